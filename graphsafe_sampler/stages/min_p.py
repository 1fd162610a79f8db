"""min_p: keep tokens with p >= min_p * p_max, i.e. logit >= max_logit + ln(min_p).

The log form needs no softmax: one max and one compare per row. min_p = 0 gives a
threshold of -inf, which keeps everything (also in all -inf rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.processors.base import SlotLogitsProcessor


def min_p_threshold(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """logits: [num_rows, V]; min_p: [num_rows] -> [num_rows, 1] logit threshold."""
    max_logit = logits.amax(dim=-1, keepdim=True)
    return max_logit + torch.log(min_p.to(logits.dtype))[:, None]


class MinPLogitsProcessor(SlotLogitsProcessor):
    """Table: min_p [num_slots] float32 (0 = off). Argmax-invariant."""

    def init_tables(self) -> None:
        self.min_p = self.staged("min_p", (), torch.float32)

    def is_argmax_invariant(self) -> bool:
        return True

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        self.min_p.write(slot, params.min_p)

    def values(self, slots: torch.Tensor) -> torch.Tensor:
        """[num_rows] float32: each row's min_p (0 = off), for slots [num_rows] int64."""
        return self.min_p.device[slots]

    def apply_slots(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        threshold = min_p_threshold(logits, self.values(slots))
        return logits.masked_fill_(logits < threshold, float("-inf"))
