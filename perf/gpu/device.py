"""The device side of a check: waiting for it, noticing a broken CUDA context, running a
part's checks in their time boxes, and forbidding host syncs (on a GPU for real, on the CPU
by op name)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from graphsafe_sampler.testing import SyncOpDetector

from .report import error_result

# (name, weight in the part's time, job(until: a time.monotonic() deadline) -> result)
Job = tuple[str, float, Callable[[float], dict[str, Any]]]


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


def run_jobs(
    jobs: Sequence[Job], deadline: float, device: torch.device
) -> list[tuple[str, dict[str, Any]]]:
    """Each job in turn, given its weight's share of the time left until `deadline` (so
    time a job leaves unused goes to the later ones); a job that raises is an error, and
    once the CUDA context broke the rest are errors without running."""
    results = []
    for i, (name, weight, job) in enumerate(jobs):
        share = weight / sum(w for _, w, _ in jobs[i:])
        until = time.monotonic() + (deadline - time.monotonic()) * share
        if not cuda_alive(device):
            result = {"status": "error", "reason": "the CUDA context is broken by an earlier error"}
        else:
            try:
                result = job(until)
            except Exception as exc:
                result = error_result(exc)
        results.append((name, result))
    return results


Launch = tuple[Any, tuple[Any, ...], Any, dict[str, Any]]
"""A Triton launch as `run` receives it: (kernel, args, grid, keyword arguments)."""


@contextlib.contextmanager
def observed_launches() -> Iterator[list[Launch]]:
    """Every Triton launch made inside, run as usual and appended to the yielded list (its
    tensors kept alive: `kernel.run(*args, grid=grid, warmup=False, **kwargs)` launches it
    again). The kernels are JITFunctions, or InterpretedFunctions under TRITON_INTERPRET=1
    (the CPU smoke run): the class of the package's own kernels is patched."""
    from graphsafe_sampler.kernels.sampling import _sample_kernel

    function = type(_sample_kernel)
    original = function.run
    launches: list[Launch] = []

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        launches.append((self, args, grid, kwargs))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    function.run = run
    try:
        yield launches
    finally:
        function.run = original


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
