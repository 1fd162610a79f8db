"""The sampling step's two pipelines over one stage set: `TorchPipeline` (PyTorch ops, the
reference and the CPU path) and `TritonPipeline` (the kernels). `make_pipeline` picks one,
once, when a sampler is built; the Triton one is imported only then, so the PyTorch backend
never imports Triton."""

from __future__ import annotations

from typing import Literal

from graphsafe_sampler.pipelines.base import Pipeline, Processed
from graphsafe_sampler.pipelines.torch_pipeline import TorchPipeline
from graphsafe_sampler.stages import Stages


def make_pipeline(backend: Literal["torch", "triton"], stages: Stages) -> Pipeline:
    """The pipeline of `backend` (see `config.resolve_backend`) over `stages`."""
    if backend == "torch":
        return TorchPipeline(stages)
    from graphsafe_sampler.pipelines.triton_pipeline import TritonPipeline

    return TritonPipeline(stages)


__all__ = ["Pipeline", "Processed", "TorchPipeline", "make_pipeline"]
