"""Logits processors: the vLLM-shaped base classes, the built-ins and plugin loading."""

from graphsafe_sampler.processors.adapter import AdapterLogitsProcessor
from graphsafe_sampler.processors.allowed_token_ids import AllowedTokenIdsLogitsProcessor
from graphsafe_sampler.processors.base import LogitsProcessor, SlotLogitsProcessor
from graphsafe_sampler.processors.loading import (
    ENTRY_POINT_GROUP,
    build_logits_processors,
    load_logits_processors,
)
from graphsafe_sampler.processors.logit_bias import LogitBiasLogitsProcessor
from graphsafe_sampler.processors.min_p import MinPLogitsProcessor
from graphsafe_sampler.processors.min_tokens import MinTokensLogitsProcessor

BUILTIN_LOGITS_PROCESSORS: tuple[type[SlotLogitsProcessor], ...] = (
    AllowedTokenIdsLogitsProcessor,
    MinTokensLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
)

__all__ = [
    "BUILTIN_LOGITS_PROCESSORS",
    "ENTRY_POINT_GROUP",
    "AdapterLogitsProcessor",
    "AllowedTokenIdsLogitsProcessor",
    "LogitBiasLogitsProcessor",
    "LogitsProcessor",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "SlotLogitsProcessor",
    "build_logits_processors",
    "load_logits_processors",
]
