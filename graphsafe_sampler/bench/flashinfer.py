"""FlashInfer's sampling functions as a peer: the one table of which function stands beside
which benchmark case, shared by the stage benchmarks and the GPU check.

FlashInfer runs on CUDA only. Its functions sample or renormalise rather than mask, and
ignore per-request seeds, so a row here is a cost reference, not the same work: the filter
stages take its masking or renormalising function (the closest to a mask), and the cases
that sample take its sampling functions. `top_k_top_p_sampling_from_logits` is the headline
peer of the whole step.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from graphsafe_sampler.bench.stages import MIN_P, TEMPERATURE, TOP_K, TOP_P

FLASHINFER_FUNCTIONS: dict[str, str] = {
    "top_k": "top_k_mask_logits",
    "top_p": "top_p_renorm_probs",
    "top_k_top_p": "top_k_top_p_sampling_from_logits",
    "min_p": "min_p_sampling_from_probs",
    "sampling": "sampling_from_logits",
    "all": "top_k_top_p_sampling_from_logits",
}
"""Case -> the FlashInfer function timed beside it (`flashinfer.sampling.<name>`)."""


def flashinfer_available(device: torch.device) -> bool:
    """FlashInfer runs on CUDA only, and only when installed."""
    return device.type == "cuda" and importlib.util.find_spec("flashinfer") is not None


def flashinfer_call(
    case: str, rows: int, device: torch.device
) -> tuple[str, Callable[[torch.Tensor], object]] | None:
    """(function name, call on [rows, V] logits) for `case`, or None where FlashInfer has no
    function for it (penalties, bias, greedy, logprobs) or cannot run here."""
    if case not in FLASHINFER_FUNCTIONS or not flashinfer_available(device):
        return None
    from flashinfer import sampling as fi

    top_k = torch.full((rows,), TOP_K, dtype=torch.int32, device=device)
    top_p = torch.full((rows,), TOP_P, dtype=torch.float32, device=device)
    min_p = torch.full((rows,), MIN_P, dtype=torch.float32, device=device)
    calls: dict[str, Callable[[torch.Tensor], object]] = {
        "top_k": lambda x: fi.top_k_mask_logits(x.float(), top_k),
        "top_p": lambda x: fi.top_p_renorm_probs(x.float().softmax(dim=-1), top_p),
        "top_k_top_p": lambda x: fi.top_k_top_p_sampling_from_logits(x.float(), top_k, top_p),
        "min_p": lambda x: fi.min_p_sampling_from_probs(x.float().softmax(dim=-1), min_p),
        "sampling": lambda x: fi.sampling_from_logits(x.float()),
        "all": lambda x: fi.top_k_top_p_sampling_from_logits(x.float() / TEMPERATURE, top_k, top_p),
    }
    return FLASHINFER_FUNCTIONS[case], calls[case]
