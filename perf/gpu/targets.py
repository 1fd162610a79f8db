"""What the checks build and drive: Samplers with every feature on (and RejectionSamplers
on them), requests that use every feature, and the one rule for a backend that cannot run
here (a skip with its reason) against one that is broken (an error)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import torch

from graphsafe_sampler import RejectionSampler, Sampler, SamplerConfig, SamplingParams
from graphsafe_sampler.config import triton_available
from graphsafe_sampler.testing import random_sampling_params

from .cases import SPEC_LEN
from .options import Options

Target = Sampler | RejectionSampler
"""What a replay check drives: the Sampler, or a RejectionSampler on its own Sampler."""


TARGET_TOKEN_PROCESSOR = "graphsafe_sampler.examples.target_token:TargetTokenLogitsProcessor"


def all_feature_params(rng: Any, config: SamplerConfig) -> SamplingParams:
    """`random_sampling_params` (every SamplingParams field, on in some requests and off in
    others) plus, in some requests, the custom target-token processor's extra_args."""
    params = random_sampling_params(rng, config)
    if config.logits_processors and rng.random() < 0.1:
        params = dataclasses.replace(
            params, extra_args={"target_token": rng.randrange(config.vocab_size)}
        )
    return params


def graph_config(opts: Options, backend: str, logprobs_mode: str) -> SamplerConfig:
    """Every feature: logprobs, EOS under min_tokens, bad words, a custom processor; small
    per-request capacities in the CPU smoke run (host work), the defaults on a GPU."""
    vocab = opts.graph_vocab
    small: dict[str, Any] = {
        "max_logit_bias_tokens": 8,
        "max_stop_token_ids": 4,
        "max_bad_word_len": 4,
    }
    return SamplerConfig(
        opts.graph_rows,
        vocab,
        max_num_logprobs=min(5, vocab),
        logprobs_mode=logprobs_mode,  # type: ignore[arg-type]
        eos_token_id=vocab - 1,
        backend=backend,  # type: ignore[arg-type]
        logits_processors=(TARGET_TOKEN_PROCESSOR,),
        seed=opts.seed + 1,
        **(small if opts.cpu_smoke else {}),
    )


def spec_config(opts: Options, backend: str) -> SamplerConfig:
    """The graph part's every-feature config (bad words, EOS under min_tokens, the custom
    target-token processor, ...) without logprobs: the verification step returns none."""
    return replace(graph_config(opts, backend, "raw_logprobs"), max_num_logprobs=0)


def sampler_or_reason(config: SamplerConfig, device: torch.device) -> Sampler | str:
    """The Sampler, or why its backend cannot run here: "triton" where its kernels cannot
    run on `device` (the CPU without the interpreter). Any other error building it is a
    failure and raises: a broken backend must never read as "skipped"."""
    if config.backend == "triton" and not triton_available(device):
        return (
            f"not available: the Triton backend needs CUDA or TRITON_INTERPRET=1, and the "
            f"device is {device}"
        )
    return Sampler(config, device)


def rejection_or_reason(config: SamplerConfig, device: torch.device) -> RejectionSampler | str:
    """A RejectionSampler (SPEC_LEN) built right after its Sampler, or why this backend
    cannot be built here (see `sampler_or_reason`)."""
    sampler = sampler_or_reason(config, device)
    if isinstance(sampler, str):
        return sampler
    return RejectionSampler(sampler, SPEC_LEN)
