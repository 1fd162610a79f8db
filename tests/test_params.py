"""SamplingParams: range checks at construction, and `check_against(config)` (docs/design.md
§3-4)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest

from graphsafe_sampler import SamplerConfig, SamplingParams
from graphsafe_sampler.params import GREEDY_TEMPERATURE

NAN = float("nan")
INF = float("inf")

VOCAB = 100


def _config(**kwargs: Any) -> SamplerConfig:
    kwargs.setdefault("max_num_reqs", 4)
    kwargs.setdefault("vocab_size", VOCAB)
    return SamplerConfig(**kwargs)


# --------------------------------------------------------------------------------------------
# Construction: out-of-range values
# --------------------------------------------------------------------------------------------

OUT_OF_RANGE = [
    pytest.param({"temperature": -0.5}, r"temperature must be >= 0 and finite, got -0\.5",
                 id="temperature-negative"),
    pytest.param({"temperature": -1e-30}, r"temperature must be >= 0", id="temperature-tiny-neg"),
    pytest.param({"temperature": INF}, r"temperature must be >= 0 and finite, got inf",
                 id="temperature-inf"),
    pytest.param({"temperature": -INF}, r"temperature must be >= 0 and finite, got -inf",
                 id="temperature-neg-inf"),
    pytest.param({"temperature": NAN}, r"temperature must be >= 0 and finite, got nan",
                 id="temperature-nan"),
    pytest.param({"temperature": 10**400}, r"temperature must be a finite float",
                 id="temperature-int-overflows-float"),
    pytest.param({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0\.0", id="top_p-zero"),
    pytest.param({"top_p": -0.1}, r"top_p must be in \(0, 1\], got -0\.1", id="top_p-negative"),
    pytest.param({"top_p": 1.0000001}, r"top_p must be in \(0, 1\], got 1\.0000001",
                 id="top_p-above-one"),
    pytest.param({"top_p": 2}, r"top_p must be in \(0, 1\], got 2\.0", id="top_p-int-two"),
    pytest.param({"top_p": NAN}, r"top_p must be in \(0, 1\], got nan", id="top_p-nan"),
    pytest.param({"top_p": INF}, r"top_p must be in \(0, 1\], got inf", id="top_p-inf"),
    pytest.param({"top_k": -2}, r"top_k must be -1, 0 \(off\) or >= 1, got -2", id="top_k-minus-2"),
    pytest.param({"top_k": -(2**40)}, r"top_k must be -1, 0 \(off\) or >= 1", id="top_k-huge-neg"),
    pytest.param({"min_p": -0.01}, r"min_p must be in \[0, 1\], got -0\.01", id="min_p-negative"),
    pytest.param({"min_p": 1.5}, r"min_p must be in \[0, 1\], got 1\.5", id="min_p-above-one"),
    pytest.param({"min_p": NAN}, r"min_p must be in \[0, 1\], got nan", id="min_p-nan"),
    pytest.param({"presence_penalty": -2.001},
                 r"presence_penalty must be in \[-2, 2\], got -2\.001", id="presence-below"),
    pytest.param({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\], got 2\.5",
                 id="presence-above"),
    pytest.param({"presence_penalty": NAN}, r"presence_penalty must be in \[-2, 2\], got nan",
                 id="presence-nan"),
    pytest.param({"presence_penalty": INF}, r"presence_penalty must be in \[-2, 2\], got inf",
                 id="presence-inf"),
    pytest.param({"frequency_penalty": -3}, r"frequency_penalty must be in \[-2, 2\], got -3\.0",
                 id="frequency-below"),
    pytest.param({"frequency_penalty": 2.0001}, r"frequency_penalty must be in \[-2, 2\]",
                 id="frequency-above"),
    pytest.param({"frequency_penalty": NAN}, r"frequency_penalty must be in \[-2, 2\], got nan",
                 id="frequency-nan"),
    pytest.param({"repetition_penalty": 0.0}, r"repetition_penalty must be in \(0, 2\], got 0\.0",
                 id="repetition-zero"),
    pytest.param({"repetition_penalty": -1.0}, r"repetition_penalty must be in \(0, 2\], got -1\.0",
                 id="repetition-negative"),
    pytest.param({"repetition_penalty": 2.01}, r"repetition_penalty must be in \(0, 2\], got 2\.01",
                 id="repetition-above"),
    pytest.param({"repetition_penalty": NAN}, r"repetition_penalty must be in \(0, 2\], got nan",
                 id="repetition-nan"),
    pytest.param({"repetition_penalty": INF}, r"repetition_penalty must be in \(0, 2\], got inf",
                 id="repetition-inf"),
    pytest.param({"seed": 2**64}, r"seed must be in \[-2\*\*63, 2\*\*64\)", id="seed-2p64"),
    pytest.param({"seed": -(2**63) - 1}, r"seed must be in \[-2\*\*63, 2\*\*64\)",
                 id="seed-below-int64"),
    pytest.param({"min_tokens": -1}, r"min_tokens must be >= 0, got -1", id="min_tokens-negative"),
    pytest.param({"logprobs": -1}, r"logprobs must be >= 0, got -1", id="logprobs-negative"),
    pytest.param({"logit_bias": {-1: 1.0}}, r"logit_bias key must be a token id >= 0, got -1",
                 id="logit_bias-negative-key"),
    pytest.param({"logit_bias": {3: INF}}, r"logit_bias\[3\] must be finite in float32, got inf",
                 id="logit_bias-inf"),
    pytest.param({"logit_bias": {3: -INF}}, r"logit_bias\[3\] must be finite in float32, got -inf",
                 id="logit_bias-neg-inf"),
    pytest.param({"logit_bias": {3: NAN}}, r"logit_bias\[3\] must be finite in float32, got nan",
                 id="logit_bias-nan"),
    pytest.param({"logit_bias": {3: 10**400}}, r"logit_bias\[3\] must be a finite float",
                 id="logit_bias-int-overflows-float"),
    pytest.param({"allowed_token_ids": []}, r"allowed_token_ids must not be empty",
                 id="allowed-empty"),
    pytest.param({"allowed_token_ids": ()}, r"allowed_token_ids must not be empty",
                 id="allowed-empty-tuple"),
    pytest.param({"allowed_token_ids": [0, -1]},
                 r"allowed_token_ids\[1\] must be a token id >= 0, got -1", id="allowed-negative"),
    pytest.param({"stop_token_ids": [5, 6, -7]},
                 r"stop_token_ids\[2\] must be a token id >= 0, got -7", id="stop-negative"),
    pytest.param({"bad_words_token_ids": [[1], []]}, r"bad_words_token_ids\[1\] must not be empty",
                 id="bad_word-empty"),
    pytest.param({"bad_words_token_ids": [[1, -3]]},
                 r"bad_words_token_ids\[0\]\[1\] must be a token id >= 0, got -3",
                 id="bad_word-negative"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "match"), OUT_OF_RANGE)
def test_out_of_range_raises_value_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


WRONG_TYPE = [
    pytest.param({"temperature": "1.0"}, r"temperature must be a float, got str", id="temp-str"),
    pytest.param({"temperature": None}, r"temperature must be a float, got NoneType",
                 id="temp-none"),
    pytest.param({"temperature": True}, r"temperature must be a float, got bool", id="temp-bool"),
    pytest.param({"top_p": [0.5]}, r"top_p must be a float, got list", id="top_p-list"),
    pytest.param({"min_p": False}, r"min_p must be a float, got bool", id="min_p-bool"),
    pytest.param({"presence_penalty": "0"}, r"presence_penalty must be a float, got str",
                 id="presence-str"),
    pytest.param({"frequency_penalty": True}, r"frequency_penalty must be a float, got bool",
                 id="frequency-bool"),
    pytest.param({"repetition_penalty": "1"}, r"repetition_penalty must be a float, got str",
                 id="repetition-str"),
    pytest.param({"top_k": True}, r"top_k must be an int, got bool", id="top_k-bool"),
    pytest.param({"top_k": 5.0}, r"top_k must be an int, got float", id="top_k-float"),
    pytest.param({"top_k": "5"}, r"top_k must be an int, got str", id="top_k-str"),
    pytest.param({"seed": True}, r"seed must be an int, got bool", id="seed-bool"),
    pytest.param({"seed": 1.0}, r"seed must be an int, got float", id="seed-float"),
    pytest.param({"min_tokens": False}, r"min_tokens must be an int, got bool",
                 id="min_tokens-bool"),
    pytest.param({"min_tokens": 2.0}, r"min_tokens must be an int, got float",
                 id="min_tokens-float"),
    pytest.param({"logprobs": True}, r"logprobs must be an int, got bool", id="logprobs-bool"),
    pytest.param({"logprobs": 1.5}, r"logprobs must be an int, got float", id="logprobs-float"),
    pytest.param({"ignore_eos": 1}, r"ignore_eos must be a bool, got int", id="ignore_eos-int"),
    pytest.param({"ignore_eos": None}, r"ignore_eos must be a bool, got NoneType",
                 id="ignore_eos-none"),
    pytest.param({"logit_bias": [(1, 1.0)]}, r"logit_bias must be a dict\[int, float\], got list",
                 id="logit_bias-list"),
    pytest.param({"logit_bias": {"1": 1.0}}, r"logit_bias key must be an int, got str",
                 id="logit_bias-str-key"),
    pytest.param({"logit_bias": {True: 1.0}}, r"logit_bias key must be an int, got bool",
                 id="logit_bias-bool-key"),
    pytest.param({"logit_bias": {1: "2"}}, r"logit_bias\[1\] must be a float, got str",
                 id="logit_bias-str-value"),
    pytest.param({"logit_bias": {1: None}}, r"logit_bias\[1\] must be a float, got NoneType",
                 id="logit_bias-none-value"),
    pytest.param({"allowed_token_ids": {1, 2}},
                 r"allowed_token_ids must be a list of ints, got set", id="allowed-set"),
    pytest.param({"allowed_token_ids": 3}, r"allowed_token_ids must be a list of ints, got int",
                 id="allowed-int"),
    pytest.param({"allowed_token_ids": [1, 2.0]},
                 r"allowed_token_ids\[1\] must be an int, got float", id="allowed-float-id"),
    pytest.param({"stop_token_ids": "12"}, r"stop_token_ids must be a list of ints, got str",
                 id="stop-str"),
    pytest.param({"stop_token_ids": [True]}, r"stop_token_ids\[0\] must be an int, got bool",
                 id="stop-bool-id"),
    pytest.param({"bad_words_token_ids": [1, 2]},
                 r"bad_words_token_ids\[0\] must be a list of ints, got int", id="bad_words-flat"),
    pytest.param({"bad_words_token_ids": {(1,)}},
                 r"bad_words_token_ids must be a list of token-id lists, got set",
                 id="bad_words-set"),
    pytest.param({"bad_words_token_ids": [[1, "2"]]},
                 r"bad_words_token_ids\[0\]\[1\] must be an int, got str", id="bad_words-str-id"),
    pytest.param({"extra_args": [("k", 1)]}, r"extra_args must be a dict, got list",
                 id="extra_args-list"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "match"), WRONG_TYPE)
def test_wrong_type_raises_type_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        SamplingParams(**kwargs)


# --------------------------------------------------------------------------------------------
# Construction: values at and inside the limits
# --------------------------------------------------------------------------------------------

AT_THE_LIMIT = [
    pytest.param({"temperature": 0.0}, id="temperature-zero"),
    pytest.param({"temperature": 1e6}, id="temperature-large"),
    pytest.param({"top_p": 1.0}, id="top_p-one"),
    pytest.param({"top_p": 1e-12}, id="top_p-tiny"),
    pytest.param({"top_k": -1}, id="top_k-minus-1"),
    pytest.param({"top_k": 0}, id="top_k-zero"),
    pytest.param({"top_k": 1}, id="top_k-one"),
    pytest.param({"top_k": 10**9}, id="top_k-large"),
    pytest.param({"min_p": 0.0}, id="min_p-zero"),
    pytest.param({"min_p": 1.0}, id="min_p-one"),
    pytest.param({"presence_penalty": -2.0}, id="presence-minus-2"),
    pytest.param({"presence_penalty": 2.0}, id="presence-plus-2"),
    pytest.param({"frequency_penalty": -2.0}, id="frequency-minus-2"),
    pytest.param({"frequency_penalty": 2.0}, id="frequency-plus-2"),
    pytest.param({"repetition_penalty": 2.0}, id="repetition-two"),
    pytest.param({"repetition_penalty": 1e-9}, id="repetition-tiny"),
    pytest.param({"seed": -(2**63)}, id="seed-int64-min"),
    pytest.param({"seed": 2**64 - 1}, id="seed-uint64-max"),
    pytest.param({"seed": 0}, id="seed-zero"),
    pytest.param({"min_tokens": 0}, id="min_tokens-zero"),
    pytest.param({"logprobs": 0}, id="logprobs-zero"),
    pytest.param({"logit_bias": {}}, id="logit_bias-empty"),
    pytest.param({"logit_bias": {0: -1e30, 1: 1e30}}, id="logit_bias-large-finite"),
    pytest.param({"allowed_token_ids": [0]}, id="allowed-token-zero"),
    pytest.param({"stop_token_ids": []}, id="stop-empty"),
    pytest.param({"bad_words_token_ids": []}, id="bad_words-none-listed"),
    pytest.param({"ignore_eos": True}, id="ignore_eos-true"),
    pytest.param({"extra_args": {}}, id="extra_args-empty"),
]


@pytest.mark.parametrize("kwargs", AT_THE_LIMIT)
def test_values_at_the_limit_are_accepted(kwargs: dict[str, Any]) -> None:
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value


def test_defaults() -> None:
    params = SamplingParams()
    assert params.temperature == 1.0
    assert params.top_p == 1.0
    assert params.top_k == 0
    assert params.min_p == 0.0
    assert params.presence_penalty == 0.0
    assert params.frequency_penalty == 0.0
    assert params.repetition_penalty == 1.0
    assert params.seed is None
    assert params.logit_bias is None
    assert params.allowed_token_ids is None
    assert params.bad_words_token_ids is None
    assert params.min_tokens == 0
    assert params.stop_token_ids is None
    assert params.ignore_eos is False
    assert params.logprobs is None
    assert params.extra_args is None
    assert not params.is_greedy


def test_ints_are_accepted_as_floats() -> None:
    params = SamplingParams(
        temperature=2,
        top_p=1,
        min_p=0,
        presence_penalty=-2,
        frequency_penalty=1,
        repetition_penalty=2,
        logit_bias={5: 3},
    )
    for name in (
        "temperature",
        "top_p",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
    ):
        assert type(getattr(params, name)) is float, name
    assert params.temperature == 2.0
    assert params.presence_penalty == -2.0
    assert params.logit_bias == {5: 3.0}
    assert all(type(v) is float for v in params.logit_bias.values())


def test_token_id_sequences_are_normalised_to_lists() -> None:
    params = SamplingParams(
        allowed_token_ids=(3, 1, 2),
        stop_token_ids=(7,),
        bad_words_token_ids=((1, 2), [3]),
    )
    assert params.allowed_token_ids == [3, 1, 2]
    assert type(params.allowed_token_ids) is list
    assert params.stop_token_ids == [7]
    assert type(params.stop_token_ids) is list
    assert params.bad_words_token_ids == [[1, 2], [3]]
    assert type(params.bad_words_token_ids) is list
    assert all(type(word) is list for word in params.bad_words_token_ids)


def test_normalised_lists_are_copies() -> None:
    allowed = [1, 2]
    bias = {1: 0.5}
    words = [[4, 5]]
    params = SamplingParams(allowed_token_ids=allowed, logit_bias=bias, bad_words_token_ids=words)
    allowed.append(3)
    bias[2] = 1.0
    words[0].append(6)
    assert params.allowed_token_ids == [1, 2]
    assert params.logit_bias == {1: 0.5}
    assert params.bad_words_token_ids == [[4, 5]]


def test_duplicate_ids_and_order_are_kept() -> None:
    # vLLM keeps what the user sent; deduplication, if any, is the consumer's business.
    params = SamplingParams(stop_token_ids=[9, 2, 9], allowed_token_ids=[4, 4])
    assert params.stop_token_ids == [9, 2, 9]
    assert params.allowed_token_ids == [4, 4]


def test_extra_args_are_kept_by_reference() -> None:
    extra = {"my_processor": {"strength": 0.5}}
    params = SamplingParams(extra_args=extra)
    assert params.extra_args is extra


def test_negative_seed_is_kept() -> None:
    assert SamplingParams(seed=-5).seed == -5


@pytest.mark.parametrize(
    ("temperature", "greedy"),
    [
        pytest.param(0.0, True, id="zero"),
        pytest.param(GREEDY_TEMPERATURE / 2, True, id="half-eps"),
        pytest.param(math.nextafter(GREEDY_TEMPERATURE, 0.0), True, id="just-below-eps"),
        pytest.param(GREEDY_TEMPERATURE, False, id="at-eps"),
        pytest.param(math.nextafter(GREEDY_TEMPERATURE, 1.0), False, id="just-above-eps"),
        pytest.param(1.0, False, id="one"),
    ],
)
def test_is_greedy_boundary(temperature: float, greedy: bool) -> None:
    assert GREEDY_TEMPERATURE == 1e-5
    assert SamplingParams(temperature=temperature).is_greedy is greedy


def test_is_greedy_follows_temperature() -> None:
    params = SamplingParams(temperature=0.0)
    assert params.is_greedy
    assert not dataclasses.replace(params, temperature=0.7).is_greedy


def test_error_messages_name_the_value() -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(top_p=1.25)
    message = str(info.value)
    assert "top_p" in message
    assert "1.25" in message
    assert "(0, 1]" in message


# --------------------------------------------------------------------------------------------
# check_against(config)
# --------------------------------------------------------------------------------------------

OUTSIDE_VOCAB = [
    pytest.param({"logit_bias": {VOCAB: 1.0}},
                 rf"logit_bias key\[0\] = {VOCAB} is outside the vocabulary \[0, {VOCAB}\)",
                 id="logit_bias-key-eq-vocab"),
    pytest.param({"logit_bias": {0: 1.0, 5: 1.0, 10**6: 1.0}},
                 rf"logit_bias key\[2\] = 1000000 is outside the vocabulary \[0, {VOCAB}\)",
                 id="logit_bias-key-huge"),
    pytest.param({"stop_token_ids": [1, VOCAB]},
                 rf"stop_token_ids\[1\] = {VOCAB} is outside the vocabulary \[0, {VOCAB}\)",
                 id="stop-eq-vocab"),
    pytest.param({"allowed_token_ids": [VOCAB + 7]},
                 rf"allowed_token_ids\[0\] = {VOCAB + 7} is outside the vocabulary \[0, {VOCAB}\)",
                 id="allowed-above-vocab"),
    pytest.param({"bad_words_token_ids": [[1], [2, VOCAB]]},
                 rf"bad_words_token_ids\[1\]\[1\] = {VOCAB} is outside the vocabulary "
                 rf"\[0, {VOCAB}\)",
                 id="bad_word-eq-vocab"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "match"), OUTSIDE_VOCAB)
def test_check_against_rejects_ids_outside_the_vocabulary(
    kwargs: dict[str, Any], match: str
) -> None:
    params = SamplingParams(**kwargs)
    with pytest.raises(ValueError, match=match):
        params.check_against(_config())


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"logit_bias": {VOCAB - 1: 1.0, 0: -1.0}}, id="logit_bias"),
        pytest.param({"stop_token_ids": [0, VOCAB - 1]}, id="stop"),
        pytest.param({"allowed_token_ids": [VOCAB - 1]}, id="allowed"),
        pytest.param({"bad_words_token_ids": [[0, VOCAB - 1]]}, id="bad_word"),
    ],
)
def test_check_against_accepts_the_last_token_id(kwargs: dict[str, Any]) -> None:
    SamplingParams(**kwargs).check_against(_config())


def _bias(n: int) -> dict[int, float]:
    return {tok: 0.5 for tok in range(n)}


CAPACITY_EXCEEDED = [
    pytest.param({"max_logit_bias_tokens": 3}, {"logit_bias": _bias(4)},
                 r"logit_bias has 4 entries, more than max_logit_bias_tokens = 3",
                 id="logit_bias"),
    pytest.param({"max_stop_token_ids": 2}, {"stop_token_ids": [1, 2, 3]},
                 r"stop_token_ids has 3 ids, more than max_stop_token_ids = 2", id="stop"),
    pytest.param({"max_stop_token_ids": 2}, {"stop_token_ids": [1, 1, 1]},
                 r"stop_token_ids has 3 ids, more than max_stop_token_ids = 2",
                 id="stop-duplicates-count"),
    pytest.param({}, {"allowed_token_ids": [*range(VOCAB), 0]},
                 rf"allowed_token_ids has {VOCAB + 1} ids, more than vocab_size = {VOCAB}",
                 id="allowed-more-than-vocab"),
    pytest.param({"max_bad_words": 2}, {"bad_words_token_ids": [[1], [2], [3]]},
                 r"bad_words_token_ids has 3 words, more than max_bad_words = 2",
                 id="bad_words-count"),
    pytest.param({"max_bad_word_len": 3}, {"bad_words_token_ids": [[1, 2, 3], [1, 2, 3, 4]]},
                 r"bad_words_token_ids\[1\] has 4 tokens, more than max_bad_word_len = 3",
                 id="bad_word-len"),
    pytest.param({"max_bad_words_tokens": 5, "max_bad_word_len": 4},
                 {"bad_words_token_ids": [[1, 2, 3], [4, 5, 6]]},
                 r"bad_words_token_ids has 6 tokens in total, more than max_bad_words_tokens = 5",
                 id="bad_words-total"),
    pytest.param({"max_num_logprobs": 5}, {"logprobs": 6},
                 r"logprobs = 6 exceeds max_num_logprobs = 5", id="logprobs"),
    pytest.param({}, {"logprobs": 1},
                 r"logprobs = 1 exceeds max_num_logprobs = 0", id="logprobs-when-disabled"),
]  # fmt: skip


@pytest.mark.parametrize(("config_kwargs", "kwargs", "match"), CAPACITY_EXCEEDED)
def test_check_against_rejects_exceeded_capacities(
    config_kwargs: dict[str, Any], kwargs: dict[str, Any], match: str
) -> None:
    params = SamplingParams(**kwargs)
    with pytest.raises(ValueError, match=match):
        params.check_against(_config(**config_kwargs))


CAPACITY_EXACT = [
    pytest.param({"max_logit_bias_tokens": 3}, {"logit_bias": _bias(3)}, id="logit_bias"),
    pytest.param({"max_stop_token_ids": 2}, {"stop_token_ids": [1, 2]}, id="stop"),
    pytest.param({}, {"allowed_token_ids": list(range(VOCAB))}, id="allowed-whole-vocab"),
    pytest.param({"max_bad_words": 2}, {"bad_words_token_ids": [[1], [2]]}, id="bad_words"),
    pytest.param({"max_bad_word_len": 3}, {"bad_words_token_ids": [[1, 2, 3]]}, id="bad_word-len"),
    pytest.param({"max_bad_words_tokens": 6, "max_bad_word_len": 3},
                 {"bad_words_token_ids": [[1, 2, 3], [4, 5, 6]]}, id="bad_words-total"),
    pytest.param({"max_num_logprobs": 5}, {"logprobs": 5}, id="logprobs"),
    pytest.param({}, {"logprobs": 0}, id="logprobs-zero-when-disabled"),
    pytest.param({"max_num_logprobs": VOCAB}, {"logprobs": VOCAB}, id="logprobs-whole-vocab"),
]  # fmt: skip


@pytest.mark.parametrize(("config_kwargs", "kwargs"), CAPACITY_EXACT)
def test_check_against_accepts_values_at_each_capacity(
    config_kwargs: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    SamplingParams(**kwargs).check_against(_config(**config_kwargs))


def test_check_against_default_capacities() -> None:
    # docs/design.md §3: defaults hold at least 1024 logit-bias entries, 128 stop ids, 1024 bad-word
    # tokens in total, and allowed_token_ids up to vocab_size.
    vocab = 4096
    config = _config(vocab_size=vocab)
    SamplingParams(
        logit_bias=_bias(1024),
        stop_token_ids=list(range(128)),
        allowed_token_ids=list(range(vocab)),
    ).check_against(config)
    word_len = config.max_bad_word_len
    words = [list(range(i, i + word_len)) for i in range(1024 // word_len)]
    assert sum(map(len, words)) == 1024
    SamplingParams(bad_words_token_ids=words).check_against(config)


def test_check_against_defaults_pass() -> None:
    SamplingParams().check_against(_config())


def test_check_against_changes_nothing() -> None:
    params = SamplingParams(
        logit_bias={1: 1.0},
        stop_token_ids=[2],
        allowed_token_ids=[3],
        bad_words_token_ids=[[4, 5]],
        logprobs=0,
    )
    before = repr(params)
    params.check_against(_config())
    assert repr(params) == before


def test_check_against_error_is_a_value_error_naming_the_limit() -> None:
    params = SamplingParams(stop_token_ids=[0] * 129)
    with pytest.raises(ValueError) as info:
        params.check_against(_config())
    message = str(info.value)
    assert re.search(r"\bstop_token_ids\b", message)
    assert "129" in message
    assert "max_stop_token_ids = 128" in message
