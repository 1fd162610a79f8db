"""The radix search of top-k/top-p in Triton: the largest float32 whose count (or mass) of
logits at or above it reaches a target, found on float32's order-preserving integer image,
4 bits of the answer a pass over the row, and the gather that cuts a search short (the few
logits left around the cut, collected in one pass for the search to go on over them
alone). The cut kernel of kernels/top_k_top_p.py runs them for the rows its candidate
buffer does not settle (docs/kernels.md, top-k/top-p: the integer image, stage 3: the
search, the passes and their cost).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .library import SEARCH_STAGES, exp_ftz
from .processed_rows import processed


@triton.jit
def _ordered_image(x):
    """float32 -> int32 with the floats' order (a signed compare); -0.0 and +0.0 share one."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _float_to_key(x):
    """float32 -> int64 key in [0, 2**32) with the floats' order: `_ordered_image` + 2**31."""
    return _ordered_image(x).to(tl.int64) + 2147483648


@triton.jit
def _key_to_float(key):
    """int64 key -> the float32 it stands for; keys below key(-inf) = 8388607 (negative NaN
    patterns) become -inf."""
    ordered = (tl.maximum(key, 8388607) - 2147483648).to(tl.int32)
    bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _quarters(v, LANES: tl.constexpr):
    """[4 * LANES] -> its four [LANES] quarters of elements 4i, 4i + 2, 4i + 1, 4i + 3."""
    a, b = tl.split(tl.reshape(v, (LANES, 2, 2)))
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    return a0, a1, b0, b1


@triton.jit
def _tally(
    row_ptr, start, vocab_size, low, s, floor, shift, divisor, digits, MASS: tl.constexpr,
    LANES: tl.constexpr, BLOCK_SIZE: tl.constexpr, FULL: tl.constexpr,
):  # fmt: skip
    """A search pass's tile at `start` -> its histogram of digit + 1 ([32]) and, with MASS,
    each lane's masses at the 16 thresholds ([16, LANES], a lane's 4 logits summed); `low`
    is the range's low end on the keys' int32 image (`_ordered_image`), the digit's width
    2**s. FULL: the tile lies inside the row, its load unmasked."""
    cols = start + tl.arange(0, BLOCK_SIZE)
    if FULL:
        x = tl.load(row_ptr + cols)
    else:
        x = tl.load(row_ptr + cols, mask=cols < vocab_size, other=float("nan"))
    x = processed(x, divisor)
    valid = x == x  # in the row and not NaN
    # the digit, -1 below the range and for NaN, 16 above it: on the keys' int32 image
    # (key - 2**31, the same order), its offset from the range's low end a uint32 shifted
    # logically (in int64: 7 SASS instructions a logit more)
    ordered = _ordered_image(x)
    offset = (ordered - low).to(tl.uint32, bitcast=True) >> s.to(tl.uint32)
    digit = tl.where(valid & (ordered >= low), tl.minimum(offset, 16).to(tl.int32), -1)
    masses = tl.zeros((16, LANES), tl.float32)
    if MASS:
        mass = tl.where(valid & (x >= floor), exp_ftz(x - shift), 0.0)
        d0, d1, d2, d3 = _quarters(digit, LANES)
        m0, m1, m2, m3 = _quarters(mass, LANES)
        masses = tl.where(d0[None, :] >= digits[:, None], m0[None, :], 0.0)
        masses += tl.where(d1[None, :] >= digits[:, None], m1[None, :], 0.0)
        masses += tl.where(d2[None, :] >= digits[:, None], m2[None, :], 0.0)
        masses += tl.where(d3[None, :] >= digits[:, None], m3[None, :], 0.0)
    return tl.histogram(digit + 1, 32), masses


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
    given,  # float32: the target, or < 0 for top_p times the first pass's mass (MASS)
    cap,  # int32: stop once at most this many logits lie at or above the bin (0: never)
    divisor,  # float32: the row's `processed_rows.processed` divisor (0: none)
    MASS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """-> (key, passes, gather, target): the largest key t with W(t) >= target, W(t) =
    count (or mass) of logits with key >= t, the passes it took over the row (its first
    `vocab_size` logits), whether it stopped for a gather, and the target (MASS; 0.0
    otherwise). Searched from the digits where lo_key and hi_key first differ. Each pass
    reads the row once and measures W at prefix + c * 2**s, c = 0..15 (4 bits of the
    answer); the digit is how many of c = 1..15 still reach the target. It stops early once
    the mask is decided: top-k when exactly k logits lie at or above the chosen bin's low
    end, top-p when the chosen bin holds a single logit (docs/kernels.md, top-k/top-p). Or,
    with `gather` true, once at most `cap` logits lie at or above the chosen bin's low end
    and it does not decide the mask yet: `key` is then that low end, the answer lies among
    those logits, for `gather_at_or_above` to collect in one more pass."""
    # A pass's tile is [BLOCK_SIZE], 4 logits a thread (the cut kernel's 4 warps: 128
    # lanes). Its counts are a histogram of the digits (shared-memory atomics), and its
    # masses each lane's own [16] sums over the pass, reduced across lanes once a pass: a
    # [BLOCK, 16] compare reduced every tile took twice the instructions
    LANES: tl.constexpr = BLOCK_SIZE // 4
    digits = tl.arange(0, 16)
    bins = tl.arange(0, 32)  # the histogram's: digit + 1, in [0, 17]
    diff = lo_key ^ hi_key
    # tensors, not Python ints: they are carried through data-dependent while loops
    s = tl.full((), 28, tl.int32)
    while (s > 0) & ((diff >> s) == 0):
        s -= 4
    prefix = (lo_key >> (s + 4)) << (s + 4)
    target = tl.zeros((), tl.float32) + given
    passes = tl.zeros((), tl.int32)
    gather = tl.zeros((), tl.int1)
    # each pass: the whole tiles unmasked, pipelined, then the partial last one alone (a
    # mask on every tile's load took about 18 registers a stage of the pipeline, these 2)
    full_end = vocab_size // BLOCK_SIZE * BLOCK_SIZE
    while s >= 0:
        low = (prefix - 2147483648).to(tl.int32)  # key - 2**31: `_ordered_image`'s
        histogram = tl.zeros((32,), tl.int32)
        lane_masses = tl.zeros((16, LANES), tl.float32)  # [c, lane]
        for start in tl.range(0, full_end, BLOCK_SIZE, num_stages=SEARCH_STAGES):
            tile_counts, tile_masses = _tally(
                row_ptr, start, vocab_size, low, s, floor, shift, divisor, digits, MASS,
                LANES, BLOCK_SIZE, FULL=True,
            )  # fmt: skip
            histogram += tile_counts
            lane_masses += tile_masses
        if full_end < vocab_size:
            tile_counts, tile_masses = _tally(
                row_ptr, full_end, vocab_size, low, s, floor, shift, divisor, digits, MASS,
                LANES, BLOCK_SIZE, FULL=False,
            )  # fmt: skip
            histogram += tile_counts
            lane_masses += tile_masses
        # logits with key >= prefix + c * 2**s (digit >= c: bins c + 1 on), and above the
        # whole range (digit 16: bin 17)
        counts = tl.sum(tl.where(bins[None, :] > digits[:, None], histogram[None, :], 0), axis=1)
        above = tl.sum(tl.where(bins == 17, histogram, 0), axis=0)
        if MASS:
            masses = tl.sum(lane_masses, axis=1)
            # the first pass's column 0 covers every candidate (the range starts at or
            # below floor): the total mass
            total = tl.sum(tl.where(digits == 0, masses, 0.0), axis=0)
            target = tl.where((passes == 0) & (given < 0.0), top_p * total, target)
            reach = masses >= target
        else:
            reach = counts >= k
        chosen = tl.sum((reach & (digits >= 1)).to(tl.int32), axis=0)
        prefix += chosen.to(tl.int64) << s
        at_low_end = tl.sum(tl.where(digits == chosen, counts, 0), axis=0)
        past_bin = tl.sum(tl.where(digits == chosen + 1, counts, 0), axis=0)
        past_bin += tl.where(chosen == 15, above, 0)
        decided = (at_low_end - past_bin <= 1) if MASS else (at_low_end == k)
        # few enough logits at or above the bin's low end for the caller's scratch: one
        # more pass collects them, where each further digit would cost a pass over the
        # row (at full resolution, s = 0, the low end is the answer itself)
        gather = ~decided & (at_low_end <= cap) & (cap > 0) & (s > 0)  # cap 0: never
        s = tl.where(decided | gather, -4, s - 4)
        passes += 1
    return prefix, passes, gather, target


@triton.jit
def gather_at_or_above(
    row_ptr,
    vocab_size,
    floor,  # float32: the logits >= floor (never NaN), at most `cap` of them
    scratch_ptr,  # [cap] float32, the row's own, overwritten
    cap,
    divisor,  # float32: the row's `processed_rows.processed` divisor (0: none)
    BLOCK_SIZE: tl.constexpr,
):
    """One pass over the row: its logits >= floor stored to scratch in column order, then
    NaN (never counted) up to a multiple of 16 -> that length, at most `cap` (a multiple of
    16; the caller counted at most `cap` logits, any past it are left out). A multiple of
    16, as the vocabulary usually is, keeps the search's loads over it vectorized as over
    the row. Each tile's logits go at the running count plus their rank among the tile's,
    a prefix sum; a barrier follows, so that every thread may read what the others
    stored."""
    count = tl.zeros((), tl.int32)
    for start in tl.range(0, vocab_size, BLOCK_SIZE, num_stages=SEARCH_STAGES):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = processed(tl.load(row_ptr + cols, mask=cols < vocab_size, other=float("nan")), divisor)
        kept = (x >= floor).to(tl.int32)  # NaN: 0
        at = count + tl.cumsum(kept, 0) - 1
        tl.store(scratch_ptr + at, x, mask=(kept != 0) & (at < cap))
        count += tl.sum(kept, axis=0)
    count = tl.minimum(count, cap)
    length = (count + 15) // 16 * 16
    pad = count + tl.arange(0, 16)
    tl.store(scratch_ptr + pad, float("nan"), mask=pad < length)
    tl.debug_barrier()
    return length
