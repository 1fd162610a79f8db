"""top-k / top-p filtering (stages: top_k_top_p, threshold_search, sorted_cut) vs a float64 sort.

Every test draws fresh inputs from a new seed, printed so that a failure can be replayed.
top-k must match the reference exactly. top-p sums float32 masses where the reference sums
float64 ones in sorted order, so a row may differ where some candidate set's mass lies within
float rounding of top_p: such a row must still keep a valid top-p set for a top_p within
`MASS_TOL` (an upper set of the top-k survivors, whole tie groups, holding >= top_p - tol,
that would hold < top_p + tol without its lowest group).
"""

from __future__ import annotations

import random

import pytest
import torch

import graphsafe_sampler.stages.candidates as candidates_module
from graphsafe_sampler.stages.candidates import (
    CANDIDATE_GROUP,
    CANDIDATE_TILE,
    CANDIDATES,
    TILE_BLOCK,
    TILE_LANES,
    num_tiles,
    tile_exp_sums,
    tile_max,
    tile_token_ids,
    top_candidates,
)
from graphsafe_sampler.stages.min_p import min_p_threshold
from graphsafe_sampler.stages.sorted_cut import _RADIX_SORT_MIN, descending, sorted_cut
from graphsafe_sampler.stages.threshold_search import top_k_threshold, top_p_threshold
from graphsafe_sampler.stages.top_k_top_p import (
    apply_top_k_top_p,
    candidate_cut,
    filter_scaled,
    filter_top_k_top_p,
    scaled_logits,
    top_k_top_p_cut,
)
from graphsafe_sampler.testing import SyncOpDetector

MASS_TOL = 1e-5
NEG_INF = float("-inf")


@pytest.fixture
def gen() -> torch.Generator:
    seed = random.randrange(2**31)
    print(f"seed={seed}")  # shown by pytest when the test fails
    return torch.Generator().manual_seed(seed)


# --- inputs -------------------------------------------------------------------------------


def llm_logits(
    num_rows: int, vocab_size: int, gen: torch.Generator, slope: float | None = None
) -> torch.Tensor:
    """A few tokens hold most of the mass, then a long tail; token order shuffled per row.
    p(rank r) ~ r ** -slope, the slope drawn in [0.5, 3.5] per row unless given."""
    rank = torch.arange(1, vocab_size + 1, dtype=torch.float32)
    slopes = torch.rand(num_rows, 1, generator=gen) * 3.0 + 0.5 if slope is None else slope
    noise = torch.randn(num_rows, vocab_size, generator=gen) * 0.5
    values = -slopes * rank.log() + noise + torch.randn(num_rows, 1, generator=gen) * 5.0
    order = torch.rand(num_rows, vocab_size, generator=gen).argsort(dim=-1)
    return values.gather(1, order)


def tied_logits(num_rows: int, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    """Few distinct values: ties everywhere, at every boundary."""
    return torch.randint(-6, 3, (num_rows, vocab_size), generator=gen).float()


def randn_logits(num_rows: int, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(num_rows, vocab_size, generator=gen) * 3.0


def random_top_k(num_rows: int, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    choices = [0, -1, 1, 2, 5, 50, vocab_size - 1, vocab_size, vocab_size + 7]
    picks = torch.randint(0, len(choices) + 2, (num_rows,), generator=gen).tolist()
    drawn = torch.randint(1, vocab_size + 1, (num_rows,), generator=gen).tolist()
    return torch.tensor(
        [choices[i] if i < len(choices) else d for i, d in zip(picks, drawn, strict=True)],
        dtype=torch.int32,
    )


def random_top_p(num_rows: int, gen: torch.Generator) -> torch.Tensor:
    choices = [1.0, 1.0, 0.5, 1e-7, 0.9999]
    picks = torch.randint(0, len(choices) + 3, (num_rows,), generator=gen).tolist()
    drawn = (torch.rand(num_rows, generator=gen) * 0.95 + 0.05).tolist()
    return torch.tensor(
        [choices[i] if i < len(choices) else d for i, d in zip(picks, drawn, strict=True)],
        dtype=torch.float32,
    )


# --- reference ----------------------------------------------------------------------------


def reference_keep(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """docs/design.md §4 step 8 for one [V] row, in float64 with a full sort: the kept tokens."""
    x = logits.double()
    vocab_size = x.shape[0]
    keep = torch.ones(vocab_size, dtype=torch.bool)
    if 0 < top_k < vocab_size:
        keep = x >= x.sort(descending=True).values[top_k - 1]
    if top_p < 1.0:
        probs = survivor_probs(x, keep)
        sorted_probs = probs.sort(descending=True).values
        cut = min(int((sorted_probs.cumsum(0) < top_p).sum()), vocab_size - 1)
        keep &= probs >= sorted_probs[cut]
    return keep


def survivor_probs(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """float64 softmax of x over `keep` (0 elsewhere)."""
    masked = torch.where(keep, x.double(), NEG_INF)
    return torch.softmax(masked, dim=0)


def rounding_explains(out_row: torch.Tensor, logits_row: torch.Tensor, k: int, p: float) -> bool:
    """Whether `out_row` keeps a valid top-p set for some top_p within MASS_TOL of p."""
    kept = out_row > NEG_INF
    top_k_kept = reference_keep(logits_row, k, 1.0)
    if not kept.any() or (kept & ~top_k_kept).any():
        return False
    x = logits_row.double()
    lowest = x[kept].min()
    if not torch.equal(kept, top_k_kept & (x >= lowest)):
        return False
    probs = survivor_probs(x, top_k_kept)
    mass = float(probs[kept].sum())
    mass_above_lowest = float(probs[kept & (x > lowest)].sum())
    return mass >= p - MASS_TOL and mass_above_lowest < p + MASS_TOL


def check_filtered(
    out: torch.Tensor, logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> set[int]:
    """Assert `out` is logits filtered per the reference; return the rows within rounding."""
    assert out.shape == logits.shape and out.dtype == torch.float32
    rounding_rows = set()
    for row in range(logits.shape[0]):
        k, p = int(top_k[row]), float(top_p[row])
        keep = reference_keep(logits[row], k, p)
        expected = torch.where(keep, logits[row], NEG_INF)
        if torch.equal(out[row], expected):
            continue
        kept_values_intact = torch.equal(
            out[row], torch.where(out[row] > NEG_INF, logits[row], NEG_INF)
        )
        assert kept_values_intact and p < 1.0 and rounding_explains(out[row], logits[row], k, p), (
            f"row {row} (top_k={k}, top_p={p}): kept {int((out[row] > NEG_INF).sum())} tokens, "
            f"reference keeps {int(keep.sum())}"
        )
        rounding_rows.add(row)
    return rounding_rows


def filtered(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """apply_top_k_top_p on a copy, checking that it works in place and returns its input."""
    work = logits.clone()
    out = apply_top_k_top_p(work, top_k, top_p)
    assert out is work
    return out


# --- random mixes -------------------------------------------------------------------------

GENERATORS = {"llm": llm_logits, "tied": tied_logits, "randn": randn_logits}


@pytest.mark.parametrize(
    ("num_rows", "vocab_size", "kind"),
    [
        pytest.param(1, 111, "llm", id="R1-V111-llm"),
        pytest.param(3, 1023, "llm", id="R3-V1023-llm"),
        pytest.param(17, 4099, "llm", id="R17-V4099-llm"),
        pytest.param(17, 111, "tied", id="R17-V111-tied"),
        pytest.param(3, 4099, "tied", id="R3-V4099-tied"),
        pytest.param(17, 1023, "randn", id="R17-V1023-randn"),
    ],
)
def test_random_mix_matches_reference(
    num_rows: int, vocab_size: int, kind: str, gen: torch.Generator
) -> None:
    for _ in range(3):
        logits = GENERATORS[kind](num_rows, vocab_size, gen)
        top_k = random_top_k(num_rows, vocab_size, gen)
        top_p = random_top_p(num_rows, gen)
        check_filtered(filtered(logits, top_k, top_p), logits, top_k, top_p)


# --- edge cases ---------------------------------------------------------------------------


def one_finite(gen: torch.Generator) -> torch.Tensor:
    logits = torch.full((8, 1023), NEG_INF)
    cols = torch.randint(0, 1023, (8,), generator=gen)
    logits[torch.arange(8), cols] = torch.randn(8, generator=gen) * 1e3
    return logits


def five_finite(gen: torch.Generator) -> torch.Tensor:
    logits = torch.full((8, 1023), NEG_INF)
    cols = torch.rand(8, 1023, generator=gen).argsort(dim=-1)[:, :5]
    logits.scatter_(1, cols, torch.randn(8, 5, generator=gen))
    return logits


def thousand_ties(gen: torch.Generator) -> torch.Tensor:
    # 1000 tokens tied at the top (each 1/1000 of the mass, up to 23 tiny ones), shuffled.
    logits = torch.cat([torch.full((8, 1000), 2.0), torch.randn(8, 23, generator=gen) - 30.0], 1)
    return logits.gather(1, torch.rand(8, 1023, generator=gen).argsort(dim=-1))


def plus_minus_1e9(gen: torch.Generator) -> torch.Tensor:
    signs = torch.randint(0, 2, (8, 111), generator=gen).float() * 2 - 1
    logits = signs * 1e9
    logits[:4, ::7] = torch.randn(4, 16, generator=gen)  # mixed with ordinary values
    return logits


def boundary_duplicates(gen: torch.Generator) -> torch.Tensor:
    logits = torch.tensor([[5.0, 4.0, 3.0, 3.0, 3.0, 2.0, 1.0]]).repeat(8, 1)
    return logits.gather(1, torch.rand(8, 7, generator=gen).argsort(dim=-1))


def signed_zeros(gen: torch.Generator) -> torch.Tensor:
    logits = torch.tensor([[1.0, 0.0, -0.0, -1.0, -0.0, 0.0, -2.0]]).repeat(8, 1)
    return logits.gather(1, torch.rand(8, 7, generator=gen).argsort(dim=-1))


def extreme_values(gen: torch.Generator) -> torch.Tensor:
    # Float32's ends: the largest magnitudes, denormals, signed zeros and -inf.
    values = torch.tensor(
        [-3.4e38, -3.0e38, -1e30, NEG_INF, -1e-45, -0.0, 0.0, 1e-45, 3.0e38, 3.4e38]
    )
    # Rows 4-7 draw only from the negative end, where thresholds sit just above -inf.
    high = torch.tensor([[len(values)]] * 4 + [[4]] * 4)
    return values[(torch.rand(8, 111, generator=gen) * high).long()]


def llm_batch(gen: torch.Generator) -> torch.Tensor:
    return llm_logits(8, 1023, gen)


def full(value: float, num_rows: int = 8) -> torch.Tensor:
    return torch.full((num_rows,), value)


EDGE_CASES = {
    # name: (logits, top_k (a function of V), top_p, expected kept count per row or None)
    "all-inf-but-one-k5": (one_finite, lambda v: 5, full(1.0), 1),
    "all-inf-but-one-k1-tiny-p": (one_finite, lambda v: 1, full(1e-7), 1),
    "all-inf-but-one-p0.5": (one_finite, lambda v: 0, full(0.5), 1),
    "fewer-finite-than-k": (five_finite, lambda v: 10, full(1.0), 5),
    "fewer-finite-than-k-p0.9": (five_finite, lambda v: 1000, full(0.9), None),
    "1000-ties-p0.5": (thousand_ties, lambda v: 0, full(0.5), 1000),
    "1000-ties-k10": (thousand_ties, lambda v: 10, full(1.0), 1000),
    "1000-ties-k10-p0.5": (thousand_ties, lambda v: 10, full(0.5), 1000),
    "pm-1e9-k50-p0.9": (plus_minus_1e9, lambda v: 50, full(0.9), None),
    "pm-1e9-off": (plus_minus_1e9, lambda v: 0, full(1.0), None),
    "k1": (llm_batch, lambda v: 1, full(1.0), 1),
    "k1-p0.3": (llm_batch, lambda v: 1, full(0.3), 1),
    "kV": (llm_batch, lambda v: v, full(1.0), 1023),
    "kV-1": (llm_batch, lambda v: v - 1, full(1.0), 1022),
    "tiny-p": (llm_batch, lambda v: 0, full(1e-7), 1),
    "tiny-p-k200": (llm_batch, lambda v: 200, full(1e-30), 1),
    "dup-boundary-k3": (boundary_duplicates, lambda v: 3, full(1.0), 5),
    "dup-boundary-k4-p0.99": (boundary_duplicates, lambda v: 4, full(0.99), None),
    "signed-zero-k2": (signed_zeros, lambda v: 2, full(1.0), 5),
    "extremes-k5": (extreme_values, lambda v: 5, full(1.0), None),
    "extremes-k30-p0.7": (extreme_values, lambda v: 30, full(0.7), None),
    "extremes-k100": (extreme_values, lambda v: 100, full(1.0), None),
    "p0": (llm_batch, lambda v: 0, full(0.0), 1),
}


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_case(case: str, gen: torch.Generator) -> None:
    make_logits, make_k, top_p, expected_count = EDGE_CASES[case]
    logits = make_logits(gen)
    top_k = torch.full((8,), make_k(logits.shape[1]), dtype=torch.int64)
    out = filtered(logits, top_k, top_p)
    check_filtered(out, logits, top_k, top_p)
    if expected_count is not None:
        assert (out > NEG_INF).sum(-1).tolist() == [expected_count] * 8
    # Whatever survives, the row max does.
    assert torch.equal(out.amax(-1), logits.amax(-1))


# --- the threshold helpers ----------------------------------------------------------------


def test_top_k_threshold_is_kth_largest(gen: torch.Generator) -> None:
    logits = tied_logits(17, 1023, gen)
    logits[::2] = llm_logits(9, 1023, gen)
    top_k = random_top_k(17, 1023, gen)
    is_on = (top_k > 0) & (top_k < 1023)
    kth = logits.sort(dim=-1, descending=True).values.gather(
        1, (top_k.long().clamp(1, 1023) - 1)[:, None]
    )
    expected = torch.where(is_on[:, None], kth, NEG_INF)
    assert torch.equal(top_k_threshold(logits, top_k), expected)


def test_top_p_threshold_alone_matches_reference(gen: torch.Generator) -> None:
    logits = llm_logits(17, 1023, gen)
    top_p = random_top_p(17, gen)
    threshold = top_p_threshold(logits, top_p)
    out = logits.masked_fill(logits < threshold, NEG_INF)
    check_filtered(out, logits, torch.zeros(17, dtype=torch.int32), top_p)


@pytest.mark.parametrize("make_logits", [llm_batch, thousand_ties, one_finite, five_finite,
                                         plus_minus_1e9, boundary_duplicates, signed_zeros,
                                         extreme_values, lambda g: tied_logits(8, 1023, g)],
                         ids=["llm", "ties", "one-finite", "five-finite", "pm-1e9", "dup",
                              "zeros", "extremes", "tied"])  # fmt: skip
def test_sorted_cut_equals_the_searches(make_logits, gen: torch.Generator) -> None:  # type: ignore[no-untyped-def]
    """Eager on a CPU, the rows the candidates leave take `sorted_cut`'s cut: the searches'
    on every row (top-k's exactly), but where both keep a top-p set within rounding of
    the masses. Rows 0-1 hold a NaN, which neither counts, row 1 nothing else above -inf
    (no mass: every t reaches top-p's target); their top_p (off, or tiny) puts the cut at
    the k-th value or the row max, where no rounding decides."""
    logits = make_logits(gen)
    num_rows, vocab_size = logits.shape
    top_k, top_p = random_top_k(num_rows, vocab_size, gen), random_top_p(num_rows, gen)
    top_p[:2] = torch.tensor([1.0, 1e-7])
    logits[1] = NEG_INF
    cols = torch.randint(0, vocab_size, (2,), generator=gen)
    logits[torch.arange(2), cols] = float("nan")
    sort = sorted_cut(logits, top_k, top_p)
    searches = top_p_threshold(logits, top_p, top_k_threshold(logits, top_k))
    torch.testing.assert_close(sort[:2], searches[:2], rtol=0, atol=0, equal_nan=True)
    # and the stage takes it for the rows the candidates leave
    # given the candidates, the sort takes the row max from them (NaN first)
    candidates = top_candidates(logits, min(CANDIDATES, vocab_size))
    stage = top_k_top_p_cut(
        logits, top_k, top_p, conditional=False, candidates=candidates, sort=True
    )
    settled = candidate_cut(logits, top_k, top_p)[1]
    unsettled = ~settled[:, 0]
    torch.testing.assert_close(stage[unsettled], sort[unsettled], rtol=0, atol=0, equal_nan=True)
    rest = logits[2:]
    by_sort, by_search = (rest.masked_fill(rest < cut[2:], NEG_INF) for cut in (sort, searches))
    rounding = check_filtered(by_sort, rest, top_k[2:], top_p[2:])
    rounding |= check_filtered(by_search, rest, top_k[2:], top_p[2:])
    same = [r for r in range(num_rows - 2) if r not in rounding]
    assert torch.equal(sort[2:][same], searches[2:][same])


@pytest.mark.parametrize(
    "vocab_size", [_RADIX_SORT_MIN // 2 - 1, _RADIX_SORT_MIN - 1, _RADIX_SORT_MIN + 4097]
)
def test_descending_equals_a_float_sort(vocab_size: int, gen: torch.Generator) -> None:
    """`sorted_cut`'s sort of float32's integer image (all rows at once below half of
    _RADIX_SORT_MIN tokens, else radix-sorted row by row, padded up to it where shorter)
    gives torch's descending float sort:
    ties, both zeros, +-inf and the extremes included (as values: -0.0 == 0.0)."""
    logits = llm_logits(3, vocab_size, gen)
    cols = torch.randperm(vocab_size, generator=gen)[:600].view(6, 100)
    logits[0, cols[0]] = 0.0
    logits[0, cols[1]] = -0.0
    logits[1, cols[2]] = NEG_INF
    logits[1, cols[3]] = float("inf")
    logits[2, cols[4]] = torch.finfo(torch.float32).max
    logits[2, cols[5]] = -torch.finfo(torch.float32).tiny
    logits[2] = logits[2].round()  # ties everywhere
    expected = logits.sort(dim=-1, descending=True).values
    assert torch.equal(descending(logits), expected)
    assert descending(logits[:0]).shape == (0, vocab_size)  # no rows: no row to stack


# --- graph safety -------------------------------------------------------------------------


def test_no_sync_ops(gen: torch.Generator) -> None:
    logits = llm_logits(17, 1023, gen)
    top_k, top_p = random_top_k(17, 1023, gen), random_top_p(17, gen)
    with SyncOpDetector("apply_top_k_top_p"):
        out = apply_top_k_top_p(logits.clone(), top_k, top_p)
    check_filtered(out, logits, top_k, top_p)


def test_compiled_fullgraph_equals_eager(gen: torch.Generator) -> None:
    """The one inductor compile of this file: a single shape, fed random and edge-case
    batches, of the branch-free cut (the searches' inductor code; the traced conditionals
    around them, which cost an inductor compile 20 s more, are checked against it in
    test_compiled_conditional_equals_branch_free and, compiled by inductor, in the Sampler
    of test_demo.py)."""
    num_rows, vocab_size = 17, 1023

    def branch_free(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        cut = top_k_top_p_cut(logits, top_k, top_p, conditional=False)
        return logits.masked_fill(logits < cut, NEG_INF)

    compiled = torch.compile(branch_free, fullgraph=True, dynamic=False)
    batches = []
    for _ in range(3):
        logits = llm_logits(num_rows, vocab_size, gen)
        logits[:8] = torch.where(torch.rand(8, 1, generator=gen) < 0.5, one_finite(gen), logits[:8])
        logits[8:16] = torch.where(
            torch.rand(8, 1, generator=gen) < 0.5, thousand_ties(gen), tied_logits(8, 1023, gen)
        )
        batches.append(
            (logits, random_top_k(num_rows, vocab_size, gen), random_top_p(num_rows, gen))
        )
    for logits, top_k, top_p in batches:
        eager_out = apply_top_k_top_p(logits.clone(), top_k, top_p)
        compiled_out = compiled(logits.clone(), top_k, top_p)
        # The two sum masses in different orders; a row may differ only where both are
        # within rounding of the reference.
        rounding_rows = check_filtered(eager_out, logits, top_k, top_p)
        rounding_rows |= check_filtered(compiled_out, logits, top_k, top_p)
        same = [r for r in range(num_rows) if r not in rounding_rows]
        assert torch.equal(compiled_out[same], eager_out[same])


# --- the candidates and the conditional ---------------------------------------------------


def test_candidates_settle_llm_rows_with_the_searches_cut(gen: torch.Generator) -> None:
    """LLM-like rows under top-k <= CANDIDATES and a top-p whose nucleus is small are
    settled: top-k's cut is the search's bit for bit, top-p's keeps a valid set (its masses
    are summed in another order); k above CANDIDATES, a nucleus past the candidates, a NaN
    and an all -inf row are not settled."""
    # slope 2: top-p 0.5 and 0.9 keep a few tokens (at 0.5 a row's nucleus could otherwise
    # pass the candidates, ~1,000 tokens at slope 0.5)
    logits = llm_logits(12, 4099, gen, slope=2.0)
    top_k = torch.tensor([50, 1, CANDIDATES, 0, 0, 50, CANDIDATES + 1, 0, 0, 50, 0, 0])
    top_p = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.5, 0.9, 1.0, 0.9999, 1.0, 0.9, 1.0, 0.3])
    logits[7] = torch.randn(4099, generator=gen) * 0.01  # flat: a nucleus of ~4,000
    logits[10, 5] = float("nan")
    logits[11] = NEG_INF
    cut, settled = candidate_cut(logits, top_k, top_p)
    want = [True, True, True, True, True, True, False, False, True, True, False, False]
    assert settled[:, 0].tolist() == want
    exact = top_p_threshold(logits, top_p, top_k_threshold(logits, top_k))
    only_k = (top_p >= 1.0) & settled[:, 0]
    assert torch.equal(cut[only_k], exact[only_k])
    out = logits.masked_fill(logits < top_k_top_p_cut(logits, top_k, top_p), NEG_INF)
    rows = [r for r in range(12) if r not in (10, 11)]
    check_filtered(out[rows], logits[rows], top_k[rows], top_p[rows])


def test_candidate_cut_asks_the_row_total_only_where_needed(gen: torch.Generator) -> None:
    """top-p's total over the row is asked only of rows with top-p on where a token
    outside the candidates may count: top-k off, or its cut equal to the last candidate
    (k = CANDIDATES, or a tie). Elsewhere the candidates' own masses are the total, the
    same terms: a `row_total` that poisons every other row leaves the cut unchanged."""
    num_rows, vocab_size = 10, 4099
    logits = llm_logits(num_rows, vocab_size, gen, slope=2.0)
    top_k = torch.tensor([40, 40, 0, 0, 20, 0, 100, 40, 0, CANDIDATES])
    top_p = torch.tensor([0.9, 1.0, 0.9, 1.0, 0.5, 0.95, 0.99, 0.9, 0.8, 0.3])
    logits[5, 100:] = NEG_INF  # fewer finite logits than CANDIDATES: every one is a candidate
    logits[7] = tied_logits(1, vocab_size, gen)  # the 40th value ties with the 128th
    logits[8] = torch.randn(vocab_size, generator=gen) * 0.01  # flat: a nucleus of ~3,000
    want_needed = [False, False, True, False, False, False, False, True, True, True]
    asked: list[torch.Tensor] = []

    def poisoned(
        rows: torch.Tensor, floor: torch.Tensor, shift: torch.Tensor, needed: torch.Tensor
    ) -> torch.Tensor:
        asked.append(needed)
        exact = torch.where(rows >= floor, torch.exp(rows - shift), 0.0).sum(-1, keepdim=True)
        return torch.where(needed, exact, float("nan"))

    cut, settled = candidate_cut(logits, top_k, top_p, row_total=poisoned)
    assert asked[0][:, 0].tolist() == want_needed
    want_cut, want_settled = candidate_cut(logits, top_k, top_p)
    assert torch.equal(settled, want_settled)
    assert torch.equal(cut, want_cut)
    # the candidates' total settles these rows as the row's does: a valid top-p set
    rows = [0, 4, 5, 6]
    assert settled[rows].all()
    out = logits.masked_fill(logits < cut, NEG_INF)
    check_filtered(out[rows], logits[rows], top_k[rows], top_p[rows])


def test_compiled_conditional_equals_branch_free(gen: torch.Generator) -> None:
    """Compiled on the CPU, the cut with the traced conditional (one compile: a cond op in
    the graph, not a branch baked in) equals the branch-free one bit for bit, both when the
    candidates settle every row (the searches skipped) and when a row needs them, and
    both when the candidates hold every top-p row's total mass and when a row needs a pass.
    aot_eager traces as inductor does and runs eager's numerics, so the branch-free twin
    runs eagerly, its searches forced (`sort=False`: 1 bit a pass, the same answer as the
    compiled 2); inductor's code for the conditionals is checked in the compiled Sampler
    against eager (test_demo.py)."""
    graphs: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        graphs.append(gm)  # Dynamo's graph, then aot_eager's compile of it
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    def with_conditional(
        logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
    ) -> torch.Tensor:
        return top_k_top_p_cut(logits, top_k, top_p, conditional=True)

    conditional = torch.compile(with_conditional, backend=recording, fullgraph=True)

    def branch_free(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        return top_k_top_p_cut(logits, top_k, top_p, conditional=False, sort=False)

    num_rows, vocab_size = 9, 2049
    for step in range(4):
        logits = llm_logits(num_rows, vocab_size, gen)
        top_k = torch.randint(1, 100, (num_rows,), generator=gen, dtype=torch.int32)
        top_p = torch.rand(num_rows, generator=gen) * 0.8 + 0.1
        if step % 2:  # a row the candidates cannot settle: k past them, or a flat nucleus
            top_k[step % num_rows] = CANDIDATES + 50
            logits[0] = torch.randn(vocab_size, generator=gen) * 0.01
            top_k[0], top_p[0] = 0, 0.99
        settled = bool(candidate_cut(logits, top_k, top_p)[1].all())
        assert settled == (step % 2 == 0)
        got = conditional(logits, top_k, top_p)
        assert torch.equal(got, branch_free(logits, top_k, top_p)), step
    assert len(graphs) == 1
    # two conditionals: top-p's pass over the rows for their total mass, and the searches
    conds = [n for n in graphs[0].graph.nodes if n.target is torch.ops.higher_order.cond]
    assert len(conds) == 2


# --- the candidates' two-level top-k and the rows they cover --------------------------------


@pytest.mark.parametrize("vocab_size", [100, 512, 4099, 8192], ids=lambda v: f"V{v}")
def test_tiles_partition_the_row_in_interleaved_blocks(
    vocab_size: int, gen: torch.Generator
) -> None:
    """Tile b * 16 + j holds tokens b * 512 + j + 16 * i: tile_max and tile_exp_sums (exp
    against each tile's finite maximum, else 0) equal a float64 reduction over exactly those
    tokens (a NaN, +inf and an all -inf row included),
    the last block padded with -inf, and tile_token_ids names the same tokens."""
    logits = randn_logits(4, vocab_size, gen)
    logits[1, int(torch.randint(vocab_size, (1,), generator=gen))] = float("nan")
    logits[2, int(torch.randint(vocab_size, (1,), generator=gen))] = float("inf")
    logits[3] = NEG_INF
    tiles = num_tiles(vocab_size)
    ids = torch.arange(vocab_size)
    owner = (ids // TILE_BLOCK) * TILE_LANES + ids % TILE_LANES  # [V]: each token's tile
    want = torch.full((4, tiles), NEG_INF, dtype=torch.float64)
    want = want.scatter_reduce(1, owner.expand(4, -1), logits.double(), "amax")
    assert torch.equal(tile_max(logits).double().nan_to_num(nan=7.0), want.nan_to_num(nan=7.0))
    shift = torch.where(want.abs() < float("inf"), want, 0.0)
    exp = torch.exp(logits.double() - shift.gather(1, owner.expand(4, -1)))
    want_sums = torch.zeros(4, tiles, dtype=torch.float64).index_add(1, owner, exp)
    maxima, got_sums = tile_exp_sums(logits)
    assert torch.equal(maxima.nan_to_num(nan=7.0), tile_max(logits).nan_to_num(nan=7.0))
    got_sums = got_sums.double()
    fin = want_sums.isfinite()
    assert torch.equal(got_sums.isfinite(), fin)
    torch.testing.assert_close(got_sums[fin], want_sums[fin], rtol=1e-5, atol=0.0)
    every = torch.arange(tiles)[None, :]  # [1, tiles]
    held = tile_token_ids(every)[0]  # [tiles, CANDIDATE_TILE]
    assert held.shape == (tiles, CANDIDATE_TILE)
    assert torch.equal(held.flatten().sort().values, torch.arange(tiles * CANDIDATE_TILE))
    inside = held < vocab_size
    assert torch.equal(owner[held[inside]], every.expand(CANDIDATE_TILE, -1).T[inside])


@pytest.mark.parametrize("vocab_size", [4099, 5000, 8192, 40000], ids=lambda v: f"V{v}")
@pytest.mark.parametrize("n", [5, CANDIDATES])
def test_top_candidates_are_topk_values(vocab_size: int, n: int, gen: torch.Generator) -> None:
    """The values equal torch.topk's bit for bit (NaN first) on LLM-like, tied, sparse
    (mostly -inf, the padding of a vocabulary that is no multiple of the tile in play),
    NaN and all -inf rows, and each id holds its value (the ids of -inf values may
    repeat, nothing else). Every case has two levels; n = 5, and n = CANDIDATES at
    V = 40,000, also cut the tile maxima at the groups' bound."""
    tiles = num_tiles(vocab_size)
    assert tiles > CANDIDATES  # two levels, not one topk
    assert (-(-tiles // CANDIDATE_GROUP) >= n) == (n == 5 or vocab_size == 40000)
    rows = [
        llm_logits(3, vocab_size, gen),
        tied_logits(3, vocab_size, gen),
        randn_logits(3, vocab_size, gen),
    ]
    sparse = randn_logits(3, vocab_size, gen)
    sparse[sparse < 2.4] = NEG_INF  # about 30 tokens left a row: -inf past them
    rows.append(sparse)
    nan = tied_logits(2, vocab_size, gen)
    nan[0, int(torch.randint(vocab_size, (1,), generator=gen))] = float("nan")
    nan[1] = NEG_INF
    rows.append(nan)
    logits = torch.cat(rows)
    got = top_candidates(logits, n, tiled=True)  # eagerly on a CPU, None would be topk
    want = logits.topk(n, dim=-1).values
    assert torch.equal(got.values.nan_to_num(nan=1e30), want.nan_to_num(nan=1e30))
    assert got.ids.dtype == torch.int64 and bool(((got.ids >= 0) & (got.ids < vocab_size)).all())
    held = logits.gather(1, got.ids)
    above = got.values > NEG_INF
    assert torch.equal(held[above], got.values[above])
    for r in range(logits.shape[0]):
        ids = got.ids[r][above[r]].tolist()
        assert len(set(ids)) == len(ids)


def test_top_candidates_tile_unless_eager_on_a_cpu_without_tiles(
    monkeypatch: pytest.MonkeyPatch, gen: torch.Generator
) -> None:
    """`tiled=None`: eagerly on a CPU, with no tiles at hand, one topk over the row (the
    tiles' small ops each cost a call there); under torch.compile, or told to, the tiles."""
    made: list[int] = []
    real = candidates_module.tile_max
    monkeypatch.setattr(candidates_module, "tile_max", lambda x: made.append(1) or real(x))
    logits = llm_logits(2, 8192, gen)
    want = logits.topk(16, dim=-1).values
    assert torch.equal(top_candidates(logits, 16).values, want) and made == []
    assert torch.equal(top_candidates(logits, 16, tiled=True).values, want) and made == [1]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert torch.equal(top_candidates(logits, 16).values, want) and made == [1, 1]


def test_covered_rows_keep_only_candidates(gen: torch.Generator) -> None:
    """A covered row keeps no token outside its candidates and has a maximum above -inf;
    rows with neither filter, a nucleus past the candidates, ties at the last candidate,
    a NaN or nothing above -inf are not covered; the mask is apply_top_k_top_p's."""
    vocab_size = 4099
    logits = llm_logits(10, vocab_size, gen, slope=2.0)
    top_k = torch.tensor([50, 0, 0, 20, 0, 0, CANDIDATES, 0, 0, 0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.8, 0.9999, 1.0, 1.0, 0.9, 1.0, 1.0])
    logits[4] = torch.randn(vocab_size, generator=gen) * 0.01  # flat: a nucleus of ~4,000
    logits[5, ::2] = NEG_INF  # neither filter, but only 2,050 tokens left
    logits[6] = tied_logits(1, vocab_size, gen)  # the k-th value ties far past the candidates
    logits[7, 3] = float("nan")
    logits[8] = NEG_INF
    logits[9, : vocab_size - 100] = NEG_INF  # neither filter, 100 tokens left: all candidates
    expected = apply_top_k_top_p(logits.clone(), top_k, top_p)
    filtered = filter_top_k_top_p(logits.clone(), top_k, top_p)
    assert torch.equal(filtered.logits.nan_to_num(nan=1e30), expected.nan_to_num(nan=1e30))
    covered = filtered.covered.tolist()
    assert covered == [True, True, False, True, False, False, False, False, False, True]
    for r in range(10):
        if covered[r]:
            outside = torch.ones(vocab_size, dtype=torch.bool)
            outside[filtered.candidates.ids[r]] = False
            assert bool(filtered.logits[r, outside].isneginf().all())
            assert float(filtered.logits[r].max()) > NEG_INF


@pytest.mark.parametrize("vocab_size", [4099, 8192], ids=lambda v: f"V{v}")
def test_filter_scaled_equals_the_stages_in_turn(vocab_size: int, gen: torch.Generator) -> None:
    """filter_scaled, which writes only the filtered logits, gives the tensors of
    temperature, min_p's mask and filter_top_k_top_p applied one after another; its greedy
    tokens are the argmax of the scaled logits, the raw logits' on temperature-1 rows
    (ties to the lowest id, the first NaN, token 0 of an all -inf row, +inf)."""
    num_rows = 12
    logits = llm_logits(num_rows, vocab_size, gen)
    logits[1] = tied_logits(1, vocab_size, gen)
    logits[2, 7::331] = float(logits[2].max()) + 1.0  # the maximum tied in many tiles
    logits[3, [40, 4000]] = float("nan")
    logits[4] = NEG_INF
    logits[5, vocab_size - 1] = float(logits[5].max()) + 1.0  # in the padded last tile
    logits[6, 123] = float("inf")
    logits[7] = torch.randn(vocab_size, generator=gen) * 0.01  # flat: past the candidates
    temperature = torch.rand(num_rows, generator=gen) * 1.5 + 0.2
    temperature[:8] = 1.0  # the rows whose greedy token is the raw argmax
    min_p = torch.where(torch.rand(num_rows, generator=gen) < 0.5, 0.0, 0.05)
    top_k = torch.randint(0, 100, (num_rows,), generator=gen, dtype=torch.int32)
    top_p = torch.where(torch.rand(num_rows, generator=gen) < 0.5, 1.0, 0.9)
    scaled = logits / temperature[:, None]
    threshold = min_p_threshold(scaled, min_p)
    stepwise = scaled.masked_fill(scaled < threshold, NEG_INF)
    assert torch.equal(
        scaled_logits(logits, temperature, threshold).nan_to_num(nan=1e30),
        stepwise.nan_to_num(nan=1e30),
    )
    want = filter_top_k_top_p(stepwise.clone(), top_k, top_p)
    got = filter_scaled(logits, temperature, min_p, top_k, top_p)
    for a, b in ((got.logits, want.logits), (got.candidates.values, want.candidates.values)):
        assert torch.equal(a.nan_to_num(nan=1e30), b.nan_to_num(nan=1e30))
    assert torch.equal(got.covered, want.covered)
    assert got.greedy is not None
    assert torch.equal(got.greedy, scaled.argmax(-1))
    assert torch.equal(got.greedy[:8], logits[:8].argmax(-1))
    assert got.greedy[:7].tolist()[2:7] == [int(logits[2].argmax()), 40, 0, vocab_size - 1, 123]
