"""Token bitmasks in xgrammar's layout: int32 `[rows, ceil(V / 32)]`, bit set = allowed.

Token t is bit `t % 32` of word `t // 32` (least significant bit first). The same layout
serves allowed_token_ids and the per-step structured-output bitmask.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def num_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def pack_token_ids(token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """[ceil(V/32)] int32 words with the bits of `token_ids` set (host side)."""
    bits = np.zeros(num_words(vocab_size) * 32, dtype=np.uint8)
    bits[np.asarray(token_ids, dtype=np.int64)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


class BitmaskUnpacker:
    """Expands bitmask words to a `[rows, V]` bool mask on the device (graph-safe).

    The word index and shift of every token are computed once, so `unpack` is one gather,
    one shift and one compare.
    """

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        tokens = torch.arange(vocab_size, device=device, dtype=torch.int32)
        self.vocab_size = vocab_size
        self.word_index = (tokens // 32).long()  # [V]
        self.shift = tokens % 32  # [V] int32

    def unpack(self, words: torch.Tensor) -> torch.Tensor:
        """words: [rows, ceil(V/32)] int32 -> [rows, V] bool (True = allowed)."""
        # An arithmetic shift of a negative word still leaves the wanted bit at position 0.
        return ((words[:, self.word_index] >> self.shift) & 1).bool()
