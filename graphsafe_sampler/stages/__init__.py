"""The stages of the sampling step, one per file, each holding its slot tables and its
PyTorch apply (the reference the Triton kernels match). Every apply takes its rows' slots as
an argument, so a row need not be a batch row (a speculative step lays S + 1 positions of a
request over S + 1 rows).

`Stages` is one sampler's set of them, on one `BatchState`; the pipelines
(`graphsafe_sampler.pipelines`) run them in the order of docs/design.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.processors.base import LogitsProcessor, SlotLogitsProcessor
from graphsafe_sampler.processors.loading import build_logits_processors, load_logits_processors
from graphsafe_sampler.stages.allowed_token_ids import AllowedTokenIdsLogitsProcessor
from graphsafe_sampler.stages.bad_words import BadWordsState
from graphsafe_sampler.stages.grammar import GrammarBitmask
from graphsafe_sampler.stages.logit_bias import LogitBiasLogitsProcessor
from graphsafe_sampler.stages.logprob_token_ids import LogprobTokenIdsState
from graphsafe_sampler.stages.min_p import MinPLogitsProcessor
from graphsafe_sampler.stages.min_tokens import MinTokensLogitsProcessor
from graphsafe_sampler.stages.penalties import PenaltyState
from graphsafe_sampler.stages.sampling import SamplingState
from graphsafe_sampler.stages.temperature import TemperatureState
from graphsafe_sampler.stages.thinking_budget import ThinkingBudgetState
from graphsafe_sampler.stages.top_k_top_p import TopKTopPState
from graphsafe_sampler.stages.watermark import WatermarkState

BUILTIN_LOGITS_PROCESSORS: tuple[type[SlotLogitsProcessor], ...] = (
    AllowedTokenIdsLogitsProcessor,
    MinTokensLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
)
"""The stages that are also vLLM-shaped logits processors (usable alone)."""


@dataclass(frozen=True)
class Stages:
    """One sampler's stages on `batch_state`, in pipeline order; `custom` holds the
    configured logits processors in their configured order."""

    batch_state: BatchState
    bad_words: BadWordsState
    logit_bias: LogitBiasLogitsProcessor
    min_tokens: MinTokensLogitsProcessor
    allowed: AllowedTokenIdsLogitsProcessor
    grammar: GrammarBitmask
    thinking_budget: ThinkingBudgetState | None
    custom: tuple[LogitsProcessor, ...]
    penalties: PenaltyState
    temperature: TemperatureState
    min_p: MinPLogitsProcessor
    top_k_top_p: TopKTopPState
    sampling: SamplingState
    logprob_token_ids: LogprobTokenIdsState | None
    watermark: WatermarkState | None

    @classmethod
    def build(cls, config: SamplerConfig, batch_state: BatchState) -> Stages:
        """Every stage on `batch_state` (registration order is add order), then the custom
        processors of `config.logits_processors`, slot processors sharing the state."""
        device, pin = batch_state.device, batch_state.pin_memory
        allowed = AllowedTokenIdsLogitsProcessor(config, device, pin, batch_state=batch_state)
        bad_words = BadWordsState(config, batch_state)
        grammar = GrammarBitmask(config, batch_state)
        thinking_budget = ThinkingBudgetState(config, batch_state) if config.has_reasoning else None
        min_tokens = MinTokensLogitsProcessor(config, device, pin, batch_state=batch_state)
        logit_bias = LogitBiasLogitsProcessor(config, device, pin, batch_state=batch_state)
        penalties = PenaltyState(config, batch_state)
        temperature = TemperatureState(batch_state)
        top_k_top_p = TopKTopPState(batch_state)
        sampling = SamplingState(config, batch_state)
        min_p = MinPLogitsProcessor(config, device, pin, batch_state=batch_state)
        logprob_token_ids = None
        if config.max_logprob_token_ids:
            logprob_token_ids = LogprobTokenIdsState(config, batch_state)
        watermark = None
        if config.watermark_context_len:
            watermark = WatermarkState(config, batch_state)
        classes = load_logits_processors(config.logits_processors)
        custom = build_logits_processors(classes, config, device, pin, batch_state)
        return cls(
            batch_state=batch_state,
            bad_words=bad_words,
            logit_bias=logit_bias,
            min_tokens=min_tokens,
            allowed=allowed,
            grammar=grammar,
            thinking_budget=thinking_budget,
            custom=tuple(custom),
            penalties=penalties,
            temperature=temperature,
            min_p=min_p,
            top_k_top_p=top_k_top_p,
            sampling=sampling,
            logprob_token_ids=logprob_token_ids,
            watermark=watermark,
        )

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor kept across steps, by name (the graph-safety harness checks them)."""
        out = dict(self.batch_state.state_tensors())
        parts: dict[str, object] = {
            "allowed": self.allowed,
            "bad_words": self.bad_words,
            "min_tokens": self.min_tokens,
            "logit_bias": self.logit_bias,
            "penalties": self.penalties,
            "temperature": self.temperature,
            "top_k_top_p": self.top_k_top_p,
            "sampling": self.sampling,
            "min_p": self.min_p,
        }
        if self.logprob_token_ids is not None:
            parts["logprob_token_ids"] = self.logprob_token_ids
        if self.thinking_budget is not None:
            parts["thinking_budget"] = self.thinking_budget
        if self.watermark is not None:
            parts["watermark"] = self.watermark
        for i, proc in enumerate(self.custom):
            parts[f"custom{i}"] = proc
        for prefix, part in parts.items():
            for name, tensor in part.state_tensors().items():  # type: ignore[attr-defined]
                if not name.startswith("batch_state."):
                    out[f"{prefix}.{name}"] = tensor
        return out


__all__ = [
    "BUILTIN_LOGITS_PROCESSORS",
    "AllowedTokenIdsLogitsProcessor",
    "BadWordsState",
    "GrammarBitmask",
    "LogitBiasLogitsProcessor",
    "LogprobTokenIdsState",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "PenaltyState",
    "SamplingState",
    "Stages",
    "TemperatureState",
    "ThinkingBudgetState",
    "TopKTopPState",
    "WatermarkState",
]
