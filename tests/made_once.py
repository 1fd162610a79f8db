"""A fixture's file made once per pytest run, when pytest-xdist hands a module's tests to
more than one worker: the first worker to ask makes it under a file lock, the others wait
for it and read it, where each used to make its own (the sm_90 lowering of every kernel
variant is about a minute; the cost model's fixture, about 15 s)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def made_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]
) -> Path:
    """The path of the file `name`, made by `make(path)` unless this run has made it. Under
    pytest-xdist it lies in the run's temporary directory, the parent of each worker's base,
    which only that run's workers share; otherwise in this process's own base. A `make` that
    raises leaves no file, so the next worker to ask makes it again (and fails alike)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    with FileLock(f"{path}.lock"):
        if not path.exists():
            partial = path.with_name(f"{name}.partial")
            make(partial)
            partial.rename(path)  # whole or absent: a failed make leaves no `name`
    return path
