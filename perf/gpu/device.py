"""The device side of a check: waiting for it, noticing a broken CUDA context, and
forbidding host syncs (on a GPU for real, on the CPU by op name)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from graphsafe_sampler.testing import SyncOpDetector


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_alive(device: torch.device) -> bool:
    """False once an asynchronous CUDA error has poisoned the context (nothing more can run)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
    except Exception:
        return False
    return True


@contextlib.contextmanager
def no_host_sync(device: torch.device, what: str) -> Iterator[None]:
    """Any host synchronisation inside raises: `set_sync_debug_mode("error")` on CUDA,
    `SyncOpDetector` (the ops that would sync on a GPU) on the CPU."""
    if device.type == "cuda":
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    else:
        with SyncOpDetector(what):
            yield
