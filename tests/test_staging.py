"""StagedTensor: fixed addresses, dirty-row flushes that never clobber device progress."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from graphsafe_sampler.staging import (
    StagedTensor,
    host_to_device,
    index_to_device,
    pin_memory_available,
)


@pytest.mark.parametrize("use_staging", [None, True], ids=["auto", "ring"])
def test_flush_sends_only_dirty_rows(device: torch.device, use_staging: bool | None) -> None:
    # use_staging=True runs the pinned-ring path (packed rows + index_copy_) on the CPU too.
    t = StagedTensor("t", (9, 3), torch.float32, device, fill=-1.0, use_staging=use_staging)
    ptr = t.device.data_ptr()
    assert torch.equal(t.device.cpu(), torch.full((9, 3), -1.0))
    # The device advances rows on its own (as commits do); a flush must not undo that.
    t.device[:, 0] += torch.arange(9, dtype=torch.float32, device=device)
    t.write(2, [1.0, 2.0, 3.0])
    t.fill_rows([5, 7], 4.5)
    assert t.has_pending()
    t.flush()
    assert not t.has_pending()
    expected = torch.full((9, 3), -1.0)
    expected[:, 0] += torch.arange(9, dtype=torch.float32)
    expected[2] = torch.tensor([1.0, 2.0, 3.0])
    expected[[5, 7]] = 4.5
    assert torch.equal(t.device.cpu(), expected)
    assert t.device.data_ptr() == ptr


def test_dense_flush_and_reset(device: torch.device) -> None:
    t = StagedTensor("t", (6,), torch.int32, device, fill=7)
    ptr = t.device.data_ptr()
    t.np[:] = range(6)
    t.mark_dirty(slice(None))
    t.flush()
    assert t.device.cpu().tolist() == list(range(6))
    t.reset()
    assert t.device.cpu().tolist() == [7] * 6 and t.host.tolist() == [7] * 6
    assert t.device.data_ptr() == ptr


def test_copy_rows_reads_all_sources_first(device: torch.device) -> None:
    t = StagedTensor("t", (4,), torch.int64, device)
    t.np[:] = [10, 11, 12, 13]
    t.mark_dirty(slice(None))
    t.flush()
    t.copy_rows([0, 3], [3, 0])  # a swap
    assert t._dirty.tolist() == [True, False, False, True]
    t.flush()
    assert t.device.cpu().tolist() == [13, 11, 12, 10]


def test_cpu_staging_degrades_to_plain_tensors() -> None:
    # No accelerator: pinning is impossible (torch raises), so nothing may ask for it.
    t = StagedTensor("t", (3,), torch.float32, "cpu")
    assert not t.pin_memory
    assert not t.host.is_pinned()
    if not pin_memory_available():
        with pytest.raises(RuntimeError):
            torch.empty(1, pin_memory=True)


def test_ring_reuses_pinned_buffers_only_after_their_copy() -> None:
    if not torch.cuda.is_available():
        pytest.skip("the pinned staging ring exists only with CUDA")
    # The defaults: pinned buffers, a CUDA event per copy (the CPU test below fakes both).
    t = StagedTensor("t", (1024, 64), torch.float32, "cuda", ring=2)
    assert t.pin_memory and all(buf.is_pinned() for buf in t._staging + t._staging_index)
    torch.cuda._sleep(50_000_000)  # keep the stream busy so the host runs ahead of copies
    for step in range(20):
        t.write(step, float(step))
        t.flush()
    assert all(isinstance(event, torch.cuda.Event) for event in t._events)
    torch.cuda.synchronize()
    assert torch.equal(t.device.cpu(), t.host)  # every row, not only the last flush's


@pytest.mark.parametrize(
    ("shape", "ring", "match"),
    [((), 2, "shape must be non-empty"), ((0, 2), 2, "positive sizes"), ((3,), 0, "ring")],
    ids=["scalar", "zero-rows", "no-ring"],
)
def test_bad_construction(shape: tuple[int, ...], ring: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StagedTensor("t", shape, torch.float32, "cpu", ring=ring)


@pytest.mark.parametrize("use_staging", [None, True], ids=["auto", "ring"])
def test_partial_flush_never_clobbers_device_rows(
    device: torch.device, use_staging: bool | None
) -> None:
    # Most rows dirty but not all: the one the device advanced must survive.
    t = StagedTensor("t", (8,), torch.int32, device, use_staging=use_staging)
    t.device[7] = 99
    t.fill_rows(slice(0, 7), 1)
    t.flush()
    assert t.device.cpu().tolist() == [1] * 7 + [99]


def test_ring_path_matches_host_through_many_flushes() -> None:
    # The staged path on the CPU: ring buffers rotate, packed and dense flushes alternate.
    t = StagedTensor("t", (33, 5), torch.int64, "cpu", use_staging=True, ring=3)
    assert len(t._staging) == 3
    gen = torch.Generator().manual_seed(0)
    for step in range(40):
        rows = torch.randperm(33, generator=gen)[: 1 + step % 33].tolist()
        for r in rows:
            t.write(r, torch.randint(100, (5,), generator=gen).numpy())
        t.flush()
        assert torch.equal(t.device, t.host), step


class _PendingCopy:
    """A fake `CopyEvent`: the copies of one flush on a slow device, which has not performed
    them yet and performs them only when the host waits (`synchronize()`). Until then the
    ring buffers they read must keep the contents they had when the flush recorded it."""

    def __init__(self, reads: list[torch.Tensor], label: str) -> None:
        assert reads, f"{label}: a flush recorded an event without filling a ring buffer"
        # (buffer, its write counter, its contents) at record time.
        self._reads = [(buf, buf._version, buf.clone()) for buf in reads]
        self.label = label
        self.done = False

    def check(self) -> None:
        for buf, version, contents in self._reads:
            race = f"{self.label}: the host wrote into a ring buffer its pending copy still reads"
            assert torch.equal(buf, contents), f"{race} (contents changed)"
            # Even a write of the same values is the race (it may just have been lucky).
            assert buf._version == version, f"{race} (same contents)"

    def synchronize(self) -> None:
        if not self.done:  # waiting again on a completed copy returns at once
            self.check()
            self.done = True


class _SlowDevice:
    """The `host_alloc` and `record_event` hooks of a StagedTensor on a slow device: it knows
    every ring buffer, and at each record the buffers written since the last one are those
    the flush just filled, hence those its copies read."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.buffers: list[torch.Tensor] = []
        self._versions: list[int] = []  # each buffer's write counter at the last record
        self.events: list[_PendingCopy] = []

    def alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buf = torch.zeros(shape, dtype=dtype)
        self.buffers.append(buf)
        self._versions.append(buf._version)
        return buf

    def record(self) -> _PendingCopy:
        reads = [b for b, v in zip(self.buffers, self._versions, strict=True) if b._version != v]
        self._versions = [b._version for b in self.buffers]
        self.events.append(_PendingCopy(reads, f"{self.label} copy {len(self.events)}"))
        return self.events[-1]

    def pending(self) -> list[_PendingCopy]:
        return [e for e in self.events if not e.done]


def _seed() -> int:
    # A fresh seed each run (printed, and in every failure message); STAGING_SEED replays one.
    seed = int(os.environ.get("STAGING_SEED") or random.SystemRandom().randrange(2**32))
    print(f"STAGING_SEED={seed}")
    return seed


@pytest.mark.parametrize("ring", [1, 2, 3])
def test_ring_never_refills_a_buffer_its_pending_copy_reads(ring: int) -> None:
    # The ring's reuse logic on the CPU, with the event the GPU path records faked: each
    # flush's copy stays pending until the host waits on its event. A host write into a
    # buffer whose copy is pending (the race the events exist to prevent) fails `check`.
    seed = _seed()
    label = f"seed={seed} ring={ring}"
    rng = np.random.default_rng(seed)
    dev = _SlowDevice(label)
    num_rows = 17
    t = StagedTensor(
        "t",
        (num_rows, 3),
        torch.int64,
        "cpu",
        ring=ring,
        use_staging=True,
        host_alloc=dev.alloc,
        record_event=dev.record,
    )
    assert len(dev.buffers) == 2 * ring  # rows and packed-row indices, per ring slot
    copies = 0
    for step in range(300):
        kind = rng.integers(4)  # 0: nothing dirty, 1: every row (dense), else some (packed)
        n = 0 if kind == 0 else num_rows if kind == 1 else int(rng.integers(1, num_rows))
        rows = rng.choice(num_rows, size=n, replace=False)
        t.fill_rows(rows, rng.integers(-(2**40), 2**40, size=(n, 3)))
        t.flush()
        copies += n > 0
        # Copies still pending read intact buffers (those waited on were checked at the wait).
        for event in dev.pending():
            event.check()
        where = f"{label} step={step} dirty={n}"
        # One event per flush that copied, and the host waits only when a buffer comes round
        # again: the last `ring` copies stay pending (the host runs that far ahead).
        assert len(dev.events) == copies, f"{where}: not one event per flush that copied"
        pending, ahead = len(dev.pending()), min(ring, copies)
        assert pending == ahead, f"{where}: {pending} copies pending, not the last {ahead}"
    assert torch.equal(t.device, t.host), label


def test_default_cpu_ring_records_no_events() -> None:
    # A CPU copy (like a pageable one) is over when it returns: nothing to wait on.
    t = StagedTensor("t", (4, 2), torch.float32, "cpu", use_staging=True)
    t.fill_rows([1, 3], 2.0)
    t.flush()
    assert t._events == [None, None]
    assert torch.equal(t.device, t.host)


def test_host_alloc_must_return_the_asked_buffer() -> None:
    def wrong(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty((*shape, 2), dtype=dtype)

    with pytest.raises(ValueError, match="host_alloc"):
        StagedTensor("t", (3,), torch.float32, "cpu", use_staging=True, host_alloc=wrong)


@pytest.mark.parametrize("pin", [False, True], ids=["pageable", "pinned"])
def test_host_to_device(device: torch.device, pin: bool) -> None:
    # pin=True on a CPU device must not ask for pinned memory (no accelerator: torch raises).
    counts = host_to_device([0, 7, 255], torch.uint8, device, pin=pin)
    assert counts.dtype == torch.uint8 and counts.device.type == device.type
    assert counts.cpu().tolist() == [0, 7, 255]
    index = index_to_device([3, 1], device, pin=pin)
    assert index.dtype == torch.int64 and index.device.type == device.type
    assert index.cpu().tolist() == [3, 1]
    assert host_to_device([], torch.float32, device, pin=pin).shape == (0,)


def test_host_to_device_lands_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = host_to_device([1, 2, 3], torch.uint8, torch.device("cuda"), pin=True)
    assert out.is_cuda and out.dtype == torch.uint8
    assert out.cpu().tolist() == [1, 2, 3]
