"""`RejectionSampler`: speculative decoding's verification step, graph-safe, on both backends.

A draft model (or an n-gram lookup) proposes up to S = `max_spec_len` tokens per request; the
target scores them all at once, giving `[num_rows, S + 1, V]` logits where position j is its
distribution after the first j drafts. The key idea: every position goes through the
Sampler's own pipeline, the drafts before it counted as output, then the standard
speculative-sampling rule keeps the target's distribution exactly. Draws are counter-based
per (request seed, position, salt), so a request's tokens do not depend on its row, its
neighbours, the batch size or padding; out-of-range device values are made harmless on the
device, never read. The rule, its draws, the backends' agreement and the out-of-range cases:
docs/kernels.md, the speculative rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.kernels.constants import SALT_ACCEPT
from graphsafe_sampler.output import RejectionSamplerOutput
from graphsafe_sampler.rng import row_uniforms
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.stages.grammar import GrammarBitmask

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)
PLACEHOLDER_TOKEN_ID = -1
"""Output columns after a row's emitted token."""


def _probabilities(p: torch.Tensor) -> torch.Tensor:
    """Draft probabilities as float32 with NaN and negative values read as 0. Then no draft
    value can emit a token the target gives probability 0: acceptance needs `u * p_draft <
    p_target` (strict, so false at p_target = 0) and the residual `max(p_target - p_draft,
    0)` stays at or below p_target. A negative p_draft would break both."""
    p = p.float()
    return torch.where(p >= 0.0, p, 0.0)  # NaN >= 0 is False


class RejectionSampler(nn.Module):
    """Verifies draft tokens against target logits, sharing a `Sampler`'s request state.

    sampler: the Sampler whose requests, parameters and device-side history this step reads
        and advances; `update_state` goes through it as usual.
    max_spec_len: S, the most drafts per request, fixed for life (the logits have S + 1
        positions per row).

    Build it before the first request is added: it registers a per-position grammar
    bitmask table with the Sampler's batch state. Custom logits processors must read their
    rows' state from the slots they are given (`apply_slots`, as `SlotLogitsProcessor`s
    do): every position of a row is one logits row.
    """

    def __init__(self, sampler: Sampler, max_spec_len: int) -> None:
        super().__init__()
        if not isinstance(sampler, Sampler):
            raise TypeError(f"sampler must be a Sampler, got {type(sampler).__name__}")
        if isinstance(max_spec_len, bool) or not isinstance(max_spec_len, int):
            raise TypeError(f"max_spec_len must be an int, got {type(max_spec_len).__name__}")
        if max_spec_len < 1:
            raise ValueError(f"max_spec_len must be >= 1, got {max_spec_len}")
        for proc in sampler.stages.custom:
            if not proc.reads_rows_by_slot:
                raise ValueError(
                    f"custom processor {type(proc).__name__} reads its state by batch row (it "
                    "implements apply, not apply_slots): it cannot serve the S + 1 positions "
                    "of a speculative step"
                )
        if sampler.batch_state.num_requests:
            raise RuntimeError(
                "build the RejectionSampler before the first request is added: its "
                "per-position grammar bitmask is a row table of the batch state"
            )
        self.sampler = sampler
        self.max_spec_len = max_spec_len
        self.grammar = GrammarBitmask(
            sampler.config,
            sampler.batch_state,
            num_positions=max_spec_len + 1,
            name="spec_grammar",
        )
        self.graph_safe = sampler.graph_safe

    @property
    def config(self) -> SamplerConfig:
        return self.sampler.config

    @property
    def device(self) -> torch.device:
        return self.sampler.device

    # ----------------------------------------------------------------- host side

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """The Sampler's `update_state` (one shared batch)."""
        self.sampler.update_state(batch_update)

    def stage_grammar_bitmask(
        self, bitmask: torch.Tensor | np.ndarray | None, rows: Sequence[int] | None = None
    ) -> None:
        """Stage this step's structured-output masks, one per verified position: int32
        [len(rows), S + 1, ceil(V/32)] (xgrammar's layout, bit set = allowed), where
        position j is the grammar's state after the row's first j drafts. Other rows are
        unconstrained; `None` clears every row. Same lifetime as the Sampler's mask (it moves
        with its request and stays until the next call); the Sampler's own single-position
        mask (`Sampler.stage_grammar_bitmask`) is not applied by this step."""
        self.grammar.stage(bitmask, rows)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor kept across steps (the Sampler's, which include this step's grammar
        tables: they live on the shared batch state)."""
        return self.sampler.state_tensors()

    def _check_inputs(
        self,
        target_logits: torch.Tensor,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        commit_mask: torch.Tensor | None,
    ) -> None:
        sampler, spec = self.sampler, self.max_spec_len
        columns, what = sampler._logits_columns()  # the logits' width (a rank's: its shard)
        tensors = {
            "target_logits": target_logits,
            "draft_token_ids": draft_token_ids,
            "num_draft_tokens": num_draft_tokens,
            "draft_probs": draft_probs,
            "commit_mask": commit_mask,
        }
        for name, tensor in tensors.items():
            if tensor is None and name in ("draft_probs", "commit_mask"):
                continue
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if target_logits.dim() != 3:
            raise ValueError(
                f"target_logits must be 3-D [num_rows, max_spec_len + 1, vocab_size], "
                f"got {target_logits.dim()}-D"
            )
        rows = target_logits.shape[0]
        expected = {
            "target_logits": ((rows, spec + 1, columns), _FLOAT_DTYPES),
            "draft_token_ids": ((rows, spec), _INDEX_DTYPES),
            "num_draft_tokens": ((rows,), _INDEX_DTYPES),
            "draft_probs": ((rows, spec, columns), _FLOAT_DTYPES),
            "commit_mask": ((rows,), (torch.bool,)),
        }
        for name, (shape, dtypes) in expected.items():
            tensor = tensors[name]
            if tensor is None:
                continue
            if tensor.dtype not in dtypes:
                names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
                raise TypeError(f"{name} must be {names}, got {tensor.dtype}")
            if tuple(tensor.shape) != shape:
                raise ValueError(
                    f"{name} must have shape {list(shape)} (num_rows = {rows}, "
                    f"max_spec_len = {spec}, {what} = {columns}), got {list(tensor.shape)}"
                )
            sampler._check_device(name, tensor)
        sampler._check_rows("target_logits", rows)

    def _validate_values(
        self,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
    ) -> None:
        """Opt-in host check of the device values (reads them: a sync, eager only)."""
        if torch.compiler.is_compiling():
            raise RuntimeError("validate=True reads device values on the host: not in a graph")
        spec, vocab = self.max_spec_len, self.config.vocab_size
        counts = num_draft_tokens.cpu().numpy()
        bad_rows = np.flatnonzero((counts < 0) | (counts > spec))
        if bad_rows.size:
            row = int(bad_rows[0])
            raise ValueError(
                f"num_draft_tokens[{row}] = {int(counts[row])} is outside [0, max_spec_len = "
                f"{spec}]"
            )
        drafts = draft_token_ids.cpu().numpy()
        used = np.arange(spec)[None, :] < counts[:, None]
        bad = np.argwhere(used & ((drafts < 0) | (drafts >= vocab)))
        if bad.size:
            row, col = (int(i) for i in bad[0])
            raise ValueError(
                f"draft_token_ids[{row}, {col}] = {int(drafts[row, col])} is outside the "
                f"vocabulary [0, {vocab})"
            )
        if draft_probs is not None:
            probs = draft_probs.float().cpu().numpy()  # [num_rows, S, V]
            # NaN fails `>= 0` too; only the positions a row drafted are read
            bad = np.argwhere(used[:, :, None] & ~(probs >= 0.0))
            if bad.size:
                row, col, token = (int(i) for i in bad[0])
                raise ValueError(
                    f"draft_probs[{row}, {col}, {token}] = {float(probs[row, col, token])} is "
                    "not a probability (NaN or negative)"
                )

    # ----------------------------------------------------------------- device side

    def forward(
        self,
        target_logits: torch.Tensor,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None = None,
        *,
        commit: bool = True,
        commit_mask: torch.Tensor | None = None,
        validate: bool = False,
    ) -> RejectionSamplerOutput:
        """Verify one step's drafts (graph-safe unless `validate`).

        target_logits: [num_rows, S + 1, V] float32/float16/bfloat16; row i = batch row i
            (rows past the batch are padding), position j = after the row's first j drafts.
        draft_token_ids: [num_rows, S] int32/int64; columns past a row's count are ignored.
        num_draft_tokens: [num_rows] int32/int64 device tensor, drafts per row (0 allowed).
        draft_probs: optional [num_rows, S, V] float, the draft model's probabilities at
            each draft position; None for n-gram drafts (probability 1 for the drafted id).
        commit: append each row's accepted drafts and emitted token to its request's
            device-side history (default: `Sampler.commit_tokens` with num_accepted + 1
            tokens, inside the graph); False leaves the history alone.
        commit_mask: optional [num_rows] bool device tensor; rows with False commit nothing.
        validate: first read num_draft_tokens, draft_token_ids and draft_probs on the host
            and raise ValueError for values out of range (a sync: eager only). Without it
            they are made harmless on the device (docs/kernels.md, the speculative rule).
        """
        self._check_inputs(
            target_logits, draft_token_ids, num_draft_tokens, draft_probs, commit_mask
        )
        if validate:
            self._validate_values(draft_token_ids, num_draft_tokens, draft_probs)
        sampler = self.sampler
        num_rows, num_positions, width = target_logits.shape  # width: the logits' columns
        vocab = self.config.vocab_size
        spec = self.max_spec_len
        device = target_logits.device
        slots = sampler.batch_state.slots(num_rows)  # [num_rows] int64

        num_drafts = num_draft_tokens.long().clamp(0, spec)  # [num_rows]
        drafts = draft_token_ids.long()  # [num_rows, S]
        in_vocab = (drafts >= 0) & (drafts < vocab)
        drafts = torch.where(in_vocab, drafts, 0)  # safe to index with; never accepted if not
        columns = torch.arange(spec, device=device)  # [S]
        is_draft = (columns[None, :] < num_drafts[:, None]) & in_vocab  # [num_rows, S]

        # Every position of every row through the pipeline at once: flattened row
        # r * (S + 1) + j is row r after its first j drafts.
        flat_rows = num_rows * num_positions
        # repeat_interleave, not expand + reshape: a real copy is contiguous, as the kernels
        # require, while the reshape of an expanded single row is a stride-0 view
        flat_slots = slots.repeat_interleave(num_positions)  # [flat_rows]
        preceding = torch.arange(num_positions, device=device).repeat(num_rows)  # [flat]
        flat_drafts = drafts.repeat_interleave(num_positions, dim=0)  # [flat_rows, S]
        flat_logits = target_logits.reshape(flat_rows, width)  # read only, any float dtype
        grammar = self.grammar.bitmask_rows(flat_rows)
        processed = sampler.pipeline.process(
            flat_logits, flat_slots, grammar, flat_drafts, preceding
        )
        x = processed.logits.view(num_rows, num_positions, width)  # processed target logits
        greedy = processed.greedy_tokens().view(num_rows, num_positions)  # [num_rows, S + 1]
        row_is_greedy = sampler.stages.temperature.is_greedy(slots)  # [num_rows]

        # Acceptance of each draft.
        sampling = sampler.stages.sampling
        seeds = sampling.seed.device[slots]  # [num_rows]
        start = sampler.batch_state.positions(slots)  # [num_rows] position of column 0
        draft_positions = start[:, None] + columns[None, :]  # [num_rows, S]
        uniforms = row_uniforms(
            seeds[:, None].expand(num_rows, spec).reshape(-1),
            draft_positions.reshape(-1),
            SALT_ACCEPT,
        ).view(num_rows, spec)
        lse = self._logsumexp(x[:, :spec])  # [num_rows, S]
        target_at_draft = self._at(x[:, :spec], drafts)  # [num_rows, S]
        p_target = torch.exp(target_at_draft - lse)  # NaN for an all-masked row: rejected
        if draft_probs is None:
            p_draft = torch.ones_like(p_target)
        else:
            p_draft = _probabilities(self._at(draft_probs, drafts))
        # u < p_target / p_draft without the division; strict, so p_target = 0 never passes.
        accept_random = uniforms * p_draft < p_target
        accept_greedy = drafts == greedy[:, :spec]
        accept = torch.where(row_is_greedy[:, None], accept_greedy, accept_random) & is_draft
        # Accepted drafts are the leading run of accepts.
        num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [num_rows]
        is_bonus = num_accepted == num_drafts  # [num_rows]

        # The emitted token, at position a = num_accepted of each row.
        row_ids = torch.arange(num_rows, device=device)
        emitted_logits = x[row_ids, num_accepted]  # [num_rows, V]
        rejected_at = num_accepted.clamp(max=spec - 1)  # the rejected draft (if any)
        p_emitted = torch.exp(emitted_logits - lse[row_ids, rejected_at][:, None])  # [rows, V]
        if draft_probs is None:
            # One-hot p_draft: the target without the drafted token (an id outside the
            # vocabulary removes nothing).
            drafted = drafts[row_ids, rejected_at]  # [num_rows]
            remove = self._token_ids(device)[None, :] == drafted[:, None]
            remove = remove & in_vocab[row_ids, rejected_at][:, None]
            residual = p_emitted.masked_fill(remove, 0.0)
        else:
            p_draft_row = _probabilities(draft_probs[row_ids, rejected_at])  # [num_rows, V]
            residual = (p_emitted - p_draft_row).clamp(min=0.0)
        # A residual without mass happens only through rounding (p_target == p_draft):
        # fall back to the target itself rather than emit token 0.
        has_mass = self._any((residual > 0.0).any(dim=-1, keepdim=True))
        recovered_scores = torch.where(has_mass, residual.log(), emitted_logits)
        # One noise row per request, from the stream of what it emits.
        emit_position = start + num_accepted
        random_emitted = sampler.pipeline.race_emitted(
            emitted_logits, recovered_scores, is_bonus, slots, emit_position
        )
        greedy_emitted = greedy.gather(1, num_accepted[:, None])[:, 0]
        emitted = torch.where(row_is_greedy, greedy_emitted, random_emitted)

        all_columns = torch.arange(num_positions, device=device)[None, :]  # [1, S + 1]
        accepted_column = all_columns < num_accepted[:, None]
        padded_drafts = torch.cat([drafts, drafts.new_zeros(num_rows, 1)], dim=1)
        tokens = torch.where(accepted_column, padded_drafts, emitted[:, None])  # [rows, S+1]
        if commit:
            sampler.commit_tokens(tokens, num_tokens=num_accepted + 1, commit_mask=commit_mask)
        produced = all_columns <= num_accepted[:, None]
        output = torch.where(produced, tokens, PLACEHOLDER_TOKEN_ID).to(torch.int32)
        return RejectionSamplerOutput(output, num_accepted.to(torch.int32))

    # Row reductions over the logits' columns: a vocab-parallel rank takes them over every
    # rank's columns (graphsafe_sampler.distributed.VocabParallelRejectionSampler).

    def _logsumexp(self, x: torch.Tensor) -> torch.Tensor:
        """[..., V] -> [...]: each row's logsumexp."""
        return x.logsumexp(dim=-1)

    def _at(self, values: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """values [num_rows, S, V], token_ids [num_rows, S] int64 in [0, V) -> [num_rows, S]:
        the value of each token."""
        return values.gather(2, token_ids[:, :, None])[:, :, 0]

    def _any(self, mask: torch.Tensor) -> torch.Tensor:
        """[num_rows, 1] bool, whether a row holds a True in its columns -> in its whole row."""
        return mask

    def _token_ids(self, device: torch.device) -> torch.Tensor:
        """[V] int64: the token id of each column of the logits."""
        return torch.arange(self.config.vocab_size, device=device)
