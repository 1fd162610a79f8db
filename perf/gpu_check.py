#!/usr/bin/env python
"""The GPU check (issue 4): one command that proves the Sampler on a real GPU and times it.

    python perf/gpu_check.py OUT_DIR [--budget-s 450] [--skip tests ...] [--cpu-smoke]

Parts, in this order, each in its own subprocess with its own timeout (so a hang, a crash
or a slow compile costs that part only), each writing its results as it goes:

    env         environment report (torch, triton, CUDA, driver, GPU, FlashInfer) -> env.json
    graph       real `torch.cuda.CUDAGraph` capture of `Sampler.forward` (every feature on),
                replayed for --steps steps of random batch churn against an eager twin fed
                the same updates and logits, under `torch.cuda.set_sync_debug_mode("error")`,
                per backend and logprobs mode; plus `graphsafe_sampler.testing.
                check_graph_safety` on CUDA -> graph_check.json
    bench       rows x vocab x case, timed on graph replay with
                `triton.testing.do_bench_cudagraph`: the floor (a captured copy of the
                logits), the Sampler eager and (second pass) compiled, each captured
                -> bench.json (graphsafe_sampler.bench.results format), bench.md
    spec        speculative decoding's verification step, `RejectionSampler.forward`
                (S = 4): captured the same way and replayed for --steps steps of churn
                against an eager twin (drafts, counts, grammar masks per position, a
                commit mask), per backend, with draft_probs and without (n-gram drafts)
                -> graph_check.json; then the step timed at rows 64 first, the other
                grid rows after while its time lasts (vocab: the first of --vocabs),
                beside the floor (a captured copy of the target logits)
                -> appended to bench.json, bench.md (stage "rejection")
    flashinfer  FlashInfer's sampling functions on the same grid, when importable
                -> appended to bench.json, bench.md
    compiled    `torch.compile(fullgraph=True)` of the step, captured by hand in a CUDA
                graph, replayed against an eager twin -> graph_check.json
    tests       pytest on CUDA with TRITON_INTERPRET=0 (the tests that take the `device`
                fixture, and the kernel tests) -> pytest.log, pytest.xml, tests.json

`summary.json` says what ran, for how long, and how it ended ("passed", "failed",
"incomplete", "timeout", "error", "skipped" with the reason). The exit status is 0 when
every part that ran passed (benchmarks pass when every case they started was timed).

Time: the whole run stays under --budget-s plus about 15 s of interpreter start-up. Each
part gets a share of what is left (`allot`), so time a part leaves unused flows to the
later ones; a part whose allotment falls below its minimum is skipped with the reason.
Inside a part, loops stop at the part's deadline (recorded as "incomplete") and the
subprocess is killed a few seconds later if something cannot be interrupted (a compile).
Benchmarks run smallest shape first, so a cut run loses the biggest shapes.

Without a GPU, the CUDA parts are recorded as skipped ("no CUDA device"). `--cpu-smoke`
runs the CPU-side versions instead, at tiny sizes: the same replay comparison with `make_fx`
traces in place of CUDA graphs (and `SyncOpDetector` in place of the sync debug mode), the
benchmark grid timed with a wall-clock timer, and the same result files.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import signal
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()

try:  # an installed package (pip install -e .) is the normal case
    import graphsafe_sampler
except ImportError:  # a bare checkout: run from the source tree
    sys.path.insert(0, str(ROOT))
    import graphsafe_sampler


def _alias_kernels() -> None:
    """In a bare checkout `kernels/` is not yet `graphsafe_sampler.kernels` (setuptools maps
    it at install time): register it under that name so the Triton backend imports."""
    name = "graphsafe_sampler.kernels"
    if name in sys.modules or importlib.util.find_spec(name) is not None:
        return
    init = ROOT / "kernels" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)]
    )
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_alias_kernels()

# E402: these imports need the fallback above on a machine where the package is not installed.
from graphsafe_sampler import (  # noqa: E402
    BatchUpdate,
    RejectionSampler,
    Sampler,
    SamplerConfig,
    SamplerOutput,
    SamplingParams,
)
from graphsafe_sampler.bench import stages  # noqa: E402
from graphsafe_sampler.bench.logits import llm_like_logits  # noqa: E402
from graphsafe_sampler.bench.results import (  # noqa: E402
    FLOOR_PROVIDER,
    CaseResult,
    Results,
    fill_ratios,
    logits_gbps,
    run_context,
)
from graphsafe_sampler.bench.timing import time_rounds  # noqa: E402
from graphsafe_sampler.bench.workload import DECODE_RECIPES  # noqa: E402
from graphsafe_sampler.config import triton_available  # noqa: E402
from graphsafe_sampler.processors.base import SlotLogitsProcessor  # noqa: E402
from graphsafe_sampler.testing import (  # noqa: E402
    BatchDriver,
    SyncOpDetector,
    check_graph_safety,
    random_sampling_params,
)

# ----------------------------------------------------------------- parts and budget

PART_NAMES = ("graph", "bench", "spec", "flashinfer", "compiled", "tests")
FINAL_RESERVE_S = 8.0
"""Kept back from the budget for the summary and the process start-ups."""
INTERRUPT_GRACE_S = 8.0
"""A part past its time gets SIGINT this long before its allotment ends (pytest then stops
and still writes its junit XML), SIGTERM later, SIGKILL at the end."""
CHILD_MARGIN_S = 3.0
"""A part's own deadline comes this long before its SIGINT."""


@dataclass(frozen=True)
class Part:
    """One part of the check.

    share: its weight when the time left is split among the parts still to run.
    min_s: below this allotment the part is skipped (it could not do anything useful).
    cpu_smoke: has a CPU version that `--cpu-smoke` runs.
    """

    name: str
    share: float
    min_s: float
    cpu_smoke: bool
    doc: str


PARTS: tuple[Part, ...] = (
    Part("graph", 0.16, 25.0, True, "CUDA-graph replay of Sampler.forward against an eager twin"),
    Part("bench", 0.34, 40.0, True, "graph-replay benchmarks: floor, Sampler eager, compiled"),
    Part("spec", 0.12, 25.0, True, "RejectionSampler: replay vs eager twin, then its benchmark"),
    Part("flashinfer", 0.10, 30.0, False, "FlashInfer's sampling functions on the same grid"),
    Part("compiled", 0.10, 45.0, True, "torch.compile + manual CUDA-graph capture vs eager"),
    Part("tests", 0.18, 30.0, False, "pytest on CUDA with TRITON_INTERPRET=0"),
)
"""Run order. The core proof first, then the table, then the speculative step (its own
part: a crash in its capture costs it alone); the parts most likely to overrun (a compile,
the test suite) last, where they get whatever the others left unused."""
PARTS_BY_NAME = {p.name: p for p in PARTS}


def allot(remaining_s: float, part: Part, pending: Sequence[Part]) -> float:
    """Seconds `part` may take now: its share of `remaining_s` among the `pending` parts
    (itself included), so time an earlier part left unused flows to every later one."""
    if part not in pending:
        raise ValueError(f"{part.name} is not among the pending parts")
    total = sum(p.share for p in pending)
    return max(0.0, remaining_s) * part.share / total


@dataclass
class Budget:
    """The run's clock: `remaining()` is what the parts may still use."""

    total_s: float
    reserve_s: float = FINAL_RESERVE_S
    start: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return self.total_s - self.reserve_s - self.elapsed()


def skip_reason(part: Part, opts: Options, cuda: bool) -> str | None:
    """Why `part` does not run on this machine with these options (None: it runs)."""
    if part.name in opts.skip:
        return "--skip"
    if opts.cpu_smoke:
        if not part.cpu_smoke:
            return "no CUDA device" if not cuda else "--cpu-smoke runs the CPU versions only"
        if part.name == "compiled" and not opts.smoke_compile:
            return "--cpu-smoke without --smoke-compile (a CPU compile takes minutes)"
        return None
    if not cuda:
        return "no CUDA device"
    needs = {"flashinfer": "flashinfer", "tests": "pytest"}.get(part.name)
    if needs is not None and importlib.util.find_spec(needs) is None:
        return f"{needs} is not installed"
    return None


# ----------------------------------------------------------------- options


@dataclass
class Options:
    """Everything a part needs, resolved (defaults depend on --cpu-smoke)."""

    out_dir: str
    budget_s: float = 450.0
    skip: tuple[str, ...] = ()
    cpu_smoke: bool = False
    smoke_compile: bool = False
    in_process: bool = False
    steps: int = 120
    harness_steps: int = 30
    graph_rows: int = 64
    graph_vocab: int = 32_000
    rows: tuple[int, ...] = (1, 64, 256, 1024)
    vocabs: tuple[int, ...] = (128_256, 151_936)
    spec_rows: tuple[int, ...] = ()
    """Requests of the speculative benchmark; empty: the grid's rows (64 first)."""
    cases: tuple[str, ...] = ()
    backends: tuple[str, ...] = ("torch", "triton")
    rep_ms: int = 10
    cpu_rounds: int = 5
    tests_scope: str = "cuda"
    seed: int = 0

    @property
    def out(self) -> Path:
        return Path(self.out_dir)

    def device(self) -> torch.device:
        if self.cpu_smoke or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Options:
        tuples = ("skip", "rows", "vocabs", "spec_rows", "cases", "backends")
        fields: dict[str, Any] = {k: tuple(v) if k in tuples else v for k, v in data.items()}
        return cls(**fields)


GPU_DEFAULTS: dict[str, Any] = {
    "steps": 120,
    "harness_steps": 30,
    "graph_rows": 64,
    "graph_vocab": 32_000,
    "rows": (1, 64, 256, 1024),
    "vocabs": (128_256, 151_936),
    "spec_rows": (),
}
SMOKE_DEFAULTS: dict[str, Any] = {
    "steps": 12,
    "harness_steps": 6,
    "graph_rows": 6,
    "graph_vocab": 111,
    "rows": (1, 3),
    "vocabs": (1000,),
    "spec_rows": (1, 3),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perf/gpu_check.py",
        description="Tests on CUDA, CUDA-graph replay checks and graph-replay benchmarks "
        "of the Sampler, in one time-boxed run (see the module docstring).",
    )
    parser.add_argument("out_dir", help="folder for the results (created if missing)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="whole run, seconds")
    parser.add_argument("--skip", nargs="+", default=[], choices=PART_NAMES, metavar="PART",
                        help=f"parts not to run, of {', '.join(PART_NAMES)}")  # fmt: skip
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="CPU versions of the parts at tiny sizes (no GPU needed)")  # fmt: skip
    parser.add_argument("--smoke-compile", action="store_true",
                        help="with --cpu-smoke: also the compiled provider and check")  # fmt: skip
    parser.add_argument("--in-process", action="store_true",
                        help="run the parts in this process (no subprocess, no kill on "
                        "timeout; for debugging)")  # fmt: skip
    parser.add_argument("--steps", type=int, help="replay steps per check (GPU: 120)")
    parser.add_argument("--harness-steps", type=int, help="check_graph_safety steps (GPU: 30)")
    parser.add_argument("--graph-rows", type=int, help="max_num_reqs of the replay checks")
    parser.add_argument("--graph-vocab", type=int, help="vocab of the replay checks")
    parser.add_argument("--rows", type=int, nargs="+", help="benchmark rows (GPU: 1 64 256 1024)")
    parser.add_argument("--vocabs", type=int, nargs="+",
                        help="benchmark vocabularies (GPU: 128256 151936)")  # fmt: skip
    parser.add_argument("--spec-rows", type=int, nargs="+",
                        help="requests of the speculative step's benchmark, at the first of "
                        "--vocabs (GPU: the --rows, 64 first)")  # fmt: skip
    parser.add_argument("--cases", nargs="+", choices=BENCH_CASES, metavar="CASE",
                        help=f"benchmark cases (default all: {' '.join(BENCH_CASES)})")  # fmt: skip
    parser.add_argument("--backends", nargs="+", default=["torch", "triton"],
                        choices=["torch", "triton"],
                        help="Sampler backends to check and time (one not available here "
                        "is recorded as skipped)")  # fmt: skip
    parser.add_argument("--rep-ms", type=int, default=10,
                        help="do_bench_cudagraph's rep: ms of calls per graph")  # fmt: skip
    parser.add_argument("--tests-scope", choices=["cuda", "all"], default="cuda",
                        help="cuda: the tests that run on CUDA (device fixture, kernels); "
                        "all: then the rest of the suite in the time left")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    # Internal: how the orchestrator starts one part in a subprocess.
    parser.add_argument("--part", choices=PART_NAMES, help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)
    parser.add_argument("--deadline-unix", type=float, help=argparse.SUPPRESS)
    return parser


def options_from_args(ns: argparse.Namespace) -> Options:
    defaults = SMOKE_DEFAULTS if ns.cpu_smoke else GPU_DEFAULTS

    def pick(name: str) -> Any:
        value = getattr(ns, name)
        return defaults[name] if value is None else value

    opts = Options(
        out_dir=str(Path(ns.out_dir).resolve()),
        budget_s=ns.budget_s,
        skip=tuple(ns.skip),
        cpu_smoke=ns.cpu_smoke,
        smoke_compile=ns.smoke_compile,
        in_process=ns.in_process,
        steps=pick("steps"),
        harness_steps=pick("harness_steps"),
        graph_rows=pick("graph_rows"),
        graph_vocab=pick("graph_vocab"),
        rows=tuple(pick("rows")),
        vocabs=tuple(pick("vocabs")),
        spec_rows=tuple(pick("spec_rows")),
        cases=tuple(ns.cases or BENCH_CASES),
        backends=tuple(dict.fromkeys(ns.backends)),
        rep_ms=ns.rep_ms,
        cpu_rounds=3 if ns.cpu_smoke else 5,
        tests_scope=ns.tests_scope,
        seed=ns.seed,
    )
    for name, value, minimum in (
        ("--budget-s", opts.budget_s, 1.0),
        ("--steps", opts.steps, 1),
        ("--harness-steps", opts.harness_steps, 0),
        ("--graph-rows", opts.graph_rows, 1),
        ("--graph-vocab", opts.graph_vocab, 8),
        ("--rep-ms", opts.rep_ms, 1),
        ("--rows", min(opts.rows), 1),
        ("--vocabs", min(opts.vocabs), 8),
        ("--spec-rows", min(opts.spec_rows, default=1), 1),
    ):
        if value < minimum:
            raise SystemExit(f"gpu_check: {name} must be >= {minimum}, got {value}")
    return opts


# ----------------------------------------------------------------- small helpers


def write_json(path: Path, data: Any) -> None:
    """Atomic: a part killed mid-write leaves the previous version, never half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _say(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _error_text(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cuda_alive(device: torch.device) -> bool:
    """False once an asynchronous CUDA error has poisoned the context (nothing more can run)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
    except Exception:
        return False
    return True


@contextlib.contextmanager
def no_host_sync(device: torch.device, what: str) -> Iterator[None]:
    """Any host synchronisation inside raises: `set_sync_debug_mode("error")` on CUDA,
    `SyncOpDetector` (the ops that would sync on a GPU) on the CPU."""
    if device.type == "cuda":
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    else:
        with SyncOpDetector(what):
            yield


# ----------------------------------------------------------------- environment


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def flashinfer_version() -> str | None:
    """FlashInfer's version without importing it (None: not installed)."""
    for dist in ("flashinfer-python", "flashinfer"):
        version = _version(dist)
        if version:
            return version
    return "importable (version unknown)" if importlib.util.find_spec("flashinfer") else None


def _nvidia_smi() -> list[dict[str, str]] | str:
    fields = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return _error_text(exc)
    if done.returncode != 0:
        return f"nvidia-smi exited {done.returncode}: {done.stderr.strip()[:300]}"
    keys = fields.split(",")
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
        for line in done.stdout.strip().splitlines()
    ]


def environment_report(opts: Options) -> dict[str, Any]:
    """Versions and hardware; every field is filled on its own, so one failure costs one
    field."""

    def safely(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            return f"error: {_error_text(exc, 300)}"

    cuda = safely(torch.cuda.is_available)
    report: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": safely(lambda: _version("triton") or __import__("triton").__version__),
        "flashinfer": safely(flashinfer_version),
        "cuda_available": cuda,
        "graphsafe_sampler": safely(
            lambda: {
                "version": graphsafe_sampler.__version__,
                "path": str(Path(graphsafe_sampler.__file__).parent),
                "installed": _version("graphsafe-sampler") is not None,
            }
        ),
        "env": {
            k: os.environ.get(k)
            for k in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_CACHE_DIR")
        },
        "cpu_count": os.cpu_count(),
        "options": opts.to_json(),
    }
    if cuda is True:
        report["device_count"] = safely(torch.cuda.device_count)
        report["gpus"] = safely(
            lambda: [
                {
                    "name": p.name,
                    "capability": f"{p.major}.{p.minor}",
                    "memory_gib": round(p.total_memory / 2**30, 1),
                    "multiprocessors": p.multi_processor_count,
                }
                for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))
            ]
        )
        report["nvidia_smi"] = safely(_nvidia_smi)
    report["context"] = safely(lambda: run_context(opts.device()))
    return report


# ----------------------------------------------------------------- replay checks

StepFn = Callable[..., tuple[torch.Tensor, ...]]
"""A captured step: its inputs positionally (the Sampler's: logits, commit mask), its
outputs a flat tuple of tensors."""
OUTPUT_NAMES = ("sampled_token_ids", "logprob_token_ids", "logprobs", "selected_token_ranks")
SPEC_OUTPUT_NAMES = ("output_token_ids", "num_accepted")
TOKEN_OUTPUTS = (OUTPUT_NAMES[0], *SPEC_OUTPUT_NAMES)
"""Outputs whose differences count as token mismatches (the others: logprob mismatches)."""
ATOL = 1e-5
RTOL = 1e-5
MAX_FAILURES_KEPT = 8
TARGET_TOKEN_PROCESSOR = "graphsafe_sampler.examples.target_token:TargetTokenLogitsProcessor"


def flatten_output(out: SamplerOutput) -> tuple[torch.Tensor, ...]:
    """(tokens [rows, 1] int32[, logprob ids [rows, K+1], logprobs [rows, K+1], ranks [rows]])."""
    lp = out.logprobs_tensors
    if lp is None:
        return (out.sampled_token_ids,)
    return (out.sampled_token_ids, lp.logprob_token_ids, lp.logprobs, lp.selected_token_ranks)


def sampler_step(sampler: Sampler) -> StepFn:
    """The step a model runner captures: forward with a chunked-prefill commit mask."""

    def step(logits: torch.Tensor, commit_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return flatten_output(sampler(logits, commit_mask))

    return step


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


class StateTensors:
    """A Sampler's state tensors (`state_tensors()`; a RejectionSampler's are its Sampler's):
    snapshots, address checks, diffs."""

    def __init__(self, sampler: Target) -> None:
        self.sampler = sampler
        self.tensors: dict[str, torch.Tensor] = dict(sampler.state_tensors())
        self.ptrs = {name: t.data_ptr() for name, t in self.tensors.items()}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: t.clone() for name, t in self.tensors.items()}

    def restore(self, snap: dict[str, torch.Tensor]) -> None:
        for name, t in self.tensors.items():
            t.copy_(snap[name])

    def moved(self) -> list[str]:
        """Names of state tensors reallocated (or added/removed) since construction: a
        captured graph would keep reading the old memory."""
        now = dict(self.sampler.state_tensors())
        changed = sorted(now.keys() ^ self.tensors.keys())
        for name, t in now.items():
            old = self.tensors.get(name)
            if old is not None and (t is not old or t.data_ptr() != self.ptrs[name]):
                changed.append(name)
        return changed

    def diff(self, actual: StateTensors) -> list[str]:
        """Names whose tensors in `actual` differ from ours (ours are the expected ones):
        integers exactly, floats within ATOL/RTOL; one host read per device."""
        verdicts: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
        bad = []
        for name, want in self.tensors.items():
            got = actual.tensors.get(name)
            if got is None or got.shape != want.shape or got.dtype != want.dtype:
                bad.append(name)
                continue
            verdicts.setdefault(want.device, []).append((name, same_values(want, got)))
        for pairs in verdicts.values():
            flags = torch.stack([flag for _, flag in pairs]).tolist()
            bad.extend(name for (name, _), ok in zip(pairs, flags, strict=True) if not ok)
        return bad

    def copy_to(self, other: StateTensors) -> None:
        for name, t in self.tensors.items():
            other.tensors[name].copy_(t)


def same_values(want: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """0-dim bool: equal integers/bools; floats within ATOL + RTOL * |want|, NaN == NaN."""
    if not want.is_floating_point():
        return (want == got).all()
    close = (got - want).abs() <= ATOL + RTOL * want.abs()
    return (close | (got == want) | (got.isnan() & want.isnan())).all()


def diff_outputs(
    want: tuple[torch.Tensor, ...],
    got: tuple[torch.Tensor, ...],
    names: Sequence[str] | None = None,
) -> list[str]:
    """Why the replay's outputs differ from eager's (empty: they agree); each problem starts
    with the output's name (`names`, default the Sampler's OUTPUT_NAMES).

    Tokens, ranks and other integer outputs must be equal. Logprob token ids must be equal
    where the logprob is finite and not tied with another column of the row (ties and -inf
    columns may name any of the tied ids); logprobs must be close."""
    if len(want) != len(got):
        return [f"outputs: {len(got)} tensors, eager gave {len(want)}"]
    if names is None or len(names) != len(want):
        names = (
            OUTPUT_NAMES if len(want) in (1, 4) else tuple(f"output {i}" for i in range(len(want)))
        )
    problems = []
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w.shape != g.shape or w.dtype != g.dtype:
            problems.append(
                f"{names[i]}: {tuple(g.shape)} {g.dtype}, eager {tuple(w.shape)} {w.dtype}"
            )
            continue
        if names[i] == "logprob_token_ids":
            values = want[2]
            tied = (values[:, :, None] == values[:, None, :]).sum(-1) > 1
            excused = tied | ~values.isfinite()
            excused[:, 0] = False  # column 0 is the sampled token: always exact
            differ = (w != g) & ~excused
        elif w.is_floating_point():
            differ = ~((g - w).abs() <= ATOL + RTOL * w.abs()) & (g != w) & ~(g.isnan() & w.isnan())
        else:
            differ = w != g
        count = int(differ.sum())
        if count:
            rows = differ.reshape(differ.shape[0], -1).any(dim=1).nonzero().flatten()[:4].tolist()
            r = rows[0]
            problems.append(
                f"{names[i]}: {count} elements differ, rows {rows}; row {r}: "
                f"eager {w[r].flatten()[:6].tolist()}, replay {g[r].flatten()[:6].tolist()}"
            )
    return problems


class CudaGraphReplayer:
    """`fn` captured once in a real `torch.cuda.CUDAGraph` on static inputs (after warm-up
    on a side stream), replayed on new inputs copied in place."""

    kind = "cuda-graph"

    def __init__(
        self, fn: StepFn, example: tuple[torch.Tensor, ...], state: StateTensors, warmup: int = 2
    ) -> None:
        self.inputs = tuple(t.clone() for t in example)
        snap = state.snapshot()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):  # lazy inits and allocator pools outside the capture
                fn(*self.inputs)
                state.restore(snap)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn(*self.inputs)
        state.restore(snap)  # capture runs nothing, but be sure the twin starts level
        torch.cuda.synchronize()
        self.info: dict[str, Any] = {}

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for static, new in zip(self.inputs, inputs, strict=True):
            static.copy_(new)
        self.graph.replay()
        return tuple(t.clone() for t in self.outputs)


class MakeFxReplayer:
    """The CPU analogue of a CUDA graph (DESIGN §5): `make_fx` traces `fn` once, keeping
    state tensors by reference and baking Python branches in; replays run the trace."""

    kind = "make_fx"

    def __init__(self, fn: StepFn, example: tuple[torch.Tensor, ...], state: StateTensors) -> None:
        from torch.fx.experimental.proxy_tensor import make_fx

        snap = state.snapshot()
        self.traced = make_fx(fn)(*(t.clone() for t in example))
        state.restore(snap)  # tracing ran the step for real
        self.info: dict[str, Any] = {}

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.traced(*(t.clone() for t in inputs)))


class CompiledReplayer:
    """`torch.compile(fn, fullgraph=True)`; on CUDA the compiled step is then captured by
    hand in a CUDA graph (what an engine does), elsewhere it is called every step (and must
    not recompile as the batch churns)."""

    def __init__(self, fn: StepFn, example: tuple[torch.Tensor, ...], state: StateTensors) -> None:
        from torch._dynamo.testing import CompileCounterWithBackend

        torch._dynamo.reset()
        self.counter = CompileCounterWithBackend("inductor")
        self.compiled = torch.compile(fn, fullgraph=True, backend=self.counter)
        snap = state.snapshot()
        start = time.perf_counter()
        self.compiled(*(t.clone() for t in example))
        _sync(example[0].device)
        compile_s = time.perf_counter() - start
        state.restore(snap)
        self.graph: CudaGraphReplayer | None = None
        if example[0].device.type == "cuda":
            self.graph = CudaGraphReplayer(self.compiled, example, state)
        self.kind = "compiled+cuda-graph" if self.graph is not None else "compiled"
        self.info = {"compile_s": round(compile_s, 1)}

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.info["compile_frames"] = self.counter.frame_count
        if self.graph is not None:
            return self.graph(*inputs)
        return tuple(t.clone() for t in self.compiled(*(t.clone() for t in inputs)))


Replayer = CudaGraphReplayer | MakeFxReplayer | CompiledReplayer
MakeReplayer = Callable[[StepFn, tuple[torch.Tensor, ...], StateTensors], Replayer]


Target = Sampler | RejectionSampler
"""What a replay check drives: the Sampler, or a RejectionSampler on its own Sampler."""


class _Engine:
    """The engine side of the replay check: one driver's updates and grammar bitmasks,
    applied to every sampler alike. A RejectionSampler gets one mask per verified position
    ([rows, S + 1, words]), staged through its own `stage_grammar_bitmask`."""

    def __init__(self, driver: BatchDriver, samplers: Sequence[Target], seed: int) -> None:
        self.driver = driver
        self.samplers = samplers
        self.rng = np.random.default_rng(seed)
        spec = getattr(samplers[0], "max_spec_len", None)
        self.positions: tuple[int, ...] = () if spec is None else (spec + 1,)

    def update(self) -> None:
        update = self.driver.next_update()
        for sampler in self.samplers:
            sampler.update_state(update)
        self._stage_grammar()

    def _stage_grammar(self) -> None:
        config = self.samplers[0].config
        words = (config.vocab_size + 31) // 32
        draw = self.rng.random()
        if draw < 0.1:
            for sampler in self.samplers:
                sampler.stage_grammar_bitmask(None)
        elif draw < 0.5:
            size = int(self.rng.integers(1, max(2, config.max_num_reqs // 4) + 1))
            rows = sorted(self.rng.choice(config.max_num_reqs, size=size, replace=False).tolist())
            shape = (len(rows), *self.positions, words)
            bits = self.rng.integers(-(2**31), 2**31, size=shape, dtype=np.int64)
            for sampler in self.samplers:
                sampler.stage_grammar_bitmask(bits.astype(np.int32), rows=rows)


class StepInputs:
    """Fresh inputs per step, drawn on the device (no host copy per step): logits whose
    spread varies per step, with a NaN row and an all -inf row every 5th step, and a commit
    mask keeping about 1 row in 10 out (as chunked prefill does)."""

    def __init__(self, config: SamplerConfig, device: torch.device, seed: int) -> None:
        self.rows, self.vocab = config.max_num_reqs, config.vocab_size
        self.device = device
        self.gen = torch.Generator(device).manual_seed(seed)
        self.rng = random.Random(seed)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows, device, gen = self.rows, self.device, self.gen
        logits = torch.randn(rows, self.vocab, generator=gen, device=device)
        logits *= self.rng.uniform(0.5, 8.0)
        if step % 5 == 4 and rows >= 2:
            nan_row, inf_row = self.rng.sample(range(rows), 2)
            logits[nan_row] = float("nan")
            logits[inf_row] = float("-inf")
        mask = torch.rand(rows, generator=gen, device=device) >= 0.1
        return logits, mask


MakeInputs = Callable[[SamplerConfig, torch.device, int], Callable[[int], tuple[torch.Tensor, ...]]]
"""(config, device, seed) -> inputs(step): a step's inputs, in the step function's order."""
RecordTokens = Callable[[BatchDriver, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]], None]
"""(driver, eager's outputs, the step's inputs): the engine appends what was committed."""


def record_sampled(
    driver: BatchDriver, outputs: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...]
) -> None:
    """The Sampler's step: one token per row, kept where the commit mask (last input) is."""
    driver.record_tokens(outputs[0][:, 0].tolist(), inputs[-1].tolist())


SPEC_LEN = 4
"""S = max_spec_len of the speculative step (the issue's case)."""
SPEC_STAGE = "rejection"
"""The verification step's stage name in bench.json (as perf/bench_rejection.py names it)."""
DRAFT_NOISE = 1.0
"""Draft model = target logits + Gaussian noise of this standard deviation (as in
perf/bench_rejection.py)."""


class SpecInputs:
    """Fresh inputs per verification step, drawn on the device: target logits
    [rows, S + 1, V] whose spread varies per step (a NaN row and an all -inf row every 5th
    step); a draft model's logits (the target's plus noise), whose softmax is draft_probs
    [rows, S, V] (`with_probs`; n-gram drafts otherwise); drafts drawn from them, or on
    about half the rows the target's argmax (so greedy rows accept runs of them), with an id
    outside the vocabulary every 7th step; num_draft_tokens in [0, S] (S + 2 on one row
    every 6th step: clamped on the device); a commit mask keeping about 1 row in 10 out.
    Returns (target_logits, draft_token_ids, num_draft_tokens[, draft_probs], commit_mask)."""

    def __init__(
        self,
        config: SamplerConfig,
        device: torch.device,
        seed: int,
        *,
        spec_len: int = SPEC_LEN,
        with_probs: bool = True,
    ) -> None:
        self.rows, self.vocab, self.spec = config.max_num_reqs, config.vocab_size, spec_len
        self.with_probs = with_probs
        self.device = device
        self.gen = torch.Generator(device).manual_seed(seed)
        self.rng = random.Random(seed)

    def __call__(self, step: int) -> tuple[torch.Tensor, ...]:
        rows, spec, vocab = self.rows, self.spec, self.vocab
        device, gen, rng = self.device, self.gen, self.rng
        logits = torch.randn(rows, spec + 1, vocab, generator=gen, device=device)
        logits *= rng.uniform(0.5, 8.0)
        if step % 5 == 4 and rows >= 2:
            nan_row, inf_row = rng.sample(range(rows), 2)
            logits[nan_row] = float("nan")
            logits[inf_row] = float("-inf")
        finite = torch.where(logits[:, :spec].isfinite(), logits[:, :spec], 0.0)
        noise = torch.randn(rows, spec, vocab, generator=gen, device=device)
        draft_logits = finite + DRAFT_NOISE * noise
        uniform = torch.rand(rows, spec, vocab, generator=gen, device=device)
        gumbel = -(-uniform.clamp_min(1e-20).log()).log()
        sampled = (draft_logits + gumbel).argmax(dim=-1)  # a draw from softmax(draft_logits)
        take_best = torch.rand(rows, 1, generator=gen, device=device) < 0.5
        drafts = torch.where(take_best, finite.argmax(dim=-1), sampled)
        if step % 7 == 6:
            drafts[rng.randrange(rows), rng.randrange(spec)] = rng.choice([-1, vocab + 3])
        num = torch.randint(0, spec + 1, (rows,), generator=gen, device=device)
        if step % 6 == 5:
            num[rng.randrange(rows)] = spec + 2
        mask = torch.rand(rows, generator=gen, device=device) >= 0.1
        if self.with_probs:
            return logits, drafts, num, torch.softmax(draft_logits, dim=-1), mask
        return logits, drafts, num, mask


def rejection_step(with_probs: bool) -> Callable[[RejectionSampler], StepFn]:
    """The speculative step a model runner captures: verify the drafts (with or without
    the draft model's probabilities), committing under a commit mask."""

    def make(rejection: RejectionSampler) -> StepFn:
        if with_probs:

            def step(
                target_logits: torch.Tensor,
                draft_token_ids: torch.Tensor,
                num_draft_tokens: torch.Tensor,
                draft_probs: torch.Tensor,
                commit_mask: torch.Tensor,
            ) -> tuple[torch.Tensor, ...]:
                out = rejection(target_logits, draft_token_ids, num_draft_tokens, draft_probs,
                                commit_mask=commit_mask)  # fmt: skip
                return (out.output_token_ids, out.num_accepted)

            return step

        def ngram_step(
            target_logits: torch.Tensor,
            draft_token_ids: torch.Tensor,
            num_draft_tokens: torch.Tensor,
            commit_mask: torch.Tensor,
        ) -> tuple[torch.Tensor, ...]:
            out = rejection(target_logits, draft_token_ids, num_draft_tokens,
                            commit_mask=commit_mask)  # fmt: skip
            return (out.output_token_ids, out.num_accepted)

        return ngram_step

    return make


def record_accepted(
    driver: BatchDriver, outputs: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...]
) -> None:
    """The speculative step: a row's accepted drafts and its emitted token, kept where the
    commit mask (last input) is."""
    tokens, accepted, keep = outputs[0].tolist(), outputs[1].tolist(), inputs[-1].tolist()
    for row, req in enumerate(driver.rows):
        if req is not None and keep[row]:
            req.output_tok_ids.extend(tokens[row][: accepted[row] + 1])


def replay_check(
    make_sampler: Callable[[], Target],
    make_replayer: MakeReplayer,
    *,
    steps: int,
    seed: int,
    deadline: float,
    step_fn: Callable[[Any], StepFn] = sampler_step,
    make_inputs: MakeInputs = StepInputs,
    record: RecordTokens = record_sampled,
    output_names: Sequence[str] | None = None,
    min_steps: int = 0,
) -> dict[str, Any]:
    """Capture `step_fn(sampler)` once (`make_replayer`), then for each of `steps` random
    batch states: update both samplers alike, replay the capture on one and run the other
    eagerly on the same inputs, with host syncs forbidden around both; outputs and the
    state left behind must agree. A mismatch is recorded and the replayed sampler is reset
    to the twin's state, so each later step is judged on its own. Stops at `deadline`, once
    `min_steps` steps are done (a capture whose setup outlasted its time still gets judged).

    The defaults drive `Sampler.forward`; a RejectionSampler's check passes its step
    (`rejection_step`), inputs (`SpecInputs`), `record_accepted` and SPEC_OUTPUT_NAMES."""
    result: dict[str, Any] = {
        "status": "error",
        "steps_requested": steps,
        "steps_run": 0,
        "token_mismatches": 0,
        "logprob_mismatches": 0,
        "state_mismatches": 0,
        "address_changes": 0,
        "failures": [],
    }
    started = time.monotonic()
    replayed, eager = make_sampler(), make_sampler()
    config, device = replayed.config, replayed.device
    result.update(
        rows=config.max_num_reqs,
        vocab=config.vocab_size,
        max_num_logprobs=config.max_num_logprobs,
        logprobs_mode=config.logprobs_mode,
        backend=getattr(getattr(replayed, "sampler", replayed), "backend", config.backend),
        device=str(device),
    )
    if isinstance(replayed, RejectionSampler):
        result["max_spec_len"] = replayed.max_spec_len
    driver = BatchDriver(config, seed=seed, make_params=all_feature_params, churn=0.25)
    engine = _Engine(driver, (replayed, eager), seed)
    inputs = make_inputs(config, device, seed)
    engine.update()
    state, twin_state = StateTensors(replayed), StateTensors(eager)
    eager_fn = step_fn(eager)

    def fail(kind: str, message: str) -> None:
        if kind:
            result[kind] += 1
        if len(result["failures"]) < MAX_FAILURES_KEPT:
            result["failures"].append(message)

    replayer = make_replayer(step_fn(replayed), inputs(-1), state)
    result["replay"] = replayer.kind
    result["setup_s"] = round(time.monotonic() - started, 2)
    for step in range(steps):
        if step >= min_steps and time.monotonic() > deadline:
            break
        if step:
            engine.update()
        moved = state.moved()
        if moved:
            fail("address_changes", f"step {step}: state tensors reallocated: {moved[:5]}")
        step_inputs = inputs(step)
        try:
            # On the CPU the sync guard is a TorchDispatchMode, under which torch.compile
            # refuses to run compiled code: the compiled replay goes unguarded there.
            guard = device.type == "cuda" or not isinstance(replayer, CompiledReplayer)
            with (
                no_host_sync(device, f"step {step}: replay") if guard else contextlib.nullcontext()
            ):
                got = replayer(*step_inputs)
            with no_host_sync(device, f"step {step}: eager"):
                want = eager_fn(*(t.clone() for t in step_inputs))
            _sync(device)
        except Exception as exc:  # a sync, a crash: the step cannot be judged
            fail("", f"step {step}: {_error_text(exc)}")
            result["error"] = traceback.format_exc()[-3000:]
            result["seconds"] = round(time.monotonic() - started, 2)
            return result
        problems = diff_outputs(want, got, output_names)
        for problem in problems:
            token = problem.split(":", 1)[0] in TOKEN_OUTPUTS
            fail("token_mismatches" if token else "logprob_mismatches", f"step {step}: {problem}")
        bad_state = twin_state.diff(state)
        if bad_state:
            fail("state_mismatches", f"step {step}: state differs from eager's: {bad_state[:6]}")
        if problems or bad_state:
            twin_state.copy_to(state)  # judge the next step on its own
        record(driver, want, step_inputs)
        if "max_spec_len" in result:  # how much of the acceptance path the steps exercised
            result["accepted_drafts"] = result.get("accepted_drafts", 0) + int(want[1].sum())
        result["steps_run"] = step + 1
    result.update(replayer.info)
    mismatches = sum(
        result[k]
        for k in ("token_mismatches", "logprob_mismatches", "state_mismatches", "address_changes")
    )
    if mismatches:
        result["status"] = "failed"
    elif result["steps_run"] < steps:
        result["status"] = "incomplete"
    else:
        result["status"] = "passed"
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def overall_status(statuses: Sequence[str]) -> str:
    """One word for several: any error/failure wins, then incomplete; only skips: skipped."""
    ran = [s for s in statuses if s != "skipped"]
    for worst in ("error", "timeout", "failed", "incomplete"):
        if worst in ran:
            return worst
    return "passed" if ran else "skipped"


GRAPH_JSON = "graph_check.json"
GRAPH_CHECKS = (
    ("triton", "raw_logprobs", 1.0),
    ("torch", "raw_logprobs", 1.5),
    ("torch", "processed_logprobs", 1.0),
)
"""(backend, logprobs_mode, weight in the graph part's time). Triton first: while its
backend is not available it is skipped at once and its time goes to the others."""


def _record_check(opts: Options, name: str, check: dict[str, Any]) -> None:
    path = opts.out / GRAPH_JSON
    doc = read_json(path) or {}
    doc.setdefault("schema", 1)
    doc.setdefault("checks", {})
    doc["checks"][name] = check
    doc["status"] = overall_status([c.get("status", "error") for c in doc["checks"].values()])
    doc["device"] = str(opts.device())
    if opts.device().type == "cuda":
        doc["device_name"] = torch.cuda.get_device_name()
    write_json(path, doc)
    _say(f"{name}: {check.get('status')} ({check.get('steps_run', '-')} steps)")


def _sampler_or_reason(config: SamplerConfig, device: torch.device) -> Sampler | str:
    """The Sampler, or why its backend cannot run here: "triton" where its kernels cannot
    run on `device` (the CPU without the interpreter). Any other error building it is a
    failure and raises: a broken backend must never read as "skipped"."""
    if config.backend == "triton" and not triton_available(device):
        return (
            f"not available: the Triton backend needs CUDA or TRITON_INTERPRET=1, and the "
            f"device is {device}"
        )
    return Sampler(config, device)


def _harness_check(opts: Options) -> dict[str, Any]:
    """`graphsafe_sampler.testing.check_graph_safety` on the Sampler: sync ops, fixed
    addresses, make_fx replay and, on CUDA, its own CUDA-graph replay under sync errors
    (--harness-steps steps; it cannot stop early, so keep them few)."""
    from graphsafe_sampler.testing import GraphSafetyError

    started = time.monotonic()
    config = graph_config(opts, "torch", "raw_logprobs")
    sampler = Sampler(config, opts.device())
    rng = np.random.default_rng(opts.seed + 7)
    words = (config.vocab_size + 31) // 32

    def advance(driver: BatchDriver, out: SamplerOutput) -> None:
        driver.record_tokens(out.sampled_token_ids[:, 0].tolist())
        size = min(2, config.max_num_reqs)
        rows = sorted(rng.choice(config.max_num_reqs, size=size, replace=False).tolist())
        bits = rng.integers(-(2**31), 2**31, size=(len(rows), words), dtype=np.int64)
        sampler.stage_grammar_bitmask(bits.astype(np.int32), rows=rows)

    steps = opts.harness_steps
    try:
        report = check_graph_safety(
            sampler,
            fn=lambda x: sampler(x),
            num_steps=steps,
            seed=opts.seed + 7,
            make_params=all_feature_params,
            advance=advance,
            compile=False,
        )
    except GraphSafetyError as exc:
        return {"status": "failed", "failures": [_error_text(exc, 2000)], "steps_requested": steps,
                "seconds": round(time.monotonic() - started, 2)}  # fmt: skip
    return {
        "status": "passed",
        "steps_requested": steps,
        "steps_run": report.steps,
        "state_tensors": report.state_tensors,
        "cuda_graph": report.cuda_graph,
        "seconds": round(time.monotonic() - started, 2),
    }


class _HistcProcessor(SlotLogitsProcessor):
    """`torch.histc` with min == max: its CUDA kernel reads the range on the host. Graph-safe
    in every other way (no state at all)."""

    def is_argmax_invariant(self) -> bool:
        return True

    def add_request(self, slot: int, params: SamplingParams, prompt: Any, output: Any) -> None:
        return None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        counts = torch.histc(logits, bins=8, min=0.0, max=0.0)
        return logits + 0.0 * counts.sum()


def _unlisted_sync_check(opts: Options) -> dict[str, Any]:
    """The graph-safety checker's limit, covered on a GPU: an op that syncs inside its CUDA
    kernel but is not on the CPU detector's list (histc, taken off the list here) must
    still fail `check_graph_safety` on CUDA, through set_sync_debug_mode("error") and the
    real CUDA-graph capture. Passed when it fails with GraphSafetyError."""
    from graphsafe_sampler.testing import GraphSafetyError, sync_detector

    device = opts.device()
    if device.type != "cuda":
        return {"status": "skipped", "reason": "CUDA only: on a CPU only the listed ops fail"}
    started = time.monotonic()
    config = SamplerConfig(4, 1000)
    proc = _HistcProcessor(config, device, False)
    listed = sync_detector.SYNC_OP_PACKETS
    sync_detector.SYNC_OP_PACKETS = frozenset(listed - {torch.ops.aten.histc})
    try:
        check_graph_safety(proc, num_steps=3, compile=False)
    except GraphSafetyError as exc:
        return {"status": "passed", "caught": _error_text(exc, 500),
                "seconds": round(time.monotonic() - started, 2)}  # fmt: skip
    finally:
        sync_detector.SYNC_OP_PACKETS = listed
    return {"status": "failed", "failures": ["histc's host read passed check_graph_safety on CUDA"]}


def run_graph_part(opts: Options, deadline: float) -> dict[str, Any]:
    """The replay checks (per backend and logprobs mode) and the harness check."""
    device = opts.device()
    cuda = device.type == "cuda"
    make_replayer: MakeReplayer = CudaGraphReplayer if cuda else MakeFxReplayer
    kind = CudaGraphReplayer.kind if cuda else MakeFxReplayer.kind

    def replay_job(config: SamplerConfig) -> Callable[[float], dict[str, Any]]:
        def job(until: float) -> dict[str, Any]:
            probe = _sampler_or_reason(config, device)
            if isinstance(probe, str):
                return {"status": "skipped", "reason": probe}
            del probe
            return replay_check(
                lambda: Sampler(config, device),
                make_replayer,
                steps=opts.steps,
                seed=opts.seed,
                deadline=until,
            )

        return job

    # (name, weight in the part's time, job): the harness repeats what the replay checks do.
    jobs: list[tuple[str, float, Callable[[float], dict[str, Any]]]] = [
        (f"{backend}/{mode}/{kind}", weight, replay_job(graph_config(opts, backend, mode)))
        for backend, mode, weight in GRAPH_CHECKS
        if backend in opts.backends
    ]
    if opts.harness_steps > 0:
        jobs.append(("harness/torch/check_graph_safety", 0.6, lambda until: _harness_check(opts)))
        jobs.append(("harness/unlisted-sync-op", 0.2, lambda until: _unlisted_sync_check(opts)))
    statuses = []
    for i, (name, weight, job) in enumerate(jobs):
        share = weight / sum(w for _, w, _ in jobs[i:])
        until = time.monotonic() + (deadline - time.monotonic()) * share
        if not _cuda_alive(device):
            check = {"status": "error", "reason": "the CUDA context is broken by an earlier error"}
        else:
            try:
                check = job(until)
            except Exception as exc:
                check = {"status": "error", "error": _error_text(exc, 2000),
                         "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        _record_check(opts, name, check)
        statuses.append(check["status"])
    return {"status": overall_status(statuses), "checks": [name for name, _, _ in jobs]}


def run_compiled_part(opts: Options, deadline: float) -> dict[str, Any]:
    """torch.compile(fullgraph=True) of the step, captured by hand on CUDA, against an eager
    twin over the same churn as the graph part."""
    device = opts.device()
    config = graph_config(opts, "torch", "raw_logprobs")
    name = "torch/raw_logprobs/" + ("compiled+cuda-graph" if device.type == "cuda" else "compiled")
    try:
        check = replay_check(
            lambda: Sampler(config, device),
            CompiledReplayer,
            steps=opts.steps,
            seed=opts.seed + 1,
            deadline=deadline,
        )
        frames = check.get("compile_frames")
        if check["status"] == "passed" and frames not in (None, 1):
            check["status"] = "failed"
            check["failures"].append(f"compiled {frames} times as the batch churned (want 1)")
    except Exception as exc:
        check = {"status": "error", "error": _error_text(exc, 2000),
                 "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
    _record_check(opts, name, check)
    return {"status": check["status"], "checks": [name]}


# ----------------------------------------------------------------- benchmarks

BENCH_CASES: tuple[str, ...] = (*stages.STAGES, "all")
"""Each feature alone (bench.stages' stage names), then every feature at once."""
LOGPROBS_CASES = ("logprobs", "all")
BENCH_K = stages.MAX_NUM_LOGPROBS
PROMPT_LEN = 512
OUTPUT_LEN = 128
BIAS_ENTRIES = 32
EAGER_PASS_SHARE = 0.55
"""Of the bench part's time, what the eager pass may take when a compiled pass follows."""
MAX_FAILURES_IN_A_ROW = 3
COMPILE_ESTIMATE_S = 60.0
"""Assumed cost of a Sampler compile until one has been measured in the run."""
BENCH_JSON = "bench.json"
BENCH_MD = "bench.md"
FLASHINFER = "flashinfer"


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


SAMPLER_PROVIDERS = (
    "sampler-compiled-graph",
    "sampler-graph",
    "sampler-triton-graph",
    "sampler-compiled",
    "sampler-eager",
    "sampler-triton",
)
"""Column order in bench.md: the first present is the headline provider."""


class Timer:
    """`triton.testing.do_bench_cudagraph` on CUDA (the call captured n times in one graph,
    median of 10 replays), the wall-clock median of `rounds` calls on the CPU."""

    def __init__(self, device: torch.device, rep_ms: int, cpu_rounds: int) -> None:
        self.device = device
        self.rep_ms = rep_ms
        self.cpu_rounds = cpu_rounds
        self.name = "do_bench_cudagraph" if device.type == "cuda" else "wall-clock median"

    def __call__(
        self, fn: Callable[[], object], *, fallback: bool = False
    ) -> tuple[tuple[float, float, float], int, dict[str, Any]]:
        """((median, p20, p80) µs, rounds, notes). fallback: when the capture fails, time
        eagerly with `triton.testing.do_bench` instead of raising (for peers)."""
        if self.device.type != "cuda":
            timing = time_rounds(lambda: fn(), lambda: (), rounds=self.cpu_rounds, warmup=1)
            return (timing.median_us, timing.p20_us, timing.p80_us), timing.rounds, {}
        from triton.testing import do_bench, do_bench_cudagraph

        quantiles = [0.5, 0.2, 0.8]
        try:
            ms = do_bench_cudagraph(fn, rep=self.rep_ms, quantiles=quantiles)
            notes: dict[str, Any] = {"timer": "do_bench_cudagraph"}
        except Exception as exc:
            if not fallback:
                raise
            torch.cuda.synchronize()
            ms = do_bench(fn, rep=self.rep_ms, quantiles=quantiles)
            notes = {"timer": "do_bench (no graph)", "capture_error": _error_text(exc, 300)}
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
            _sync(self.device)  # the timers run on side streams
        return self.full[vocab][:rows]


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
            self.samplers[key] = _sampler_or_reason(config, self.device)
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
        _sync(self.device)
        self.loaded[id(sampler)] = (case, rows)
        return time.perf_counter() - start


class BenchBook:
    """bench.json and bench.md, rewritten after every case (a killed run keeps its cases)."""

    def __init__(self, opts: Options, context: dict[str, Any]) -> None:
        self.path = opts.out / BENCH_JSON
        self.md_path = opts.out / BENCH_MD
        existing = None
        if self.path.exists():
            with contextlib.suppress(ValueError, OSError):
                existing = Results.read(self.path)
        if existing is not None:
            self.results = existing
            self.results.context.update(
                {k: v for k, v in context.items() if k not in existing.context}
            )
        else:
            self.results = Results(context, [])
        self.results.context.setdefault("notes", [])
        self.results.context.setdefault("errors", [])

    def has(self, name: str) -> bool:
        return any(c.name == name for c in self.results.cases)

    def floor_of(self, rows: int, vocab: int) -> bool:
        return any(
            c.provider == FLOOR_PROVIDER and (c.rows, c.vocab) == (rows, vocab)
            for c in self.results.cases
        )

    def note(self, text: str) -> None:
        if text not in self.results.context["notes"]:
            self.results.context["notes"].append(text)
            _say(text)
        self.write()

    def error(self, what: str, exc: BaseException) -> None:
        self.results.context["errors"].append(f"{what}: {_error_text(exc, 800)}")
        _say(f"{what}: {_error_text(exc, 300)}")
        self.write()

    def add(self, case: CaseResult) -> None:
        self.results.cases.append(case)
        self.write()

    def write(self) -> None:
        fill_ratios(self.results.cases)
        fill_flashinfer_ratios(self.results.cases)
        write_json(self.path, self.results.to_json())
        tmp = self.md_path.with_name(self.md_path.name + ".tmp")
        tmp.write_text(format_markdown(self.results), encoding="utf-8")
        os.replace(tmp, self.md_path)


def fill_flashinfer_ratios(cases: Sequence[CaseResult]) -> None:
    """extra["ratio_to_flashinfer"]: a case's median over FlashInfer's on the same case and
    shape, or over FlashInfer's top-k/top-p sampling when FlashInfer has nothing for the
    case (extra["flashinfer_ref"] names which)."""
    peer = {
        (c.stage, c.rows, c.vocab, c.dtype): c.median_us for c in cases if c.provider == FLASHINFER
    }
    for c in cases:
        c.extra.pop("ratio_to_flashinfer", None)
        c.extra.pop("flashinfer_ref", None)
        if c.provider in (FLASHINFER, FLOOR_PROVIDER):
            continue
        for stage in (c.stage, "top_k_top_p"):
            ref = peer.get((stage, c.rows, c.vocab, c.dtype))
            if ref:
                c.extra["ratio_to_flashinfer"] = round(c.median_us / ref, 4)
                c.extra["flashinfer_ref"] = stage
                break


def _us(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else (f"{value:.2f}" if value < 100 else f"{value:.0f}")


def format_markdown(results: Results) -> str:
    """bench.md: the floor per shape, then one line per case and shape with every provider's
    µs (and ratio to the floor), the headline provider's GB/s and its ratio to FlashInfer."""
    ctx = results.context
    cases = results.cases
    by_key = {(c.stage, c.provider, c.rows, c.vocab): c for c in cases}
    floors = {(c.rows, c.vocab): c for c in cases if c.provider == FLOOR_PROVIDER}
    present = [p for p in SAMPLER_PROVIDERS if any(c.provider == p for c in cases)]
    lines = [
        "# gpu_check benchmarks",
        "",
        f"{ctx.get('device_name', '?')} · torch {ctx.get('torch', '?')} · triton "
        f"{ctx.get('triton', '?')} · FlashInfer {ctx.get('flashinfer') or '–'} · timer "
        f"{ctx.get('timer', '?')} · {ctx.get('created', '')} · commit {ctx.get('commit')}",
        "",
        "Times are µs per call (median); `x floor` is over the floor of the same shape "
        "(one captured copy of the logits); `x FI` is the headline Sampler provider over "
        "FlashInfer on the same case († over FlashInfer's top-k/top-p sampling, where "
        "FlashInfer has nothing for the case). float32 logits.",
        *(
            [
                "",
                f"`{SPEC_STAGE}`: speculative decoding's verification step (`RejectionSampler`, "
                "draft probabilities given); its rows are requests x (S + 1) target-logits rows "
                "(extra: requests, max_spec_len), so its floor is a copy of the target logits.",
            ]
            if any(c.stage == SPEC_STAGE for c in cases)
            else []
        ),
        "",
        "## Floor",
        "",
        "| rows | vocab | MB | µs | read GB/s | copy GB/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for (rows, vocab), f in sorted(floors.items()):
        mb = rows * vocab * 4 / 1e6
        copy = f.extra.get("copy_gbps")
        lines.append(
            f"| {rows} | {vocab} | {mb:.3g} | {_us(f.median_us)} | {_ratio(f.gbps)} | "
            f"{_ratio(copy)} |"
        )
    shapes = sorted({(c.rows, c.vocab, c.stage) for c in cases if c.provider != FLOOR_PROVIDER},
                    key=lambda s: (s[0] * s[1], s[1], BENCH_CASES.index(s[2])
                                   if s[2] in BENCH_CASES else 99))  # fmt: skip
    head = ["case", "rows", "vocab", "floor µs"]
    head += [f"{p} µs (x floor)" for p in present]
    head += ["GB/s", "FlashInfer µs", "FlashInfer function", "x FI"]
    lines += ["", "## Cases", "", "| " + " | ".join(head) + " |",
              "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]  # fmt: skip
    for rows, vocab, stage in shapes:
        floor = floors.get((rows, vocab))
        cells = [stage, str(rows), str(vocab), _us(floor.median_us if floor else None)]
        headline = None
        for p in present:
            c = by_key.get((stage, p, rows, vocab))
            cells.append("–" if c is None else f"{_us(c.median_us)} ({_ratio(c.ratio_to_floor)})")
            headline = headline or c
        fi = by_key.get((stage, FLASHINFER, rows, vocab))
        ratio = headline.extra.get("ratio_to_flashinfer") if headline else None
        dagger = (
            " †" if headline and headline.extra.get("flashinfer_ref") not in (None, stage) else ""
        )
        cells += [
            _ratio(headline.gbps if headline else None),
            _us(fi.median_us if fi else None),
            fi.extra.get("function", "") if fi else "",
            _ratio(ratio) + dagger if ratio is not None else "–",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    kernel_cases = [c for c in cases if c.provider.startswith(CANDIDATES_PROVIDER)]
    if kernel_cases:
        lines += ["", "## top-k/top-p kernel: candidate buffer vs search alone", "",
                  "| case | rows | vocab | candidates | µs (x floor) | mean reads of a row |",
                  "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for c in sorted(kernel_cases, key=lambda c: (c.rows * c.vocab, c.stage, c.provider)):
            lines.append(
                f"| {c.stage} | {c.rows} | {c.vocab} | {c.extra.get('candidates')} | "
                f"{_us(c.median_us)} ({_ratio(c.ratio_to_floor)}) | {c.extra.get('mean_reads')} |"
            )
    for title, key in (("Notes", "notes"), ("Errors", "errors")):
        if ctx.get(key):
            lines += ["", f"## {title}", ""] + [f"- {n}" for n in ctx[key]]
    return "\n".join(lines) + "\n"


def _case_result(
    stage: str,
    provider: str,
    rows: int,
    vocab: int,
    timed: tuple[tuple[float, float, float], int, dict[str, Any]],
    extra: dict[str, Any],
) -> CaseResult:
    (median, p20, p80), rounds, notes = timed
    return CaseResult(
        stage=stage,
        provider=provider,
        rows=rows,
        vocab=vocab,
        dtype="float32",
        median_us=median,
        p20_us=p20,
        p80_us=p80,
        gbps=logits_gbps(rows, vocab, torch.float32, median),
        rounds=rounds,
        extra={**notes, **extra},
    )


def _time_floor(book: BenchBook, timer: Timer, logits: torch.Tensor) -> None:
    rows, vocab = logits.shape
    out = torch.empty_like(logits)
    timed = timer(lambda: out.copy_(logits))
    median = timed[0][0]
    extra = {"copy_gbps": round(2 * logits.numel() * 4 / (median * 1e3), 1), "what": "copy_"}
    book.add(_case_result("floor", FLOOR_PROVIDER, rows, vocab, timed, extra))


def run_bench_part(opts: Options, deadline: float) -> dict[str, Any]:
    """Pass 1: the floor and the eager Sampler (each backend), graph-captured, over the whole
    grid. Pass 2, in the time left: the compiled Sampler, graph-captured (compiled_order)."""
    device = opts.device()
    started = time.monotonic()
    timer = Timer(device, opts.rep_ms, opts.cpu_rounds)
    context = run_context(device, suite="perf/gpu_check.py", timer=timer.name, rep_ms=opts.rep_ms,
                          flashinfer=flashinfer_version())  # fmt: skip
    book = BenchBook(opts, context)
    grid = case_grid(opts.rows, opts.vocabs, opts.cases)
    logits = LogitsCache(device, max(opts.rows), opts.seed)
    pool = SamplerPool(device, max(opts.rows), opts.seed)
    cuda = device.type == "cuda"
    compiling = cuda or opts.smoke_compile
    # The eager pass may take EAGER_PASS_SHARE of the part when a compiled pass follows.
    eager_until = started + (deadline - started) * (EAGER_PASS_SHARE if compiling else 1.0)
    incomplete = False
    broken = False
    failures: dict[str, int] = {}  # provider -> errors in a row

    def measure(label: str, fn: Callable[[], None], provider: str) -> None:
        """Run one measurement; an error is recorded and the part goes on. A provider that
        failed MAX_FAILURES_IN_A_ROW times in a row is not tried again."""
        nonlocal broken
        if failures.get(provider, 0) >= MAX_FAILURES_IN_A_ROW:
            return
        try:
            fn()
            failures[provider] = 0
        except Exception as exc:
            book.error(label, exc)
            failures[provider] = failures.get(provider, 0) + 1
            if failures[provider] == MAX_FAILURES_IN_A_ROW:
                book.note(
                    f"{provider} failed {MAX_FAILURES_IN_A_ROW} times in a row: not tried again"
                )
            if not _cuda_alive(device):
                broken = True
                book.note("the CUDA context broke; the rest of the part was not run")

    for rows, vocab, case in grid:
        if broken:
            break
        if time.monotonic() > eager_until:
            book.note(f"eager pass stopped at {case} R{rows}-V{vocab}: its time was up")
            incomplete = True
            break
        x = logits.get(rows, vocab)
        if not book.floor_of(rows, vocab):
            floor = functools.partial(_time_floor, book, timer, x)
            measure(f"floor R{rows}-V{vocab}", floor, FLOOR_PROVIDER)
        for backend in opts.backends:
            sampler = pool.get(vocab, case_logprobs(case), backend)
            kind = "sampler" if backend == "torch" else "sampler-triton"
            if isinstance(sampler, str):
                book.note(f"{provider_name(kind, device)}: {sampler}")
                continue

            def run(sampler: Sampler = sampler, kind: str = kind, x: torch.Tensor = x,
                    rows: int = rows, vocab: int = vocab, case: str = case,
                    backend: str = backend) -> None:  # fmt: skip
                update_s = pool.load(sampler, case, rows)
                timed = timer(lambda: sampler(x))
                extra = {"backend": backend, "max_num_logprobs": sampler.config.max_num_logprobs,
                         "update_s": round(update_s, 3)}  # fmt: skip
                book.add(_case_result(case, provider_name(kind, device), rows, vocab, timed, extra))

            name = provider_name(kind, device)
            measure(f"{case} {name} R{rows}-V{vocab}", run, name)
        # on the interpreter (--cpu-smoke) the buffer costs seconds a row: one shape only
        smoke_shape = rows == min(opts.rows) and case == CANDIDATE_CASES[-1]
        if case in CANDIDATE_CASES and "triton" in opts.backends and (cuda or smoke_shape):
            ab = functools.partial(_time_candidates, book, timer, x, case)
            measure(f"{case} {CANDIDATES_PROVIDER} R{rows}-V{vocab}", ab, CANDIDATES_PROVIDER)

    if compiling and not broken and "torch" in opts.backends:
        incomplete |= _compiled_pass(opts, deadline, grid, book, timer, logits, pool, measure)
    errors = book.results.context.get("errors")
    status = "error" if broken else "failed" if errors else "incomplete" if incomplete else "passed"
    return {"status": status, "cases": len(book.results.cases), "errors": len(errors or [])}


CANDIDATE_CASES = ("top_k_top_p", "all")
CANDIDATES_PROVIDER = "kernel-top-k-top-p"
"""The top-k/top-p kernel alone, with its candidate buffer and without (provider
`kernel-top-k-top-p-c<candidates>`): which default is faster on this GPU."""


def _time_candidates(book: BenchBook, timer: Timer, x: torch.Tensor, case: str) -> None:
    """Time `top_k_top_p_threshold` on x at the stage's top_k and top_p (with min_p for
    "all") with the candidate buffer (one read a settled row) and with the search alone
    (candidates 0), recording each one's mean reads of a row. On CUDA the buffer is the
    kernel's default size over 1,024-element tiles; on the interpreter (--cpu-smoke) 64 over
    128 (still enough for top_k 50; the full size takes seconds a row there)."""
    from graphsafe_sampler.kernels.top_k_top_p import CANDIDATES
    from graphsafe_sampler.kernels.top_k_top_p import launch_top_k_top_p as launch

    device = x.device
    rows, vocab = x.shape
    candidates, block = (CANDIDATES, 1024) if device.type == "cuda" else (64, 128)
    slots = torch.arange(rows, device=device)
    top_k = torch.full((rows,), stages.TOP_K, dtype=torch.int32, device=device)
    top_p = torch.full((rows,), stages.TOP_P, dtype=torch.float32, device=device)
    min_p = torch.full((rows,), stages.MIN_P, device=device) if case == "all" else None
    threshold = torch.empty(rows, device=device)
    reads = torch.empty(rows, dtype=torch.int32, device=device)
    for c in (candidates, 0):
        launch(x, slots, top_k, top_p, threshold, False, min_p, reads, c, block)
        mean_reads = float(reads.float().mean())  # untimed, outside any capture

        def call(c: int = c) -> None:
            launch(x, slots, top_k, top_p, threshold, False, min_p, None, c, block)

        timed = timer(call)
        extra = {"candidates": c, "block_size": block, "mean_reads": round(mean_reads, 2)}
        book.add(_case_result(case, f"{CANDIDATES_PROVIDER}-c{c}", rows, vocab, timed, extra))


def _compiled_pass(
    opts: Options,
    deadline: float,
    grid: Sequence[tuple[int, int, str]],
    book: BenchBook,
    timer: Timer,
    logits: LogitsCache,
    pool: SamplerPool,
    measure: Callable[[str, Callable[[], None], str], None],
) -> bool:
    """The compiled Sampler (`torch.compile(fullgraph=True)` of `forward`, rows dynamic),
    graph-captured, in `compiled_order`; a compile starts only when its estimated cost fits
    in the time left. Returns True when some case was left out."""
    from torch._dynamo.testing import CompileCounterWithBackend

    device = timer.device
    dynamo_config = torch._dynamo.config
    for limit in ("recompile_limit", "cache_size_limit"):  # 4 samplers x 2 programs each
        if hasattr(dynamo_config, limit):
            setattr(dynamo_config, limit, max(64, getattr(dynamo_config, limit)))
    provider = provider_name("sampler-compiled", device)
    compiled: dict[tuple[int, int], tuple[Callable[..., Any], Any]] = {}
    programs: set[tuple[int, int, bool]] = set()
    estimate = COMPILE_ESTIMATE_S
    left_out = 0
    for rows, vocab, case in compiled_order(grid):
        k = case_logprobs(case)
        program = (vocab, k, rows == 1)
        left = deadline - time.monotonic()
        if program not in programs and left < estimate + 10.0:
            left_out += 1
            book.note(
                f"{provider}: not compiled for V{vocab} K{k} rows {'1' if rows == 1 else '>1'}: "
                f"a compile takes ~{estimate:.0f} s, {left:.0f} s were left"
            )
            continue
        if left < 2.0:
            left_out += 1
            continue
        sampler = pool.get(vocab, k, "torch")
        if isinstance(sampler, str):
            continue
        if (vocab, k) not in compiled:
            counter = CompileCounterWithBackend("inductor")
            compiled[(vocab, k)] = (
                torch.compile(sampler.forward, fullgraph=True, backend=counter),
                counter,
            )
        fn, counter = compiled[(vocab, k)]
        x = logits.get(rows, vocab)

        def run(sampler: Sampler = sampler, fn: Callable[..., Any] = fn, counter: Any = counter,
                x: torch.Tensor = x, rows: int = rows, vocab: int = vocab,
                case: str = case, program: tuple[int, int, bool] = program,
                k: int = k) -> None:  # fmt: skip
            nonlocal estimate
            update_s = pool.load(sampler, case, rows)
            if rows > 1:
                torch._dynamo.maybe_mark_dynamic(x, 0)
            start = time.perf_counter()
            fn(x)  # untimed first call: compiles when the program is new
            _sync(device)
            first_s = time.perf_counter() - start
            if program not in programs:
                programs.add(program)
                estimate = max(first_s * 1.2, 10.0)
            timed = timer(lambda: fn(x))
            extra = {"backend": "torch", "max_num_logprobs": k, "update_s": round(update_s, 3),
                     "first_call_s": round(first_s, 2),
                     "compile_frames": counter.frame_count}  # fmt: skip
            book.add(_case_result(case, provider, rows, vocab, timed, extra))

        measure(f"{case} {provider} R{rows}-V{vocab}", run, provider)
    return left_out > 0


# ----------------------------------------------------------------- speculative decoding

SPEC_HEADLINE_ROWS = 64
"""The issue's case: 64 requests (S = SPEC_LEN, the first of --vocabs: 128,256 on a GPU)."""
SPEC_CHECK_WEIGHT = 1.0
SPEC_BENCH_WEIGHT = 2.0
"""Weights in the spec part's time: each replay check, and the benchmark (last)."""
SPEC_SETUP_S = 5.0
"""Added to the estimate of a benchmark shape: a capture and its replays per backend."""
SPEC_MIN_STEPS = 8
"""Steps a spec replay check runs even past its time: its setup (kernel compiles, the
capture) may outlast its share, and steps 4-6 bring the NaN/-inf rows, an over-long draft
count and an out-of-vocabulary draft (`SpecInputs`)."""


def spec_config(opts: Options, backend: str) -> SamplerConfig:
    """The graph part's every-feature config (bad words, EOS under min_tokens, the custom
    target-token processor, ...) without logprobs: the verification step returns none."""
    return replace(graph_config(opts, backend, "raw_logprobs"), max_num_logprobs=0)


def _rejection_or_reason(config: SamplerConfig, device: torch.device) -> RejectionSampler | str:
    """A RejectionSampler (SPEC_LEN) built right after its Sampler, or why this backend
    cannot be built here (see `_sampler_or_reason`)."""
    sampler = _sampler_or_reason(config, device)
    if isinstance(sampler, str):
        return sampler
    return RejectionSampler(sampler, SPEC_LEN)


def spec_bench_rows(rows: Sequence[int]) -> list[int]:
    """The speculative benchmark's request counts (--spec-rows, default the grid's --rows)
    in run order: the issue's 64 first when present, then the others, smallest first."""
    ordered = sorted(set(rows))
    if SPEC_HEADLINE_ROWS in ordered:
        ordered.remove(SPEC_HEADLINE_ROWS)
        ordered.insert(0, SPEC_HEADLINE_ROWS)
    return ordered


def spec_bench_inputs(
    rows: int, vocab: int, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """perf/bench_rejection.py's case at `rows` requests: LLM-like target logits
    [rows, S + 1, V], a draft model's probabilities [rows, S, V] (the target plus Gaussian
    noise, softmaxed), drafts drawn from them; S drafts per row, 0 to S - 1 on every eighth
    (rows 7, 15, ...). Returns (target_logits, draft_token_ids, num_draft_tokens,
    draft_probs), in `RejectionSampler.forward`'s order."""
    spec, positions = SPEC_LEN, SPEC_LEN + 1
    flat = llm_like_logits(rows * positions, vocab, seed=seed, device=device)
    target = flat.view(rows, positions, vocab)
    gen = torch.Generator(device).manual_seed(seed)
    noise = torch.randn(rows, spec, vocab, generator=gen, device=device)
    draft_probs = torch.softmax(noise.mul_(DRAFT_NOISE).add_(target[:, :spec]), dim=-1)
    del noise
    drafts = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=gen).view(rows, spec)
    num = torch.full((rows,), spec, dtype=torch.int64, device=device)
    short = num[7::8]
    short.copy_(torch.arange(short.numel(), device=device) % spec)
    _sync(device)  # the timers run on side streams
    return target, drafts, num, draft_probs


def _spec_bench(opts: Options, deadline: float) -> dict[str, Any]:
    """The verification step timed like the bench part's cases (graph replay on CUDA),
    beside the floor of its target logits, appended to bench.json: `spec_bench_rows`
    requests at the first vocabulary, per backend. A shape starts only when its estimate
    (the largest shape so far, scaled by rows, first calls left out) fits in the time left;
    a provider that failed MAX_FAILURES_IN_A_ROW times in a row is not tried again."""
    device = opts.device()
    timer = Timer(device, opts.rep_ms, opts.cpu_rounds)
    context = run_context(device, suite="perf/gpu_check.py", timer=timer.name, rep_ms=opts.rep_ms,
                          flashinfer=flashinfer_version())  # fmt: skip
    book = BenchBook(opts, context)
    vocab = opts.vocabs[0]
    order = spec_bench_rows(opts.spec_rows or opts.rows)
    pool = SamplerPool(device, max(order), opts.seed)
    per_row_s: float | None = None  # host seconds per request row, from the largest shape
    largest = 0
    failures: dict[str, int] = {}  # provider -> errors in a row (as in the bench part)
    cases = errors = 0
    incomplete = False
    for rows in order:
        left = deadline - time.monotonic()
        estimate = SPEC_SETUP_S * len(opts.backends) + (per_row_s or 0.0) * rows
        if left < estimate:
            book.note(f"{SPEC_STAGE} stopped before {rows} requests: ~{estimate:.0f} s needed, "
                      f"{left:.0f} s left")  # fmt: skip
            incomplete = True
            break
        flat = rows * (SPEC_LEN + 1)
        start = time.monotonic()
        first_calls_s = 0.0
        try:
            inputs = spec_bench_inputs(rows, vocab, device, opts.seed)
            if not book.floor_of(flat, vocab):
                _time_floor(book, timer, inputs[0].view(flat, vocab))
        except Exception as exc:
            errors += 1
            book.error(f"{SPEC_STAGE} inputs/floor R{flat}-V{vocab}", exc)
            if not _cuda_alive(device):
                return {"status": "error", "reason": "the CUDA context broke", "cases": cases}
            continue
        for backend in opts.backends:
            kind = "sampler" if backend == "torch" else "sampler-triton"
            name = provider_name(kind, device)
            rejection = pool.get_rejection(vocab, backend, SPEC_LEN)
            if isinstance(rejection, str):
                book.note(f"{SPEC_STAGE} {name}: {rejection}")
                continue
            if failures.get(name, 0) >= MAX_FAILURES_IN_A_ROW:
                continue
            try:
                update_s = pool.load(rejection, SPEC_STAGE, rows)
                first = time.perf_counter()
                out = rejection(*inputs)  # untimed: kernel compiles, lazy inits
                accepted = float(out.num_accepted.float().mean())
                first_s = time.perf_counter() - first
                first_calls_s += first_s
                timed = timer(functools.partial(rejection, *inputs))
                extra = {"backend": backend, "requests": rows, "max_spec_len": SPEC_LEN,
                         "draft_probs": True, "max_num_logprobs": 0,
                         "update_s": round(update_s, 3), "first_call_s": round(first_s, 2),
                         "accepted_per_request": round(accepted, 2)}  # fmt: skip
                book.add(_case_result(SPEC_STAGE, name, flat, vocab, timed, extra))
                cases += 1
                failures[name] = 0
            except Exception as exc:
                errors += 1
                failures[name] = failures.get(name, 0) + 1
                book.error(f"{SPEC_STAGE} {name} R{flat}-V{vocab}", exc)
                if failures[name] == MAX_FAILURES_IN_A_ROW:
                    book.note(f"{SPEC_STAGE} {name} failed {MAX_FAILURES_IN_A_ROW} times in a row: "
                              "not tried again")  # fmt: skip
                if not _cuda_alive(device):
                    return {"status": "error", "reason": "the CUDA context broke", "cases": cases}
        del inputs
        if rows >= largest:
            largest = rows
            per_row_s = max(0.0, time.monotonic() - start - first_calls_s) / rows
    status = "failed" if errors else "incomplete" if incomplete else "passed"
    return {"status": status, "cases": cases, "errors": errors, "vocab": vocab, "rows": order}


def run_spec_part(opts: Options, deadline: float) -> dict[str, Any]:
    """The RejectionSampler: its replay checks (per backend, with the draft model's
    probabilities and with n-gram drafts) into graph_check.json, then its benchmark into
    bench.json (`_spec_bench`)."""
    device = opts.device()
    cuda = device.type == "cuda"
    make_replayer: MakeReplayer = CudaGraphReplayer if cuda else MakeFxReplayer
    kind = CudaGraphReplayer.kind if cuda else MakeFxReplayer.kind

    def replay_job(backend: str, with_probs: bool) -> Callable[[float], dict[str, Any]]:
        config = spec_config(opts, backend)

        def job(until: float) -> dict[str, Any]:
            probe = _rejection_or_reason(config, device)
            if isinstance(probe, str):
                return {"status": "skipped", "reason": probe}
            del probe

            def make() -> RejectionSampler:
                return RejectionSampler(Sampler(config, device), SPEC_LEN)

            check = replay_check(
                make,
                make_replayer,
                steps=opts.steps,
                seed=opts.seed,
                deadline=until,
                step_fn=rejection_step(with_probs),
                make_inputs=functools.partial(SpecInputs, with_probs=with_probs),
                record=record_accepted,
                output_names=SPEC_OUTPUT_NAMES,
                min_steps=min(SPEC_MIN_STEPS, opts.steps),
            )
            return {**check, "draft_probs": with_probs}

        return job

    # (name, weight in the part's time, job); triton first, as in the graph part.
    jobs: list[tuple[str, float, Callable[[float], dict[str, Any]]]] = [
        (f"{SPEC_STAGE}/{backend}/{drafts}/{kind}", SPEC_CHECK_WEIGHT,
         replay_job(backend, with_probs))
        for backend in ("triton", "torch")
        if backend in opts.backends
        for drafts, with_probs in (("draft_probs", True), ("ngram", False))
    ]  # fmt: skip
    jobs.append(("bench", SPEC_BENCH_WEIGHT, lambda until: _spec_bench(opts, until)))
    checks: list[str] = []
    statuses = []
    bench: dict[str, Any] = {}
    for i, (name, weight, job) in enumerate(jobs):
        share = weight / sum(w for _, w, _ in jobs[i:])
        until = time.monotonic() + (deadline - time.monotonic()) * share
        if not _cuda_alive(device):
            result = {"status": "error", "reason": "the CUDA context is broken by an earlier error"}
        else:
            try:
                result = job(until)
            except Exception as exc:
                result = {"status": "error", "error": _error_text(exc, 2000),
                          "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        if name == "bench":
            bench = result
        else:
            _record_check(opts, name, result)
            checks.append(name)
        statuses.append(result["status"])
    return {"status": overall_status(statuses), "checks": checks, "bench": bench}


def flashinfer_call(
    fi: Any, case: str, rows: int, device: torch.device
) -> tuple[str, Callable[[torch.Tensor], object]] | None:
    """FlashInfer's function for a case (name, call on float32 logits), or None where it has
    none (penalties, bias, greedy, logprobs). They sample or renormalise rather than mask,
    and ignore per-request seeds: a cost reference, not the same work."""
    top_k = torch.full((rows,), stages.TOP_K, dtype=torch.int32, device=device)
    top_p = torch.full((rows,), stages.TOP_P, dtype=torch.float32, device=device)
    min_p = torch.full((rows,), stages.MIN_P, dtype=torch.float32, device=device)
    calls: dict[str, tuple[str, Callable[[torch.Tensor], object]]] = {
        "top_k": ("top_k_sampling_from_probs",
                  lambda x: fi.top_k_sampling_from_probs(torch.softmax(x, dim=-1), top_k)),
        "top_p": ("top_p_sampling_from_probs",
                  lambda x: fi.top_p_sampling_from_probs(torch.softmax(x, dim=-1), top_p)),
        "top_k_top_p": ("top_k_top_p_sampling_from_logits",
                        lambda x: fi.top_k_top_p_sampling_from_logits(x, top_k, top_p)),
        "min_p": ("min_p_sampling_from_probs",
                  lambda x: fi.min_p_sampling_from_probs(torch.softmax(x, dim=-1), min_p)),
        "sampling": ("sampling_from_logits", lambda x: fi.sampling_from_logits(x)),
        "all": ("top_k_top_p_sampling_from_logits",
                lambda x: fi.top_k_top_p_sampling_from_logits(x / 0.8, top_k, top_p)),
    }  # fmt: skip
    return calls.get(case)


def run_flashinfer_part(opts: Options, deadline: float) -> dict[str, Any]:
    """FlashInfer on the benchmark grid, appended to bench.json (floors timed where the
    bench part left none). The first call of each function is untimed (FlashInfer may
    JIT-compile it)."""
    if importlib.util.find_spec("flashinfer") is None:
        return {"status": "skipped", "reason": "flashinfer is not installed"}
    from flashinfer import sampling as fi

    device = opts.device()
    timer = Timer(device, opts.rep_ms, opts.cpu_rounds)
    context = run_context(device, suite="perf/gpu_check.py", timer=timer.name, rep_ms=opts.rep_ms,
                          flashinfer=flashinfer_version())  # fmt: skip
    book = BenchBook(opts, context)
    book.results.context["flashinfer"] = flashinfer_version()
    logits = LogitsCache(device, max(opts.rows), opts.seed)
    incomplete = False
    errors = 0
    for rows, vocab, case in case_grid(opts.rows, opts.vocabs, opts.cases):
        if time.monotonic() > deadline:
            book.note(f"flashinfer stopped at {case} R{rows}-V{vocab}: its time was up")
            incomplete = True
            break
        x = logits.get(rows, vocab)
        try:
            if not book.floor_of(rows, vocab):
                _time_floor(book, timer, x)
            call = flashinfer_call(fi, case, rows, device)
            if call is None or book.has(f"{case}/{FLASHINFER}/R{rows}-V{vocab}-float32"):
                continue
            function, fn = call
            start = time.perf_counter()
            fn(x)
            _sync(device)
            first_s = time.perf_counter() - start
            timed = timer(functools.partial(fn, x), fallback=True)
            extra = {"function": function, "first_call_s": round(first_s, 2)}
            book.add(_case_result(case, FLASHINFER, rows, vocab, timed, extra))
        except Exception as exc:
            errors += 1
            book.error(f"flashinfer {case} R{rows}-V{vocab}", exc)
            if not _cuda_alive(device):
                return {"status": "error", "reason": "the CUDA context broke"}
    status = "failed" if errors else "incomplete" if incomplete else "passed"
    return {"status": status, "errors": errors}


# ----------------------------------------------------------------- tests on CUDA

TESTS_SELECTION = "cuda or kernel"
"""The tests that touch CUDA: parametrised by the `device` fixture ([cuda] ids) and the
Triton kernel tests (compiled for real under TRITON_INTERPRET=0)."""


def summarize_junit(path: Path) -> dict[str, Any]:
    """Counts and failing test ids from a pytest junit XML file."""
    root = ET.parse(path).getroot()
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    counter_of = {"failure": "failures", "error": "errors", "skipped": "skipped"}
    failed: list[str] = []
    cpu_tensor = 0
    for case in root.iter("testcase"):
        counts["tests"] += 1
        for outcome, counter in counter_of.items():
            node = case.find(outcome)
            if node is None:
                continue
            counts[counter] += 1
            if outcome != "skipped":
                failed.append(f"{case.get('classname')}::{case.get('name')}")
                text = f"{node.get('message', '')} {node.text or ''}".lower()
                if "cpu tensor" in text or "pointer argument" in text:
                    cpu_tensor += 1
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    summary: dict[str, Any] = {**counts, "failed": failed[:60]}
    if cpu_tensor:
        summary["note"] = (
            f"{cpu_tensor} failures passed CPU tensors to compiled Triton kernels: those tests "
            "need a device parameter to run on CUDA"
        )
    return summary


def run_subprocess(
    cmd: Sequence[str],
    timeout_s: float,
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> tuple[str, int | None, float]:
    """Run `cmd` in its own process group, output to `log_path`, for at most `timeout_s`:
    past `soft_timeout(timeout_s)` the whole group (pytest's or inductor's workers
    included) gets SIGINT, then SIGTERM, then SIGKILL at `timeout_s`.
    Returns ("ok" | "failed" | "timeout", return code, seconds)."""
    start = time.monotonic()
    soft = soft_timeout(timeout_s)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=soft)
        except subprocess.TimeoutExpired:
            _stop_group(proc, timeout_s - soft)
            return "timeout", None, time.monotonic() - start
        except BaseException:
            _stop_group(proc, 2.0)
            raise
    return ("ok" if rc == 0 else "failed"), rc, time.monotonic() - start


def soft_timeout(timeout_s: float) -> float:
    """When a part of `timeout_s` gets its SIGINT: INTERRUPT_GRACE_S before the end, or
    halfway through a short one."""
    return max(timeout_s - INTERRUPT_GRACE_S, timeout_s / 2, 0.5)


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGINT, SIGTERM, then SIGKILL to the process group we started, within `grace_s`
    (plus a few seconds for the kill)."""
    ladder = ((signal.SIGINT, 0.6 * grace_s), (signal.SIGTERM, 0.4 * grace_s))
    for sig, wait_s in (*ladder, (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=max(0.1, wait_s))
            return
        except subprocess.TimeoutExpired:
            continue


def _child_env(opts: Options) -> dict[str, str]:
    """TRITON_INTERPRET=0 on a GPU (kernels compile for real), 1 in the CPU smoke run; the
    checkout on PYTHONPATH in case the package is not installed."""
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1" if opts.cpu_smoke else "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_tests_part(opts: Options, timeout_s: float) -> dict[str, Any]:
    """pytest on CUDA: first the tests that touch CUDA, then (--tests-scope all) the rest."""
    deadline = time.monotonic() + timeout_s
    runs = [("pytest", ["-k", TESTS_SELECTION])]
    if opts.tests_scope == "all":
        runs.append(("pytest-rest", ["-k", f"not ({TESTS_SELECTION})"]))
    out: dict[str, Any] = {"runs": {}}
    statuses = []
    for label, selection in runs:
        left = deadline - time.monotonic()
        if left < 15.0:
            out["runs"][label] = {"status": "skipped", "reason": f"budget: {left:.0f} s left"}
            continue
        xml = opts.out / f"{label}.xml"
        cmd = [sys.executable, "-m", "pytest", "tests", *selection, "-q", "--durations=15",
               "-p", "no:cacheprovider", f"--junitxml={xml}",
               "--ignore=tests/test_gpu_check.py"]  # fmt: skip
        ran, rc, seconds = run_subprocess(
            cmd, left, opts.out / f"{label}.log", env=_child_env(opts)
        )
        # pytest exit codes: 0 all passed, 1 some failed, 5 nothing collected.
        status = {"ok": "passed", "timeout": "timeout"}.get(ran, "failed" if rc == 1 else "error")
        run: dict[str, Any] = {"status": status, "returncode": rc, "seconds": round(seconds, 1),
                               "command": " ".join(cmd), "log": f"{label}.log"}  # fmt: skip
        if xml.exists():
            try:
                run["junit"] = summarize_junit(xml)
            except ET.ParseError as exc:
                run["junit_error"] = _error_text(exc)
        out["runs"][label] = run
        statuses.append(status)
    out["status"] = overall_status(statuses)
    write_json(opts.out / "tests.json", out)
    return out


# ----------------------------------------------------------------- orchestration

RUNNERS: dict[str, Callable[[Options, float], dict[str, Any]]] = {
    "graph": run_graph_part,
    "bench": run_bench_part,
    "spec": run_spec_part,
    "flashinfer": run_flashinfer_part,
    "compiled": run_compiled_part,
}


def _part_status_path(opts: Options, name: str) -> Path:
    return opts.out / "parts" / f"{name}.json"


def run_part_here(opts: Options, name: str, deadline: float) -> dict[str, Any]:
    """Run one part in this process, recording its outcome in parts/<name>.json."""
    path = _part_status_path(opts, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"status": "running", "pid": os.getpid()})
    try:
        result = RUNNERS[name](opts, deadline)
    except Exception as exc:
        result = {"status": "error", "error": _error_text(exc, 2000),
                  "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
    write_json(path, result)
    return result


def run_part(opts: Options, part: Part, timeout_s: float) -> dict[str, Any]:
    """One part with its allotment: pytest for "tests", otherwise this script again as a
    subprocess (`--part`), killed when it overruns (or in this process with --in-process)."""
    if part.name == "tests":
        return run_tests_part(opts, timeout_s)
    child_deadline_s = max(1.0, soft_timeout(timeout_s) - CHILD_MARGIN_S)
    if opts.in_process:
        return run_part_here(opts, part.name, time.monotonic() + child_deadline_s)
    options_path = opts.out / "parts" / "options.json"
    options_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(options_path, opts.to_json())
    cmd = [sys.executable, str(SCRIPT), opts.out_dir, "--part", part.name,
           "--options", str(options_path),
           "--deadline-unix", f"{time.time() + child_deadline_s:.3f}"]  # fmt: skip
    ran, rc, _ = run_subprocess(cmd, timeout_s, opts.out / f"{part.name}.log", env=_child_env(opts))
    result = read_json(_part_status_path(opts, part.name)) or {}
    if ran == "timeout":
        result = {**result, "status": "timeout",
                  "reason": f"killed after {timeout_s:.0f} s; results so far are kept"}  # fmt: skip
    elif result.get("status") in (None, "running"):
        result = {**result, "status": "error", "reason": f"the part exited {rc} without a result"}
    result["log"] = f"{part.name}.log"
    return result


OUTPUTS = (
    "summary.json", "env.json", GRAPH_JSON, BENCH_JSON, BENCH_MD, "tests.json",
    "pytest.log", "pytest.xml", "pytest-rest.log", "pytest-rest.xml",
    *(f"{name}.log" for name in PART_NAMES),
)  # fmt: skip
"""What a run writes to OUT_DIR (and parts/): cleared at the start of the next run there."""


def _clear_previous_results(out: Path) -> None:
    """A second run into the same folder starts from nothing (the parts merge into
    graph_check.json and bench.json, and the logs are appended to)."""
    for name in OUTPUTS:
        (out / name).unlink(missing_ok=True)
    parts = out / "parts"
    if parts.is_dir():
        for path in parts.glob("*.json"):
            path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check (see the module docstring); returns 0 when every part that ran passed."""
    ns = build_parser().parse_args(argv)
    if ns.part:
        return _child_main(ns)
    opts = options_from_args(ns)
    opts.out.mkdir(parents=True, exist_ok=True)
    _clear_previous_results(opts.out)
    budget = Budget(opts.budget_s)
    cuda = torch.cuda.is_available()
    summary: dict[str, Any] = {
        "command": " ".join(["perf/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
        "budget_s": opts.budget_s,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cuda": cuda,
        "finished": False,
        "parts": {},
    }

    def record(name: str, entry: dict[str, Any]) -> None:
        summary["parts"][name] = entry
        summary["elapsed_s"] = round(budget.elapsed(), 1)
        write_json(opts.out / "summary.json", summary)

    start = time.monotonic()
    env = environment_report(opts)
    write_json(opts.out / "env.json", env)
    record("env", {"status": "passed", "seconds": round(time.monotonic() - start, 1),
                   "outputs": ["env.json"]})  # fmt: skip
    _say(f"env: torch {env.get('torch')}, cuda {env.get('cuda_available')}, "
         f"flashinfer {env.get('flashinfer')}")  # fmt: skip

    reasons = {p.name: skip_reason(p, opts, cuda) for p in PARTS}
    pending = [p for p in PARTS if reasons[p.name] is None]
    for part in PARTS:
        reason = reasons[part.name]
        if reason is not None:
            record(part.name, {"status": "skipped", "reason": reason})
            _say(f"{part.name}: skipped ({reason})")
            continue
        timeout_s = allot(budget.remaining(), part, pending)
        pending.remove(part)
        if timeout_s < part.min_s:
            reason = f"budget: {timeout_s:.0f} s left for it, it needs {part.min_s:.0f} s"
            record(part.name, {"status": "skipped", "reason": reason, "budget": True})
            _say(f"{part.name}: skipped ({reason})")
            continue
        _say(f"{part.name}: starting, {timeout_s:.0f} s ({part.doc})")
        record(part.name, {"status": "running", "timeout_s": round(timeout_s, 1)})
        start = time.monotonic()
        try:
            result = run_part(opts, part, timeout_s)
        except Exception as exc:
            result = {"status": "error", "error": _error_text(exc, 2000)}
        result = {**result, "timeout_s": round(timeout_s, 1),
                  "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
        record(part.name, result)
        _say(f"{part.name}: {result.get('status')} in {result['seconds']} s")

    bench = opts.out / BENCH_JSON
    if bench.exists():
        with contextlib.suppress(ValueError, OSError):
            (opts.out / BENCH_MD).write_text(format_markdown(Results.read(bench)), encoding="utf-8")
    summary["finished"] = True
    # A part the budget left out makes the run incomplete; --skip and "no CUDA" do not.
    statuses = [
        "incomplete" if e.get("budget") else e.get("status", "error")
        for e in summary["parts"].values()
    ]
    summary["status"] = overall_status(statuses)
    summary["elapsed_s"] = round(budget.elapsed(), 1)
    write_json(opts.out / "summary.json", summary)
    _say(f"done in {budget.elapsed():.0f} s: {summary['status']}; results in {opts.out}")
    return 0 if summary["status"] in ("passed", "skipped") else 1


def _child_main(ns: argparse.Namespace) -> int:
    """A part in a subprocess: options from the orchestrator's file, its own deadline."""
    if ns.options is None or ns.deadline_unix is None:
        raise SystemExit("gpu_check: --part needs --options and --deadline-unix")
    data = read_json(Path(ns.options))
    if not isinstance(data, dict):
        raise SystemExit(f"gpu_check: cannot read {ns.options}")
    opts = Options.from_json(data)
    deadline = time.monotonic() + (ns.deadline_unix - time.time())
    _say(f"part {ns.part}: {deadline - time.monotonic():.0f} s")
    result = run_part_here(opts, ns.part, deadline)
    _say(f"part {ns.part}: {result.get('status')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
