"""`SamplerConfig`: sizes and capacities fixed for the life of a sampler.

Everything here decides a buffer's shape, so it is chosen once: the state tensors are
preallocated from it and never grow (docs/design.md §1). The capacities are per request.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal

import torch

LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
Backend = Literal["auto", "torch", "triton"]

LOGPROBS_MODES: tuple[str, ...] = (
    "raw_logprobs",
    "raw_logits",
    "processed_logprobs",
    "processed_logits",
)
BACKENDS: tuple[str, ...] = ("auto", "torch", "triton")


def _positive(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _contains(seq: Sequence[int], part: Sequence[int]) -> bool:
    """Whether `part` occurs in `seq` as a contiguous run."""
    n = len(part)
    return any(tuple(seq[i : i + n]) == tuple(part) for i in range(len(seq) - n + 1))


@dataclass(frozen=True)
class SamplerConfig:
    """Fixed sizes of a sampler.

    max_num_reqs: requests held at once; also the most logits rows `forward` accepts.
    vocab_size: logits width V.
    max_num_logprobs: top-K logprobs columns returned (0 = no logprobs tensors).
    max_logprob_token_ids: chosen token ids per request whose logprobs and ranks are
        returned beside the top K (`SamplingParams.logprob_token_ids`; 0 = none; needs
        max_num_logprobs >= 1).
    logprobs_mode: "raw_logprobs" | "raw_logits" | "processed_logprobs" | "processed_logits".
    eos_token_id: masked while a request has fewer than `min_tokens` outputs.
    backend: "auto" (Triton on CUDA, PyTorch elsewhere), "torch" or "triton".
    logits_processors: custom processors: classes or "package.module:QualName" strings.
    seed: seeds the host RNG that draws seeds for unseeded requests (None = from the OS).
    max_logit_bias_tokens: logit-bias entries per request.
    max_stop_token_ids: stop token ids per request (EOS not counted).
    max_bad_words: bad words (token sequences) per request (a check only: the tables are
        sized by max_bad_words_tokens).
    max_bad_word_len: tokens in one bad word; also the device-side window of recent outputs.
    max_bad_words_tokens: bad-word tokens per request, all words together.
    max_model_len: tokens per request, prompt and output together (requests added with more
        are rejected); sizes the penalty state's table of tokens output 255 times or more.
    reasoning_start_token_ids, reasoning_end_token_ids: the token sequences that open and
        close a reasoning section (vLLM's names; both or neither): with them, requests may
        set `thinking_token_budget`, and the end sequence is forced once it is spent.
    watermark_context_len: the previous tokens a watermarked request's draws are keyed by
        (`SamplingParams.watermark_key`; 0 = watermarking off).
    pin_memory: pin the host staging buffers (None = when an accelerator exists).
    """

    max_num_reqs: int
    vocab_size: int
    # docs/design.md §3: everything after vocab_size is keyword-only.
    _: KW_ONLY
    max_num_logprobs: int = 0
    max_logprob_token_ids: int = 0
    logprobs_mode: LogprobsMode = "raw_logprobs"
    eos_token_id: int | None = None
    backend: Backend = "auto"
    logits_processors: Sequence[Any] = ()
    seed: int | None = None
    max_logit_bias_tokens: int = 1024
    max_stop_token_ids: int = 128
    max_bad_words: int = 1024
    max_bad_word_len: int = 16
    max_bad_words_tokens: int = 1024
    max_model_len: int = 131072
    reasoning_start_token_ids: Sequence[int] = ()
    reasoning_end_token_ids: Sequence[int] = ()
    watermark_context_len: int = 0
    pin_memory: bool | None = None

    def __post_init__(self) -> None:
        _positive("max_num_reqs", self.max_num_reqs)
        _positive("vocab_size", self.vocab_size, minimum=2)
        if self.vocab_size >= 2**31:
            raise ValueError(f"vocab_size must be < 2**31, got {self.vocab_size}")
        _positive("max_num_logprobs", self.max_num_logprobs, minimum=0)
        if self.max_num_logprobs > self.vocab_size:
            raise ValueError(
                f"max_num_logprobs must be <= vocab_size = {self.vocab_size}, "
                f"got {self.max_num_logprobs}"
            )
        _positive("max_logprob_token_ids", self.max_logprob_token_ids, minimum=0)
        if self.max_logprob_token_ids > 0 and self.max_num_logprobs == 0:
            raise ValueError(
                f"max_logprob_token_ids = {self.max_logprob_token_ids} needs logprobs: "
                "set max_num_logprobs >= 1"
            )
        if self.max_logprob_token_ids > self.vocab_size:
            raise ValueError(
                f"max_logprob_token_ids must be <= vocab_size = {self.vocab_size}, "
                f"got {self.max_logprob_token_ids}"
            )
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.eos_token_id is not None:
            _positive("eos_token_id", self.eos_token_id, minimum=0)
            if self.eos_token_id >= self.vocab_size:
                raise ValueError(
                    f"eos_token_id = {self.eos_token_id} is outside the vocabulary "
                    f"[0, {self.vocab_size})"
                )
        for name in (
            "max_logit_bias_tokens",
            "max_stop_token_ids",
            "max_bad_words",
            "max_bad_word_len",
            "max_bad_words_tokens",
            "max_model_len",
        ):
            _positive(name, getattr(self, name))
        if self.seed is not None:
            _positive("seed", self.seed, minimum=0)
        _positive("watermark_context_len", self.watermark_context_len, minimum=0)
        for name in ("reasoning_start_token_ids", "reasoning_end_token_ids"):
            ids = getattr(self, name)
            if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
                raise TypeError(f"{name} must be a sequence of token ids, got {type(ids).__name__}")
            ids = tuple(ids)
            for i, tok in enumerate(ids):
                _positive(f"{name}[{i}]", tok, minimum=0)
                if tok >= self.vocab_size:
                    raise ValueError(
                        f"{name}[{i}] = {tok} is outside the vocabulary [0, {self.vocab_size})"
                    )
            object.__setattr__(self, name, ids)
        if bool(self.reasoning_start_token_ids) != bool(self.reasoning_end_token_ids):
            raise ValueError(
                "reasoning_start_token_ids and reasoning_end_token_ids come together: "
                f"got {len(self.reasoning_start_token_ids)} and "
                f"{len(self.reasoning_end_token_ids)} ids"
            )
        start, end = self.reasoning_start_token_ids, self.reasoning_end_token_ids
        if start and (_contains(end, start) or _contains(start, end)):
            # forcing an end that holds the start would reopen the section it closes
            raise ValueError(
                f"reasoning_start_token_ids {list(start)} and reasoning_end_token_ids "
                f"{list(end)} must not contain one another"
            )
        # A lone "module:QualName" string is iterable too; tuple() would split it into characters.
        if isinstance(self.logits_processors, (str, bytes)) or not isinstance(
            self.logits_processors, Iterable
        ):
            raise TypeError(
                "logits_processors must be a sequence of classes or 'module:QualName' strings, "
                f"got {type(self.logits_processors).__name__}"
            )
        # A tuple, so that a frozen config cannot change under a live sampler.
        object.__setattr__(self, "logits_processors", tuple(self.logits_processors))

    @property
    def has_reasoning(self) -> bool:
        """Whether the reasoning sequences are set (requests may set a thinking budget)."""
        return bool(self.reasoning_start_token_ids)

    @property
    def num_slots(self) -> int:
        """Rows of every slot-indexed state tensor: one per request plus the padding slot."""
        return self.max_num_reqs + 1

    @property
    def padding_slot(self) -> int:
        """The slot that empty and padded rows map to; it holds neutral parameters."""
        return self.max_num_reqs


def triton_available(device: torch.device) -> bool:
    """Whether Triton kernels can run on `device`: CUDA, or any device under the Triton
    interpreter (`TRITON_INTERPRET=1`, numpy: correct and slow, for tests)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device.type == "cuda"


def resolve_backend(config: SamplerConfig, device: torch.device) -> Literal["torch", "triton"]:
    """The backend `config` asks for on `device`; "auto": Triton where its kernels run
    natively (CUDA), PyTorch elsewhere. Raises ValueError for "triton" where its kernels
    cannot run."""
    if config.backend == "torch":
        return "torch"
    if config.backend == "triton":
        if not triton_available(device):
            raise ValueError(
                f"backend='triton' needs a CUDA device (or TRITON_INTERPRET=1, the Triton "
                f"interpreter, for tests); the sampler is on {device}: use 'torch' or 'auto'"
            )
        return "triton"
    return "triton" if device.type == "cuda" else "torch"
