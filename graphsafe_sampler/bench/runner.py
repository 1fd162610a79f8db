"""Run a grid of benchmark cases (stages x rows x vocab x dtype x providers) into `Results`.

Shared by `graphsafe-sampler bench` and the `perf/` suite's JSON: one place decides how a
case is built, warmed up and timed, and how its row of the table reads.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from graphsafe_sampler.bench.providers import (
    ALL_STAGES,
    PROVIDERS,
    Bench,
    CaseSpec,
    ProviderUnavailable,
    build_bench,
)
from graphsafe_sampler.bench.results import (
    FLOOR_PROVIDER,
    CaseResult,
    Results,
    dtype_name,
    fill_ratios,
    logits_gbps,
    run_context,
)
from graphsafe_sampler.bench.timing import check_mib, eviction_buffer, time_rounds

FLOOR_ROUNDS_FACTOR = 5
"""The floor is cheap and the denominator of every ratio: it gets this many times the rounds."""


@dataclass
class GridSpec:
    """What to run. Every combination of stages x rows x vocabs x dtypes is one case shape,
    each provider of `providers` one timed case on it."""

    stages: Sequence[str] = ("step",)
    rows: Sequence[int] = (8,)
    vocabs: Sequence[int] = (32_000,)
    dtypes: Sequence[torch.dtype] = (torch.float32,)
    providers: Sequence[str] = ("clone", "sampler-compiled", "vllm-style")
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "auto"
    rounds: int = 10
    warmup: int = 2
    seed: int = 0
    churn: float = 0.1
    evict_mib: int = 0  # written before each round (`time_rounds(evict=...)`); 0: off

    def __post_init__(self) -> None:
        for name, values, allowed in (
            ("stages", self.stages, ALL_STAGES),
            ("providers", self.providers, PROVIDERS),
        ):
            if not values:
                raise ValueError(f"{name} must not be empty")
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ValueError(f"unknown {name} {bad}; choose from {allowed}")
        for name, ints, minimum in (("rows", self.rows, 1), ("vocabs", self.vocabs, 2)):
            if not ints or any(isinstance(v, bool) or not isinstance(v, int) for v in ints):
                raise TypeError(f"{name} must be a non-empty list of ints, got {list(ints)}")
            if min(ints) < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {list(ints)}")
        if not self.dtypes:
            raise ValueError("dtypes must not be empty")
        if self.rounds < 1 or self.warmup < 0:
            raise ValueError(f"need rounds >= 1 and warmup >= 0, got {self.rounds}, {self.warmup}")
        check_mib(self.evict_mib, "evict_mib")

    def shapes(self) -> list[tuple[str, int, int, torch.dtype]]:
        return list(itertools.product(self.stages, self.rows, self.vocabs, self.dtypes))

    def rounds_of(self, provider: str) -> int:
        return self.rounds * FLOOR_ROUNDS_FACTOR if provider == FLOOR_PROVIDER else self.rounds


def _progress(total: int, enabled: bool, stream: TextIO) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        disable=not enabled,
        file=stream,
        unit="round",
        dynamic_ncols=True,
        leave=False,
    )


def run_grid(
    grid: GridSpec, *, progress: bool = True, stream: TextIO = sys.stderr
) -> tuple[Results, list[str]]:
    """Time every case of `grid`; returns the results (ratios filled in) and notes on the
    providers that could not run (e.g. "flashinfer: CUDA only")."""
    shapes = grid.shapes()
    total = sum((grid.warmup + grid.rounds_of(p)) * len(shapes) for p in grid.providers)
    cases: list[CaseResult] = []
    skipped: dict[str, None] = {}
    evict = eviction_buffer(grid.evict_mib, grid.device)
    bar = _progress(total, progress, stream)
    try:
        for stage, rows, vocab, dtype in shapes:
            spec = CaseSpec(
                stage,
                rows,
                vocab,
                dtype,
                grid.device,
                seed=grid.seed,
                backend=grid.backend,
                churn=grid.churn,
            )
            for provider in grid.providers:
                label = f"{stage} {provider} {rows}x{vocab} {dtype_name(dtype)}"
                doing = "compiling" if provider == "sampler-compiled" else "setting up"
                bar.set_postfix_str(f"{label} ({doing})", refresh=True)
                rounds = grid.rounds_of(provider)
                try:
                    bench: Bench = build_bench(spec, provider)
                except ProviderUnavailable as why:
                    skipped[str(why)] = None
                    bar.update(grid.warmup + rounds)
                    continue
                bar.set_postfix_str(label, refresh=True)
                timing = time_rounds(
                    bench.run,
                    bench.setup,
                    rounds=rounds,
                    warmup=grid.warmup,
                    device=grid.device,
                    on_round=lambda: bar.update(1),
                    evict=evict,
                )
                cases.append(
                    CaseResult(
                        stage=stage,
                        provider=provider,
                        rows=rows,
                        vocab=vocab,
                        dtype=dtype_name(dtype),
                        median_us=timing.median_us,
                        p20_us=timing.p20_us,
                        p80_us=timing.p80_us,
                        gbps=logits_gbps(rows, vocab, dtype, timing.median_us),
                        rounds=timing.rounds,
                        extra=dict(bench.info),
                    )
                )
    finally:
        bar.close()
    fill_ratios(cases)
    context = run_context(
        grid.device,
        suite="graphsafe-sampler bench",
        rounds=grid.rounds,
        warmup=grid.warmup,
        seed=grid.seed,
        churn=grid.churn,
        backend=grid.backend,
        evict_mib=grid.evict_mib,
    )
    return Results(context, cases), list(skipped)


def format_table(results: Results) -> str:
    """The readable table: one line per case, grouped by shape, with tokens/s for the step."""
    header = (
        f"{'stage':<12} {'rows':>5} {'vocab':>7} {'dtype':<9} {'provider':<17} "
        f"{'µs/call':>10} {'p20-p80 µs':>19} {'tokens/s':>10} {'GB/s':>7} "
        f"{'x floor':>8} {'x vllm':>7}"
    )
    lines = [header, "-" * len(header)]

    def num(value: float | None, width: int, spec: str) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"

    def ratio(value: float | None, width: int) -> str:
        if value is None:
            return f"{'-':>{width}}"
        # Ratios span 1e-5 (the floor against the peer) to 1e5 (a stage against the floor).
        spec = ".2f" if 0.01 <= value < 100 else (".0f" if value >= 100 else ".1e")
        return f"{value:>{width}{spec}}"

    for c in results.cases:
        # A step samples one token per row; stages produce no tokens on their own.
        tokens_per_s = c.rows / (c.median_us * 1e-6) if c.stage == "step" else None
        spread = f"{c.p20_us:.0f}-{c.p80_us:.0f}"
        lines.append(
            f"{c.stage:<12} {c.rows:>5} {c.vocab:>7} {c.dtype:<9} {c.provider:<17} "
            f"{c.median_us:>10.0f} {spread:>19} {num(tokens_per_s, 10, '.0f')} "
            f"{num(c.gbps, 7, '.2f')} {ratio(c.ratio_to_floor, 8)} "
            f"{ratio(c.ratio_to_vllm_style, 7)}"
        )
    return "\n".join(lines)
