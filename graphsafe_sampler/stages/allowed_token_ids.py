"""allowed_token_ids: every token outside the request's list becomes -inf.

Each slot holds a bitmask over the vocabulary (xgrammar's layout, see `bitmask.py`), so a
list of any length, up to the whole vocabulary, costs ceil(V/32) int32 words. Slots without
a list (and the padding slot) have every bit set. A vocabulary shard (`VocabShard`) holds
the bits of its own ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphsafe_sampler.bitmask import bits_at, num_words, pack_token_ids
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.processors.base import SlotLogitsProcessor

_ALL_ALLOWED = -1  # int32 with every bit set


class AllowedTokenIdsLogitsProcessor(SlotLogitsProcessor):
    """Tables: allowed [num_slots, ceil(V/32)] int32 bitmask (bit set = allowed; V the
    shard's size), and restricted [num_slots] int32, 1 where the slot's request has a list
    (so that a kernel knows a slot without one from it, not from its V/32 words)."""

    def init_tables(self) -> None:
        self.shard = self.batch_state.shard
        self.allowed = self.staged(
            "allowed", (num_words(self.shard.size),), torch.int32, fill=_ALL_ALLOWED
        )
        self.restricted = self.staged("allowed_restricted", (), torch.int32, fill=0)
        self.unpacker = self.batch_state.bitmask_unpacker

    def is_argmax_invariant(self) -> bool:
        return False

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        if params.allowed_token_ids is None:
            self.allowed.write(slot, _ALL_ALLOWED)
        else:
            local = self.shard.local_ids(params.allowed_token_ids)
            self.allowed.write(slot, pack_token_ids(local, self.shard.size))
        self.restricted.write(slot, int(params.allowed_token_ids is not None))

    def apply_slots(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return logits.masked_fill_(~self.mask(slots), float("-inf"))

    def mask(self, slots: torch.Tensor) -> torch.Tensor:
        """[num_rows, V] bool: the tokens each row's request allows."""
        return self.unpacker.unpack(self.allowed.device[slots])

    def allows(self, slots: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[num_rows, C] bool: whether each row's request allows the ids [num_rows, C]."""
        return bits_at(self.allowed.device[slots], ids)
