"""StagedTensor: fixed addresses, dirty-row flushes that never clobber device progress."""

from __future__ import annotations

import pytest
import torch

from graphsafe_sampler.staging import StagedTensor, pin_memory_available


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
    t = StagedTensor("t", (1024, 64), torch.float32, "cuda", ring=2)
    assert t.pin_memory and all(buf.is_pinned() for buf in t._staging)
    torch.cuda._sleep(50_000_000)  # keep the stream busy so the host runs ahead of copies
    for step in range(20):
        t.write(step, float(step))
        t.flush()
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
