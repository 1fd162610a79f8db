"""Per-request sampling parameters, with vLLM's field names and ranges.

`SamplingParams` checks what it can on its own when it is built (ranges that do not depend on
the sampler); `SamplingParams.check_against(config)` checks the rest (token ids against the
vocabulary, per-request capacities, logprobs against `max_num_logprobs`). Every error is a
`ValueError` (or `TypeError` for a wrong type) that names the field, the value and the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from graphsafe_sampler.kernels.constants import GREEDY_TEMPERATURE

if TYPE_CHECKING:
    from graphsafe_sampler.config import SamplerConfig


_INT64_MIN = -(2**63)
_UINT64_LIMIT = 2**64


def seed_bits(seed: int) -> int:
    """Any seed (or watermark key) in [-2**63, 2**64) as the int64 with the same 64 bits."""
    seed %= _UINT64_LIMIT
    return seed - _UINT64_LIMIT if seed >= 2**63 else seed


def _check_int(name: str, value: object) -> int:
    # bool is an int subclass; a flag passed where a count belongs is a bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def _check_float(name: str, value: object) -> float:
    # NaN passes here on purpose: every caller's range check is written `not lo <= x <= hi`,
    # which rejects NaN with a message that names the limit.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        # an int beyond float range (float(10**400)); still a ValueError naming the field.
        raise ValueError(f"{name} must be a finite float, got {value}") from None


def _check_token_ids(name: str, ids: object) -> list[int]:
    if not isinstance(ids, (list, tuple)):
        raise TypeError(f"{name} must be a list of ints, got {type(ids).__name__}")
    out = []
    for i, tok in enumerate(ids):
        tok = _check_int(f"{name}[{i}]", tok)
        if tok < 0:
            raise ValueError(f"{name}[{i}] must be a token id >= 0, got {tok}")
        out.append(tok)
    return out


def _check_logit_bias(logit_bias: object) -> dict[int, float]:
    if not isinstance(logit_bias, dict):
        raise TypeError(f"logit_bias must be a dict[int, float], got {type(logit_bias).__name__}")
    bias: dict[int, float] = {}
    for tok, value in logit_bias.items():
        tok = _check_int("logit_bias key", tok)
        if tok < 0:
            raise ValueError(f"logit_bias key must be a token id >= 0, got {tok}")
        value = _check_float(f"logit_bias[{tok}]", value)
        # The bias is added in float32: 1e39 is finite as a double and +inf as a float32.
        with np.errstate(over="ignore"):
            finite = bool(np.isfinite(np.float32(value)))
        if not finite:
            raise ValueError(f"logit_bias[{tok}] must be finite in float32, got {value}")
        bias[tok] = value
    return bias


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler (docs/design.md §3; vLLM's names and meanings).

    `top_k` 0 or -1 and `top_p` 1.0 switch those filters off; `temperature` below 1e-5 is
    greedy. `logit_bias` maps token id -> additive bias; `allowed_token_ids` restricts the
    vocabulary; `bad_words_token_ids` lists token-id sequences that must not be completed;
    `min_tokens` masks `stop_token_ids` (and the config's EOS) until that many tokens have
    been generated. `logprobs` is how many top logprobs the engine will read for this request
    (at most `SamplerConfig.max_num_logprobs`); `logprob_token_ids` the ids whose logprobs
    and ranks it reads at every step (at most `SamplerConfig.max_logprob_token_ids`, no
    repeats). `thinking_token_budget` caps the tokens of each reasoning section, after which
    the config's `reasoning_end_token_ids` are forced (None: no cap). `watermark_key` (any
    64-bit int) watermarks the request's random draws (None: not watermarked; needs
    `SamplerConfig.watermark_context_len`). `extra_args` carries custom processors' params.

    Frozen: a field set after construction would skip the checks (use
    `dataclasses.replace`, which checks again). The containers (`logit_bias`, the id lists,
    `extra_args`) are the caller's own copies and stay mutable, so the sampler checks every
    request again when it is added (`check`).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    extra_args: dict[str, Any] | None = field(default=None)
    # after extra_args, so that positional construction of the fields above still works
    logprob_token_ids: list[int] | None = None
    thinking_token_budget: int | None = None
    watermark_key: int | None = None

    def __post_init__(self) -> None:
        # Normalised values (ints as floats, fresh containers) go in once, at construction.
        for name, value in self._checked().items():
            object.__setattr__(self, name, value)

    def check(self) -> None:
        """Raise ValueError/TypeError if a field is out of range now (the sampler calls it
        at add time: a container may have been changed since construction)."""
        self._checked()

    def _checked(self) -> dict[str, Any]:
        """Every field checked, as its normalised value; raises naming the first bad one."""
        out: dict[str, Any] = {}
        temperature = _check_float("temperature", self.temperature)
        if not temperature >= 0.0 or math.isinf(temperature):
            raise ValueError(f"temperature must be >= 0 and finite, got {temperature}")
        out["temperature"] = temperature
        top_p = _check_float("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        out["top_p"] = top_p
        top_k = _check_int("top_k", self.top_k)
        if top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or >= 1, got {top_k}")
        out["top_k"] = top_k
        min_p = _check_float("min_p", self.min_p)
        if not 0.0 <= min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")
        out["min_p"] = min_p
        for name in ("presence_penalty", "frequency_penalty"):
            value = _check_float(name, getattr(self, name))
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
            out[name] = value
        repetition = _check_float("repetition_penalty", self.repetition_penalty)
        if not 0.0 < repetition <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {repetition}")
        out["repetition_penalty"] = repetition
        if self.seed is not None:
            seed = _check_int("seed", self.seed)
            if not _INT64_MIN <= seed < _UINT64_LIMIT:
                raise ValueError(f"seed must be in [-2**63, 2**64), got {seed}")
        if self.watermark_key is not None:
            key = _check_int("watermark_key", self.watermark_key)
            if not _INT64_MIN <= key < _UINT64_LIMIT:
                raise ValueError(f"watermark_key must be in [-2**63, 2**64), got {key}")
        min_tokens = _check_int("min_tokens", self.min_tokens)
        if min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {min_tokens}")
        if self.logprobs is not None:
            logprobs = _check_int("logprobs", self.logprobs)
            if logprobs < 0:
                raise ValueError(f"logprobs must be >= 0, got {logprobs}")
        if self.thinking_token_budget is not None:
            budget = _check_int("thinking_token_budget", self.thinking_token_budget)
            if budget < 0:
                raise ValueError(f"thinking_token_budget must be >= 0, got {budget}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        if self.logit_bias is not None:
            out["logit_bias"] = _check_logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            allowed = _check_token_ids("allowed_token_ids", self.allowed_token_ids)
            if not allowed:
                raise ValueError("allowed_token_ids must not be empty (use None for no limit)")
            out["allowed_token_ids"] = allowed
        if self.logprob_token_ids is not None:
            ids = _check_token_ids("logprob_token_ids", self.logprob_token_ids)
            if len(set(ids)) != len(ids):
                raise ValueError("logprob_token_ids must not repeat an id")
            out["logprob_token_ids"] = ids
        if self.stop_token_ids is not None:
            out["stop_token_ids"] = _check_token_ids("stop_token_ids", self.stop_token_ids)
        if self.bad_words_token_ids is not None:
            if not isinstance(self.bad_words_token_ids, (list, tuple)):
                raise TypeError(
                    "bad_words_token_ids must be a list of token-id lists, "
                    f"got {type(self.bad_words_token_ids).__name__}"
                )
            words = []
            for i, word in enumerate(self.bad_words_token_ids):
                word = _check_token_ids(f"bad_words_token_ids[{i}]", word)
                if not word:
                    raise ValueError(f"bad_words_token_ids[{i}] must not be empty")
                words.append(word)
            out["bad_words_token_ids"] = words
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise TypeError(f"extra_args must be a dict, got {type(self.extra_args).__name__}")
        return out

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def check_against(self, config: SamplerConfig) -> None:
        """Raise ValueError if this request does not fit `config` (vocabulary, capacities)."""
        vocab = config.vocab_size

        def check_ids(name: str, ids: list[int]) -> None:
            for i, tok in enumerate(ids):
                if tok >= vocab:
                    raise ValueError(f"{name}[{i}] = {tok} is outside the vocabulary [0, {vocab})")

        if self.logprobs is not None and self.logprobs > config.max_num_logprobs:
            raise ValueError(
                f"logprobs = {self.logprobs} exceeds max_num_logprobs = {config.max_num_logprobs}"
            )
        if self.watermark_key is not None and config.watermark_context_len == 0:
            raise ValueError("watermark_key needs the config's watermark_context_len >= 1")
        if self.thinking_token_budget is not None and not config.has_reasoning:
            raise ValueError(
                "thinking_token_budget needs the config's reasoning_start_token_ids and "
                "reasoning_end_token_ids"
            )
        if self.logprob_token_ids:
            if len(self.logprob_token_ids) > config.max_logprob_token_ids:
                raise ValueError(
                    f"logprob_token_ids has {len(self.logprob_token_ids)} ids, more than "
                    f"max_logprob_token_ids = {config.max_logprob_token_ids}"
                )
            check_ids("logprob_token_ids", self.logprob_token_ids)
        if self.logit_bias:
            if len(self.logit_bias) > config.max_logit_bias_tokens:
                raise ValueError(
                    f"logit_bias has {len(self.logit_bias)} entries, more than "
                    f"max_logit_bias_tokens = {config.max_logit_bias_tokens}"
                )
            check_ids("logit_bias key", list(self.logit_bias))
        if self.stop_token_ids:
            if len(self.stop_token_ids) > config.max_stop_token_ids:
                raise ValueError(
                    f"stop_token_ids has {len(self.stop_token_ids)} ids, more than "
                    f"max_stop_token_ids = {config.max_stop_token_ids}"
                )
            check_ids("stop_token_ids", self.stop_token_ids)
        if self.allowed_token_ids:
            if len(self.allowed_token_ids) > vocab:
                raise ValueError(
                    f"allowed_token_ids has {len(self.allowed_token_ids)} ids, more than "
                    f"vocab_size = {vocab}"
                )
            check_ids("allowed_token_ids", self.allowed_token_ids)
        if self.bad_words_token_ids:
            if len(self.bad_words_token_ids) > config.max_bad_words:
                raise ValueError(
                    f"bad_words_token_ids has {len(self.bad_words_token_ids)} words, more than "
                    f"max_bad_words = {config.max_bad_words}"
                )
            total = 0
            for i, word in enumerate(self.bad_words_token_ids):
                if len(word) > config.max_bad_word_len:
                    raise ValueError(
                        f"bad_words_token_ids[{i}] has {len(word)} tokens, more than "
                        f"max_bad_word_len = {config.max_bad_word_len}"
                    )
                check_ids(f"bad_words_token_ids[{i}]", word)
                total += len(word)
            if total > config.max_bad_words_tokens:
                raise ValueError(
                    f"bad_words_token_ids has {total} tokens in total, more than "
                    f"max_bad_words_tokens = {config.max_bad_words_tokens}"
                )
