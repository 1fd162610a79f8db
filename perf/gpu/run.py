"""The orchestration: the environment report, then each part in its own subprocess (this
script again, `--part NAME`) with its share of the time left, and summary.json."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from graphsafe_sampler.bench.results import Results
from graphsafe_sampler.testing import speed_up_interpreter

from .bench_part import run_bench_part
from .book import format_markdown
from .cases import HEADLINE_CASES
from .environment import environment_report
from .flashinfer_part import run_flashinfer_part
from .graph_part import run_compiled_part, run_graph_part
from .kernels_part import run_kernels_part
from .options import (
    CHILD_MARGIN_S,
    PARTS,
    Budget,
    Options,
    Part,
    allot,
    build_parser,
    options_from_args,
    skip_reason,
)
from .processes import Background, child_env, run_subprocess, soft_timeout
from .report import (
    BENCH_JSON,
    BENCH_MD,
    clear_previous_results,
    error_text,
    overall_status,
    read_json,
    say,
    write_json,
)
from .spec_part import run_spec_part
from .tests_part import run_tests_part

SCRIPT = Path(__file__).resolve().parents[1] / "gpu_check.py"
"""The entry script, which a part's subprocess runs again with `--part`."""
MODEL_SCRIPT = SCRIPT.parent / "kernel_model.py"
MODEL_JSON = "model.json"
MODEL_WAIT_S = 30.0
"""At the end of the run, how long the cost model may still take (it runs beside the parts
from the start, on the CPU: about 30 s for the default grid)."""


def start_model(opts: Options) -> Background:
    """perf/kernel_model.py for the grid's rows, its largest vocabulary and the headline
    cases, on the CPU beside the parts (no device time): the estimates bench.md puts beside
    each timed kernel, for this machine's GPU (`--gpu auto`: an H100's bandwidth and SMs
    on an H100)."""
    cases = [c for c in HEADLINE_CASES if c in opts.cases] or list(HEADLINE_CASES)
    cmd = [sys.executable, str(MODEL_SCRIPT), "--rows", *map(str, opts.rows),
           "--vocab", str(max(opts.vocabs)), "--cases", *cases, "--gpu", "auto",
           "--json", str(opts.out / MODEL_JSON)]  # fmt: skip
    env = {k: v for k, v in child_env(opts).items() if k != "TRITON_INTERPRET"}
    return Background(cmd, opts.out / "model.log", env)


RUNNERS: dict[str, Callable[[Options, float], dict[str, Any]]] = {
    "kernels": run_kernels_part,
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
    if opts.cpu_smoke:  # the Triton backend through the interpreter: the same values, sooner
        speed_up_interpreter()
    try:
        result = RUNNERS[name](opts, deadline)
    except Exception as exc:
        result = {"status": "error", "error": error_text(exc, 2000),
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
    ran, rc, _ = run_subprocess(cmd, timeout_s, opts.out / f"{part.name}.log", env=child_env(opts))
    result = read_json(_part_status_path(opts, part.name)) or {}
    if ran == "timeout":
        result = {**result, "status": "timeout",
                  "reason": f"killed after {timeout_s:.0f} s; results so far are kept"}  # fmt: skip
    elif result.get("status") in (None, "running"):
        result = {**result, "status": "error", "reason": f"the part exited {rc} without a result"}
    result["log"] = f"{part.name}.log"
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check (see the module docstring); returns 0 when every part that ran passed."""
    ns = build_parser().parse_args(argv)
    if ns.part:
        return _child_main(ns)
    opts = options_from_args(ns)
    opts.out.mkdir(parents=True, exist_ok=True)
    clear_previous_results(opts.out)
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
    say(f"env: torch {env.get('torch')}, cuda {env.get('cuda_available')}, "
         f"flashinfer {env.get('flashinfer')}")  # fmt: skip

    # the cost model, on the CPU beside the parts: only where the table times kernels on CUDA
    model = start_model(opts) if cuda and not opts.cpu_smoke and "bench" not in opts.skip else None
    reasons = {p.name: skip_reason(p, opts, cuda) for p in PARTS}
    pending = [p for p in PARTS if reasons[p.name] is None]
    for part in PARTS:
        reason = reasons[part.name]
        if reason is not None:
            record(part.name, {"status": "skipped", "reason": reason})
            say(f"{part.name}: skipped ({reason})")
            continue
        timeout_s = allot(budget.remaining(), part, pending)
        pending.remove(part)
        if timeout_s < part.min_s:
            reason = f"budget: {timeout_s:.0f} s left for it, it needs {part.min_s:.0f} s"
            record(part.name, {"status": "skipped", "reason": reason, "budget": True})
            say(f"{part.name}: skipped ({reason})")
            continue
        say(f"{part.name}: starting, {timeout_s:.0f} s ({part.doc})")
        record(part.name, {"status": "running", "timeout_s": round(timeout_s, 1)})
        start = time.monotonic()
        try:
            result = run_part(opts, part, timeout_s)
        except Exception as exc:
            result = {"status": "error", "error": error_text(exc, 2000)}
        result = {**result, "timeout_s": round(timeout_s, 1),
                  "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
        record(part.name, result)
        say(f"{part.name}: {result.get('status')} in {result['seconds']} s")

    estimates = None
    if model is not None:
        status, rc, seconds = model.finish(min(MODEL_WAIT_S, max(1.0, budget.remaining() + 5)))
        estimates = read_json(opts.out / MODEL_JSON) if status == "ok" else None
        summary["model"] = {"status": status, "rc": rc, "seconds": round(seconds, 1),
                            "log": "model.log", "estimate": True}  # fmt: skip
    bench = opts.out / BENCH_JSON
    if bench.exists():
        with contextlib.suppress(ValueError, OSError):
            table = format_markdown(Results.read(bench), estimates)
            (opts.out / BENCH_MD).write_text(table, encoding="utf-8")
    summary["finished"] = True
    # A part the budget left out makes the run incomplete; --skip and "no CUDA" do not.
    statuses = [
        "incomplete" if e.get("budget") else e.get("status", "error")
        for e in summary["parts"].values()
    ]
    summary["status"] = overall_status(statuses)
    summary["elapsed_s"] = round(budget.elapsed(), 1)
    write_json(opts.out / "summary.json", summary)
    say(f"done in {budget.elapsed():.0f} s: {summary['status']}; results in {opts.out}")
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
    say(f"part {ns.part}: {deadline - time.monotonic():.0f} s")
    result = run_part_here(opts, ns.part, deadline)
    say(f"part {ns.part}: {result.get('status')}")
    return 0
