"""logit_bias: `logits[token] += bias` for up to `max_logit_bias_tokens` tokens a request."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.processors.base import SlotLogitsProcessor


class LogitBiasLogitsProcessor(SlotLogitsProcessor):
    """Sparse tables: bias_ids [num_slots, C] int32 and bias_values [num_slots, C] float32,
    C = max_logit_bias_tokens; unused entries are (token 0, +0.0)."""

    def init_tables(self) -> None:
        config = self.config
        self.capacity = config.max_logit_bias_tokens
        self.bias_ids = self.staged("bias_ids", (self.capacity,), torch.int32)
        self.bias_values = self.staged("bias_values", (self.capacity,), torch.float32)

    def is_argmax_invariant(self) -> bool:
        return False

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        ids = np.zeros(self.capacity, dtype=np.int32)
        values = np.zeros(self.capacity, dtype=np.float32)
        if params.logit_bias:
            n = len(params.logit_bias)
            ids[:n] = list(params.logit_bias.keys())
            values[:n] = list(params.logit_bias.values())
        self.bias_ids.write(slot, ids)
        self.bias_values.write(slot, values)

    def apply_slots(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        ids = self.bias_ids.device[slots].long()  # [num_rows, C]
        values = self.bias_values.device[slots]  # [num_rows, C]
        # Keys are unique per request and unused entries add +0.0, so the sum is exact in
        # any order: x + b + 0.0 == x + b. index_put_, not scatter_add_: inductor lowers it
        # in place, where a scatter falls back to aten on a copy of the whole tensor.
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
        return logits.index_put_((rows, ids), values, accumulate=True)
