"""Every input the engine hands over is checked on the host or made harmless on the device.

Host facts (types, shapes, dtypes, devices) raise ValueError/TypeError before anything
changes. Device values the host cannot read without a sync (token ids, draft
probabilities) are made harmless on the device, and `validate=True` reads them in eager
mode to raise instead.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from graphsafe_sampler import BatchUpdate, RejectionSampler, Sampler, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.bitmask import num_words
from graphsafe_sampler.testing import assert_no_sync, state_fingerprint

V = 97


def _sampler(**overrides: object) -> Sampler:
    settings: dict[str, object] = dict(
        max_num_reqs=4, vocab_size=V, eos_token_id=3, max_bad_word_len=3, seed=0
    )
    settings.update(overrides)
    sampler = Sampler(SamplerConfig(**settings), "cpu")  # type: ignore[arg-type]
    requests = [
        SP(seed=1, frequency_penalty=0.5, bad_words_token_ids=[[5, 6]]),
        SP(seed=2, presence_penalty=0.3, min_tokens=4),
        SP(temperature=0.0, repetition_penalty=1.2),
    ]
    sampler.update_state(
        BatchUpdate(3, added=[(r, p, [1, 2], [8]) for r, p in enumerate(requests)])
    )
    return sampler


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
    return {k for k in a if not torch.equal(a[k], b[k])}


# ------------------------------------------------------------------ commit_mask


@pytest.mark.parametrize(
    ("mask", "exc", "match"),
    [
        (torch.ones(1, dtype=torch.bool), ValueError, r"commit_mask must have shape \[3\]"),
        (torch.ones(4, dtype=torch.bool), ValueError, r"commit_mask must have shape \[3\]"),
        (torch.ones(3, 1, dtype=torch.bool), ValueError, r"must have shape \[3\], got \[3, 1\]"),
        (torch.ones(3, dtype=torch.int64), TypeError, "commit_mask must be bool, got torch.int64"),
        ([True, True, False], TypeError, "commit_mask must be a torch.Tensor, got list"),
        (torch.ones(3, dtype=torch.bool, device="meta"), ValueError, "commit_mask are on meta"),
    ],
    ids=["broadcast-1", "too-long", "2-D", "int", "list", "other-device"],
)
def test_bad_commit_masks_are_refused_and_change_nothing(
    mask: object, exc: type[Exception], match: str
) -> None:
    sampler = _sampler()
    logits = torch.randn(3, V) * 3
    before = state_fingerprint([sampler])
    with pytest.raises(exc, match=match):
        sampler(logits, mask)  # type: ignore[arg-type]
    with pytest.raises(exc, match=match):
        sampler.commit_tokens(torch.tensor([4, 5, 6]), commit_mask=mask)  # type: ignore[arg-type]
    assert _same(before, state_fingerprint([sampler]))


def test_a_good_commit_mask_keeps_its_rows_out() -> None:
    sampler = _sampler()
    before = state_fingerprint([sampler])
    sampler(torch.randn(3, V) * 3, torch.zeros(3, dtype=torch.bool))
    assert _same(before, state_fingerprint([sampler]))


# ------------------------------------------------------------------ commit_tokens ids


@pytest.mark.parametrize("bad", [-1, V, V + 1000, -(2**40)], ids=["-1", "V", "V+1000", "-2^40"])
def test_out_of_range_ids_commit_nothing(bad: int) -> None:
    sampler = _sampler()
    before = state_fingerprint([sampler])
    # Graph-safe: the ids are masked on the device, with no host read.
    assert_no_sync(sampler.commit_tokens, torch.tensor([bad, bad, bad]))
    assert _same(before, state_fingerprint([sampler]))
    # The same row with a valid id does change: the check above can fail.
    sampler.commit_tokens(torch.tensor([bad, 9, bad]))
    after = state_fingerprint([sampler])
    assert _changed(before, after)
    slot = sampler.batch_state.slot_of_row(1)
    assert slot is not None
    generated = sampler.batch_state.num_generated.device
    assert int(generated[slot]) == int(before["0.num_generated.device"][slot]) + 1
    counts = sampler.stages.penalties.counts
    assert int(counts[slot, 9]) == 1
    others = [s for s in range(sampler.config.num_slots) if s != slot]
    assert torch.equal(generated[others], before["0.num_generated.device"][others])


def test_out_of_range_ids_in_a_multi_token_commit_skip_their_column_only() -> None:
    sampler = _sampler()
    slot = sampler.batch_state.slot_of_row(0)
    assert slot is not None
    start = int(sampler.batch_state.num_generated.device[slot])
    ids = torch.tensor([[11, -1, 12], [V, V, V], [13, 14, 2**31 - 1]], dtype=torch.int32)
    sampler.commit_tokens(ids, num_tokens=torch.tensor([3, 3, 2]))
    generated = sampler.batch_state.num_generated.device
    counts = sampler.stages.penalties.counts
    assert int(generated[slot]) == start + 2  # 11 and 12, not -1
    assert int(counts[slot, 11]) == 1 and int(counts[slot, 12]) == 1
    assert int(counts[slot, V - 1]) == 0  # -1 did not wrap to the last token
    row1, row2 = sampler.batch_state.slot_of_row(1), sampler.batch_state.slot_of_row(2)
    assert int(generated[row1]) == start  # every id out of range: nothing
    assert int(generated[row2]) == start + 2  # 13, 14; the third column is past num_tokens
    # the bad-words window of row 0 holds the committed ids in order, never -1
    window = sampler.stages.bad_words.window.device[slot]
    assert -1 not in window.tolist() and {11, 12} <= set(window.tolist())


@pytest.mark.parametrize(
    ("ids", "kwargs", "exc", "match"),
    [
        (torch.tensor([1.0, 2.0, 3.0]), {}, TypeError, "token_ids must be int32 or int64, got"),
        (torch.tensor([True, False, True]), {}, TypeError, "token_ids must be int32 or int64"),
        ([1, 2, 3], {}, TypeError, "token_ids must be a torch.Tensor, got list"),
        (torch.ones(3, 2, 2, dtype=torch.int64), {}, ValueError, "got 3-D"),
        (torch.ones(5, dtype=torch.int64), {}, ValueError, "token_ids have 5 rows"),
        (torch.ones(2, dtype=torch.int64), {}, ValueError, "token_ids have 2 rows but the batch"),
        (
            torch.ones(3, dtype=torch.int64),
            {"num_tokens": torch.ones(3, dtype=torch.int64)},
            ValueError,
            "num_tokens needs 2-D token_ids",
        ),
        (
            torch.ones(3, 2, dtype=torch.int64),
            {"num_tokens": torch.ones(3)},
            TypeError,
            "num_tokens must be int32 or int64, got torch.float32",
        ),
        (
            torch.ones(3, 2, dtype=torch.int64),
            {"num_tokens": torch.ones(1, dtype=torch.int64)},
            ValueError,
            r"num_tokens must have shape \[3\], got \[1\]",
        ),
    ],
    ids=[
        "float",
        "bool",
        "list",
        "3-D",
        "too-many-rows",
        "fewer-than-batch",
        "num_tokens-1-D",
        "num_tokens-float",
        "num_tokens-broadcast",
    ],
)
def test_bad_commit_tokens_calls_are_refused(
    ids: object, kwargs: dict[str, object], exc: type[Exception], match: str
) -> None:
    sampler = _sampler()
    before = state_fingerprint([sampler])
    with pytest.raises(exc, match=match):
        sampler.commit_tokens(ids, **kwargs)  # type: ignore[arg-type]
    assert _same(before, state_fingerprint([sampler]))


@pytest.mark.parametrize(
    ("ids", "num_tokens", "match"),
    [
        ([4, -1, 5], None, r"token_ids\[1\] = -1 is outside the vocabulary \[0, 97\)"),
        ([4, 5, V], None, r"token_ids\[2\] = 97 is outside"),
        ([[4, 5], [6, V]], [2, 2], r"token_ids\[1, 1\] = 97 is outside"),
        ([[4, 5], [6, 7]], [2, 3], r"num_tokens\[1\] = 3 is outside \[0, 2\]"),
        ([[4, 5], [6, 7]], [-1, 1], r"num_tokens\[0\] = -1 is outside \[0, 2\]"),
    ],
    ids=["minus-one", "V", "2-D", "count-above", "count-below"],
)
def test_validate_raises_for_out_of_range_values(
    ids: list[object], num_tokens: list[int] | None, match: str
) -> None:
    sampler = _sampler()
    ids_t = torch.tensor(ids, dtype=torch.int64)
    counts = None if num_tokens is None else torch.tensor(num_tokens)
    rows = 3 - ids_t.shape[0]
    if rows:  # 2-row cases: pad to the batch with rows that commit nothing
        ids_t = torch.cat([ids_t, ids_t.new_zeros(rows, *ids_t.shape[1:])])
        if counts is not None:
            counts = torch.cat([counts, counts.new_zeros(rows)])
    before = state_fingerprint([sampler])
    with pytest.raises(ValueError, match=match):
        sampler.commit_tokens(ids_t, counts, validate=True)
    assert _same(before, state_fingerprint([sampler]))


def test_validate_ignores_ids_past_num_tokens() -> None:
    sampler = _sampler()
    ids = torch.tensor([[4, -1], [5, V], [6, 7]])
    sampler.commit_tokens(ids, torch.tensor([1, 1, 2]), validate=True)


# ------------------------------------------------------------------ SamplingParams


def test_params_are_frozen() -> None:
    params = SP(temperature=0.7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = math.nan  # type: ignore[misc]
    # replace builds a new one and checks it
    for field, value, match in [
        ("temperature", math.nan, "temperature must be >= 0"),
        ("top_p", 0.0, r"top_p must be in \(0, 1\]"),
        ("min_p", 5.0, r"min_p must be in \[0, 1\]"),
        ("top_k", 2.5, "top_k must be an int"),
        ("seed", 2**70, r"seed must be in \[-2\*\*63, 2\*\*64\)"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            dataclasses.replace(params, **{field: value})


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda p: p.logit_bias.__setitem__(7, math.nan), r"logit_bias\[7\] must be finite"),
        (lambda p: p.logit_bias.__setitem__(7, 1e39), r"logit_bias\[7\] must be finite in float32"),
        (lambda p: p.logit_bias.__setitem__(-3, 1.0), "logit_bias key must be a token id >= 0"),
        (lambda p: p.stop_token_ids.append(-5), r"stop_token_ids\[1\] must be a token id >= 0"),
        (lambda p: p.stop_token_ids.append(V), r"stop_token_ids\[1\] = 97 is outside"),
        (lambda p: p.allowed_token_ids.clear(), "allowed_token_ids must not be empty"),
        (lambda p: p.bad_words_token_ids.append([]), r"bad_words_token_ids\[1\] must not be empty"),
    ],
    ids=[
        "bias-nan",
        "bias-1e39",
        "bias-key",
        "stop-negative",
        "stop-V",
        "allowed-empty",
        "bad-word-empty",
    ],
)
def test_params_changed_after_construction_are_checked_again_at_add(mutate, match) -> None:  # type: ignore[no-untyped-def]
    sampler = _sampler()
    params = SP(
        logit_bias={7: 1.0}, stop_token_ids=[5], allowed_token_ids=[1, 2], bad_words_token_ids=[[4]]
    )
    mutate(params)
    before = state_fingerprint([sampler])
    with pytest.raises(ValueError, match=r"added\[1\] \(row 3\): " + match):
        sampler.update_state(BatchUpdate(4, added=[(3, SP(), None, []), (3, params, None, [])]))
    assert _same(before, state_fingerprint([sampler]))


def test_logit_bias_is_checked_as_float32() -> None:
    largest = float(np.finfo(np.float32).max)
    assert SP(logit_bias={1: largest, 2: -largest}).logit_bias == {1: largest, 2: -largest}
    for value in (1e39, -1e39, 3.5e38):
        with pytest.raises(ValueError, match="must be finite in float32"):
            SP(logit_bias={1: value})


def test_errors_name_the_refused_request() -> None:
    sampler = _sampler()
    before = state_fingerprint([sampler])
    cases = [
        (SP(logit_bias={V: 1.0}), ValueError, r"added\[1\] \(row 3\): logit_bias key\[0\] = 97"),
        (SP(stop_token_ids=[1] * 200), ValueError, r"added\[1\] \(row 3\): stop_token_ids has"),
        ("not params", TypeError, r"added\[1\] \(row 3\): params must be SamplingParams"),
    ]
    for params, exc, match in cases:
        with pytest.raises(exc, match=match):
            sampler.update_state(
                BatchUpdate(4, added=[(3, SP(), None, []), (3, params, None, [])])  # type: ignore[list-item]
            )
    with pytest.raises(ValueError, match=r"added\[0\] \(row 3\): output_tok_ids holds token id"):
        sampler.update_state(BatchUpdate(4, added=[(3, SP(), None, [V])]))
    assert _same(before, state_fingerprint([sampler]))


# ------------------------------------------------------------------ grammar rows


@pytest.mark.parametrize(
    ("rows", "exc", "match"),
    [
        ([0.7], TypeError, r"rows\[0\] must be an int, got 0.7"),
        ([True], TypeError, r"rows\[0\] must be an int, got True"),
        ("0", TypeError, "must be a sequence of ints, got str"),
        ([1, 1], ValueError, "repeat a row"),
    ],
    ids=["float", "bool", "str", "repeated"],
)
def test_grammar_rows_must_be_distinct_ints(rows: object, exc: type[Exception], match: str) -> None:
    sampler = _sampler()
    words = num_words(V)
    mask = np.full((len(rows), words), -1, dtype=np.int32)  # type: ignore[arg-type]
    before = state_fingerprint([sampler])
    with pytest.raises(exc, match=match):
        sampler.stage_grammar_bitmask(mask, rows)  # type: ignore[arg-type]
    assert _same(before, state_fingerprint([sampler]))
    sampler.stage_grammar_bitmask(mask[:1], np.array([2]))  # numpy ints are ints


# ------------------------------------------------------------------ draft probabilities


@pytest.mark.parametrize("bad", [-1.0, math.nan, -math.inf], ids=["negative", "nan", "-inf"])
def test_bad_draft_probs_never_emit_a_banned_token(bad: float) -> None:
    seed = int(torch.seed() % 2**31)
    print(f"generator seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    config = SamplerConfig(max_num_reqs=8, vocab_size=V, seed=0)
    sampler = Sampler(config, "cpu")
    rejection = RejectionSampler(sampler, max_spec_len=2)
    allowed = [1, 2, 3]
    sampler.update_state(
        BatchUpdate(
            8, added=[(r, SP(seed=r, allowed_token_ids=allowed), None, []) for r in range(8)]
        )
    )
    rows, spec = 8, 2
    drafts = torch.full((rows, spec), 30, dtype=torch.int64)  # banned at every position
    probs = torch.rand(rows, spec, V, generator=gen)
    probs /= probs.sum(-1, keepdim=True)
    probs[:, :, 30] = bad  # the drafted, banned token
    probs[::2, :, 40:60] = bad  # more banned tokens with bad values, on half the rows
    for _ in range(6):
        logits = torch.randn(rows, spec + 1, V, generator=gen) * 3
        out = rejection(logits, drafts, torch.full((rows,), spec), probs)
        assert out.num_accepted.tolist() == [0] * rows
        emitted = out.output_token_ids[:, 0].tolist()
        assert set(emitted) <= set(allowed), emitted
    with pytest.raises(ValueError, match=r"draft_probs\[0, 0, 30\] = .* is not a probability"):
        rejection(logits, drafts, torch.full((rows,), spec), probs, validate=True)
    # only the drafted positions are read: with no drafts, nothing to refuse
    rejection(logits, drafts, torch.zeros(rows, dtype=torch.int64), probs, validate=True)
