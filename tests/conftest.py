"""Shared fixtures: the device under test (CPU everywhere, CUDA too where present), and the
device the Triton kernels run on.

`device`: every device present, as a parameter ([cpu], and [cuda] where there is one).

`kernel_device`: the one device whose tensors the Triton kernels can take, decided by
TRITON_INTERPRET (`kernel_device_or_skip_reason`):

- "1" (the default set below, so CI and this machine): `cpu`, the kernels run through the
  numpy interpreter, on CPU tensors;
- anything else, with CUDA present (perf/gpu_check.py's `tests` part sets "0"): `cuda`, the
  kernels compiled for real; a compiled kernel cannot read CPU tensors, so a kernel test
  built on the CPU would prove nothing there;
- neither (the interpreter off, no CUDA): the test is skipped, with the reason.

Kernel tests draw their random inputs on the CPU (a `torch.Generator` is a CPU generator)
and move them with `.to(kernel_device)`, build the package's objects (BatchState, Sampler,
...) on it, and bring results back with `.cpu()` before numpy, float64 references or
host-side expectations.

Every test that takes `kernel_device` is marked `kernel` at collection, so `-k kernel` (the
GPU check's "cuda or kernel") selects it whatever its file is called.
"""

from __future__ import annotations

import os

# Triton kernels run through the numpy interpreter here (no GPU on CI). It must be set
# before Triton is first imported; set TRITON_INTERPRET=0 to run them on a GPU.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist (`make test` runs one worker per core) each worker takes one thread:
# two workers of two OpenMP threads each on two cores spin against each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor's CPU code scalar, not SIMD, as the demo command makes it (read when
# torch._inductor.config is imported; "1" gives SIMD back): its SIMD C++ of the top-k/top-p
# searches is most of a cold compile. Measured on 2 cores, one process, caches cold: the
# suite's 12 inductor tests took 114 s SIMD against 71 s scalar. The suite passes with
# either; where their values differ (libm's last bit in the RNG's exponentials), the test
# says which it ran (tests/test_rng.py, test_compiled_draws_match_eager).
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

if os.environ["TRITON_INTERPRET"] == "1":
    from graphsafe_sampler.testing import speed_up_interpreter

    # about half the interpreted kernels' time was Triton re-patching its language on every
    # helper call, a fifth more its element-by-element scans, and of what was left a quarter
    # its overflow checks that nothing asserts; the values are the same
    # (graphsafe_sampler/testing/interpreter.py)
    speed_up_interpreter()

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

KERNEL_MARK = "kernel"


def kernel_device_or_skip_reason() -> tuple[torch.device | None, str]:
    """(the device the Triton kernels run on, "") or (None, why no device can run them).
    Read at fixture time, not import time: a test may change TRITON_INTERPRET first.
    "1" only, as `graphsafe_sampler.config.triton_available` reads it."""
    interpret = os.environ.get("TRITON_INTERPRET")
    if interpret == "1":
        return torch.device("cpu"), ""
    if torch.cuda.is_available():
        return torch.device("cuda"), ""
    return None, (
        f"Triton kernels need CUDA when the interpreter is off (TRITON_INTERPRET={interpret!r})"
        " and no CUDA device is available; set TRITON_INTERPRET=1 to run them on the CPU"
    )


def pytest_configure(config: pytest.Config) -> None:
    # --strict-markers: register the mark that `pytest_collection_modifyitems` adds.
    config.addinivalue_line(
        "markers", f"{KERNEL_MARK}: runs Triton kernels on the `kernel_device` fixture's device"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that take `kernel_device`. tryfirst: before `-k` deselects, which
    matches mark names as keywords."""
    for item in items:
        if "kernel_device" in getattr(item, "fixturenames", ()):
            item.add_marker(KERNEL_MARK)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


@pytest.fixture
def kernel_device() -> torch.device:
    """The device the Triton kernels run on (module docstring); skips where there is none."""
    device, reason = kernel_device_or_skip_reason()
    if device is None:
        pytest.skip(reason)
    return device
