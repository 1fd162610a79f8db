"""graphsafe_sampler/bench/timing.py: rounds, warm-up and cache eviction, with counters in
place of the clock (nothing here is timed)."""

from __future__ import annotations

import pytest
import torch

from graphsafe_sampler.bench import runner
from graphsafe_sampler.bench.runner import GridSpec
from graphsafe_sampler.bench.timing import Timing, eviction_buffer, time_rounds


def test_rounds_after_warmup_each_with_its_own_setup() -> None:
    calls: list[str] = []

    def setup() -> tuple[int]:
        calls.append("setup")
        return (len(calls),)

    timing = time_rounds(lambda n: calls.append(f"run {n}"), setup, rounds=3, warmup=2)
    assert timing.rounds == 3 and all(t >= 0 for t in timing.times_us)
    assert calls == [x for i in range(1, 10, 2) for x in ("setup", f"run {i}")]


def test_eviction_writes_the_buffer_before_every_setup() -> None:
    evict = eviction_buffer(1)
    assert evict is not None and evict.numel() * 4 == 2**20 and bool((evict == 1).all())
    seen: list[float] = []  # the buffer's sign as each setup finds it

    def setup() -> tuple[()]:
        seen.append(float(evict[0]))
        return ()

    time_rounds(lambda: None, setup, rounds=2, warmup=1, evict=evict)
    assert seen == [-1.0, 1.0, -1.0]  # written once per round, warm-up included
    assert bool((evict == -1).all())  # every element, not only the first


def test_no_eviction_buffer_for_zero() -> None:
    assert eviction_buffer(0) is None


@pytest.mark.parametrize(
    ("mib", "error", "match"),
    [(-1, ValueError, "mib must be >= 0"), (1.5, TypeError, "an int"), (True, TypeError, "an int")],
)
def test_eviction_buffer_rejects_bad_sizes(mib: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        eviction_buffer(mib, torch.device("cpu"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("evict_mib", "error"), [(-1, ValueError), (2.0, TypeError), (False, TypeError)]
)
def test_grid_rejects_bad_eviction_sizes(evict_mib: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="evict_mib"):
        GridSpec(evict_mib=evict_mib)  # type: ignore[arg-type]


def test_the_grid_times_every_case_with_one_eviction_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    buffers: list[torch.Tensor | None] = []

    def spy(*args: object, evict: torch.Tensor | None = None, **kwargs: object) -> Timing:
        buffers.append(evict)
        return Timing.from_seconds([1e-6])

    monkeypatch.setattr(runner, "time_rounds", spy)
    grid = GridSpec(rows=(2,), vocabs=(64,), providers=("clone", "vllm-style"), evict_mib=1)
    results, _ = runner.run_grid(grid, progress=False)
    assert len(buffers) == 2 and buffers[0] is buffers[1]  # one buffer, every provider
    assert buffers[0] is not None and buffers[0].numel() * 4 == 2**20
    assert results.context["evict_mib"] == 1
    buffers.clear()
    runner.run_grid(GridSpec(rows=(2,), vocabs=(64,), providers=("clone",)), progress=False)
    assert buffers == [None]
