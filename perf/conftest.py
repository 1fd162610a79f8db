"""pytest setup for the perf suite: benchmark modules are named `bench_*.py`.

The root pyproject keeps `python_files` at pytest's default (`test_*.py`) and `testpaths` at
`tests/`, so a plain `pytest` never runs benchmarks. This hook makes `pytest perf/` collect
the `bench_*.py` files too, without touching the project-wide configuration.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest

BENCH_FILES = "bench_*.py"


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
