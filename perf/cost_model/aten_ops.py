"""The aten ops a step runs outside the Triton kernels: a `TorchDispatchMode` that lists each
one with its bytes, and whether a GPU would launch a kernel for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from graphsafe_sampler.testing.launches import launches_kernel

# What launches a kernel: graphsafe_sampler.testing.launches (the launch-count test's rule)
# gathers read as many elements of their source as they write, not the whole source
GATHERS = frozenset({"aten.index", "aten.gather", "aten.index_select"})
# fills write their tensor without reading it
WRITE_ONLY = frozenset({"aten.fill_", "aten.zero_", "aten.ones_like", "aten.zeros_like"})


@dataclass
class AtenOp:
    name: str
    launches: bool
    read_bytes: int
    write_bytes: int
    logits_bytes: int  # of those, on [rows, V] operands


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class AtenCounter(TorchDispatchMode):
    """Lists every op the step dispatches, with its bytes (each operand once; a gather's
    source as many elements as it writes), into `events`. Ops during which a Triton launch
    was recorded (the kernels' torch.library ops) are the kernels themselves, not listed.
    Every op counts as a device op: the step is captured in a CUDA graph, which holds none
    of the host's work (on this CPU build, host and device tensors look alike)."""

    def __init__(
        self, rows: int, vocab: int, events: list[Any], launched: Callable[[], int]
    ) -> None:
        super().__init__()
        self.shape = (rows, vocab)
        self.events = events
        self.launched = launched

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        before = self.launched()
        out = func(*args, **(kwargs or {}))
        if self.launched() == before:
            self.events.append(self.describe(func, args, kwargs or {}, out))
        return out

    def describe(
        self, func: torch._ops.OpOverload, args: Any, kwargs: dict[str, Any], out: Any
    ) -> AtenOp:
        packet = str(func.overloadpacket)
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        launches = launches_kernel(func)
        if not launches:  # without a kernel, no byte moves
            inputs = outputs = []
        elif packet in GATHERS:
            # the source is the first input; the rest are indices
            inputs = inputs[1:] + outputs
        elif packet in WRITE_ONLY:
            inputs = []
        read = sum(t.nbytes for t in inputs)
        written = sum(t.nbytes for t in outputs)
        logits = sum(t.nbytes for t in inputs + outputs if tuple(t.shape) == self.shape)
        return AtenOp(str(func), launches, read, written, logits)
