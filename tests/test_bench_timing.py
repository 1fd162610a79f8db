"""graphsafe_sampler/bench/timing.py: rounds, warm-up and cache eviction, with counters in
place of the clock (nothing here is timed)."""

from __future__ import annotations

import pytest
import torch

from graphsafe_sampler.bench.runner import GridSpec
from graphsafe_sampler.bench.timing import eviction_buffer, time_rounds


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

    time_rounds(lambda: None, setup, rounds=3, warmup=1, evict=evict)
    assert seen == [-1.0, 1.0, -1.0, 1.0]  # written once per round, warm-up included
    assert bool((evict == 1).all())  # every element, not only the first


def test_without_eviction_nothing_is_allocated_or_written() -> None:
    assert eviction_buffer(0) is None
    time_rounds(lambda: None, lambda: (), rounds=2)


@pytest.mark.parametrize("mib", [-1, 1.5, True])
def test_eviction_buffer_rejects_bad_sizes(mib: object) -> None:
    with pytest.raises(ValueError, match="mib must be an int >= 0"):
        eviction_buffer(mib, torch.device("cpu"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("evict_mib", "error"), [(-1, ValueError), (2.0, TypeError), (False, TypeError)]
)
def test_grid_rejects_bad_eviction_sizes(evict_mib: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="evict_mib"):
        GridSpec(evict_mib=evict_mib)  # type: ignore[arg-type]
