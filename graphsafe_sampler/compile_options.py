"""The inductor options this library recommends for `torch.compile` of its modules.

On a CPU, inductor's default wrapper is Python: each call of the compiled step runs a few
hundred lines of it (allocations, size asserts, one call a kernel), about 350 us of an 8 x
32,000 step that takes 1.9 ms. `cpp_wrapper` compiles that wrapper to C++: the same kernels,
called from C++, at the cost of a longer first compile (README, "Using the sampler"). On CUDA the
step is replayed from a CUDA graph, where the wrapper never runs: nothing to add.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def compile_options(
    device: torch.device | str,
) -> dict[str, str | int | bool | Callable[..., Any]]:
    """`options=` for `torch.compile(sampler.forward, fullgraph=True, options=...)` on
    `device`: {"cpp_wrapper": True} on a CPU, {} elsewhere."""
    return {"cpp_wrapper": True} if torch.device(device).type == "cpu" else {}
