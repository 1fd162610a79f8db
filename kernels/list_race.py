"""A covered row's token from top-k/top-p stage 1's lists alone (docs/kernels.md, sampling):
the sampling kernel's race over the lists, rank by rank, for the rows whose every kept token
is listed, instead of a walk over the row.

The key idea: each chunk's list descends, so the logits a row keeps lead every list, and the
usual row keeps a few a list. The first block of ranks of every list is raced in one round
of loads; the rest only where the last rank raced still keeps a logit somewhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .library import RACE_STAGES
from .noise import gumbel, token_hash

RACE_BLOCK = 512
"""List entries a covered row's race takes at a time (`race_lists`): RANK_BLOCK ranks of
every chunk's list, RANK_BLOCK = RACE_BLOCK / CHUNK_BLOCK (the lists' chunks, a power of
two), at most a list's length: 8 ranks of 64 padded chunks at B = 1 (56-64 registers, no
spill), every rank of every list from B = 64 on. The whole union at once, 2,048 at B = 1,
spilled."""


@triton.jit
def _load_ranks(
    first, chunk, base, list_len, chunks, values_ptr, ids_ptr, wanted, RANK_BLOCK: tl.constexpr
):
    """Ranks [first, first + RANK_BLOCK) of every chunk's list ([RANK_BLOCK, CHUNK_BLOCK]
    values and ids, `base` each chunk's list; -inf and -1 past the lists or where not
    `wanted`)."""
    rank = first + tl.arange(0, RANK_BLOCK)[:, None]
    # tl.where, not &: the interpreter cannot & a scalar bool with a block of them
    inside = tl.where(wanted, (rank < list_len) & (chunk < chunks), False)
    x = tl.load(values_ptr + base + rank, mask=inside, other=float("-inf"))
    ids = tl.load(ids_ptr + base + rank, mask=inside, other=-1)
    return x, ids


@triton.jit
def first_ranks(
    row, values_ptr, ids_ptr, num_lists, list_len, wanted, CHUNK_BLOCK: tl.constexpr,
    RANK_BLOCK: tl.constexpr,
):  # fmt: skip
    """The first RANK_BLOCK ranks of row `row`'s lists, for `race_lists`, loaded where
    `wanted` (a covered row's racing program): the sampling kernel issues them with its
    parameters, before any use of those, so that the race waits no round of its own (a
    warp issues in order: loaded inside the race, after the row's key, they waited one)."""
    chunk = tl.arange(0, CHUNK_BLOCK)[None, :]
    # (the lists' count, not the buffer's length, comes in: no integer division here)
    base = (row.to(tl.int64) * num_lists + chunk) * list_len  # [1, CHUNK_BLOCK]
    return _load_ranks(0, chunk, base, list_len, num_lists, values_ptr, ids_ptr, wanted, RANK_BLOCK)


@triton.jit
def _race_ranks(
    x, ids, first, threshold, is_random, offset, mult, best, best_id,
    RANK_BLOCK: tl.constexpr, MORE: tl.constexpr,
):  # fmt: skip
    """Ranks [first, first + RANK_BLOCK) of every chunk's list (`_load_ranks`' x and ids)
    raced into (best, best_id) -> (best, best_id, with MORE whether the last of these ranks
    keeps a logit in some chunk, else False)."""
    rank = first + tl.arange(0, RANK_BLOCK)[:, None]
    # the threshold is above every unlisted logit, so above the -inf padding too
    kept = x >= threshold
    if is_random:
        x = x + gumbel(token_hash(tl.maximum(ids, 0), offset, mult))
    x = tl.where(kept, x, float("-inf"))
    top = tl.max(tl.max(x, axis=1), axis=0)
    top_id = tl.min(tl.min(tl.where(kept & (x == top), ids, 2147483647), axis=1), axis=0)
    # the lists are not in id order: equal values keep the lower id
    take = (top > best) | ((top == best) & (top_id < best_id))
    more = tl.zeros((), tl.int1)
    if MORE:
        last = kept & (rank == first + RANK_BLOCK - 1)
        more = tl.max(tl.max(last.to(tl.int32), axis=1), axis=0) > 0
    return tl.where(take, top, best), tl.where(take, top_id, best_id), more


@triton.jit
def race_lists(
    row, first_values, first_ids, values_ptr, ids_ptr, num_lists, list_len, threshold,
    is_random, offset, mult, CHUNK_BLOCK: tl.constexpr, RANK_BLOCK: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
):  # fmt: skip
    """A covered row's token from its listed logits alone (`first_ranks` its first block,
    loaded by the caller): those at or above the threshold
    are every token the row keeps, so the greedy argmax, or the race's argmax of logit +
    noise (the same noise of the same ids), lowest id on ties, is the walk's token.

    Each chunk's list descends, so the logits it keeps lead it. The first RANK_BLOCK ranks of
    every list are raced at once (at B = 1, 8 ranks of 50 lists of 32); the rest, only where
    the last of those ranks still keeps a logit in some chunk (no later rank can keep one
    where it does not), RANK_BLOCK ranks at a time, the next ones' loads in flight while
    one is raced (`library.RACE_STAGES`). The usual row keeps a few logits a chunk: one
    round of loads, where racing the whole union took 7 pipelined blocks at B = 1. With
    ONE_BLOCK (RANK_BLOCK >= the lists' length: the whole union, from B = 64 on) there is
    nothing after the first block to look for."""
    best = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), 2147483647, tl.int32)
    best, best_id, more = _race_ranks(
        first_values, first_ids, 0, threshold, is_random, offset, mult, best, best_id,
        RANK_BLOCK, not ONE_BLOCK,
    )  # fmt: skip
    if more:
        chunk = tl.arange(0, CHUNK_BLOCK)[None, :]
        base = (row.to(tl.int64) * num_lists + chunk) * list_len  # [1, CHUNK_BLOCK]
        for first in tl.range(RANK_BLOCK, list_len, RANK_BLOCK, num_stages=RACE_STAGES):
            x, ids = _load_ranks(
                first, chunk, base, list_len, num_lists, values_ptr, ids_ptr, True, RANK_BLOCK
            )
            best, best_id, _ = _race_ranks(
                x, ids, first, threshold, is_random, offset, mult, best, best_id, RANK_BLOCK,
                False,
            )  # fmt: skip
    # the row's max is at or above the threshold, so listed: never unset (0 if it were)
    return tl.where(best_id == 2147483647, 0, best_id)
