"""top-k's and top-p's exact cuts as threshold searches, without sorting the vocabulary.

Both are searches for the largest float32 t whose weight W(t) (the count, or the mass, of
the tokens >= t) reaches a target, done as a branch-free radix search on float32's
order-preserving integer image (`ordered_int`), 2 bits a pass, each pass masked sums that
torch.compile fuses into one loop (uncompiled it is about as slow as a full sort: eagerly
on a CPU `sorted_cut.py` sorts instead). Split over ranks, each pass is a histogram and one
collective (`AcrossShards`). The stage that takes these cuts: `top_k_top_p.py`; the
passes, the alternatives measured and the exactness: docs/kernels.md, top-k/top-p.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

_BITS_PER_PASS = 2
"""Compiled: the 3 thresholds of a pass are masked sums fused into one loop over the row."""
_EAGER_BITS_PER_PASS = 1
"""Eager, where every threshold's masked sum is ops of its own: 32 of them, not 48."""
_INT32_MIN = -(2**31)
# ordered(-inf): bits 0xFF800000 (as int32) ^ 0x7FFFFFFF. Anything below is a negative NaN.
ORDERED_NEG_INF = -0x00800000 ^ 0x7FFFFFFF


class AcrossShards(Protocol):
    """How row statistics of one vocabulary shard become the whole row's, where the logits
    of a row are split over ranks (`graphsafe_sampler.distributed`): each method takes this
    rank's [num_rows, m] values and returns the rows' totals over every shard, the same on
    every rank. None (the default everywhere here) means the logits hold the whole row."""

    def sum(self, values: torch.Tensor) -> torch.Tensor: ...

    def max(self, values: torch.Tensor) -> torch.Tensor: ...


_SHARDED_BITS_PER_PASS = 4
"""Split over ranks, where every pass is a collective: 8 passes of 15 sums, not 16 of 3
(`_largest_threshold_across`)."""


def ordered_int(values: torch.Tensor) -> torch.Tensor:
    """float32 -> int32 with the same order (its own inverse: see `ordered_value`).

    `ordered = bits if bits >= 0 else bits ^ 0x7FFFFFFF`: a < b as floats exactly when
    ordered(a) < ordered(b) as int32 (-0.0 sits just below +0.0).
    """
    return _flip_negatives(values.contiguous().view(torch.int32))


def ordered_value(ordered: torch.Tensor) -> torch.Tensor:
    """int32 from `ordered_int` -> the float32 it came from."""
    return _flip_negatives(ordered).view(torch.float32)


def _flip_negatives(bits: torch.Tensor) -> torch.Tensor:
    # bits ^ 0x7FFFFFFF where negative: the arithmetic shift gives each sign its mask, so
    # eagerly on a CPU this is ~8x faster than a where() (50 against 395 µs at 151,936)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _largest_threshold(
    weight_at_or_above: Callable[[torch.Tensor], torch.Tensor],
    target: torch.Tensor,  # [num_rows, 1]
    num_rows: int,
    device: torch.device,
) -> torch.Tensor:
    """[num_rows, 1] int32: ordered image of the largest t with weight_at_or_above(t) >= target.

    weight_at_or_above(t [num_rows, 1] float32) -> [num_rows, 1] must not shrink as t falls.
    Where no t reaches the target, the answer is -inf's image (keep everything).

    A radix search, `_BITS_PER_PASS` bits a pass from the top (`_EAGER_BITS_PER_PASS`
    uncompiled): a pass measures the weight at the 3 smallest thresholds whose next digit is
    1, 2, 3 (3 masked sums fused into one loop, comparing as floats against candidates made
    on [num_rows, 1] tensors, so no token is bit-cast); the digit is how many of them still
    reach the target. The answer is the same for any digit width. Branch-free: every row
    pays the same work whether its filters are on or off.
    """
    bits = _BITS_PER_PASS if torch.compiler.is_compiling() else _EAGER_BITS_PER_PASS
    # The answer + 2**31, in [0, 2**32), built from the top digit down; int64 so that the
    # arithmetic never wraps and each candidate converts to int32 exactly.
    offset = torch.zeros(num_rows, 1, dtype=torch.int64, device=device)
    for shift in range(32 - bits, -1, -bits):
        digit = torch.zeros(num_rows, 1, dtype=torch.int64, device=device)
        for candidate_digit in range(1, 1 << bits):
            # The smallest threshold with this next digit: if it reaches the target, the
            # answer's digit is at least `candidate_digit`.
            candidate = _offset_to_ordered(offset + (candidate_digit << shift))
            digit += weight_at_or_above(ordered_value(candidate)) >= target
        offset = offset + (digit << shift)
    return _offset_to_ordered(offset)


def _largest_threshold_across(
    values: torch.Tensor,  # [num_rows, V] float32: one shard of the rows
    weights: torch.Tensor | None,  # [num_rows, V] float32 each token's weight (None: 1)
    target: torch.Tensor,  # [num_rows, 1]
    across: AcrossShards,
) -> torch.Tensor:
    """`_largest_threshold` of the whole rows that `values` are one shard of, where a
    token's weight counts at every threshold at or below its value (NaN never counts).

    Each pass is one `across.sum` of the weights at the `_SHARDED_BITS_PER_PASS` bits'
    15 thresholds, and each shard finds its own from a histogram: every token's
    order-preserving key (-0.0 read as +0.0, as a float compare reads it) falls below the
    pass's range, in one of its 16 digits, or above it; the weight at a digit's threshold
    is the sum of the digits from it up and of the tokens above. One pass over the shard a
    pass, not 15 masked sums; the same answer.
    """
    bits = _SHARDED_BITS_PER_PASS
    digits = 1 << bits
    num_rows = values.shape[0]
    key = ordered_int(values + 0.0).to(torch.int64) - _INT32_MIN  # [num_rows, V] in [0, 2**32)
    counts = values == values  # NaN counts nowhere
    token_weight = counts.to(torch.int32) if weights is None else torch.where(counts, weights, 0.0)
    offset = torch.zeros(num_rows, 1, dtype=torch.int64, device=values.device)
    for shift in range(32 - bits, -1, -bits):
        # column 0: below the range (dropped), 1 + d: digit d, digits + 1: above the range
        column = ((key - offset) >> shift).clamp(-1, digits) + 1
        histogram = torch.zeros(
            num_rows, digits + 2, dtype=token_weight.dtype, device=values.device
        ).scatter_add_(1, column, token_weight)
        from_top = histogram.flip(-1).cumsum(-1).flip(-1)  # [num_rows, digits + 2]
        at_or_above = from_top[:, 2 : digits + 1]  # the thresholds of digits 1 .. digits - 1
        digit = (across.sum(at_or_above) >= target).sum(-1, keepdim=True)
        offset = offset + (digit << shift)
    return _offset_to_ordered(offset)


def _offset_to_ordered(offset: torch.Tensor) -> torch.Tensor:
    """int64 in [0, 2**32) -> int32 ordered image, negative NaNs clamped to -inf.

    Thresholds above +inf are NaN bit patterns, left as they are: they compare false, so
    nothing reaches them (no token is above +inf). Thresholds below -inf become -inf.
    """
    # Inlined into every one of the 33 loops, 3 times each: inductor's codegen time grows with
    # those ops (a 14-op version of this conversion took 44 s to compile instead of 33 s).
    return (offset + _INT32_MIN).clamp(min=ORDERED_NEG_INF).to(torch.int32)


def top_k_threshold(
    logits: torch.Tensor,  # [num_rows, V] float32
    top_k: torch.Tensor,  # [num_rows] int; <= 0 or >= V is off
    across: AcrossShards | None = None,  # where `logits` are one shard of the rows
    vocab_size: int | None = None,  # the whole rows' V, with `across`
) -> torch.Tensor:
    """[num_rows, 1] float32: the k-th largest logit (-inf where top-k is off).

    top-k keeps `logits >= threshold`.
    """
    num_rows = logits.shape[0]
    vocab_size = logits.shape[1] if vocab_size is None else vocab_size
    k = top_k.to(torch.int64)[:, None]
    is_off = (k <= 0) | (k >= vocab_size)

    def count_at_or_above(threshold: torch.Tensor) -> torch.Tensor:
        return (logits >= threshold).sum(-1, keepdim=True, dtype=torch.int32)

    if across is None:
        ordered = _largest_threshold(count_at_or_above, k, num_rows, logits.device)
    else:
        ordered = _largest_threshold_across(logits, None, k, across)
    return torch.where(is_off, float("-inf"), ordered_value(ordered))


def top_p_threshold(
    logits: torch.Tensor,  # [num_rows, V] float32
    top_p: torch.Tensor,  # [num_rows] float32; >= 1 is off
    floor: torch.Tensor | None = None,  # [num_rows, 1] float32: only logits >= floor count
    across: AcrossShards | None = None,  # where `logits` are one shard of the rows
    row_max: torch.Tensor | None = None,  # [num_rows, 1]: the rows' max, where known
) -> torch.Tensor:
    """[num_rows, 1] float32: top-p over the tokens with logits >= floor (all when None).

    top-p keeps `logits >= threshold`; the threshold is >= floor, never above the row max,
    and equals floor (or -inf) where top-p is off.
    """
    num_rows = logits.shape[0]
    if floor is None:
        floor = torch.full((num_rows, 1), float("-inf"), device=logits.device, dtype=logits.dtype)
    if row_max is None:
        row_max = logits.amax(-1, keepdim=True)
        if across is not None:
            row_max = across.max(row_max)
    # An all -inf row would give exp(-inf - -inf) = nan; its masses are all 0 instead.
    shift = torch.where(torch.isfinite(row_max), row_max, 0.0)
    mass = torch.where(logits >= floor, torch.exp(logits - shift), 0.0)
    total = mass.sum(-1, keepdim=True)
    if across is not None:
        total = across.sum(total)
    p = top_p.to(torch.float32)[:, None]

    def mass_at_or_above(threshold: torch.Tensor) -> torch.Tensor:
        return torch.where(logits >= threshold, mass, 0.0).sum(-1, keepdim=True)

    if across is None:
        ordered = _largest_threshold(mass_at_or_above, p * total, num_rows, logits.device)
    else:
        ordered = _largest_threshold_across(logits, mass, p * total, across)
    return top_p_cut(ordered, row_max, floor, p)


def top_p_cut(
    ordered: torch.Tensor, row_max: torch.Tensor, floor: torch.Tensor, p: torch.Tensor
) -> torch.Tensor:
    """[num_rows, 1] each: top-p's cut from its answer's image `ordered`: at most the row max
    (top_p = 0 keeps it), at least top-k's cut `floor`, which it is where top-p is off."""
    threshold = torch.maximum(ordered_value(torch.minimum(ordered, ordered_int(row_max))), floor)
    return torch.where(p >= 1.0, floor, threshold)
