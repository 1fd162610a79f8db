"""SamplerConfig: validation of sizes, modes and capacities; derived slots; immutability."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from graphsafe_sampler import SamplerConfig
from graphsafe_sampler.config import BACKENDS, LOGPROBS_MODES

CAPACITIES = (
    "max_logit_bias_tokens",
    "max_stop_token_ids",
    "max_bad_words",
    "max_bad_word_len",
    "max_bad_words_tokens",
)


def _config(**kwargs: Any) -> SamplerConfig:
    kwargs.setdefault("max_num_reqs", 8)
    kwargs.setdefault("vocab_size", 32)
    return SamplerConfig(**kwargs)


def test_defaults() -> None:
    config = SamplerConfig(8, 32)
    assert config.max_num_reqs == 8
    assert config.vocab_size == 32
    assert config.max_num_logprobs == 0
    assert config.logprobs_mode == "raw_logprobs"
    assert config.eos_token_id is None
    assert config.backend == "auto"
    assert config.logits_processors == ()
    assert config.seed is None
    assert config.pin_memory is None
    # docs/design.md §3: at least 1024 logit-bias entries, 128 stop ids, 1024 bad-word tokens.
    assert config.max_logit_bias_tokens >= 1024
    assert config.max_stop_token_ids >= 128
    assert config.max_bad_words_tokens >= 1024
    assert config.max_bad_words >= 1
    assert config.max_bad_word_len >= 1


def test_options_after_vocab_size_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        SamplerConfig(8, 32, 4)  # type: ignore[misc]


OUT_OF_RANGE = [
    pytest.param({"max_num_reqs": 0}, r"max_num_reqs must be >= 1, got 0", id="max_num_reqs-zero"),
    pytest.param({"max_num_reqs": -3}, r"max_num_reqs must be >= 1, got -3",
                 id="max_num_reqs-negative"),
    pytest.param({"vocab_size": 1}, r"vocab_size must be >= 2, got 1", id="vocab-one"),
    pytest.param({"vocab_size": 0}, r"vocab_size must be >= 2, got 0", id="vocab-zero"),
    pytest.param({"vocab_size": 2**31}, r"vocab_size must be < 2\*\*31, got 2147483648",
                 id="vocab-2p31"),
    pytest.param({"max_num_logprobs": -1}, r"max_num_logprobs must be >= 0, got -1",
                 id="logprobs-negative"),
    pytest.param({"vocab_size": 32, "max_num_logprobs": 33},
                 r"max_num_logprobs must be <= vocab_size = 32, got 33", id="logprobs-above-vocab"),
    pytest.param({"logprobs_mode": "logprobs"}, r"logprobs_mode must be one of .*, got 'logprobs'",
                 id="logprobs_mode-unknown"),
    pytest.param({"logprobs_mode": "RAW_LOGPROBS"}, r"logprobs_mode must be one of",
                 id="logprobs_mode-case"),
    pytest.param({"logprobs_mode": None}, r"logprobs_mode must be one of .*, got None",
                 id="logprobs_mode-none"),
    pytest.param({"backend": "cuda"}, r"backend must be one of .*, got 'cuda'",
                 id="backend-unknown"),
    pytest.param({"backend": ""}, r"backend must be one of .*, got ''", id="backend-empty"),
    pytest.param({"eos_token_id": -1}, r"eos_token_id must be >= 0, got -1", id="eos-negative"),
    pytest.param({"vocab_size": 32, "eos_token_id": 32},
                 r"eos_token_id = 32 is outside the vocabulary \[0, 32\)", id="eos-eq-vocab"),
    pytest.param({"vocab_size": 32, "eos_token_id": 1000},
                 r"eos_token_id = 1000 is outside the vocabulary \[0, 32\)", id="eos-above-vocab"),
    pytest.param({"seed": -1}, r"seed must be >= 0, got -1", id="seed-negative"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "match"), OUT_OF_RANGE)
def test_out_of_range_raises_value_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _config(**kwargs)


@pytest.mark.parametrize("name", CAPACITIES)
@pytest.mark.parametrize("value", [pytest.param(0, id="zero"), pytest.param(-1, id="negative")])
def test_capacity_below_one_raises(name: str, value: int) -> None:
    with pytest.raises(ValueError, match=rf"{name} must be >= 1, got {value}"):
        _config(**{name: value})


@pytest.mark.parametrize("name", CAPACITIES)
def test_capacity_of_one_is_accepted(name: str) -> None:
    assert getattr(_config(**{name: 1}), name) == 1


WRONG_TYPE = [
    pytest.param({"max_num_reqs": 8.0}, r"max_num_reqs must be an int, got float",
                 id="max_num_reqs-float"),
    pytest.param({"max_num_reqs": True}, r"max_num_reqs must be an int, got bool",
                 id="max_num_reqs-bool"),
    pytest.param({"vocab_size": "32"}, r"vocab_size must be an int, got str", id="vocab-str"),
    pytest.param({"vocab_size": None}, r"vocab_size must be an int, got NoneType",
                 id="vocab-none"),
    pytest.param({"max_num_logprobs": False}, r"max_num_logprobs must be an int, got bool",
                 id="logprobs-bool"),
    pytest.param({"eos_token_id": True}, r"eos_token_id must be an int, got bool", id="eos-bool"),
    pytest.param({"eos_token_id": 2.0}, r"eos_token_id must be an int, got float",
                 id="eos-float"),
    pytest.param({"seed": 1.5}, r"seed must be an int, got float", id="seed-float"),
    pytest.param({"seed": True}, r"seed must be an int, got bool", id="seed-bool"),
    pytest.param({"max_bad_word_len": 4.0}, r"max_bad_word_len must be an int, got float",
                 id="bad_word_len-float"),
    pytest.param({"max_stop_token_ids": True}, r"max_stop_token_ids must be an int, got bool",
                 id="stop-bool"),
    pytest.param({"logits_processors": "pkg.mod:Cls"},
                 r"logits_processors must be a sequence .*, got str", id="processors-lone-str"),
    pytest.param({"logits_processors": None}, r"logits_processors must be a sequence .*NoneType",
                 id="processors-none"),
    pytest.param({"logits_processors": object}, r"logits_processors must be a sequence .*type",
                 id="processors-lone-class"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "match"), WRONG_TYPE)
def test_wrong_type_raises_type_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        _config(**kwargs)


@pytest.mark.parametrize("mode", LOGPROBS_MODES)
def test_every_logprobs_mode_is_accepted(mode: str) -> None:
    assert _config(logprobs_mode=mode).logprobs_mode == mode


def test_logprobs_modes_are_vllms() -> None:
    assert set(LOGPROBS_MODES) == {
        "raw_logprobs",
        "raw_logits",
        "processed_logprobs",
        "processed_logits",
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_is_accepted(backend: str) -> None:
    assert _config(backend=backend).backend == backend


def test_backends() -> None:
    assert set(BACKENDS) == {"auto", "torch", "triton"}


BOUNDARIES = [
    pytest.param({"max_num_reqs": 1}, id="one-request"),
    pytest.param({"vocab_size": 2}, id="vocab-two"),
    pytest.param({"vocab_size": 2**31 - 1}, id="vocab-int32-max"),
    pytest.param({"vocab_size": 32, "max_num_logprobs": 32}, id="logprobs-eq-vocab"),
    pytest.param({"max_num_logprobs": 0}, id="logprobs-zero"),
    pytest.param({"eos_token_id": 0}, id="eos-zero"),
    pytest.param({"vocab_size": 32, "eos_token_id": 31}, id="eos-last-id"),
    pytest.param({"seed": 0}, id="seed-zero"),
    pytest.param({"seed": 2**64 - 1}, id="seed-large"),
    pytest.param({"pin_memory": False}, id="pin_memory-false"),
    pytest.param({"pin_memory": True}, id="pin_memory-true"),
]


@pytest.mark.parametrize("kwargs", BOUNDARIES)
def test_values_at_the_limit_are_accepted(kwargs: dict[str, Any]) -> None:
    config = _config(**kwargs)
    for name, value in kwargs.items():
        assert getattr(config, name) == value


@pytest.mark.parametrize(
    ("max_num_reqs", "slots"),
    [pytest.param(1, 2, id="R1"), pytest.param(7, 8, id="R7"), pytest.param(256, 257, id="R256")],
)
def test_num_slots_and_padding_slot(max_num_reqs: int, slots: int) -> None:
    config = _config(max_num_reqs=max_num_reqs)
    assert config.num_slots == slots
    # The padding slot is the extra one, after every request's slot.
    assert config.padding_slot == max_num_reqs
    assert config.padding_slot == config.num_slots - 1


class _Processor:
    pass


@pytest.mark.parametrize(
    "processors",
    [
        pytest.param([_Processor, "pkg.mod:Other"], id="list"),
        pytest.param((_Processor, "pkg.mod:Other"), id="tuple"),
        pytest.param(iter([_Processor, "pkg.mod:Other"]), id="iterator"),
    ],
)
def test_logits_processors_become_a_tuple(processors: Any) -> None:
    config = _config(logits_processors=processors)
    assert config.logits_processors == (_Processor, "pkg.mod:Other")
    assert type(config.logits_processors) is tuple


def test_logits_processors_are_a_copy() -> None:
    processors: list[Any] = [_Processor]
    config = _config(logits_processors=processors)
    processors.append("pkg.mod:Late")
    assert config.logits_processors == (_Processor,)


def test_frozen() -> None:
    config = _config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.vocab_size = 64  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.logits_processors = ()  # type: ignore[misc]
    assert config.vocab_size == 32


def test_equal_configs_compare_and_hash_equal() -> None:
    a = _config(logits_processors=[_Processor], eos_token_id=3)
    b = _config(logits_processors=(_Processor,), eos_token_id=3)
    assert a == b
    assert hash(a) == hash(b)
    assert a != _config(eos_token_id=4)


def test_replace_revalidates() -> None:
    config = _config(vocab_size=32, eos_token_id=31)
    with pytest.raises(ValueError, match=r"eos_token_id = 31 is outside the vocabulary \[0, 16\)"):
        dataclasses.replace(config, vocab_size=16)
