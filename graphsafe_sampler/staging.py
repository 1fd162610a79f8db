"""`StagedTensor`: a fixed-capacity device tensor fed from the host without syncs.

Layout: an authoritative host copy (`host`, a plain CPU tensor the host writes freely), a
ring of pinned staging buffers, and the device tensor (`device`) whose address never changes.
`flush()` sends the rows written since the last flush:

- the changed rows are gathered from `host` into the next pinned buffer of the ring, and
  copied to the device with `non_blocking=True`; when only some rows changed, rows and their
  indices travel packed and one `index_copy_` scatters them (no host sync, one launch);
- each pinned buffer carries the CUDA event of its last copy: before the host fills it again
  it waits on that event, so a host write never touches pinned memory that an enqueued copy
  still reads. With a ring of 2, the host runs one step ahead of the device at no cost.

The ring's buffers and events come from two hooks, `host_alloc` and `record_event`; their
defaults are pinned `torch.empty` and a `torch.cuda.Event` on the device's current stream.
Tests inject a plain allocator and a fake event (a copy that completes only when waited on)
so that the ring's reuse logic runs, and is checked, on the CPU.

Rows the device itself updates (counters, histories) are only overwritten where the host
marked them dirty, so a flush never clobbers device progress in other rows.

Without an accelerator, pinned memory cannot be allocated (torch raises): the staging ring
degrades to plain CPU tensors and the flush to a plain copy, with the same row semantics; no
event is recorded unless one is injected.

`host_to_device` (and `index_to_device`, its int64 case) moves a small host-built list to
the device the same way: from pinned memory (when asked) and non-blocking on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch


class CopyEvent(Protocol):
    """Marks the completion of the copies a flush enqueued (`torch.cuda.Event` is one)."""

    def synchronize(self) -> None:
        """Block the host until those copies have completed."""


# (shape, dtype) -> a host tensor of that shape and dtype, for the ring's staging buffers.
HostAlloc = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]
# Called right after a flush enqueued its copies: a marker of their completion.
RecordEvent = Callable[[], CopyEvent]


def pin_memory_available() -> bool:
    """Whether pinned host memory can be allocated here (needs an accelerator)."""
    return torch.cuda.is_available()


class StagedTensor:
    """A device tensor of fixed shape `[rows, *row_shape]` written row-wise from the host.

    host: the authoritative host copy; write it through `write`/`fill_rows` or by indexing
        `host`/`np` and calling `mark_dirty(rows)`.
    device: the device tensor; its `data_ptr` is fixed for the life of the object.
    ring: pinned staging buffers, used round-robin (2 lets the host run a step ahead).
    use_staging: force the staging path (True) or the direct copy (False); default: stage
        where the device is not the CPU.
    host_alloc: allocates the ring's buffers (rows, and the packed rows' indices); default:
        `torch.empty`, pinned when `pin_memory`.
    record_event: called after each staged flush enqueued its copies; the buffer it read is
        refilled only after the returned event's `synchronize()`. Default: a
        `torch.cuda.Event` recorded on the device's current stream when the copies are
        asynchronous (pinned memory, CUDA device); none otherwise, the copy being over
        when it returns.
    """

    def __init__(
        self,
        name: str,
        shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        fill: float | int = 0,
        pin_memory: bool | None = None,
        ring: int = 2,
        use_staging: bool | None = None,
        host_alloc: HostAlloc | None = None,
        record_event: RecordEvent | None = None,
    ) -> None:
        if len(shape) < 1 or any(s < 1 for s in shape):
            raise ValueError(f"{name}: shape must be non-empty with positive sizes, got {shape}")
        if ring < 1:
            raise ValueError(f"{name}: ring must be >= 1, got {ring}")
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.fill = fill
        device = torch.device(device)
        if pin_memory is None:
            pin_memory = device.type == "cuda" and pin_memory_available()
        self.pin_memory = bool(pin_memory)
        self.host = torch.full(self.shape, fill, dtype=dtype)
        # numpy view of `host` (same memory) for cheap host-side writes.
        self.np: np.ndarray = self.host.numpy()
        self.device = torch.full(self.shape, fill, dtype=dtype, device=device)
        # use_staging=None: stage through the ring exactly where copies are asynchronous
        # (a non-CPU device). True forces the ring on the CPU too, so that the packed-row
        # path runs in CPU-only tests.
        self._async = self.device.device.type != "cpu" if use_staging is None else use_staging
        rows = self.shape[0]
        # The staging ring and the device landing area for packed rows only exist where the
        # copy is asynchronous; on a CPU device the flush copies host -> device directly.
        ring = ring if self._async else 0
        alloc = host_alloc or self._alloc_host
        self._staging = [self._checked(alloc, self.shape, dtype) for _ in range(ring)]
        self._staging_index = [self._checked(alloc, (rows,), torch.int64) for _ in range(ring)]
        if record_event is None and self.pin_memory and self.device.is_cuda:
            # Only a copy from pinned memory is asynchronous to the host: one from pageable
            # memory has read its source by the time it returns, so it needs no event.
            record_event = self._record_cuda_event
        self._record_event = record_event
        # _events[k]: the completion of the last copy that read ring buffer k (None: none).
        self._events: list[CopyEvent | None] = [None] * ring
        self._next = 0
        if self._async:
            self._packed_rows = torch.empty(self.shape, dtype=dtype, device=device)
            self._packed_index = torch.empty(rows, dtype=torch.int64, device=device)
        self._dirty = np.zeros(rows, dtype=bool)
        # Whether any row may be dirty: most tables are clean on most steps, and their flush
        # then returns before any numpy call (25 tables a sampler, each flushed every update)
        self._maybe_dirty = False
        # numpy view of a CPU `device`: the direct copy's rows land by one fancy-index
        # assignment, not index_select + index_copy_ (two torch ops of ~5 us overhead each)
        self._device_np = self.device.numpy() if self.device.device.type == "cpu" else None

    def __repr__(self) -> str:
        return (
            f"StagedTensor({self.name!r}, shape={self.shape}, dtype={self.dtype}, "
            f"device={self.device.device}, pinned={self.pin_memory})"
        )

    @property
    def num_rows(self) -> int:
        return self.shape[0]

    def mark_dirty(self, rows: int | Sequence[int] | np.ndarray | slice) -> None:
        self._dirty[rows] = True
        self._maybe_dirty = True

    def has_pending(self) -> bool:
        return self._maybe_dirty and bool(self._dirty.any())

    def write(self, row: int, value: object) -> None:
        """host[row] = value (broadcast as numpy does) and mark the row dirty."""
        self.np[row] = value
        self.mark_dirty(row)

    def fill_rows(self, rows: int | Sequence[int] | np.ndarray | slice, value: object) -> None:
        self.np[rows] = value
        self.mark_dirty(rows)

    def copy_rows(self, dst: Sequence[int] | np.ndarray, src: Sequence[int] | np.ndarray) -> None:
        """host[dst] = host[src] (all sources read before any write), marking dst dirty."""
        self.np[np.asarray(dst)] = self.np[np.asarray(src)]
        self.mark_dirty(np.asarray(dst))

    def reset(self) -> None:
        """Every row back to the fill value, on host and device (a full flush)."""
        self.np[...] = self.fill
        self.mark_dirty(slice(None))
        self.flush()

    def _alloc_host(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin_memory)

    def _checked(
        self, alloc: HostAlloc, shape: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        buf = alloc(shape, dtype)
        if tuple(buf.shape) != shape or buf.dtype != dtype or buf.device.type != "cpu":
            raise ValueError(
                f"{self.name}: host_alloc{(shape, dtype)} returned a {buf.dtype} tensor of "
                f"shape {tuple(buf.shape)} on {buf.device}"
            )
        return buf

    def _record_cuda_event(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        # The copies ran on the target device's current stream, which need not be the
        # current device's.
        event.record(torch.cuda.current_stream(self.device.device))
        return event

    def _take_buffer(self) -> tuple[torch.Tensor, torch.Tensor]:
        k = self._next
        self._next = (k + 1) % len(self._staging)
        event = self._events[k]
        if event is not None:
            # The copy that last read this buffer was enqueued `ring` flushes ago.
            event.synchronize()
        return self._staging[k], self._staging_index[k]

    def _record(self) -> None:
        if self._record_event is not None:
            # The buffer `_take_buffer` just handed out: the one the enqueued copies read.
            k = (self._next - 1) % len(self._staging)
            self._events[k] = self._record_event()

    def flush(self) -> None:
        """Send the dirty rows to the device (non-blocking); no-op when none are dirty."""
        if not self._maybe_dirty:
            return
        self._maybe_dirty = False
        dirty = self._dirty.nonzero()[0]  # 1-D: the rows
        n = int(dirty.size)
        if n == 0:
            return
        self._dirty[:] = False
        if not self._async:
            # a plain copy, same rows, same semantics (a CPU device's through numpy)
            if self._device_np is not None:
                self._device_np[dirty] = self.np[dirty]
            elif n == self.num_rows:
                self.device.copy_(self.host)
            else:
                index = torch.from_numpy(dirty)
                self.device.index_copy_(0, index, self.host.index_select(0, index))
            return
        rows, index = self._take_buffer()
        # Whole-tensor copy only when every row is dirty: a partial one would overwrite rows
        # the device advanced on its own (num_generated, histories).
        if n == self.num_rows:
            rows.copy_(self.host)
            self.device.copy_(rows, non_blocking=True)
        else:
            index_np = torch.from_numpy(dirty)
            torch.index_select(self.host, 0, index_np, out=rows[:n])
            index[:n].copy_(index_np)
            packed_rows = self._packed_rows[:n]
            packed_index = self._packed_index[:n]
            packed_rows.copy_(rows[:n], non_blocking=True)
            packed_index.copy_(index[:n], non_blocking=True)
            self.device.index_copy_(0, packed_index, packed_rows)
        self._record()


def host_to_device(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device, *, pin: bool
) -> torch.Tensor:
    """[len(values)] `dtype` on `device` without a host sync: a copy from pageable memory
    waits for the stream, one from pinned memory does not. (The pinned temporary comes from
    torch's caching host allocator, which keeps it until the copy that reads it is done.)"""
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return host
    if pin:
        host = host.pin_memory()
    return host.to(device, non_blocking=pin)


def index_to_device(values: Sequence[int], device: torch.device, *, pin: bool) -> torch.Tensor:
    """[len(values)] int64 on `device` without a host sync (see `host_to_device`)."""
    return host_to_device(values, torch.int64, device, pin=pin)
