"""Benchmark results as JSON, and the base-vs-head regression gate.

One document per run:

    {"schema": 1,
     "context": {"device_name", "device_type", "torch", "triton", "python", "platform",
                 "cpu_count", "torch_threads", "commit", "created", "load_avg_1min", ...},
     "cases": [{"name", "stage", "provider", "rows", "vocab", "dtype", "median_us",
                "p20_us", "p80_us", "gbps", "ratio_to_floor", "ratio_to_vllm_style",
                "rounds", "extra"}, ...]}

A case is one provider timed on one shape: `name` is `stage/provider/R{rows}-V{vocab}-{dtype}`
and is what `compare` matches across runs. Times are microseconds per call. `gbps` is the
logits' bytes (rows * vocab * element size, one read) divided by the median time: how fast a
provider gets through its input, comparable with the floor's. `ratio_to_floor` is the median
over the median of the floor provider (`clone`, one pass over the logits, docs/design.md §6) on the
same rows, vocab and dtype in the same run; `ratio_to_vllm_style` the median over the
`vllm-style` provider's on the same stage and shape (below 1: faster than the peer). Either is
null when that provider was not run.

Machines are noisy, and a busy neighbour slows every provider of a run alike, so the gate
compares ratios to the in-run floor, never raw times: a case regresses when its head ratio
exceeds its base ratio by more than the threshold.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

SCHEMA_VERSION = 1
FLOOR_PROVIDER = "clone"
"""One pass over the logits: the floor every case is measured against."""
VLLM_STYLE_PROVIDER = "vllm-style"
"""The vLLM-V1-style eager peer (`graphsafe_sampler.bench.vllm_style`)."""
DEFAULT_THRESHOLD = 0.10

_CASE_FIELDS = (
    "name",
    "stage",
    "provider",
    "rows",
    "vocab",
    "dtype",
    "median_us",
    "p20_us",
    "p80_us",
    "gbps",
    "ratio_to_floor",
    "ratio_to_vllm_style",
)


def case_name(stage: str, provider: str, rows: int, vocab: int, dtype: str) -> str:
    """The key `compare` matches: `stage/provider/R{rows}-V{vocab}-{dtype}`."""
    return f"{stage}/{provider}/R{rows}-V{vocab}-{dtype}"


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


@dataclass
class CaseResult:
    """One provider on one shape. Times in microseconds; see the module docstring."""

    stage: str
    provider: str
    rows: int
    vocab: int
    dtype: str  # "float32", "bfloat16", ...
    median_us: float
    p20_us: float
    p80_us: float
    gbps: float | None = None
    ratio_to_floor: float | None = None
    ratio_to_vllm_style: float | None = None
    rounds: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return case_name(self.stage, self.provider, self.rows, self.vocab, self.dtype)

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, **asdict(self)}
        # `name` first, the schema's order after it, extras last.
        return {key: out[key] for key in (*_CASE_FIELDS, "rounds", "extra")}

    @classmethod
    def from_json(cls, data: object, where: str = "case") -> CaseResult:
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(data).__name__}")
        missing = [key for key in _CASE_FIELDS if key not in data]
        if missing:
            raise ValueError(f"{where} lacks the fields {missing}")
        for key in ("median_us", "p20_us", "p80_us"):
            if not isinstance(data[key], (int, float)) or isinstance(data[key], bool):
                raise ValueError(f"{where}: {key} must be a number, got {data[key]!r}")
        case = cls(
            stage=str(data["stage"]),
            provider=str(data["provider"]),
            rows=int(data["rows"]),
            vocab=int(data["vocab"]),
            dtype=str(data["dtype"]),
            median_us=float(data["median_us"]),
            p20_us=float(data["p20_us"]),
            p80_us=float(data["p80_us"]),
            gbps=_optional_float(data["gbps"], f"{where}: gbps"),
            ratio_to_floor=_optional_float(data["ratio_to_floor"], f"{where}: ratio_to_floor"),
            ratio_to_vllm_style=_optional_float(
                data["ratio_to_vllm_style"], f"{where}: ratio_to_vllm_style"
            ),
            rounds=int(data.get("rounds", 0)),
            extra=dict(data.get("extra") or {}),
        )
        if case.name != data["name"]:
            raise ValueError(f"{where}: name {data['name']!r} does not match its fields")
        return case


def _optional_float(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number or null, got {value!r}")
    return float(value)


def logits_gbps(rows: int, vocab: int, dtype: torch.dtype, median_us: float) -> float | None:
    """GB/s (1e9 bytes) of one read of [rows, vocab] `dtype` logits in `median_us`."""
    if not median_us > 0.0:
        return None
    itemsize = torch.empty((), dtype=dtype).element_size()
    return rows * vocab * itemsize / (median_us * 1e3)


def fill_ratios(cases: Sequence[CaseResult]) -> None:
    """Set every case's `ratio_to_floor` and `ratio_to_vllm_style` from the cases of the
    same run (None where the reference provider was not run), in place."""
    floors: dict[tuple[int, int, str], float] = {}
    for case in cases:
        if case.provider == FLOOR_PROVIDER:
            # The floor does not depend on the stage; any stage's clone of the shape will do,
            # the fastest being the least disturbed by the host.
            key = (case.rows, case.vocab, case.dtype)
            floors[key] = min(floors.get(key, math.inf), case.median_us)
    peers = {
        (c.stage, c.rows, c.vocab, c.dtype): c.median_us
        for c in cases
        if c.provider == VLLM_STYLE_PROVIDER
    }
    for case in cases:
        floor = floors.get((case.rows, case.vocab, case.dtype))
        peer = peers.get((case.stage, case.rows, case.vocab, case.dtype))
        case.ratio_to_floor = case.median_us / floor if floor else None
        case.ratio_to_vllm_style = case.median_us / peer if peer else None


def _git_commit() -> str | None:
    """The checkout's commit (with "+dirty" when it has changes), or None outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        if commit.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = "+dirty" if status.returncode == 0 and status.stdout.strip() else ""
    return commit.stdout.strip() + dirty


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    # platform.processor() is only the architecture on Linux; the CPU's model is in /proc.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def run_context(device: torch.device | str, **extra: Any) -> dict[str, Any]:
    """Where and with what a run was made: device, versions, commit, threads, host load."""
    device = torch.device(device)
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device_type": device.type,
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "commit": _git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # Other work on the host inflates every time of the run; this says how busy it was.
        "load_avg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        **extra,
    }


@dataclass
class Results:
    """A run: its context and its cases."""

    context: dict[str, Any]
    cases: list[CaseResult]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "context": self.context,
            "cases": [c.to_json() for c in self.cases],
        }

    def write(self, path: str | os.PathLike[str]) -> None:
        text = json.dumps(self.to_json(), indent=1, allow_nan=False)
        Path(path).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, data: object, where: str = "results") -> Results:
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(data).__name__}")
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(
                f"{where}: schema must be {SCHEMA_VERSION}, got {data.get('schema')!r}"
            )
        context, cases = data.get("context"), data.get("cases")
        if not isinstance(context, dict):
            raise ValueError(f"{where}: context must be a JSON object")
        if not isinstance(cases, list):
            raise ValueError(f"{where}: cases must be a JSON list")
        parsed = [CaseResult.from_json(c, f"{where}: cases[{i}]") for i, c in enumerate(cases)]
        names = [c.name for c in parsed]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"{where}: duplicate cases {duplicates}")
        return cls(context, parsed)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Results:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err})") from None
        return cls.from_json(data, str(path))


# ----------------------------------------------------------------- compare


@dataclass(frozen=True)
class CaseComparison:
    """One case of `compare`: base and head ratios to the floor, and their ratio."""

    name: str
    base: float | None  # base run's ratio_to_floor (None: missing or no floor)
    head: float | None
    status: str  # "ok", "regression", "improvement", "only in base", "only in head", "no floor"

    @property
    def change(self) -> float | None:
        """head / base: above 1 is slower relative to the floor."""
        if self.base is None or self.head is None or self.base <= 0.0:
            return None
        return self.head / self.base


def compare(
    base: Results, head: Results, threshold: float = DEFAULT_THRESHOLD
) -> list[CaseComparison]:
    """Per case (union of both runs, in base order then head's new ones): the ratio to the
    floor in each run and a status. A case regresses when head / base > 1 + threshold and
    improves when head / base < 1 / (1 + threshold). The floor's own cases (always 1) are
    left out."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise TypeError(f"threshold must be a number, got {type(threshold).__name__}")
    if not 0.0 <= threshold < math.inf:
        raise ValueError(f"threshold must be a finite number >= 0, got {threshold}")
    base_cases = {c.name: c for c in base.cases if c.provider != FLOOR_PROVIDER}
    head_cases = {c.name: c for c in head.cases if c.provider != FLOOR_PROVIDER}
    names = list(base_cases) + [n for n in head_cases if n not in base_cases]
    out = []
    for name in names:
        b, h = base_cases.get(name), head_cases.get(name)
        b_ratio = b.ratio_to_floor if b else None
        h_ratio = h.ratio_to_floor if h else None
        if h is None:
            status = "only in base"
        elif b is None:
            status = "only in head"
        elif b_ratio is None or h_ratio is None or b_ratio <= 0.0:
            status = "no floor"
        elif h_ratio / b_ratio > 1.0 + threshold:
            status = "regression"
        elif h_ratio / b_ratio < 1.0 / (1.0 + threshold):
            status = "improvement"
        else:
            status = "ok"
        out.append(CaseComparison(name, b_ratio, h_ratio, status))
    return out


def has_regression(comparisons: Iterable[CaseComparison]) -> bool:
    return any(c.status == "regression" for c in comparisons)


def format_comparison(comparisons: Sequence[CaseComparison], threshold: float) -> str:
    """A plain-text table: case, base and head ratio to the floor, head/base, status."""
    width = max([len("case"), *(len(c.name) for c in comparisons)])
    lines = [
        f"{'case':<{width}}  {'base x floor':>12}  {'head x floor':>12}  {'head/base':>9}  status",
    ]

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for c in comparisons:
        lines.append(
            f"{c.name:<{width}}  {num(c.base, '12.2f')}  {num(c.head, '12.2f')}  "
            f"{num(c.change, '9.3f')}  {c.status}"
        )
    counts = {s: sum(c.status == s for c in comparisons) for s in ("regression", "improvement")}
    lines.append(
        f"{len(comparisons)} cases, {counts['regression']} regressions and "
        f"{counts['improvement']} improvements beyond {threshold:.0%} (ratio to the in-run floor)"
    )
    return "\n".join(lines)
