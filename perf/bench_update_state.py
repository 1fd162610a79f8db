"""Host cost of `BatchState.update` per engine step, with and without the built-in processors.

Scenario: a full persistent batch of 256 requests (max_num_reqs = 256) where each request
finishes with probability 0.1 per step and every freed row is refilled at once (a busy
server with a waiting queue), plus up to 3 swaps a step. Updates are generated before the
timed region; one round times one `update(batch_update)` call: validation, slot
bookkeeping, every registered processor's `add_request` and the flush of all staged tensors
(on a CPU device the flush is a plain copy; docs/design.md §6: absolute times only mean something
on the machine that produced them, compare variants of the same run).

Run: python -m pytest perf/bench_update_state.py --benchmark-only
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.stages import BUILTIN_LOGITS_PROCESSORS
from graphsafe_sampler.testing import BatchDriver, refill

MAX_NUM_REQS = 256
CHURN = 0.1
# No built-in reads prompts, but BatchState.validate scans every prompt's token ids;
# 0..1024 tokens keeps that cost in the picture without making generation slow.
MAX_PROMPT_LEN = 1024
ROUNDS = 300
WARMUP_ROUNDS = 20
# (vocab_size, eos_token_id): Qwen2's vocabulary and <|im_end|>, Llama 2's and </s>.
EOS_TOKEN_ID = {151_936: 151_645, 32_000: 2}


def realistic_params(rng: random.Random, config: SamplerConfig) -> SamplingParams:
    """Chat-like traffic: most requests use defaults, a minority the built-in processors.

    About 10% carry a logit_bias (1-16 entries), 15% stop_token_ids (1-4), 10% min_tokens,
    10% min_p and 3% a short allowed_token_ids list (classification-style, 2-64 ids).
    """
    vocab = config.vocab_size

    def some_ids(lo: int, hi: int) -> list[int]:
        return rng.sample(range(vocab), rng.randint(lo, hi))

    greedy = rng.random() < 0.3
    return SamplingParams(
        temperature=0.0 if greedy else rng.choice([0.6, 0.7, 1.0]),
        top_p=1.0 if greedy else rng.choice([0.8, 0.95, 1.0]),
        top_k=0 if greedy else rng.choice([0, 0, 20, 50]),
        min_p=0.05 if rng.random() < 0.1 else 0.0,
        logit_bias=(
            {tok: rng.uniform(-10.0, 10.0) for tok in some_ids(1, 16)}
            if rng.random() < 0.1
            else None
        ),
        stop_token_ids=some_ids(1, 4) if rng.random() < 0.15 else None,
        min_tokens=rng.randint(1, 32) if rng.random() < 0.1 else 0,
        allowed_token_ids=some_ids(2, 64) if rng.random() < 0.03 else None,
        seed=rng.randrange(2**63) if rng.random() < 0.1 else None,
    )


@pytest.fixture
def one_torch_thread():
    """Run with one intra-op thread, restoring the setting afterwards.

    The flush's index_select/index_copy_ over [rows, ceil(V/32)] words enters an OpenMP
    parallel region; on a busy host with 2 threads one such copy was measured at ~16 ms
    instead of ~60 µs (the workers wait on descheduled peers). Host-side bookkeeping
    should not depend on that pool, and one thread keeps the numbers comparable.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield 1
    torch.set_num_threads(threads)


def make_state(vocab_size: int, with_processors: bool) -> tuple[BatchState, list[str]]:
    """A CPU BatchState, with the built-in processors registered on it if asked."""
    config = SamplerConfig(
        max_num_reqs=MAX_NUM_REQS, vocab_size=vocab_size, eos_token_id=EOS_TOKEN_ID[vocab_size]
    )
    device = torch.device("cpu")
    state = BatchState(config, device)
    processors = []
    if with_processors:
        for cls in BUILTIN_LOGITS_PROCESSORS:
            processors.append(cls(config, device, False, batch_state=state))
    return state, [type(p).__name__ for p in processors]


@pytest.mark.parametrize(
    ("vocab_size", "with_processors"),
    [
        pytest.param(151_936, True, id="V151936-builtins"),
        pytest.param(32_000, True, id="V32000-builtins"),
        pytest.param(151_936, False, id="V151936-no-processors"),
    ],
)
def test_update_state(
    benchmark, one_torch_thread: int, vocab_size: int, with_processors: bool
) -> None:
    state, processors = make_state(vocab_size, with_processors)
    driver = BatchDriver(
        state.config,
        seed=0,
        make_params=realistic_params,
        churn=CHURN,
        max_prompt_len=MAX_PROMPT_LEN,
        joins=refill,
        condense=0.0,
    )
    # Untimed: fill the empty batch to 256 requests in one update.
    state.update(driver.next_update())
    assert state.num_requests == MAX_NUM_REQS

    updates = [driver.next_update() for _ in range(WARMUP_ROUNDS + ROUNDS)]
    pending = iter(updates)
    applied: list[BatchUpdate] = []

    def next_batch_update() -> tuple[tuple[BatchUpdate], dict]:
        # Runs outside the timed region. Extra calls (--benchmark-cprofile, a disabled
        # benchmark) get fresh updates from the driver so the sequence stays consistent.
        batch_update = next(pending, None) or driver.next_update()
        applied.append(batch_update)
        return (batch_update,), {}

    benchmark.group = "update_state"
    benchmark.pedantic(
        state.update,
        setup=next_batch_update,
        rounds=ROUNDS,
        warmup_rounds=WARMUP_ROUNDS,
        iterations=1,
    )
    assert state.num_requests == driver.batch_size == MAX_NUM_REQS

    if benchmark.stats is None:  # --benchmark-disable: one untimed call, a smoke test
        return
    timed = applied[WARMUP_ROUNDS : WARMUP_ROUNDS + ROUNDS]
    num_added = np.array([len(u.added) for u in timed], dtype=np.float64)
    us = np.asarray(benchmark.stats.stats.data, dtype=np.float64) * 1e6
    # Once the batch is full every add pairs with a removal, so "per added request" is the
    # cost of one request leaving and another joining, the step's fixed cost spread over
    # them. The median resists the spikes a shared host adds; the mean is kept beside it.
    benchmark.extra_info.update(
        vocab_size=vocab_size,
        max_num_reqs=MAX_NUM_REQS,
        churn=CHURN,
        torch_threads=one_torch_thread,
        processors=processors,
        mean_added_per_step=float(num_added.mean()),
        mean_removed_per_step=float(np.mean([len(u.removed) for u in timed])),
        mean_moved_per_step=float(np.mean([len(u.moved) for u in timed])),
        us_per_step_median=float(np.median(us)),
        us_per_step_mean=float(us.mean()),
        us_per_step_min=float(us.min()),
        us_per_added_request=float(np.median(us) / num_added.mean()),
        us_per_added_request_mean=float(us.sum() / num_added.sum()),
    )
