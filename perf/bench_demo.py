"""The demo's continuous-batching loop as a benchmark: model + sampler, eager against compiled.

Case: the `graphsafe-sampler demo` defaults (`graphsafe_sampler/demo/`): a tiny random-weight
decoder (2 layers, width 64, vocab 4,099) and a `Sampler` serving a stream of requests with
mixed parameters (greedy, temperature, top-k, top-p, min_p, penalties, logit bias, stop ids
with min_tokens, EOS, bad words, ignore_eos; half of the sampled ones seeded) that arrive
and finish over `NUM_STEPS` decode steps in a persistent batch of 16 rows, padded to buckets
2/4/8/16. One round serves the whole stream: host bookkeeping, prefill, `update_state`, the
decode step, reading the tokens.

Providers, side by side in one process on the same stream (docs/design.md, performance):
- `eager`: `decode_step` (model forward + `Sampler.forward`) eagerly;
- `compiled`: the same function under `torch.compile(fullgraph=True)`, the batch dimension
  marked dynamic so one compile serves every bucket; compiled and warmed up untimed.

Every round starts from a fresh sampler and engine (untimed setup). Before timing, the
module checks (untimed) that both providers produce the same tokens at every step and that
the compiled loop does not recompile.

Run: python -m pytest perf/bench_demo.py --benchmark-only
The JSON (--benchmark-json=...) carries tokens/s, ms per step (p20/p50/p80 of the decode
steps), the compile time and the speed-up over `eager` in each benchmark's extra_info; a
summary table is printed after pytest-benchmark's.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture
from summary import registered_plugin

from graphsafe_sampler.demo import (
    DemoOptions,
    DemoSetup,
    Engine,
    RunResult,
    build_setup,
    compiled_graphs,
    first_difference,
    prepare_engine,
    torch_threads,
)

NUM_STEPS = 96
PROVIDERS = ("eager", "compiled")
# (warm-up rounds, timed rounds): a round is NUM_STEPS decode steps, about 3-5 s eager and
# 1-3 s compiled on 2 cores.
ROUNDS = {"eager": (1, 3), "compiled": (1, 5)}
OPTIONS = DemoOptions(steps=NUM_STEPS, device="cpu")


@dataclass
class Case:
    setup: DemoSetup
    compile_s: float
    check: dict[str, object]


@pytest.fixture(scope="module")
def threads() -> Iterator[None]:
    # One intra-op thread, as the demo runs: its ops are tiny, and a second OpenMP thread
    # costs more in hand-offs than it saves (many times more on a busy host).
    with torch_threads(OPTIONS.threads):
        yield


@pytest.fixture(scope="module")
def case(threads: None) -> Case:
    setup = build_setup(OPTIONS, PROVIDERS)
    # Untimed: the first compiled engine's warm-up is the compile; then both providers serve
    # the stream once and must agree step by step, with no recompile in the loop.
    graphs = compiled_graphs()
    start = time.perf_counter()
    compiled_engine = prepare_engine(setup, "compiled")
    compile_s = time.perf_counter() - start
    compiled = compiled_engine.run(setup.stream, NUM_STEPS, "compiled")
    eager = prepare_engine(setup, "eager").run(setup.stream, NUM_STEPS, "eager")
    diff = first_difference(eager, compiled)
    assert diff is None, diff
    assert not eager.violations and not compiled.violations, eager.violations + compiled.violations
    assert compiled_graphs() - graphs == 1, "the compiled loop compiled more than one graph"
    check = {
        "requests": len(setup.stream),
        "tokens_per_round": eager.num_tokens,
        "steps_per_bucket": dict(sorted(eager.bucket_steps.items())),
        "batch_changes": dict(eager.batch_changes),
        "tokens_identical": True,
    }
    return Case(setup, compile_s, check)


class _Summary:
    """Medians by provider; the speed-up over eager goes into every benchmark's extra_info
    as results come in, and a table prints at the end."""

    name = "bench_demo_summary"

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, float]] = {}
        self.benchmarks: dict[str, BenchmarkFixture] = {}

    def record(self, provider: str, benchmark: BenchmarkFixture, row: dict[str, float]) -> None:
        self.rows[provider] = row
        self.benchmarks[provider] = benchmark
        eager = self.rows.get("eager")
        for name, bench in self.benchmarks.items():
            bench.extra_info["speedup_vs_eager"] = (
                None if eager is None else round(eager["round_s"] / self.rows[name]["round_s"], 2)
            )

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.rows:
            return
        eager = self.rows.get("eager")
        write = terminalreporter.write_line
        terminalreporter.section(
            f"demo loop: {NUM_STEPS} steps, vocab {OPTIONS.vocab}, buckets "
            f"{'/'.join(map(str, OPTIONS.buckets))}, torch {torch.__version__}, "
            f"{OPTIONS.threads} thread(s)"
        )
        write(f"{'provider':<12}{'round s':>10}{'tokens/s':>11}{'step ms':>10}{'speed-up':>10}")
        for name in PROVIDERS:
            if name not in self.rows:
                continue
            row = self.rows[name]
            speedup = f"{eager['round_s'] / row['round_s']:.2f}x" if eager else "-"
            write(
                f"{name:<12}{row['round_s']:>10.2f}{row['tokens_per_s']:>11.1f}"
                f"{row['step_ms']:>10.2f}{speedup:>10}"
            )


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> _Summary:
    return registered_plugin(request, _Summary.name, _Summary)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_demo_loop(
    benchmark: BenchmarkFixture, case: Case, summary: _Summary, provider: str
) -> None:
    results: list[RunResult] = []

    def fresh_engine() -> tuple[tuple[Engine], dict]:
        # Untimed: a fresh sampler (same seed) and engine, warmed up on every bucket.
        return (prepare_engine(case.setup, provider),), {}

    def serve(engine: Engine) -> None:
        results.append(engine.run(case.setup.stream, NUM_STEPS, provider))

    load_before = os.getloadavg()[0]
    warmup, rounds = ROUNDS[provider]
    benchmark.group = f"demo loop {NUM_STEPS} steps, vocab {OPTIONS.vocab}"
    benchmark.pedantic(serve, setup=fresh_engine, rounds=rounds, warmup_rounds=warmup, iterations=1)
    if benchmark.stats is None:  # --benchmark-disable: one untimed call, a smoke test
        return
    step_ms = np.asarray([s for r in results for s in r.step_seconds], dtype=np.float64) * 1e3
    round_s = float(np.median(benchmark.stats.stats.data))
    tokens = results[-1].num_tokens
    row = {
        "round_s": round_s,
        "tokens_per_s": tokens / round_s,
        "step_ms": float(np.median(step_ms)),
    }
    benchmark.extra_info.update(
        provider=provider,
        num_steps=NUM_STEPS,
        vocab_size=OPTIONS.vocab,
        max_num_reqs=OPTIONS.max_num_reqs,
        buckets=list(OPTIONS.buckets),
        torch_version=torch.__version__,
        torch_threads=torch.get_num_threads(),
        # Other processes on the host inflate times; the 1-minute load says how busy it was.
        load_avg_1min=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        rounds=rounds,
        tokens_per_s=round(row["tokens_per_s"], 1),
        step_ms_p20=round(float(np.percentile(step_ms, 20)), 3),
        step_ms_median=round(statistics.median(step_ms.tolist()), 3),
        step_ms_p80=round(float(np.percentile(step_ms, 80)), 3),
        compile_s=round(case.compile_s, 1) if provider == "compiled" else None,
        **case.check,
    )
    summary.record(provider, benchmark, row)
