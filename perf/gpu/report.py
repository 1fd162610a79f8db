"""What the check writes: result files (atomic JSON, graph_check.json's checks, the list of
files a run leaves), its log lines, and the one-word status of several results."""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .options import PART_NAMES, Options


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


def say(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def error_text(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def error_result(exc: BaseException) -> dict[str, Any]:
    """A check that raised: an error (never a skip), with the end of its traceback. Call it
    in the `except` block, where the traceback is at hand."""
    return {"status": "error", "error": error_text(exc, 2000),
            "traceback": traceback.format_exc()[-3000:]}  # fmt: skip


def overall_status(statuses: Sequence[str]) -> str:
    """One word for several: any error/failure wins, then incomplete; only skips: skipped."""
    ran = [s for s in statuses if s != "skipped"]
    for worst in ("error", "timeout", "failed", "incomplete"):
        if worst in ran:
            return worst
    return "passed" if ran else "skipped"


GRAPH_JSON = "graph_check.json"
BENCH_JSON = "bench.json"
BENCH_MD = "bench.md"


def record_check(opts: Options, name: str, check: dict[str, Any]) -> None:
    """Add (or replace) one check in graph_check.json, with the status of them all."""
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
    say(f"{name}: {check.get('status')} ({check.get('steps_run', '-')} steps)")


OUTPUTS = (
    "summary.json", "env.json", GRAPH_JSON, BENCH_JSON, BENCH_MD, "tests.json",
    "pytest.log", "pytest.xml", "pytest-rest.log", "pytest-rest.xml",
    *(f"{name}.log" for name in PART_NAMES),
)  # fmt: skip
"""What a run writes to OUT_DIR (and parts/): cleared at the start of the next run there."""


def clear_previous_results(out: Path) -> None:
    """A second run into the same folder starts from nothing (the parts merge into
    graph_check.json and bench.json, and the logs are appended to)."""
    for name in OUTPUTS:
        (out / name).unlink(missing_ok=True)
    parts = out / "parts"
    if parts.is_dir():
        for path in parts.glob("*.json"):
            path.unlink()
