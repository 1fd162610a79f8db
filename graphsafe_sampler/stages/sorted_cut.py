"""top-k's and top-p's exact cuts from one sort of each row: the method eagerly on a CPU,
where the threshold searches' masked sums (`threshold_search.py`) are each ops of their
own. The sort is of float32's integer image, which aten radix-sorts. The same cut as the
searches, within rounding of a mass equal to the target: docs/kernels.md, the PyTorch stage.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from graphsafe_sampler.stages.threshold_search import (
    ORDERED_NEG_INF,
    ordered_int,
    ordered_value,
    top_p_cut,
)

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
    if values.device.type != "cpu" or vocab_size < _RADIX_SORT_MIN // 2 or num_rows == 0:
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
    (eagerly on a CPU several times faster than their 64 passes, compiled slower): the
    same, within rounding of a mass equal to the target (docs/kernels.md, the PyTorch
    stage)."""
    rows = sort_rows(logits, top_k) if rows is None else rows
    vocab_size = logits.shape[1]
    p = top_p.to(torch.float32)[:, None]
    target = p * rows.total
    # the cumulative mass never falls: the first entry past the target is in the answer's run
    short = (~(rows.cumulative >= target)).sum(-1, keepdim=True)  # [num_rows, 1]
    reached = ordered_int(rows.values.gather(1, short.clamp(max=vocab_size - 1)))
    # no value reaches the target: -inf; every t does (target <= 0): the largest t
    ordered = torch.where(short >= vocab_size, ORDERED_NEG_INF, reached)
    ordered = torch.where(target <= 0, torch.iinfo(torch.int32).max, ordered)
    return top_p_cut(ordered, rows.row_max, rows.floor, p)
