"""Subprocesses with a timeout: each in its own process group, interrupted, then
terminated, then killed, so that a hang costs its own time only."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from . import ROOT
from .options import INTERRUPT_GRACE_S, Options


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


class Background:
    """A CPU-side job run beside the parts (its own process group, output to a log), waited
    for at the end for at most what the run has left, then stopped."""

    def __init__(self, cmd: Sequence[str], log_path: Path, env: dict[str, str]) -> None:
        self.start = time.monotonic()
        self.log = open(log_path, "ab")  # noqa: SIM115 (closed in finish)
        self.proc = subprocess.Popen(
            list(cmd), stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
            start_new_session=True,
        )  # fmt: skip

    def finish(self, wait_s: float) -> tuple[str, int | None, float]:
        """("ok" | "failed" | "timeout", return code, seconds since the start)."""
        try:
            rc = self.proc.wait(timeout=max(0.1, wait_s))
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            _stop_group(self.proc, 2.0)
            status, rc = "timeout", None
        finally:
            self.log.close()
        return status, rc, time.monotonic() - self.start


def child_env(opts: Options) -> dict[str, str]:
    """TRITON_INTERPRET=0 on a GPU (kernels compile for real), 1 in the CPU smoke run; the
    checkout on PYTHONPATH in case the package is not installed."""
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1" if opts.cpu_smoke else "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env
