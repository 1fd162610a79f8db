"""Logits processors: the vLLM-shaped base classes, the adapter for request-level callables,
and plugin loading. The built-in processors are stages (`graphsafe_sampler.stages`)."""

from graphsafe_sampler.processors.adapter import AdapterLogitsProcessor
from graphsafe_sampler.processors.base import LogitsProcessor, SlotLogitsProcessor
from graphsafe_sampler.processors.loading import (
    ENTRY_POINT_GROUP,
    build_logits_processors,
    load_logits_processors,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "AdapterLogitsProcessor",
    "LogitsProcessor",
    "SlotLogitsProcessor",
    "build_logits_processors",
    "load_logits_processors",
]
