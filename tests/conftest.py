"""Shared fixtures: the device under test (CPU everywhere, CUDA too where present)."""

from __future__ import annotations

import os

# Triton kernels run through the numpy interpreter here (no GPU on CI). It must be set
# before Triton is first imported; set TRITON_INTERPRET=0 to run them on a GPU.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)
