"""`SamplingParams.logprob_token_ids`: the logprobs and ranks of chosen token ids, beside the
top K, in every logprobs mode and on both backends, against the float64 reference over a
churning batch (fresh logits each run; the seed is printed)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from backends import BACKENDS, backend_device, interpreted

from graphsafe_sampler import Sampler, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.testing import BatchDriver, reference
from graphsafe_sampler.testing.batch_driver import refill

V = 97
C = 5


@pytest.mark.parametrize(
    "mode", ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_chosen_ids_match_the_float64_reference(backend: str, mode: str) -> None:
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    config = SamplerConfig(
        8, V, backend=backend, max_num_logprobs=3, max_logprob_token_ids=C, logprobs_mode=mode,
        eos_token_id=1, max_logit_bias_tokens=8, max_stop_token_ids=4, seed=seed,
    )  # fmt: skip
    device = backend_device(backend)
    sampler = Sampler(config, device)
    driver = BatchDriver(config, seed=seed, churn=0.2, joins=refill)
    gen = torch.Generator().manual_seed(seed)
    checked = 0
    for _step in range(2 if interpreted(backend, device) else 8):
        sampler.update_state(driver.next_update())
        logits = torch.randn(8, V, generator=gen) * 3
        out = sampler(logits.to(device))
        lp = out.logprobs_tensors
        assert lp is not None and lp.requested_token_ids is not None
        assert lp.requested_logprobs is not None and lp.requested_ranks is not None
        assert lp.requested_token_ids.shape == (8, C)
        got_ids = lp.requested_token_ids.cpu().numpy()
        got_values = lp.requested_logprobs.double().cpu().numpy()
        got_ranks = lp.requested_ranks.cpu().numpy()
        tokens = out.sampled_token_ids[:, 0].tolist()
        for r in range(8):
            req = driver.rows[r] if r < len(driver.rows) else None
            ids = list(req.params.logprob_token_ids or ()) if req is not None else []
            want_ids = ids + [-1] * (C - len(ids))
            assert got_ids[r].tolist() == want_ids, r
            assert np.all(got_values[r, len(ids) :] == -np.inf)
            assert np.all(got_ranks[r, len(ids) :] == 0)
            if not ids:
                continue
            raw = logits[r].double().numpy()
            source = raw if mode.startswith("raw") else reference.pipeline(raw, req, config)[0]
            values = source
            atol = 1e-6
            finite = np.isfinite(source)
            if mode.endswith("logprobs") and not finite.any():
                values = np.full_like(source, -np.inf)  # every token masked: all -inf
            elif mode.endswith("logprobs"):
                top = source[finite].max()
                lse = np.log(np.exp(source[finite] - top).sum()) + top
                values = source - lse
                # a float32 logprob is logit - lse, off by a few ulp of the larger (processed
                # logits reach 100 at temperature 0.2), however near 0 the logprob lies
                scale = max(abs(lse), np.abs(source[finite]).max())
                atol = max(atol, 8 * float(np.spacing(np.float32(scale))))
            want = values[ids]
            np.testing.assert_allclose(got_values[r, : len(ids)], want, rtol=1e-5, atol=atol)
            checked += len(ids)
            for j, value in enumerate(want):
                if not np.isfinite(value):
                    continue  # a masked id: -inf, and its rank counts every token
                # float32 may merge a neighbour within rounding into the value, or not
                least = int((values >= value + 1e-5 * (1 + abs(value))).sum())
                most = int((values >= value - 1e-5 * (1 + abs(value))).sum())
                assert least <= got_ranks[r, j] <= most, (r, j)
        driver.record_tokens(tokens)
    assert checked > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sampled_token_among_the_chosen_ids_has_the_sampled_tokens_logprob(
    backend: str,
) -> None:
    device = backend_device(backend)
    config = SamplerConfig(2, V, backend=backend, max_num_logprobs=2, max_logprob_token_ids=V)
    sampler = Sampler(config, device)
    every = list(range(V))
    sampler.update_state(
        gs_update(
            [SP(logprob_token_ids=every, seed=3), SP(temperature=0.0, logprob_token_ids=every)]
        )
    )
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(random.randrange(2**31)))
    out = sampler(logits.to(device))
    lp = out.logprobs_tensors
    assert lp is not None and lp.requested_logprobs is not None and lp.requested_ranks is not None
    tokens = out.sampled_token_ids[:, 0].long().cpu()
    values = lp.requested_logprobs.cpu()
    ranks = lp.requested_ranks.cpu()
    # with every id chosen, the chosen values are the whole row's log-softmax, and the
    # sampled token's entry is column 0's value and rank
    torch.testing.assert_close(values, torch.log_softmax(logits, -1), rtol=1e-5, atol=1e-5)
    for r in range(2):
        assert values[r, tokens[r]] == lp.logprobs[r, 0].cpu()
        assert ranks[r, tokens[r]] == lp.selected_token_ranks[r].cpu()


def gs_update(params: list[SP]) -> object:
    from graphsafe_sampler import BatchUpdate

    return BatchUpdate(len(params), added=[(r, p, None, []) for r, p in enumerate(params)])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(logprob_token_ids=[3, 3]), ValueError, "must not repeat"),
        (dict(logprob_token_ids=[-1]), ValueError, r"logprob_token_ids\[0\] must be a token id"),
        (dict(logprob_token_ids="12"), TypeError, "must be a list of ints"),
    ],
)
def test_bad_chosen_ids_are_refused_at_construction(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SP(**kwargs)


def test_chosen_ids_are_checked_against_the_config_and_nothing_changes() -> None:
    config = SamplerConfig(2, V, max_num_logprobs=1, max_logprob_token_ids=2)
    sampler = Sampler(config, "cpu")
    before = {k: v.clone() for k, v in sampler.state_tensors().items()}
    for params, match in [
        (SP(logprob_token_ids=[1, 2, 3]), "more than max_logprob_token_ids = 2"),
        (SP(logprob_token_ids=[V]), "outside the vocabulary"),
    ]:
        with pytest.raises(ValueError, match=match):
            sampler.update_state(gs_update([SP(), params]))
    for name, tensor in sampler.state_tensors().items():
        assert torch.equal(tensor, before[name]), name


def test_the_capacity_needs_logprobs() -> None:
    with pytest.raises(ValueError, match="set max_num_logprobs >= 1"):
        SamplerConfig(2, V, max_logprob_token_ids=2)
    with pytest.raises(ValueError, match="max_logprob_token_ids must be <= vocab_size"):
        SamplerConfig(2, V, max_num_logprobs=1, max_logprob_token_ids=V + 1)
