"""The tests part: pytest on CUDA with TRITON_INTERPRET=0, summarised from its junit XML."""

from __future__ import annotations

import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from .options import Options
from .processes import child_env, run_subprocess
from .report import error_text, overall_status, write_json

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
        ran, rc, seconds = run_subprocess(cmd, left, opts.out / f"{label}.log", env=child_env(opts))
        # pytest exit codes: 0 all passed, 1 some failed, 5 nothing collected.
        status = {"ok": "passed", "timeout": "timeout"}.get(ran, "failed" if rc == 1 else "error")
        run: dict[str, Any] = {"status": status, "returncode": rc, "seconds": round(seconds, 1),
                               "command": " ".join(cmd), "log": f"{label}.log"}  # fmt: skip
        if xml.exists():
            try:
                run["junit"] = summarize_junit(xml)
            except ET.ParseError as exc:
                run["junit_error"] = error_text(exc)
        out["runs"][label] = run
        statuses.append(status)
    out["status"] = overall_status(statuses)
    write_json(opts.out / "tests.json", out)
    return out
