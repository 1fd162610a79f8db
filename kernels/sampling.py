"""Sampling in Triton: greedy argmax and the counter-based Gumbel-max race, one program per row.

Greedy rows take the argmax, random rows argmax(logits + gumbel) with the noise exactly
`graphsafe_sampler/rng.py`'s draw (noise.py). The key idea: the filters need not write their
mask, since tokens below the row's `threshold` (when given: top-k/top-p/min_p fused as one
per-row cut) count as -inf here, so a step reads the logits once per row and writes nothing.
`sample_and_commit` also commits each row's token (history.py's `commit_row`) in the kernel
that makes it, one launch fewer than `sample_tokens` then `commit_history`. The per-row
rule is `_sample_kernel`'s docstring; why greedy rows may take the argmax of the filtered
logits, NaN and -inf rows, and where the Gumbel transform differs from torch's in the last
bits: docs/kernels.md, sampling.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from .constants import GREEDY_TEMPERATURE, SALT_SAMPLE
from .dependent_launch import await_prior_grids, pdl_launch
from .history import CommitTables, commit_row
from .library import (
    LISTED_STAGES,
    TILE,
    SplitPolicy,
    arrival_counters,
    candidate_buffer,
    check_arrivals,
    check_logits,
    check_rows,
    check_table,
    check_tile_max,
    chunk_bounds,
    hoisted_reciprocal,
    inplace_op,
    last_to_arrive,
    listed_tile,
    merge_argmax,
    split_chunks,
    split_count,
    tile_count,
    tiles_to_visit,
    together,
)
from .list_race import RACE_BLOCK, first_ranks, race_lists
from .noise import race_tile, row_key
from .processed_rows import (
    check_deferred,
    load_deferred,
    processed_bounds,
    processed_tile,
    processed_upper_bound,
    row_logits,
)
from .row_params import FILTERS, KEYS, check_positions, load_keys

_INT32_MAX = 2**31 - 1


@triton.jit
def _sample_kernel(
    logits_ptr,  # [num_rows, V] float32, read only
    logits_stride,  # elements between rows
    threshold_ptr,  # [num_rows] float32: tokens below it count as -inf (HAS_THRESHOLD)
    slots_ptr,  # [num_rows] int64 row -> slot
    temperature_ptr,  # [num_slots] float32
    seeds_ptr,  # [num_slots] int64
    positions_ptr,  # [num_rows] int64 token position each row samples (not BY_SLOT)
    prompt_len_ptr,  # [num_slots] int64 (BY_SLOT): position = prompt_len + num_generated
    num_generated_ptr,  # [num_slots] int32 (BY_SLOT)
    tokens_ptr,  # [num_rows] int32 or int64, written
    partial_best_ptr,  # [num_rows, splits] float32, written (SPLIT): each chunk's best
    partial_index_ptr,  # [num_rows, splits] int32 (SPLIT): its lowest index
    partial_nan_ptr,  # [num_rows, splits] int32 (SPLIT): its first NaN, or INT32_MAX
    arrivals_ptr,  # [num_rows] int32 (SPLIT): 0, counted up and left 0 (`last_to_arrive`)
    tile_max_ptr,  # [num_rows, ceil(V / BLOCK_SIZE)] float32 (HAS_TILE_MAX): upper bounds
    visits_ptr,  # [num_rows, ceil(V / BLOCK_SIZE)] int32 scratch (HAS_TILE_MAX): tiles read
    covered_ptr,  # [num_rows] int32 (HAS_BUFFER): 1 where every kept token is listed below
    buffer_values_ptr,  # [num_rows, N] float32 (HAS_BUFFER): top_k_top_p's chunk lists
    buffer_ids_ptr,  # [num_rows, N] int32 (HAS_BUFFER): their token ids (-1: padding)
    num_lists,  # the lists a row's buffer holds, one a chunk (HAS_BUFFER)
    list_len,  # each list's entries (HAS_BUFFER): a row's buffer is num_lists x list_len
    source_ptr,  # [num_rows, V] float32 (DEFER): the rows process_logits deferred
    source_stride,
    deferred_ptr,  # [num_rows] float32 (DEFER): not 0 = read the row from source_ptr, over it
    filters_ptr,  # [num_rows, FILTERS] float32 (KEYED): the rows' temperatures (row_params.py)
    keys_ptr,  # [num_rows, KEYS] int64 (KEYED): their seeds and positions
    # HAND_VALUE: the logits logprobs reads ([num_rows, V], any float type) and, written,
    # each row's token's value there ([num_rows] float32), for it to load with its first
    values_from_ptr, values_from_stride, values_ptr,
    vocab_size,
    chunk,  # columns a program scans, a multiple of BLOCK_SIZE (the row when not SPLIT)
    # COMMIT: keep, the history tables and their sizes, as `history.commit_row` takes them
    # (num_generated_ptr above is the same table); unread without COMMIT
    keep_ptr, counts_ptr, output_words_ptr, overflow_token_ptr, overflow_excess_ptr, window_ptr,
    counts_stride, num_words, num_overflow, window_len, padding_slot,
    SALT: tl.constexpr,
    GREEDY_BELOW: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr,
    HAS_TILE_MAX: tl.constexpr,
    BY_SLOT: tl.constexpr,
    SPLIT: tl.constexpr,
    TILES_BLOCK: tl.constexpr,  # a power of two >= 2 and a chunk's tiles (HAS_TILE_MAX)
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr = 2,  # a power of two >= splits (SPLIT)
    COMMIT: tl.constexpr = False,  # commit each row's token (history.py)
    SATURATED: tl.constexpr = 255,
    HAS_KEEP: tl.constexpr = False,
    OVERFLOW_BLOCK: tl.constexpr = 2,
    HAS_BUFFER: tl.constexpr = False,
    CHUNK_BLOCK: tl.constexpr = 2,  # a power of two >= the lists' chunks (HAS_BUFFER)
    RANK_BLOCK: tl.constexpr = 2,  # ranks of every list raced at a time (HAS_BUFFER)
    ONE_BLOCK: tl.constexpr = True,  # RANK_BLOCK >= each list's length (HAS_BUFFER)
    DEFER: tl.constexpr = False,
    KEYED: tl.constexpr = False,  # by row, as processing resolved them (BY_SLOT's values)
    HAND_VALUE: tl.constexpr = False,
):  # fmt: skip
    """Per row r with slot s = slots[r]: greedy rows (temperature[s] < GREEDY_BELOW) take
    argmax(logits[r]), lowest index on ties; random rows take argmax(logits[r] + gumbel[r]),
    the noise being rng.py's draw for (seeds[s], positions[r], token id, SALT). Tokens below
    threshold[r] (HAS_THRESHOLD) count as -inf. A row holding NaN returns its first NaN's
    index and a row with every token at -inf returns 0, as torch.argmax does.

    A random row's tile is hashed only when its largest logit plus GUMBEL_MAX beats the
    best so far: the rest cannot win (fl(x + g) <= fl(x + GUMBEL_MAX) <= best), so the
    token is the same, and a row cut by top-k/top-p hashes only the tiles holding a
    survivor. With the tile maxima (HAS_TILE_MAX, upper bounds of each tile's logits), a
    tile whose bound lies below the cut is not even read: every token of it counts as -inf,
    and the walk goes over the others only (`library.tiles_to_visit`).

    Program (row, split) scans columns [split * chunk, (split + 1) * chunk). With SPLIT (so
    that a few rows still spread over every SM), it writes its chunk's best value (NaN left
    out), lowest index and first NaN, and the row's last program to finish merges them
    (`library.last_to_arrive`, `library.merge_argmax`): no launch of its own. The program
    that makes a row's token then commits it (COMMIT), as `history.commit_history` would."""
    await_prior_grids(PDL)
    row = tl.program_id(0)
    split = tl.program_id(1)
    begin = split * chunk
    end = tl.minimum(begin + chunk, vocab_size)
    # every load first, the row's then its slot's, in two rounds (a warp issues in order: a
    # load after a use of loaded data waits a memory latency more); a greedy row's seed and
    # position go unused
    slot = tl.load(slots_ptr + row)
    divisor, from_source = load_deferred(deferred_ptr, row, DEFER)
    row_ptr = row_logits(logits_ptr, logits_stride, source_ptr, source_stride, from_source, row)
    threshold = tl.full((), float("-inf"), tl.float32)
    if HAS_THRESHOLD:
        threshold = tl.load(threshold_ptr + row)
    num_tiles = tl.cdiv(vocab_size, BLOCK_SIZE)
    tile_row = tile_max_ptr + row.to(tl.int64) * num_tiles
    first = begin // BLOCK_SIZE
    visits = tl.cdiv(end, BLOCK_SIZE) - first
    if HAS_TILE_MAX:
        bounds = chunk_bounds(tile_row, 1, first, first + visits, TILES_BLOCK)
    if KEYED:  # a round sooner than through the slot
        temperature, seed, position = load_keys(filters_ptr, keys_ptr, row)
    else:
        if BY_SLOT:
            position = tl.load(prompt_len_ptr + slot) + tl.load(num_generated_ptr + slot)
        else:
            position = tl.load(positions_ptr + row)
        seed = tl.load(seeds_ptr + slot)
        temperature = tl.load(temperature_ptr + slot)
    is_random = temperature >= GREEDY_BELOW
    covered = tl.zeros((), tl.int1)
    if HAS_BUFFER:
        covered = tl.load(covered_ptr + row) != 0
        # a covered row's first program races over the lists (below, before the walk, so
        # that the block is not held over it): their first ranks, loaded by every row's
        # first program with its first loads (masked by `covered`, a round later)
        first_values, first_ids = first_ranks(
            row, buffer_values_ptr, buffer_ids_ptr, num_lists, list_len, split == 0,
            CHUNK_BLOCK, RANK_BLOCK,
        )  # fmt: skip
        # a covered row's other programs stop once their first loads are in (the barrier:
        # ptxas moves no load across one; after the flag's test, they waited a round)
        tl.debug_barrier()
        if covered & (split != 0):
            return

    # a tile wholly below the cut is all -inf: it changes neither the best nor the NaN, so
    # the walk reads only the others, listed in column order (the list's comparison is the
    # mask's own, which a NaN cut never makes true); without the maxima, every tile
    listed = row * num_tiles + first  # int32: B x tiles < 2**31
    # the divisions of the bounds and the walk past the prologue's loads: a branch on the
    # divisor (IEEE division's slow path, here) waits for it, and a load after it a round
    reciprocal, fast = hoisted_reciprocal(divisor)
    if covered:  # raced over the lists below: nothing of the row is read or listed
        visits = 0
    elif HAS_TILE_MAX:
        bounds = processed_bounds(bounds, divisor, reciprocal, fast)  # (the temperature)
        visits = tiles_to_visit(bounds, first, first + visits, threshold, visits_ptr + listed,
                                TILES_BLOCK)  # fmt: skip
    offset = tl.zeros((), tl.uint32)
    mult = tl.zeros((), tl.uint32)
    if is_random:
        offset, mult = row_key(seed, position, SALT)
    raced = 0
    if HAS_BUFFER:  # noqa: SIM102 (a constexpr guard)
        if covered & (split == 0):  # (`covered` alone, the same here, spilled 8 bytes)
            raced = race_lists(
                row, first_values, first_ids, buffer_values_ptr, buffer_ids_ptr, num_lists,
                list_len, threshold, is_random, offset, mult, CHUNK_BLOCK, RANK_BLOCK,
                ONE_BLOCK,
            )  # fmt: skip

    # Running argmax, the lowest index on ties: a later tile replaces the best only when
    # strictly greater; an all -inf row keeps index 0 (its first chunk's start), torch's.
    best = tl.full((), float("-inf"), tl.float32)
    best_index = tl.where(covered, raced, begin)  # (a covered row's: held apart, it spilled)
    first_nan = tl.full((), 2147483647, tl.int32)
    for visit in tl.range(0, visits, num_stages=LISTED_STAGES):
        start = listed_tile(visits_ptr, listed, first, visit, HAS_TILE_MAX, BLOCK_SIZE)
        cols = start + tl.arange(0, BLOCK_SIZE)
        in_row = cols < end
        x = tl.load(row_ptr + cols, mask=in_row, other=float("-inf"))
        x = processed_tile(x, divisor, reciprocal, fast)
        # x < threshold is False for NaN: a NaN stays, as under masked_fill
        x = tl.where(x < threshold, float("-inf"), x)
        # a finite entry of the table bounds the tile's logits, and the tile holds no NaN:
        # only an unknown tile (+inf), or any without the table, seeks NaN and takes its max
        top = tl.full((), float("inf"), tl.float32)
        if HAS_TILE_MAX:
            top = tl.load(tile_row + start // BLOCK_SIZE)
            # a known entry over the divisor, as a bound: the race only asks whether the
            # tile can win (`noise.race_tile`); +inf stays unknown
            if top != float("inf"):
                top = processed_upper_bound(top, divisor, reciprocal, fast)
        if top == float("inf"):
            # torch.argmax treats NaN as the maximum: remember the first one, and leave NaN
            # out of the best (it decides alone); the noise keeps NaN NaN and nothing else NaN
            is_nan = x != x
            first_nan = tl.minimum(first_nan, tl.min(tl.where(is_nan, cols, 2147483647), axis=0))
            x = tl.where(is_nan, float("-inf"), x)
            top = tl.max(x, axis=0)
        # the tile's best and its lowest index; a tile that cannot win stays at -inf
        tile_max, tile_index = race_tile(
            x, cols, start, in_row, top, best, is_random, offset, mult, row_ptr, divisor
        )  # fmt: skip
        better = tile_max > best
        best_index = tl.where(better, tile_index, best_index)
        best = tl.where(better, tile_max, best)
    token = tl.where(first_nan < 2147483647, first_nan, best_index)
    finish = True
    if covered:  # (never without HAS_BUFFER)
        # its first program, which raced over the lists (the others stopped above)
        finish = split == 0  # (its token: `best_index`, the raced one)
    elif SPLIT:
        splits = tl.num_programs(1)
        at = row.to(tl.int64) * splits + split
        tl.store(partial_best_ptr + at, best)
        tl.store(partial_index_ptr + at, best_index)
        tl.store(partial_nan_ptr + at, first_nan)
        finish = last_to_arrive(arrivals_ptr + row, splits)
        if finish:
            token = merge_argmax(
                row, splits, partial_best_ptr, partial_index_ptr, partial_nan_ptr, SPLIT_BLOCK
            )
    if finish:
        tl.store(tokens_ptr + row, token.to(tokens_ptr.dtype.element_ty))
        if HAND_VALUE:  # loaded before the commit's loads, in their round; stored after
            value = tl.load(values_from_ptr + row.to(tl.int64) * values_from_stride + token)
        if COMMIT:
            # commit_row's barrier orders every thread's read of num_generated (the
            # position, at the start) before the store that advances it; the row's other
            # programs read theirs before they arrived
            commit_row(
                row, slot, token, keep_ptr, num_generated_ptr, counts_ptr, output_words_ptr,
                overflow_token_ptr, overflow_excess_ptr, window_ptr, counts_stride, num_words,
                num_overflow, window_len, padding_slot, SATURATED, HAS_KEEP, OVERFLOW_BLOCK,
            )  # fmt: skip
        if HAND_VALUE:
            tl.store(values_ptr + row, value.to(tl.float32))


def launch_sample_tokens(
    logits: torch.Tensor,  # [num_rows, V] float32, processed and (unless threshold) filtered
    slots: torch.Tensor,  # [num_rows] int64
    temperature: torch.Tensor,  # [num_slots] float32
    seeds: torch.Tensor,  # [num_slots] int64
    positions: torch.Tensor | None,  # [num_rows] int64, or None: by slot
    tokens: torch.Tensor,  # [num_rows] int32 or int64, written
    threshold: torch.Tensor | None = None,  # [num_rows] float32 per-row cut, or None
    salt: int = SALT_SAMPLE,
    prompt_len: torch.Tensor | None = None,  # [num_slots] int64, without positions
    num_generated: torch.Tensor | None = None,  # [num_slots] int32, without positions
    splits: int = 1,  # programs a row is split over (`sample_splits`)
    # [num_rows, >= splits] float32, int32, int32 scratch, needed when splits > 1
    partials: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    block_size: int = TILE,
    # [num_rows, ceil(V / block_size)] float32: upper bounds of each tile's logits
    tile_max: torch.Tensor | None = None,
    # [num_rows, ceil(V / block_size)] int32 scratch, needed with tile_max and threshold
    visits: torch.Tensor | None = None,
    # the history each row's token is committed to, by the program that makes it (a split
    # row's last to finish); its num_generated must be `num_generated` where that is given
    commit: CommitTables | None = None,
    keep: torch.Tensor | None = None,  # [num_rows] bool: the rows that commit (None: all)
    # [>= num_rows] int32, all 0 (left so): each split row's count of finished programs
    arrivals: torch.Tensor | None = None,
    # top_k_top_p's (covered [num_rows] int32, lists [num_rows, ...] float32, ids the same
    # int32) for this threshold: covered rows race over the lists
    buffer: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    # (source [num_rows, V] float32, deferred [num_rows] float32): process_logits' deferred
    # rows, read from source
    defer: tuple[torch.Tensor, torch.Tensor] | None = None,
    # (filters [num_rows, 4] float32, keys [num_rows, 2] int64): process_logits' records of
    # the rows (`row_params`), read instead of the slot's tables (positions None)
    keyed: tuple[torch.Tensor, ...] | None = None,
    # (source [num_rows, V], values [num_rows] float32 written): each row's token's value in
    # the logits logprobs reads, for `compute_logprobs(sampled=values)`
    hand: tuple[torch.Tensor, ...] | None = None,
) -> None:
    """Launch `_sample_kernel` over rows x splits (a split row merged by its last
    program); allocates nothing, returns None."""
    num_rows, vocab_size = logits.shape
    if vocab_size > _INT32_MAX - block_size:
        raise ValueError(f"vocab_size must be below 2**31 - {block_size}, got {vocab_size}")
    if threshold is not None:  # read as a [num_rows] vector: a strided view reads others
        check_rows("threshold", threshold, torch.float32, num_rows)
    splits, chunk = split_chunks(vocab_size, splits, block_size)
    split = splits > 1
    scratch = [tokens] * 4  # unread without SPLIT
    if split:
        if partials is None or arrivals is None:
            raise ValueError(f"{splits} splits need the partials' scratch and the counters")
        check_arrivals(arrivals, num_rows, logits.device)
        scratch = [t.view(-1)[: num_rows * splits] for t in partials] + [arrivals]
    listing = tile_max is not None and threshold is not None
    if listing:
        if visits is None:
            raise ValueError("the tile maxima need the visits scratch")
        check_table("visits", visits, torch.int32, (num_rows, tile_count(vocab_size, block_size)))
    # commit_row's arguments after the slot and token: (keep, num_generated, the five
    # tables, V, W, E, L, padding slot), placeholders without a commit
    unused: tuple[Any, ...] = (tokens,) * 7 + (1, 1, 1, 1, -1)
    history, committing = unused, dict[str, Any]()
    if commit is not None:
        if num_generated is not None and num_generated is not commit.num_generated:
            raise ValueError("the positions' num_generated must be the one committed")
        history, committing = commit.launch_args(keep)
        committing["COMMIT"] = True
        num_generated = commit.num_generated
    # unread without a buffer
    covered, values, ids, buffer_len, list_len = tokens, logits, tokens, 1, 1
    if buffer is not None:
        if threshold is None:
            raise ValueError("the candidate lists need the threshold they were cut with")
        covered, values, ids = buffer
        check_rows("covered", covered, torch.int32, num_rows)
        for name, table, dtype in (("lists", values, torch.float32), ("ids", ids, torch.int32)):
            check_table(name, table, dtype, (num_rows, *values.shape[1:]))
        buffer_len = max(1, math.prod(values.shape[1:]))
        list_len = max(1, values.shape[-1])
    if keyed is not None:
        if positions is not None:
            raise ValueError("the rows' keys hold their positions: no positions with them")
        check_table("filters", keyed[0], torch.float32, (num_rows, FILTERS.value))
        check_table("keys", keyed[1], torch.int64, (num_rows, KEYS.value))
    if hand is not None:
        floats = (torch.float32, torch.float16, torch.bfloat16)
        if hand[0].dtype not in floats or hand[0].shape != logits.shape or hand[0].stride(1) != 1:
            raise ValueError("values_from must be [num_rows, V] float, rows contiguous")
        check_rows("values", hand[1], torch.float32, num_rows)
    # a block of RACE_BLOCK list entries: RANK_BLOCK ranks of every chunk's list
    chunk_block = max(2, triton.next_power_of_2(buffer_len // list_len))
    rank_block = max(2, min(RACE_BLOCK // chunk_block, triton.next_power_of_2(list_len)))
    _sample_kernel[(num_rows, splits)](
        logits,
        logits.stride(0),
        threshold if threshold is not None else logits,  # unread without HAS_THRESHOLD
        slots,
        temperature,
        seeds,
        positions if positions is not None else seeds,  # unread with BY_SLOT
        prompt_len if prompt_len is not None else seeds,  # unread without BY_SLOT
        num_generated if num_generated is not None else slots,
        tokens,
        *scratch,
        tile_max if listing else logits,  # unread without HAS_TILE_MAX
        visits if listing else tokens,
        covered,
        values,
        ids,
        buffer_len // list_len,
        list_len,
        *((defer[0], defer[0].stride(0), defer[1]) if defer else (logits, 1, tokens)),
        *(keyed if keyed is not None else (logits, seeds)),  # unread without KEYED
        *((hand[0], hand[0].stride(0), hand[1]) if hand else (logits, 1, logits)),
        vocab_size,
        chunk,
        history[0],  # keep; num_generated is the one above
        *history[2:],
        SALT=salt,
        GREEDY_BELOW=GREEDY_TEMPERATURE,
        HAS_THRESHOLD=threshold is not None,
        HAS_TILE_MAX=listing,
        BY_SLOT=positions is None,
        SPLIT=split,
        # at least 2: over one lane the compiler proves the walk runs at most once and drops
        # its loop, which perf/kernel_model.py (it times tile loops) would no longer see
        TILES_BLOCK=max(2, triton.next_power_of_2(triton.cdiv(chunk, block_size))),
        BLOCK_SIZE=block_size,
        SPLIT_BLOCK=max(2, triton.next_power_of_2(splits)),
        HAS_BUFFER=buffer is not None,
        CHUNK_BLOCK=chunk_block,
        RANK_BLOCK=rank_block,
        ONE_BLOCK=rank_block >= list_len,
        DEFER=defer is not None,
        KEYED=keyed is not None,
        HAND_VALUE=hand is not None,
        **committing,
        **pdl_launch(logits.device),
    )


sample_splits = SplitPolicy(ctas_per_sm=6)
"""Programs per row for `sample_tokens` (`SplitPolicy`): 64-77 registers on sm_90, 6 CTAs."""


@inplace_op("sample_tokens", mutates_args=("tokens", "arrivals", "values"))
def sample_tokens(
    logits: torch.Tensor,
    slots: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor | None,
    threshold: torch.Tensor | None,
    tokens: torch.Tensor,
    salt: int = 0,
    prompt_len: torch.Tensor | None = None,
    num_generated: torch.Tensor | None = None,
    splits: int = 1,
    tile_max: torch.Tensor | None = None,
    arrivals: torch.Tensor | None = None,
    covered: torch.Tensor | None = None,
    lists: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    source: torch.Tensor | None = None,
    deferred: torch.Tensor | None = None,
    filters: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
    values_from: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> None:
    """Greedy argmax or the counter-based Gumbel-max race, merged per row into `tokens`.

    logits [num_rows, V] float32 (read only); slots [num_rows] int64; each row's token
    position: positions [num_rows] int64, or (positions None) the slot's
    prompt_len [num_slots] int64 + num_generated [num_slots] int32, read in the kernel;
    temperature [num_slots] float32 (below GREEDY_TEMPERATURE is greedy); seeds [num_slots]
    int64; threshold [num_rows] float32 or None (tokens below it count as -inf); tokens
    [num_rows] int32 or int64 (written); salt: the random stream (constants.SALT_*);
    splits: programs per row, each scanning a chunk of whole tiles, merged by the row's
    last program to finish (`sample_splits` picks it; the tokens do not depend on it).
    tile_max [num_rows, ceil(V / TILE)] float32 or None: upper bounds of each tile's
    logits, +inf where a tile holds NaN (`process_logits`' tile maxima, before any mask),
    with which a tile wholly below the threshold is not read, and only the +inf tiles are
    searched for NaN. arrivals: int32 [>= num_rows], all 0, which the op leaves 0 (the split
    rows' counters: a caller's persistent buffer saves a fill launch), or None: allocated.
    covered, lists, ids: all three or none, `top_k_top_p_threshold`'s for this threshold:
    each covered row is raced over its lists alone, its logits unread (the same token).
    source [num_rows, V] float32 and deferred [num_rows] float32, both or neither: each row
    read divided by |deferred[r]|, from `source` where positive (`process_logits` left it
    unwritten), and so are tile_max's (`processed_rows`). filters [num_rows, 4] float32 and
    keys [num_rows, 2] int64, both or neither, positions None: `process_logits`' records of
    the rows, their temperatures, seeds and positions resolved from these tables
    (`row_params`), read by row.
    values_from [num_rows, V] (float32, float16 or bfloat16) and values [num_rows] float32
    (written), both or neither: each row's token's value in values_from (the logits logprobs
    reads), for `compute_logprobs(sampled=...)`.
    """
    _sample(
        logits, slots, temperature, seeds, positions, threshold, tokens, salt, prompt_len,
        num_generated, splits, tile_max, arrivals=arrivals,
        buffer=candidate_buffer(covered, lists, ids), source=source, deferred=deferred,
        keyed=together("filters and keys", filters, keys),
        hand=together("values_from and values", values_from, values),
    )  # fmt: skip


@inplace_op(
    "sample_and_commit",
    mutates_args=("tokens", "num_generated", "counts", "output_words", "overflow_token",
                  "overflow_excess", "window", "arrivals", "values"),
)  # fmt: skip
def sample_and_commit(
    logits: torch.Tensor,
    slots: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor | None,
    threshold: torch.Tensor | None,
    tokens: torch.Tensor,
    salt: int,
    prompt_len: torch.Tensor | None,
    num_generated: torch.Tensor,
    splits: int,
    tile_max: torch.Tensor | None,
    keep: torch.Tensor | None,
    counts: torch.Tensor,
    output_words: torch.Tensor,
    overflow_token: torch.Tensor,
    overflow_excess: torch.Tensor,
    window: torch.Tensor,
    padding_slot: int,
    arrivals: torch.Tensor | None = None,
    covered: torch.Tensor | None = None,
    lists: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    source: torch.Tensor | None = None,
    deferred: torch.Tensor | None = None,
    filters: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
    values_from: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> None:
    """`sample_tokens`, then `history.commit_history` of its tokens, with the commit made
    by the program that makes each row's token (a split row's last to finish): one launch
    fewer a step. The arguments are theirs; num_generated
    is always given, since the commit advances it, and with positions None it also gives
    the positions, read before the commit."""
    commit = CommitTables(
        num_generated, counts, output_words, overflow_token, overflow_excess, window, padding_slot
    )
    commit.check(logits.shape[0], keep, logits.shape[1])
    _sample(
        logits, slots, temperature, seeds, positions, threshold, tokens, salt, prompt_len,
        None if positions is not None else num_generated, splits, tile_max, commit, keep,
        arrivals, candidate_buffer(covered, lists, ids), source, deferred,
        together("filters and keys", filters, keys),
        together("values_from and values", values_from, values),
    )  # fmt: skip


def _sample(
    logits: torch.Tensor,
    slots: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor | None,
    threshold: torch.Tensor | None,
    tokens: torch.Tensor,
    salt: int,
    prompt_len: torch.Tensor | None,
    num_generated: torch.Tensor | None,
    splits: int,
    tile_max: torch.Tensor | None,
    commit: CommitTables | None = None,
    keep: torch.Tensor | None = None,
    arrivals: torch.Tensor | None = None,
    buffer: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    source: torch.Tensor | None = None,
    deferred: torch.Tensor | None = None,
    keyed: tuple[torch.Tensor, ...] | None = None,
    hand: tuple[torch.Tensor, ...] | None = None,
) -> None:
    """The sampling ops' checks, their scratch, and the launch."""
    check_logits(logits)
    check_deferred(logits, source, deferred)
    num_rows = logits.shape[0]
    check_rows("slots", slots, torch.int64, num_rows)
    check_positions(positions, prompt_len, num_generated, num_rows)
    check_rows("tokens", tokens, (torch.int32, torch.int64), num_rows)
    if threshold is not None:
        check_rows("threshold", threshold, torch.float32, num_rows)
    if tile_max is not None:
        check_tile_max(tile_max, num_rows, logits.shape[1])
    if temperature.dtype != torch.float32:
        raise TypeError(f"temperature must be float32, got {temperature.dtype}")
    if seeds.dtype != torch.int64:
        raise TypeError(f"seeds must be int64, got {seeds.dtype}")
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    splits = split_count(logits.shape[1], splits)
    partials = None
    if splits > 1:  # the chunks' answers, merged by each row's last program
        shape, device = (num_rows, splits), logits.device
        partials = (
            torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.int32, device=device),
            torch.empty(shape, dtype=torch.int32, device=device),
        )
        arrivals = arrival_counters(arrivals, num_rows, device)
    visits = None
    if tile_max is not None and threshold is not None:  # the tiles each program reads
        visits = torch.empty_like(tile_max, dtype=torch.int32)
    launch_sample_tokens(
        logits, slots, temperature, seeds, positions, tokens, threshold, salt, prompt_len,
        num_generated, splits, partials, tile_max=tile_max, visits=visits, commit=commit,
        keep=keep, arrivals=arrivals, buffer=buffer,
        defer=(source, deferred) if source is not None and deferred is not None else None,
        keyed=keyed, hand=hand,
    )  # fmt: skip
