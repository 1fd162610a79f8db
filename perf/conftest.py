"""pytest setup for the perf suite: `bench_*.py` collection, `--full`, and `--gs-json`.

The root pyproject keeps `python_files` at pytest's default (`test_*.py`) and `testpaths` at
`tests/`, so a plain `pytest` never runs benchmarks. This hook makes `pytest perf/` collect
the `bench_*.py` files too, without touching the project-wide configuration.

`--gs-json PATH` writes the results of every benchmark that reports through the `gs_record`
fixture in the format of `graphsafe-sampler bench` (`graphsafe_sampler.bench.results`), so
that `graphsafe-sampler compare BASE.json HEAD.json` gates either. `--full` runs the whole
grid of `bench_suite.py` instead of its short default.
"""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from graphsafe_sampler.bench.allocator import ALLOCATORS, use_allocator
from graphsafe_sampler.bench.results import (
    CaseResult,
    Results,
    dtype_name,
    fill_ratios,
    logits_gbps,
    run_context,
)

BENCH_FILES = "bench_*.py"
_CASES = pytest.StashKey[list[CaseResult]]()
_ALLOCATOR = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("graphsafe-sampler perf")
    group.addoption(
        "--gs-json",
        metavar="PATH",
        default=None,
        help="write the results as graphsafe-sampler JSON (for `graphsafe-sampler compare`)",
    )
    group.addoption(
        "--gs-allocator",
        choices=ALLOCATORS,
        default="heap",
        help="host allocator on a CPU, for every provider alike: 'heap' keeps glibc's freed "
        "memory for reuse, 'system' leaves it as it is (graphsafe_sampler/bench/allocator.py)",
    )
    group.addoption(
        "--full",
        action="store_true",
        default=False,
        help="bench_suite.py: rows {1,8,64,256} x vocab {32000,128256,151936} x "
        "{float32,bfloat16} instead of the short default",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_CASES] = []
    # the GPU's buffers come from torch's caching allocator: the host's matters on a CPU only
    on_cpu = not torch.cuda.is_available()
    config.stash[_ALLOCATOR] = use_allocator(
        config.getoption("--gs-allocator") if on_cpu else "system"
    )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if not fnmatch(file_path.name, BENCH_FILES):
        return None
    # pytest's own hook already collects paths named on the command line and files that
    # match `python_files`; collecting them here as well would run every benchmark twice.
    if parent.session.isinitpath(file_path):
        return None
    if any(fnmatch(file_path.name, pattern) for pattern in parent.config.getini("python_files")):
        return None
    return pytest.Module.from_parent(parent, path=file_path)


Record = Callable[..., None]


@pytest.fixture
def gs_record(request: pytest.FixtureRequest) -> Record:
    """record(benchmark, *, stage, provider, rows, vocab, dtype, extra=None): keep one timed
    case for `--gs-json` (nothing when the benchmark did not time, e.g. --benchmark-disable)."""
    cases = request.config.stash[_CASES]

    def record(
        benchmark: Any,
        *,
        stage: str,
        provider: str,
        rows: int,
        vocab: int,
        dtype: torch.dtype,
        extra: dict[str, Any] | None = None,
    ) -> None:
        if benchmark.stats is None:
            return
        us = np.asarray(benchmark.stats.stats.data, dtype=np.float64) * 1e6
        median = float(np.median(us))
        cases.append(
            CaseResult(
                stage=stage,
                provider=provider,
                rows=rows,
                vocab=vocab,
                dtype=dtype_name(dtype),
                median_us=median,
                p20_us=float(np.percentile(us, 20)),
                p80_us=float(np.percentile(us, 80)),
                gbps=logits_gbps(rows, vocab, dtype, median),
                rounds=len(us),
                extra=dict(extra or {}),
            )
        )

    return record


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--gs-json")
    cases = session.config.stash.get(_CASES, [])
    if path is None or not cases:
        return
    fill_ratios(cases)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    context = run_context(
        device, suite="perf (pytest-benchmark)", allocator=session.config.stash[_ALLOCATOR]
    )
    Results(context, cases).write(path)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    path = terminalreporter.config.getoption("--gs-json")
    if path is not None and terminalreporter.config.stash.get(_CASES, []):
        terminalreporter.write_line(f"graphsafe-sampler results: {path}")
