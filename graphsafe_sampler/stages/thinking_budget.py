"""Thinking budget: once a request has spent `thinking_token_budget` tokens inside a
reasoning section, force the section's end sequence, token by token (vLLM's
`SamplingParams.thinking_token_budget`).

A reasoning section starts after `SamplerConfig.reasoning_start_token_ids` and ends with
`reasoning_end_token_ids` (the sequence forced, which also counts as a natural end). As in
vLLM, the latest occurrences decide: a request is reasoning when its last start sequence
began after its last end sequence, and the tokens after that start count against the
budget, prompt tokens too (a template may open the section in the prompt). Once the count
reaches the budget, every token but the next one of the end sequence is -inf, greedy and
random rows alike; "next" continues a prefix of the end sequence the request already ends
with. Forcing overrides the masks before it (allowed ids, grammar, bad words, min_tokens):
a forced token they made -inf reads 0. A later start sequence opens a new section with a
fresh count.

Tables (per slot, registered only when the config has the two sequences):
budget [num_slots] int32 (-1: off); a `RecentTokens` ring of the last W = max(len(start),
len(end)) tokens; last_start and last_end [num_slots] int64, the positions where the
latest start and end sequences began (-1: none). `add_request` fills them from the
prompt and output on the host; `commit` advances them on the device, and `apply` extends
them over the drafts before a speculative position without writing them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.recent_tokens import RecentTokens
from graphsafe_sampler.slot_tables import SlotTables

_INT32_MAX = 2**31 - 1


def last_occurrence(tokens: Sequence[int], pattern: Sequence[int]) -> int:
    """Where the last occurrence of `pattern` in `tokens` begins, or -1 (host side)."""
    n = len(pattern)
    for i in range(len(tokens) - n, -1, -1):
        if list(tokens[i : i + n]) == list(pattern):
            return i
    return -1


class ThinkingBudgetState(SlotTables):
    """Per-slot reasoning-section state (see the module docstring)."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.start_ids = tuple(config.reasoning_start_token_ids)
        self.end_ids = tuple(config.reasoning_end_token_ids)
        self.width = max(len(self.start_ids), len(self.end_ids))
        self.budget = self.staged("thinking_budget", (), torch.int32, fill=-1)
        self.recent = RecentTokens(self, "thinking", self.width)
        self.last_start = self.staged("thinking_last_start", (), torch.int64, fill=-1)
        self.last_end = self.staged("thinking_last_end", (), torch.int64, fill=-1)
        device = batch_state.device
        self._start = torch.tensor(self.start_ids, dtype=torch.int64, device=device)
        self._end = torch.tensor(self.end_ids, dtype=torch.int64, device=device)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        tokens = [*(prompt_tok_ids or ()), *output_tok_ids]
        budget = params.thinking_token_budget
        self.budget.write(slot, -1 if budget is None else min(budget, _INT32_MAX))
        self.recent.add_request(slot, prompt_tok_ids, output_tok_ids)
        self.last_start.write(slot, last_occurrence(tokens, self.start_ids))
        self.last_end.write(slot, last_occurrence(tokens, self.end_ids))

    def _ends_at(
        self,
        pattern: torch.Tensor,  # [n] int64
        token_at: torch.Tensor,  # [num_rows, n_pos, W + 1]: tokens at end - W .. end
        end: torch.Tensor,  # [num_rows, n_pos] int64: the position of the last token
    ) -> torch.Tensor:
        """[num_rows, n_pos] bool: the tokens ending at `end` are `pattern`."""
        n = pattern.shape[0]
        return (token_at[..., -n:] == pattern).all(-1) & (end - n + 1 >= 0)

    def commit(self, slots: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor) -> None:
        n = self.batch_state.positions(slots)  # [rows]: the new token's position
        # [rows, W + 1]: the tokens at n - W .. n
        window = torch.cat([self.recent.last(slots), token_ids[:, None]], dim=1)
        # rows that do not commit write back what is there, so that duplicate (padding)
        # slots all carry the same value
        starts = keep & self._ends_at(self._start, window[:, None], n[:, None])[:, 0]
        ends = keep & self._ends_at(self._end, window[:, None], n[:, None])[:, 0]
        last_start = self.last_start.device
        last_end = self.last_end.device
        last_start.index_put_(
            (slots,), torch.where(starts, n - len(self.start_ids) + 1, last_start[slots])
        )
        last_end.index_put_((slots,), torch.where(ends, n - len(self.end_ids) + 1, last_end[slots]))
        self.recent.commit(slots, token_ids, keep)

    def forced(
        self,
        slots: torch.Tensor,  # [num_rows] int64
        drafts: torch.Tensor | None = None,  # [num_rows, S] int64 ids in [0, V)
        num_preceding: torch.Tensor | None = None,  # [num_rows] int64 in [0, S]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(force [num_rows] bool, token [num_rows] int64 global id): the rows whose budget
        is spent, and the end-sequence token each must take. With `drafts`, a row's history
        is its committed tokens followed by its first `num_preceding` drafts."""
        n = self.batch_state.positions(slots)  # [rows]
        last_start = self.last_start.device[slots]
        last_end = self.last_end.device[slots]
        spec = 0 if drafts is None else drafts.shape[1]
        preceding = torch.zeros_like(n) if num_preceding is None else num_preceding.long()
        # every token this row's checks read: positions n - W .. n + spec - 1
        seq = self.recent.last(slots)  # [rows, W]
        if drafts is not None:
            seq = torch.cat([seq, drafts.long()], dim=1)  # [rows, W + spec]
        if spec:
            # the drafts before this position may complete a start or an end sequence:
            # windows ending at draft j, W + 1 tokens each ([rows, spec, W + 1])
            index = torch.arange(spec, device=slots.device)[:, None] + torch.arange(
                self.width + 1, device=slots.device
            )  # [spec, W + 1]: window j covers seq columns j .. j + W
            windows = seq[:, index.clamp(max=self.width + spec - 1)]
            ends_at = n[:, None] + torch.arange(spec, device=slots.device)  # [rows, spec]
            seen = torch.arange(spec, device=slots.device)[None, :] < preceding[:, None]
            starts = seen & self._ends_at(self._start, windows, ends_at)
            ends = seen & self._ends_at(self._end, windows, ends_at)
            never = torch.full_like(ends_at, -1)
            last_start = torch.maximum(
                last_start,
                torch.where(starts, ends_at - len(self.start_ids) + 1, never).amax(-1),
            )
            last_end = torch.maximum(
                last_end, torch.where(ends, ends_at - len(self.end_ids) + 1, never).amax(-1)
            )
        length = n + preceding  # [rows]: the position being sampled
        budget = self.budget.device[slots].long()
        reasoning = (last_start >= 0) & (last_start > last_end)
        spent = length - (last_start + len(self.start_ids)) >= budget
        force = (budget >= 0) & reasoning & spent
        # the longest proper prefix of the end sequence the history ends with: its next
        # token is forced (end[0] where none)
        last = self.width + preceding  # [rows]: seq column of position `length`
        forced_at = torch.zeros_like(n)
        for p in range(1, len(self.end_ids)):
            tail = seq.gather(1, last[:, None] - p + torch.arange(p, device=slots.device))
            match = (tail == self._end[:p]).all(-1)
            forced_at = torch.where(match, p, forced_at)
        return force, self._end[forced_at]

    def apply(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, updated in place
        slots: torch.Tensor,  # [num_rows] int64
        drafts: torch.Tensor | None = None,  # [num_rows, S] int64 ids in [0, V)
        num_preceding: torch.Tensor | None = None,  # [num_rows] int64 in [0, S]
    ) -> torch.Tensor:
        """In the rows whose budget is spent, every token but the forced one is -inf, and
        the forced one keeps its value, or reads 0 where an earlier mask made it -inf (the
        end is forced whatever else the request restricts; NaN stays NaN). The columns are
        the batch state's vocabulary shard's. Runs after penalties: it commutes with
        temperature (it keeps a value, or writes 0 or -inf)."""
        force, token = self.forced(slots, drafts, num_preceding)
        shard = self.batch_state.shard
        columns = torch.arange(logits.shape[1], device=logits.device) + shard.start
        is_forced = columns[None, :] == token[:, None]  # [rows, V]
        kept = torch.where(logits == float("-inf"), 0.0, logits)
        forced = torch.where(is_forced, kept, float("-inf"))
        return logits.copy_(torch.where(force[:, None], forced, logits))
