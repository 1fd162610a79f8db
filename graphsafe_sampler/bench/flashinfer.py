"""FlashInfer's sampling functions as a peer: the one table of which function stands beside
which benchmark case, shared by the stage benchmarks and the GPU check.

FlashInfer runs on CUDA only. Its functions sample or renormalise rather than mask, and
ignore per-request seeds, so a row here is a cost reference, not the same work. A case has
two peers: beside the stage alone (a filter), FlashInfer's masking or renormalising function
where it has one; beside a whole step (the GPU check's cases, which sample), its sampling
function. `top_k_top_p_sampling_from_logits` is the headline peer of the step.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from graphsafe_sampler.bench.stages import MIN_P, TEMPERATURE, TOP_K, TOP_P

FLASHINFER_FUNCTIONS: dict[str, tuple[str | None, str]] = {
    # case: (beside the stage alone, beside a step that samples)
    "top_k": ("top_k_mask_logits", "top_k_sampling_from_probs"),
    "top_p": ("top_p_renorm_probs", "top_p_sampling_from_probs"),
    "top_k_top_p": ("top_k_top_p_sampling_from_logits", "top_k_top_p_sampling_from_logits"),
    "min_p": ("min_p_sampling_from_probs", "min_p_sampling_from_probs"),
    "sampling": ("sampling_from_logits", "sampling_from_logits"),
    "all": (None, "top_k_top_p_sampling_from_logits"),
}
"""Case -> the `flashinfer.sampling` functions timed beside it (None: none)."""


def flashinfer_available(device: torch.device) -> bool:
    """FlashInfer runs on CUDA only, and only when installed."""
    return device.type == "cuda" and importlib.util.find_spec("flashinfer") is not None


def flashinfer_call(
    case: str, rows: int, device: torch.device, *, step: bool = False
) -> tuple[str, Callable[[torch.Tensor], object]] | None:
    """(function name, call on [rows, V] logits) beside `case`, alone or (`step`) as a whole
    sampling step; None where FlashInfer has no function for it (penalties, bias, greedy,
    logprobs) or cannot run here."""
    if case not in FLASHINFER_FUNCTIONS or not flashinfer_available(device):
        return None
    name = FLASHINFER_FUNCTIONS[case][1 if step else 0]
    if name is None:
        return None
    from flashinfer import sampling as fi

    top_k = torch.full((rows,), TOP_K, dtype=torch.int32, device=device)
    top_p = torch.full((rows,), TOP_P, dtype=torch.float32, device=device)
    min_p = torch.full((rows,), MIN_P, dtype=torch.float32, device=device)
    # the whole-step case runs at its temperature, as the Sampler's does
    temperature = TEMPERATURE if case == "all" else 1.0

    def probs(x: torch.Tensor) -> torch.Tensor:
        return x.float().softmax(dim=-1)

    calls: dict[str, Callable[[torch.Tensor], object]] = {
        "top_k_mask_logits": lambda x: fi.top_k_mask_logits(x.float(), top_k),
        "top_p_renorm_probs": lambda x: fi.top_p_renorm_probs(probs(x), top_p),
        "top_k_sampling_from_probs": lambda x: fi.top_k_sampling_from_probs(probs(x), top_k),
        "top_p_sampling_from_probs": lambda x: fi.top_p_sampling_from_probs(probs(x), top_p),
        "top_k_top_p_sampling_from_logits": lambda x: fi.top_k_top_p_sampling_from_logits(
            x.float() / temperature, top_k, top_p
        ),
        "min_p_sampling_from_probs": lambda x: fi.min_p_sampling_from_probs(probs(x), min_p),
        "sampling_from_logits": lambda x: fi.sampling_from_logits(x.float()),
    }
    return name, calls[name]
