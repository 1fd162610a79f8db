"""`AdapterLogitsProcessor`: request-level callables behind the batch-level interface.

This is the escape hatch for existing per-request processors (vLLM's
`AdapterLogitsProcessor`): `new_req_logits_processor(params)` returns a callable
`(output_ids, logits_row) -> logits_row` or `(prompt_ids, output_ids, logits_row) ->
logits_row`, or None for requests it does not touch.

It is not graph-safe, and says so (`graph_safe = False`): `apply` loops over requests in
Python and reads each request's live, host-side output list. What that costs: a sampler
holding one runs its step eagerly (no CUDA graph, no `torch.compile(fullgraph=True)`), pays
a Python call and a kernel launch per affected row per step, and the engine must keep
`output_tok_ids` current on the host before each step. Port hot processors to
`SlotLogitsProcessor` instead.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from graphsafe_sampler.batch_update import BatchUpdate, MoveDirectionality
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.processors.base import LogitsProcessor

RequestLogitsProcessor = Callable[..., torch.Tensor]


class AdapterLogitsProcessor(LogitsProcessor):
    """Wraps request-level callables; `graph_safe = False` (see the module docstring)."""

    graph_safe: ClassVar[bool] = False

    def __init__(self, config, device, is_pin_memory) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config, device, is_pin_memory)
        # row -> (callable, takes prompt ids?, prompt ids, live output ids)
        self._requests: dict[
            int, tuple[RequestLogitsProcessor, bool, Sequence[int], Sequence[int]]
        ] = {}
        # (the update validate_update last saw, its callables and whether each takes
        # prompt ids), consumed by the next update_state of that same update
        self._validated: (
            tuple[BatchUpdate, list[tuple[RequestLogitsProcessor, bool] | None]] | None
        ) = None

    @abc.abstractmethod
    def new_req_logits_processor(self, params: SamplingParams) -> RequestLogitsProcessor | None:
        """The callable for one request, or None if this processor leaves it alone."""

    def validate_update(self, batch_update: BatchUpdate) -> None:
        """Build (and check) every added request's callable before anything changes; the
        following `update_state` of the same update uses them."""
        made = []
        for _row, params, _prompt, _output in batch_update.added:
            type(self).validate_params(params)
            fn = self.new_req_logits_processor(params)
            made.append(None if fn is None else (fn, _num_positional_params(fn) == 3))
        self._validated = (batch_update, made)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        if self._validated is None or self._validated[0] is not batch_update:
            self.validate_update(batch_update)
        assert self._validated is not None  # set by validate_update
        made = self._validated[1]
        self._validated = None
        for row in batch_update.removed:
            self._requests.pop(row, None)
        for (row, _params, prompt, output), entry in zip(batch_update.added, made, strict=True):
            if entry is None:
                self._requests.pop(row, None)
            else:
                self._requests[row] = (entry[0], entry[1], prompt or (), output)
        for a, b, direction in batch_update.moved:
            entry_a = self._requests.pop(a, None)
            entry_b = self._requests.pop(b, None)
            if entry_a is not None:
                self._requests[b] = entry_a
            if direction is MoveDirectionality.SWAP and entry_b is not None:
                self._requests[a] = entry_b

    def is_argmax_invariant(self) -> bool:
        return False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (fn, takes_prompt, prompt, output) in self._requests.items():
            if row >= logits.shape[0]:
                continue
            if takes_prompt:
                logits[row] = fn(prompt, output, logits[row])
            else:
                logits[row] = fn(output, logits[row])
        return logits


def _num_positional_params(fn: Callable[..., object]) -> int:
    params = inspect.signature(fn).parameters.values()
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) not in (2, 3):
        raise TypeError(
            "a request-level logits processor takes (output_ids, logits_row) or "
            f"(prompt_ids, output_ids, logits_row), got {len(positional)} parameters"
        )
    return len(positional)
