"""`SyncOpDetector`: a TorchDispatchMode that fails on ops that sync with the host or give
data-dependent shapes (DESIGN §5, rule 1).

On a CPU-only machine no device-to-host copy is visible, so the detector flags the ops
themselves: whatever would sync or allocate by value on a GPU is flagged on the CPU too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
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


# Tensor methods that read values on the host without reaching the dispatcher when the
# tensor is already on the CPU; forbidden in forward all the same.
_HOST_READS = frozenset(
    {
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.__array__,
        torch.Tensor.cpu,
        torch.Tensor.item,
    }
)


class _HostReadDetector(TorchFunctionMode):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in _HOST_READS:
            raise GraphSafetyError(f"{self.where}: Tensor.{func.__name__}() reads on the host")
        return func(*args, **(kwargs or {}))


class SyncOpDetector(TorchDispatchMode):
    """Raises GraphSafetyError at the first op that would sync or give a data-dependent shape,
    and at host reads (`.tolist()`, `.numpy()`, `.cpu()`, `.item()`) even of CPU tensors.

    Use as a context manager around the code under test (eager mode).
    """

    def __init__(self, where: str = "forward") -> None:
        super().__init__()
        self.where = where
        self._host_reads = _HostReadDetector(where)

    def __enter__(self) -> SyncOpDetector:
        self._host_reads.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._host_reads.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._host_reads.__exit__(*exc)

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
