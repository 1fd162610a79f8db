"""Programmatic dependent launch (PDL, Hopper and later): each kernel of a step may be
launched while the one before it in the stream still runs, and waits for it in the kernel.

The key idea: a kernel launched with PDL (`launch_pdl=True`, CUDA's
programmatic-stream-serialization attribute) may start before the kernel ahead of it in the
stream has finished, so its launch, its CTAs' placement and its entry overlap that kernel's
tail instead of following it. It must then wait in the kernel before it touches memory
another kernel writes or reads (`griddepcontrol.wait`: every prior grid complete, its stores
visible). Every kernel here calls `await_prior_grids(PDL)` as its first statement, before
any load or store, so it sees memory as a normally ordered launch would: the ordering is
the stream's, and only the launch latency overlaps. Right after the wait it lets the next
PDL launch begin (`griddepcontrol.launch_dependents`), which then waits in turn.

`pdl_launch(device)` gives a launch its two arguments together (the kernel's `PDL`
constexpr and Triton's `launch_pdl`), so that no kernel is launched early without its wait.
On by default where it exists: CUDA at compute capability 9.0 or later, not under the
interpreter. `GRAPHSAFE_SAMPLER_PDL=0` turns it off (the GPU check times both).
docs/kernels.md, programmatic dependent launch: the proof, the checks, what is measured.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .library import INTERPRETED

PDL_ENV = "GRAPHSAFE_SAMPLER_PDL"
"""The environment variable that turns programmatic dependent launch off ("0") or on
("1", where the device has it); unset, it is on where the device has it. Read at each
launch, so a process may time a step both ways."""


@triton.jit
def await_prior_grids(PDL: tl.constexpr):
    """A kernel's first statement: with PDL, wait until every grid before it in the stream
    has finished and its stores are visible, then let the next PDL launch begin. Without
    PDL, nothing (the interpreter has neither instruction)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def pdl_supported(
    device: torch.device, interpreted: bool = bool(INTERPRETED), setting: str | None = None
) -> bool:
    """Whether launches on `device` use PDL: CUDA at compute capability 9.0 or later, not
    under the Triton interpreter, and `setting` (the value of GRAPHSAFE_SAMPLER_PDL; None:
    read it now) not "0". Any value but "", "0" and "1" raises ValueError."""
    if setting is None:
        setting = os.environ.get(PDL_ENV, "")
    if setting not in ("", "0", "1"):
        raise ValueError(f"{PDL_ENV} must be 0 or 1, got {setting!r}")
    if setting == "0" or interpreted or device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability(index) >= (9, 0)


def pdl_launch(device: torch.device) -> dict[str, bool]:
    """A launch's keyword arguments for PDL on `device`: the kernel's `PDL` constexpr and
    Triton's `launch_pdl`, always equal (a kernel launched early must wait)."""
    on = pdl_supported(device)
    return {"PDL": on, "launch_pdl": on}
