"""kernels/bitonic.py's top-K of sorted runs against torch.topk: the cut kernel's merge of
stage 1's lists (kernels/top_k_top_p.py), on its own."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from graphsafe_sampler.kernels.bitonic import top_of_sorted_runs


@triton.jit
def _top_kernel(runs_ptr, out_ptr, N: tl.constexpr, RUN: tl.constexpr, K: tl.constexpr):
    x = tl.load(runs_ptr + tl.arange(0, N))
    tl.store(out_ptr + tl.arange(0, K), top_of_sorted_runs(x, RUN, K))


@pytest.mark.parametrize(
    ("runs", "run", "k"),
    # the cut kernel's shapes (64, 16 and 4 chunks' lists of 32 into 128), then runs as
    # long as K (folds only), one run (no fold), runs of one, and K below the runs' count
    [(64, 32, 128), (16, 32, 128), (4, 32, 128), (8, 16, 16), (1, 64, 64), (32, 1, 8), (8, 4, 4)],
)
def test_the_k_largest_of_sorted_runs(runs: int, run: int, k: int) -> None:
    """The K largest of the runs, descending, equal to torch.topk's values, on fresh
    lists: mostly -inf padded as stage 1's are, with ties inside and across runs, each run
    given ascending where its index is even and descending where odd."""
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    gen = torch.Generator().manual_seed(seed)
    lists = torch.randn(runs, run, generator=gen) * 3
    lists[torch.rand(runs, run, generator=gen) < 0.5] = float("-inf")
    lists[:, 0] = torch.randint(0, 4, (runs,), generator=gen).float()  # ties across runs
    lists[0, : max(1, run // 2)] = 2.0  # and within one
    ordered = lists.sort(dim=1, descending=True).values
    even = (torch.arange(runs) % 2 == 0)[:, None]
    laid_out = torch.where(even, ordered.flip(1), ordered).reshape(-1).contiguous()
    out = torch.empty(k)
    _top_kernel[(1,)](laid_out, out, runs * run, run, k)
    assert torch.equal(out, lists.reshape(-1).topk(k).values)
