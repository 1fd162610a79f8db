"""Thinking budget: the end sequence forced once a reasoning section has spent its budget,
against the host reference (`reference.thinking_budget_token`, which rescans the whole
history) over churning batches, both backends in lockstep, and under speculative decoding.
Fresh logits each run (the seed is printed)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from backends import BACKENDS, backend_device
from conftest import kernel_device_or_skip_reason

from graphsafe_sampler import BatchUpdate, RejectionSampler, Sampler, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.testing import BatchDriver, reference
from graphsafe_sampler.testing.batch_driver import open_reasoning_sections, refill

V = 60
START = (50, 51)
END = (52, 53, 54)


def _config(**kwargs: object) -> SamplerConfig:
    return SamplerConfig(
        8, V, reasoning_start_token_ids=START, reasoning_end_token_ids=END, seed=0,
        max_logit_bias_tokens=8, max_stop_token_ids=4, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


def _budget_params(rng: random.Random, config: SamplerConfig) -> SP:
    """Sampling with a budget in most requests, greedy in some, no other masks."""
    return SP(
        temperature=0.0 if rng.random() < 0.25 else rng.uniform(0.5, 1.5),
        top_k=rng.choice([0, 0, 20]),
        seed=rng.randrange(2**32) if rng.random() < 0.5 else None,
        thinking_token_budget=rng.choice([None, 0, 1, 3, 6]),
    )


def _logits(gen: torch.Generator, rows: int) -> torch.Tensor:
    """Random rows where the sequences' tokens are likely, so that sections open and close."""
    x = torch.randn(rows, V, generator=gen) * 2
    x[:, list(START)] += 5.0
    return x


def _forced(req: object, config: SamplerConfig) -> int | None:
    tokens = [*(req.prompt_tok_ids or ()), *req.output_tok_ids]  # type: ignore[attr-defined]
    return reference.thinking_budget_token(
        tokens,
        req.params.thinking_token_budget,
        START,
        END,  # type: ignore[attr-defined]
    )


def test_both_backends_force_the_end_sequence_as_the_reference_does() -> None:
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    samplers = {"torch": Sampler(_config(backend="torch"), "cpu")}
    # the Triton backend in lockstep wherever its kernels run (else the PyTorch one alone)
    triton_device, _ = kernel_device_or_skip_reason()
    if triton_device is not None:
        samplers["triton"] = Sampler(_config(backend="triton"), triton_device)
    driver = BatchDriver(samplers["torch"].config, seed=seed, make_params=_budget_params,
                         churn=0.2, joins=refill)  # fmt: skip
    open_reasoning_sections(driver, START, seed)
    gen = torch.Generator().manual_seed(seed)
    forced_rows = 0
    for _step in range(25):
        update = driver.next_update()
        logits = _logits(gen, 8)
        tokens = {}
        for name, sampler in samplers.items():
            sampler.update_state(update)
            tokens[name] = sampler(logits.to(sampler.device)).sampled_token_ids[:, 0].tolist()
        if "triton" in tokens:
            assert tokens["triton"] == tokens["torch"]
        for r, req in enumerate(driver.rows):
            if req is None:
                continue
            forced = _forced(req, samplers["torch"].config)
            if forced is not None:
                forced_rows += 1
                assert tokens["torch"][r] == forced, (r, req)
            else:
                # the reference's processed row: the token is one it keeps
                want = reference.pipeline(logits[r].double().numpy(), req, samplers["torch"].config)
                assert want[0][tokens["torch"][r]] > float("-inf"), (r, req)
        driver.record_tokens(tokens["torch"])
    assert forced_rows >= 5, "too few forced steps to test anything"


def test_a_section_opened_in_the_prompt_spends_its_budget_then_the_end_is_forced() -> None:
    sampler = Sampler(_config(backend="torch"), "cpu")
    prompt = [1, 2, *START]
    # free token, a natural first end token, then the rest forced
    sampler.update_state(
        BatchUpdate(2, added=[(0, SP(thinking_token_budget=2, temperature=0.0), prompt, []),
                              (1, SP(thinking_token_budget=2, temperature=0.0), [5, 6], [])])
    )  # fmt: skip
    logits = torch.zeros(2, V)
    logits[:, 7] = 5.0  # the model's favourite, everywhere
    steps = []
    for _ in range(7):
        steps.append(sampler(logits).sampled_token_ids[:, 0].tolist())
    row0 = [s[0] for s in steps]
    row1 = [s[1] for s in steps]
    assert row0 == [7, 7, *END, 7, 7]  # two free tokens, the end forced, then free again
    assert row1 == [7] * 7  # no section: the budget never applies


def test_a_started_end_sequence_is_continued_and_a_new_section_is_budgeted_again() -> None:
    sampler = Sampler(_config(backend="torch"), "cpu")
    # the output already holds the start and the end's first token: end[1] comes next
    sampler.update_state(
        BatchUpdate(1, added=[(0, SP(thinking_token_budget=1, temperature=0.0), [3],
                               [*START, 9, END[0]])])
    )  # fmt: skip
    logits = torch.zeros(1, V)
    logits[:, 7] = 5.0
    assert sampler(logits).sampled_token_ids[0, 0] == END[1]
    assert sampler(logits).sampled_token_ids[0, 0] == END[2]
    assert sampler(logits).sampled_token_ids[0, 0] == 7
    # the model opens a new section: one free token, then the end again
    opened = torch.full((1, V), -10.0)
    opened[0, START[0]] = 5.0
    assert sampler(opened).sampled_token_ids[0, 0] == START[0]
    opened[0, START[0]], opened[0, START[1]] = -10.0, 5.0
    assert sampler(opened).sampled_token_ids[0, 0] == START[1]
    got = [int(sampler(logits).sampled_token_ids[0, 0]) for _ in range(4)]
    assert got == [7, *END]


def test_speculative_steps_force_the_end_at_every_position_after_the_drafts() -> None:
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    spec = 3
    config = _config(backend="torch")
    sampler = Sampler(config, "cpu")
    rejection = RejectionSampler(sampler, spec)
    driver = BatchDriver(config, seed=seed, make_params=_budget_params, churn=0.2, joins=refill)
    open_reasoning_sections(driver, START, seed)
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    forced_positions = 0
    for _step in range(40):
        sampler.update_state(driver.next_update())
        rows = len(driver.rows)
        logits = _logits(gen, rows * (spec + 1)).view(rows, spec + 1, V)
        # drafts: the forced token often, the section's tokens often, noise otherwise
        drafts = torch.tensor(
            [[rng.choice([*START, *END, rng.randrange(V)]) for _ in range(spec)]
             for _ in range(rows)]
        )  # fmt: skip
        counts = torch.tensor([rng.randint(0, spec) for _ in range(rows)])
        out = rejection(logits, drafts, counts)
        emitted = out.output_token_ids.tolist()
        accepted = out.num_accepted.tolist()
        for r, req in enumerate(driver.rows):
            if req is None:
                continue
            history = list(req.output_tok_ids)
            for j in range(accepted[r] + 1):
                probe = dataclasses.replace(req, output_tok_ids=history)
                forced = _forced(probe, config)
                if forced is not None:
                    forced_positions += 1
                    assert emitted[r][j] == forced, (r, j, req)
                history.append(emitted[r][j])
            req.output_tok_ids[:] = history  # the engine records every committed token
    assert forced_positions >= 5


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(reasoning_start_token_ids=(1,)), ValueError, "come together"),
        (dict(reasoning_start_token_ids=(1,), reasoning_end_token_ids=(V,)), ValueError,
         r"reasoning_end_token_ids\[0\] = 60 is outside"),
        (dict(reasoning_start_token_ids="ab", reasoning_end_token_ids=(2,)), TypeError,
         "must be a sequence of token ids"),
        (dict(reasoning_start_token_ids=(5,), reasoning_end_token_ids=(4, 5, 6)), ValueError,
         "must not contain one another"),
        (dict(reasoning_start_token_ids=(4, 5, 6), reasoning_end_token_ids=(6,)), ValueError,
         "must not contain one another"),
    ],
)  # fmt: skip
def test_bad_reasoning_sequences_are_refused(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SamplerConfig(2, V, **kwargs)


def test_a_budget_needs_the_sequences_and_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        SP(thinking_token_budget=-1)
    sampler = Sampler(SamplerConfig(2, V), "cpu")
    with pytest.raises(ValueError, match="needs the config's reasoning_start_token_ids"):
        sampler.update_state(BatchUpdate(1, added=[(0, SP(thinking_token_budget=3), None, [])]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_forcing_overrides_the_masks_before_it(backend: str) -> None:
    device = backend_device(backend)
    sampler = Sampler(_config(backend=backend, eos_token_id=END[1]), device)
    # allowed ids without the end sequence, min_tokens banning one of its tokens (the EOS),
    # a bad word on another: the end is forced all the same
    params = SP(thinking_token_budget=1, allowed_token_ids=[7, 8], min_tokens=50,
                bad_words_token_ids=[[END[2]]], seed=3)  # fmt: skip
    sampler.update_state(BatchUpdate(1, added=[(0, params, [*START], [])]))
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1)).to(device)
    got = [int(sampler(logits).sampled_token_ids[0, 0]) for _ in range(5)]
    assert got[0] in (7, 8)
    assert got[1:4] == list(END)
    assert got[4] in (7, 8)
