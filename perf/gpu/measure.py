"""What the benchmark parts share: the timer (graph replay on CUDA), the logits, the
Samplers loaded with a case's requests, and the floor."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from graphsafe_sampler import BatchUpdate, RejectionSampler, Sampler, SamplerConfig
from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.bench.results import FLOOR_PROVIDER
from graphsafe_sampler.bench.timing import time_rounds

from .book import BenchBook, case_result
from .cases import BIAS_ENTRIES, OUTPUT_LEN, PROMPT_LEN, READ_FLOOR, bench_params
from .device import sync
from .report import error_text
from .targets import Target, sampler_or_reason

MAX_FAILURES_IN_A_ROW = 3
"""A provider that failed this many times in a row is not tried again in its part."""


class Timer:
    """`triton.testing.do_bench_cudagraph` on CUDA (the call captured n times in one graph,
    median of 10 replays), the wall-clock median of `rounds` calls on the CPU."""

    def __init__(self, device: torch.device, rep_ms: int, cpu_rounds: int) -> None:
        self.device = device
        self.rep_ms = rep_ms
        self.cpu_rounds = cpu_rounds
        self.name = "do_bench_cudagraph" if device.type == "cuda" else "wall-clock median"

    def __call__(
        self, fn: Callable[[], object], *, fallback: bool = False, eager: bool = False
    ) -> tuple[tuple[float, float, float], int, dict[str, Any]]:
        """((median, p20, p80) µs, rounds, notes). fallback: when the capture fails, time
        eagerly with `triton.testing.do_bench` instead of raising (for peers); eager: time
        with `do_bench` from the start (a peer that syncs with the host cannot be captured)."""
        if self.device.type != "cuda":
            timing = time_rounds(lambda: fn(), lambda: (), rounds=self.cpu_rounds, warmup=1)
            return (timing.median_us, timing.p20_us, timing.p80_us), timing.rounds, {}
        from triton.testing import do_bench, do_bench_cudagraph

        quantiles = [0.5, 0.2, 0.8]
        if eager:
            ms = do_bench(fn, rep=self.rep_ms, quantiles=quantiles)
            return (ms[0] * 1e3, ms[1] * 1e3, ms[2] * 1e3), 10, {"timer": "do_bench (eager)"}
        try:
            ms = do_bench_cudagraph(fn, rep=self.rep_ms, quantiles=quantiles)
            notes: dict[str, Any] = {"timer": "do_bench_cudagraph"}
        except Exception as exc:
            if not fallback:
                raise
            torch.cuda.synchronize()
            ms = do_bench(fn, rep=self.rep_ms, quantiles=quantiles)
            notes = {"timer": "do_bench (no graph)", "capture_error": error_text(exc, 300)}
        return (ms[0] * 1e3, ms[1] * 1e3, ms[2] * 1e3), 10, notes


class LogitsCache:
    """LLM-like float32 logits per vocabulary, drawn once at the largest rows; a shape's
    logits are the first rows (one slow draw per vocabulary, not per shape)."""

    def __init__(self, device: torch.device, max_rows: int, seed: int) -> None:
        self.device = device
        self.max_rows = max_rows
        self.seed = seed
        self.full: dict[int, torch.Tensor] = {}

    def get(self, rows: int, vocab: int) -> torch.Tensor:
        if vocab not in self.full:
            self.full[vocab] = llm_like_logits(
                self.max_rows, vocab, seed=self.seed, device=self.device
            )
            sync(self.device)  # the timers run on side streams
        return self.full[vocab][:rows]


class PeerPool:
    """The vLLM-V1-style eager peers, one per (vocab, max_num_logprobs), with the config of
    the benchmark's Sampler of the same key."""

    def __init__(self, device: torch.device, samplers: SamplerPool) -> None:
        self.device = device
        self.samplers = samplers
        self.peers: dict[tuple[int, int], Any] = {}

    def get(self, vocab: int, k: int) -> Any:
        from graphsafe_sampler.bench.vllm_style import VllmStyleSampler

        if (vocab, k) not in self.peers:
            sampler = self.samplers.get(vocab, k, "torch")
            if isinstance(sampler, str):
                return sampler
            self.peers[(vocab, k)] = VllmStyleSampler(sampler.config, self.device)
        return self.peers[(vocab, k)]


class SamplerPool:
    """The Samplers of the benchmark, one per (vocab, max_num_logprobs, backend), sized for
    the largest rows; each holds one case's requests at a time. `get_rejection`: a
    RejectionSampler on one of them (the speculative step's benchmark)."""

    def __init__(self, device: torch.device, max_rows: int, seed: int) -> None:
        self.device = device
        self.max_rows = max_rows
        self.seed = seed
        self.samplers: dict[tuple[int, int, str], Sampler | str] = {}
        self.rejections: dict[tuple[int, str, int], RejectionSampler | str] = {}
        self.loaded: dict[int, tuple[str, int]] = {}  # id(sampler) -> (case, rows)
        self.gen = torch.Generator().manual_seed(seed)

    def get(self, vocab: int, k: int, backend: str) -> Sampler | str:
        """The sampler, or why there is none (e.g. the triton backend is not available)."""
        key = (vocab, k, backend)
        if key not in self.samplers:
            config = SamplerConfig(
                self.max_rows,
                vocab,
                max_num_logprobs=k,
                eos_token_id=vocab - 1,
                backend=backend,  # type: ignore[arg-type]
                seed=self.seed,
                max_logit_bias_tokens=max(BIAS_ENTRIES, 1),
            )
            self.samplers[key] = sampler_or_reason(config, self.device)
        return self.samplers[key]

    def get_rejection(self, vocab: int, backend: str, spec_len: int) -> RejectionSampler | str:
        """A RejectionSampler of `spec_len` on the Sampler of (vocab, no logprobs, backend),
        built with it before any request is loaded; or why there is none."""
        key = (vocab, backend, spec_len)
        if key not in self.rejections:
            sampler = self.get(vocab, 0, backend)
            if isinstance(sampler, str):
                self.rejections[key] = sampler
            else:
                self.rejections[key] = RejectionSampler(sampler, spec_len)
        return self.rejections[key]

    def load(self, sampler: Target, case: str, rows: int) -> float:
        """Give `sampler` `rows` requests of `case` (replacing the batch it held); returns
        the host seconds the update took (0 when it already held them)."""
        if self.loaded.get(id(sampler)) == (case, rows):
            return 0.0
        vocab = sampler.config.vocab_size
        previous = self.loaded.get(id(sampler), ("", 0))[1]
        tokens = torch.randint(vocab, (rows, PROMPT_LEN + OUTPUT_LEN), generator=self.gen)
        added = []
        for row, toks in enumerate(tokens.tolist()):
            params = bench_params(case, row, vocab, self.gen)
            added.append((row, params, toks[:PROMPT_LEN], toks[PROMPT_LEN:]))
        start = time.perf_counter()
        sampler.update_state(BatchUpdate(rows, removed=tuple(range(previous)), added=tuple(added)))
        sync(self.device)
        self.loaded[id(sampler)] = (case, rows)
        return time.perf_counter() - start


def time_floor(book: BenchBook, timer: Timer, logits: torch.Tensor) -> None:
    """The two floors of a shape: a copy of the logits (a read and a write) and their row
    max (`amax(-1)`: one read, what a step that reads its logits once cannot beat)."""
    rows, vocab = logits.shape
    out = torch.empty_like(logits)
    timed = timer(lambda: out.copy_(logits))
    median = timed[0][0]
    extra = {"copy_gbps": round(2 * logits.numel() * 4 / (median * 1e3), 1), "what": "copy_"}
    book.add(case_result("floor", FLOOR_PROVIDER, rows, vocab, timed, extra))
    maxes = torch.empty(rows, dtype=logits.dtype, device=logits.device)
    read = timer(lambda: torch.amax(logits, dim=-1, out=maxes))
    book.add(case_result("floor", READ_FLOOR, rows, vocab, read, {"what": "amax(-1)"}))
