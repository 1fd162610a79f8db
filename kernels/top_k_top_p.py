"""top-k then top-p thresholds in Triton, one program per row, no sort.

Semantics are exactly those of `graphsafe_sampler/ops/top_k_top_p.py` (read its docstring):
top-k (`top_k` <= 0 or >= V is off) keeps every logit >= the k-th largest, ties kept, and a
row with fewer than k candidates loses nothing; top-p (`top_p` >= 1 is off) works on the
top-k survivors' masses exp(l - l_max) (float32 sums) and keeps every logit >= the largest t
whose kept mass reaches top_p times their total; the row max always survives. The kernel
writes each row's cut to `threshold[row]` (keep `logits >= threshold`, -inf when every filter
is off) and, with APPLY, sets the logits below it to -inf in place. Without APPLY the sampling
kernel takes the threshold and no mask is ever written.

With `min_p` ([num_slots] float32, 0 = off), min_p's cut comes first, folded in rather than
written: `l >= l_max + ln(min_p)` (kernels/min_p.py's formula, from the statistics pass's max;
a row holding NaN gets no min_p cut, as there). top-k then runs on the whole row and the cut
is the larger of the two: when at least k logits pass min_p, the k-th largest of the row is
that of the survivors; when fewer do, it lies below the min_p cut, which then keeps every
survivor, as the -inf k-th value of the masked row does. top-p weighs only the logits at or
above both cuts. The kept set equals min_p's mask followed by top-k/top-p, and the min_p
kernel's read, read and write of the row are saved.

Algorithm: a radix search for the largest threshold whose weight W(t) (count, or mass, of the
logits >= t) reaches the target, on the order-preserving integer image of float32,
    key(x) = (bits ^ 0x7FFFFFFF if bits < 0 else bits) + 2**31   in [0, 2**32), int64,
with -0.0 mapped to +0.0 first so that keys compare exactly as the floats do. A pass reads the
row once and measures W at the 16 thresholds `prefix + c * 2**shift`, c = 0..15, as a
[BLOCK, 16] compare-and-sum (4 bits of the answer per pass); the digit is how many of
c = 1..15 still reach the target. The search starts at the first digit where the smallest
and largest candidate keys differ, and stops early once the answer's mask is decided:
- top-k: when exactly k logits lie at or above the chosen bin's low end, that low end keeps
  exactly the top k (no logit lies between it and the k-th largest);
- top-p: when the chosen bin holds a single logit, that logit is the threshold (W only steps
  at logit values), and the bin's low end keeps the same set.
The mask `logits >= t` is then identical to the one at the exact k-th value; the threshold
written may be that low end rather than a logit.

Passes over each [V] row (reads of the [rows, V] float32 logits; the row is reused, so on a
GPU passes after the first mostly hit L2):
- 1 statistics pass (min and max), when any of min_p, top-k, top-p is on;
- top-k: at most 8 search passes (4 bits each of the 32-bit key), fewer when the candidate
  keys share leading digits or the early stop hits;
- top-p: at most 8 search passes, the first also summing the total mass;
- APPLY: one more read and one write.
Rows whose filters (min_p, top-k, top-p) are all off read their parameters and exit.
Compared with 2 bits per pass (16 passes, 3 sums each: the PyTorch backend's choice, where
every sum is a separate fused loop), 4 bits per pass halves the reads and costs 16 compares
and sums per element, which stays under the memory time on an H100-class GPU.

Exactness: top-k compares integer counts, so its mask is exact. top-p sums float32 masses
(tl.exp may differ from torch's exp in the last bit, and the summation order differs from the
PyTorch backend's), so the two masks can differ only where the mass of some candidate set is
within float32 rounding of top_p * total. The sums are monotone in the threshold (float
addition is monotone), so the digit choice is consistent. NaN logits are neither counted nor
masked (rows holding them are outside these semantics, as in the PyTorch backend).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    """The largest key t with W(t) >= target, W(t) = count (or mass) of logits with key >= t;
    searched from the digits where lo_key and hi_key first differ. See the module docstring."""
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
    return prefix


@triton.jit
def _top_k_top_p_kernel(
    logits_ptr,  # [num_rows, V] float32; updated in place with APPLY
    logits_stride,  # elements between rows
    slots_ptr,  # [num_rows] int64 row -> slot
    top_k_ptr,  # [num_slots] int32; <= 0 or >= V is off
    top_p_ptr,  # [num_slots] float32; >= 1 is off
    min_p_ptr,  # [num_slots] float32; 0 is off (HAS_MIN_P)
    threshold_ptr,  # [num_rows] float32, written: keep logits >= threshold
    vocab_size,
    APPLY: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
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
    if k_on | p_on | (min_p != 0.0):
        row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
        row_max = tl.full((), float("-inf"), tl.float32)
        row_min = tl.full((), float("inf"), tl.float32)
        nan_count = tl.zeros((), tl.int32)
        for start in range(0, vocab_size, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            x = tl.load(row_ptr + cols, mask=cols < vocab_size, other=float("nan"))
            valid = x == x
            row_max = tl.maximum(row_max, tl.max(tl.where(valid, x, float("-inf")), axis=0))
            row_min = tl.minimum(row_min, tl.min(tl.where(valid, x, float("inf")), axis=0))
            nan_count += tl.sum((~valid & (cols < vocab_size)).to(tl.int32), axis=0)
        max_key = _float_to_key(row_max)
        if HAS_MIN_P:  # noqa: SIM102 (a constexpr guard: Triton cannot `and` it with a tensor)
            # min_p's cut, never written: l >= l_max + ln(min_p) (kernels/min_p.py's formula).
            # A row holding NaN has a NaN min_p threshold there, which masks nothing: -inf.
            if (min_p != 0.0) & (nan_count == 0):
                threshold = row_max + tl.log(min_p)
        # top-k on the min_p survivors: the k-th largest of the whole row when at least k
        # logits pass the min_p cut, else below it (the cut then keeps every survivor)
        if k_on:
            key = _largest_key_reaching(
                row_ptr, vocab_size, _float_to_key(row_min), max_key, k, 1.0, 0.0, 0.0,
                MASS=False, BLOCK_SIZE=BLOCK_SIZE,
            )  # fmt: skip
            threshold = tl.maximum(_key_to_float(key), threshold)
        if p_on:
            # an all -inf row would give exp(-inf - -inf) = nan: its masses are 0 instead
            shift = tl.where(row_max > float("-inf"), row_max, 0.0)
            key = _largest_key_reaching(
                row_ptr, vocab_size, _float_to_key(tl.maximum(row_min, threshold)), max_key,
                0, top_p, threshold, shift, MASS=True, BLOCK_SIZE=BLOCK_SIZE,
            )  # fmt: skip
            # never above the row max (top_p = 0), never below the top-k cut
            threshold = tl.maximum(_key_to_float(tl.minimum(key, max_key)), threshold)
        if APPLY:
            for start in range(0, vocab_size, BLOCK_SIZE):
                cols = start + tl.arange(0, BLOCK_SIZE)
                in_row = cols < vocab_size
                x = tl.load(row_ptr + cols, mask=in_row, other=0.0)
                tl.store(row_ptr + cols, tl.where(x < threshold, float("-inf"), x), mask=in_row)
    tl.store(threshold_ptr + row, threshold)


def top_k_top_p_threshold(
    logits: torch.Tensor,  # [num_rows, V] float32; masked in place when apply
    slots: torch.Tensor,  # [num_rows] int64
    top_k: torch.Tensor,  # [num_slots] int32
    top_p: torch.Tensor,  # [num_slots] float32
    threshold: torch.Tensor,  # [num_rows] float32, written
    apply: bool,
    min_p: torch.Tensor | None = None,  # [num_slots] float32: min_p's cut folded in first
    block_size: int = 1024,
) -> None:
    """Launch `_top_k_top_p_kernel` over the rows; allocates nothing, returns None."""
    num_rows, vocab_size = logits.shape
    _top_k_top_p_kernel[(num_rows,)](
        logits,
        logits.stride(0),
        slots,
        top_k,
        top_p,
        min_p if min_p is not None else top_p,  # unread without HAS_MIN_P
        threshold,
        vocab_size,
        APPLY=apply,
        HAS_MIN_P=min_p is not None,
        BLOCK_SIZE=block_size,
    )
