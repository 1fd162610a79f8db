"""The one state snapshot and the two replayers that `check_graph_safety` and
`perf/gpu_check.py` use to replay a step captured once (docs/design.md §5).

- `StateTensors`: a target's `state_tensors()`, read once: snapshots to restore (a capture
  or a trace runs the step, which advances the state) and the address changes a captured
  graph would never see;
- `MakeFxReplayer`: the CPU analogue of a CUDA graph, a `make_fx` trace taken once;
- `CudaGraphReplayer`: a real `torch.cuda.CUDAGraph`, captured once on static inputs.

A replayer is built from the step `fn`, example inputs and the target's `StateTensors`, and
called with fresh inputs of the same shapes; it returns `fn`'s outputs (same structure,
tensors cloned, so the next replay cannot overwrite them) and leaves the state as the step
left it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch.utils import _pytree as pytree

Step = Callable[..., Any]
"""A step to capture: tensors in (positionally), a pytree of tensors out."""

WARMUP_CALLS = 2
"""Eager calls before a CUDA-graph capture, on a side stream: lazy inits (kernel compiles,
workspaces) and the allocator's pools happen there, never inside the capture."""


class HasStateTensors(Protocol):
    def state_tensors(self) -> Mapping[str, torch.Tensor]: ...


class AddressChanges(NamedTuple):
    """State tensor names new, gone, or at another address (or another tensor object)
    since the `StateTensors` was built."""

    added: list[str]
    gone: list[str]
    reallocated: list[str]

    def names(self) -> list[str]:
        return sorted(self.added + self.gone) + self.reallocated


class StateTensors:
    """A target's state tensors (a Sampler's, a RejectionSampler's, a processor's), read
    once: snapshots, restores and address checks."""

    def __init__(self, target: HasStateTensors) -> None:
        if not hasattr(target, "state_tensors"):  # targets typed Any reach here too
            raise TypeError(f"{type(target).__name__} has no state_tensors() to check")
        self.target = target
        self.tensors: dict[str, torch.Tensor] = dict(target.state_tensors())
        self.ptrs = {name: t.data_ptr() for name, t in self.tensors.items()}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: t.clone() for name, t in self.tensors.items()}

    def restore(self, snap: Mapping[str, torch.Tensor]) -> None:
        """Copy `snap` (a snapshot, or another target's tensors of the same names) in place."""
        for name, t in self.tensors.items():
            t.copy_(snap[name])

    def address_changes(self) -> AddressChanges:
        """What `state_tensors()` says now against construction: a captured graph keeps
        reading the old tensors, so any change breaks it."""
        now = dict(self.target.state_tensors())
        reallocated = [
            name
            for name, t in now.items()
            if name in self.tensors
            and (t is not self.tensors[name] or t.data_ptr() != self.ptrs[name])
        ]
        return AddressChanges(
            added=sorted(now.keys() - self.tensors.keys()),
            gone=sorted(self.tensors.keys() - now.keys()),
            reallocated=reallocated,
        )


def _clone_tensors(out: Any) -> Any:
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


class MakeFxReplayer:
    """`make_fx` traces `fn` once: module tensors are kept by reference and Python branches
    baked in, as a CUDA graph does; each call runs the trace on clones of its inputs."""

    kind = "make_fx"

    def __init__(self, fn: Step, example: Sequence[torch.Tensor], state: StateTensors) -> None:
        from torch.fx.experimental.proxy_tensor import make_fx

        snap = state.snapshot()
        self.traced = make_fx(fn)(*(t.clone() for t in example))
        state.restore(snap)  # tracing ran the step for real

    def __call__(self, *inputs: torch.Tensor) -> Any:
        return self.traced(*(t.clone() for t in inputs))


class CudaGraphReplayer:
    """`fn` captured once in a real `torch.cuda.CUDAGraph` on static copies of `example`
    (after WARMUP_CALLS calls on a side stream); each call copies its inputs into the static
    ones in place, replays, and returns clones of the outputs."""

    kind = "cuda-graph"

    def __init__(self, fn: Step, example: Sequence[torch.Tensor], state: StateTensors) -> None:
        self.inputs = tuple(t.clone() for t in example)
        snap = state.snapshot()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_CALLS):
                fn(*self.inputs)
                state.restore(snap)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn(*self.inputs)
        state.restore(snap)  # a capture runs nothing, but be sure the state starts level
        torch.cuda.synchronize()

    def __call__(self, *inputs: torch.Tensor) -> Any:
        for static, new in zip(self.inputs, inputs, strict=True):
            static.copy_(new)
        self.graph.replay()
        return _clone_tensors(self.outputs)
