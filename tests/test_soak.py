"""perf/bench_soak.py's soak check: compiled decode steps under churn leave memory flat.

The quick test runs a few hundred steps of the same measurement as
`python perf/bench_soak.py --steps 10000`; another injects a tensor leak and a host-memory
leak and checks that both figures catch them. The whole 10,000-step soak is opt-in:

    GS_SOAK_STEPS=10000 .venv/bin/python -m pytest tests/test_soak.py -s

(about 30 s with a warm inductor cache; -s prints the table). All three share one Sampler:
eager in the default run, since compiling is most of the time (about 7 s with a warm
inductor cache, a minute or more cold on 2 cores), and compiled when GS_SOAK_STEPS is set.
"""

from __future__ import annotations

import mmap
import os

import pytest
import torch
from perf_scripts import load_perf_script

from graphsafe_sampler import SamplerOutput

bench_soak = load_perf_script("bench_soak")


FULL_SOAK = "GS_SOAK_STEPS" in os.environ


@pytest.fixture(scope="module")
def rig() -> bench_soak.SoakRig:
    # Eager in the default run (the compile would cost a minute or more cold); compiled,
    # as the soak proper is, when the full soak is asked for.
    return bench_soak.build_rig(bench_soak.soak_config(), compiled=FULL_SOAK)


def test_a_short_soak_keeps_memory_flat(rig: bench_soak.SoakRig) -> None:
    result = bench_soak.run_soak(rig, 300, samples=4)
    assert result.sample_steps == [30, 120, 210, 300]
    assert result.compile_frames == (1 if FULL_SOAK else 0), "the churn recompiled the step"
    assert result.live_tensor_growth == 0, result.report()
    assert result.rss_growth <= result.rss_limit_bytes, result.report()
    assert result.passed


def test_the_soak_catches_a_tensor_leak_and_a_host_memory_leak(rig: bench_soak.SoakRig) -> None:
    steps, warmup = 200, 20
    window = steps - warmup
    # Twice the RSS limit over the measured window, as fresh anonymous mappings written
    # through: malloc'ed blocks would first reuse the free memory the heap keeps resident
    # (hundreds of MB after other tests), which RSS cannot see growing.
    chunk = 2 * bench_soak.RSS_GROWTH_LIMIT_BYTES // window + 1
    tensors: list[torch.Tensor] = []
    host: list[mmap.mmap] = []

    def leak(out: SamplerOutput) -> None:
        tensors.append(out.sampled_token_ids.clone())
        host.append(mmap.mmap(-1, chunk))
        host[-1].write(b"\x01" * chunk)

    result = bench_soak.run_soak(rig, steps, warmup=warmup, samples=3, on_step=leak)
    per_step = tensors[0].untyped_storage().nbytes()  # 4 bytes a row: a tiny leak
    assert result.live_tensor_growth == window * per_step
    assert result.rss_growth > result.rss_limit_bytes
    assert not result.passed
    assert "MEMORY GROWS" in result.report()


@pytest.mark.slow
@pytest.mark.skipif(not FULL_SOAK, reason="opt-in: set GS_SOAK_STEPS=10000")
def test_the_full_soak(rig: bench_soak.SoakRig) -> None:
    result = bench_soak.run_soak(rig, int(os.environ["GS_SOAK_STEPS"]))
    print(result.report())
    assert result.compile_frames == 1
    assert result.passed, result.report()
