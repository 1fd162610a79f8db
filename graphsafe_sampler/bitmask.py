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


def pack_token_ids(token_ids: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    """[ceil(V/32)] int32 words with the bits of `token_ids` set (host side)."""
    bits = np.zeros(num_words(vocab_size) * 32, dtype=np.uint8)
    bits[np.asarray(token_ids, dtype=np.int64)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


def bits_at(
    words: torch.Tensor,  # [rows, ceil(V/32)] int32
    ids: torch.Tensor,  # [rows, C] int64 token ids in [0, V)
) -> torch.Tensor:
    """[rows, C] bool: each id's bit of its row (a gather a token, for a few ids a row)."""
    word = words.gather(1, ids >> 5)  # [rows, C]
    return ((word >> (ids & 31).to(torch.int32)) & 1) != 0


class BitmaskUnpacker:
    """Expands bitmask words to a `[rows, V]` bool mask on the device (graph-safe).

    Each word is masked with bits 0..31 and the `[rows, W, 32]` results read as
    `[rows, 32 W]`: every load is a word a group of 32 tokens shares, where a gather through
    a per-token word index would load each token's word on its own (measured 3-6x slower on
    a CPU, eager and compiled: perf/README.md).
    """

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        # bit 31, token 31 of a word, is the sign bit: int32's minimum
        bits = [1 << i for i in range(31)] + [-(2**31)]
        self.bits = torch.tensor(bits, dtype=torch.int32, device=device)  # [32]

    def unpack(self, words: torch.Tensor) -> torch.Tensor:
        """words: [rows, ceil(V/32)] int32 -> [rows, V] bool (True = allowed)."""
        bits = words[:, :, None] & self.bits  # [rows, W, 32]
        # `!= 0`, not `.bool()`: inductor's CPU code turns an int-to-bool cast into a
        # lane-by-lane mask through the stack, a compare into one vector instruction
        return bits.view(words.shape[0], -1)[:, : self.vocab_size] != 0
