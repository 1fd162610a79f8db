"""A row's slot parameters resolved once a step, for the kernels that read them by row.

The key idea: a kernel that finds a parameter through the row's slot loads the slot, then
the parameter, and waits a memory latency for each (a warp issues in order). The step's
first kernel loads its slot's parameters anyway; where it also writes those of the kernels
after it into two small per-row records, each of those loads them with its first loads,
one round of dependent loads sooner. Processing resolves them on the Sampler's fused path
(`load_slot_params`, `store_row_params`); stage 1 of top-k/top-p writes the filters itself
where nothing did, for its cut kernel. docs/kernels.md, the rounds of dependent loads.

The records: `filters` [num_rows, FILTERS] float32, (k, top_p, min_p, temperature), k 0
where top-k is off (k <= 0 or k >= V); `keys` [num_rows, KEYS] int64, (seed, position), the
position prompt_len + num_generated of the slot, the token the row samples.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .library import check_rows, check_table, together

FILTERS = tl.constexpr(4)
"""Columns of a row's filters record: k (float32, exact: k < V < 2**24), top_p, min_p,
temperature."""

KEYS = tl.constexpr(2)
"""Columns of a row's keys record: the seed and the position its race draws with."""


def check_positions(
    positions: torch.Tensor | None,  # [num_rows] int64: each row's position, or None
    prompt_len: torch.Tensor | None,  # [num_slots] int64, without positions
    num_generated: torch.Tensor | None,  # [num_slots] int32, without positions
    num_rows: int,
) -> None:
    """A sampling launch's positions: given by row, or the slot's prompt_len +
    num_generated (as the keys record holds them), never both."""
    if positions is not None:
        check_rows("positions", positions, torch.int64, num_rows)
        if prompt_len is not None or num_generated is not None:
            raise ValueError("positions, or prompt_len with num_generated: not both")
    elif prompt_len is None or num_generated is None:
        raise ValueError("without positions, prompt_len and num_generated are needed")
    else:
        if prompt_len.dtype != torch.int64 or num_generated.dtype != torch.int32:
            raise TypeError(
                f"prompt_len must be int64 and num_generated int32, got {prompt_len.dtype} "
                f"and {num_generated.dtype}"
            )
        if prompt_len.shape != num_generated.shape or prompt_len.dim() != 1:
            raise ValueError("prompt_len and num_generated must be [num_slots] vectors")


def check_row_params(
    top_k: torch.Tensor | None,  # [num_slots] int32
    top_p: torch.Tensor | None,  # [num_slots] float32
    min_p: torch.Tensor | None,  # [num_slots] float32
    seeds: torch.Tensor | None,  # [num_slots] int64
    prompt_len: torch.Tensor | None,  # [num_slots] int64
    filters: torch.Tensor | None,  # [num_rows, FILTERS] float32, written
    keys: torch.Tensor | None,  # [num_rows, KEYS] int64, written
    num_slots: int,
    num_rows: int,
) -> tuple[torch.Tensor, ...] | None:
    """The slot tables processing resolves and the records it writes, all seven or none
    -> the tuple."""
    names = ("top_k", "top_p", "min_p", "seeds", "prompt_len", "filters", "keys")
    tables = together(", ".join(names), top_k, top_p, min_p, seeds, prompt_len, filters, keys)
    if tables is not None:
        for name, table, dtype, shape in zip(
            names, tables,
            (torch.int32, torch.float32, torch.float32, torch.int64, torch.int64, torch.float32,
             torch.int64),
            ((num_slots,),) * 5 + ((num_rows, FILTERS.value), (num_rows, KEYS.value)),
            strict=True,
        ):  # fmt: skip
            check_table(name, table, dtype, shape)
    return tables


@triton.jit
def top_k_on(k, vocab_size):
    """A slot's top_k as the kernels take it: 0 where off (k <= 0 or k >= V)."""
    return tl.where((k > 0) & (k < vocab_size), k, 0)


@triton.jit
def store_filters(filters_ptr, row, k, top_p, min_p, mask=None):
    """The row's k, top_p and min_p into its filters record (its temperature left), where
    `mask` (a scalar; None: always)."""
    at = filters_ptr + row.to(tl.int64) * FILTERS
    tl.store(at + 0, k.to(tl.float32), mask=mask)
    tl.store(at + 1, top_p, mask=mask)
    tl.store(at + 2, min_p, mask=mask)


@triton.jit
def load_slot_params(slot, top_k_ptr, top_p_ptr, min_p_ptr, seeds_ptr, prompt_len_ptr, vocab_size):
    """The slot's (k, top_p, min_p, seed, prompt_len) for `store_row_params`: loaded with
    the caller's other parameters, in their round (stored at once, they held the loads
    after them a round)."""
    k = top_k_on(tl.load(top_k_ptr + slot), vocab_size)
    top_p = tl.load(top_p_ptr + slot)
    min_p = tl.load(min_p_ptr + slot)
    return k, top_p, min_p, tl.load(seeds_ptr + slot), tl.load(prompt_len_ptr + slot)


@triton.jit
def store_row_params(filters_ptr, keys_ptr, row, params, temperature, generated, mask):
    """Both records of the row, where `mask` (a scalar: the row's first program):
    `load_slot_params`' params with the slot's temperature and num_generated the caller
    loaded. Masked, not branched on: in a branch the compiler moved the loads into it,
    after the caller's later loads had waited for theirs (a round more)."""
    k, top_p, min_p, seed, prompt_len = params
    store_filters(filters_ptr, row, k, top_p, min_p, mask)
    tl.store(filters_ptr + row.to(tl.int64) * FILTERS + 3, temperature, mask=mask)
    at = keys_ptr + row.to(tl.int64) * KEYS
    tl.store(at + 0, seed, mask=mask)
    tl.store(at + 1, prompt_len + generated, mask=mask)


@triton.jit
def load_filters(filters_ptr, row, HAS_MIN_P: tl.constexpr):
    """The row's (k, top_p, min_p) from its filters record, min_p 0 without HAS_MIN_P."""
    at = filters_ptr + row.to(tl.int64) * FILTERS
    k = tl.load(at + 0).to(tl.int32)
    top_p = tl.load(at + 1)
    min_p = tl.zeros((), tl.float32)
    if HAS_MIN_P:
        min_p = tl.load(at + 2)
    return k, top_p, min_p


@triton.jit
def load_keys(filters_ptr, keys_ptr, row):
    """The row's (temperature, seed, position) from its records."""
    temperature = tl.load(filters_ptr + row.to(tl.int64) * FILTERS + 3)
    at = keys_ptr + row.to(tl.int64) * KEYS
    return temperature, tl.load(at + 0), tl.load(at + 1)
