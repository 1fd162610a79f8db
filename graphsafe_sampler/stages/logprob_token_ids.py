"""Logprobs of chosen tokens (step 10): `SamplingParams.logprob_token_ids`, the ids whose
logprobs and ranks a request reads beside the top K at every step (vLLM's name).

Table: ids, staged `[num_slots, C]` int32, C = `SamplerConfig.max_logprob_token_ids`, a
request's ids in the order given and -1 past them (the padding slot is all -1). The values
and ranks come from `stages.logprobs.requested_logprobs`, on the same source (raw or
processed, per `logprobs_mode`) and shift as the top K. Ids are global: a vocabulary shard's
pipeline finds each on the rank that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables


class LogprobTokenIdsState(SlotTables):
    """Each slot's chosen token ids (see the module docstring); registered only when
    `max_logprob_token_ids` > 0."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.capacity = config.max_logprob_token_ids
        self.token_ids = self.staged("logprob_token_ids", (self.capacity,), torch.int32, fill=-1)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        row = np.full(self.capacity, -1, dtype=np.int32)
        ids = params.logprob_token_ids or ()
        row[: len(ids)] = ids
        self.token_ids.write(slot, row)

    def ids(self, slots: torch.Tensor) -> torch.Tensor:
        """[num_rows] int64 slots -> [num_rows, C] int64 global ids, -1 where unused."""
        return self.token_ids.device[slots].long()
