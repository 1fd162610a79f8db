"""The environment report (env.json): versions and hardware."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import graphsafe_sampler
from graphsafe_sampler.bench.results import run_context

from .options import Options
from .report import error_text


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def flashinfer_version() -> str | None:
    """FlashInfer's version without importing it (None: not installed)."""
    for dist in ("flashinfer-python", "flashinfer"):
        version = _version(dist)
        if version:
            return version
    return "importable (version unknown)" if importlib.util.find_spec("flashinfer") else None


def _nvidia_smi() -> list[dict[str, str]] | str:
    fields = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return error_text(exc)
    if done.returncode != 0:
        return f"nvidia-smi exited {done.returncode}: {done.stderr.strip()[:300]}"
    keys = fields.split(",")
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
        for line in done.stdout.strip().splitlines()
    ]


def environment_report(opts: Options) -> dict[str, Any]:
    """Versions and hardware; every field is filled on its own, so one failure costs one
    field."""

    def safely(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            return f"error: {error_text(exc, 300)}"

    cuda = safely(torch.cuda.is_available)
    report: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": safely(lambda: _version("triton") or __import__("triton").__version__),
        "flashinfer": safely(flashinfer_version),
        "cuda_available": cuda,
        "graphsafe_sampler": safely(
            lambda: {
                "version": graphsafe_sampler.__version__,
                "path": str(Path(graphsafe_sampler.__file__).parent),
                "installed": _version("graphsafe-sampler") is not None,
            }
        ),
        "env": {
            k: os.environ.get(k)
            for k in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_CACHE_DIR")
        },
        "cpu_count": os.cpu_count(),
        "options": opts.to_json(),
    }
    if cuda is True:
        report["device_count"] = safely(torch.cuda.device_count)
        report["gpus"] = safely(
            lambda: [
                {
                    "name": p.name,
                    "capability": f"{p.major}.{p.minor}",
                    "memory_gib": round(p.total_memory / 2**30, 1),
                    "multiprocessors": p.multi_processor_count,
                }
                for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))
            ]
        )
        report["nvidia_smi"] = safely(_nvidia_smi)
    report["context"] = safely(lambda: run_context(opts.device()))
    return report
