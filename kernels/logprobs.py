"""Logprobs in Triton (docs/design.md §4 step 10), one program per row, without a [num_rows, V]
log-softmax (`compute_logprobs` in graphsafe_sampler/stages/logprobs.py is the reference).

The key idea: one pass over the row gives its top K values and ids, the sampled token's value
and rank, and the logsumexp (online: a running max and a rescaled sum), and only those K + 1
values are shifted by it; a second pass runs only in the rare case where tokens below the
sampled value merge with it after the shift. The per-row rule is `_logprobs_kernel`'s
docstring; its match with the reference (ties, NaN, ulps) and its traffic: docs/kernels.md,
logprobs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dependent_launch import await_prior_grids, pdl_launch
from .library import (
    LISTED_STAGES,
    SplitPolicy,
    arrival_counters,
    check_arrivals,
    check_raw_tiles,
    check_rows,
    check_table,
    chunk_bounds,
    exp_ftz,
    inplace_op,
    kth_known,
    kth_known_of_few,
    last_to_arrive,
    listed_tile,
    split_chunks,
    split_count,
    tile_count,
    tiles_to_visit,
)

_NO_TOKEN = 2**31 - 1  # the id of an empty top-K slot: loses every tie


@triton.jit
def _top_k_update(top_v, top_i, x, cols, in_tile, lanes, K: tl.constexpr, NO_TOKEN: tl.constexpr):
    """The running top K (values descending, K_BLOCK lanes) merged with a tile's values x at
    ids cols (in_tile: the lanes that hold one), by K selections of the largest value left,
    lowest id first among equal values (what a stable descending sort gives; torch.topk
    documents no order for ties). NaN is never picked. With K = 0 it unrolls to nothing."""
    taken_run = lanes >= K
    taken_tile = ~in_tile
    new_v = tl.full(top_v.shape, float("-inf"), tl.float32)
    new_i = tl.full(top_i.shape, NO_TOKEN, tl.int32)
    for j in tl.static_range(K):
        best = tl.maximum(
            tl.max(tl.where(taken_run, float("-inf"), top_v), axis=0),
            tl.max(tl.where(taken_tile, float("-inf"), x), axis=0),
        )
        pick = tl.minimum(
            tl.min(tl.where(~taken_run & (top_v == best), top_i, NO_TOKEN), axis=0),
            tl.min(tl.where(~taken_tile & (x == best), cols, NO_TOKEN), axis=0),
        )
        new_v = tl.where(lanes == j, best, new_v)
        new_i = tl.where(lanes == j, pick, new_i)
        taken_run |= top_i == pick
        taken_tile |= cols == pick
    return new_v, new_i


@triton.jit
def _from_tiles(
    tile_row, num_tiles, first, last, sampled, K: tl.constexpr, TILES_BLOCK: tl.constexpr
):
    """From processing's raw-tile table (each tile's max, +inf where it holds NaN, and sum
    of exp against it), for the tiles [first, last): the running max and sum, as the online
    pass would end with them (up to the float32 order of the sum); the lowest max a tile
    must reach to be read, the floor of the row's top K (`kth_known`: every one of the K
    largest lies in a tile whose max reaches it; +inf at K = 0) or the sampled value if
    lower; the largest max below the sampled value among the tiles left unread (each
    one's value nearest below it); and that floor itself."""
    tiles = tl.arange(0, TILES_BLOCK)
    bounds = tl.load(tile_row + tiles * 2, mask=tiles < num_tiles, other=float("-inf"))
    mine = (tiles >= first) & (tiles < last)
    sums = tl.load(tile_row + tiles * 2 + 1, mask=mine, other=0.0)
    maxes = tl.where(mine, bounds, float("-inf"))
    run_max = tl.max(maxes, axis=0)
    shift = tl.where(run_max == float("-inf"), 0.0, run_max)
    # an all -inf tile adds nothing (its exp(-inf - shift) would be inf for a low shift)
    run_sum = tl.sum(tl.where(maxes == float("-inf"), 0.0, sums * exp_ftz(maxes - shift)), axis=0)
    floor = tl.full((), float("inf"), tl.float32)
    if K > 0:
        if K <= 8:  # noqa: SIM108 (a constexpr branch)
            floor = kth_known_of_few(bounds, K)
        else:
            floor = kth_known(bounds, tiles, K)
    # read: max >= floor or max >= sampled (a NaN sampled value reads only those at the floor)
    lowest = tl.where(sampled < floor, sampled, floor)
    unread = mine & (bounds < lowest) & (bounds < sampled)
    below = tl.max(tl.where(unread, bounds, float("-inf")), axis=0)
    return run_max, run_sum, lowest, below, floor


@triton.jit
def _finish_row(
    row,
    row_ptr,
    vocab_size,
    token,
    sampled,  # float32: the sampled token's value
    top_v,  # [K_BLOCK] float32: the row's top K values, descending
    top_i,  # [K_BLOCK] int32: their ids
    run_max,  # float32: the row's max
    run_sum,  # float32: sum(exp(x - run_max)) (run_max -inf: 0)
    count_ge,  # int32: tokens with x >= sampled
    below,  # float32: the largest value under `sampled`
    token_ids_ptr,
    logprobs_ptr,
    ranks_ptr,
    lse_ptr,
    K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    SUBTRACT_LSE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """lse, the rank (with the rare second pass over the row) and the row's outputs, from
    its statistics (`_logprobs_kernel`'s docstring)."""
    lanes = tl.arange(0, K_BLOCK)
    lse = run_max + tl.log(run_sum)
    # as `_logprobs`: a row with every token masked keeps -inf logprobs, not NaN
    finite = (lse == lse) & (tl.abs(lse) != float("inf"))
    lse = tl.where(finite, lse, 0.0)
    rank = count_ge
    if SUBTRACT_LSE:
        sampled_lp = sampled - lse
        top_v = top_v - lse
        if below - lse >= sampled_lp:
            # some tokens under the sampled value merge with it after the shift: count them
            for start in range(0, vocab_size, BLOCK_SIZE):
                cols = start + tl.arange(0, BLOCK_SIZE)
                in_row = cols < vocab_size
                x = tl.load(row_ptr + cols, mask=in_row, other=float("-inf")).to(tl.float32)
                merged = in_row & (x < sampled) & (x - lse >= sampled_lp)
                rank += tl.sum(merged.to(tl.int32), axis=0)
    else:
        sampled_lp = sampled
    out = row.to(tl.int64) * (K + 1)
    tl.store(token_ids_ptr + out, token.to(tl.int32))
    tl.store(logprobs_ptr + out, sampled_lp)
    tl.store(token_ids_ptr + out + 1 + lanes, top_i, mask=lanes < K)
    tl.store(logprobs_ptr + out + 1 + lanes, top_v, mask=lanes < K)
    tl.store(ranks_ptr + row, rank)
    tl.store(lse_ptr + row, lse)


@triton.jit
def _logprobs_kernel(
    source_ptr,  # [num_rows, V] float32/float16/bfloat16, read only
    source_stride,  # elements between rows
    tokens_ptr,  # [num_rows] int32 or int64 sampled token per row
    token_ids_ptr,  # [num_rows, K + 1] int32, written: sampled, then top K
    logprobs_ptr,  # [num_rows, K + 1] float32, written
    ranks_ptr,  # [num_rows] int32, written
    lse_ptr,  # [num_rows] float32, written (0 where not finite)
    stats_ptr,  # [num_rows, splits, 4] float32, written (SPLIT): max, sum, count, below
    part_v_ptr,  # [num_rows, splits, K_BLOCK] float32, written (SPLIT): the chunk's top K
    part_i_ptr,  # [num_rows, splits, K_BLOCK] int32, written (SPLIT): their ids
    arrivals_ptr,  # [num_rows] int32 (SPLIT): 0, counted up and left 0 (`last_to_arrive`)
    tiles_ptr,  # [num_rows, ceil(V / BLOCK_SIZE), 2] float32 (HAS_TILES): the raw tiles
    visits_ptr,  # [num_rows, ceil(V / BLOCK_SIZE)] int32 scratch (HAS_TILES): tiles read
    sampled_ptr,  # [num_rows] float32 (HAS_SAMPLED): x[t] as float32, from the sampling kernel
    vocab_size,
    chunk,  # columns a program reads: whole tiles (the row, without SPLIT)
    K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    SUBTRACT_LSE: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_TILES: tl.constexpr,
    TILES_BLOCK: tl.constexpr,  # a power of two >= ceil(V / BLOCK_SIZE) (HAS_TILES)
    BLOCK_SIZE: tl.constexpr,
    NO_TOKEN: tl.constexpr,
    PDL: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr = 2,  # a power of two >= splits (SPLIT)
    HAS_SAMPLED: tl.constexpr = False,
):
    """Per row r with sampled token t = tokens[r], over the source row x (raw or processed
    logits, as the logprobs mode says; float32, float16 or bfloat16, read as float32):

    - lse = log(sum(exp(x))), online (running max and rescaled sum); written to lse[r], with
      0 where it is not finite (a row with every token at -inf), the shift the reference
      applies;
    - the top K values in descending order: a running top-K (K_BLOCK registers) merged with
      a tile only when the tile can change it (its max beats the K-th value and, with the
      raw tiles, reaches the row's floor), by K selections of the largest value left,
      lowest index first among equal values (`_top_k_update`), or, for a tile with one
      value that can enter (above the K-th of a full top K, at or above the floor of one
      not yet full), by inserting it at its rank (K <= 16); NaN is never picked;
    - the rank: the reference counts tokens with `x - lse >= x[t] - lse` in float32
      (logprobs modes; the shift can merge neighbours) or `x >= x[t]` (logits modes).
      Rounding is monotone, so every token with x >= x[t] counts either way, and the pass
      counts those and keeps the largest value below x[t]. Only if that value merges with
      x[t] after the shift does a second pass over the row count the merged tokens (rare:
      they must sit within an ulp of the shifted value).

    Outputs: token_ids[r] = [t, top ids...] int32, logprobs[r] = [x[t], top values...]
    minus lse in the logprobs modes (SUBTRACT_LSE), ranks[r] int32.

    With HAS_TILES (the source's tile statistics from processing, `raw_tile_stats`), the
    logsumexp comes from the table, and only the tiles that can hold one of the K largest
    (max at or above the K-th largest known max) or a token at or above x[t] are read: a
    tile left unread lies wholly below x[t], so it adds nothing to the count, and its max
    is its value nearest below x[t]. The outputs are the full pass's (lse up to the float32
    order of its sum).

    With SPLIT the row is split over programs (grid rows x splits), each scanning a chunk of
    whole tiles and writing its statistics and top K; the row's last program to finish
    (`library.last_to_arrive`) merges them (`_merge_chunks`: the top K of a row is the top K
    of its chunks' top Ks) and writes the outputs, with no launch of its own.
    """
    await_prior_grids(PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = source_ptr + row.to(tl.int64) * source_stride
    token = tl.load(tokens_ptr + row)
    # with the first loads: loaded at the token, it waited a round for it
    if HAS_SAMPLED:  # noqa: SIM108 (a constexpr guard: one branch is compiled)
        sampled = tl.load(sampled_ptr + row)
    else:
        sampled = tl.load(row_ptr + token).to(tl.float32)

    lanes = tl.arange(0, K_BLOCK)
    top_v = tl.full((K_BLOCK,), float("-inf"), tl.float32)
    top_i = tl.full((K_BLOCK,), NO_TOKEN, tl.int32)
    kth_v = tl.full((), float("-inf"), tl.float32)
    kth_i = tl.full((), NO_TOKEN, tl.int32)
    run_max = tl.full((), float("-inf"), tl.float32)
    run_sum = tl.zeros((), tl.float32)
    count_ge = tl.zeros((), tl.int32)
    below = tl.full((), float("-inf"), tl.float32)  # the largest value under `sampled`
    # (HAS_TILES) the K-th largest finite tile max: K tiles hold a value at or above it, so
    # no value below it is one of the row's K largest, and the top K takes none (at -inf,
    # no floor: fewer than K finite maxima, or no table)
    floor = tl.full((), float("-inf"), tl.float32)
    begin = part * chunk
    end = tl.minimum(begin + chunk, vocab_size)
    num_tiles = tl.cdiv(vocab_size, BLOCK_SIZE)
    tile_row = tiles_ptr + row.to(tl.int64) * num_tiles * 2
    # only the listed tiles are read (`library.tiles_to_visit`); without the table, all
    first = begin // BLOCK_SIZE
    visits = tl.cdiv(end, BLOCK_SIZE) - first
    listed = row * num_tiles + first  # int32: B x tiles < 2**31
    if HAS_TILES:
        bounds = chunk_bounds(tile_row, 2, first, first + visits, TILES_BLOCK)
        if HAS_SAMPLED:
            # the token and its value are loaded before the tile statistics' reductions:
            # ptxas issued them after (waiting on the tables a round), and moves no load
            # across a barrier
            tl.debug_barrier()
        run_max, run_sum, lowest, below, floor = _from_tiles(
            tile_row, num_tiles, first, first + visits, sampled, K, TILES_BLOCK
        )
        visits = tiles_to_visit(
            bounds, first, first + visits, lowest, visits_ptr + listed, TILES_BLOCK
        )
    for visit in tl.range(0, visits, num_stages=LISTED_STAGES):
        start = listed_tile(visits_ptr, listed, first, visit, HAS_TILES, BLOCK_SIZE)
        cols = start + tl.arange(0, BLOCK_SIZE)
        in_row = cols < end
        x = tl.load(row_ptr + cols, mask=in_row, other=float("-inf")).to(tl.float32)
        tile_max = tl.max(x, axis=0)
        if not HAS_TILES:
            # logsumexp, online; a -inf max shifts by 0 so that -inf - -inf is never NaN
            new_max = tl.maximum(run_max, tile_max)
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * exp_ftz(run_max - shift) + tl.sum(exp_ftz(x - shift), axis=0)
            run_max = new_max
        # rank: tokens at or above the sampled value, and the nearest one below it
        count_ge += tl.sum((in_row & (x >= sampled)).to(tl.int32), axis=0)
        below = tl.maximum(below, tl.max(tl.where(x < sampled, x, float("-inf")), axis=0))
        # top K: a tile changes it only with a value above the K-th, or one equal to an
        # empty K-th slot's -inf (earlier tiles' ids are lower, so they win equal values),
        # and with a finite floor only with one at or above it: the top K holds no other
        full = kth_i != NO_TOKEN
        if ((tile_max > kth_v) | ((tile_max == kth_v) & ~full)) & (tile_max >= floor):
            if K_BLOCK <= 16:
                entering = (x > kth_v) & (x >= floor)
                above = tl.sum(entering.to(tl.int32), axis=0)
                # (a top K not yet full under a floor of -inf takes a tile's -inf values
                # too: the K selections)
                if (above != 1) | ~(full | (floor > float("-inf"))):
                    top_v, top_i = _top_k_update(
                        top_v, top_i, x, cols, in_row & (x >= floor), lanes, K, NO_TOKEN
                    )
                else:
                    # one value enters (the usual tile): above the K-th of a full top K, or
                    # at or above the floor of one not yet full (whose empty lanes hold
                    # -inf). The tile's max goes in at its rank, after the earlier tiles'
                    # equal values (lower ids), the smaller ones one lane down; the K
                    # selections would give the same
                    col = tl.min(tl.where(entering, cols, NO_TOKEN), axis=0)
                    rank = tl.sum(((lanes < K) & (top_v >= tile_max)).to(tl.int32), axis=0)
                    down = tl.maximum(lanes - 1, 0)
                    shifted = (lanes > rank) & (lanes < K)
                    below_v = tl.where(shifted, tl.gather(top_v, down, 0), top_v)
                    below_i = tl.where(shifted, tl.gather(top_i, down, 0), top_i)
                    top_v = tl.where(lanes == rank, tile_max, below_v)
                    top_i = tl.where(lanes == rank, col, below_i)
            else:
                # K > 16: the insertion's gathers spilled at K = 20 (tests/cuda_compile.py)
                top_v, top_i = _top_k_update(
                    top_v, top_i, x, cols, in_row & (x >= floor), lanes, K, NO_TOKEN
                )
            kth_v = tl.max(tl.where(lanes == K - 1, top_v, float("-inf")), axis=0)
            kth_i = tl.min(tl.where(lanes == K - 1, top_i, NO_TOKEN), axis=0)
    if SPLIT:
        splits = tl.num_programs(1)
        at = row.to(tl.int64) * splits + part
        tl.store(stats_ptr + at * 4 + 0, run_max)
        tl.store(stats_ptr + at * 4 + 1, run_sum)
        tl.store(stats_ptr + at * 4 + 2, count_ge.to(tl.float32))  # exact: V < 2**24
        tl.store(stats_ptr + at * 4 + 3, below)
        tl.store(part_v_ptr + at * K_BLOCK + lanes, top_v)
        tl.store(part_i_ptr + at * K_BLOCK + lanes, top_i)
        if last_to_arrive(arrivals_ptr + row, splits):
            _merge_chunks(
                row, row_ptr, vocab_size, splits, token, sampled, stats_ptr, part_v_ptr,
                part_i_ptr, token_ids_ptr, logprobs_ptr, ranks_ptr, lse_ptr, K, K_BLOCK,
                SUBTRACT_LSE, SPLIT_BLOCK, BLOCK_SIZE, NO_TOKEN,
            )  # fmt: skip
    else:
        _finish_row(
            row, row_ptr, vocab_size, token, sampled, top_v, top_i, run_max, run_sum, count_ge,
            below, token_ids_ptr, logprobs_ptr, ranks_ptr, lse_ptr, K, K_BLOCK, SUBTRACT_LSE,
            BLOCK_SIZE,
        )  # fmt: skip


@triton.jit
def _merge_chunks(
    row, row_ptr, vocab_size, splits, token, sampled, stats_ptr, part_v_ptr, part_i_ptr,
    token_ids_ptr, logprobs_ptr, ranks_ptr, lse_ptr, K: tl.constexpr, K_BLOCK: tl.constexpr,
    SUBTRACT_LSE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NO_TOKEN: tl.constexpr,
):  # fmt: skip
    """A split row's chunks merged: the max, the sum rescaled to it, the counts added, the
    largest value below the sampled one, the top K of the chunks' top Ks (the same
    selections), then the outputs as one program would have written them."""
    # every load before any use of one (a warp issues in order: a load after a use of
    # loaded data waits a memory latency more): the statistics, then the top Ks' first group
    parts = tl.arange(0, SPLIT_BLOCK)
    used = parts < splits
    at = (row.to(tl.int64) * splits + parts) * 4
    maxes = tl.load(stats_ptr + at + 0, mask=used, other=float("-inf"))
    sums = tl.load(stats_ptr + at + 1, mask=used, other=0.0)
    counts = tl.load(stats_ptr + at + 2, mask=used, other=0.0)
    belows = tl.load(stats_ptr + at + 3, mask=used, other=float("-inf"))
    # the top K of the chunks' top Ks, MERGE chunks at a time: their union is at most 512
    # values (a whole 64 x 32 union spilled at K = 20); one group for K <= 8
    MERGE: tl.constexpr = min(SPLIT_BLOCK, max(1, 512 // K_BLOCK))
    lanes = tl.arange(0, K_BLOCK)
    top_v = tl.full((K_BLOCK,), float("-inf"), tl.float32)
    top_i = tl.full((K_BLOCK,), NO_TOKEN, tl.int32)
    for group in range(0, splits, MERGE):
        chunks = group + tl.arange(0, MERGE)
        flat = (row.to(tl.int64) * splits + chunks[:, None]) * K_BLOCK + lanes[None, :]
        in_group = (chunks < splits)[:, None]
        union_v = tl.load(part_v_ptr + flat, mask=in_group, other=float("-inf"))
        union_i = tl.load(part_i_ptr + flat, mask=in_group, other=NO_TOKEN)
        union_v = tl.reshape(union_v, (MERGE * K_BLOCK,))
        union_i = tl.reshape(union_i, (MERGE * K_BLOCK,))
        top_v, top_i = _top_k_update(
            top_v, top_i, union_v, union_i, union_i != NO_TOKEN, lanes, K, NO_TOKEN
        )
    count_ge = tl.sum(counts, axis=0).to(tl.int32)
    below = tl.max(belows, axis=0)
    run_max = tl.max(maxes, axis=0)
    # each chunk's sum is against its own max
    shift = tl.where(run_max == float("-inf"), 0.0, run_max)
    # an all -inf chunk adds nothing (its exp(-inf - shift) would be inf for a low shift)
    run_sum = tl.sum(tl.where(maxes == float("-inf"), 0.0, sums * exp_ftz(maxes - shift)), axis=0)
    _finish_row(
        row, row_ptr, vocab_size, token, sampled, top_v, top_i, run_max, run_sum, count_ge,
        below, token_ids_ptr, logprobs_ptr, ranks_ptr, lse_ptr, K, K_BLOCK, SUBTRACT_LSE,
        BLOCK_SIZE,
    )  # fmt: skip


MAX_SPLITS = 64
"""At most this many chunks a row: a row's last program selects the top K of their top Ks
(`_merge_chunks`), MERGE chunks at a time."""


logprobs_splits = SplitPolicy(ctas_per_sm=6, max_splits=MAX_SPLITS)
"""Programs per row for `compute_logprobs` (`library.SplitPolicy`: at least one tile each,
at most MAX_SPLITS). 6 CTAs an SM (at most 85 registers): the cubins Triton builds (its own
ptxas flags) take 40-72 at K = 5, a split row's merge included (tests/cuda_compile.py,
perf/kernel_model.py); K = 20's split rows take 91 without the raw tiles (5 CTAs), 80 with
them."""


def launch_logprobs(
    source: torch.Tensor,  # [num_rows, V] float32/float16/bfloat16
    tokens: torch.Tensor,  # [num_rows] int32 or int64
    token_ids: torch.Tensor,  # [num_rows, K + 1] int32, written
    logprobs: torch.Tensor,  # [num_rows, K + 1] float32, written
    ranks: torch.Tensor,  # [num_rows] int32, written
    lse: torch.Tensor,  # [num_rows] float32, written
    subtract_lse: bool,
    block_size: int = 1024,
    splits: int = 1,  # programs a row is split over (`logprobs_splits`)
    # [num_rows, >= splits, 4] float32, [.., K_BLOCK] float32 and int32 scratch (splits > 1)
    partials: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    tiles: torch.Tensor | None = None,  # [num_rows, ceil(V / block_size), 2] float32
    visits: torch.Tensor | None = None,  # [num_rows, ceil(V / block_size)] int32 (tiles)
    # [>= num_rows] int32, all 0 (left so): each split row's count of finished programs
    arrivals: torch.Tensor | None = None,
    sampled: torch.Tensor | None = None,  # [num_rows] float32: source[r, tokens[r]]
) -> None:
    """Launch `_logprobs_kernel` over rows x splits (a split row merged by its last
    program); outputs must be contiguous. Allocates nothing, returns None."""
    num_rows, vocab_size = source.shape
    k = token_ids.shape[1] - 1
    k_block = logprobs_k_block(k)
    splits, chunk = split_chunks(vocab_size, splits, block_size)
    split = splits > 1
    stats, part_v, part_i = lse, lse, ranks  # unused without SPLIT
    if split:
        if partials is None:
            raise ValueError(f"{splits} splits need the partials' scratch")
        stats, part_v, part_i = partials
    num_tiles = tile_count(vocab_size, block_size)
    if tiles is not None:
        if visits is None:
            raise ValueError("the raw tiles need the visits scratch")
        check_table("visits", visits, torch.int32, (num_rows, num_tiles))
    counters = lse  # unread without SPLIT
    if split:
        if arrivals is None:
            raise ValueError(f"{splits} splits need the arrival counters")
        check_arrivals(arrivals, num_rows, source.device)
        counters = arrivals
    _logprobs_kernel[(num_rows, splits)](
        source, source.stride(0), tokens, token_ids, logprobs, ranks, lse, stats, part_v,
        part_i, counters, tiles if tiles is not None else lse,
        visits if tiles is not None else ranks, sampled if sampled is not None else lse,
        vocab_size, chunk, K=k, K_BLOCK=k_block,
        SUBTRACT_LSE=subtract_lse, SPLIT=split, HAS_TILES=tiles is not None,
        TILES_BLOCK=triton.next_power_of_2(num_tiles), BLOCK_SIZE=block_size,
        NO_TOKEN=_NO_TOKEN, SPLIT_BLOCK=max(2, triton.next_power_of_2(splits)),
        HAS_SAMPLED=sampled is not None, **pdl_launch(source.device),
    )  # fmt: skip


def logprobs_k_block(k: int) -> int:
    """The top K's lanes: a power of two >= K, at least 2."""
    return max(triton.next_power_of_2(k), 2)


@inplace_op("compute_logprobs", mutates_args=("token_ids", "logprobs", "ranks", "lse", "arrivals"))
def compute_logprobs(
    source: torch.Tensor,
    tokens: torch.Tensor,
    token_ids: torch.Tensor,
    logprobs: torch.Tensor,
    ranks: torch.Tensor,
    lse: torch.Tensor,
    subtract_lse: bool,
    splits: int = 1,
    tiles: torch.Tensor | None = None,
    arrivals: torch.Tensor | None = None,
    sampled: torch.Tensor | None = None,
) -> None:
    """The logprobs stage in one pass per row: column 0 the sampled token, columns 1..K the
    top K in descending order, minus the row's logsumexp when `subtract_lse` (the
    *_logprobs modes), and the sampled token's rank.

    source [num_rows, V] float32/float16/bfloat16 (raw or processed logits, read only);
    tokens [num_rows] int32 or int64 in [0, V). Written: token_ids [num_rows, K + 1] int32, logprobs
    [num_rows, K + 1] float32, ranks [num_rows] int32, lse [num_rows] float32 (the row's
    logsumexp, 0 where not finite). splits: programs per row, each scanning a chunk of whole
    tiles, merged by the row's last program to finish (`logprobs_splits` picks it; the
    outputs do not depend on it beyond the float32 order of the sum). tiles: float32
    [num_rows, ceil(V / TILE), 2] or None: `source`'s tile statistics from
    `process_logits(raw_tiles=...)`; with them the logsumexp is taken from the table and
    only the tiles that can matter are read (the same outputs, lse up to the float32 order
    of its sum). arrivals: int32 [>= num_rows], all 0, which the op leaves 0 (the split
    rows' counters: a caller's persistent buffer saves a fill launch), or None: allocated.
    sampled: float32 [num_rows] or None: source[r, tokens[r]] as float32, which the sampling
    kernel wrote (`sample_tokens`' values), read with the row's first loads.
    """
    if source.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"source must be float32, float16 or bfloat16, got {source.dtype}")
    if source.dim() != 2:
        raise ValueError(f"source must be 2-D [num_rows, vocab_size], got {source.dim()}-D")
    if source.stride(-1) != 1:
        raise ValueError("source rows must be contiguous (stride 1 along the vocabulary)")
    num_rows, vocab_size = source.shape
    check_rows("tokens", tokens, (torch.int32, torch.int64), num_rows)
    check_rows("ranks", ranks, torch.int32, num_rows)
    check_rows("lse", lse, torch.float32, num_rows)
    check_table("token_ids", token_ids, torch.int32, (num_rows, None))
    check_table("logprobs", logprobs, torch.float32, (num_rows, token_ids.shape[-1]))
    k = token_ids.shape[1] - 1
    if not 0 <= k <= vocab_size:
        raise ValueError(f"token_ids must have K + 1 columns with 0 <= K <= {vocab_size}")
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    if tiles is not None:
        check_raw_tiles(tiles, num_rows, vocab_size)
    if sampled is not None:
        check_rows("sampled", sampled, torch.float32, num_rows)
    splits = split_count(vocab_size, splits)
    visits = None
    if tiles is not None:  # the tiles each program reads
        visits = torch.empty(tiles.shape[:2], dtype=torch.int32, device=source.device)
    partials = None
    if splits > 1:  # the chunks' statistics and top Ks, merged by each row's last program
        lanes, device = logprobs_k_block(k), source.device
        partials = (
            torch.empty((num_rows, splits, 4), dtype=torch.float32, device=device),
            torch.empty((num_rows, splits, lanes), dtype=torch.float32, device=device),
            torch.empty((num_rows, splits, lanes), dtype=torch.int32, device=device),
        )
        arrivals = arrival_counters(arrivals, num_rows, device)
    launch_logprobs(
        source,
        tokens,
        token_ids,
        logprobs,
        ranks,
        lse,
        subtract_lse,
        1024,
        splits,
        partials,
        tiles,
        visits,
        arrivals,
        sampled,
    )
