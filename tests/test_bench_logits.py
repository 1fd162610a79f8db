"""`graphsafe_sampler.bench.logits.llm_like_logits`: the properties the benchmarks rely on."""

from __future__ import annotations

import pytest
import torch

from graphsafe_sampler.bench.logits import NOISE_STD, SCALE, TOP_LOGIT, llm_like_logits


def top1_mass(logits: torch.Tensor) -> float:
    return float(logits.softmax(dim=-1).amax(dim=-1).mean())


def test_seeded_determinism() -> None:
    a = llm_like_logits(4, 1000, seed=7)
    b = llm_like_logits(4, 1000, seed=7)
    c = llm_like_logits(4, 1000, seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # The dtype and device only change the representation, never the draw.
    torch.testing.assert_close(
        llm_like_logits(4, 1000, seed=7, dtype=torch.bfloat16).float(),
        a.to(torch.bfloat16).float(),
        rtol=0,
        atol=0,
    )


def test_peakedness_raises_top1_mass_monotonically() -> None:
    masses = [top1_mass(llm_like_logits(16, 32_000, peakedness=p)) for p in (0.7, 0.9, 1.1, 1.4)]
    assert masses == sorted(masses) and len(set(masses)) == len(masses), masses
    # The documented scale at the default: about 45% of the mass on the top token.
    assert 0.35 < top1_mass(llm_like_logits(16, 32_000)) < 0.55


def test_each_row_is_a_permutation_of_the_zipf_profile() -> None:
    rows, vocab, peakedness = 8, 5000, 1.1
    logits = llm_like_logits(rows, vocab, peakedness=peakedness, seed=3)
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    profile = (TOP_LOGIT - SCALE * peakedness * ranks.log()).float()
    # Sorted, every row is the rank profile up to the noise: the generator only permutes it.
    sorted_rows = logits.sort(dim=-1, descending=True).values
    assert float((sorted_rows - profile).abs().max()) < 6 * NOISE_STD
    # The permutation differs per row and scatters the likely tokens over the vocabulary.
    top = logits.topk(10, dim=-1).indices
    assert len({tuple(r) for r in top.tolist()}) == rows
    assert float(top.float().mean()) > vocab / 4  # not bunched at low ids


def test_not_flat_like_randn() -> None:
    # docs/design.md §6: top-p must keep few tokens. At the default, top-p 0.9 keeps a few dozen.
    probs = llm_like_logits(4, 32_000).softmax(dim=-1).sort(dim=-1, descending=True).values
    kept = (probs.cumsum(dim=-1) < 0.9).sum(dim=-1) + 1
    assert int(kept.max()) < 200


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"num_rows": 0, "vocab_size": 10}, "num_rows >= 1", id="no-rows"),
        pytest.param({"num_rows": 1, "vocab_size": 1}, "vocab_size >= 2", id="vocab-1"),
        pytest.param({"num_rows": 1, "vocab_size": 10, "peakedness": 0.0}, "peakedness", id="flat"),
    ],
)
def test_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        llm_like_logits(**kwargs)
