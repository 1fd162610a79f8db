"""Repetition, frequency and presence penalties (DESIGN §4, step 4), vLLM's definitions.

Repetition applies to tokens seen in the prompt or the output: `l / r` if `l > 0` else
`l * r`. Frequency and presence apply to output tokens only: `l -= f * count`,
`l -= p * (count > 0)`.

State per slot: the three penalties (staged), the prompt's token set as a bitmask
(`[num_slots, ceil(V/32)]` int32, built on the host at add time) and the output counts
(`[num_slots, V]` int32, device only). Counts are advanced by `commit` inside the graph from
the tokens the sampler itself produced; they are never rebuilt from host lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.bitmask import num_words, pack_token_ids
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables
from graphsafe_sampler.staging import index_to_device


def apply_penalties(
    logits: torch.Tensor,  # [num_rows, V] float32
    counts: torch.Tensor,  # [num_rows, V] int32 output-token counts
    in_prompt: torch.Tensor,  # [num_rows, V] bool
    repetition: torch.Tensor,  # [num_rows] float32 (1 = off)
    frequency: torch.Tensor,  # [num_rows] float32 (0 = off)
    presence: torch.Tensor,  # [num_rows] float32 (0 = off)
) -> torch.Tensor:
    in_output = counts > 0
    rep = repetition[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(in_prompt | in_output, penalised, logits)
    logits = logits - frequency[:, None] * counts.to(logits.dtype)
    return logits - presence[:, None] * in_output.to(logits.dtype)


class PenaltyState(SlotTables):
    """Slot state for penalties (see the module docstring)."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.config = config
        self.repetition = self.staged("repetition", (), torch.float32, fill=1.0)
        self.frequency = self.staged("frequency", (), torch.float32)
        self.presence = self.staged("presence", (), torch.float32)
        self.prompt_mask = self.staged("prompt_mask", (num_words(config.vocab_size),), torch.int32)
        self.counts = self.device_only("counts", (config.vocab_size,), torch.int32)
        self.unpacker = batch_state.bitmask_unpacker
        # Rows to reset at the next flush: slot -> output tokens the request already has.
        self._pending: dict[int, Sequence[int]] = {}
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
        self.prompt_mask.write(slot, pack_token_ids(prompt_tok_ids or (), self.config.vocab_size))
        self._pending[slot] = list(output_tok_ids)

    def flush(self) -> None:
        super().flush()
        if not self._pending:
            return
        # Reset the new requests' count rows and count their resumed outputs. Stream-ordered
        # device ops from host-built index lists: no sync, and only on steps with adds.
        device, pin = self.counts.device, self.batch_state.pin_memory
        slots = list(self._pending)
        self.counts.index_fill_(0, index_to_device(slots, device, pin=pin), 0)
        rows = [s for s, toks in self._pending.items() for _ in toks]
        cols = [t for toks in self._pending.values() for t in toks]
        if cols:
            index = (index_to_device(rows, device, pin=pin), index_to_device(cols, device, pin=pin))
            ones = torch.ones(len(cols), dtype=torch.int32, device=device)
            self.counts.index_put_(index, ones, accumulate=True)
        self._pending.clear()

    def commit(self, slots: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor) -> None:
        # Padded rows all point at the padding slot with keep=False: they add 0.
        self.counts.index_put_((slots, token_ids), keep.to(torch.int32), accumulate=True)

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
        counts = self.counts[slots]  # [num_rows, V] int32
        if extra_tokens is not None:
            ones = torch.ones_like(extra_tokens, dtype=torch.int32)
            if extra_mask is not None:
                ones = extra_mask.to(torch.int32)
            counts = counts.scatter_add(1, extra_tokens.long(), ones)
        return apply_penalties(
            logits,
            counts,
            self.unpacker.unpack(self.prompt_mask.device[slots]),
            self.repetition.device[slots],
            self.frequency.device[slots],
            self.presence.device[slots],
        )
