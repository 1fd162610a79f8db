"""vLLM's documentation example, rewritten graph-safe.

vLLM's `DummyLogitsProcessor` keeps only `extra_args["target_token"]` for the requests that
set it. Its apply starts with `if not self.req_info: return logits` and builds index tensors
from a dict on every step: both are baked into a captured graph, which then serves the wrong
rows once the batch changes. Here the target lives in a slot table (-1 = no target), so
`apply` is the same few ops whatever the batch holds.

Load it by class, as "graphsafe_sampler.examples.target_token:TargetTokenLogitsProcessor",
or through the `graphsafe_sampler.logits_processors` entry-point group.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.processors.base import SlotLogitsProcessor

_NO_TARGET = -1


class TargetTokenLogitsProcessor(SlotLogitsProcessor):
    """Table: target [num_slots] int32, the only token a request may produce (-1 = any)."""

    @classmethod
    def example_extra_args(cls, rng: random.Random, config: SamplerConfig) -> dict[str, Any] | None:
        # half the requests pick a target, anywhere in the vocabulary
        return {"target_token": rng.randrange(config.vocab_size)} if rng.random() < 0.5 else None

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        target = (params.extra_args or {}).get("target_token")
        if target is not None and (isinstance(target, bool) or not isinstance(target, int)):
            raise ValueError(f"extra_args['target_token'] must be an int token id, got {target!r}")
        if target is not None and target < 0:
            raise ValueError(f"extra_args['target_token'] must be >= 0, got {target}")

    def init_tables(self) -> None:
        config = self.config
        self.target = self.staged("target", (), torch.int32, fill=_NO_TARGET)
        self.token_ids = torch.arange(config.vocab_size, device=self.device)  # [V]

    def validate_request(self, params: SamplingParams) -> None:
        super().validate_request(params)
        target = (params.extra_args or {}).get("target_token")
        if target is not None and target >= self.config.vocab_size:
            raise ValueError(
                f"extra_args['target_token'] = {target} is outside the vocabulary "
                f"[0, {self.config.vocab_size})"
            )

    def is_argmax_invariant(self) -> bool:
        return False

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        target = (params.extra_args or {}).get("target_token")
        self.target.write(slot, _NO_TARGET if target is None else target)

    def apply_slots(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        target = self.target.device[slots].long()[:, None]  # [num_rows, 1]
        keep = (target == _NO_TARGET) | (self.token_ids == target)  # [num_rows, V]
        return logits.masked_fill_(~keep, float("-inf"))
