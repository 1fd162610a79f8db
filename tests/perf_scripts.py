"""Import a script of perf/ (not a package) as a module, for the tests that cover it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PERF = Path(__file__).resolve().parents[1] / "perf"


def load_perf_script(name: str) -> ModuleType:
    """perf/<name>.py as the module `name` (registered in sys.modules first: dataclasses
    resolve their annotations through it)."""
    spec = importlib.util.spec_from_file_location(name, PERF / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
