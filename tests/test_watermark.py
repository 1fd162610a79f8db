"""Watermarking: draws keyed by (watermark key, context hash, token id) keep the sampling
distribution (chi-square), are detected from the text with the key and not without it, and
are bit-identical across backends and batch layouts. Fresh logits each run (seed printed)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from backends import BACKENDS, backend_device
from scipy import stats

from graphsafe_sampler import (
    BatchUpdate,
    MoveDirectionality,
    Sampler,
    SamplerConfig,
    detect_watermark,
)
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.testing import reference

N = 4  # context tokens


def _generate(
    params: list[SP],
    steps: int,
    seed: int,
    vocab: int = 1000,
    prompt: list[int] | None = None,
    shared: bool = False,
) -> list[list[int]]:
    """Each request's tokens, one per row, over `steps` steps of fresh random logits (the
    entropy of a chatty model: a few nats); `shared`: every row the same logits."""
    rows = len(params)
    config = SamplerConfig(rows, vocab, watermark_context_len=N, seed=0)
    sampler = Sampler(config, "cpu")
    added = [(r, p, prompt, []) for r, p in enumerate(params)]
    sampler.update_state(BatchUpdate(rows, added=added))
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        logits = torch.randn(1 if shared else rows, vocab, generator=gen).expand(rows, -1) * 2.5
        out.append(sampler(logits).sampled_token_ids[:, 0].tolist())
    return [list(column) for column in zip(*out, strict=True)]


def test_200_watermarked_tokens_are_detected_and_unwatermarked_ones_are_not() -> None:
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    key = random.Random(seed).randrange(2**64)
    prompt = [11, 12, 13]
    # row 0 watermarked, rows 1..20 plain (their own seeds), side by side
    params = [SP(watermark_key=key)] + [SP(seed=s) for s in range(20)]
    marked, *plains = _generate(params, 200, seed, prompt=prompt)
    found = detect_watermark(marked, key, N, prompt)
    assert found.p_value < 1e-6, found
    # other text scored with this key, and the watermarked text with another: nothing found
    plain_p = [detect_watermark(plain, key, N, prompt).p_value for plain in plains]
    plain_p.append(detect_watermark(marked, key ^ 1, N, prompt).p_value)
    # p is uniform on text without the watermark: at most 5 of 21 below 0.01 (a correct
    # detector has more in 4.8e-8 of the runs; "at most 2" failed in 1.2e-3 of them), where
    # a detector that fires on plain text has most of them near 0
    assert sum(p <= 0.01 for p in plain_p) <= 5, plain_p
    # and not all large either (a detector that never fires would pass the above)
    assert min(plain_p) < 0.9


def test_a_watermark_keeps_the_sampling_distribution() -> None:
    """Chi-square over 1,024 requests x 50 rounds, each round fresh contexts: 51,200 draws."""
    vocab, rows, rounds = 64, 1024, 50
    # small capacities, as the Sampler's chi-square test has them (tests/test_sampler.py):
    # 53 tokens a request at most
    config = SamplerConfig(
        max_num_reqs=rows, vocab_size=vocab, seed=11, max_model_len=128, max_bad_words=1,
        max_bad_word_len=2, max_bad_words_tokens=2, max_logit_bias_tokens=2,
        max_stop_token_ids=1, watermark_context_len=N,
    )  # fmt: skip
    sampler = Sampler(config, "cpu")
    params = SP(temperature=0.9, top_k=40)
    base = torch.from_numpy(np.random.default_rng(3).normal(0, 1.5, vocab)).float()
    req = reference.DriverRequest(params, [1, 2, 3], [])
    processed, _, _ = reference.pipeline(base.double().numpy(), req, config)
    want = np.exp(processed - processed.max())
    want /= want.sum()
    rows_added = [(r, SP(temperature=0.9, top_k=40, watermark_key=r), [1, 2, 3], [])
                  for r in range(rows)]  # fmt: skip
    sampler.update_state(BatchUpdate(rows, added=rows_added))
    counts = np.zeros(vocab)
    logits = base.repeat(rows, 1)
    history = torch.Generator().manual_seed(7)
    for _ in range(rounds):
        np.add.at(counts, sampler(logits, commit=False).sampled_token_ids[:, 0].numpy(), 1)
        # a random token enters each context (no penalties: the distribution stays fixed),
        # so the next round's draws are keyed by fresh contexts (64**4 of them)
        sampler.commit_tokens(torch.randint(vocab, (rows,), generator=history))
    support = want > 0
    assert counts[~support].sum() == 0, "drew a token outside the support"
    expected = want[support] * counts.sum()
    merged = expected >= 5
    obs = np.append(counts[support][merged], counts[support][~merged].sum())
    exp = np.append(expected[merged], expected[~merged].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    p = stats.chisquare(obs, exp).pvalue
    assert p > 1e-3, f"chi-square p = {p}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_watermarked_tokens_do_not_depend_on_backend_row_batch_or_padding(backend: str) -> None:
    vocab = 111
    config = SamplerConfig(9, vocab, backend=backend, watermark_context_len=N, seed=1)
    params = SP(temperature=1.1, top_k=40, top_p=0.95, watermark_key=2**63 + 5)
    device = backend_device(backend)
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    steps = [torch.randn(vocab, generator=gen) * 2 for _ in range(6)]

    def run(sampler: Sampler, row: int, num_rows: int) -> list[int]:
        return [
            int(sampler(x.repeat(num_rows, 1).to(device)).sampled_token_ids[row, 0]) for x in steps
        ]

    alone_sampler = Sampler(config, device)
    alone_sampler.update_state(BatchUpdate(1, added=[(0, params, [5, 6], [])]))
    alone = run(alone_sampler, 0, 1)
    crowded_sampler = Sampler(config, device)
    crowded_sampler.update_state(
        BatchUpdate(
            6,
            added=[(r, SP(temperature=0.7, seed=r, watermark_key=r), None, []) for r in range(5)]
            + [(5, params, [5, 6], [])],
            moved=[(5, 2, MoveDirectionality.SWAP)],
        )
    )
    crowded = run(crowded_sampler, 2, 9)  # row 2, a full batch, 3 padded rows
    assert alone == crowded
    # the PyTorch backend's tokens, for the Triton one to match bit for bit
    reference_sampler = Sampler(SamplerConfig(9, vocab, backend="torch",
                                              watermark_context_len=N, seed=1), "cpu")  # fmt: skip
    reference_sampler.update_state(BatchUpdate(1, added=[(0, params, [5, 6], [])]))
    assert alone == [int(reference_sampler(x[None]).sampled_token_ids[0, 0]) for x in steps]
    assert len(set(alone)) > 3  # really random


def test_the_key_not_the_seed_decides_a_watermarked_draw() -> None:
    prompt = [3, 4]
    a, b, c = _generate(
        [SP(watermark_key=99, seed=1), SP(watermark_key=99, seed=2), SP(watermark_key=98, seed=1)],
        30, 5, prompt=prompt, shared=True,
    )  # fmt: skip
    assert a == b
    assert a != c


def test_bad_watermark_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"watermark_key must be in \[-2\*\*63, 2\*\*64\)"):
        SP(watermark_key=2**64)
    with pytest.raises(TypeError, match="watermark_key must be an int"):
        SP(watermark_key=1.5)  # type: ignore[arg-type]
    sampler = Sampler(SamplerConfig(2, 50), "cpu")
    with pytest.raises(ValueError, match="needs the config's watermark_context_len"):
        sampler.update_state(BatchUpdate(1, added=[(0, SP(watermark_key=1), None, [])]))
    with pytest.raises(ValueError, match="context_len must be an int >= 1"):
        detect_watermark([1, 2], 5, 0)
    with pytest.raises(ValueError, match="token_ids must hold token ids"):
        detect_watermark([1, -2], 5, 2)
    assert detect_watermark([], 5, 2).p_value == 1.0
