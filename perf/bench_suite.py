"""The suite: the full decode step and each stage alone, every provider side by side.

Cases (`graphsafe_sampler.bench`): stage `step` (the whole Sampler step over a churning
persistent batch: requests join and leave with mixed parameters) and the stages alone
(penalties, bias, min_p, top_k, top_p, top_k_top_p, greedy, sampling, logprobs; see
`graphsafe_sampler/bench/stages.py` for what each provider runs). Providers: `clone` (the
floor), `sampler-eager`, `sampler-compiled`, `vllm-style`, `flashinfer` (CUDA, installed).

Grid: by default one shape, 64 rows x vocab 32,000, float32 (each stage compiles once:
minutes with a cold inductor cache on 2 cores, seconds when warm). `--full`: rows
{1, 8, 64, 256} x vocab {32,000, 128,256, 151,936} x {float32, bfloat16}.

Run:
    .venv/bin/python -m pytest perf/bench_suite.py --benchmark-only --gs-json=head.json
    .venv/bin/graphsafe-sampler compare base.json head.json
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from graphsafe_sampler.bench.providers import (
    ALL_STAGES,
    PROVIDERS,
    CaseSpec,
    ProviderUnavailable,
    build_bench,
)
from graphsafe_sampler.bench.results import FLOOR_PROVIDER, dtype_name

DEFAULT_GRID = ((64,), (32_000,), (torch.float32,))
FULL_GRID = ((1, 8, 64, 256), (32_000, 128_256, 151_936), (torch.float32, torch.bfloat16))
ROUNDS = 10
WARMUP = 2
FLOOR_ROUNDS = 50
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "shape" not in metafunc.fixturenames:
        return
    rows, vocabs, dtypes = FULL_GRID if metafunc.config.getoption("--full") else DEFAULT_GRID
    params = [
        pytest.param(
            (stage, r, v, d),
            provider,
            id=f"{stage}-R{r}-V{v}-{dtype_name(d)}-{provider}",
        )
        for stage, r, v, d in itertools.product(ALL_STAGES, rows, vocabs, dtypes)
        for provider in PROVIDERS
    ]
    metafunc.parametrize(("shape", "provider"), params)


@pytest.fixture(scope="module")
def specs() -> dict[tuple, CaseSpec]:
    """One CaseSpec per shape, shared by its providers (same logits, same state)."""
    return {}


def test_case(
    benchmark: Any,
    gs_record: Callable[..., None],
    specs: dict[tuple, CaseSpec],
    shape: tuple[str, int, int, torch.dtype],
    provider: str,
) -> None:
    stage, rows, vocab, dtype = shape
    if shape not in specs:
        specs.clear()  # shapes run in order: free the previous one's logits and state
        specs[shape] = CaseSpec(stage, rows, vocab, dtype, DEVICE)
    try:
        bench = build_bench(specs[shape], provider)
    except ProviderUnavailable as why:
        pytest.skip(str(why))
    benchmark.group = f"{stage} {rows}x{vocab} {dtype_name(dtype)}"
    benchmark.pedantic(
        bench.run,
        setup=lambda: (bench.setup(), {}),
        rounds=FLOOR_ROUNDS if provider == FLOOR_PROVIDER else ROUNDS,
        warmup_rounds=WARMUP,
        iterations=1,
    )
    benchmark.extra_info.update(bench.info)
    gs_record(
        benchmark,
        stage=stage,
        provider=provider,
        rows=rows,
        vocab=vocab,
        dtype=dtype,
        extra=bench.info,
    )
