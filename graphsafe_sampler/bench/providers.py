"""Providers: the implementations a benchmark case times side by side, ready to run.

A `Bench` is what the timer needs: `setup()` (untimed, returns the call's arguments) and
`run(*args)` (timed). Providers, by name:

- `clone`: `logits.clone()`, one pass over the logits: the floor (docs/design.md §6);
- `sampler-eager`: this package, eager;
- `sampler-compiled`: this package under `torch.compile(fullgraph=True)`, compiled and
  warmed up before timing (the compile time goes into the case's `extra`);
- `vllm-style`: the vLLM-V1-style eager peer (`graphsafe_sampler.bench.vllm_style`);
- `flashinfer`: FlashInfer's sampling functions (stage cases, CUDA, when installed).

Stage `step` is the whole decode step over a churning persistent batch
(`graphsafe_sampler.bench.workload`): each round applies that step's `BatchUpdate`
(`update_state`), samples, and hands the tokens back to the engine's output lists, as an
engine's loop does. Update generation and fresh logits are untimed setup. Every provider
replays the same churn (the driver's choices never depend on the tokens). The other stages
are `graphsafe_sampler.bench.stages`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from graphsafe_sampler.bench.flashinfer import flashinfer_available, flashinfer_call
from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.bench.stages import STAGES, StageCase
from graphsafe_sampler.bench.timing import Setup
from graphsafe_sampler.bench.vllm_style import VllmStyleSampler
from graphsafe_sampler.bench.workload import decode_driver
from graphsafe_sampler.compile_options import compile_options
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.output import SamplerOutput
from graphsafe_sampler.sampler import Sampler

PROVIDERS = ("clone", "sampler-eager", "sampler-compiled", "vllm-style", "flashinfer")
ALL_STAGES = ("step", *STAGES)
NUM_LOGITS = 4
"""Distinct logits tensors a case cycles through (each row's top tokens move every step)."""
PEAKEDNESS = 1.1
MAX_NUM_LOGPROBS = 5


@dataclass
class CaseSpec:
    """One shape of one stage: what every provider of the case shares."""

    stage: str
    rows: int
    vocab: int
    dtype: torch.dtype
    device: torch.device
    seed: int = 0
    backend: str = "auto"  # the Sampler's backend for `step`
    churn: float = 0.1
    logits: list[torch.Tensor] = field(default_factory=list)  # NUM_LOGITS x [rows, vocab]
    _stage_case: StageCase | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.stage not in ALL_STAGES:
            raise ValueError(f"stage must be one of {ALL_STAGES}, got {self.stage!r}")
        if self.rows < 1 or self.vocab < 2:
            raise ValueError(f"need rows >= 1 and vocab >= 2, got {self.rows} and {self.vocab}")
        if not self.logits:
            self.logits = [
                llm_like_logits(
                    self.rows,
                    self.vocab,
                    peakedness=PEAKEDNESS,
                    seed=self.seed + i,
                    dtype=self.dtype,
                    device=self.device,
                )
                for i in range(NUM_LOGITS)
            ]

    def stage_case(self) -> StageCase:
        if self._stage_case is None:
            self._stage_case = StageCase.build(
                self.stage, self.rows, self.vocab, self.device, self.seed
            )
        return self._stage_case

    def sampler_config(self) -> SamplerConfig:
        return SamplerConfig(
            self.rows,
            self.vocab,
            max_num_logprobs=MAX_NUM_LOGPROBS,
            eos_token_id=self.vocab - 1,
            backend=self.backend,  # type: ignore[arg-type]
            seed=self.seed,
        )

    def fresh_logits(self, *, copy: bool) -> Setup:
        """Setup returning the next logits tensor, cloned when the provider writes into it."""
        turn = itertools.cycle(self.logits)

        def setup() -> tuple[torch.Tensor]:
            logits = next(turn)
            return (logits.clone() if copy else logits,)

        return setup


@dataclass
class Bench:
    """A provider ready to time: `run(*setup())`, timed; `setup()` untimed.

    info: reported with the timings. workload: the step cases' batch driver (its rows hold
    each request's params and output list), for tests; None for stage cases.
    """

    run: Callable[..., object]
    setup: Setup
    info: dict[str, Any] = field(default_factory=dict)
    workload: Any = None


class ProviderUnavailable(Exception):
    """The provider cannot run this case here (no CUDA, not installed, no such stage)."""


def build_bench(spec: CaseSpec, provider: str) -> Bench:
    """A `Bench` of `provider` on `spec`; raises ProviderUnavailable where it cannot run."""
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {PROVIDERS}, got {provider!r}")
    if provider == "clone":
        return Bench(lambda logits: logits.clone(), spec.fresh_logits(copy=False))
    if spec.stage == "step":
        return _step_bench(spec, provider)
    return _stage_bench(spec, provider)


def _compile(
    fn: Callable[..., Any], first_args: tuple[Any, ...], device: torch.device
) -> tuple[Callable, float]:
    """torch.compile(fn, fullgraph=True) with the options recommended for `device`
    (`compile_options`), compiled by one call on `first_args`; returns the compiled
    function and the seconds that first call took."""
    # Each case compiles its own closures: Dynamo's per-code-object cache would otherwise
    # pile up guards (and hit its recompile limit) across cases. Inductor's on-disk cache
    # still serves shapes compiled before: whole graphs, or only their C++ for a graph
    # holding torch.cond (torch 2.13 does not cache those).
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, options=compile_options(device))
    start = time.perf_counter()
    compiled(*first_args)
    return compiled, time.perf_counter() - start


def _stage_bench(spec: CaseSpec, provider: str) -> Bench:
    case = spec.stage_case()
    setup = spec.fresh_logits(copy=True)  # most stages write into their input
    if provider == "sampler-eager":
        return Bench(case.ours(), setup)
    if provider == "sampler-compiled":
        compiled, compile_s = _compile(case.ours(), setup(), spec.device)
        return Bench(compiled, setup, {"compile_s": round(compile_s, 1)})
    if provider == "vllm-style":
        return Bench(case.vllm_style(), setup)
    call = flashinfer_call(spec.stage, spec.rows, spec.device)
    if call is None:
        where = "not installed" if spec.device.type == "cuda" else "CUDA only"
        if flashinfer_available(spec.device):
            where = f"no {spec.stage} function"
        raise ProviderUnavailable(f"flashinfer: {where}")
    name, fn = call
    return Bench(fn, setup, {"flashinfer_function": name})


def _record(driver: Any, out: SamplerOutput) -> torch.Tensor:
    """The engine's part of a step: read the tokens, append them to the output lists.
    Returns the tokens, [num_rows]."""
    tokens = out.sampled_token_ids[:, 0]
    driver.record_tokens(tokens.tolist())
    return tokens


def _step_bench(spec: CaseSpec, provider: str) -> Bench:
    if provider == "flashinfer":
        raise ProviderUnavailable("flashinfer: no full sampling step (stage cases only)")
    config = spec.sampler_config()
    driver = decode_driver(spec.rows, config, seed=spec.seed, churn=spec.churn)
    logits_setup = spec.fresh_logits(copy=provider == "vllm-style")  # vLLM writes into it

    def setup() -> tuple[Any, ...]:
        return (driver.next_update(), *logits_setup())

    info: dict[str, Any] = {"churn": spec.churn, "max_num_logprobs": MAX_NUM_LOGPROBS}
    if provider == "vllm-style":
        peer = VllmStyleSampler(config, spec.device)
        peer.update_state(driver.next_update())  # untimed: fill the batch

        def peer_step(batch_update: Any, logits: torch.Tensor) -> torch.Tensor:
            peer.update_state(batch_update)
            return _record(driver, peer(logits))

        return Bench(peer_step, setup, info, driver)

    sampler = Sampler(config, spec.device)
    sampler.update_state(driver.next_update())  # untimed: fill the batch
    info["backend"] = sampler.backend
    forward: Callable[[torch.Tensor], SamplerOutput] = sampler.forward
    if provider == "sampler-compiled":
        first = logits_setup()
        forward, compile_s = _compile(sampler.forward, first, spec.device)
        info["compile_s"] = round(compile_s, 1)

    def sampler_step(batch_update: Any, logits: torch.Tensor) -> torch.Tensor:
        sampler.update_state(batch_update)
        return _record(driver, forward(logits))

    return Bench(sampler_step, setup, info, driver)
