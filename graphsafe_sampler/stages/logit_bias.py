"""logit_bias: `logits[token] += bias` for up to `max_logit_bias_tokens` tokens a request."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.processors.base import SlotLogitsProcessor


class LogitBiasLogitsProcessor(SlotLogitsProcessor):
    """Sparse tables: bias_ids [num_slots, C] int32 and bias_values [num_slots, C] float32,
    C = max_logit_bias_tokens; unused entries repeat the first (token 0, +0.0 for a request
    without a bias), so that every entry of a token writes the same value. Ids are local to
    the batch state's vocabulary shard, which keeps only the entries of its own tokens.
    And biased [num_slots] int32: 1 where an entry's bias is not 0 (a kernel's test for a
    slot the stage leaves as it is, without reading the C entries)."""

    def init_tables(self) -> None:
        config = self.config
        self.capacity = config.max_logit_bias_tokens
        self.bias_ids = self.staged("bias_ids", (self.capacity,), torch.int32)
        self.bias_values = self.staged("bias_values", (self.capacity,), torch.float32)
        self.biased = self.staged("bias_any", (), torch.int32)

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
        shard = self.batch_state.shard
        entries = [
            (t - shard.start, b) for t, b in (params.logit_bias or {}).items() if shard.holds(t)
        ]
        if entries:
            n = len(entries)
            ids[:n], values[:n] = zip(*entries, strict=True)
            ids[n:], values[n:] = ids[0], values[0]
        self.bias_ids.write(slot, ids)
        self.bias_values.write(slot, values)
        self.biased.write(slot, int(bool(np.any(values != 0.0))))

    def apply_slots(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        ids = self.bias_ids.device[slots].long()  # [num_rows, C]
        values = self.bias_values.device[slots]  # [num_rows, C]
        # Keys are unique per request and unused entries repeat the first, so the entries
        # of one token all write x + b: a plain store (accumulate=True made inductor add
        # each entry with a compare-and-swap loop, ~65k of them a step at 64 rows).
        # index_put_, not scatter_: inductor lowers it in place, where a scatter falls back
        # to aten on a copy of the whole tensor.
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
        return logits.index_put_((rows, ids), logits[rows, ids] + values)

    def entries(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([num_rows, C] int64 ids, [num_rows, C] float32 biases) of each row's request,
        unused entries repeating the first."""
        return self.bias_ids.device[slots].long(), self.bias_values.device[slots]
