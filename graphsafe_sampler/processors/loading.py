"""Loading custom processors as vLLM does: classes, "module:QualName" strings, entry points.

Entry points of the group `graphsafe_sampler.logits_processors` are loaded for every
sampler; a plugin that fails to import raises RuntimeError (never skipped silently).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.processors.base import LogitsProcessor, SlotLogitsProcessor

ENTRY_POINT_GROUP = "graphsafe_sampler.logits_processors"


def _check_class(obj: object, name: str) -> type[LogitsProcessor]:
    if not (isinstance(obj, type) and issubclass(obj, LogitsProcessor)):
        raise TypeError(f"{name} is not a LogitsProcessor subclass (got {obj!r})")
    return obj


def resolve_qualname(spec: str) -> type[LogitsProcessor]:
    """ "package.module:Qual.Name" -> the class it names."""
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(
            f"logits processor {spec!r} must be a fully-qualified 'package.module:QualName'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"logits processor {spec!r}: cannot import {module_name!r}") from exc
    obj: object = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(
                f"logits processor {spec!r}: {module_name!r} has no attribute {qualname!r}"
            ) from None
    return _check_class(obj, f"logits processor {spec!r}")


def entry_point_processors() -> list[type[LogitsProcessor]]:
    """Every class registered under the entry-point group, in name order."""
    classes = []
    eps = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    for ep in eps:
        try:
            obj = ep.load()
        except Exception as exc:
            raise RuntimeError(
                f"logits processor plugin {ep.name!r} ({ep.value}) failed to load: {exc}"
            ) from exc
        classes.append(_check_class(obj, f"logits processor plugin {ep.name!r} ({ep.value})"))
    return classes


def load_logits_processors(
    specs: Iterable[type[LogitsProcessor] | str], *, entry_points: bool = True
) -> list[type[LogitsProcessor]]:
    """Resolve `specs` (classes or "module:QualName" strings) plus, if `entry_points`, the
    installed plugins; duplicates are kept once, in first-seen order."""
    classes: list[type[LogitsProcessor]] = []
    for spec in specs:
        if isinstance(spec, str):
            classes.append(resolve_qualname(spec))
        else:
            classes.append(_check_class(spec, f"logits processor {spec!r}"))
    if entry_points:
        classes.extend(entry_point_processors())
    seen: set[type[LogitsProcessor]] = set()
    unique = []
    for cls in classes:
        if cls not in seen:
            seen.add(cls)
            unique.append(cls)
    return unique


def build_logits_processors(
    classes: Iterable[type[LogitsProcessor]],
    config: SamplerConfig,
    device: torch.device,
    is_pin_memory: bool,
    batch_state: BatchState,
) -> list[LogitsProcessor]:
    """Instantiate `classes`; slot processors share `batch_state`, others get vLLM's args."""
    processors: list[LogitsProcessor] = []
    for cls in classes:
        if issubclass(cls, SlotLogitsProcessor):
            processors.append(cls(config, device, is_pin_memory, batch_state=batch_state))
        else:
            processors.append(cls(config, device, is_pin_memory))
    return processors
