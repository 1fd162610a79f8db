"""The GPU check's modules (`perf/gpu_check.py` is the entry point and says what it does).

    options.py        the options, the parts and the time budget
    report.py         result files (graph_check.json, ...), log lines, statuses
    device.py         host syncs forbidden, a broken CUDA context
    environment.py    the environment report (env.json)
    targets.py        the Samplers the checks build: every-feature configs, backends
    replay_check.py   a step captured once, replayed against an eager twin under churn
    kernels_part.py   the kernels part: every kernel variant compiled and run on CUDA
    graph_part.py     the graph and compiled parts: Sampler.forward replayed, the harness
    cases.py          the benchmark grid: cases, shapes, requests, provider names
    book.py           bench.json and bench.md: the benchmark table
    measure.py        the timer, the logits, the benchmark's Samplers and peers, the floors
    bench_part.py     the bench part: floors, the Sampler eager and compiled, each kernel,
                      the vLLM-style peer
    spec_part.py      the spec part: RejectionSampler replayed, then timed
    flashinfer_part.py  FlashInfer on the same grid
    processes.py      subprocesses killed at their timeout
    tests_part.py     pytest on CUDA
    run.py            the orchestration: each part in its own subprocess, the cost model
                      beside them, summary.json

Importing the package makes `graphsafe_sampler` importable from a bare checkout (the
script runs on a fresh GPU machine, maybe before `pip install -e .`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""

try:  # an installed package (pip install -e .) is the normal case
    import graphsafe_sampler
except ImportError:  # a bare checkout: run from the source tree
    sys.path.insert(0, str(ROOT))
    import graphsafe_sampler  # noqa: F401


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
