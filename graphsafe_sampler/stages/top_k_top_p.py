"""top-k and top-p filtering (step 8), exact, without sorting the vocabulary.

top-k (`top_k` <= 0 or >= V is off) keeps every token whose logit is >= the k-th largest,
ties included; top-p (`top_p` >= 1 is off), on the top-k survivors renormalised, keeps every
token with probability >= t, t the largest value whose kept tokens hold `top_p` of the mass
(ties kept, the row max always survives). Masked tokens become -inf. The key idea: both are
threshold searches for the largest float32 t whose weight W(t) (count, or mass, of the
tokens >= t) reaches a target, done as a branch-free radix search on float32's
order-preserving integer image, 2 bits a pass, each pass masked sums that torch.compile fuses
into one loop (uncompiled it is about as slow as a full sort: compile it). The semantics in
full, the passes, the alternatives measured and the exactness: docs/kernels.md, top-k/top-p.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables
from graphsafe_sampler.stages.candidates import (
    CANDIDATES,
    Candidates,
    argmax_by_tiles,
    tile_max,
    top_candidates,
)
from graphsafe_sampler.stages.min_p import min_p_threshold

_BITS_PER_PASS = 2
"""Compiled: the 3 thresholds of a pass are masked sums fused into one loop over the row."""
_EAGER_BITS_PER_PASS = 1
"""Eager, where every threshold's masked sum is ops of its own: 32 of them, not 48."""
_INT32_MIN = -(2**31)
# ordered(-inf): bits 0xFF800000 (as int32) ^ 0x7FFFFFFF. Anything below is a negative NaN.
_ORDERED_NEG_INF = -0x00800000 ^ 0x7FFFFFFF


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
    return (offset + _INT32_MIN).clamp(min=_ORDERED_NEG_INF).to(torch.int32)


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
    return _top_p_cut(ordered, row_max, floor, p)


def _top_p_cut(
    ordered: torch.Tensor, row_max: torch.Tensor, floor: torch.Tensor, p: torch.Tensor
) -> torch.Tensor:
    """[num_rows, 1] each: top-p's cut from its answer's image `ordered`: at most the row max
    (top_p = 0 keeps it), at least top-k's cut `floor`, which it is where top-p is off."""
    threshold = torch.maximum(ordered_value(torch.minimum(ordered, ordered_int(row_max))), floor)
    return torch.where(p >= 1.0, floor, threshold)


_RADIX_SORT_MIN = 32768
"""aten's CPU sort takes a radix sort for a 1-D integer tensor of at least this many
elements (its GRAIN_SIZE), where x86 builds have fbgemm's: a row of 151,936 in 1-3 ms
against 10-13 ms for float32's comparison sort. Shorter rows from half of it are padded up
to it, which still beats sorting them as float32 (docs/kernels.md, the PyTorch stage)."""


def descending(values: torch.Tensor) -> torch.Tensor:
    """[num_rows, V] float32 without NaN -> each row's values sorted descending (of equal
    values, +0.0 before -0.0). Sorts float32's ordered image, bit-flipped so that ascending
    is descending: on a CPU row by row where aten radix-sorts it, else all rows at once."""
    num_rows, vocab_size = values.shape
    keys = ~ordered_int(values)  # [num_rows, V] int32, ascending = the floats descending
    if values.device.type != "cpu" or vocab_size < _RADIX_SORT_MIN // 2:
        return ordered_value(~keys.sort(dim=-1).values)
    if vocab_size < _RADIX_SORT_MIN:
        # int32 max sorts last: ~ordered_int gives it only for a negative NaN
        pad = keys.new_full((num_rows, _RADIX_SORT_MIN - vocab_size), torch.iinfo(torch.int32).max)
        keys = torch.cat([keys, pad], dim=1)
    rows = [row.sort(stable=True).values[:vocab_size] for row in keys.unbind(0)]
    return ordered_value(~torch.stack(rows))


class SortedRows(NamedTuple):
    """One sort of each row and what top-k and top-p read from it (`sort_rows`)."""

    values: torch.Tensor  # [num_rows, V] float32 descending, NaN as -inf
    floor: torch.Tensor  # [num_rows, 1] float32 top-k's cut (-inf where off)
    row_max: torch.Tensor  # [num_rows, 1] float32, NaN where the row holds one
    cumulative: torch.Tensor  # [num_rows, V] float32 running mass of the values >= floor

    @property
    def total(self) -> torch.Tensor:
        """[num_rows, 1] float32: the mass of the tokens >= floor (`masked_total`'s terms,
        summed in descending order)."""
        return self.cumulative[:, -1:]


def sort_rows(
    logits: torch.Tensor,  # [num_rows, V] float32
    top_k: torch.Tensor,  # [num_rows] int; <= 0 or >= V is off
    row_max: torch.Tensor | None = None,  # [num_rows, 1]: the candidates' first, if made
) -> SortedRows:
    """Sorts each row once: top-k's cut is its k-th value, and the running mass of the
    values at or above it (exp(value - row max), as top_p_threshold weighs) is top-p's
    weight at each value and, at the end, its total."""
    vocab_size = logits.shape[1]
    # NaN counts nowhere; as -inf it would count at t = -inf alone, where both agree
    clean = logits.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    values = descending(clean)  # [num_rows, V]
    k = top_k.to(torch.int64)[:, None]
    kth = values.gather(1, (k - 1).clamp(0, vocab_size - 1))
    floor = torch.where((k <= 0) | (k >= vocab_size), float("-inf"), kth)
    if row_max is None:
        row_max = logits.amax(-1, keepdim=True)  # top-p as top_p_threshold weighs: NaN stays
    shift = torch.where(torch.isfinite(row_max), row_max, 0.0)
    mass = torch.where(values >= floor, torch.exp(values - shift), 0.0)
    return SortedRows(values, floor, row_max, mass.cumsum(-1))


def sorted_cut(
    logits: torch.Tensor,  # [num_rows, V] float32
    top_k: torch.Tensor,  # [num_rows] int; <= 0 or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; >= 1 is off
    rows: SortedRows | None = None,  # sort_rows(logits, top_k), if made already
) -> torch.Tensor:
    """[num_rows, 1] float32: the searches' top-k then top-p cut from one sort of each row
    (eagerly on a CPU 2-3x faster than their 64 passes, compiled slower): the same, within
    rounding of a mass equal to the target (docs/kernels.md, the PyTorch stage)."""
    rows = sort_rows(logits, top_k) if rows is None else rows
    vocab_size = logits.shape[1]
    p = top_p.to(torch.float32)[:, None]
    target = p * rows.total
    # the cumulative mass never falls: the first entry past the target is in the answer's run
    short = (~(rows.cumulative >= target)).sum(-1, keepdim=True)  # [num_rows, 1]
    reached = ordered_int(rows.values.gather(1, short.clamp(max=vocab_size - 1)))
    # no value reaches the target: -inf; every t does (target <= 0): the largest t
    ordered = torch.where(short >= vocab_size, _ORDERED_NEG_INF, reached)
    ordered = torch.where(target <= 0, torch.iinfo(torch.int32).max, ordered)
    return _top_p_cut(ordered, rows.row_max, rows.floor, p)


def masked_total(
    logits: torch.Tensor,  # [num_rows, V] float32
    floor: torch.Tensor,  # [num_rows, 1] float32: only logits >= floor count
    shift: torch.Tensor,  # [num_rows, 1] float32 finite
) -> torch.Tensor:
    """[num_rows, 1] float32: the sum of exp(logit - shift) over the logits >= floor, one
    pass over the rows: top-p's total mass where the candidates don't hold it."""
    return torch.where(logits >= floor, torch.exp(logits - shift), 0.0).sum(-1, keepdim=True)


RowTotal = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(logits, floor, shift, needed [num_rows, 1] bool) -> [num_rows, 1] `masked_total`, exact
at least on the rows `needed` marks: how `candidate_cut` sums the rows it must."""


def _every_row_total(
    logits: torch.Tensor, floor: torch.Tensor, shift: torch.Tensor, needed: torch.Tensor
) -> torch.Tensor:
    return masked_total(logits, floor, shift)


def _sorted_total(rows: SortedRows) -> RowTotal:
    """A `RowTotal` read off the sort: where a row can be settled (top-k off or within the
    candidates, no NaN), its floor and shift are the candidates', so its total is the same
    terms; the sort makes no second pass over the row."""

    def row_total(
        logits: torch.Tensor, floor: torch.Tensor, shift: torch.Tensor, needed: torch.Tensor
    ) -> torch.Tensor:
        return rows.total

    return row_total


def candidate_cut(
    logits: torch.Tensor,  # [num_rows, V] float32
    top_k: torch.Tensor,  # [num_rows] int; <= 0 or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; >= 1 is off
    candidates: Candidates | None = None,  # top_candidates(logits, min(CANDIDATES, V))
    across: AcrossShards | None = None,  # where `logits` are one shard of the rows
    vocab_size: int | None = None,  # the whole rows' V, with `across`
    row_total: RowTotal = _every_row_total,
) -> tuple[torch.Tensor, torch.Tensor]:
    """([num_rows, 1] float32 cut, [num_rows, 1] bool settled): the top-k then top-p cut
    from the row's CANDIDATES largest logits, exact where `settled`.

    top-k's cut is the k-th candidate (exactly the search's). top-p's weight of a candidate
    value, the mass of the tokens at or above it, is the cumulative sum of the candidates'
    masses in descending order up to the end of its run of equal values; the cut is the
    largest value whose weight reaches top_p of the row's total mass. The total is the
    candidates' own where every token at or above top-k's cut is a candidate (top-k's cut
    above the last candidate, or the row holding fewer finite logits: the same terms, so
    one pass over the row is saved), else summed over the row by `row_total`, which is
    asked only for those rows with top-p on. A row is settled when top-k is off or k <=
    CANDIDATES, and top-p is off or its cut lies strictly above the last candidate (every
    token at or above it is a candidate); never when the row holds NaN (topk ranks NaN
    first; the search leaves it out). With `across`, `logits` are one shard of the rows
    and `candidates` the whole rows' (merged from every shard's): a row's total over the
    shards is summed across them."""
    vocab_size = logits.shape[1] if vocab_size is None else vocab_size
    if candidates is None:
        candidates = top_candidates(logits, min(CANDIDATES, vocab_size))
    values = candidates.values  # [num_rows, n] descending, NaN first
    n = values.shape[1]
    last = values[:, n - 1 :]
    k = top_k.to(torch.int64)[:, None]
    k_off = (k <= 0) | (k >= vocab_size)
    kth = values.gather(1, k.clamp(1, n) - 1)
    floor = torch.where(k_off, float("-inf"), kth)
    row_max = values[:, :1]
    # as top_p_threshold: an all -inf row shifts by 0, so that its masses are 0, not NaN
    shift = torch.where(torch.isfinite(row_max), row_max, 0.0)
    mass = torch.where(values >= floor, torch.exp(values - shift), 0.0)
    p = top_p.to(torch.float32)[:, None]
    p_off = p >= 1.0
    all_in = (floor > last) | (last == float("-inf"))  # every token >= floor a candidate
    streamed = row_total(logits, floor, shift, ~all_in & ~p_off)
    if across is not None:
        streamed = across.sum(streamed)
    total = torch.where(all_in, mass.sum(-1, keepdim=True), streamed)
    # the weight at each candidate: the cumulative mass at the end of its run of ties
    run_end = torch.ones_like(values, dtype=torch.bool)
    run_end[:, :-1] = values[:, :-1] > values[:, 1:]
    ends = torch.where(run_end, mass.cumsum(-1), float("inf"))
    weight = ends.flip(-1).cummin(-1).values.flip(-1)
    reached = (weight < p * total).sum(-1, keepdim=True)  # candidates short of the target
    cut_p = values.gather(1, reached.clamp(max=n - 1))
    cut = torch.where(p_off, floor, torch.maximum(cut_p, floor))
    settled_p = p_off | ((reached < n) & (cut_p > last))
    settled = (k_off | (k <= n)) & settled_p & ~torch.isnan(row_max)
    return cut, settled


def _conditional_row_total(
    logits: torch.Tensor,  # [num_rows, V] float32: before `scale`
    scale: tuple[torch.Tensor, torch.Tensor] | None,
) -> RowTotal:
    """A `RowTotal` of `scaled_logits(logits, *scale)` (of `logits` without `scale`) that
    makes its pass only when some row needs it, in a traced conditional whose operands are
    the raw logits and `scale`: the scaled logits are never written. The rows not needed
    read 0 when no row is; `candidate_cut` never reads them."""

    def row_total(
        filtered: torch.Tensor, floor: torch.Tensor, shift: torch.Tensor, needed: torch.Tensor
    ) -> torch.Tensor:
        def streamed(logits: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            floor, shift, *scaling = rest
            if scaling:
                logits = scaled_logits(logits, *scaling)
            return masked_total(logits, floor, shift)

        def unread(logits: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(rest[0])

        operands = (logits, floor, shift, *(scale or ()))
        return torch.cond(needed.any(), streamed, unread, operands)

    return row_total


def top_k_top_p_cut(
    logits: torch.Tensor,  # [num_rows, V] float32
    top_k: torch.Tensor,  # [num_rows] int; <= 0 or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; >= 1 is off
    conditional: bool | None = None,
    candidates: Candidates | None = None,  # top_candidates of the filtered logits
    scale: tuple[torch.Tensor, torch.Tensor] | None = None,  # (temperature, threshold)
    across: AcrossShards | None = None,  # where `logits` are one shard of the rows
    vocab_size: int | None = None,  # the whole rows' V, with `across`
    sort: bool | None = None,  # None: eagerly on a CPU
) -> torch.Tensor:
    """[num_rows, 1] float32: the top-k then top-p cut (keep `logits >= cut`): the
    candidates' where they settle the row (`candidate_cut`), the exact searches' elsewhere.
    With `scale`, of `scaled_logits(logits, *scale)` rather than of `logits`. With
    `across`, of the whole rows that `logits` are one shard of (`candidates` are then the
    whole rows'), the same cut on every shard.

    Branch-free: both run, and each row takes one. `conditional` (None: under torch.compile
    on a CPU, the only place docs/design.md allows data-dependent control flow) adds a
    traced conditional (`torch.cond`, an op of the graph) that skips the searches when
    every row is settled, and another that skips top-p's pass for its total mass when no
    row with top-p on needs it (`candidate_cut`); the cut is the same. `sort` (None:
    eagerly on a CPU) finds the searched rows' cut by `sorted_cut` instead of the radix
    searches."""
    on_cpu = logits.device.type == "cpu" and across is None
    if conditional is None:
        conditional = on_cpu and torch.compiler.is_compiling()
    if sort is None:
        sort = on_cpu and not torch.compiler.is_compiling()
    # the scaled logits are remade from the operands wherever they are read, never written
    filtered = logits if scale is None else scaled_logits(logits, *scale)
    rows = None
    if sort and not conditional:
        # the candidates rank NaN first: their first is the row max, NaN where a row holds one
        rows = sort_rows(filtered, top_k, None if candidates is None else candidates.values[:, :1])
    row_total: RowTotal = _every_row_total
    if conditional:
        row_total = _conditional_row_total(logits, scale)
    elif rows is not None:
        row_total = _sorted_total(rows)
    cut, settled = candidate_cut(filtered, top_k, top_p, candidates, across, vocab_size, row_total)

    def searched(*ops: torch.Tensor) -> torch.Tensor:
        logits, top_k, top_p, cut, settled, *scaling = ops  # scaling: `scale`, if given
        if scaling:
            logits = scaled_logits(logits, *scaling)
        if sort:
            return torch.where(settled, cut, sorted_cut(logits, top_k, top_p, rows))
        floor = top_k_threshold(logits, top_k, across, vocab_size)
        # split over ranks, the candidates' first is the row max: an exchange saved
        row_max = None if across is None or candidates is None else candidates.values[:, :1]
        exact = top_p_threshold(logits, top_p, floor, across, row_max)
        return torch.where(settled, cut, exact)

    operands = (logits, top_k, top_p, cut, settled, *(scale or ()))
    if conditional:
        # both branches take the same operands; the settled one only copies the cut out
        return torch.cond(settled.all(), lambda *ops: ops[3].clone(), searched, operands)
    return searched(*operands)


def scaled_logits(
    logits: torch.Tensor,  # [num_rows, V] float32
    temperature: torch.Tensor,  # [num_rows] float32 > 0
    threshold: torch.Tensor,  # [num_rows, 1] float32 (-inf: keep all)
) -> torch.Tensor:
    """`logits / temperature` with what falls below `threshold` set to -inf (NaN kept):
    temperature, then min_p's mask, as `filter_scaled` reads them."""
    scaled = logits / temperature[:, None]
    return torch.where(scaled < threshold, float("-inf"), scaled)


def cut_scaled(
    logits: torch.Tensor,  # [num_rows, V] float32
    temperature: torch.Tensor,  # [num_rows] float32 > 0
    threshold: torch.Tensor,  # [num_rows, 1] float32: min_p's (-inf: keep all)
    cut: torch.Tensor,  # [num_rows, 1] float32: top-k/top-p's
) -> torch.Tensor:
    """`scaled_logits` with what falls below `cut` set to -inf too: `filter_scaled`'s
    logits, pointwise in the rows of every operand."""
    scaled = scaled_logits(logits, temperature, threshold)
    return torch.where(scaled < cut, float("-inf"), scaled)


class Filtered(NamedTuple):
    """`filter_top_k_top_p`'s result: logits [num_rows, V] float32, masked; the candidates
    the cut came from (before the mask); covered [num_rows] bool, where every token the row
    keeps is a candidate and its maximum is above -inf (and not NaN): a race among the
    candidates draws the token a race over the row would (`SamplingState.race_covered`);
    greedy [num_rows] int64 (`filter_scaled` only), each row's argmax before the cut;
    remake (`filter_scaled` only): (`cut_scaled`, its operands), which give `logits` again,
    or any rows of it from those rows of the operands: a consumer under torch.compile that
    recomputes them instead spares the step writing `logits` at all."""

    logits: torch.Tensor
    candidates: Candidates
    covered: torch.Tensor
    greedy: torch.Tensor | None = None
    remake: tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]] | None = None


def _covered(candidates: Candidates, cut: torch.Tensor) -> torch.Tensor:
    """[num_rows] bool: every token at or above `cut` [num_rows, 1] is a candidate, and the
    largest is above -inf."""
    last = candidates.values[:, -1:]
    # a token that is no candidate lies at or below `last`: kept only where cut <= last
    covered = ((cut > last) | (last == float("-inf"))) & (candidates.values[:, :1] > float("-inf"))
    return covered[:, 0]


def filter_top_k_top_p(
    logits: torch.Tensor,  # [num_rows, V] float32, updated in place
    top_k: torch.Tensor,  # [num_rows] int; 0, -1 (any <= 0) or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; 1.0 (any >= 1) is off
) -> Filtered:
    """Set the logits that top-k, then top-p, remove to -inf, in place; with the
    candidates and the rows they cover."""
    candidates = top_candidates(logits, min(CANDIDATES, logits.shape[1]))
    cut = top_k_top_p_cut(logits, top_k, top_p, candidates=candidates)
    logits = logits.masked_fill_(logits < cut, float("-inf"))
    return Filtered(logits, candidates, _covered(candidates, cut))


def filter_scaled(
    logits: torch.Tensor,  # [num_rows, V] float32, read only: the logits before temperature
    temperature: torch.Tensor,  # [num_rows] float32 > 0 (1 on greedy rows)
    min_p: torch.Tensor,  # [num_rows] float32 (0 = off)
    top_k: torch.Tensor,  # [num_rows] int; 0, -1 (any <= 0) or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; 1.0 (any >= 1) is off
) -> Filtered:
    """`filter_top_k_top_p` of the logits after temperature and min_p's mask
    (`scaled_logits` with `min_p_threshold` of `logits / temperature`), the same tensors,
    with one [num_rows, V] tensor written (the filtered logits, new) instead of three: the
    scaled logits are a value each pass that reads them computes again, inside the
    conditional too. One pass makes the tile maxima of `logits / temperature`, which give
    min_p's row maximum and, masked at its threshold, the candidates' first level (a tile's
    maximum survives the mask exactly when some token of it does). They also give
    `greedy`, each row's argmax of the scaled logits (on a greedy row, of `logits`:
    temperature 1 changes nothing, and min_p keeps the maximum)."""
    vocab_size = logits.shape[1]
    unmasked_max = tile_max(logits / temperature[:, None])  # [num_rows, tiles]
    threshold = min_p_threshold(unmasked_max, min_p)  # the row max is the tiles' max
    masked_max = torch.where(unmasked_max < threshold, float("-inf"), unmasked_max)
    scaled = scaled_logits(logits, temperature, threshold)
    candidates = top_candidates(scaled, min(CANDIDATES, vocab_size), masked_max)
    cut = top_k_top_p_cut(
        logits, top_k, top_p, candidates=candidates, scale=(temperature, threshold)
    )
    operands = (logits, temperature, threshold, cut)
    greedy = argmax_by_tiles(scaled, masked_max)
    covered = _covered(candidates, cut)
    return Filtered(cut_scaled(*operands), candidates, covered, greedy, (cut_scaled, operands))


def apply_top_k_top_p(
    logits: torch.Tensor,  # [num_rows, V] float32, updated in place
    top_k: torch.Tensor,  # [num_rows] int; 0, -1 (any <= 0) or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; 1.0 (any >= 1) is off
) -> torch.Tensor:
    """Set the logits that top-k, then top-p, remove to -inf, in place; returns `logits`."""
    return filter_top_k_top_p(logits, top_k, top_p).logits


class TopKTopPState(SlotTables):
    """Tables: top_k, staged [num_slots] int32 (0 = off); top_p, staged [num_slots] float32
    (1 = off)."""

    def __init__(self, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.vocab_size = batch_state.config.vocab_size
        self.top_k = self.staged("top_k", (), torch.int32)
        self.top_p = self.staged("top_p", (), torch.float32, fill=1.0)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        # -1 and k >= V are off, as 0 is: one value, so that off rows skip alike
        top_k = params.top_k if 0 < params.top_k < self.vocab_size else 0
        self.top_k.write(slot, top_k)
        self.top_p.write(slot, params.top_p)

    def apply(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, updated in place
        slots: torch.Tensor,  # [num_rows] int64
    ) -> torch.Tensor:
        """`apply_top_k_top_p` with each row's request parameters."""
        return self.filter(logits, slots).logits

    def filter(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, updated in place
        slots: torch.Tensor,  # [num_rows] int64
    ) -> Filtered:
        """`filter_top_k_top_p` with each row's request parameters."""
        return filter_top_k_top_p(logits, self.top_k.device[slots], self.top_p.device[slots])

    def filter_scaled(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, read only
        temperature: torch.Tensor,  # [num_rows] float32 > 0
        min_p: torch.Tensor,  # [num_rows] float32
        slots: torch.Tensor,  # [num_rows] int64
    ) -> Filtered:
        """`filter_scaled` with each row's request parameters."""
        top_k, top_p = self.top_k.device[slots], self.top_p.device[slots]
        return filter_scaled(logits, temperature, min_p, top_k, top_p)
