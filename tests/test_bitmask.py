"""Bitmask packing in xgrammar's layout: token t is bit t % 32 of word t // 32."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from graphsafe_sampler.bitmask import BitmaskUnpacker, num_words, pack_token_ids


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 111, 1023], ids=lambda v: f"V{v}")
def test_pack_unpack_round_trip(vocab: int) -> None:
    rng = random.Random(vocab)
    rows = [rng.sample(range(vocab), rng.randint(1, vocab)) for _ in range(5)]
    words = torch.from_numpy(np.stack([pack_token_ids(ids, vocab) for ids in rows]))
    assert words.shape == (5, num_words(vocab)) and words.dtype == torch.int32
    mask = BitmaskUnpacker(vocab, torch.device("cpu")).unpack(words)
    for r, ids in enumerate(rows):
        assert sorted(mask[r].nonzero().flatten().tolist()) == sorted(ids)
        for tok in ids:  # xgrammar's bit arithmetic, by hand
            assert (int(words[r, tok // 32]) >> (tok % 32)) & 1 == 1


def test_bit_31_is_the_sign_bit() -> None:
    words = torch.from_numpy(pack_token_ids([31], 32))
    assert words.item() == -(2**31)
    assert BitmaskUnpacker(32, torch.device("cpu")).unpack(words[None]).nonzero().tolist() == [
        [0, 31]
    ]
