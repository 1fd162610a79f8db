"""Wall-clock timing of one call, round by round, with untimed setup between rounds.

Each round: `setup()` (untimed: stage the next batch update, copy fresh logits), then the
timed `fn(*args)`. On CUDA the device is synchronised before the clock starts and before it
stops, so a round is the call's full device time; on CPU every op is synchronous anyway.
The median resists the spikes a shared host adds; p20/p80 say how wide the spread was.

Rounds back to back keep a small step's code and data in the caches, where a decode step
after the model's forward finds other data: `evict` (an `eviction_buffer`) is written before
each round's setup, so that only what setup staged is fresh (perf/README.md, cold caches).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Setup = Callable[[], tuple[Any, ...]]


@dataclass(frozen=True)
class Timing:
    """Per-round times of one call, in microseconds."""

    times_us: tuple[float, ...]

    @classmethod
    def from_seconds(cls, seconds: Sequence[float]) -> Timing:
        if not seconds:
            raise ValueError("a timing needs at least one round")
        return cls(tuple(float(s) * 1e6 for s in seconds))

    def percentile(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.times_us), q))

    @property
    def median_us(self) -> float:
        return self.percentile(50)

    @property
    def p20_us(self) -> float:
        return self.percentile(20)

    @property
    def p80_us(self) -> float:
        return self.percentile(80)

    @property
    def rounds(self) -> int:
        return len(self.times_us)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_mib(mib: int, name: str = "mib") -> None:
    """Raise unless `mib` is an eviction buffer's size: an int >= 0 (TypeError, ValueError)."""
    if isinstance(mib, bool) or not isinstance(mib, int):
        raise TypeError(f"{name} must be an int, got {mib!r}")
    if mib < 0:
        raise ValueError(f"{name} must be >= 0, got {mib}")


def eviction_buffer(mib: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """A `mib` MiB float32 buffer on `device` for `time_rounds(evict=...)`, its pages already
    in place (written once); None for 0. To evict a cache it must be larger than it: at least
    twice the last-level cache (a CPU's L3, `lscpu`; a GPU's L2)."""
    check_mib(mib)
    if mib == 0:
        return None
    return torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)


def time_rounds(
    fn: Callable[..., object],
    setup: Setup,
    *,
    rounds: int,
    warmup: int = 1,
    device: torch.device | str = "cpu",
    on_round: Callable[[], None] | None = None,
    evict: torch.Tensor | None = None,
) -> Timing:
    """Time `fn(*setup())` for `rounds` rounds after `warmup` untimed ones.

    on_round: called after every round, warm-up included (a progress bar's update).
    evict: written (read and negated, every line of it) before each round's setup, warm-up
    included: an `eviction_buffer`, None to leave the caches as the last round left them.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    device = torch.device(device)
    seconds = []
    for i in range(warmup + rounds):
        if evict is not None:
            evict.neg_()  # a load and a store of each line: no streaming store skips the cache
        args = setup()
        _sync(device)
        start = time.perf_counter()
        fn(*args)
        _sync(device)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            seconds.append(elapsed)
        if on_round is not None:
            on_round()
    return Timing.from_seconds(seconds)
