"""Speculative decoding's verification step: `RejectionSampler` compiled against a
vLLM-V1-style eager implementation of the same rule.

Case: 64 rows, max_spec_len S = 4, vocab 128,256 (Llama 3): target logits `[64, 5, V]` from
`llm_like_logits`, a draft model's probabilities `[64, 4, V]` (the target's logits plus
Gaussian noise of standard deviation `DRAFT_NOISE`, softmaxed) and drafts sampled from them
(untimed), 4 drafts on most rows and 0-3 on every eighth. Rows cycle through greedy,
temperature, top-k, top-p, top-k + top-p, min_p and top-k + top-p + min_p; penalties on
about a third of the rows and half the rows seeded. Features this case leaves off (logit
bias, allowed ids, bad words, min_tokens, grammar) cost the RejectionSampler their fixed
per-row work either way.

Providers, side by side in one process on the same inputs (docs/design.md §6):
- `clone`: `target_logits.clone()`, one pass over the target logits, the floor;
- `rejection-compiled`: `torch.compile(RejectionSampler(...), fullgraph=True)` with
  `compile_options("cpu")`, compiled and warmed up untimed; it commits each row's tokens to
  the device-side history in the step;
- `vllm-style`: `graphsafe_sampler.bench.vllm_style.VllmStyleRejectionSampler`, the way vLLM
  V1 does it, eager: penalty
  tensors rebuilt every step from the host-side output lists (each position's list extended
  by the drafts before it), sort-based top-k/top-p, softmax target probabilities for every
  position, uniforms and exponentials drawn through a per-request `torch.Generator` loop for
  seeded requests, recovered tokens computed at every draft position, the bonus token
  sampled separately.

One round is one engine step on a static batch of 64 requests: the verification, then the
engine reads the outputs and appends each row's tokens to its output lists (the baseline
rebuilds its penalties from those lists). Each provider owns its requests, so every history
advances step by step. Inputs come from an untimed setup; `NUM_INPUTS` sets take turns.

Before timing (untimed) the module checks agreement over `CHECK_STEPS` steps: greedy rows
give the same outputs in both implementations, and every token either side emits for a
random row survives the baseline's filters at its position.

Run: python -m pytest perf/bench_rejection.py --benchmark-only
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture
from summary import ProviderSummary, registered_plugin, timing_info

from graphsafe_sampler import (
    BatchUpdate,
    RejectionSampler,
    RejectionSamplerOutput,
    Sampler,
    SamplerConfig,
    SamplingParams,
    compile_options,
)
from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.bench.vllm_style import VllmStyleRejectionSampler
from graphsafe_sampler.bench.workload import DECODE_RECIPES
from graphsafe_sampler.kernels.constants import GREEDY_TEMPERATURE
from graphsafe_sampler.testing import DriverRequest

NUM_ROWS = 64
MAX_SPEC_LEN = 4
VOCAB_SIZE = 128_256  # Llama 3
PEAKEDNESS = 1.1
DRAFT_NOISE = 1.0
NUM_INPUTS = 2
CHECK_STEPS = 2
PROVIDERS = ("clone", "rejection-compiled", "vllm-style")
ROUNDS = {  # (warm-up rounds, timed rounds)
    "clone": (3, 30),
    "rejection-compiled": (2, 8),
    "vllm-style": (1, 4),
}
# Per row, cycled: the CLI workload's recipes (2 of 8 rows greedy).
PROFILES = DECODE_RECIPES


def make_requests(seed: int = 0) -> tuple[list[DriverRequest], dict[str, int]]:
    """The 64 requests, mid-generation, and how many rows use each feature."""
    rng = random.Random(seed)
    penalty_rows = set(rng.sample(range(NUM_ROWS), 21))
    seeded_rows = set(rng.sample(range(NUM_ROWS), 32))
    requests, mix = [], {name: 0 for name, _ in PROFILES}
    for row in range(NUM_ROWS):
        name, recipe = PROFILES[row % len(PROFILES)]
        mix[name] += 1
        kwargs = dict(recipe)
        if row in penalty_rows:
            kwargs.update(
                repetition_penalty=rng.choice([1.0, 1.05, 1.1, 1.2]),
                frequency_penalty=rng.choice([0.0, 0.3, 0.5]),
                presence_penalty=rng.choice([0.0, 0.5, 1.0]),
            )
        if row in seeded_rows:
            kwargs["seed"] = rng.randrange(2**63)
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(16, 2048))]
        output = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(1, 512))]
        requests.append(DriverRequest(SamplingParams(**kwargs), prompt, output))
    mix.update(penalties=len(penalty_rows), seeded=len(seeded_rows))
    return requests, mix


@dataclass
class StepInputs:
    target_logits: torch.Tensor  # [NUM_ROWS, S + 1, V] float32
    draft_token_ids: torch.Tensor  # [NUM_ROWS, S] int64
    num_draft_tokens: torch.Tensor  # [NUM_ROWS] int64
    draft_probs: torch.Tensor  # [NUM_ROWS, S, V] float32

    def fresh(self) -> tuple[torch.Tensor, ...]:
        # The baseline writes into its inputs, as vLLM does: every round gets copies.
        return (
            self.target_logits.clone(),
            self.draft_token_ids.clone(),
            self.num_draft_tokens.clone(),
            self.draft_probs.clone(),
        )


def make_inputs(seed: int) -> StepInputs:
    """One step's target logits and a draft model's proposals (a noisy copy of the target)."""
    positions = MAX_SPEC_LEN + 1
    flat = llm_like_logits(NUM_ROWS * positions, VOCAB_SIZE, peakedness=PEAKEDNESS, seed=seed)
    target = flat.view(NUM_ROWS, positions, VOCAB_SIZE)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(NUM_ROWS, MAX_SPEC_LEN, VOCAB_SIZE, generator=gen) * DRAFT_NOISE
    draft_probs = torch.softmax(target[:, :MAX_SPEC_LEN] + noise, dim=-1)
    drafts = torch.multinomial(draft_probs.view(-1, VOCAB_SIZE), 1, generator=gen)
    num = torch.full((NUM_ROWS,), MAX_SPEC_LEN, dtype=torch.int64)
    num[::8] = torch.arange(NUM_ROWS // 8) % MAX_SPEC_LEN
    return StepInputs(target, drafts.view(NUM_ROWS, MAX_SPEC_LEN), num, draft_probs)


def record_tokens(requests: list[DriverRequest], out: RejectionSamplerOutput) -> None:
    """The engine's part of a step: read the outputs, append each row's tokens."""
    tokens, accepted = out.output_token_ids.tolist(), out.num_accepted.tolist()
    for req, row, count in zip(requests, tokens, accepted, strict=True):
        req.output_tok_ids.extend(row[: count + 1])


# ----------------------------------------------------------------- case and agreement


def make_config() -> SamplerConfig:
    return SamplerConfig(max_num_reqs=NUM_ROWS, vocab_size=VOCAB_SIZE, seed=0)


def new_rejection_sampler(requests: list[DriverRequest]) -> RejectionSampler:
    sampler = Sampler(make_config(), "cpu")
    rejection = RejectionSampler(sampler, MAX_SPEC_LEN)
    added = [(row, r.params, r.prompt_tok_ids, r.output_tok_ids) for row, r in enumerate(requests)]
    sampler.update_state(BatchUpdate(len(requests), added=added))
    return rejection


@dataclass
class Case:
    inputs: list[StepInputs]
    requests: list[DriverRequest]  # pristine; each provider deep-copies them
    mix: dict[str, int]
    greedy_rows: list[int]
    check: dict[str, object] = field(default_factory=dict)
    # (compiled RejectionSampler, its live requests), set by check_agreement
    compiled: tuple[Callable[..., RejectionSamplerOutput], list[DriverRequest]] | None = None


def check_agreement(case: Case) -> dict[str, object]:
    """Untimed: the compiled RejectionSampler against the baseline over CHECK_STEPS steps.

    Compiles the RejectionSampler (once per process) and leaves it, mid-run with its own
    requests, in `case.compiled` for the timed provider.
    """
    ours_reqs, theirs_reqs = copy.deepcopy(case.requests), copy.deepcopy(case.requests)
    compiled = torch.compile(
        new_rejection_sampler(ours_reqs), fullgraph=True, options=compile_options("cpu")
    )
    baseline = VllmStyleRejectionSampler(theirs_reqs, VOCAB_SIZE, MAX_SPEC_LEN)
    greedy = set(case.greedy_rows)
    accepted = {"rejection-compiled": 0, "vllm-style": 0}
    compile_s = 0.0
    for step in range(CHECK_STEPS):
        inputs = case.inputs[step % NUM_INPUTS]
        drafts = inputs.draft_token_ids.tolist()
        # The random rows' histories differ between the two sides: judge each side's
        # tokens by the baseline's filters over its own history.
        judge = VllmStyleRejectionSampler(copy.deepcopy(ours_reqs), VOCAB_SIZE, MAX_SPEC_LEN)
        filtered = {
            "rejection-compiled": judge.processed_logits(inputs.target_logits.clone(), drafts)[0],
            "vllm-style": baseline.processed_logits(inputs.target_logits.clone(), drafts)[0],
        }
        start = time.perf_counter()
        ours = compiled(*inputs.fresh())
        if step == 0:
            compile_s = time.perf_counter() - start
        theirs = baseline(*inputs.fresh())
        for who, out in (("rejection-compiled", ours), ("vllm-style", theirs)):
            view = filtered[who].view(NUM_ROWS, MAX_SPEC_LEN + 1, VOCAB_SIZE)
            counts = out.num_accepted.tolist()
            accepted[who] += sum(counts)
            for row in sorted(set(range(NUM_ROWS)) - greedy):
                for j in range(counts[row] + 1):
                    token = int(out.output_token_ids[row, j])
                    assert view[row, j, token] > float("-inf"), (
                        f"step {step}, row {row}, position {j}: {who} emitted {token}, which "
                        "the baseline's filters remove"
                    )
        for row in greedy:
            assert ours.output_token_ids[row].tolist() == theirs.output_token_ids[row].tolist(), (
                f"step {step}, greedy row {row}"
            )
        record_tokens(ours_reqs, ours)
        record_tokens(theirs_reqs, theirs)
    case.compiled = (compiled, ours_reqs)
    return {
        "check_steps": CHECK_STEPS,
        "greedy_rows": len(greedy),
        "compile_s": round(compile_s, 1),
        "accepted_drafts_per_step": {k: v / CHECK_STEPS for k, v in accepted.items()},
    }


@pytest.fixture(scope="module")
def case() -> Case:
    torch.manual_seed(0)  # the baseline's unseeded rows draw from torch's global generator
    inputs = [make_inputs(seed) for seed in range(NUM_INPUTS)]
    requests, mix = make_requests()
    greedy = [r for r, req in enumerate(requests) if req.params.temperature < GREEDY_TEMPERATURE]
    built = Case(inputs, requests, mix, greedy)
    built.check = check_agreement(built)
    return built


# ----------------------------------------------------------------- providers

Step = Callable[..., object]


def clone_step(case: Case) -> tuple[Step, dict]:
    return (lambda target_logits, *_: target_logits.clone()), {}


def rejection_compiled_step(case: Case) -> tuple[Step, dict]:
    assert case.compiled is not None
    forward, requests = case.compiled  # compiled and checked by `check_agreement`

    def step(*inputs: torch.Tensor) -> RejectionSamplerOutput:
        out = forward(*inputs)
        record_tokens(requests, out)
        return out

    return step, {}


def vllm_style_step(case: Case) -> tuple[Step, dict]:
    requests = copy.deepcopy(case.requests)
    baseline = VllmStyleRejectionSampler(requests, VOCAB_SIZE, MAX_SPEC_LEN)

    def step(*inputs: torch.Tensor) -> RejectionSamplerOutput:
        out = baseline(*inputs)
        record_tokens(requests, out)
        return out

    return step, {"seeded_random_rows": len(baseline.generators)}


BUILDERS = {
    "clone": clone_step,
    "rejection-compiled": rejection_compiled_step,
    "vllm-style": vllm_style_step,
}


# ----------------------------------------------------------------- summary


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> ProviderSummary:
    title = (
        f"rejection step: {NUM_ROWS} x (S = {MAX_SPEC_LEN}) x {VOCAB_SIZE}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    return registered_plugin(
        request, "bench_rejection_summary", lambda: ProviderSummary(title, PROVIDERS)
    )


# ----------------------------------------------------------------- the benchmark


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rejection_step(
    benchmark: BenchmarkFixture,
    case: Case,
    summary: ProviderSummary,
    provider: str,
    gs_record: Callable[..., None],
) -> None:
    step, info = BUILDERS[provider](case)
    load_before = os.getloadavg()[0]
    turn = iter(range(10**9))

    def fresh_inputs() -> tuple[tuple[torch.Tensor, ...], dict]:
        return case.inputs[next(turn) % NUM_INPUTS].fresh(), {}

    warmup, rounds = ROUNDS[provider]
    benchmark.group = f"rejection step {NUM_ROWS}x{MAX_SPEC_LEN + 1}x{VOCAB_SIZE}"
    benchmark.pedantic(step, setup=fresh_inputs, rounds=rounds, warmup_rounds=warmup, iterations=1)
    if benchmark.stats is None:  # --benchmark-disable: one untimed call, a smoke test
        return
    benchmark.extra_info.update(
        provider=provider,
        num_rows=NUM_ROWS,
        max_spec_len=MAX_SPEC_LEN,
        vocab_size=VOCAB_SIZE,
        logits=f"llm_like_logits(peakedness={PEAKEDNESS}), draft noise {DRAFT_NOISE}",
        **timing_info(benchmark, load_before, rounds),
        row_mix=case.mix,
        **case.check,
        **info,
    )
    summary.record(provider, benchmark)
    # `--gs-json`: rows counts logits rows (requests x positions), so that GB/s and the
    # clone floor of the same shape read the [64 * 5, V] target logits.
    gs_record(
        benchmark,
        stage="rejection",
        provider=provider,
        rows=NUM_ROWS * (MAX_SPEC_LEN + 1),
        vocab=VOCAB_SIZE,
        dtype=torch.float32,
        extra={"requests": NUM_ROWS, "max_spec_len": MAX_SPEC_LEN},
    )
