"""top-k then top-p in Triton, min_p's cut folded in first: two kernels, no sort (stage 1,
`_candidates_kernel`, is candidates.py's; the cut kernel is here).

Each row's cut goes to `threshold[row]` (keep `logits >= threshold`, -inf when every filter
is off); with APPLY the logits below it become -inf in place, without it the sampling kernel
applies the cut on the fly and no mask is ever written. The semantics are exactly the PyTorch
stage's (graphsafe_sampler/stages/top_k_top_p.py). The key idea: one streaming pass, split
over the vocabulary (rows x splits programs), keeps each chunk's largest logits as a sorted
float32 list with their ids, taking in only what lies above a floor no cut can fall below;
the cut kernel merges the lists into one CANDIDATES (128) buffer, which settles the usual
row (k up to 128, a nucleus of up to about 127 tokens) with the row read once, and marks
`covered` the rows whose kept tokens are all listed, which the sampling kernel races over
the lists without reading the row. What the buffer cannot settle falls to a radix search on
float32's order-preserving integer image, 4 bits a pass. The
lists, the floors, the search, the min_p fold, the reads per row and the exactness:
docs/kernels.md, top-k/top-p.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .bitonic import top_of_sorted_runs
from .candidates import STATS, _candidates_kernel
from .dependent_launch import await_prior_grids, pdl_launch
from .library import (
    SEARCH_STAGES,
    TILE,
    SplitPolicy,
    candidate_buffer,
    check_logits,
    check_rows,
    check_table,
    check_tile_max,
    exp_ftz,
    inplace_op,
    register_cap,
    split_chunks,
    tile_count,
)
from .processed_rows import check_deferred, load_deferred, row_logits
from .radix_select import (
    _float_to_key,
    _key_to_float,
    _largest_key_reaching,
    gather_at_or_above,
)
from .row_params import FILTERS, load_filters


@triton.jit
def _minimum(a, b):
    """Scan operator: the running minimum."""
    return tl.minimum(a, b)


@triton.jit
def _walk_on(
    searching,  # the search stopped for a gather
    key,  # int64: its answer, or the low end of the bin it stopped in
    passes,  # its passes over what it walked
    source,  # what it walked, and the rest of its walk's state:
    length,
    lo,
    cap,
    gathered,
    reads,  # int32: reads of the row so far
    row_ptr,
    vocab_size,
    scratch_ptr,  # [num_rows, GATHER] float32
    row,
    divisor,  # `processed_rows.processed`'s, for the row (never the scratch, already divided)
    GATHER: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """After a search's walk: its passes counted as reads of the row (over the scratch,
    none), and where it stopped for a gather, the row's logits at or above `key` collected
    into the row's scratch in one more read -> the next walk's (source, length, lo, cap,
    gathered) and the reads: the scratch, its length, `key`, no cap, gathered."""
    reads += tl.where(gathered, 0, passes)
    if searching:
        source = scratch_ptr + row.to(tl.int64) * GATHER
        floor = _key_to_float(key)
        length = gather_at_or_above(
            row_ptr, vocab_size, floor, source, GATHER, divisor, BLOCK_SIZE
        )  # fmt: skip
        lo, cap, gathered, reads = key, 0, True, reads + 1
    return source, length, lo, cap, gathered, reads


@triton.jit
def _top_k_top_p_kernel(
    logits_ptr,  # [num_rows, V] float32; read by the search, updated in place with APPLY
    logits_stride,  # elements between rows
    stats_ptr,  # [num_rows, splits, STATS] float32, from _candidates_kernel
    filters_ptr,  # [num_rows, FILTERS] float32: the rows' filters (row_params.py)
    lists_ptr,  # [num_rows, splits, PARTIAL] float32, from _candidates_kernel
    threshold_ptr,  # [num_rows] float32, written: keep logits >= threshold
    covered_ptr,  # [num_rows] int32, written: 1 where every kept logit is in the lists
    reads_ptr,  # [num_rows] int32, written with COUNT_READS: reads of the row made
    scratch_ptr,  # [num_rows, GATHER] float32: the logits a search's gather collects
    source_ptr,  # [num_rows, V] float32 (DEFER): the deferred rows' logits
    source_stride,
    deferred_ptr,  # [num_rows] float32 (DEFER): not 0 = read the row from source_ptr, over it
    vocab_size,
    splits,  # programs stage 1 gave a row
    buffer_size,  # CANDIDATES, or 0: no buffer (search only)
    APPLY: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    COUNT_READS: tl.constexpr,
    CANDIDATES: tl.constexpr,  # the merged buffer: a power of two
    PARTIAL: tl.constexpr,  # each chunk's list; SPLIT_BLOCK * PARTIAL >= CANDIDATES
    SPLIT_BLOCK: tl.constexpr,  # a power of two >= splits (its padding masked)
    STATS: tl.constexpr,
    GATHER: tl.constexpr,  # the searches' gather (kernels/top_k_top_p.py GATHER), 0: none
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
    DEFER: tl.constexpr,  # never with APPLY, which writes the row
):
    """Stage 2, one program per row: the chunks' statistics and lists merged, the cut read
    off the merged buffer, or searched for where the buffer cannot settle it, the search
    cut short by a gather of the few logits left around the cut (docs/kernels.md,
    top-k/top-p)."""
    await_prior_grids(PDL)
    row = tl.program_id(0)
    divisor, from_source = load_deferred(deferred_ptr, row, DEFER)  # with the first loads
    # The chunks' statistics and lists ([SPLIT_BLOCK] each, [SPLIT_BLOCK, PARTIAL]) depend on
    # the row alone: all loaded first, with the slot, in one round (a warp issues in order,
    # and each reduction waits for its load: loaded between them, each took a round). An
    # unfiltered row's are never written, nor used.
    parts = tl.arange(0, SPLIT_BLOCK)
    used = parts < splits
    at = stats_ptr + (row.to(tl.int64) * splits + parts) * STATS
    maxes = tl.load(at + 0, mask=used, other=float("-inf"))
    mins = tl.load(at + 1, mask=used, other=float("inf"))
    nans = tl.load(at + 2, mask=used, other=0.0)
    masses = tl.load(at + 3, mask=used, other=0.0)
    completes = tl.load(at + 4, mask=used, other=float("-inf"))
    listed = tl.load(at + 5, mask=used, other=0.0)
    ranks = tl.arange(0, CANDIDATES)
    lists = lists_ptr + row.to(tl.int64) * splits * PARTIAL
    if SPLIT_BLOCK == 1:
        union = tl.load(lists + ranks)  # PARTIAL == CANDIDATES: already merged
    else:
        # each list sorted, descending: the even chunks' read backwards, so that the merge
        # starts from sorted runs (`bitonic.top_of_sorted_runs`)
        entry = tl.arange(0, PARTIAL)[None, :]
        entry = tl.where(parts[:, None] % 2 == 0, PARTIAL - 1 - entry, entry)
        union = tl.load(
            lists + parts[:, None] * PARTIAL + entry, mask=used[:, None], other=float("-inf")
        )  # fmt: skip
    # the row's filters as processing or stage 1 resolved them from its slot: loaded with
    # the rest, where a load of the slot, then of its parameters, took a round more
    k, top_p, min_p = load_filters(filters_ptr, row, HAS_MIN_P)
    k_on = k > 0
    p_on = top_p < 1.0
    threshold = tl.full((), float("-inf"), tl.float32)
    reads = tl.zeros((), tl.int32)
    covered = tl.zeros((), tl.int1)
    if k_on | p_on | (min_p != 0.0):
        row_ptr = row_logits(
            logits_ptr, logits_stride, source_ptr, source_stride, from_source, row
        )  # fmt: skip
        use_buffer = (buffer_size > 0) & ((k_on & (k <= buffer_size)) | (~k_on & p_on))
        row_max = tl.max(maxes, axis=0)
        row_min = tl.min(mins, axis=0)
        nan_count = tl.sum(nans, axis=0).to(tl.int32)
        reads += 1
        max_key = _float_to_key(row_max)
        if HAS_MIN_P:  # noqa: SIM102 (a constexpr guard: Triton cannot `and` it with a tensor)
            # min_p's cut, never written: l >= l_max + ln(min_p) (kernels/min_p.py's formula).
            # A row holding NaN has a NaN min_p threshold there, which masks nothing: -inf.
            if (min_p != 0.0) & (nan_count == 0):
                threshold = row_max + tl.log(min_p)
        # The merged buffer: the CANDIDATES largest of the chunks' lists, descending, -inf
        # padded; every logit of the row above `complete` is in it.
        values = tl.full((CANDIDATES,), float("-inf"), tl.float32)
        complete = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((), tl.float32)
        if use_buffer:
            # each chunk's mass against its own max, rescaled to the row's
            bases = tl.where(maxes > float("-inf"), maxes, 0.0)
            shift = tl.where(row_max > float("-inf"), row_max, 0.0)
            total = tl.sum(masses * exp_ftz(bases - shift), axis=0)
            complete = tl.max(completes, axis=0)
            entries = tl.sum(listed, axis=0)
            if SPLIT_BLOCK == 1:
                values = union
            else:
                values = top_of_sorted_runs(
                    tl.reshape(union, (SPLIT_BLOCK * PARTIAL,)), PARTIAL, CANDIDATES
                )
            if entries > CANDIDATES:  # the merge left some out: at or below its last
                complete = tl.maximum(complete, tl.min(values, axis=0))
        in_buffer = values > float("-inf")
        # what the searches walk: the row, or what a gather collected of it
        source, length, gathered = row_ptr, vocab_size, tl.zeros((), tl.int1)
        # top-k on the min_p survivors: the k-th largest of the whole row when at least k
        # logits pass the min_p cut, else below it (the cut then keeps every survivor)
        if k_on:
            # The buffer's k-th value v is the row's when v >= complete: the row and the
            # buffer hold the same logits above v (fewer than k), and the buffer holds at
            # least k at or above v (-inf when the row holds fewer than k logits: then
            # top-k keeps everything). When v < complete the row's k-th lies at or below
            # complete (fewer than k logits above it), so a min_p cut at or above
            # complete is the answer, which max(v, cut) gives.
            kth = tl.max(tl.where(ranks == k - 1, values, float("-inf")), axis=0)
            if use_buffer & ((kth >= complete) | (complete <= threshold)):
                threshold = tl.maximum(kth, threshold)
            else:
                # over the row, then (once the search narrows to at most GATHER logits) over
                # those alone, collected in one more read: top-p's search then goes on over
                # them too, since every survivor of the k-th is among them
                key, lo, cap, searching = max_key, _float_to_key(row_min), GATHER, True
                while searching:
                    key, passes, searching, _ = _largest_key_reaching(
                        source, length, lo, max_key, k, 1.0, 0.0, 0.0, -1.0, cap,
                        tl.where(gathered, 0.0, divisor), MASS=False, BLOCK_SIZE=BLOCK_SIZE,
                    )  # fmt: skip
                    source, length, lo, cap, gathered, reads = _walk_on(
                        searching, key, passes, source, length, lo, cap, gathered, reads,
                        row_ptr, vocab_size, scratch_ptr, row, divisor, GATHER, BLOCK_SIZE,
                    )  # fmt: skip
                threshold = tl.maximum(_key_to_float(key), threshold)
        if p_on:
            # an all -inf row would give exp(-inf - -inf) = nan: its masses are 0 instead
            shift = tl.where(row_max > float("-inf"), row_max, 0.0)
            # The survivors so far (logits >= threshold) are all in the buffer when every
            # logit above `complete` is and the cut lies above it; with no cut at all
            # (threshold -inf) the total is the streamed one, and the mass at or above any
            # buffered logit above `complete` is exact. Either way, the largest buffered
            # logit whose mass at or above it reaches top_p of the total is the cut.
            all_in = (complete < threshold) | (complete == float("-inf"))
            found = tl.zeros((), tl.int32)
            if use_buffer & (all_in | (threshold == float("-inf"))):
                survivor = in_buffer & (values >= threshold)
                mass = tl.where(survivor, exp_ftz(values - shift), 0.0)
                # the mass at or above each buffered logit, ties included: the buffer is
                # sorted descending, so it is the running sum at the end of the logit's run
                # of equal values (the smallest running sum at a run's end from it on)
                cumulative = tl.cumsum(mass, 0)
                following = tl.gather(values, tl.minimum(ranks + 1, CANDIDATES - 1), 0)
                run_end = (ranks == CANDIDATES - 1) | (following != values)
                at_or_above = tl.associative_scan(
                    tl.where(run_end, cumulative, float("inf")), 0, _minimum, reverse=True
                )
                row_total = tl.where(all_in, tl.sum(mass, axis=0), total)
                exact = tl.where(all_in, survivor, survivor & (values > complete))
                reach = exact & (at_or_above >= top_p * row_total)
                found = tl.sum(reach.to(tl.int32), axis=0)
                cut = tl.max(tl.where(reach, values, float("-inf")), axis=0)
                cut = tl.maximum(tl.minimum(cut, row_max), threshold)
                threshold = tl.where(found > 0, cut, threshold)
            if found == 0:
                # over the row (or top-k's gather), then over a gather of its own, with the
                # row's target: the mass at or above any logit at or above the gather's
                # floor is the same over the gathered logits as over the row
                key, lo, target = max_key, _float_to_key(tl.maximum(row_min, threshold)), -1.0
                cap, searching = tl.where(gathered, 0, GATHER), True
                while searching:
                    key, passes, searching, target = _largest_key_reaching(
                        source, length, lo, max_key, 0, top_p, threshold, shift, target, cap,
                        tl.where(gathered, 0.0, divisor), MASS=True, BLOCK_SIZE=BLOCK_SIZE,
                    )  # fmt: skip
                    source, length, lo, cap, gathered, reads = _walk_on(
                        searching, key, passes, source, length, lo, cap, gathered, reads,
                        row_ptr, vocab_size, scratch_ptr, row, divisor, GATHER, BLOCK_SIZE,
                    )  # fmt: skip
                # never above the row max (top_p = 0), never below the top-k cut
                threshold = tl.maximum(_key_to_float(tl.minimum(key, max_key)), threshold)
        # every logit at or above the cut is in the chunks' lists, with its id, where the cut
        # lies above `complete` (a row holding NaN samples its first NaN, never listed):
        # sampling then races over the lists instead of reading the row
        covered = use_buffer & (nan_count == 0) & (threshold > complete)
        if APPLY:
            for start in tl.range(0, vocab_size, BLOCK_SIZE, num_stages=SEARCH_STAGES):
                cols = start + tl.arange(0, BLOCK_SIZE)
                in_row = cols < vocab_size
                x = tl.load(row_ptr + cols, mask=in_row, other=0.0)
                tl.store(row_ptr + cols, tl.where(x < threshold, float("-inf"), x), mask=in_row)
            reads += 1
    tl.store(threshold_ptr + row, threshold)
    tl.store(covered_ptr + row, covered.to(tl.int32))
    if COUNT_READS:
        tl.store(reads_ptr + row, reads)


CANDIDATES = 128
"""The candidate buffer's size when compiled (a power of two, 0 = off). Under the Triton
interpreter the default is 0: numpy runs the cut kernel's top-k network op by op, so the
Sampler suites run the search alone there and the buffer has its own kernel tests."""


CHUNK_PARTIAL = 32
"""The list each chunk keeps when stage 1 splits a row (at most the buffer): 64 chunks' lists,
2,048 values, are the widest union the cut kernel merges (and sampling races over). Since
stage 1 inserts one logit at a time, lists of 64 and 128 fit `top_k_top_p_splits`' cap of
80 registers too (72-80, no spill), where its sorting networks spilled them."""

MAX_SPLITS = 64
"""At most this many chunks a row: the cut kernel merges their lists in one program."""

CUT_BLOCK = 512
"""The tile of the cut kernel's passes over a row (the search's, the gather's, the mask's),
which it makes at 4 warps: 4 logits a thread, one vector load, which a summing pass of the
search splits into the thread's own 16 running sums (`radix_select._largest_key_reaching`,
whose lanes are CUT_BLOCK / 4: the kernel's 128 threads). Unrelated to the tile maxima's
TILE: the cut reads no table."""

CUT_CTAS_PER_SM = 2
"""The cut kernel's occupancy, by construction: its launch caps registers at 256 for 2 CTAs
of 4 warps an SM (`library.register_cap`), the issue's floor. Left to itself, ptxas took
80-90 registers for some specializations and spilled 8 bytes there; under the cap it takes
187-218 and spills nothing (at 168, 3 CTAs, its two search loops spilled)."""

MIN_SPLIT_TILES = 2
"""At least this many 1,024-element tiles a chunk (151,936 columns: at most 74 chunks)."""


def default_candidates() -> int:
    """`CANDIDATES`, or 0 under the Triton interpreter (see `CANDIDATES`)."""
    return 0 if os.environ.get("TRITON_INTERPRET") == "1" else CANDIDATES


GATHER = 2048
"""The search's gather (a multiple of 16, 0 = off): a search stops once at most this many
logits lie at or above the bin it chose, one more pass collects them
(`radix_select.gather_at_or_above`) into the row's scratch, and the search goes on over
them alone instead of over the row, as top-p's does after a gathered top-k: 8 KB a row,
where each pass read 600 KB (docs/kernels.md, top-k/top-p: the passes and their cost)."""


def candidate_lists(
    num_rows: int,
    vocab_size: int,
    splits: int,
    device: torch.device,
    candidates: int | None = None,
    block_size: int = TILE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 1's lists for a launch of `splits` programs a row (`launch_top_k_top_p`'s
    `buffer`), uninitialized: covered [num_rows] int32, lists [num_rows, splits', partial]
    float32 and ids [num_rows, splits', partial] int32, splits' and partial as the launch
    takes them (`split_chunks`, `partial_size`; candidates None: `default_candidates()`)."""
    if candidates is None:
        candidates = default_candidates()
    splits, _ = split_chunks(vocab_size, splits, block_size)
    shape = (num_rows, splits, partial_size(candidates, splits))
    return (
        torch.empty(num_rows, dtype=torch.int32, device=device),
        torch.empty(shape, dtype=torch.float32, device=device),
        torch.empty(shape, dtype=torch.int32, device=device),
    )


def partial_size(candidates: int, splits: int) -> int:
    """Each chunk's list: the whole buffer for one chunk a row, CHUNK_PARTIAL (at most the
    buffer) for more; 2 (a shape, unused) without a buffer."""
    if not candidates:
        return 2
    return candidates if splits == 1 else min(candidates, CHUNK_PARTIAL)


top_k_top_p_splits = SplitPolicy(6, MIN_SPLIT_TILES, MAX_SPLITS, min_splits=3)
"""Programs per row for stage 1 (`library.SplitPolicy`: at least MIN_SPLIT_TILES tiles each,
at most MAX_SPLITS, since the cut kernel merges their lists in one program). 6 CTAs an SM by
construction: a split row's lists hold CHUNK_PARTIAL, and the launch caps registers at 80
for its 4 warps (it takes 72-78 there, no spill; at B = 256 its 3 chunks a row fill one
wave: docs/kernels.md, split rows). At least 3 chunks where the row has the tiles: one
chunk's list of 128 takes about 80 registers, and 2 chunks' lists hold 64 candidates, which
settle fewer rows than 3 or more."""


def launch_top_k_top_p(
    logits: torch.Tensor,  # [num_rows, V] float32; masked in place when apply
    slots: torch.Tensor,  # [num_rows] int64
    top_k: torch.Tensor,  # [num_slots] int32
    top_p: torch.Tensor,  # [num_slots] float32
    threshold: torch.Tensor,  # [num_rows] float32, written
    apply: bool,
    min_p: torch.Tensor | None = None,  # [num_slots] float32: min_p's cut folded in first
    reads: torch.Tensor | None = None,  # [num_rows] int32, written: reads of each row made
    candidates: int | None = None,  # the buffer's size; None: default_candidates()
    block_size: int = TILE,
    splits: int = 1,  # stage 1's programs per row (`top_k_top_p_splits`)
    # [num_rows, ceil(V / block_size)] float32: process_logits' tile maxima of `logits`
    tile_max: torch.Tensor | None = None,
    gather: int = GATHER,  # the search's gather: a multiple of 16 logits, 0 = off
    # (covered [num_rows] int32, lists [num_rows, splits, partial] float32, ids the same
    # int32), written (`candidate_lists`): for sampling to race the covered rows over the
    # lists; None: scratch
    buffer: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    # [num_rows, V] float32 and [num_rows] float32, both or neither: rows read divided by
    # |deferred[r]|, from `source` where positive (`processed_rows`), never with apply
    source: torch.Tensor | None = None,
    deferred: torch.Tensor | None = None,
    # [num_rows, FILTERS] float32: the rows' filters as processing resolved them
    # (`row_params`), which stage 1 then reads by row; None: stage 1 resolves them
    filters: torch.Tensor | None = None,
) -> None:
    """Launch `_candidates_kernel` over rows x splits, then `_top_k_top_p_kernel` over the
    rows; allocates the chunks' statistics, the rows' filters stage 1 hands the cut unless
    given (and the lists without `buffer`), returns None."""
    if apply and source is not None:
        raise ValueError("apply writes the logits: a deferred row has none to write")
    if candidates is None:
        candidates = default_candidates()
    if gather < 0 or gather % 16:
        raise ValueError(f"gather must be 0 or a positive multiple of 16, got {gather}")
    if candidates and (candidates & (candidates - 1) or candidates > block_size):
        raise ValueError(
            f"candidates must be 0 or a power of two <= block_size {block_size}, got {candidates}"
        )
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    num_rows, vocab_size = logits.shape
    splits, chunk = split_chunks(vocab_size, splits, block_size)
    partial = partial_size(candidates, splits)
    device = logits.device
    stats = torch.empty((num_rows, splits, STATS), dtype=torch.float32, device=device)
    resolved = filters is not None
    if filters is None:
        filters = torch.empty((num_rows, FILTERS.value), dtype=torch.float32, device=device)
    if buffer is None:
        buffer = candidate_lists(num_rows, vocab_size, splits, device, candidates, block_size)
    covered, lists, ids = buffer
    check_rows("covered", covered, torch.int32, num_rows)
    for name, table, dtype in (("lists", lists, torch.float32), ("ids", ids, torch.int32)):
        check_table(name, table, dtype, (num_rows, splits, partial))
    # the searches' scratch: the logits a gather collects, written before they are read
    scratch = torch.empty((num_rows, max(gather, 1)), dtype=torch.float32, device=device)
    num_tiles = tile_count(vocab_size, block_size)
    visits = None
    if tile_max is not None:
        visits = torch.empty((num_rows, num_tiles), dtype=torch.int32, device=device)
    min_p_table = min_p if min_p is not None else top_p  # unread without HAS_MIN_P
    deferred_args = (
        (source, source.stride(0), deferred)
        if source is not None and deferred is not None
        else (logits, logits.stride(0), threshold)  # unread without DEFER
    )
    # stage 1 at 4 warps: its list's work (the insertions) is the same in every warp, so
    # half the warps do half of it, for 8 logits a thread instead of 4 (estimated stage 1 at
    # B = 256 when it was made so: 34.5 -> 27.7 us)
    _candidates_kernel[(num_rows, splits)](
        logits, logits.stride(0), slots, top_k, top_p, min_p_table, stats, filters, lists, ids,
        tile_max if tile_max is not None else stats,  # unread without HAS_TILE_MAX
        visits if visits is not None else stats,
        *deferred_args,
        vocab_size, chunk, candidates, num_tiles,
        HAS_MIN_P=min_p is not None, HAS_TILE_MAX=tile_max is not None, PARTIAL=partial,
        STATS=STATS, RESOLVED=resolved, TILES_BLOCK=triton.next_power_of_2(num_tiles),
        BLOCK_SIZE=block_size,
        DEFER=source is not None, **pdl_launch(device), num_warps=4,
        maxnreg=top_k_top_p_splits.max_registers(4) if partial <= CHUNK_PARTIAL else None,
    )  # fmt: skip
    _top_k_top_p_kernel[(num_rows,)](
        logits,
        logits.stride(0),
        stats,
        filters,
        lists,
        threshold,
        covered,
        reads if reads is not None else threshold,  # unwritten without COUNT_READS
        scratch,
        *deferred_args,
        vocab_size,
        splits,
        candidates,
        APPLY=apply,
        HAS_MIN_P=min_p is not None,
        COUNT_READS=reads is not None,
        # a shape even when off (k <= the tile, which a GPU checks even in the branch that
        # is never taken)
        CANDIDATES=max(candidates, partial),
        PARTIAL=partial,
        # padded to hold the buffer: 2 chunks' lists of 32 are fewer than 128 candidates
        SPLIT_BLOCK=max(triton.next_power_of_2(splits), candidates // partial),
        STATS=STATS,
        GATHER=gather,
        BLOCK_SIZE=CUT_BLOCK,
        DEFER=source is not None,
        **pdl_launch(device),
        num_warps=4,
        maxnreg=register_cap(4, CUT_CTAS_PER_SM),
    )


def _check_top_k_top_p(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None,
    tile_max: torch.Tensor | None,
) -> None:
    check_logits(logits)
    num_rows = logits.shape[0]
    check_rows("slots", slots, torch.int64, num_rows)
    check_rows("threshold", threshold, torch.float32, num_rows)
    if top_k.dtype != torch.int32:
        raise TypeError(f"top_k must be torch.int32, got {top_k.dtype}")
    if top_p.dtype != torch.float32:
        raise TypeError(f"top_p must be torch.float32, got {top_p.dtype}")
    for name, table in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        if table is not None and not table.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if min_p is not None:
        if min_p.dtype != torch.float32:
            raise TypeError(f"min_p must be torch.float32, got {min_p.dtype}")
        if min_p.shape != top_p.shape:
            raise ValueError(
                f"min_p must have the shape of top_p {tuple(top_p.shape)}, got {tuple(min_p.shape)}"
            )
    if tile_max is not None:
        check_tile_max(tile_max, num_rows, logits.shape[1])


@inplace_op(
    "top_k_top_p_threshold", mutates_args=("threshold", "covered", "lists", "ids")
)  # fmt: skip
def top_k_top_p_threshold(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None = None,
    splits: int = 1,
    tile_max: torch.Tensor | None = None,
    covered: torch.Tensor | None = None,
    lists: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    source: torch.Tensor | None = None,
    deferred: torch.Tensor | None = None,
    filters: torch.Tensor | None = None,
) -> None:
    """Each row's top-k-then-top-p cut into `threshold` (keep logits >= it; -inf when off),
    without writing the logits. logits [num_rows, V] float32; slots [num_rows] int64; top_k
    [num_slots] int32 (<= 0 or >= V off); top_p [num_slots] float32 (>= 1 off); threshold
    [num_rows] float32. min_p [num_slots] float32 (0 off), when given: min_p's cut first,
    folded into the threshold. splits: stage 1's programs per row (`top_k_top_p_splits`
    picks it; the cut does not depend on it). tile_max [num_rows, ceil(V / TILE)] float32:
    `process_logits`' tile maxima of these logits (finite: exact; +inf: NaN or unknown),
    with which stage 1 skips the tiles below every cut of a top-k row (docs/kernels.md).
    covered, lists, ids: all three or none, as `candidate_lists(num_rows, V, splits, ...)`
    allocates them, written: the chunks' lists of largest logits with their token ids (-1
    padded), and 1 in `covered` for each row whose every kept logit is in them (0
    otherwise), for `sample_tokens` to race those rows over the lists. source [num_rows, V]
    float32 and deferred [num_rows] float32, both or neither: each row read divided by
    |deferred[r]|, from `source` where positive (`process_logits` left it unwritten), and
    so are tile_max's (`processed_rows`). filters [num_rows, 4] float32: the rows' filters as
    `process_logits` resolved them from these tables (`row_params`), read by row."""
    _check_top_k_top_p(logits, slots, top_k, top_p, threshold, min_p, tile_max)
    check_deferred(logits, source, deferred)
    if filters is not None:
        check_table("filters", filters, torch.float32, (logits.shape[0], FILTERS.value))
    launch_top_k_top_p(
        logits, slots, top_k, top_p, threshold, False, min_p, splits=splits,
        tile_max=tile_max, buffer=candidate_buffer(covered, lists, ids), source=source,
        deferred=deferred, filters=filters,
    )  # fmt: skip


@inplace_op("apply_top_k_top_p", mutates_args=("logits", "threshold"))
def apply_top_k_top_p(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None = None,
    splits: int = 1,
    tile_max: torch.Tensor | None = None,
) -> None:
    """`top_k_top_p_threshold`, then the logits below each row's cut become -inf in place
    (the PyTorch stage's apply_top_k_top_p, after min_p's mask when `min_p` is given). The
    tile maxima stay upper bounds of the masked logits."""
    _check_top_k_top_p(logits, slots, top_k, top_p, threshold, min_p, tile_max)
    launch_top_k_top_p(
        logits, slots, top_k, top_p, threshold, True, min_p, splits=splits, tile_max=tile_max
    )
