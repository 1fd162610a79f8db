"""`SyncOpDetector`: a TorchDispatchMode that fails on ops that sync with the host or give
data-dependent shapes (docs/design.md §5, rule 1).

On a CPU-only machine no device-to-host copy is visible, so the detector flags the ops
themselves: whatever would sync or allocate by value on a GPU is flagged on the CPU too.
That covers explicit device moves (`.to(device)`, `.cpu()`, `.cuda()`, a `copy_` across
devices, `torch.tensor(data, device=...)`): on a CPU every tensor is already on the CPU,
while on a GPU the same line is a device-to-host or a pageable host-to-device copy.

The limit: ops are known by name. An op whose CUDA kernel syncs inside (`torch.histc`
reads its range on the host when min == max) is caught only if it is listed below;
whatever is not listed passes here, and only a GPU run catches it:
`check_graph_safety` on a CUDA target runs every eager step under
`torch.cuda.set_sync_debug_mode("error")` and captures a real CUDA graph.
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
        # CUDA kernels that read a value on the host: histc its range (min == max), histogram
        # and its bin edges their range, the linalg error checks their info codes
        "histc",
        "histogram",
        "histogramdd",
        "_histogramdd_bin_edges",
        "_linalg_check_errors",
        "_coalesce",
        "_to_sparse",
        "to_sparse",
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


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _is_cross_device_copy(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A copy between devices: device-to-host, or host-to-device from pageable memory."""
    if func.overloadpacket is aten._to_copy:
        src, dst_device = args[0], kwargs.get("device")
        return (
            isinstance(src, torch.Tensor)
            and dst_device is not None
            and not _same_device(src.device, torch.device(dst_device))
        )
    if func.overloadpacket is aten.copy_:
        dst, src = args[0], args[1]
        return (
            isinstance(src, torch.Tensor)
            and isinstance(dst, torch.Tensor)
            and not _same_device(src.device, dst.device)
        )
    return False


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


# Factories that copy host data: with a device named, a host-to-device copy.
_HOST_DATA_FACTORIES = frozenset({torch.tensor, torch.as_tensor})


def _named_device(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The device `Tensor.to` / `.cuda` / a host-data factory is asked to move to, or None."""
    if func is torch.Tensor.to:
        to_kwargs = {k: v for k, v in kwargs.items() if k != "copy"}
        device, _dtype, _non_blocking, _format = torch._C._nn._parse_to(*args[1:], **to_kwargs)
        return device
    if func is torch.Tensor.cuda:
        return torch.device("cuda")
    if func in _HOST_DATA_FACTORIES:
        return kwargs.get("device")
    return None


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
        kwargs = kwargs or {}
        if func in _HOST_READS:
            raise GraphSafetyError(f"{self.where}: Tensor.{func.__name__}() reads on the host")
        device = _named_device(func, args, kwargs)
        if device is not None:
            # Flagged even when it names the tensor's own device: on the CPU this check runs
            # on, every device is the host, and on a GPU the same line is a copy between
            # host and device (state belongs on the device, moved in update_state).
            raise GraphSafetyError(
                f"{self.where}: {getattr(func, '__name__', func)}(device={device}) moves data "
                "between devices inside the step"
            )
        return func(*args, **kwargs)


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
        elif _is_cross_device_copy(func, args, kwargs):
            reason = "copies memory between devices"
        if reason is not None:
            raise GraphSafetyError(f"{self.where}: {func} {reason}")
        return func(*args, **kwargs)


def assert_no_sync(fn: Callable[..., Any], *args: Any, where: str = "forward") -> Any:
    """Run `fn(*args)` eagerly under SyncOpDetector and return its result."""
    with SyncOpDetector(where):
        return fn(*args)
