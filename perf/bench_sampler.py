"""The full sampling step: `Sampler` eager and compiled against a vLLM-V1-style baseline.

Case: 64 rows x vocab 128,256 (Llama 3), LLM-like logits (`graphsafe_sampler.bench.logits`),
every feature on in a realistic mix of rows (see `make_requests`): greedy, temperature,
top-k, top-p, top-k + top-p, min_p; penalties on about a third of the rows, logit bias on a
quarter, stop ids with an active min_tokens on a quarter, allowed ids on 3 rows, bad words
on 4, half the rows seeded; logprobs K = 5 in `raw_logprobs` mode. A static batch: the
churning decode step is `bench_suite.py`'s `step`. With `--gs-json` its cases are stage
`step-static`.

Providers, side by side in one process on the same inputs (docs/design.md §6):
- `clone`: `logits.clone()`, one pass over the logits, the floor;
- `sampler-eager`: `Sampler.forward`, eager;
- `sampler-compiled`: `torch.compile(sampler.forward, fullgraph=True)` with
  `compile_options("cpu")` (inductor's `cpp_wrapper`), compiled and warmed up before timing;
- `vllm-style`: `graphsafe_sampler/bench/vllm_style.py`, the way vLLM V1 does it, eager.

One round is one engine step on a static batch of 64 requests: the sampler step (the
baseline's `update_state(None)` too, which vLLM calls every step), then the engine reads the
tokens and appends them to its output lists. The Sampler commits its tokens to its device-side
history inside `forward`; the baseline reads the lists. Each provider owns its own requests and
lists, so every history advances step by step. Fresh logits come from an untimed setup (the
baseline writes into its input, as vLLM does); 4 different logits tensors take turns.

Before timing (untimed) the module checks that the implementations agree: greedy rows give
the same tokens in the Sampler and the baseline, the raw top-K logprobs match, every random
token either draws survives the baseline's filters, and the compiled Sampler gives the eager
one's tokens.

Run: python -m pytest perf/bench_sampler.py --benchmark-only
The JSON (--benchmark-json=...) carries shape, provider, torch version, threads and the
ratios (to `clone` and to `vllm-style`) in each benchmark's extra_info; a summary table is
printed after pytest-benchmark's.
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
    Sampler,
    SamplerConfig,
    SamplerOutput,
    SamplingParams,
    compile_options,
)
from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.bench.vllm_style import VllmStyleSampler
from graphsafe_sampler.bench.workload import DECODE_RECIPES
from graphsafe_sampler.testing import DriverRequest

NUM_ROWS = 64
VOCAB_SIZE = 128_256  # Llama 3
EOS_TOKEN_ID = 128_009  # Llama 3's <|eot_id|>
MAX_NUM_LOGPROBS = 5
PEAKEDNESS = 1.1
NUM_LOGITS = 4
CHECK_STEPS = 2
PROVIDERS = ("clone", "sampler-eager", "sampler-compiled", "vllm-style")
# (warm-up rounds, timed rounds): about 1.2 s a vllm-style step and 2-3 s an eager Sampler
# step on 2 cores keep the file near 2 minutes with the compile.
ROUNDS = {
    "clone": (3, 30),
    "sampler-eager": (1, 3),
    "sampler-compiled": (2, 10),
    "vllm-style": (1, 5),
}

# Per row, cycled: the CLI workload's recipes (2 of 8 rows greedy).
PROFILES = DECODE_RECIPES
ALLOWED_ROWS = {5: 16, 29: 256, 50: 4096}  # row -> allowed_token_ids length
BAD_WORDS_ROWS = (2, 17, 40, 63)


def make_requests(seed: int = 0) -> tuple[list[DriverRequest], dict[str, int]]:
    """The 64 requests of the case, mid-generation, and how many rows use each feature."""
    rng = random.Random(seed)
    vocab = VOCAB_SIZE

    def some_ids(n: int) -> list[int]:
        return rng.sample(range(vocab), n)

    # Features on fixed numbers of rows, drawn independently of the profiles.
    def rows_with(count: int) -> set[int]:
        return set(rng.sample(range(NUM_ROWS), count))

    penalty_rows, bias_rows, min_tokens_rows = rows_with(21), rows_with(16), rows_with(16)
    seeded_rows, logprobs_rows = rows_with(32), rows_with(32) | {0}
    requests = []
    counts = {name: 0 for name, _ in PROFILES}
    for row in range(NUM_ROWS):
        name, recipe = PROFILES[row % len(PROFILES)]
        counts[name] += 1
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(16, 2048))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(1, 512))]
        kwargs = dict(recipe)
        if row in penalty_rows:
            kwargs.update(
                repetition_penalty=rng.choice([1.0, 1.05, 1.1, 1.2]),
                frequency_penalty=rng.choice([0.0, 0.3, 0.5]),
                presence_penalty=rng.choice([0.0, 0.5, 1.0]),
            )
        if row in bias_rows:
            kwargs["logit_bias"] = {
                t: rng.uniform(-10.0, 10.0) for t in some_ids(rng.randint(1, 32))
            }
        if row in min_tokens_rows:
            # Active for the whole run: many more tokens to go than any provider takes steps.
            kwargs.update(stop_token_ids=some_ids(rng.randint(1, 4)), min_tokens=len(output) + 1000)
        if row in ALLOWED_ROWS:
            kwargs["allowed_token_ids"] = some_ids(ALLOWED_ROWS[row])
        if row in BAD_WORDS_ROWS:
            # Some words continue the current output, so they ban a token at the first step.
            words = [some_ids(rng.randint(1, 3)) for _ in range(rng.randint(1, 8))]
            words.append([*output[-2:], rng.randrange(vocab)])
            kwargs["bad_words_token_ids"] = words
        if row in seeded_rows:
            kwargs["seed"] = rng.randrange(2**63)
        if row in logprobs_rows:
            kwargs["logprobs"] = MAX_NUM_LOGPROBS
        requests.append(DriverRequest(SamplingParams(**kwargs), prompt, output))
    counts.update(
        penalties=len(penalty_rows),
        logit_bias=len(bias_rows),
        min_tokens=len(min_tokens_rows),
        allowed=len(ALLOWED_ROWS),
        bad_words=len(BAD_WORDS_ROWS),
        seeded=len(seeded_rows),
        logprobs=len(logprobs_rows),
    )
    return requests, counts


def make_config() -> SamplerConfig:
    return SamplerConfig(
        max_num_reqs=NUM_ROWS,
        vocab_size=VOCAB_SIZE,
        max_num_logprobs=MAX_NUM_LOGPROBS,
        logprobs_mode="raw_logprobs",
        eos_token_id=EOS_TOKEN_ID,
        seed=0,
    )


def add_all(requests: list[DriverRequest]) -> BatchUpdate:
    """One update that adds every request at its row (the output lists are live references)."""
    added = [(row, r.params, r.prompt_tok_ids, r.output_tok_ids) for row, r in enumerate(requests)]
    return BatchUpdate(len(requests), added=added)


def record_tokens(requests: list[DriverRequest], out: SamplerOutput) -> list[int]:
    """The engine's part of a step: read the tokens, append them to the output lists."""
    tokens = out.sampled_token_ids[:, 0].tolist()
    for req, token in zip(requests, tokens, strict=True):
        req.output_tok_ids.append(token)
    return tokens


def new_sampler(requests: list[DriverRequest]) -> Sampler:
    sampler = Sampler(make_config(), "cpu")
    sampler.update_state(add_all(requests))
    return sampler


def new_vllm_style(requests: list[DriverRequest]) -> VllmStyleSampler:
    baseline = VllmStyleSampler(make_config(), "cpu")
    baseline.update_state(add_all(requests))
    return baseline


@dataclass
class Case:
    logits: list[torch.Tensor]  # NUM_LOGITS x [NUM_ROWS, VOCAB_SIZE] float32
    requests: list[DriverRequest]  # pristine; each provider deep-copies them
    mix: dict[str, int]
    greedy_rows: list[int]
    check: dict[str, object] = field(default_factory=dict)


def check_agreement(case: Case) -> dict[str, object]:
    """Untimed cross-check of the eager Sampler and the baseline over CHECK_STEPS steps."""
    sampler_reqs, vllm_reqs = copy.deepcopy(case.requests), copy.deepcopy(case.requests)
    sampler, baseline = new_sampler(sampler_reqs), new_vllm_style(vllm_reqs)
    greedy = case.greedy_rows
    random_rows = [r for r in range(NUM_ROWS) if r not in set(greedy)]
    for step in range(CHECK_STEPS):
        logits = case.logits[step % NUM_LOGITS]
        processed, baseline_greedy = baseline.processed_logits(logits)
        ours = sampler(logits.clone())
        theirs = baseline(logits.clone())
        ours_tokens = record_tokens(sampler_reqs, ours)
        theirs_tokens = record_tokens(vllm_reqs, theirs)
        for row in greedy:
            assert ours_tokens[row] == theirs_tokens[row] == int(baseline_greedy[row]), (
                f"step {step}, greedy row {row}: sampler {ours_tokens[row]}, "
                f"vllm-style {theirs_tokens[row]}"
            )
        for row in random_rows:
            for who, tokens in (("sampler", ours_tokens), ("vllm-style", theirs_tokens)):
                assert processed[row, tokens[row]] > float("-inf"), (
                    f"step {step}, row {row}: {who} sampled token {tokens[row]}, which the "
                    "baseline's filters remove"
                )
        lp_ours, lp_theirs = ours.logprobs_tensors, theirs.logprobs_tensors
        assert lp_ours is not None and lp_theirs is not None
        torch.testing.assert_close(
            lp_ours.logprob_token_ids[:, 1:], lp_theirs.logprob_token_ids[:, 1:]
        )
        # torch's float32 CPU log_softmax over 128k tokens is off by up to ~5e-5 from
        # float64 (the Sampler's logits - logsumexp by ~2e-6): compare at that scale.
        close = {"rtol": 1e-4, "atol": 1e-4}
        torch.testing.assert_close(lp_ours.logprobs[:, 1:], lp_theirs.logprobs[:, 1:], **close)
        torch.testing.assert_close(lp_ours.logprobs[greedy], lp_theirs.logprobs[greedy], **close)
        torch.testing.assert_close(
            lp_ours.selected_token_ranks[greedy], lp_theirs.selected_token_ranks[greedy]
        )
    return {
        "check_steps": CHECK_STEPS,
        "greedy_rows": len(greedy),
        # the baseline's per-request generator loop runs over these
        "seeded_random_rows": len(baseline.meta.generators),
    }


@pytest.fixture(scope="module")
def case() -> Case:
    torch.manual_seed(0)  # the baseline's unseeded rows draw from torch's global generator
    logits = [
        llm_like_logits(NUM_ROWS, VOCAB_SIZE, peakedness=PEAKEDNESS, seed=seed)
        for seed in range(NUM_LOGITS)
    ]
    requests, mix = make_requests()
    greedy = [r for r, req in enumerate(requests) if req.params.is_greedy]
    built = Case(logits, requests, mix, greedy)
    built.check = check_agreement(built)
    return built


# ----------------------------------------------------------------- providers


def clone_step(case: Case) -> tuple[Callable[[torch.Tensor], object], dict]:
    return (lambda logits: logits.clone()), {}


def sampler_eager_step(case: Case) -> tuple[Callable[[torch.Tensor], object], dict]:
    requests = copy.deepcopy(case.requests)
    sampler = new_sampler(requests)

    def step(logits: torch.Tensor) -> SamplerOutput:
        out = sampler(logits)
        record_tokens(requests, out)
        return out

    return step, {}


def sampler_compiled_step(case: Case) -> tuple[Callable[[torch.Tensor], object], dict]:
    requests = copy.deepcopy(case.requests)
    sampler = new_sampler(requests)
    forward = torch.compile(sampler.forward, fullgraph=True, options=compile_options("cpu"))
    start = time.perf_counter()
    first = forward(case.logits[0].clone())  # compiles
    compile_s = time.perf_counter() - start
    record_tokens(requests, first)
    # The compiled step must give the eager step's tokens (same counter-based RNG).
    eager = new_sampler(copy.deepcopy(case.requests))(case.logits[0].clone())
    same = first.sampled_token_ids == eager.sampled_token_ids
    assert bool(same[case.greedy_rows].all()), "compiled and eager greedy tokens differ"
    assert first.logprobs_tensors is not None and eager.logprobs_tensors is not None
    torch.testing.assert_close(
        first.logprobs_tensors.logprob_token_ids[:, 1:],
        eager.logprobs_tensors.logprob_token_ids[:, 1:],
    )

    def step(logits: torch.Tensor) -> SamplerOutput:
        out = forward(logits)
        record_tokens(requests, out)
        return out

    info = {
        "compile_s": round(compile_s, 1),
        "compiled_rows_equal_to_eager": int(same.sum()),
    }
    return step, info


def vllm_style_step(case: Case) -> tuple[Callable[[torch.Tensor], object], dict]:
    requests = copy.deepcopy(case.requests)
    baseline = new_vllm_style(requests)

    def step(logits: torch.Tensor) -> SamplerOutput:
        baseline.update_state(None)  # vLLM refreshes its processors every step
        out = baseline(logits)
        record_tokens(requests, out)
        return out

    return step, {}


BUILDERS = {
    "clone": clone_step,
    "sampler-eager": sampler_eager_step,
    "sampler-compiled": sampler_compiled_step,
    "vllm-style": vllm_style_step,
}


# ----------------------------------------------------------------- summary


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> ProviderSummary:
    title = (
        f"sampling step: {NUM_ROWS} x {VOCAB_SIZE}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    return registered_plugin(
        request, "bench_sampler_summary", lambda: ProviderSummary(title, PROVIDERS)
    )


# ----------------------------------------------------------------- the benchmark


@pytest.mark.parametrize("provider", PROVIDERS)
def test_sampling_step(
    benchmark: BenchmarkFixture,
    case: Case,
    summary: ProviderSummary,
    provider: str,
    gs_record: Callable[..., None],
) -> None:
    step, info = BUILDERS[provider](case)
    load_before = os.getloadavg()[0]
    turn = iter(range(10**9))

    def fresh_logits() -> tuple[tuple[torch.Tensor], dict]:
        # Untimed: the baseline writes into its input; every provider gets a fresh copy.
        return (case.logits[next(turn) % NUM_LOGITS].clone(),), {}

    warmup, rounds = ROUNDS[provider]
    benchmark.group = f"sampling step {NUM_ROWS}x{VOCAB_SIZE}"
    benchmark.pedantic(step, setup=fresh_logits, rounds=rounds, warmup_rounds=warmup, iterations=1)
    if benchmark.stats is None:  # --benchmark-disable: one untimed call, a smoke test
        return
    benchmark.extra_info.update(
        provider=provider,
        num_rows=NUM_ROWS,
        vocab_size=VOCAB_SIZE,
        logits=f"llm_like_logits(peakedness={PEAKEDNESS})",
        max_num_logprobs=MAX_NUM_LOGPROBS,
        logprobs_mode="raw_logprobs",
        **timing_info(benchmark, load_before, rounds),
        row_mix=case.mix,
        **case.check,
        **info,
    )
    summary.record(provider, benchmark)
    # `--gs-json`: stage "step-static" (a static batch, every feature on; the churning
    # decode step is bench_suite.py's "step").
    gs_record(
        benchmark,
        stage="step-static",
        provider=provider,
        rows=NUM_ROWS,
        vocab=VOCAB_SIZE,
        dtype=torch.float32,
        extra=info,
    )
