"""top-k then top-p in Triton, min_p's cut folded in first: one program per row, no sort.

Each row's cut goes to `threshold[row]` (keep `logits >= threshold`, -inf when every filter
is off); with APPLY the logits below it become -inf in place, without it the sampling kernel
applies the cut on the fly and no mask is ever written. The semantics are exactly the PyTorch
stage's (graphsafe_sampler/stages/top_k_top_p.py). The key idea: one streaming pass keeps
the row's CANDIDATES (128) largest logits in a sorted buffer, which settles the usual row (k
up to 128, a nucleus of up to about 127 tokens) in one read; what it cannot settle falls to
a radix search on float32's order-preserving integer image, 4 bits a pass. The buffer, the
search, the min_p fold, the reads per row and the exactness: docs/kernels.md, top-k/top-p.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .library import check_logits, check_rows, inplace_op


@triton.jit
def _float_to_key(x):
    """float32 -> int64 key in [0, 2**32) with the floats' order; -0.0 and +0.0 share one."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return ordered.to(tl.int64) + 2147483648


@triton.jit
def _key_to_float(key):
    """int64 key -> the float32 it stands for; keys below key(-inf) = 8388607 (negative NaN
    patterns) become -inf."""
    ordered = (tl.maximum(key, 8388607) - 2147483648).to(tl.int32)
    bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _largest_key_reaching(
    row_ptr,
    vocab_size,
    lo_key,  # int64: key of the smallest candidate
    hi_key,  # int64: key of the largest candidate
    k,  # top-k target (counts), used when not MASS
    top_p,  # top-p fraction of the total mass, used when MASS
    floor,  # float32: only logits >= floor carry mass (MASS)
    shift,  # float32: masses are exp(x - shift) (MASS)
    MASS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """(the largest key t with W(t) >= target, the passes over the row it took), W(t) = count
    (or mass) of logits with key >= t; searched from the digits where lo_key and hi_key first
    differ. Each pass reads the row once and measures W at prefix + c * 2**s, c = 0..15 (4
    bits of the answer); the digit is how many of c = 1..15 still reach the target. It stops
    early once the mask is decided: top-k when exactly k logits lie at or above the chosen
    bin's low end, top-p when the chosen bin holds a single logit (docs/kernels.md,
    top-k/top-p)."""
    digits = tl.arange(0, 16)
    diff = lo_key ^ hi_key
    # tensors, not Python ints: they are carried through data-dependent while loops
    s = tl.full((), 28, tl.int32)
    while (s > 0) & ((diff >> s) == 0):
        s -= 4
    prefix = (lo_key >> (s + 4)) << (s + 4)
    target = tl.zeros((), tl.float32)
    passes = tl.zeros((), tl.int32)
    while s >= 0:
        counts = tl.zeros((16,), tl.int32)  # logits with key >= prefix + c * 2**s
        masses = tl.zeros((16,), tl.float32)
        above = tl.zeros((), tl.int32)  # logits above the whole range
        for start in range(0, vocab_size, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            x = tl.load(row_ptr + cols, mask=cols < vocab_size, other=float("nan"))
            valid = x == x  # in the row and not NaN
            # (key - prefix) >> s is negative below the range (arithmetic shift)
            digit = tl.minimum((_float_to_key(x) - prefix) >> s, 16)
            at_or_above = (digit[:, None] >= digits[None, :]) & valid[:, None]  # [BLOCK, 16]
            counts += tl.sum(at_or_above.to(tl.int32), axis=0)
            above += tl.sum(((digit >= 16) & valid).to(tl.int32), axis=0)
            if MASS:
                mass = tl.where(valid & (x >= floor), tl.exp(x - shift), 0.0)
                masses += tl.sum(tl.where(at_or_above, mass[:, None], 0.0), axis=0)
        if MASS:
            # the first pass's column 0 covers every candidate (the range starts at or
            # below floor): the total mass
            total = tl.sum(tl.where(digits == 0, masses, 0.0), axis=0)
            target = tl.where(passes == 0, top_p * total, target)
            reach = masses >= target
        else:
            reach = counts >= k
        chosen = tl.sum((reach & (digits >= 1)).to(tl.int32), axis=0)
        prefix += chosen.to(tl.int64) << s
        at_low_end = tl.sum(tl.where(digits == chosen, counts, 0), axis=0)
        past_bin = tl.sum(tl.where(digits == chosen + 1, counts, 0), axis=0)
        past_bin += tl.where(chosen == 15, above, 0)
        decided = (at_low_end - past_bin <= 1) if MASS else (at_low_end == k)
        s = tl.where(decided, -4, s - 4)
        passes += 1
    return prefix, passes


@triton.jit
def _pack(x, cols, in_row):
    """[BLOCK] float32 logits -> int64 candidate keys `key(x) << 31 | (2**31 - 1 - col)`:
    ordered by logit, then lowest index first, all distinct; -1 (below every key) for NaN and
    out-of-row lanes. key(x) < 2**32 and col < 2**31, so the key stays below 2**63."""
    packed = (_float_to_key(x) << 31) | (2147483647 - cols.to(tl.int64))
    return tl.where(in_row & (x == x), packed, -1)


@triton.jit
def _top_k_top_p_kernel(
    logits_ptr,  # [num_rows, V] float32; updated in place with APPLY
    logits_stride,  # elements between rows
    slots_ptr,  # [num_rows] int64 row -> slot
    top_k_ptr,  # [num_slots] int32; <= 0 or >= V is off
    top_p_ptr,  # [num_slots] float32; >= 1 is off
    min_p_ptr,  # [num_slots] float32; 0 is off (HAS_MIN_P)
    threshold_ptr,  # [num_rows] float32, written: keep logits >= threshold
    reads_ptr,  # [num_rows] int32, written with COUNT_READS: reads of the row made
    vocab_size,
    buffer_size,  # CANDIDATES, or 0: no buffer (search only)
    APPLY: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    COUNT_READS: tl.constexpr,
    CANDIDATES: tl.constexpr,  # the buffer's shape: a power of two <= BLOCK_SIZE
    BLOCK_SIZE: tl.constexpr,
):
    """One row's cut: stage 1, the candidate buffer; stage 2, the search, only where the
    buffer cannot settle the row (docs/kernels.md, top-k/top-p)."""
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    k = tl.load(top_k_ptr + slot)
    top_p = tl.load(top_p_ptr + slot).to(tl.float32)
    k_on = (k > 0) & (k < vocab_size)
    p_on = top_p < 1.0
    min_p = tl.zeros((), tl.float32)
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + slot).to(tl.float32)
    threshold = tl.full((), float("-inf"), tl.float32)
    reads = tl.zeros((), tl.int32)
    # rows whose filters (min_p, top-k, top-p) are all off read their parameters and exit
    if k_on | p_on | (min_p != 0.0):
        row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
        # The one pass every filtered row makes: min, max, NaN count and, for top-k/top-p,
        # the CANDIDATES largest logits (packed keys, `best`, sorted descending) and the
        # row's total mass exp(l - l_max), accumulated online against the running max.
        # (a k beyond the buffer leaves it nothing to settle: its k-th largest is at or
        # below the buffer's last, so top-p after it cannot be settled either)
        use_buffer = (buffer_size > 0) & ((k_on & (k <= buffer_size)) | (~k_on & p_on))
        row_max = tl.full((), float("-inf"), tl.float32)
        row_min = tl.full((), float("inf"), tl.float32)
        nan_count = tl.zeros((), tl.int32)
        total = tl.zeros((), tl.float32)
        best = tl.full((CANDIDATES,), -1, tl.int64)
        for start in range(0, vocab_size, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            in_row = cols < vocab_size
            x = tl.load(row_ptr + cols, mask=in_row, other=float("nan"))
            valid = x == x
            tile_max = tl.max(tl.where(valid, x, float("-inf")), axis=0)
            row_min = tl.minimum(row_min, tl.min(tl.where(valid, x, float("inf")), axis=0))
            nan_count += tl.sum((~valid & in_row).to(tl.int32), axis=0)
            if use_buffer:
                if p_on:  # only top-p weighs masses (top-k alone skips the exp per logit)
                    # masses against the new running max; an all -inf prefix has none (its
                    # exp(-inf - -inf) would be nan), so the base is then 0
                    new_max = tl.maximum(row_max, tile_max)
                    base = tl.where(new_max > float("-inf"), new_max, 0.0)
                    total = total * tl.exp(row_max - base)
                    total += tl.sum(tl.where(valid, tl.exp(x - base), 0.0), axis=0)
                packed = _pack(x, cols, in_row)
                # a tile holding nothing above the running CANDIDATES-th key skips the merge
                if tl.max(packed, axis=0) > tl.min(best, axis=0):
                    tile_top = tl.topk(packed, CANDIDATES)
                    both = tl.reshape(tl.join(best, tile_top), (2 * CANDIDATES,))
                    best = tl.topk(both, CANDIDATES)
            row_max = tl.maximum(row_max, tile_max)
        reads += 1
        max_key = _float_to_key(row_max)
        num_valid = vocab_size - nan_count
        if HAS_MIN_P:  # noqa: SIM102 (a constexpr guard: Triton cannot `and` it with a tensor)
            # min_p's cut, never written: l >= l_max + ln(min_p) (kernels/min_p.py's formula).
            # A row holding NaN has a NaN min_p threshold there, which masks nothing: -inf.
            if (min_p != 0.0) & (nan_count == 0):
                threshold = row_max + tl.log(min_p)
        # The buffer's values, largest first; -inf past the row's valid logits.
        ranks = tl.arange(0, CANDIDATES)
        in_buffer = best >= 0
        values = tl.where(in_buffer, _key_to_float(best >> 31), float("-inf"))
        last = tl.min(values, axis=0)  # the CANDIDATES-th largest, when num_valid >= CANDIDATES
        # top-k on the min_p survivors: the k-th largest of the whole row when at least k
        # logits pass the min_p cut, else below it (the cut then keeps every survivor)
        if k_on:
            if use_buffer:
                # exact: the k-th largest of the row is the buffer's k-th (-inf when the row
                # holds fewer than k logits: then top-k keeps everything)
                kth = tl.max(tl.where(ranks == k - 1, values, float("-inf")), axis=0)
                threshold = tl.maximum(kth, threshold)
            else:
                key, passes = _largest_key_reaching(
                    row_ptr, vocab_size, _float_to_key(row_min), max_key, k, 1.0, 0.0, 0.0,
                    MASS=False, BLOCK_SIZE=BLOCK_SIZE,
                )  # fmt: skip
                threshold = tl.maximum(_key_to_float(key), threshold)
                reads += passes
        if p_on:
            # an all -inf row would give exp(-inf - -inf) = nan: its masses are 0 instead
            shift = tl.where(row_max > float("-inf"), row_max, 0.0)
            # The survivors so far (logits >= threshold) are all in the buffer when the row
            # has at most CANDIDATES logits or the buffer's last lies below the cut; with no
            # cut at all (threshold -inf) the total is the streamed one, and the mass above
            # any buffered logit strictly above the last is exact. Either way, the largest
            # buffered logit whose mass at or above it reaches top_p of the total is the cut.
            all_in = (num_valid <= buffer_size) | (last < threshold)
            found = tl.zeros((), tl.int32)
            if use_buffer & (all_in | (threshold == float("-inf"))):
                survivor = in_buffer & (values >= threshold)
                mass = tl.where(survivor, tl.exp(values - shift), 0.0)
                # [CANDIDATES, CANDIDATES]: mass at or above each buffered logit, ties included
                at_or_above = tl.sum(
                    tl.where(values[None, :] >= values[:, None], mass[None, :], 0.0), axis=1
                )
                row_total = tl.where(all_in, tl.sum(mass, axis=0), total)
                exact = survivor & (all_in | (values > last))
                reach = exact & (at_or_above >= top_p * row_total)
                found = tl.sum(reach.to(tl.int32), axis=0)
                cut = tl.max(tl.where(reach, values, float("-inf")), axis=0)
                cut = tl.maximum(tl.minimum(cut, row_max), threshold)
                threshold = tl.where(found > 0, cut, threshold)
            if found == 0:
                key, passes = _largest_key_reaching(
                    row_ptr, vocab_size, _float_to_key(tl.maximum(row_min, threshold)), max_key,
                    0, top_p, threshold, shift, MASS=True, BLOCK_SIZE=BLOCK_SIZE,
                )  # fmt: skip
                # never above the row max (top_p = 0), never below the top-k cut
                threshold = tl.maximum(_key_to_float(tl.minimum(key, max_key)), threshold)
                reads += passes
        if APPLY:
            for start in range(0, vocab_size, BLOCK_SIZE):
                cols = start + tl.arange(0, BLOCK_SIZE)
                in_row = cols < vocab_size
                x = tl.load(row_ptr + cols, mask=in_row, other=0.0)
                tl.store(row_ptr + cols, tl.where(x < threshold, float("-inf"), x), mask=in_row)
            reads += 1
    tl.store(threshold_ptr + row, threshold)
    if COUNT_READS:
        tl.store(reads_ptr + row, reads)


CANDIDATES = 128
"""The candidate buffer's size when compiled (a power of two, 0 = off). Under the Triton
interpreter the default is 0: numpy runs the bitonic network op by op, about a second a row,
so the Sampler suites run the search alone there and the buffer has its own kernel tests."""


def default_candidates() -> int:
    """`CANDIDATES`, or 0 under the Triton interpreter (see `CANDIDATES`)."""
    return 0 if os.environ.get("TRITON_INTERPRET") == "1" else CANDIDATES


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
    block_size: int = 1024,
) -> None:
    """Launch `_top_k_top_p_kernel` over the rows; allocates nothing, returns None."""
    if candidates is None:
        candidates = default_candidates()
    if candidates and (candidates & (candidates - 1) or candidates > block_size):
        raise ValueError(
            f"candidates must be 0 or a power of two <= block_size {block_size}, got {candidates}"
        )
    num_rows, vocab_size = logits.shape
    _top_k_top_p_kernel[(num_rows,)](
        logits,
        logits.stride(0),
        slots,
        top_k,
        top_p,
        min_p if min_p is not None else top_p,  # unread without HAS_MIN_P
        threshold,
        reads if reads is not None else threshold,  # unwritten without COUNT_READS
        vocab_size,
        candidates,
        APPLY=apply,
        HAS_MIN_P=min_p is not None,
        COUNT_READS=reads is not None,
        # a shape even when off (k = 1 is tl.topk's special case; k <= the tile, which a GPU
        # checks even in the branch that is never taken)
        CANDIDATES=max(candidates, min(2, block_size)),
        BLOCK_SIZE=block_size,
        # why: with 1,024-element tiles at 4 warps ptxas (sm_90a) caps the kernel at 255
        # registers and spills ~600 bytes a thread, with or without the buffer (the search's
        # [BLOCK, 16] compare, the bitonic networks over int64 keys); 8 warps take 184 and
        # spill none (tests/cuda_compile.py checks every variant)
        num_warps=8 if block_size >= 512 else 4,
    )


def _check_top_k_top_p(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None,
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


@inplace_op("top_k_top_p_threshold", mutates_args=("threshold",))
def top_k_top_p_threshold(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> None:
    """Each row's top-k-then-top-p cut into `threshold` (keep logits >= it; -inf when off),
    without writing the logits. logits [num_rows, V] float32; slots [num_rows] int64; top_k
    [num_slots] int32 (<= 0 or >= V off); top_p [num_slots] float32 (>= 1 off); threshold
    [num_rows] float32. min_p [num_slots] float32 (0 off), when given: min_p's cut first,
    folded into the threshold."""
    _check_top_k_top_p(logits, slots, top_k, top_p, threshold, min_p)
    launch_top_k_top_p(logits, slots, top_k, top_p, threshold, apply=False, min_p=min_p)


@inplace_op("apply_top_k_top_p", mutates_args=("logits", "threshold"))
def apply_top_k_top_p(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> None:
    """`top_k_top_p_threshold`, then the logits below each row's cut become -inf in place
    (the PyTorch stage's apply_top_k_top_p, after min_p's mask when `min_p` is given)."""
    _check_top_k_top_p(logits, slots, top_k, top_p, threshold, min_p)
    launch_top_k_top_p(logits, slots, top_k, top_p, threshold, apply=True, min_p=min_p)
