"""`LogitsProcessor` (vLLM's shape) and `SlotLogitsProcessor` (its graph-safe form).

The graph-safety contract for `apply` (docs/design.md §5), which `graphsafe_sampler.testing`
checks:

1. no host synchronisation and no data-dependent shapes: no `.item()`, `.tolist()`,
   `.cpu()`, `nonzero`, boolean-mask indexing, `torch.unique`, `torch.multinomial`;
2. no Python branch on tensor values or on per-request host state (`if not self.reqs:`):
   a captured graph keeps the branch taken at capture time forever;
3. every tensor read across steps keeps its address: `update_state` writes state in place
   (`StagedTensor.flush`, `copy_`), never rebinds an attribute to a new tensor;
4. `apply` reads state for `logits.shape[0]` rows and must give padded rows (beyond the
   batch) some finite-or-masked values without touching request state.

Branches on things fixed for the life of the processor (the config, the vocabulary size,
the logits shape) are fine: a graph is captured per shape anyway.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from graphsafe_sampler.batch_update import BatchUpdate, refused_request
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables
from graphsafe_sampler.staging import StagedTensor

if TYPE_CHECKING:
    from graphsafe_sampler.batch_state import BatchState


class LogitsProcessor(abc.ABC):
    """A batch-level logits processor with vLLM's interface.

    graph_safe: whether `apply` meets the contract above. The sampler and the harness read
        it; a processor that sets it False keeps the whole step out of graph capture.
    """

    graph_safe: ClassVar[bool] = True

    @classmethod
    def example_extra_args(cls, rng: random.Random, config: SamplerConfig) -> dict[str, Any] | None:
        """Random `SamplingParams.extra_args` entries this processor reads, for one request.

        `graphsafe_sampler.testing.check_graph_safety` drives the processor through them
        (a captured graph must serve every value a request may send), and fails a processor
        that reads an `extra_args` key this never sets. Return a fresh dict each call, or
        None for a request that leaves the processor off; draw only from `rng`.
        """
        return None

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """Raise ValueError for a request this processor cannot serve (before any change)."""
        return None

    def validate_update(self, batch_update: BatchUpdate) -> None:
        """Raise if `batch_update` cannot be applied here; runs before anything changes.

        The default checks every added request with `validate_params`. Override it for
        checks that need the instance (and cache what you computed for `update_state`).
        """
        for i, (row, params, _prompt, _output) in enumerate(batch_update.added):
            try:
                type(self).validate_params(params)
            except (ValueError, TypeError) as exc:
                raise refused_request(exc, i, row) from exc

    def __init__(self, config: SamplerConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.config = config
        self.device = torch.device(device)
        self.is_pin_memory = is_pin_memory

    @abc.abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [num_rows, vocab_size] float32, row i = batch row i. Returns the result
        (in place where possible)."""

    def apply_slots(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """`apply` on rows that read their request's state from `slots` ([num_rows] int64):
        row i need not be batch row i (a speculative step lays a request's S + 1 positions
        over S + 1 rows). The pipelines call this. The default is `apply`, right only
        where row i is batch row i; `SlotLogitsProcessor`s override it."""
        return self.apply(logits)

    @property
    def reads_rows_by_slot(self) -> bool:
        """Whether `apply_slots` reads the rows' state from its `slots` argument (any row
        layout) rather than by batch row."""
        return type(self).apply_slots is not LogitsProcessor.apply_slots

    @abc.abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if `apply` never changes which token is the argmax (then greedy rows skip it)."""

    @abc.abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Apply one step's batch changes (host work and H2D copies only)."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor kept across steps, by attribute path (the harness checks addresses).

        The default walks the instance's attributes: tensors, StagedTensors (both sides) and
        a BatchState's tensors. Override it if state lives elsewhere.
        """
        return dict(_walk_state(self, prefix=""))


def _walk_state(obj: object, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    from graphsafe_sampler.batch_state import BatchState

    for name, value in vars(obj).items():
        path = f"{prefix}{name}"
        if isinstance(value, torch.Tensor):
            yield path, value
        elif isinstance(value, StagedTensor):
            yield f"{path}.host", value.host
            yield f"{path}.device", value.device
        elif isinstance(value, BatchState):
            for key, tensor in value.state_tensors().items():
                yield f"{path}.{key}", tensor


class SlotLogitsProcessor(LogitsProcessor, SlotTables):
    """A processor whose per-request state lives in slots of a shared `BatchState`.

    Subclasses allocate their tables in `init_tables` with `self.staged(name, row_shape,
    dtype, fill=neutral)` (shape `[config.num_slots, *row_shape]`; the padding slot keeps
    the neutral value), write a new request's row in `add_request` and implement
    `apply_slots(logits, slots)`, reading each row's state at `slots[row]`. Moves in the
    batch then cost nothing here. `apply(logits)` is `apply_slots` on the batch rows' slots.

    Inside a Sampler the processor shares the Sampler's BatchState (passed as
    `batch_state=`), which calls `add_request`/`flush`/`commit`; used alone it owns one and
    its `update_state` drives it.
    """

    def __init__(
        self,
        config: SamplerConfig,
        device: torch.device,
        is_pin_memory: bool,
        *,
        batch_state: BatchState | None = None,
    ) -> None:
        from graphsafe_sampler.batch_state import BatchState

        LogitsProcessor.__init__(self, config, device, is_pin_memory)
        self._owns_batch_state = batch_state is None
        if batch_state is None:
            batch_state = BatchState(config, self.device, pin_memory=is_pin_memory)
        SlotTables.__init__(self, batch_state)
        if type(self).apply is SlotLogitsProcessor.apply and not self.reads_rows_by_slot:
            # each default calls the other
            raise TypeError(f"{type(self).__name__} must implement apply_slots(logits, slots)")
        self.init_tables()
        batch_state.register(self)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`apply_slots` on the slots of batch rows 0..num_rows-1. (A processor that
        overrides `apply` instead reads batch rows and cannot serve a speculative step.)"""
        return self.apply_slots(logits, self.batch_state.slots(logits.shape[0]))

    def init_tables(self) -> None:
        """Allocate this processor's tables with `self.staged(...)` (called once)."""
        return None

    def validate_request(self, params: SamplingParams) -> None:
        type(self).validate_params(params)

    @abc.abstractmethod
    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        """Host-side: write the request's parameters into row `slot` of each table."""

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self._owns_batch_state:
            self.batch_state.update(batch_update)
        # A shared BatchState was already updated by its owner, which called add_request.
