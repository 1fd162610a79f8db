"""`SlotTables`: the plumbing every slot state shares (a `SlotState` for `BatchState`).

A slot state keeps its per-request tables as StagedTensors of shape `[num_slots, ...]` on
the shared BatchState, writes a request's rows in `add_request`, and has them flushed with
the batch. Subclasses call `staged(...)` for staged tables and `device_only(...)` for
tables the device alone writes (e.g. penalty counts), and override `add_request`, and
`commit` where the device advances per-request history.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.staging import StagedTensor


class SlotTables:
    """Staged slot-indexed tables on a BatchState, flushed and reported together."""

    def __init__(self, batch_state: BatchState) -> None:
        self.batch_state = batch_state
        self._tables: list[StagedTensor] = []
        self._device_tables: dict[str, torch.Tensor] = {}

    def staged(
        self,
        name: str,
        row_shape: Sequence[int],
        dtype: torch.dtype,
        *,
        fill: float | int = 0,
    ) -> StagedTensor:
        """A staged table `[num_slots, *row_shape]`, flushed with the batch state."""
        num_slots = self.batch_state.config.num_slots
        table = self.batch_state.staged(name, (num_slots, *row_shape), dtype, fill=fill)
        self._tables.append(table)
        return table

    def device_only(self, name: str, row_shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A zeroed device table `[num_slots, *row_shape]` that only the device writes."""
        num_slots = self.batch_state.config.num_slots
        table = torch.zeros((num_slots, *row_shape), dtype=dtype, device=self.batch_state.device)
        self._device_tables[name] = table
        return table

    def validate_request(self, params: SamplingParams) -> None:
        """Raise for a request these tables cannot hold; most states accept everything."""
        return None

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        for table in self._tables:
            table.flush()

    def commit(self, slots: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor) -> None:
        """Graph-safe hook run when rows commit tokens; most states need none."""
        return None

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = dict(self._device_tables)
        for table in self._tables:
            out[f"{table.name}.host"] = table.host
            out[f"{table.name}.device"] = table.device
        return out
