"""The end-of-run table the single-case benchmark files share (bench_sampler.py,
bench_rejection.py, bench_demo.py): a pytest plugin registered once per run that collects
each provider's median, fills the ratios into every benchmark's extra_info as results come in
(so the JSON has them whatever the order) and prints a table after pytest-benchmark's."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture

Plugin = TypeVar("Plugin")


def registered_plugin(
    request: pytest.FixtureRequest, name: str, make: Callable[[], Plugin]
) -> Plugin:
    """The plugin registered under `name`, made and registered on first use."""
    manager = request.config.pluginmanager
    plugin = manager.get_plugin(name)
    if plugin is None:
        plugin = make()
        manager.register(plugin, name)
    return plugin


def timing_info(benchmark: BenchmarkFixture, load_before: float, rounds: int) -> dict[str, object]:
    """The context and spread every single-case benchmark puts in its extra_info: torch's
    version and threads, the 1-minute load before and after (other processes on the host
    inflate times), the rounds and the p20/median/p80 in ms."""
    assert benchmark.stats is not None
    ms = np.asarray(benchmark.stats.stats.data, dtype=np.float64) * 1e3
    return {
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rounds": rounds,
        "ms_p20": round(float(np.percentile(ms, 20)), 3),
        "ms_median": round(float(np.median(ms)), 3),
        "ms_p80": round(float(np.percentile(ms, 80)), 3),
    }


class ProviderSummary:
    """Medians by provider against the `clone` floor and the `vllm-style` peer."""

    def __init__(self, title: str, providers: Sequence[str]) -> None:
        self.title = title
        self.providers = tuple(providers)
        self.medians: dict[str, float] = {}
        self.benchmarks: dict[str, BenchmarkFixture] = {}

    def record(self, provider: str, benchmark: BenchmarkFixture) -> None:
        assert benchmark.stats is not None
        self.medians[provider] = float(np.median(benchmark.stats.stats.data))
        self.benchmarks[provider] = benchmark
        floor, baseline = self.medians.get("clone"), self.medians.get("vllm-style")
        for name, bench in self.benchmarks.items():
            median = self.medians[name]
            bench.extra_info["ratio_to_clone"] = None if floor is None else round(median / floor, 2)
            bench.extra_info["speedup_vs_vllm_style"] = (
                None if baseline is None else round(baseline / median, 2)
            )

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.medians:
            return
        floor, baseline = self.medians.get("clone"), self.medians.get("vllm-style")
        write = terminalreporter.write_line
        terminalreporter.section(self.title)
        write(f"{'provider':<20}{'median ms':>12}{'x clone':>10}{'speed-up vs vllm-style':>25}")
        for name in self.providers:
            if name not in self.medians:
                continue
            median = self.medians[name]
            to_floor = f"{median / floor:.1f}" if floor else "-"
            speedup = f"{baseline / median:.1f}x" if baseline else "-"
            write(f"{name:<20}{median * 1e3:>12.2f}{to_floor:>10}{speedup:>25}")
