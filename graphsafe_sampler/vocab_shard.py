"""`VocabShard`: the contiguous range of token ids whose logits one rank holds.

With tensor parallelism the LM head is split by vocabulary: rank r of W holds the logits of
ids [start, end). A sampler's state that is indexed by token (penalty counts, the prompt
bitmask, bias entries, allowed ids, stop ids, the last tokens of bad words, grammar words)
then holds only those ids, at local index `id - start`; everything indexed by request
(temperature, seeds, positions, generated counts, the window of recent outputs) is the same
on every rank. A single-device sampler is the one shard [0, V).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

VOCAB_PADDING = 64
"""vLLM pads the LM head's vocabulary to a multiple of this before splitting it
(`DEFAULT_VOCAB_PADDING_SIZE`); the padding ids are no tokens and belong to no shard."""


def shard_range(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """(start, end): the real token ids rank `rank` of `world_size` holds.

    As vLLM's `VocabParallelEmbedding` splits its (unquantised, no LoRA) vocabulary: the
    size is padded to a multiple of 64, each rank takes `padded / world_size` ids in rank
    order, and the padding is left out, so the last shards may be shorter. Where
    `world_size` does not divide the padded size (vLLM refuses that), each rank takes
    ceil(padded / world_size) ids. Raises ValueError where a rank would hold no token.
    """
    for name, value in (("vocab_size", vocab_size), ("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank = {rank} is outside [0, world_size = {world_size})")
    padded = -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    per_rank = -(-padded // world_size)
    if (world_size - 1) * per_rank >= vocab_size:
        raise ValueError(
            f"vocab_size = {vocab_size} split over {world_size} ranks ({per_rank} ids each, "
            f"padded to {padded}) leaves the last rank no token"
        )
    start = rank * per_rank
    return start, min(start + per_rank, vocab_size)


@dataclass(frozen=True)
class VocabShard:
    """Token ids [start, end) of a vocabulary of `vocab_size` ids (`whole`: all of them)."""

    vocab_size: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= self.vocab_size:
            raise ValueError(
                f"shard [{self.start}, {self.end}) is not a non-empty range of "
                f"[0, {self.vocab_size})"
            )

    @classmethod
    def whole(cls, vocab_size: int) -> VocabShard:
        return cls(vocab_size, 0, vocab_size)

    @property
    def size(self) -> int:
        """Ids in the shard: the width of its logits and of its token-indexed tables."""
        return self.end - self.start

    @property
    def is_whole(self) -> bool:
        return self.size == self.vocab_size

    def holds(self, token_id: int) -> bool:
        return self.start <= token_id < self.end

    def local_ids(self, token_ids: Iterable[int]) -> np.ndarray:
        """int64 local indices of the ids that fall in the shard, in their order (host)."""
        # a list converts in one call; a generator through fromiter
        if isinstance(token_ids, (list, tuple, np.ndarray)):
            ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        else:
            ids = np.fromiter((int(t) for t in token_ids), dtype=np.int64)
        return ids[(ids >= self.start) & (ids < self.end)] - self.start

    def local(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(local index, in shard) of int64 global ids, same shape (graph-safe): ids outside
        the shard read as index 0, which a caller masks with `in shard`."""
        local = token_ids - self.start
        inside = (local >= 0) & (local < self.size)
        return torch.where(inside, local, 0), inside
