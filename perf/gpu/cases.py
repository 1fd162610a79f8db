"""The benchmark grid: its cases (each feature alone, then all together; the speculative
step), shapes in run order, the requests of each case, and the providers' names."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from graphsafe_sampler import SamplingParams
from graphsafe_sampler.bench import stages
from graphsafe_sampler.bench.workload import DECODE_RECIPES

GPU_STAGES: tuple[str, ...] = (
    "penalties", "bias", "min_p", "top_k", "top_p", "top_k_top_p", "greedy", "sampling",
    "logprobs",
)  # fmt: skip
"""The stages the GPU check times alone: the hot path's. bench.stages has more (the
thinking budget, chosen-token and prompt logprobs, the watermark), left to the CPU suite so
that the check keeps fitting its device time."""
BENCH_CASES: tuple[str, ...] = (*GPU_STAGES, "all")
"""Each feature alone (bench.stages' stage names), then every feature at once."""
HEADLINE_CASES: tuple[str, ...] = ("top_k_top_p", "all")
"""The GPU run's default cases: FlashInfer's own function's case, and every feature on."""
LOGPROBS_CASES = ("logprobs", "all")
BENCH_K = stages.MAX_NUM_LOGPROBS
PROMPT_LEN = 512
OUTPUT_LEN = 128
BIAS_ENTRIES = 32


SPEC_LEN = 4
"""S = max_spec_len of the speculative step (the headline case)."""
SPEC_STAGE = "rejection"
"""The verification step's stage name in bench.json (as perf/bench_rejection.py names it)."""


FLASHINFER = "flashinfer"


CANDIDATE_CASES = ("top_k_top_p", "all")
CANDIDATES_PROVIDER = "kernel-top-k-top-p"
"""The top-k/top-p kernel alone, with its candidate buffer and without (provider
`kernel-top-k-top-p-c<candidates>`): which default is faster on this GPU."""


SAMPLER_PROVIDERS = (
    "sampler-compiled-graph",
    "sampler-graph",
    "sampler-triton-graph",
    "sampler-triton-no-pdl-graph",
    "sampler-compiled",
    "sampler-eager",
    "sampler-triton",
    "vllm-style-eager",
)
"""Column order in bench.md: the first present is the headline provider; the last, the
vLLM-V1-style eager peer (graphsafe_sampler.bench.vllm_style), timed eagerly as vLLM runs
its sampler, after the graph."""

VLLM_STYLE = "vllm-style-eager"

TRITON_GRAPH = "sampler-triton-graph"
"""The Triton Sampler's step on graph replay (with programmatic dependent launch where the
GPU has it)."""

NO_PDL = "sampler-triton-no-pdl-graph"
"""The Triton Sampler with programmatic dependent launch turned off (GRAPHSAFE_SAMPLER_PDL=0,
kernels/dependent_launch.py), beside `sampler-triton-graph` (on, where the GPU has it):
what PDL buys on this GPU, at the grid's smallest rows."""

READ_FLOOR = "amax"
"""The one-read floor's provider: `torch.amax(logits, -1)`, one pass over the logits (the
copy floor, bench.results.FLOOR_PROVIDER, reads and writes them)."""

KERNEL_PROVIDER = "step-kernel-"
"""The Triton step's launches timed one by one: provider `step-kernel-<index in the step>`,
extra["kernel"] its name."""

NO_STORE_PROVIDER = "processing-no-store"
"""A probe, not a provider of tokens: the step's processing launch replayed alone with its
dense pass's [B, V] store left out (STORE_LOGITS=False, kernels/logits_processing.py),
extra["index"] its place in the step. Against the same launch with the store it tells
whether processing is bound by memory (it saves about the store's share of the bytes) or
by issue (it saves little): which of the two the next speed-up must cut."""


def case_logprobs(case: str) -> int:
    """max_num_logprobs of the Sampler a case runs on: logprobs are a config-level feature,
    so only the cases that ask for them pay for them."""
    return BENCH_K if case in LOGPROBS_CASES else 0


def case_grid(
    rows: Sequence[int], vocabs: Sequence[int], cases: Sequence[str]
) -> list[tuple[int, int, str]]:
    """(rows, vocab, case) in run order: smaller shapes (rows x vocab) first, so that a run
    cut short loses the biggest; a shape's cases together, in BENCH_CASES order."""
    order = {c: i for i, c in enumerate(BENCH_CASES)}
    unknown = sorted(set(cases) - order.keys())
    if unknown:
        raise ValueError(f"unknown cases {unknown}; choose from {BENCH_CASES}")
    shapes = sorted({(r, v) for r in rows for v in vocabs}, key=lambda s: (s[0] * s[1], s[1]))
    ordered = sorted(set(cases), key=order.__getitem__)
    return [(r, v, c) for r, v in shapes for c in ordered]


def compiled_order(grid: Sequence[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The compiled pass: grouped by compiled program, cheapest coverage first. One compile
    (rows marked dynamic) serves every rows > 1 of a (vocab, max_num_logprobs); rows = 1
    compiles again (Dynamo specialises sizes 0 and 1), so those come last."""
    order = {c: i for i, c in enumerate(BENCH_CASES)}
    return sorted(grid, key=lambda g: (g[0] == 1, g[1], case_logprobs(g[2]), g[0], order[g[2]]))


def bench_params(case: str, row: int, vocab: int, gen: torch.Generator) -> SamplingParams:
    """A request of `case`: bench.stages' parameters for one feature alone, or for "all"
    every per-request feature at once (penalties, bias, stop ids under min_tokens, bad
    words, min_p, top-k, top-p, seed, logprobs; not allowed_token_ids, whose host lists
    would dominate the update); `spec_params` for the speculative step."""

    def ids(n: int) -> list[int]:
        return torch.randint(vocab, (n,), generator=gen).tolist()

    if case == SPEC_STAGE:
        return spec_params(row)
    if case == "all":
        return SamplingParams(
            temperature=0.8,
            top_k=stages.TOP_K,
            top_p=stages.TOP_P,
            min_p=stages.MIN_P,
            repetition_penalty=1.1,
            frequency_penalty=0.3,
            presence_penalty=0.5,
            seed=1000 + row,
            logit_bias=dict.fromkeys(ids(BIAS_ENTRIES), 1.5),
            stop_token_ids=ids(4),
            min_tokens=1000,
            bad_words_token_ids=[ids(2), ids(1)],
            logprobs=BENCH_K,
        )
    params = stages.stage_params(case, row)
    if case == "bias":
        params = dataclasses.replace(params, logit_bias=dict.fromkeys(ids(BIAS_ENTRIES), 1.5))
    return params


def spec_params(row: int) -> SamplingParams:
    """A request of the speculative step's benchmark, mixed as perf/bench_rejection.py mixes
    them: the decode recipes in turn (greedy, temperature, top-k, top-p, min_p and their
    combinations; 2 rows in 8 greedy), penalties on every third row, a seed on every other."""
    _, recipe = DECODE_RECIPES[row % len(DECODE_RECIPES)]
    kwargs: dict[str, Any] = dict(recipe)
    if row % 3 == 1:
        kwargs.update(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.5)
    if row % 2 == 1:
        kwargs["seed"] = 1000 + row
    return SamplingParams(**kwargs)


def provider_name(kind: str, device: torch.device) -> str:
    """kind: "sampler", "sampler-compiled" or "sampler-triton"; on CUDA every one of them
    is timed on graph replay, hence the "-graph" suffix."""
    return (
        f"{kind}-graph"
        if device.type == "cuda"
        else (kind if kind != "sampler" else "sampler-eager")
    )
