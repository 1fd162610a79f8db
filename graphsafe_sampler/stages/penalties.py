"""Repetition, frequency and presence penalties (docs/design.md §4, step 4), vLLM's definitions.

Repetition applies to tokens seen in the prompt or the output: `l / r` if `l > 0` else
`l * r`. Frequency and presence apply to output tokens only: `l -= f * count`,
`l -= p * (count > 0)`.

State per slot:
- the three penalties, float32 (staged);
- the prompt's token set, a bitmask `[num_slots, ceil(V/32)]` int32 built on the host at add
  time (1 bit a token);
- the output counts, `[num_slots, V]` uint8 on the device: the count while it is below
  `SATURATED` = 255, and 255 for a token output 255 times or more (1 byte a token);
- the output's words, a bitmask `output_words` `[num_slots, ceil(ceil(V/32)/32)]` int32 on
  the device, one bit per 32-token word: bit w (of int32 w // 32, at w % 32) set where a
  token of [32w, 32w + 32) has a count above 0, kept with the counts (the resumed outputs'
  words written at add time, a token's word marked by every commit of it), so that the
  Triton dense pass reads the count bytes of the words holding an output only (1 bit per
  32 tokens; docs/kernels.md, logits processing);
- the saturated tokens' excess, an overflow table of `E = ceil(max_model_len / 255)` entries
  per slot: `overflow_token` int32 (-1 = unused) and `overflow_excess` int32, with
  count = 255 + excess. A token enters the table on the commit that takes it to 255; since
  each entry stands for 255 outputs, a request within `max_model_len` never fills it.

So the counts are exact for any output length up to `max_model_len`, at about 1 byte + 1 bit
a token instead of vLLM's 4 bytes (at vocab 151,936: ~176 KB a slot against ~608 KB; see
`perf/state_bytes.py`). Presence and repetition only ask `count > 0`, which the byte answers;
the frequency penalty of a saturated token is corrected by a scatter of E values a row.

A vocabulary shard (`VocabShard`, tensor parallelism) keeps the bitmask, counts and overflow
entries of its own tokens, at local ids; a committed token outside it counts nowhere here.

Counts are advanced by `commit` inside the graph from the tokens the sampler itself produced;
they are never rebuilt from host lists. The commit that saturates a token takes the next free
entry (found by counting used ones, on the device); later commits add to its excess.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.bitmask import bits_at, num_words, pack_token_ids
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.kernels.constants import SATURATED
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables
from graphsafe_sampler.staging import host_to_device, index_to_device

_UNUSED = -1


def overflow_capacity(config: SamplerConfig) -> int:
    """Overflow entries per slot: enough for `max_model_len` outputs (255 a saturated token)."""
    return math.ceil(config.max_model_len / SATURATED)


def apply_penalties(
    logits: torch.Tensor,  # [num_rows, V] float32
    counts: torch.Tensor,  # [num_rows, V] integer output-token counts
    in_prompt: torch.Tensor,  # [num_rows, V] bool
    repetition: torch.Tensor,  # [num_rows] float32 (1 = off)
    frequency: torch.Tensor,  # [num_rows] float32 (0 = off)
    presence: torch.Tensor,  # [num_rows] float32 (0 = off)
) -> torch.Tensor:
    # Every test on the float count: a mask built from uint8 lanes and combined with
    # 32-bit ones is cast lane by lane in inductor's CPU code (measured 10x slower).
    count = counts.to(logits.dtype)
    in_output = count > 0
    rep = repetition[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(in_prompt | in_output, penalised, logits)
    logits = logits - frequency[:, None] * count
    return logits - presence[:, None] * in_output.to(logits.dtype)


class PenaltyState(SlotTables):
    """Slot state for penalties (see the module docstring)."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.config = config
        self.capacity = overflow_capacity(config)
        self.repetition = self.staged("repetition", (), torch.float32, fill=1.0)
        self.frequency = self.staged("frequency", (), torch.float32)
        self.presence = self.staged("presence", (), torch.float32)
        self.shard = batch_state.shard
        self.prompt_mask = self.staged("prompt_mask", (num_words(self.shard.size),), torch.int32)
        self.counts = self.device_only("counts", (self.shard.size,), torch.uint8)
        self.output_words = self.device_only(
            "output_words", (num_words(num_words(self.shard.size)),), torch.int32
        )
        # One column past the capacity: commits that saturate nothing write there (a fixed
        # target keeps the commit branch-free); apply never reads it.
        width = self.capacity + 1
        self.overflow_token = self.staged("overflow_token", (width,), torch.int32, fill=_UNUSED)
        self.overflow_excess = self.staged("overflow_excess", (width,), torch.int32)
        self.unpacker = batch_state.bitmask_unpacker
        # Count rows to reset at the next flush: slot -> {token: count} of resumed outputs.
        self._pending: dict[int, Counter[int]] = {}
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        self.repetition.write(slot, params.repetition_penalty)
        self.frequency.write(slot, params.frequency_penalty)
        self.presence.write(slot, params.presence_penalty)
        shard = self.shard
        self.prompt_mask.write(
            slot, pack_token_ids(shard.local_ids(prompt_tok_ids or ()), shard.size)
        )
        counts = Counter(int(t) for t in shard.local_ids(output_tok_ids))
        tokens = np.full(self.capacity + 1, _UNUSED, dtype=np.int32)
        excess = np.zeros(self.capacity + 1, dtype=np.int32)
        saturated = [(t, n - SATURATED) for t, n in counts.items() if n >= SATURATED]
        # BatchState checks outputs against max_model_len, so this always fits.
        assert len(saturated) <= self.capacity, "outputs beyond max_model_len"
        for e, (token, extra) in enumerate(saturated):
            tokens[e], excess[e] = token, extra
        self.overflow_token.write(slot, tokens)
        self.overflow_excess.write(slot, excess)
        self._pending[slot] = counts

    def flush(self) -> None:
        super().flush()
        if not self._pending:
            return
        # Reset the new requests' count rows and write their resumed outputs' counts.
        # Stream-ordered device ops from host-built lists sent from pinned memory when the
        # state pins (no sync), only on steps with adds. (slot, token) pairs are unique, so a
        # plain index_put_ is deterministic.
        device, pin = self.counts.device, self.batch_state.pin_memory
        slots = list(self._pending)
        if device.type == "cpu":
            # a memset per row: CPU index_fill_ on uint8 rows walks them element by element
            # (measured 265 us for 2 rows of 32,000, against 7 us)
            for slot in slots:
                self.counts[slot].zero_()
                self.output_words[slot].zero_()
        else:  # one kernel a table, whatever the number of rows
            reset = index_to_device(slots, device, pin=pin)
            self.counts.index_fill_(0, reset, 0)
            self.output_words.index_fill_(0, reset, 0)
        rows = [s for s, counts in self._pending.items() for _ in counts]
        cols = [t for counts in self._pending.values() for t in counts]
        if cols:
            values = [
                min(n, SATURATED) for counts in self._pending.values() for n in counts.values()
            ]
            index = (index_to_device(rows, device, pin=pin), index_to_device(cols, device, pin=pin))
            new_counts = host_to_device(values, torch.uint8, device, pin=pin)  # [len(cols)]
            self.counts.index_put_(index, new_counts)
            # the words holding those tokens, each a slot's once (made on the host), their
            # bits added to the cleared rows: the sum is their or (bit 31 is int32's sign:
            # made in int64, wrapped)
            marked = sorted({(s, t // 32) for s, counts in self._pending.items() for t in counts})
            at = (
                index_to_device([s for s, _ in marked], device, pin=pin),
                index_to_device([w for _, w in marked], device, pin=pin),
            )
            bits = (torch.ones_like(at[1]) << (at[1] % 32)).to(torch.int32)
            self.output_words.index_put_((at[0], at[1] // 32), bits, accumulate=True)
        self._pending.clear()

    def commit(self, slots: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor) -> None:
        # slots, token_ids [num_rows] int64; keep [num_rows] bool. Padded rows all point at the
        # padding slot with keep=False: they write back what they read, and into the spare
        # overflow column. Real rows have distinct slots, so no two writes collide.
        if not self.shard.is_whole:  # a token of another shard counts there
            token_ids, inside = self.shard.local(token_ids)
            keep = keep & inside
        count = self.counts[slots, token_ids].to(torch.int32)  # [num_rows]
        bumped = torch.where(keep, torch.clamp(count + 1, max=SATURATED), count)
        self.counts.index_put_((slots, token_ids), bumped.to(torch.uint8))
        # the token's word marked (again, past its first output), as the counts: a read and
        # a write back of each row's int32 (bit 31 is int32's sign: made in int64, wrapped)
        words = token_ids // 32
        held = self.output_words[slots, words // 32]  # [num_rows] int32
        bit = (torch.ones_like(words) << (words % 32)).to(torch.int32)
        self.output_words.index_put_((slots, words // 32), torch.where(keep, held | bit, held))
        table = self.overflow_token.device[slots, : self.capacity]  # [num_rows, E]
        saturates = keep & (count == SATURATED - 1)  # takes a new entry
        grows = keep & (count == SATURATED)  # adds to its entry
        match = table == token_ids[:, None].to(torch.int32)
        found = match.any(-1)
        spare = self.capacity
        entry = torch.where(
            saturates,
            (table != _UNUSED).sum(-1),  # the next free entry (== capacity when full: spare)
            torch.where(grows & found, match.to(torch.int32).argmax(-1), spare),
        ).long()
        writes = saturates | (grows & found)
        old_token = self.overflow_token.device[slots, entry]
        new_token = torch.where(saturates, token_ids.to(torch.int32), old_token)
        self.overflow_token.device.index_put_((slots, entry), torch.where(writes, new_token, -1))
        self.overflow_excess.device.index_put_(
            (slots, entry), (grows & found).to(torch.int32), accumulate=True
        )

    def apply(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32
        slots: torch.Tensor,  # [num_rows] int64
        extra_tokens: torch.Tensor | None = None,  # [num_rows, n] int64
        extra_mask: torch.Tensor | None = None,  # [num_rows, n] bool
    ) -> torch.Tensor:
        """Penalise `logits` by each row's slot state. `extra_tokens` (with `extra_mask`,
        default all True) count as output tokens on top of the committed history: the drafts
        that precede a position within one speculative step."""
        counts = self.counts[slots]  # [num_rows, V] uint8
        if extra_tokens is not None:
            ones = torch.ones_like(extra_tokens, dtype=torch.int32)
            if extra_mask is not None:
                ones = extra_mask.to(torch.int32)
            extra_tokens = extra_tokens.long()
            if not self.shard.is_whole:  # drafts of another shard's tokens count there
                extra_tokens, inside = self.shard.local(extra_tokens)
                ones = ones * inside
            counts = counts.to(torch.int32).scatter_add(1, extra_tokens, ones)
        return self.charge_excess(self.penalize(logits, slots, counts), slots)

    def penalize(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32
        slots: torch.Tensor,  # [num_rows] int64
        counts: torch.Tensor | None = None,  # [num_rows, V]; None: the slots' byte counts
    ) -> torch.Tensor:
        """`apply` before `charge_excess`: the dense pass, a new tensor."""
        return apply_penalties(
            logits,
            self.counts[slots] if counts is None else counts,
            self.unpacker.unpack(self.prompt_mask.device[slots]),
            self.repetition.device[slots],
            self.frequency.device[slots],
            self.presence.device[slots],
        )

    def charge_excess(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, penalised with the byte counts
        slots: torch.Tensor,  # [num_rows] int64
        *,
        in_place: bool = False,
    ) -> torch.Tensor:
        """Saturated tokens were charged 255 outputs: charge the excess (a new tensor, or
        `logits` updated with `in_place`). Unused entries add 0 to token 0."""
        frequency = self.frequency.device[slots]  # [num_rows]
        tokens = self.overflow_token.device[slots, : self.capacity].long()  # [num_rows, E]
        excess = self.overflow_excess.device[slots, : self.capacity].to(torch.float32)
        charge = -frequency[:, None] * excess  # [num_rows, E]
        if in_place:
            # An index_put_ of logit + charge, which inductor lowers in place (a scatter_add_
            # after another in-place op copied the whole tensor first). A token holds one
            # entry; unused ones repeat the first entry (token 0 and a zero charge where
            # none is used), so that every write to a token carries the same value.
            unused = tokens < 0
            tokens = torch.where(unused, tokens[:, :1].clamp(min=0), tokens)
            charge = torch.where(unused, torch.where(unused[:, :1], -0.0, charge[:, :1]), charge)
            rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
            return logits.index_put_((rows, tokens), logits[rows, tokens] + charge)
        # (In `apply`, in place, which spares inductor a copy of the tensor, measured slower:
        # inductor then fused the Gumbel race into the search.)
        return logits.scatter_add(1, tokens.clamp(min=0), charge)

    def penalize_at(
        self,
        values: torch.Tensor,  # [num_rows, C] float32: logits of the tokens `ids`
        ids: torch.Tensor,  # [num_rows, C] int64 token ids in [0, V)
        slots: torch.Tensor,  # [num_rows] int64
    ) -> torch.Tensor:
        """[num_rows, C] float32: what `apply` makes of these tokens' logits before
        `charge_excess`, the same float operations in the same order, where only a few
        tokens a row are asked for (the logit bias's, `mask_and_penalize`)."""
        return apply_penalties(
            values,
            self.counts[slots[:, None], ids],
            bits_at(self.prompt_mask.device[slots], ids),
            self.repetition.device[slots],
            self.frequency.device[slots],
            self.presence.device[slots],
        )
