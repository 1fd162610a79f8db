"""The top-k/top-p Triton kernel (on `kernel_device`: interpreted on CPU, compiled on CUDA)
against stages/top_k_top_p.py and a float64 sort-based reference (on the host)."""

from __future__ import annotations

import pytest
import torch

from graphsafe_sampler.kernels.min_p import apply_min_p
from graphsafe_sampler.kernels.top_k_top_p import apply_top_k_top_p, top_k_top_p_threshold
from graphsafe_sampler.stages.top_k_top_p import apply_top_k_top_p as torch_top_k_top_p


def _gen() -> torch.Generator:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


def _kernel(
    logits: torch.Tensor, slots: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (masked copy of logits, thresholds), the threshold-only op checked against both."""
    got = logits.clone()
    # poisoned: every row writes
    threshold = torch.full((logits.shape[0],), float("nan"), device=logits.device)
    apply_top_k_top_p(got, slots, top_k, top_p, threshold)
    cut = torch.full_like(threshold, float("nan"))
    untouched = logits.clone()
    top_k_top_p_threshold(untouched, slots, top_k, top_p, cut)
    assert torch.equal(untouched, logits)
    assert torch.equal(cut, threshold)
    assert torch.equal(got, logits.masked_fill(logits < threshold[:, None], float("-inf")))
    return got, threshold


def _sorted_reference(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """float64, sort-based: [V] bool kept mask of one row (docs/design.md §4 step 8), on the
    host."""
    x = logits.double().cpu()
    values = x.sort(descending=True).values
    vocab = x.shape[0]
    keep = torch.ones(vocab, dtype=torch.bool)
    if 0 < top_k < vocab:
        keep = x >= values[top_k - 1]
    if top_p < 1.0:
        kept = torch.where(keep, x, float("-inf"))
        row_max = kept.max()
        mass = torch.exp(kept - (row_max if torch.isfinite(row_max) else 0.0))
        sorted_mass = mass.sort(descending=True).values
        cumulative = sorted_mass.cumsum(0)
        # the fewest top tokens whose mass reaches top_p of the total (at least one)
        n = int((cumulative < top_p * cumulative[-1]).sum()) + 1
        n = min(n, vocab)
        cut = kept.sort(descending=True).values[n - 1]
        keep = keep & (x >= cut)
    return keep


def _check_top_p_differences(
    logits: torch.Tensor, got: torch.Tensor, want: torch.Tensor, top_k: int, top_p: float
) -> bool:
    """Masks may differ only where the smaller kept set's mass is within float32 rounding of
    top_p times the total (both answers are right up to rounding). True if they differ.
    Compared on the host, where the float64 reference lives."""
    logits, got, want = logits.cpu(), got.cpu(), want.cpu()
    if torch.equal(got, want):
        return False
    x = logits.double()
    survivors = _sorted_reference(logits, top_k, 1.0)
    row_max = x[survivors].max()
    mass = torch.where(survivors, torch.exp(x - row_max), 0.0)
    total = mass.sum()
    smaller = got & want
    assert torch.equal(smaller, got) or torch.equal(smaller, want), "masks are not nested"
    assert abs(mass[smaller].sum() - top_p * total) <= 1e-5 * total
    return True


@pytest.mark.parametrize(
    ("rows", "vocab"),
    [pytest.param(1, 111, id="R1-V111"), pytest.param(17, 1023, id="R17-V1023"),
     pytest.param(5, 4099, id="R5-V4099")],
)  # fmt: skip
def test_matches_torch_backend_and_sorted_reference(
    rows: int, vocab: int, kernel_device: torch.device
) -> None:
    gen = _gen()
    num_slots = rows + 3
    # LLM-like rows: a few large logits over a long tail, with some exact ties
    logits = torch.randn(rows, vocab, generator=gen) * 2
    logits += torch.where(torch.rand(rows, vocab, generator=gen) < 0.01, 8.0, 0.0)
    logits = torch.round(logits * 64) / 64  # ties at the k-th value happen
    slots = torch.randperm(num_slots, generator=gen)[:rows]
    top_k = torch.randint(-1, vocab + 2, (num_slots,), generator=gen, dtype=torch.int32)
    top_k[torch.rand(num_slots, generator=gen) < 0.5] = torch.randint(1, 40, (1,), generator=gen)
    top_p = torch.rand(num_slots, generator=gen).clamp(min=0.05)
    top_p[torch.rand(num_slots, generator=gen) < 0.3] = 1.0
    logits, slots, top_k, top_p = (t.to(kernel_device) for t in (logits, slots, top_k, top_p))
    got, _ = _kernel(logits, slots, top_k, top_p)
    want = torch_top_k_top_p(logits.clone(), top_k[slots], top_p[slots])
    got_kept, want_kept = torch.isfinite(got), torch.isfinite(want)
    near_torch = near_ref = 0
    for r in range(rows):
        k, p = int(top_k[slots[r]]), float(top_p[slots[r]])
        if p >= 1.0:  # top-k alone is exact
            assert torch.equal(got_kept[r], want_kept[r])
        near_torch += _check_top_p_differences(logits[r], got_kept[r], want_kept[r], k, p)
        reference = _sorted_reference(logits[r], k, p)
        near_ref += _check_top_p_differences(logits[r], got_kept[r], reference, k, p)
    print(f"rows within rounding: {near_torch} vs torch, {near_ref} vs float64 sort")


def _one_row(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The kernel on one row (on its device), checked against torch and the reference."""
    device = row.device
    k, p = torch.tensor([top_k], device=device), torch.tensor([top_p], device=device)
    got, _ = _kernel(row[None], torch.zeros(1, dtype=torch.int64, device=device), k.int(), p)
    want = torch_top_k_top_p(row[None].clone(), k, p)
    assert torch.equal(got, want)
    # a kept -inf logit is still -inf: compare the finite survivors (on the host)
    kept = _sorted_reference(row, top_k, top_p) & torch.isfinite(row.cpu())
    assert torch.equal(torch.isfinite(got[0]).cpu(), kept)
    return got[0]


def test_all_masked_but_one(kernel_device: torch.device) -> None:
    row = torch.full((300,), float("-inf"), device=kernel_device)
    row[77] = -3.0
    for top_k, top_p in [(5, 1.0), (0, 0.5), (5, 0.5), (1, 0.0)]:
        assert torch.isfinite(_one_row(row, top_k, top_p)).nonzero().flatten().tolist() == [77]


def test_fewer_finite_logits_than_top_k(kernel_device: torch.device) -> None:
    row = torch.full((257,), float("-inf"), device=kernel_device)
    row[[3, 100, 200]] = torch.tensor([1.0, 2.0, -1.0], device=kernel_device)
    got = _one_row(row, 10, 1.0)
    assert torch.equal(got, row)  # k-th largest is -inf: nothing is removed
    got = _one_row(row, 2, 1.0)
    assert torch.isfinite(got).nonzero().flatten().tolist() == [3, 100]


def test_one_thousand_ties_with_top_p_half(kernel_device: torch.device) -> None:
    row = torch.full((1023,), -20.0, device=kernel_device)
    row[:1000] = 1.5  # 1,000 tied logits: half the mass is reached inside the tie
    got = _one_row(row, 0, 0.5)
    assert int(torch.isfinite(got).sum()) == 1000


def test_logits_at_the_searchs_low_end_carry_their_mass(kernel_device: torch.device) -> None:
    """The row min 2.0 is the first pass's low end exactly (its key, 0xC0000000, has the
    low 24 bits clear: the keys of 2.0 and the max 2.75 first differ at bit 21), so its
    1,000 logits take digit 0 and their mass is in the total: without it top_p's target is
    a quarter of about 211 where it is a quarter of about 683 (about 223 logits kept, not 55)."""
    gen = _gen()
    spread = 2.0 + 0.75 * (torch.randperm(300, generator=gen).float() + 1) / 300
    row = torch.cat([torch.full((1000,), 2.0), spread])
    row = row[torch.randperm(row.shape[0], generator=gen)].to(kernel_device)
    got = _one_row(row, 0, 0.25)
    assert 150 < int(torch.isfinite(got).sum()) < 300  # inside the spread, none of the 2.0s


def test_huge_logits(kernel_device: torch.device) -> None:
    gen = _gen()
    row = torch.randn(1023, generator=gen)
    row[:10] = 1e9
    row[10:20] = -1e9
    row[5] = 1e9 - 64.0  # the neighbouring float32 below 1e9
    row = row.to(kernel_device)
    assert int(torch.isfinite(_one_row(row, 3, 1.0)).sum()) == 9
    assert int(torch.isfinite(_one_row(row, 0, 0.3)).sum()) == 9
    # -row: 9 logits at -1e9 and one just above; the 1015th largest is -1e9, a 9-way tie
    assert int(torch.isfinite(_one_row(-row, 1014, 1.0)).sum()) == 1014
    assert int(torch.isfinite(_one_row(-row, 1015, 1.0)).sum()) == 1023


def test_top_p_zero_keeps_the_max_and_its_ties(kernel_device: torch.device) -> None:
    gen = _gen()
    row = torch.randn(555, generator=gen)
    row[[9, 400]] = 7.0
    row = row.to(kernel_device)
    assert torch.isfinite(_one_row(row, 0, 0.0)).nonzero().flatten().tolist() == [9, 400]


def test_non_contiguous_row_stride(kernel_device: torch.device) -> None:
    gen = _gen()
    base = torch.randn(6, 600, generator=gen).to(kernel_device)
    before = base.clone()
    logits = base[::2, :500]  # row stride 1200
    slots = torch.tensor([2, 0, 1], device=kernel_device)
    top_k = torch.tensor([7, 0, 100], dtype=torch.int32, device=kernel_device)
    top_p = torch.tensor([1.0, 0.6, 0.8], device=kernel_device)
    want = torch_top_k_top_p(logits.clone(), top_k[slots], top_p[slots])
    threshold = torch.empty(3, device=kernel_device)
    apply_top_k_top_p(logits, slots, top_k, top_p, threshold)
    assert torch.equal(torch.isfinite(logits), torch.isfinite(want))
    assert torch.equal(base[1::2], before[1::2])
    assert torch.equal(base[::2, 500:], before[::2, 500:])


def test_rows_with_filters_off_are_untouched(kernel_device: torch.device) -> None:
    gen = _gen()
    logits = torch.randn(3, 222, generator=gen).to(kernel_device)
    # 222 = V is off too
    top_k = torch.tensor([0, -1, 222], dtype=torch.int32, device=kernel_device)
    slots, top_p = torch.arange(3, device=kernel_device), torch.ones(3, device=kernel_device)
    got, threshold = _kernel(logits, slots, top_k, top_p)
    assert torch.equal(got, logits)
    assert threshold.tolist() == [float("-inf")] * 3


def test_rejects_bad_input(kernel_device: torch.device) -> None:
    device = kernel_device
    args = (
        torch.zeros(2, dtype=torch.int64, device=device),
        torch.zeros(1, dtype=torch.int32, device=device), torch.ones(1, device=device),
    )  # fmt: skip
    logits = torch.randn(2, 8).to(device)
    with pytest.raises(TypeError, match=r"top_k must be torch\.int32, got torch\.int64"):
        top_k_top_p_threshold(
            logits, args[0], args[1].long(), args[2], torch.empty(2, device=device)
        )
    with pytest.raises(ValueError, match=r"threshold must have shape \(2,\), got \(3,\)"):
        apply_top_k_top_p(logits, *args, torch.empty(3, device=device))


def test_opcheck(kernel_device: torch.device) -> None:
    device = kernel_device
    logits = torch.randn(3, 129).to(device)
    slots = torch.tensor([2, 0, 1], device=device)
    top_k = torch.tensor([5, 0, 60], dtype=torch.int32, device=device)
    top_p = torch.tensor([0.7, 0.9, 1.0], device=device)
    for op in (top_k_top_p_threshold, apply_top_k_top_p):
        threshold = torch.empty(3, device=device)
        torch.library.opcheck(op, (logits.clone(), slots, top_k, top_p, threshold))
    min_p = torch.tensor([0.1, 0.0, 0.5], device=device)
    for op in (top_k_top_p_threshold, apply_top_k_top_p):
        threshold = torch.empty(3, device=device)
        torch.library.opcheck(op, (logits.clone(), slots, top_k, top_p, threshold, min_p))


@pytest.mark.parametrize(
    ("rows", "vocab"), [pytest.param(7, 111, id="R7-V111"), pytest.param(9, 1023, id="R9-V1023")]
)
def test_folded_min_p_equals_min_p_then_top_k_top_p(
    rows: int, vocab: int, kernel_device: torch.device
) -> None:
    """min_p folded into the cut keeps exactly what min_p's mask followed by top-k/top-p
    keeps: the min_p kernel then this one, and the PyTorch stages (min_p_threshold, then
    stages/top_k_top_p.py; top-p within rounding). Rows cover min_p alone, min_p with fewer
    survivors than k, every filter off, logits tied exactly at the min_p cut, min_p = 1
    with a tie at the max, random mixes with top-p, a NaN row and an all -inf row."""
    from graphsafe_sampler.stages.min_p import min_p_threshold

    gen = _gen()
    num_slots = rows + 2
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits = torch.round(logits * 32) / 32  # ties at the cuts
    logits[rows - 2, 5] = float("nan")
    logits[rows - 1] = float("-inf")
    slots = torch.randperm(num_slots, generator=gen)[:rows]
    top_k = torch.randint(1, 60, (num_slots,), generator=gen, dtype=torch.int32)
    top_k[torch.rand(num_slots, generator=gen) < 0.3] = 0
    top_p = torch.rand(num_slots, generator=gen).clamp(min=0.05)
    top_p[torch.rand(num_slots, generator=gen) < 0.4] = 1.0
    min_p = torch.rand(num_slots, generator=gen) * 0.3
    min_p[torch.rand(num_slots, generator=gen) < 0.2] = 0.0
    # slot of row 0: min_p alone; row 1: min_p leaves fewer than k; row 2: every filter
    # off; row 3: logits tied at its min_p cut (top-k on, below it); row 4: min_p = 1
    recipes = [
        (0, 1.0, 0.2), (vocab - 1, 1.0, 0.9), (0, 1.0, 0.0), (vocab - 1, 1.0, 0.05), (0, 1.0, 1.0)
    ]  # fmt: skip
    for r, (k, p, m) in enumerate(recipes):
        s = int(slots[r])
        top_k[s], top_p[s], min_p[s] = k, p, m
    top = int(logits[4].argmax())
    tie = 9 if top != 9 else 10
    logits[4, tie] = logits[4, top]  # min_p = 1 keeps the max and its tie
    logits, slots, top_k, top_p, min_p = (
        t.to(kernel_device) for t in (logits, slots, top_k, top_p, min_p)
    )
    # the min_p kernel's own cut (its log), planted on row 3: ties sit exactly on it
    logits[3, :9:2] = logits[3].max() + torch.log(min_p[slots[3]])
    folded = logits.clone()
    cut = torch.empty(rows, device=kernel_device)
    apply_top_k_top_p(folded, slots, top_k, top_p, cut, min_p)
    cut_only = torch.empty(rows, device=kernel_device)
    untouched = logits.clone()
    top_k_top_p_threshold(untouched, slots, top_k, top_p, cut_only, min_p)
    torch.testing.assert_close(untouched, logits, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(cut_only, cut, rtol=0, atol=0, equal_nan=True)
    # with the rows' filters as processing resolves them (kernels/row_params.py), which
    # stage 1 then reads by row instead of through the slots: the same cut
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, 0)[slots].to(torch.float32)
    filters = torch.stack([k, top_p[slots], min_p[slots], torch.ones_like(k)], dim=1)
    resolved = torch.empty(rows, device=kernel_device)
    top_k_top_p_threshold(
        logits.clone(), slots, top_k, top_p, resolved, min_p, filters=filters.contiguous()
    )
    torch.testing.assert_close(resolved, cut_only, rtol=0, atol=0, equal_nan=True)

    two_kernels = logits.clone()
    apply_min_p(two_kernels, slots, min_p)
    apply_top_k_top_p(two_kernels, slots, top_k, top_p, torch.empty_like(cut))
    finite = torch.isfinite
    assert torch.equal(finite(folded), finite(two_kernels))  # the NaN row too
    assert torch.equal(finite(folded[0]), logits[0] >= logits[0].max() + torch.log(min_p[slots[0]]))
    assert int(finite(folded[1]).sum()) < int(top_k[slots[1]])  # min_p's survivors, all kept
    assert torch.equal(folded[2], logits[2])
    assert bool(finite(folded[3, :9:2]).all())  # tied at the cut: kept
    # min_p = 1 keeps exactly the maximum and its ties (the planted one at least)
    assert torch.equal(finite(folded[4]), logits[4] == logits[4, top])
    assert bool(finite(folded[4, [top, tie]]).all())
    assert float(cut[rows - 1]) == float("-inf")  # an all -inf row keeps (all of) itself

    staged = logits.clone()
    staged.masked_fill_(staged < min_p_threshold(staged, min_p[slots]), float("-inf"))
    want = torch_top_k_top_p(staged, top_k[slots], top_p[slots])
    for r in range(rows - 2):  # rows with real logits
        if r == 3:
            continue  # ties planted on the kernel's log: torch.log may differ in the last bit
        k, p = int(top_k[slots[r]]), float(top_p[slots[r]])
        got_kept, want_kept = finite(folded[r]), finite(want[r])
        if p >= 1.0:
            assert torch.equal(got_kept, want_kept), r
        else:
            _check_top_p_differences(staged[r], got_kept, want_kept, k, p)


# The candidate buffer (kernels/top_k_top_p.py): the one-pass path, checked against the
# search alone (candidates=0) and the float64 reference, with small tiles and buffers so
# that the interpreter's op-by-op bitonic network stays fast and rows fall on both sides of
# the buffer's reach.


def _launch(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    candidates: int,
    block_size: int,
    splits: int = 1,
    tile_max: torch.Tensor | None = None,
    gather: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (kept mask [rows, V], threshold [rows], reads [rows]) of the launcher with
    `candidates` (and the tile maxima, the search's `gather`), checking that apply=True
    writes exactly that mask and the same cut, and that the lists hold what they claim
    (`_check_lists`)."""
    from graphsafe_sampler.kernels.top_k_top_p import candidate_lists
    from graphsafe_sampler.kernels.top_k_top_p import launch_top_k_top_p as launch

    rows, vocab = logits.shape
    threshold = torch.full((rows,), float("nan"), device=logits.device)
    reads = torch.full((rows,), -1, dtype=torch.int32, device=logits.device)
    untouched = logits.clone()
    buffer = candidate_lists(rows, vocab, splits, logits.device, candidates, block_size)
    # covered is written for every row, the lists for the rows that keep them: -2 marks the
    # others
    buffer[0].fill_(-1)
    buffer[1].fill_(float("nan"))
    buffer[2].fill_(-2)
    launch(
        untouched, slots, top_k, top_p, threshold, False, min_p, reads, candidates, block_size,
        splits, tile_max, gather, buffer,
    )  # fmt: skip
    torch.testing.assert_close(untouched, logits, rtol=0, atol=0, equal_nan=True)
    _check_lists(logits, threshold, *buffer, slots, top_k, top_p, min_p, candidates)
    masked = logits.clone()
    applied = torch.empty_like(threshold)
    launch(
        masked, slots, top_k, top_p, applied, True, min_p, None, candidates, block_size, splits,
        tile_max, gather,
    )  # fmt: skip
    torch.testing.assert_close(applied, threshold, rtol=0, atol=0, equal_nan=True)
    kept = logits >= threshold[:, None]
    want = torch.where(kept | torch.isnan(logits), logits, float("-inf"))
    torch.testing.assert_close(masked, want, rtol=0, atol=0, equal_nan=True)
    return kept, threshold, reads


def _check_lists(
    logits: torch.Tensor,
    threshold: torch.Tensor,
    covered: torch.Tensor,
    lists: torch.Tensor,
    ids: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    candidates: int,
) -> None:
    """Stage 1's lists against the row: each listed id once, with its logit exactly; and a
    covered row (which sampling races over its lists alone) holds no NaN, and its listed
    logits at or above the cut are exactly its kept tokens. Without a buffer nothing is
    covered."""
    rows = logits.shape[0]
    assert set(covered.tolist()) <= {0, 1}
    if not candidates:
        assert not covered.any()
        return
    for r in range(rows):
        s = int(slots[r])
        filtered = 0 < int(top_k[s]) < logits.shape[1] or float(top_p[s]) < 1.0
        if not filtered and (min_p is None or float(min_p[s]) == 0.0):
            assert not covered[r], r  # an unfiltered row has no lists
            continue
        row_ids, row_values = ids[r].reshape(-1), lists[r].reshape(-1)
        if torch.all(row_ids == -2):  # top-k beyond the buffer: no lists kept
            assert not covered[r], r
            continue
        assert torch.all(row_ids >= -1), r
        listed = row_ids >= 0
        picked = row_ids[listed].long()
        assert picked.unique().numel() == picked.numel(), r
        torch.testing.assert_close(row_values[listed], logits[r, picked], rtol=0, atol=0)
        assert torch.all(row_values[~listed] == float("-inf")), r
        if covered[r]:
            assert not torch.isnan(logits[r]).any(), r
            kept = torch.nonzero(logits[r] >= threshold[r]).flatten()
            in_lists = picked[row_values[listed] >= threshold[r]]
            assert torch.equal(kept.sort().values, in_lists.sort().values), r


@pytest.mark.parametrize(
    ("rows", "vocab", "block_size", "candidates"),
    [pytest.param(6, 29, 32, 32, id="R6-V29-whole-row"),
     pytest.param(6, 767, 128, 16, id="R6-V767-C16")],
)  # fmt: skip
def test_candidate_buffer_matches_search_and_reference(
    rows: int, vocab: int, block_size: int, candidates: int, kernel_device: torch.device
) -> None:
    """LLM-like rows (peaked and flat, ties planted by rounding) under random top-k (within
    and beyond the buffer), top-p and min_p: the buffered kernel keeps what the search keeps
    (top-k exactly, top-p within float32 rounding of the target) and what the float64
    reference keeps, and rows whose kept set the buffer holds are read once."""
    from graphsafe_sampler.bench.logits import llm_like_logits
    from graphsafe_sampler.stages.min_p import min_p_threshold

    gen = _gen()
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    peaked = llm_like_logits(rows - rows // 3, vocab, peakedness=1.4, seed=seed)
    flat = llm_like_logits(rows // 3, vocab, peakedness=0.7, seed=seed + 1)
    logits = torch.round(torch.cat([peaked, flat]) * 16) / 16  # ties at the cuts
    num_slots = rows + 2
    slots = torch.randperm(num_slots, generator=gen)[:rows]
    top_k = torch.randint(1, candidates + 1, (num_slots,), generator=gen, dtype=torch.int32)
    fits = vocab <= candidates  # the whole row: no k lies beyond the buffer
    if not fits:
        beyond = torch.rand(num_slots, generator=gen) < 0.25
        size = (int(beyond.sum()),)
        top_k[beyond] = torch.randint(candidates + 1, vocab + 2, size, generator=gen).int()
    top_k[torch.rand(num_slots, generator=gen) < 0.25] = 0
    top_p = torch.rand(num_slots, generator=gen).clamp(min=0.05)
    top_p[torch.rand(num_slots, generator=gen) < 0.3] = 1.0
    min_p = torch.rand(num_slots, generator=gen) * 0.2
    min_p[torch.rand(num_slots, generator=gen) < 0.6] = 0.0
    # slot of row 0: top-k alone within the buffer; row 1: top-p alone; row 2: top-k beyond
    recipes = [(min(candidates, vocab) // 2, 1.0, 0.0), (0, 0.5, 0.0), (candidates + 1, 1.0, 0.0)]
    for r, (k, p, m) in enumerate(recipes):
        s = int(slots[r])
        top_k[s], top_p[s], min_p[s] = k, p, m
    logits, slots, top_k, top_p, min_p = (
        t.to(kernel_device) for t in (logits, slots, top_k, top_p, min_p)
    )
    got, _, reads = _launch(logits, slots, top_k, top_p, min_p, candidates, block_size)
    want, _, search_reads = _launch(logits, slots, top_k, top_p, min_p, 0, block_size)
    staged = logits.masked_fill(logits < min_p_threshold(logits, min_p[slots]), float("-inf"))
    near = 0
    for r in range(rows):
        s = int(slots[r])
        k, p = int(top_k[s]), float(top_p[s])
        if p >= 1.0:  # top-k (and min_p) alone: exact
            assert torch.equal(got[r], want[r]), r
        else:
            near += _check_top_p_differences(staged[r], got[r], want[r], k, p)
        reference = _sorted_reference(staged[r], k, p) & torch.isfinite(staged[r].cpu())
        _check_top_p_differences(
            staged[r], got[r].cpu() & torch.isfinite(staged[r].cpu()), reference, k, p
        )
    reads, search_reads = reads.cpu(), search_reads.cpu()
    assert int(reads[0]) == 1  # the k-th largest read off the buffer
    assert int(search_reads[0]) > 1  # no buffer: the search
    if fits:  # every filtered row is read once, the others not at all (row 2's k >= V is off)
        assert bool((reads <= 1).all())
    else:
        assert int(reads[2]) > 1  # k beyond the buffer: the search
    assert bool((reads <= search_reads).all())
    print(f"reads {reads.tolist()} (search alone {search_reads.tolist()}); {near} near rows")


def test_candidate_buffer_edges(kernel_device: torch.device) -> None:
    """Rows at the buffer's edges, each against the search alone (exact masks here):
    ties at the k-th running past the buffer's end, an all -inf row, a NaN, a row with
    fewer logits than k, top_p = 0 with a tied max, logits of +-1e9, and -0.0 tied with
    +0.0 at the k-th."""
    gen = _gen()
    vocab, candidates = 200, 16
    rows = torch.randn(7, vocab, generator=gen)
    rows[0, 10:50] = 9.0  # 40 tied maxima: k = 5 is exact, top-p 0.5 keeps all 40
    rows[1] = float("-inf")
    rows[2, 3] = float("nan")
    rows[3] = float("-inf")
    rows[3, [4, 90, 150]] = torch.tensor([1.0, 3.0, 2.0])  # 3 finite logits, k = 10
    rows[4, [7, 120]] = 6.0  # top_p = 0: both maxima
    rows[5, :12] = 1e9
    rows[5, 12:30] = -1e9
    rows[6, :8] = 5.0
    rows[6, 8:12] = -0.0
    rows[6, 12:15] = 0.0  # the 8th-15th largest are zeros of both signs
    rows[6, 15:] = -torch.rand(vocab - 15, generator=gen) - 1.0
    cases = [(5, 0.5), (4, 0.9), (6, 0.7), (10, 0.95), (0, 0.0), (3, 0.4), (10, 1.0)]
    num = len(cases)
    top_k = torch.tensor([k for k, _ in cases], dtype=torch.int32)
    top_p = torch.tensor([p for _, p in cases])
    slots = torch.arange(num)
    logits, slots, top_k, top_p = (t.to(kernel_device) for t in (rows, slots, top_k, top_p))
    got, threshold, reads = _launch(logits, slots, top_k, top_p, None, candidates, 64)
    want, _, _ = _launch(logits, slots, top_k, top_p, None, 0, 64)
    assert torch.equal(got, want)
    got, reads = got.cpu(), reads.cpu()
    assert int(got[0].sum()) == 40 and int(reads[0]) > 1  # top-p needed the search
    assert int((got[3] & torch.isfinite(rows[3])).sum()) == 3
    assert got[4].nonzero().flatten().tolist() == [7, 120] and int(reads[4]) == 1
    assert int(got[5].sum()) == 12
    assert int(got[6].sum()) == 15 and int(reads[6]) == 1
    print(f"reads {reads.tolist()}, thresholds {threshold.tolist()}")


# The search's gather (kernels/radix_select.py, `gather_at_or_above`): a search that stops
# once few logits lie at or above its bin, collects them, and goes on over them alone, as
# top-p's search after a gathered top-k does. A gather of 128 here, so that rows of 3,001
# logits fall on both sides of it.


def test_the_gather_cuts_the_search_short_and_keeps_its_mask(
    kernel_device: torch.device,
) -> None:
    """Flat and peaked rows (ties at the cuts, NaN, -inf, fewer finite logits than k, equal
    maxima) under top-k within and beyond the gather, top-p after it or alone, and min_p: the
    gathered search keeps what the search alone keeps (top-k exactly, top-p within float32
    rounding of the target) and what the float64 reference keeps, in fewer reads."""
    from graphsafe_sampler.bench.logits import llm_like_logits
    from graphsafe_sampler.stages.min_p import min_p_threshold

    gen = _gen()
    vocab, gather = 3001, 128
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    rows = torch.cat([
        torch.randn(3, vocab, generator=gen),
        torch.rand(2, vocab, generator=gen),
        llm_like_logits(3, vocab, peakedness=0.6, seed=seed),
        torch.round(llm_like_logits(2, vocab, peakedness=1.2, seed=seed + 1) * 8) / 8,
        torch.randn(4, vocab, generator=gen),
    ])  # fmt: skip
    rows[10, :300] = 9.0  # 300 tied maxima: more than the gather holds at the k-th
    rows[11, 7] = float("nan")
    rows[11, 100:200] = float("-inf")
    rows[12] = float("-inf")
    rows[12, :40] = torch.rand(40, generator=gen)  # 40 finite logits, k = 90
    # the k-th, 4.0, ties at the low end of the bin a search ends in (4.0's key has its
    # low 23 bits zero; the rest lies in [2, 4), in the bins before): the gather collects
    # the logits at or above its floor, those equal to it included
    rows[13] = 2.0 + 1.9 * torch.rand(vocab, generator=gen)
    rows[13, :30] = 4.0 + 0.9 * torch.rand(30, generator=gen)
    rows[13, 30:40] = 4.0
    cases = [
        (50, 1.0, 0.0), (100, 0.9, 0.0), (128, 0.99, 0.0),  # normal
        (20, 0.5, 0.0), (129, 0.8, 0.0),  # uniform: k beyond the gather, then top-p
        (0, 0.3, 0.0), (64, 0.95, 0.05), (1, 0.9, 0.0),  # flat LLM-like
        (30, 0.7, 0.0), (0, 0.05, 0.1),  # peaked, ties
        (5, 0.5, 0.0), (60, 0.9, 0.0), (90, 1.0, 0.0),  # tied maxima, NaN, 40 finite
        (35, 1.0, 0.0),  # 10 ties at the k-th, 4.0
    ]  # fmt: skip
    num = len(cases)
    top_k = torch.tensor([k for k, _, _ in cases], dtype=torch.int32)
    top_p = torch.tensor([p for _, p, _ in cases])
    min_p = torch.tensor([m for _, _, m in cases])
    slots = torch.randperm(num, generator=gen)
    top_k, top_p, min_p = (t[slots.argsort()] for t in (top_k, top_p, min_p))
    logits, slots, top_k, top_p, min_p = (
        t.to(kernel_device) for t in (rows, slots, top_k, top_p, min_p)
    )
    got, _, reads = _launch(logits, slots, top_k, top_p, min_p, 0, 64, gather=gather)
    want, _, search_reads = _launch(logits, slots, top_k, top_p, min_p, 0, 64)
    staged = logits.masked_fill(logits < min_p_threshold(logits, min_p[slots]), float("-inf"))
    # NaN is never counted nor weighed, and always kept: the reference's row is without it
    staged = staged.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    for r, (k, p, _) in enumerate(cases):
        if p >= 1.0:
            assert torch.equal(got[r], want[r]), r
        else:
            _check_top_p_differences(staged[r], got[r], want[r], k, p)
        finite = torch.isfinite(staged[r].cpu())
        reference = _sorted_reference(staged[r], k, p) & finite
        _check_top_p_differences(staged[r], got[r].cpu() & finite, reference, k, p)
    reads, search_reads = reads.cpu(), search_reads.cpu()
    # a gather ends a search that had a pass to go, and top-p after a gathered top-k
    # reads its cut off the same gather
    assert bool((reads <= search_reads).all())
    assert int(reads.sum()) < int(search_reads.sum())
    assert int(got[10].sum()) == 300  # the tied maxima, all kept
    assert int((got[12] & torch.isfinite(rows[12])).sum()) == 40
    assert int(got[13].sum()) == 40
    print(f"reads {reads.tolist()} (search alone {search_reads.tolist()})")


def test_flat_row_top_k_1000_top_p_099_reads_the_row_at_most_8_times(
    kernel_device: torch.device,
) -> None:
    """The worst case the GPU-speed issue bounds: a flat row (standard normal logits) of
    V = 151,936 under top-k 1,000 and top-p 0.99, beyond the candidate buffer, in at most 8
    reads with the compiled gather (13 without it), keeping what the float64 reference
    keeps."""
    from graphsafe_sampler.kernels.top_k_top_p import GATHER

    gen = _gen()
    logits = torch.randn(1, 151_936, generator=gen).to(kernel_device)
    slots = torch.zeros(1, dtype=torch.int64, device=kernel_device)
    top_k = torch.full((1,), 1000, dtype=torch.int32, device=kernel_device)
    top_p = torch.full((1,), 0.99, device=kernel_device)
    got, _, reads = _launch(logits, slots, top_k, top_p, None, 0, 1024, gather=GATHER)
    assert int(reads[0]) <= 8, int(reads[0])
    _check_top_p_differences(
        logits[0], got[0].cpu(), _sorted_reference(logits[0], 1000, 0.99), 1000, 0.99
    )
    print(f"reads {int(reads[0])}, kept {int(got[0].sum())}")


def _assert_same_cuts(
    logits: torch.Tensor,
    got: torch.Tensor,
    want: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> None:
    """Kept masks of two launches on rows whose slot is the row: equal where top-p is off,
    within float32 rounding of the target where it is on."""
    for r in range(logits.shape[0]):
        k, p = int(top_k[r]), float(top_p[r])
        if p >= 1.0:
            assert torch.equal(got[r], want[r]), r
        else:
            _check_top_p_differences(logits[r], got[r], want[r], k, p)


def test_split_rows_merge_their_lists(
    monkeypatch: pytest.MonkeyPatch, kernel_device: torch.device
) -> None:
    """Stage 1 split over 4 chunks a row (and 2), each keeping a list of 4 (CHUNK_PARTIAL
    lowered from 32, so that a chunk can hold more of a row's k largest than its list): the
    cut equals
    the search's (top-k exactly, top-p within float32 rounding, the chunks' masses summed in
    another order), the lists and floors change only which rows are searched, and a row
    whose k largest fit the lists is read once."""
    from graphsafe_sampler.bench.logits import llm_like_logits
    from graphsafe_sampler.kernels import top_k_top_p

    monkeypatch.setattr(top_k_top_p, "CHUNK_PARTIAL", 4)
    assert top_k_top_p.partial_size(16, 4) == 4
    gen = _gen()
    rows, vocab, candidates = 4, 320, 16
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    logits = torch.round(llm_like_logits(rows, vocab, peakedness=1.2, seed=seed) * 16) / 16
    logits[1, 64:70] = float("nan")  # min_p off for this row; its floor only in one chunk
    logits[2, 130:140] = logits[2].max() + 1.0  # 10 largest in one chunk: more than its list
    top_k = torch.tensor([3, 8, 10, 0], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.8, 1.0, 0.6])
    min_p = torch.tensor([0.0, 0.05, 0.0, 0.1])
    slots = torch.arange(rows)
    args = [t.to(kernel_device) for t in (logits, slots, top_k, top_p, min_p)]
    got, _, reads = _launch(*args, candidates, 64, splits=4)
    want, _, search_reads = _launch(*args, 0, 64)
    _assert_same_cuts(args[0], got, want, top_k, top_p)
    reads, search_reads = reads.cpu(), search_reads.cpu()
    assert int(reads[0]) == 1  # k = 3 <= each list
    assert int(reads[2]) > 1  # 10 tied largest in one chunk's list of 4: searched
    assert bool((reads <= search_reads).all())
    print(f"reads {reads.tolist()} (search alone {search_reads.tolist()})")
    # 2 chunks' lists of 4 hold fewer than the 16 candidates: the cut kernel pads the union
    got, _, _ = _launch(*args, candidates, 64, splits=2)
    _assert_same_cuts(args[0], got, want, top_k, top_p)


def test_tile_maxima_skip_the_tiles_below_every_cut(kernel_device: torch.device) -> None:
    """With the tile maxima (exact, some marked unknown), stage 1 floors a top-k row before
    its walk and skips the tiles below the floor: the cut is the one without them (top-k
    exactly, top-p within float32 rounding), buffered top-k rows are still read once, and a
    skipped tile is really not read: raising one of its logits above the cut behind the
    table's back leaves the cut where it was. Rows split in 3 chunks."""
    from tile_maxima import exact_tile_maxima

    from graphsafe_sampler.bench.logits import llm_like_logits
    from graphsafe_sampler.kernels.top_k_top_p import launch_top_k_top_p

    def kept(logits: torch.Tensor, tile_max: torch.Tensor | None) -> torch.Tensor:
        """Row 0's kept mask alone (launch_top_k_top_p, apply=False)."""
        threshold = torch.empty(1, device=kernel_device)
        launch_top_k_top_p(
            logits[:1], args[1][:1], args[2], args[3], threshold, False, args[4], None,
            candidates, block, splits, None if tile_max is None else tile_max[:1],
        )  # fmt: skip
        return (args[0][0] >= threshold[0]).cpu()

    gen = _gen()
    rows, vocab, block, candidates, splits = 4, 1280, 64, 16, 3  # 20 tiles
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    logits = torch.round(llm_like_logits(rows, vocab, peakedness=1.2, seed=seed) * 16) / 16
    logits[3, 700] = float("nan")  # a NaN row: min_p off, its NaN tile never skipped
    top_k = torch.tensor([3, 6, 12, 5], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.8, 1.0, 0.7])
    min_p = torch.tensor([0.0, 0.05, 0.1, 0.2])
    slots = torch.arange(rows)
    tile_max = exact_tile_maxima(logits, block)
    unknown = torch.rand(tile_max.shape, generator=gen) < 0.15
    tile_max[unknown] = float("inf")  # unknown tiles: read, and no floor taken from them
    args = [t.to(kernel_device) for t in (logits, slots, top_k, top_p, min_p)]
    tile_max = tile_max.to(kernel_device)
    got, _, reads = _launch(*args, candidates, block, splits, tile_max)
    want, _, plain_reads = _launch(*args, candidates, block, splits)
    _assert_same_cuts(args[0], got, want, top_k, top_p)
    reads = reads.cpu()
    assert int(reads[0]) == 1 and int(reads[2]) == 1  # top-k read off the buffer
    # row 0 (k = 3, no min_p): a tile below the 3rd largest known tile max, k of its logits
    # raised above the whole row while the table still says otherwise (one raised logit can
    # leave the k-th largest where it was, when the 2nd and 3rd largest tie)
    known = tile_max[0].cpu().clone()
    known[torch.isposinf(known)] = float("-inf")
    floor = float(known.sort(descending=True).values[2])
    below = [t for t in range(known.shape[0]) if float(tile_max[0, t]) < floor]  # not unknown
    assert below, "no tile below the floor"
    lied = args[0].clone()
    start = below[0] * block
    lied[0, start : start + int(top_k[0])] = float(logits[0].max()) + 10.0
    assert torch.equal(kept(lied, tile_max), want[0].cpu())
    assert not torch.equal(kept(lied, None), want[0].cpu())  # read, the logit would count
    print(f"reads {reads.tolist()} (without the maxima {plain_reads.tolist()})")


def test_a_skipping_row_the_lists_cannot_settle_is_searched_from_its_floor(
    kernel_device: torch.device,
) -> None:
    """A top-k row that skips tiles and still falls to the search (its k largest crowd one
    chunk past that chunk's list): the search starts from the floor stage 1 reports in place
    of the chunk's min (the k-th largest known tile max, at or below every cut of the row)
    and finds the same cut as the search over the whole row, top-k alone and then top-p."""
    from tile_maxima import exact_tile_maxima

    gen = _gen()
    rows, vocab, block, candidates, splits = 3, 8192, 64, 64, 4  # 128 tiles, lists of 32
    logits = torch.randn(rows, vocab, generator=gen)
    for row in range(rows):
        # 48 logits above the rest, in chunk 0's first 32 tiles: more than its list holds
        cols = torch.randperm(32 * block, generator=gen)[:48]
        logits[row, cols] = 8.0 + torch.rand(48, generator=gen) * 4
    top_k = torch.tensor([40, 40, 36], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.6, 0.9])
    slots = torch.arange(rows)
    tile_max = exact_tile_maxima(logits, block).to(kernel_device)
    args = [t.to(kernel_device) for t in (logits, slots, top_k, top_p)]
    got, _, reads = _launch(*args, None, candidates, block, splits, tile_max)
    want, _, _ = _launch(*args, None, 0, block)
    _assert_same_cuts(args[0], got, want, top_k, top_p)
    assert torch.all(reads.cpu() > 1), reads  # searched, not settled by the buffer
    print(f"reads {reads.tolist()}")


@pytest.mark.parametrize("splits", [1, 3])
def test_a_tile_with_two_logits_above_the_floor_merges_both(
    splits: int, kernel_device: torch.device
) -> None:
    """Stage 1 inserts both logits of a read tile holding exactly two above its floors (the
    max, then the next): planted so that the k-th largest is the smaller of such a pair, the
    cut is that value exactly and the buffer settles the row. Row 1 moves the pair's smaller
    logit to a third tile (one logit a tile), row 2 ties the pair."""
    from tile_maxima import exact_tile_maxima

    gen = _gen()
    rows, vocab, block, candidates = 3, 1280, 64, 16  # 20 tiles
    logits = -1.0 - 9.0 * torch.rand(rows, vocab, generator=gen)  # below every planted logit
    # tile -> planted logits: maxima 10, 9, 8, 7.5, 6, 5; k = 6 floors the walk at 5, so the
    # tiles read hold 1, 2, 1, 2, 1, 1 logits at or above it; the 6th largest is 7.0
    planted = {2: [10.0], 7: [9.0, 8.5], 11: [8.0], 15: [7.5, 7.0], 4: [6.0], 9: [5.0]}
    for row in range(rows):
        for tile, values in planted.items():
            columns = torch.randperm(block, generator=gen)[: len(values)] + tile * block
            logits[row, columns] = torch.tensor(values)
    logits[1, (logits[1] == 7.0).nonzero()[0]] = -5.0
    logits[1, 18 * block + 3] = 7.0  # a tile of its own
    logits[2, (logits[2] == 8.5).nonzero()[0]] = 9.0  # a tied pair: 9, 9
    top_k = torch.full((rows,), 6, dtype=torch.int32)
    top_p = torch.ones(rows)
    slots = torch.arange(rows)
    tile_max = exact_tile_maxima(logits, block)
    args = [t.to(kernel_device) for t in (logits, slots, top_k, top_p)]
    kept, threshold, reads = _launch(
        *args, None, candidates, block, splits, tile_max.to(kernel_device)
    )
    want = logits.topk(6, dim=-1).values[:, -1]
    assert want.tolist() == [7.0, 7.0, 7.0]
    assert threshold.cpu().tolist() == want.tolist()
    assert reads.cpu().tolist() == [1, 1, 1]  # settled by the buffer, the row read once
    assert torch.equal(kept.cpu(), logits >= want[:, None])


def test_candidates_must_be_a_power_of_two_within_a_tile() -> None:
    from graphsafe_sampler.kernels.top_k_top_p import launch_top_k_top_p as launch

    logits, slots = torch.zeros(1, 8), torch.zeros(1, dtype=torch.int64)
    k, p, t = torch.ones(1, dtype=torch.int32), torch.ones(1), torch.empty(1)
    for candidates, block_size in [(24, 64), (128, 64)]:
        with pytest.raises(ValueError, match="candidates must be 0 or a power of two"):
            launch(logits, slots, k, p, t, False, candidates=candidates, block_size=block_size)


def test_the_gather_must_be_a_multiple_of_16() -> None:
    """The gather pads what it collects to a multiple of 16 inside the row's scratch."""
    from graphsafe_sampler.kernels.top_k_top_p import launch_top_k_top_p as launch

    logits, slots = torch.zeros(1, 8), torch.zeros(1, dtype=torch.int64)
    k, p, t = torch.ones(1, dtype=torch.int32), torch.ones(1), torch.empty(1)
    for gather in (-16, 24, 100):
        with pytest.raises(ValueError, match="gather must be 0 or a positive multiple of 16"):
            launch(logits, slots, k, p, t, False, gather=gather)
