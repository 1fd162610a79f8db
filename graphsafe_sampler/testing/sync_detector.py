"""`SyncOpDetector`: a TorchDispatchMode that fails on ops that sync with the host or give
data-dependent shapes (DESIGN §5, rule 1).

On a CPU-only machine no device-to-host copy is visible, so the detector flags the ops
themselves: whatever would sync or allocate by value on a GPU is flagged on the CPU too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class GraphSafetyError(AssertionError):
    """A graph-safety check failed; the message says which rule and where."""


def _packets(*names: str) -> set[Any]:
    return {getattr(aten, name) for name in names if hasattr(aten, name)}


# Overload packets whose every overload reads device values on the host or returns a shape
# that depends on values.
SYNC_OP_PACKETS: frozenset[Any] = frozenset(
    _packets(
        "_local_scalar_dense",  # .item(), int(t), bool(t), Python branches on tensors
        "item",
        "is_nonzero",
        "equal",
        "nonzero",
        "nonzero_static",  # fine on GPU, but nothing here needs it; keep the rule simple
        "argwhere",
        "masked_select",
        "unique_dim",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim_consecutive",
        "multinomial",
        "bincount",
        "repeat_interleave",
        "_assert_async",
        "_assert_scalar",
        "allclose",
    )
)

# Ops that only sync when an index is a bool/byte mask (boolean-mask indexing).
_MASK_INDEXED = frozenset(_packets("index", "index_put", "index_put_", "_index_put_impl_"))


def _has_mask_index(args: tuple[Any, ...]) -> bool:
    if len(args) < 2:
        return False
    indices = args[1]
    if not isinstance(indices, (list, tuple)):
        return False
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


def _is_device_to_host(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if func.overloadpacket not in (aten._to_copy, aten.copy_):
        return False
    if func.overloadpacket is aten._to_copy:
        src, dst_device = args[0], kwargs.get("device")
        return (
            isinstance(src, torch.Tensor)
            and src.device.type != "cpu"
            and dst_device is not None
            and torch.device(dst_device).type == "cpu"
        )
    dst, src = args[0], args[1]
    return (
        isinstance(src, torch.Tensor)
        and src.device.type != "cpu"
        and isinstance(dst, torch.Tensor)
        and dst.device.type == "cpu"
    )


class SyncOpDetector(TorchDispatchMode):
    """Raises GraphSafetyError at the first op that would sync or give a data-dependent shape.

    Use as a context manager around the code under test (eager mode).
    """

    def __init__(self, where: str = "forward") -> None:
        super().__init__()
        self.where = where

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        packet = func.overloadpacket
        reason = None
        if packet in SYNC_OP_PACKETS:
            reason = "reads device values on the host or has a data-dependent shape"
        elif packet in _MASK_INDEXED and _has_mask_index(args):
            reason = "indexes with a boolean mask (data-dependent shape)"
        elif _is_device_to_host(func, args, kwargs):
            reason = "copies device memory to the host"
        if reason is not None:
            raise GraphSafetyError(f"{self.where}: {func} {reason}")
        return func(*args, **kwargs)


def assert_no_sync(fn: Callable[..., Any], *args: Any, where: str = "forward") -> Any:
    """Run `fn(*args)` eagerly under SyncOpDetector and return its result."""
    with SyncOpDetector(where):
        return fn(*args)
