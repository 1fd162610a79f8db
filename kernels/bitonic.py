"""The K largest of sorted runs, in Triton: a bitonic top-K network that starts from runs
already sorted, for the cut kernel's merge of stage 1's lists (kernels/top_k_top_p.py).

The key idea: `tl.topk` sorts its input from single elements up, log2(K) merges of
compare-exchange levels before its folds, while stage 1's lists come sorted. Loaded in
alternating order (a chunk's list reversed where the chunk's index is even), runs of R
elements are what a bitonic sort leaves after its log2(R)-th merge, so the network starts
at the next one: of the 28 levels a run of 128 takes, lists of 32 skip the first 15.
The folds are the usual bitonic top-K's: of two adjacent runs of K, one ascending and one
descending, the larger element of each pair forms a bitonic run holding their K largest,
which one more merge sorts. docs/kernels.md, top-k/top-p (the merged buffer)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.constexpr_function
def _log2(n: int) -> int:
    """log2 of a power of two, at compile time."""
    return n.bit_length() - 1


@triton.jit
def _bit(N_BITS: tl.constexpr, BIT: tl.constexpr):
    """[2] * N_BITS, broadcastable: bit BIT of the flat index of a hypercube whose dim d
    holds bit N_BITS - 1 - d (row-major)."""
    values = tl.arange(0, 2)
    return tl.reshape(values, [1] * (N_BITS - 1 - BIT) + [2] + [1] * BIT)


@triton.jit
def _exchange(h, N_BITS: tl.constexpr, BIT: tl.constexpr, BY: tl.constexpr):
    """One compare-exchange level on the hypercube h ([2] * N_BITS): each element against
    its partner across bit BIT, the pair ascending where bit BY of the index is 0 and
    descending where it is 1, or descending throughout for BY = N_BITS (a merge into runs
    of 2**BY leaves them sorted so: alternating, or one run, descending)."""
    partner = tl.flip(h, N_BITS - 1 - BIT)  # over a dim of 2: the other of the pair
    is_right = _bit(N_BITS, BIT)
    if BY == N_BITS:  # noqa: SIM108 (a constexpr guard: one branch is compiled)
        keeps_max = is_right == 0
    else:
        keeps_max = is_right != _bit(N_BITS, BY)
    return tl.where(keeps_max, tl.maximum(h, partner), tl.minimum(h, partner))


@triton.jit
def top_of_sorted_runs(x, RUN: tl.constexpr, K: tl.constexpr):
    """[K] the K largest of x ([N], float32 without NaN), sorted descending, where x is
    made of runs of RUN elements, each sorted ascending where its index // RUN is even and
    descending where it is odd. N, K and RUN powers of two, RUN <= K <= N."""
    N_BITS: tl.constexpr = _log2(x.shape[0])
    RUN_BITS: tl.constexpr = _log2(RUN)
    K_BITS: tl.constexpr = _log2(K)
    if RUN_BITS == N_BITS:  # one run, ascending: already all of it
        top = tl.flip(x, 0)
    else:
        h = tl.reshape(x, [2] * N_BITS)
        # the merges up to runs of K, alternating (one run, descending, when N = K)
        for stage in tl.static_range(RUN_BITS + 1, K_BITS + 1):
            for level in tl.static_range(stage):
                h = _exchange(h, N_BITS, stage - 1 - level, stage)
        # the folds: each pair of runs of K (bit K_BITS tells them apart) to the larger of
        # each pair of elements, then one merge, alternating until the last (one run,
        # descending)
        for fold in tl.static_range(N_BITS - K_BITS):
            # the hypercube's bits after the fold: N_BITS - 1 - fold
            h = tl.max(h, axis=N_BITS - 1 - fold - K_BITS)
            for level in tl.static_range(K_BITS):
                h = _exchange(h, N_BITS - 1 - fold, K_BITS - 1 - level, K_BITS)
        top = tl.reshape(h, [K])
    return top
