"""Persistent-batch fuzzer: 2,000 steps of random adds, removes, swaps and condensing moves,
with every built-in checked against the dict-based float64 reference after every step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graphsafe_sampler import BatchState, SamplerConfig
from graphsafe_sampler.stages import (
    AllowedTokenIdsLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
)
from graphsafe_sampler.testing import BatchDriver, reference

CONFIG = SamplerConfig(
    max_num_reqs=64,
    vocab_size=1023,
    eos_token_id=7,
    max_num_logprobs=5,
    max_logit_bias_tokens=48,
    max_stop_token_ids=6,
)


def _check_min_p(got: np.ndarray, want: np.ndarray, logits: np.ndarray, thresholds: list[float]):
    """Exact, except where a logit sits within float32 rounding of the cut."""
    differ = (np.isneginf(got) != np.isneginf(want)).nonzero()
    for row, col in zip(*differ, strict=True):
        thr = thresholds[row]
        assert abs(logits[row, col] - thr) <= 1e-5 * max(1.0, abs(thr)), (row, col)
    same = ~np.isneginf(want) & ~np.isneginf(got)
    np.testing.assert_array_equal(got[same], want[same])


@pytest.mark.parametrize("seed", [0, 1])
def test_builtins_match_reference_under_churn(seed: int) -> None:
    device = torch.device("cpu")
    state = BatchState(CONFIG, device)
    allowed = AllowedTokenIdsLogitsProcessor(CONFIG, device, False, batch_state=state)
    min_tokens = MinTokensLogitsProcessor(CONFIG, device, False, batch_state=state)
    bias = LogitBiasLogitsProcessor(CONFIG, device, False, batch_state=state)
    min_p = MinPLogitsProcessor(CONFIG, device, False, batch_state=state)
    driver = BatchDriver(CONFIG, seed=seed, churn=0.1)
    gen = torch.Generator().manual_seed(seed)
    rows, vocab = CONFIG.max_num_reqs, CONFIG.vocab_size
    steps = 1000  # two seeds: 2,000 steps in all
    masked_seen = {"allowed": 0, "min_tokens": 0, "bias": 0, "min_p": 0}
    for _ in range(steps):
        state.update(driver.next_update())
        logits = torch.randn(rows, vocab, generator=gen) * 4.0
        ref_in = logits.double().numpy()
        reqs = driver.rows

        got = allowed.apply(logits.clone()).double().numpy()
        want = np.stack([reference.allowed_token_ids(ref_in[r], reqs[r]) for r in range(rows)])
        np.testing.assert_array_equal(got, want)
        masked_seen["allowed"] += int(np.isneginf(want).any())

        got = min_tokens.apply(logits.clone()).double().numpy()
        want = np.stack([reference.min_tokens(ref_in[r], reqs[r], CONFIG) for r in range(rows)])
        np.testing.assert_array_equal(got, want)
        masked_seen["min_tokens"] += int(np.isneginf(want).any())

        got = bias.apply(logits.clone()).double().numpy()
        want = np.stack([reference.logit_bias(ref_in[r], reqs[r]) for r in range(rows)])
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
        masked_seen["bias"] += int(not np.array_equal(want, ref_in))

        got = min_p.apply(logits.clone()).double().numpy()
        want = np.stack([reference.min_p(ref_in[r], reqs[r]) for r in range(rows)])
        thresholds = [reference.min_p_threshold(ref_in[r], reqs[r]) for r in range(rows)]
        _check_min_p(got, want, ref_in, thresholds)
        masked_seen["min_p"] += int(np.isneginf(want).any())

        # Commit one token per row, some rows excluded (chunked prefill), as a sampler does.
        tokens = torch.randint(vocab, (rows,), generator=gen)
        keep = torch.rand(rows, generator=gen) < 0.8
        state.commit(tokens, keep)
        driver.record_tokens(tokens.tolist(), keep.tolist())
    # The fuzzer really exercised every processor in many steps.
    assert all(count > steps // 4 for count in masked_seen.values()), masked_seen


def test_padding_rows_are_untouched() -> None:
    state = BatchState(CONFIG, "cpu")
    procs = [
        cls(CONFIG, torch.device("cpu"), False, batch_state=state)
        for cls in (
            AllowedTokenIdsLogitsProcessor,
            MinTokensLogitsProcessor,
            LogitBiasLogitsProcessor,
            MinPLogitsProcessor,
        )
    ]
    driver = BatchDriver(CONFIG, seed=3)
    state.update(driver.next_update())
    logits = torch.randn(CONFIG.max_num_reqs, CONFIG.vocab_size) * 3
    for proc in procs:
        out = proc.apply(logits.clone())
        for row, req in enumerate(driver.rows):
            if req is None:
                assert torch.equal(out[row], logits[row])
    assert not math.isnan(float(logits.sum()))


def test_min_tokens_table_holds_each_stop_id_once() -> None:
    """The stop-id table the kernels walk: each id once, in the order first given (EOS
    appended), and the unused entries repeating the first, so that the block holding the
    first id again past entry 0 is the last holding a used one (kernels/sparse_phases.py,
    ban_stop_ids); a repeated id would end that walk early."""
    from graphsafe_sampler import BatchUpdate, SamplingParams

    state = BatchState(CONFIG, "cpu")
    min_tokens = MinTokensLogitsProcessor(CONFIG, torch.device("cpu"), False, batch_state=state)
    params = SamplingParams(stop_token_ids=[5, 9, 5, 7, 9], min_tokens=3)  # 7 is EOS
    state.update(BatchUpdate(1, added=[(0, params, [1, 2], [])]))
    slot = int(state.row_to_slot.device[0])
    assert min_tokens.stop_ids.device[slot].tolist() == [5, 9, 7, 5, 5, 5, 5]
