"""What to run: the options (defaults depend on --cpu-smoke), the parts in their run order,
and the time budget they share."""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .cases import BENCH_CASES, HEADLINE_CASES

# ----------------------------------------------------------------- parts and budget

DEFAULT_BUDGET_S = 280.0
"""The whole run, cold caches included: about 5 minutes with the interpreter's start-ups."""

PART_NAMES = ("kernels", "graph", "spec", "tests", "bench", "flashinfer", "compiled")
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
    Part("kernels", 0.10, 20.0, False, "every kernel variant compiled and run once, tiny shapes"),
    Part("graph", 0.13, 25.0, True, "CUDA-graph replay of Sampler.forward against an eager twin"),
    Part("spec", 0.12, 25.0, True, "RejectionSampler: replay vs eager twin, then its benchmark"),
    Part("tests", 0.17, 30.0, False, "pytest on CUDA with TRITON_INTERPRET=0"),
    Part("bench", 0.30, 40.0, True, "the table: floors, the step, each kernel, the peers"),
    Part("flashinfer", 0.08, 20.0, False, "FlashInfer's sampling functions on the same grid"),
    Part("compiled", 0.10, 45.0, True, "torch.compile + manual CUDA-graph capture vs eager"),
)
"""Run order, the issue's: a compile failure first and alone (every kernel variant); then
the proof (Sampler and RejectionSampler replayed against eager twins; the suites on CUDA);
then the table; the parts most likely to overrun (a compile) last, where they get whatever
the others left unused."""
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
    budget_s: float = DEFAULT_BUDGET_S
    skip: tuple[str, ...] = ()
    cpu_smoke: bool = False
    smoke_compile: bool = False
    compile_backend: str = "inductor"
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
    "rows": (1, 64, 256),
    "vocabs": (151_936,),
    "spec_rows": (),
    "cases": HEADLINE_CASES,
}
SMOKE_DEFAULTS: dict[str, Any] = {
    "steps": 12,
    "harness_steps": 6,
    "graph_rows": 6,
    "graph_vocab": 111,
    "rows": (1, 3),
    "vocabs": (1000,),
    "spec_rows": (1, 3),
    "cases": BENCH_CASES,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perf/gpu_check.py",
        description="Tests on CUDA, CUDA-graph replay checks and graph-replay benchmarks "
        "of the Sampler, in one time-boxed run (see the module docstring).",
    )
    parser.add_argument("out_dir", help="folder for the results (created if missing)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"whole run, seconds (default {DEFAULT_BUDGET_S:g})")  # fmt: skip
    parser.add_argument("--skip", nargs="+", default=[], choices=PART_NAMES, metavar="PART",
                        help=f"parts not to run, of {', '.join(PART_NAMES)}")  # fmt: skip
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="CPU versions of the parts at tiny sizes (no GPU needed)")  # fmt: skip
    parser.add_argument("--smoke-compile", action="store_true",
                        help="with --cpu-smoke: also the compiled provider and check")  # fmt: skip
    parser.add_argument("--compile-backend", default="inductor",
                        choices=("inductor", "aot_eager", "eager"),
                        help="the compiled provider's and check's torch.compile backend; aot_eager "
                        "checks the compile logic without inductor's code generation, eager "
                        "Dynamo's part of it alone (guards, dynamic rows, recompiles) in a "
                        "tenth of the time (the CPU tests)")  # fmt: skip
    parser.add_argument("--in-process", action="store_true",
                        help="run the parts in this process (no subprocess, no kill on "
                        "timeout; for debugging)")  # fmt: skip
    parser.add_argument("--steps", type=int, help="replay steps per check (GPU: 120)")
    parser.add_argument("--harness-steps", type=int, help="check_graph_safety steps (GPU: 30)")
    parser.add_argument("--graph-rows", type=int, help="max_num_reqs of the replay checks")
    parser.add_argument("--graph-vocab", type=int, help="vocab of the replay checks")
    parser.add_argument("--rows", type=int, nargs="+", help="benchmark rows (GPU: 1 64 256)")
    parser.add_argument("--vocabs", type=int, nargs="+",
                        help="benchmark vocabularies (GPU: 151936)")  # fmt: skip
    parser.add_argument("--spec-rows", type=int, nargs="+",
                        help="requests of the speculative step's benchmark, at the first of "
                        "--vocabs (GPU: the --rows, 64 first)")  # fmt: skip
    parser.add_argument("--cases", nargs="+", choices=BENCH_CASES, metavar="CASE",
                        help=f"benchmark cases, of {' '.join(BENCH_CASES)} (GPU default: "
                        f"{' '.join(HEADLINE_CASES)}; --cpu-smoke: all)")  # fmt: skip
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
        compile_backend=ns.compile_backend,
        in_process=ns.in_process,
        steps=pick("steps"),
        harness_steps=pick("harness_steps"),
        graph_rows=pick("graph_rows"),
        graph_vocab=pick("graph_vocab"),
        rows=tuple(pick("rows")),
        vocabs=tuple(pick("vocabs")),
        spec_rows=tuple(pick("spec_rows")),
        cases=tuple(ns.cases or defaults["cases"]),
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
