"""Tensor-parallel sampling: each rank samples from its own vocabulary shard of the logits,
and the ranks trade `[num_rows, small]` row statistics instead of the logits (README,
"Tensor-parallel sampling"; docs/design.md)."""

from graphsafe_sampler.distributed.exchange import (
    ExchangeRecord,
    LoopbackExchange,
    RowExchange,
    ShardExchange,
)
from graphsafe_sampler.distributed.sampler import (
    VocabParallelRejectionSampler,
    VocabParallelSampler,
    vocab_shard,
)

__all__ = [
    "ExchangeRecord",
    "LoopbackExchange",
    "RowExchange",
    "ShardExchange",
    "VocabParallelRejectionSampler",
    "VocabParallelSampler",
    "vocab_shard",
]
