"""Stage 1 of top-k/top-p in Triton (top_k_top_p.py runs it, then its cut kernel): one read
of each chunk of a row (rows x splits programs), writing the chunk's statistics (max, min,
NaN count, total mass, `complete`, entries) and its PARTIAL largest logits as a sorted
float32 list with their token ids, into which a tile inserts only what lies above a floor no
cut can fall below.
With the tile maxima a top-k row reads only the tiles at or above a floor taken from them.
The lists, the floors and the reads: docs/kernels.md, top-k/top-p.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .dependent_launch import await_prior_grids
from .library import (
    LISTED_STAGES,
    chunk_bounds,
    exp_ftz,
    hoisted_reciprocal,
    kth_known,
    listed_tile,
    tiles_to_visit,
)
from .processed_rows import (
    load_deferred,
    processed,
    processed_bounds,
    processed_tile,
    row_logits,
)
from .row_params import load_filters, store_filters, top_k_on


@triton.jit
def _row_filters(
    row, slots_ptr, top_k_ptr, top_p_ptr, min_p_ptr, vocab_size, HAS_MIN_P: tl.constexpr
):
    """The row's slot's (k, top_p, min_p): k 0 when top-k is off (k <= 0 or k >= V), min_p 0
    without HAS_MIN_P."""
    slot = tl.load(slots_ptr + row)
    k = top_k_on(tl.load(top_k_ptr + slot), vocab_size)
    top_p = tl.load(top_p_ptr + slot).to(tl.float32)
    min_p = tl.zeros((), tl.float32)
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + slot).to(tl.float32)
    return k, top_p, min_p


STATS = 8
"""Statistics a chunk writes (`_candidates_kernel`): its max, min (below every logit a cut
may keep: the chunk's smallest logit, or a top-k row's k-th largest known tile max), NaN
count, total mass
exp(l - max), `complete` (every logit of the chunk above it is in its list) and the list's
entries, padded to a power of two."""


_NO_ID_MAX = tl.constexpr(2**31 - 1)  # above every token id: a min over no hit


@triton.jit
def _insert(best, best_ids, value, token, ranks):
    """The sorted list (descending, with its ids) with `value` at its rank, after its equal
    values, and `token` its id; the smaller ones one place down, the last falling off."""
    rank = tl.sum((best >= value).to(tl.int32), axis=0)
    down = tl.maximum(ranks - 1, 0)
    below = tl.gather(best, down, 0)
    below_ids = tl.gather(best_ids, down, 0)
    best = tl.where(ranks == rank, value, tl.where(ranks > rank, below, best))
    best_ids = tl.where(ranks == rank, token, tl.where(ranks > rank, below_ids, best_ids))
    return best, best_ids


@triton.jit
def _tile_floor(
    bounds,  # [TILES_BLOCK] the row's tile maxima (exact, or +inf: unknown), -inf past them
    first,  # the chunk's tiles: [first, last)
    last,
    k,  # top-k, on
    min_p,  # 0: off
    log_min_p,
    HAS_MIN_P: tl.constexpr,
    TILES_BLOCK: tl.constexpr,  # a power of two >= num_tiles
):
    """(floor, complete, kth) from the tile maxima alone, before the walk. kth: the k-th
    largest known tile max (k tiles hold a logit at or above it, so the row's k-th largest
    is at or above it, and so is every cut); -inf with fewer than k known tiles, or where
    it lies below min_p's floor. The floor no top-k (then min_p) cut lies below: kth
    raised to the largest known max + ln(min_p) (at or below min_p's cut). The chunk's
    tiles below it, which the walk skips, are left out at their maxima: the largest is
    where `complete` starts.

    The sort that finds kth runs only where kth can raise the floor: where k known maxima
    reach min_p's (every row without min_p). On an LLM's rows top-k's seldom does (top-k
    50, min_p 0.05: 2 to 10 of the 149 tile maxima reach min_p's floor), and the sort of
    the row's maxima is about 360 SASS instructions a program. Without kth the walk
    reduces the chunk's min for `low`, as for a row with fewer than k known tiles."""
    tiles = tl.arange(0, TILES_BLOCK)
    known = tl.where(bounds < float("inf"), bounds, float("-inf"))
    floor = tl.full((), float("-inf"), tl.float32)
    if HAS_MIN_P:  # noqa: SIM102 (a constexpr guard)
        if min_p != 0.0:
            floor = tl.max(known, axis=0) + log_min_p
    kth = tl.full((), float("-inf"), tl.float32)
    if tl.sum((known >= floor).to(tl.int32), axis=0) >= k:  # a uniform branch on the row
        kth = kth_known(bounds, tiles, k)
    floor = tl.maximum(floor, kth)
    skipped = (tiles >= first) & (tiles < last) & (bounds < floor)
    complete = tl.max(tl.where(skipped, bounds, float("-inf")), axis=0)
    return floor, complete, kth


@triton.jit
def _candidates_kernel(
    logits_ptr,  # [num_rows, V] float32, read only
    logits_stride,  # elements between rows
    slots_ptr,  # [num_rows] int64 row -> slot
    top_k_ptr,  # [num_slots] int32; <= 0 or >= V is off
    top_p_ptr,  # [num_slots] float32; >= 1 is off
    min_p_ptr,  # [num_slots] float32; 0 is off (HAS_MIN_P)
    stats_ptr,  # [num_rows, splits, STATS] float32, written for filtered rows
    filters_ptr,  # [num_rows, FILTERS] float32 (row_params.py): read with RESOLVED, else
    # written by each row's first program, for the cut kernel
    lists_ptr,  # [num_rows, splits, PARTIAL] float32, written when the row uses the buffer
    ids_ptr,  # [num_rows, splits, PARTIAL] int32, written with lists_ptr: their token ids
    tile_max_ptr,  # [num_rows, num_tiles] float32 (HAS_TILE_MAX): exact, or +inf unknown
    visits_ptr,  # [num_rows, num_tiles] int32 scratch (HAS_TILE_MAX): the tiles to read
    source_ptr,  # [num_rows, V] float32 (DEFER): the deferred rows' logits
    source_stride,
    deferred_ptr,  # [num_rows] float32 (DEFER): not 0 = read the row from source_ptr, over it
    vocab_size,
    chunk,  # columns a program reads: whole tiles
    buffer_size,  # CANDIDATES, or 0: no buffer (search only)
    num_tiles,  # ceil(V / BLOCK_SIZE)
    HAS_MIN_P: tl.constexpr,
    HAS_TILE_MAX: tl.constexpr,
    PARTIAL: tl.constexpr,  # a chunk's list: a power of two <= BLOCK_SIZE
    STATS: tl.constexpr,
    RESOLVED: tl.constexpr,  # processing wrote the rows' filters (`row_params`)
    TILES_BLOCK: tl.constexpr,  # a power of two >= num_tiles
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
    DEFER: tl.constexpr,
):
    """Stage 1, over rows x splits: one read of a chunk of the row, its statistics and its
    PARTIAL largest logits, sorted descending, -inf padded, with their token ids (-1 padded)
    (docs/kernels.md, top-k/top-p).

    A tile merges into the list only its logits above a floor no cut can fall below: the
    list's k-th (top-k) or last (top-p alone) value so far, raised to max + ln(min_p) with
    min_p. What is left out is at or below `complete`, which the cut kernel compares with
    the cut, so the floors change which rows settle, never the answer.

    With the tile maxima (HAS_TILE_MAX) a top-k row takes a floor before its walk
    (`_tile_floor`) and skips, unread, each tile whose max lies below it: its logits are
    below every cut, so they count as left out (`complete`) at its max, and the chunk's
    min becomes at most that max, still below every logit a cut may keep. The walk goes
    over the tiles `library.tiles_to_visit` lists, so a skipped tile costs nothing in it.
    Rows without top-k read every tile: top-p alone needs the whole row's mass."""
    await_prior_grids(PDL)
    row = tl.program_id(0)
    divisor, from_source = load_deferred(deferred_ptr, row, DEFER)  # with the first loads
    reciprocal, fast = hoisted_reciprocal(divisor)  # the bounds' and the walk's divisions
    part = tl.program_id(1)
    begin = part * chunk
    end = tl.minimum(begin + chunk, vocab_size)
    first = begin // BLOCK_SIZE
    visits = tl.cdiv(end, BLOCK_SIZE) - first
    tile_row = tile_max_ptr + row.to(tl.int64) * num_tiles
    if HAS_TILE_MAX:
        # the row's tile maxima and the chunk's, loaded with the slot: they depend on the row
        # alone (a warp issues in order: loaded after the parameters, a round more)
        row_bounds = chunk_bounds(tile_row, 1, 0, num_tiles, TILES_BLOCK)
        bounds = chunk_bounds(tile_row, 1, first, first + visits, TILES_BLOCK)
    if RESOLVED:  # by row, with the first loads: no round for the slot
        k, top_p, min_p = load_filters(filters_ptr, row, HAS_MIN_P)
    else:
        k, top_p, min_p = _row_filters(
            row, slots_ptr, top_k_ptr, top_p_ptr, min_p_ptr, vocab_size, HAS_MIN_P
        )
        if part == 0:
            # for the cut kernel, which then loads them with the chunks' statistics, in its
            # first round, instead of a round after the slot
            store_filters(filters_ptr, row, k, top_p, min_p)
    k_on = k > 0
    p_on = top_p < 1.0
    # rows whose filters are all off write nothing else: the cut kernel reads their filters
    if k_on | p_on | (min_p != 0.0):
        row_ptr = row_logits(
            logits_ptr, logits_stride, source_ptr, source_stride, from_source, row
        )  # fmt: skip
        use_buffer = (buffer_size > 0) & ((k_on & (k <= buffer_size)) | (~k_on & p_on))
        # the list's rank whose value floors the next tile: the k-th, or the last
        ranks = tl.arange(0, PARTIAL)
        floor_rank = tl.where(k_on, tl.minimum(k, PARTIAL), PARTIAL) - 1
        log_min_p = tl.log(tl.maximum(min_p, 1e-38))  # unused when min_p is 0
        chunk_max = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((), tl.float32)
        best = tl.full((PARTIAL,), float("-inf"), tl.float32)
        best_ids = tl.full((PARTIAL,), -1, tl.int32)  # their token ids, -1 padded
        list_floor = tl.full((), float("-inf"), tl.float32)  # best's floor-rank value
        entries = tl.zeros((), tl.int32)
        complete = tl.full((), float("-inf"), tl.float32)
        nan_count = tl.zeros((), tl.int32)
        # the largest logit left out of the list, kept per thread and reduced once after the
        # walk (a max is exact in any order)
        left_out = tl.full((BLOCK_SIZE,), float("-inf"), tl.float32)
        # `low`, below every logit a cut may keep (the searches start from it): with the tile
        # maxima, top-k's k-th largest known max; else the chunk's smallest logit, reduced a
        # tile at a time (held per thread too, it spilled under `top_k_top_p_splits`' cap)
        low = tl.full((), float("inf"), tl.float32)
        bounded = tl.zeros((), tl.int1)
        skip_below = tl.full((), float("-inf"), tl.float32)
        if HAS_TILE_MAX:
            # the maxima before the temperature where it is this kernel's (processed_rows)
            row_bounds = processed_bounds(row_bounds, divisor, reciprocal, fast)
            bounds = processed_bounds(bounds, divisor, reciprocal, fast)
            if use_buffer & k_on:
                skip_below, complete, kth = _tile_floor(
                    row_bounds, first, first + visits, k, min_p, log_min_p, HAS_MIN_P,
                    TILES_BLOCK,
                )  # fmt: skip
                bounded = kth > float("-inf")
                low = tl.where(bounded, kth, low)
        # The chunk's total mass, which the cut kernel reads only for a top-p row with no
        # cut before it: never a row that skips tiles (top-k's k-th, at or above the floor
        # the skipping took, is then its cut), whose total would miss the skipped tiles
        weigh = p_on & (skip_below == float("-inf"))
        # the walk reads only the tiles at or above the floor, listed in column order
        # (`tiles_to_visit`); without the maxima, every tile of the chunk
        # an int32 offset, not a 64-bit pointer, held over the walk (B x tiles < 2**31)
        listed = row * num_tiles + first
        if HAS_TILE_MAX:
            visits = tiles_to_visit(
                bounds, first, first + visits, skip_below, visits_ptr + listed, TILES_BLOCK
            )
        for visit in tl.range(0, visits, num_stages=LISTED_STAGES):
            start = listed_tile(visits_ptr, listed, first, visit, HAS_TILE_MAX, BLOCK_SIZE)
            cols = start + tl.arange(0, BLOCK_SIZE)
            in_chunk = cols < end
            # columns past the chunk read -inf, which no floor, mass or max takes in
            x = tl.load(row_ptr + cols, mask=in_chunk, other=float("-inf"))
            x = processed_tile(x, divisor, reciprocal, fast)
            # a finite entry of the table is the tile's max, and the tile holds no NaN: only
            # an unknown tile (+inf), or every tile without the table, takes two reductions,
            # and its NaNs become -inf for what follows, so that a known tile's logits need
            # no NaN test (a usual visit: about 340 -> 300 SASS instructions a thread)
            tile_max = tl.full((), float("inf"), tl.float32)
            if HAS_TILE_MAX:
                # (by IEEE division: the fast one's select of +inf held 6 registers more)
                tile_max = processed(tl.load(tile_row + start // BLOCK_SIZE), divisor)
            if tile_max == float("inf"):
                valid = x == x
                tile_max = tl.max(tl.where(valid, x, float("-inf")), axis=0)
                nan_count += tl.sum((~valid).to(tl.int32), axis=0)
                if not bounded:
                    low = tl.minimum(
                        low, tl.min(tl.where(valid & in_chunk, x, float("inf")), axis=0)
                    )  # fmt: skip
                x = tl.where(valid, x, float("-inf"))
            elif not bounded:
                low = tl.minimum(low, tl.min(tl.where(in_chunk, x, float("inf")), axis=0))
            new_max = tl.maximum(chunk_max, tile_max)
            if use_buffer:
                # only top-p weighs masses (top-k alone skips the exp per logit), and not
                # a row that skips tiles (`weigh`)
                if weigh:
                    # masses against the new running max; an all -inf prefix has none
                    # (its exp(-inf - -inf) would be nan), so the base is then 0
                    base = tl.where(new_max > float("-inf"), new_max, 0.0)
                    total = total * exp_ftz(chunk_max - base)
                    total += tl.sum(exp_ftz(x - base), axis=0)
                # the list's floor-rank value, max + ln(min_p) now (below min_p's cut at
                # the end); not skip_below, which a logit of the k largest may equal
                floor = list_floor
                if HAS_MIN_P:  # noqa: SIM102 (a constexpr guard)
                    if min_p != 0.0:
                        floor = tl.maximum(floor, new_max + log_min_p)
                # the tile's logits at or below the floor, or below the tile maxima's
                # floor (which a logit of the k largest may equal), stay out of the list
                hit = (x > floor) & (x >= skip_below)
                left_out = tl.maximum(left_out, tl.where(hit, float("-inf"), x))
                if (tile_max > floor) & (tile_max >= skip_below):
                    hits = tl.sum(hit.to(tl.int32), axis=0)
                    # the tile's hits go in largest first, each at its rank with its id,
                    # after the list's equal values (earlier tiles: lower ids); a full list
                    # takes only what beats its last, which falls off. The first is the
                    # tile's max (the usual tile, once the list has filled: one hit)
                    token = tl.min(tl.where(hit & (x == tile_max), cols, _NO_ID_MAX), axis=0)
                    best, best_ids = _insert(best, best_ids, tile_max, token, ranks)
                    if hits > 1:
                        left = hit & (cols != token)
                        placed = 1
                        value = tl.max(tl.where(left, x, float("-inf")), axis=0)
                        while (placed < hits) & (value > tl.min(best, axis=0)):
                            token = tl.min(tl.where(left & (x == value), cols, _NO_ID_MAX), axis=0)
                            best, best_ids = _insert(best, best_ids, value, token, ranks)
                            left &= cols != token
                            placed += 1
                            value = tl.max(tl.where(left, x, float("-inf")), axis=0)
                    list_floor = tl.max(tl.where(ranks == floor_rank, best, float("-inf")), axis=0)
                    # what fell off lies at or below the last
                    if entries + hits > PARTIAL:
                        complete = tl.maximum(complete, tl.min(best, axis=0))
                    entries = tl.minimum(entries + hits, PARTIAL)
            chunk_max = new_max
        complete = tl.maximum(complete, tl.max(left_out, axis=0))
        at = stats_ptr + (row.to(tl.int64) * tl.num_programs(1) + part) * STATS
        tl.store(at + 0, chunk_max)
        tl.store(at + 1, low)
        tl.store(at + 2, nan_count.to(tl.float32))  # exact: V < 2**24
        tl.store(at + 3, total)
        tl.store(at + 4, complete)
        tl.store(at + 5, entries.to(tl.float32))
        if use_buffer:
            listed_at = (row.to(tl.int64) * tl.num_programs(1) + part) * PARTIAL + ranks
            tl.store(lists_ptr + listed_at, best)
            tl.store(ids_ptr + listed_at, best_ids)
