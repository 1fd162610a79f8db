"""Soak check: thousands of compiled decode steps under churn on a CPU, and no memory growth.

A `Sampler` with a small vocabulary (8 rows x vocab 1,000 by default) and every feature
reachable (logprobs, penalties, logit bias, allowed ids, bad words, min_tokens, stop ids,
seeds, a grammar bitmask) runs under `torch.compile(sampler.forward, fullgraph=True)`, as the
decode benchmark compiles it. Each step is an engine step: `update_state` with
`BatchDriver`'s next random update (its default random parameters and churn), a grammar
bitmask on some rows, `forward` on fresh LLM-like logits, and the sampled tokens appended to
the requests' output lists. After a warm-up (the first 10% of the steps), evenly spaced
samples read the process RSS and torch's live tensor bytes. The verdict:

- live tensor bytes: no sample may exceed the first one (limit 0 bytes). The walk is exact
  and every sample is taken at the same point of a step, so any tensor kept per step shows;
- RSS: the last sample may exceed the first by at most `RSS_GROWTH_LIMIT_BYTES` (the
  measured noise is beside it). RSS catches leaks outside torch too (Python objects, host
  buffers), but malloc serves new blocks from free memory the heap already keeps resident
  first, so a leak shows only once it has outgrown that: little in a fresh process such as
  this script's, possibly hundreds of MB in a test process after other tests.

Run: python perf/bench_soak.py --steps 10000   (table and verdict; exit 1 on growth)
     python -m pytest perf/bench_soak.py --benchmark-only   (the same as one benchmark case)
Tests: tests/test_soak.py runs a few hundred steps and checks that injected leaks are caught;
GS_SOAK_STEPS=10000 there runs the whole soak as an opt-in slow test.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from graphsafe_sampler import Sampler, SamplerConfig, SamplerOutput
from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.bitmask import num_words
from graphsafe_sampler.testing import BatchDriver

if TYPE_CHECKING:
    from pytest_benchmark.fixture import BenchmarkFixture

VOCAB_SIZE = 1_000
MAX_NUM_REQS = 8
MAX_NUM_LOGPROBS = 5
DEFAULT_STEPS = 10_000
DEFAULT_SAMPLES = 21
MB = 2**20
LIVE_TENSOR_GROWTH_LIMIT_BYTES = 0
RSS_GROWTH_LIMIT_BYTES = 2 * MB
"""Measured here (torch 2.13 CPU, Python 3.11, glibc): after warm-up RSS grew by at most
0.07 MB (one 64 KiB heap extension) over 45,000 steps, 0.03 MB over a 270-step window and
0.00 MB over the 9,000 steps of the default run. 2 MB is 30 times that, and over the default
run's window still catches a leak of 230 bytes a step."""

StepHook = Callable[[SamplerOutput], None]


def soak_config(vocab_size: int = VOCAB_SIZE, max_num_reqs: int = MAX_NUM_REQS) -> SamplerConfig:
    """Every feature reachable: logprobs on, an EOS for min_tokens, small per-request
    capacities so that `random_sampling_params` fills them now and then."""
    return SamplerConfig(
        max_num_reqs=max_num_reqs,
        vocab_size=vocab_size,
        max_num_logprobs=MAX_NUM_LOGPROBS,
        eos_token_id=2,
        seed=0,
        max_logit_bias_tokens=8,
        max_stop_token_ids=4,
        max_bad_word_len=4,
    )


def process_rss_bytes() -> int:
    """The process's resident set now: VmRSS of /proc/self/status (Linux).
    `resource.getrusage` gives only the peak, which never falls, so it cannot tell a plateau
    from growth."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError("no VmRSS in /proc/self/status")


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages behind every tensor the Python heap holds.

    CPU torch keeps no allocator statistics (there is no CPU `torch.cuda.memory_allocated`),
    so walk the objects the garbage collector tracks, which include every tensor object.
    Views and aliases share a storage: each storage counts once, by its data pointer. A
    tensor that only C++ holds is invisible here; RSS would show it.
    """
    gc.collect()  # unreachable cycles are garbage awaiting collection, not leaks
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        # type(), not isinstance: isinstance reads `__class__`, which some deprecated module
        # attributes (torch.distributed.reduce_op) answer with a warning.
        if not issubclass(type(obj), torch.Tensor):
            continue
        storage = obj.untyped_storage()
        # Meta storage holds no memory: the FakeTensors that tracing leaves in the compiled
        # graph's metadata (hundreds of MB of them by shape alone) live there.
        if storage.device.type == "meta":
            continue
        ptr = storage.data_ptr()
        storages[ptr] = max(storages.get(ptr, 0), storage.nbytes())
    return sum(storages.values())


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread, restored afterwards: on a shared 2-core host, OpenMP regions over
    these tiny tensors wait on descheduled workers (a 3 ms step took 130 ms with 2 threads
    at load 6); the memory figures do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class SoakRig:
    """A compiled CPU Sampler and the engine around it; `step` runs one decode step."""

    sampler: Sampler
    forward: Callable[[torch.Tensor], SamplerOutput]
    driver: BatchDriver
    counter: CompileCounterWithBackend
    rng: np.random.Generator
    compile_s: float = 0.0
    steps_done: int = 0

    def step(self, on_step: StepHook | None = None) -> None:
        config = self.sampler.config
        self.sampler.update_state(self.driver.next_update())
        # A grammar bitmask on a few random rows (random bits, about half the vocabulary
        # allowed), so that the staged path runs with changing rows step after step.
        rows = sorted(self.rng.choice(config.max_num_reqs, self.rng.integers(0, 3), replace=False))
        bits = self.rng.integers(-(2**31), 2**31, (len(rows), num_words(config.vocab_size)))
        self.sampler.stage_grammar_bitmask(bits.astype(np.int32), rows=rows)
        # Every row, padding included: a fixed shape, as a captured CUDA graph would run.
        logits = llm_like_logits(config.max_num_reqs, config.vocab_size, seed=self.steps_done)
        out = self.forward(logits)
        self.driver.record_tokens(out.sampled_token_ids[:, 0].tolist())
        if on_step is not None:
            on_step(out)
        self.steps_done += 1


def build_rig(config: SamplerConfig, *, seed: int = 0, compiled: bool = True) -> SoakRig:
    """A Sampler on the CPU, compiled with inductor by its first step (timed). With
    `compiled=False` the step runs eagerly (the CI tests: a cold compile takes a minute or
    more on 2 cores, and the measurement is the same); the counter then stays at 0 frames."""
    # As graphsafe_sampler.bench.providers does: a fresh Dynamo cache per compiled sampler,
    # so that guards of earlier samplers in the process neither pile up nor count here.
    torch._dynamo.reset()
    sampler = Sampler(config, "cpu")
    counter = CompileCounterWithBackend("inductor")
    forward: Callable[[torch.Tensor], SamplerOutput] = sampler.forward
    if compiled:
        forward = torch.compile(sampler.forward, fullgraph=True, backend=counter)
    rig = SoakRig(
        sampler, forward, BatchDriver(config, seed=seed), counter, np.random.default_rng(seed)
    )
    start = time.perf_counter()
    with one_torch_thread():
        rig.step()
    rig.compile_s = time.perf_counter() - start
    return rig


@dataclass(frozen=True)
class SoakResult:
    """Memory samples after warm-up: at `sample_steps` (steps done in this run)."""

    steps: int
    warmup: int
    step_s: float  # the steps alone, memory samples excluded
    compile_frames: int  # Dynamo frames compiled so far: 1 unless the churn recompiled
    sample_steps: list[int] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    live_tensor_bytes: list[int] = field(default_factory=list)
    rss_limit_bytes: int = RSS_GROWTH_LIMIT_BYTES
    live_tensor_limit_bytes: int = LIVE_TENSOR_GROWTH_LIMIT_BYTES

    @property
    def rss_growth(self) -> int:
        return self.rss_bytes[-1] - self.rss_bytes[0]

    @property
    def live_tensor_growth(self) -> int:
        # The largest sample, not the last: a tensor kept for a while and then freed is a
        # leak too, and at a fixed point of the step the live set is exactly the same.
        return max(self.live_tensor_bytes) - self.live_tensor_bytes[0]

    @property
    def passed(self) -> bool:
        return (
            self.rss_growth <= self.rss_limit_bytes
            and self.live_tensor_growth <= self.live_tensor_limit_bytes
        )

    def report(self) -> str:
        lines = [f"{'step':>8}  {'RSS MB':>9}  {'live tensor MB':>14}  {'live tensor bytes':>17}"]
        for step, rss, live in zip(
            self.sample_steps, self.rss_bytes, self.live_tensor_bytes, strict=True
        ):
            lines.append(f"{step:>8}  {rss / MB:>9.2f}  {live / MB:>14.4f}  {live:>17,}")

        def verdict(ok: bool) -> str:
            return "ok" if ok else "GROWTH"

        rss_ok = self.rss_growth <= self.rss_limit_bytes
        live_ok = self.live_tensor_growth <= self.live_tensor_limit_bytes
        ms = self.step_s / self.steps * 1e3
        lines += [
            f"{self.steps:,} steps in {self.step_s:.1f} s ({ms:.2f} ms/step), warm-up "
            f"{self.warmup:,} steps, compiled frames {self.compile_frames}",
            f"RSS growth (last - first sample): {self.rss_growth / MB:+.2f} MB, "
            f"limit {self.rss_limit_bytes / MB:.2f} MB: {verdict(rss_ok)}",
            f"live tensor growth (max - first sample): {self.live_tensor_growth:+,} bytes, "
            f"limit {self.live_tensor_limit_bytes:,} bytes: {verdict(live_ok)}",
            "verdict: " + ("no growth" if self.passed else "MEMORY GROWS"),
        ]
        return "\n".join(lines)


def run_soak(
    rig: SoakRig,
    steps: int,
    *,
    warmup: int | None = None,
    samples: int = DEFAULT_SAMPLES,
    on_step: StepHook | None = None,
) -> SoakResult:
    """`steps` decode steps on `rig`; after `warmup` steps (default a tenth), `samples`
    evenly spaced memory samples, the first right after the warm-up and the last after the
    last step. `on_step` sees each step's output (the tests leak through it)."""
    warmup = steps // 10 if warmup is None else warmup
    if not 0 <= warmup < steps or samples < 2:
        raise ValueError(f"need 0 <= warmup < steps and samples >= 2: {warmup}, {steps}, {samples}")
    at = {int(s) for s in np.linspace(warmup, steps, samples).round()}
    sample_steps: list[int] = []
    rss: list[int] = []
    live: list[int] = []
    step_s = 0.0
    with one_torch_thread():
        # An untimed walk first: its list of every object (MBs) moves glibc's dynamic mmap
        # threshold when freed, so the heap grows once by about that much, in warm-up.
        live_tensor_bytes()
        for done in range(steps + 1):
            if done in at:
                live.append(live_tensor_bytes())  # collects garbage first, so before RSS
                rss.append(process_rss_bytes())
                sample_steps.append(done)
            if done < steps:
                start = time.perf_counter()
                rig.step(on_step)
                step_s += time.perf_counter() - start
    return SoakResult(
        steps=steps,
        warmup=warmup,
        step_s=step_s,
        compile_frames=rig.counter.frame_count,
        sample_steps=sample_steps,
        rss_bytes=rss,
        live_tensor_bytes=live,
    )


def test_soak(benchmark: BenchmarkFixture) -> None:
    """The whole soak as one round, timed without the compile (memory samples included;
    `ms_per_step` in extra_info is the steps alone)."""
    rig = build_rig(soak_config())
    benchmark.group = "soak"
    result = benchmark.pedantic(run_soak, args=(rig, DEFAULT_STEPS), rounds=1, iterations=1)
    benchmark.extra_info.update(
        steps=result.steps,
        ms_per_step=round(result.step_s / result.steps * 1e3, 3),
        compile_s=round(rig.compile_s, 1),
        rss_mb=[round(b / MB, 2) for b in result.rss_bytes],
        live_tensor_bytes=result.live_tensor_bytes,
        rss_growth_mb=round(result.rss_growth / MB, 3),
        live_tensor_growth_bytes=result.live_tensor_growth,
    )
    assert result.passed, result.report()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--warmup", type=int, default=None, help="default: a tenth of --steps")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--vocab", type=int, default=VOCAB_SIZE)
    parser.add_argument("--rows", type=int, default=MAX_NUM_REQS)
    args = parser.parse_args(argv)
    config = soak_config(args.vocab, args.rows)
    print(
        f"soak: Sampler, torch.compile(fullgraph=True), CPU, {config.max_num_reqs} rows x "
        f"vocab {config.vocab_size:,}, {args.steps:,} steps, torch {torch.__version__}, "
        "1 intra-op thread",
        flush=True,
    )
    wall = time.perf_counter()
    rig = build_rig(config)
    print(f"compiled in {rig.compile_s:.1f} s", flush=True)
    result = run_soak(rig, args.steps, warmup=args.warmup, samples=args.samples)
    print(result.report())
    print(f"wall time {time.perf_counter() - wall:.1f} s")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
