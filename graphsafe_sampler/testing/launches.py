"""Which ops of a traced step launch a GPU kernel: the measure behind "a handful of
launches per step" (docs/kernels.md, the Triton step), and the cost model's classifier.

A trace (`make_fx`) of the step holds one node per op it dispatches. Views and aliases
(`OpOverload.is_view`, new metadata over the same storage), allocations (the caching
allocator hands out memory without a kernel; `_unsafe_view` is a view its schema does not
mark) and metadata queries launch nothing; every other op, the kernels' `torch.library` ops
included, launches one kernel, as eager CUDA does (a fill, a copy, an elementwise or
indexing kernel, a Triton program).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

NO_KERNEL = frozenset(
    {
        "aten.empty",
        "aten.empty_like",
        "aten.empty_strided",
        "aten.new_empty",
        "aten.new_empty_strided",
        "aten._unsafe_view",
        "aten.lift_fresh",
        "aten.resize_",
        "aten.sym_size",
        "aten.sym_stride",
        "aten.sym_numel",
        "aten.sym_storage_offset",
        "aten.is_contiguous",
    }
)


def launches_kernel(func: torch._ops.OpOverload) -> bool:
    """Whether `func` launches a kernel on a GPU (module docstring)."""
    return not func.is_view and str(func.overloadpacket) not in NO_KERNEL


def kernel_launches(fn: Callable[..., Any], *args: torch.Tensor) -> list[str]:
    """The ops of one call of `fn(*args)` that launch a kernel, in order (a `make_fx` trace:
    the call runs once)."""
    graph = make_fx(fn)(*args).graph
    return [
        str(node.target)
        for node in graph.nodes
        if node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and launches_kernel(node.target)
    ]
