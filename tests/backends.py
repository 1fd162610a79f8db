"""The backends a CPU-built test runs on (shared by the test modules that take `backend`).

"triton" goes through the Triton interpreter on CPU tensors. With TRITON_INTERPRET=0 (a GPU
run) those tests skip it: their tensors live on the CPU, which compiled kernels cannot take,
and the kernel tests (the `kernel_device` fixture of conftest.py) cover the kernels on CUDA.
"""

from __future__ import annotations

import os

import pytest

BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            os.environ.get("TRITON_INTERPRET") != "1",
            reason="CPU tensors reach the Triton backend only through the interpreter",
        ),
    ),
]
