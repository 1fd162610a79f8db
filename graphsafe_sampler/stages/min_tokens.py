"""min_tokens: stop tokens and EOS are -inf while fewer than min_tokens tokens exist.

As in vLLM, the config's EOS is masked whatever `ignore_eos` says (that flag concerns the
engine's stopping only). The generated-token count is the BatchState's device-side
`num_generated`, advanced by commits inside the graph, never read on the host; under
speculative decoding a position also counts the drafts before it in the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.processors.base import SlotLogitsProcessor


class MinTokensLogitsProcessor(SlotLogitsProcessor):
    """Tables: min_tokens [num_slots] int32 (0 = inactive), stop_ids [num_slots, C] int32
    with C = max_stop_token_ids + 1 (room for EOS), ids local to the batch state's vocabulary
    shard, which keeps only its own."""

    def init_tables(self) -> None:
        config = self.config
        self.capacity = config.max_stop_token_ids + 1
        self.min_tokens = self.staged("min_tokens", (), torch.int32)
        self.stop_ids = self.staged("stop_ids", (self.capacity,), torch.int32)

    def is_argmax_invariant(self) -> bool:
        return False

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        stop = list(params.stop_token_ids or ())
        if self.config.eos_token_id is not None:
            stop.append(self.config.eos_token_id)
        ids = self.batch_state.shard.local_ids(stop)
        # each id once, in its first place: the kernel's walk over the table ends at the
        # block that holds the first id again (kernels/sparse_phases.py, ban_stop_ids)
        _, first = np.unique(ids, return_index=True)
        ids = ids[np.sort(first)]
        if params.min_tokens == 0 or not len(ids):
            self.min_tokens.write(slot, 0)
            self.stop_ids.write(slot, 0)
            return
        # Unused entries repeat the first id: every write to a token in `apply` then
        # carries the same value, so duplicate scatter indices cannot race.
        row = np.full(self.capacity, ids[0], dtype=np.int32)
        row[: len(ids)] = ids
        self.min_tokens.write(slot, params.min_tokens)
        self.stop_ids.write(slot, row)

    def apply_slots(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, updated in place
        slots: torch.Tensor,  # [num_rows] int64
        num_preceding: torch.Tensor | None = None,  # [num_rows] int64
    ) -> torch.Tensor:
        """num_preceding: tokens that precede each row's position within this step and
        count as generated (the speculative drafts before it); default none."""
        generated = self.batch_state.num_generated.device[slots]
        if num_preceding is not None:
            generated = generated + num_preceding
        active = generated < self.min_tokens.device[slots]  # [num_rows] bool
        ids = self.stop_ids.device[slots].long()  # [num_rows, C]
        # min with +inf leaves a logit as it is (torch.minimum keeps NaN, as amin does);
        # duplicate ids gather the same logit and write the same value. index_put_, not
        # scatter_reduce_: inductor lowers it in place, where the scatter falls back to aten
        # on a copy of the whole tensor.
        ban = torch.where(active, float("-inf"), float("inf")).to(logits.dtype)  # [num_rows]
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
        return logits.index_put_((rows, ids), torch.minimum(logits[rows, ids], ban[:, None]))
