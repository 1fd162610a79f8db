"""The backends a `backend`-parametrised test runs on, and the device each one builds on.

- "torch" (the PyTorch backend): the CPU, everywhere.
- "triton" (the Triton kernels): the device the kernels run on, conftest.py's
  `kernel_device_or_skip_reason()`: the CPU through the Triton interpreter with
  TRITON_INTERPRET=1 (conftest's default: CI and machines without a GPU); CUDA, the kernels
  compiled, with TRITON_INTERPRET=0 where CUDA exists (a GPU run: perf/gpu_check.py's
  `tests` part); neither, the test is skipped with conftest's reason.

A test calls `backend_device(backend)` first and builds its Sampler (or RejectionSampler)
there, draws random inputs on the CPU (a `torch.Generator` is a CPU generator) and moves them
with `.to(device)`, and brings outputs back with `.cpu()` before numpy, float64 references
or host-side expectations.

The "triton" cases carry the `kernel` mark, as conftest marks the tests that take
`kernel_device`, so the GPU check's `-k "cuda or kernel"` selects them.
"""

from __future__ import annotations

import pytest
import torch
from conftest import KERNEL_MARK, kernel_device_or_skip_reason

BACKENDS = ["torch", pytest.param("triton", marks=getattr(pytest.mark, KERNEL_MARK))]


def interpreted(backend: str, device: torch.device) -> bool:
    """Whether a `backend` test on `device` runs Triton kernels through the interpreter
    (numpy, slow: such tests take fewer steps)."""
    return backend == "triton" and device.type != "cuda"


def backend_device(backend: str) -> torch.device:
    """The device a `backend` test builds on (module docstring); skips "triton" where no
    device can run the kernels, with conftest's reason."""
    if backend == "torch":
        return torch.device("cpu")
    if backend != "triton":
        raise ValueError(f"unknown backend {backend!r}")
    device, reason = kernel_device_or_skip_reason()
    if device is None:
        pytest.skip(reason)
    return device
