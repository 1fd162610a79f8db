"""min_p in Triton: logits below `max_logit + ln(min_p)` become -inf, one program per row.

Two passes over the row (max, then mask-and-store), each in BLOCK_SIZE tiles; a row whose
min_p is 0 exits after reading its parameter (a device-side branch: fine inside a graph).
Reads the row twice, writes it at most once, in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dependent_launch import await_prior_grids, pdl_launch
from .library import check_logits, inplace_op


@triton.jit
def _min_p_kernel(
    logits_ptr,  # [num_rows, V] float32, updated in place
    logits_stride,  # elements between rows (int64 offsets below)
    slots_ptr,  # [num_rows] int64 row -> slot
    min_p_ptr,  # [num_slots] float32
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    await_prior_grids(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    min_p = tl.load(min_p_ptr + slot)
    if min_p == 0.0:
        return
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    row_max = tl.full((), float("-inf"), tl.float32)
    nan_count = tl.zeros((), tl.int32)
    for start in range(0, vocab_size, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(row_ptr + cols, mask=cols < vocab_size, other=float("-inf"))
        row_max = tl.maximum(row_max, tl.max(x, axis=0))
        nan_count += tl.sum((x != x).to(tl.int32), axis=0)
    # torch.amax propagates NaN and tl.max drops it: a NaN row gets a NaN threshold, which
    # masks nothing, on both backends.
    row_max = tl.where(nan_count > 0, float("nan"), row_max)
    threshold = row_max + tl.log(min_p)
    for start in range(0, vocab_size, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        in_row = cols < vocab_size
        x = tl.load(row_ptr + cols, mask=in_row, other=0.0)
        tl.store(row_ptr + cols, tl.where(x < threshold, float("-inf"), x), mask=in_row)


def launch_min_p(
    logits: torch.Tensor,  # [num_rows, V] float32, updated in place
    slots: torch.Tensor,  # [num_rows] int64
    min_p: torch.Tensor,  # [num_slots] float32
    block_size: int = 1024,
) -> None:
    """Launch `_min_p_kernel` over the rows; allocates nothing, returns None."""
    num_rows, vocab_size = logits.shape
    _min_p_kernel[(num_rows,)](
        logits,
        logits.stride(0),
        slots,
        min_p,
        vocab_size,
        BLOCK_SIZE=block_size,
        **pdl_launch(logits.device),
    )


@inplace_op("apply_min_p", mutates_args=("logits",))
def apply_min_p(logits: torch.Tensor, slots: torch.Tensor, min_p: torch.Tensor) -> None:
    """logits [num_rows, V] float32 (in place); slots [num_rows] int64; min_p [num_slots]
    float32. Tokens below max_logit + ln(min_p) become -inf."""
    check_logits(logits)
    launch_min_p(logits, slots, min_p)
