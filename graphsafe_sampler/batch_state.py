"""`BatchState`: the persistent batch, as fixed-capacity slots behind a row -> slot map.

A request lives in one *slot* from its add to its removal; slots never move. The engine's
batch rows (vLLM's persistent-batch indices) map to slots through `row_to_slot`, a staged
`[max_num_reqs]` int32 tensor: moving or swapping requests rewrites a few entries of that
map, never a device row of request state. Empty and padded rows map to `padding_slot`, whose
parameters are neutral, so they change no logits and touch no request's history.

`update(batch_update)` validates the whole update on the host first, then applies it (vLLM
order: removed, added, moved), hands each added request's slot to the registered slot
states (`SlotState`), and flushes every staged tensor. `commit(...)` is graph-safe: it
advances the device-side history of the rows the engine keeps.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from graphsafe_sampler.batch_update import BatchUpdate, MoveDirectionality, refused_request
from graphsafe_sampler.bitmask import BitmaskUnpacker
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.staging import StagedTensor, pin_memory_available
from graphsafe_sampler.vocab_shard import VocabShard

# write_added(table, row, params, prompt_tok_ids, output_tok_ids): fill an added row.
WriteAdded = Callable[
    [StagedTensor, int, SamplingParams, "Sequence[int] | None", "Sequence[int]"], None
]


class SlotState(Protocol):
    """Per-request state kept in slots (built-in processors, penalties, RNG, histories).

    validate_request: raise ValueError/TypeError for a request this state cannot hold; runs
        for every added request before anything changes.
    add_request: host-side writes for the request that now owns `slot`.
    flush: send the host writes to the device (H2D only).
    commit: graph-safe; `slots` [num_rows] int64 and `token_ids` [num_rows] int64 are the
        rows' slots and committed tokens, `keep` [num_rows] bool says which rows commit.
    """

    def validate_request(self, params: SamplingParams) -> None: ...

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None: ...

    def flush(self) -> None: ...

    def commit(self, slots: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor) -> None: ...


def _check_row(what: str, row: object, limit: int) -> int:
    if isinstance(row, bool) or not isinstance(row, (int, np.integer)):
        raise TypeError(f"{what} must be an int row index, got {type(row).__name__}")
    if not 0 <= row < limit:
        raise ValueError(f"{what} = {row} is outside the batch rows [0, {limit})")
    return int(row)


def _check_tok_ids(what: str, ids: object, vocab_size: int) -> None:
    if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of token ids, got {type(ids).__name__}")
    if len(ids) == 0:
        return
    arr = np.asarray(ids)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{what} must be a flat sequence of int token ids")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} holds token id {bad}, outside the vocabulary [0, {vocab_size})")


class BatchState:
    """Row -> slot map, slot allocation and the device-side generation history.

    row_to_slot: staged [max_num_reqs] int64 (the kernels' and gathers' index type, so
        `slots` is a view); `padding_slot` for empty rows.
    num_generated: staged [num_slots] int32; tokens generated so far per slot (set from
        len(output_tok_ids) at add time, advanced on the device by `commit`).
    prompt_len: staged [num_slots] int64; the prompt's length per slot, so that a row's
        token position is prompt_len + num_generated on the device (`positions`).
    shard: the token ids whose logits and token-indexed state this state holds (the whole
        vocabulary, unless a tensor-parallel rank holds a part: `VocabShard`). Token ids in
        updates and commits are always global.
    """

    def __init__(
        self,
        config: SamplerConfig,
        device: torch.device | str,
        *,
        pin_memory: bool | None = None,
        shard: VocabShard | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.shard = VocabShard.whole(config.vocab_size) if shard is None else shard
        if self.shard.vocab_size != config.vocab_size:
            raise ValueError(
                f"the shard is of a vocabulary of {self.shard.vocab_size}, "
                f"the config's is {config.vocab_size}"
            )
        if pin_memory is None:
            pin_memory = config.pin_memory
        if pin_memory is None:
            pin_memory = self.device.type == "cuda" and pin_memory_available()
        self.pin_memory = pin_memory
        self.max_num_reqs = config.max_num_reqs
        self.padding_slot = config.padding_slot
        self.row_to_slot = self.staged(
            "row_to_slot", (config.max_num_reqs,), torch.int64, fill=self.padding_slot
        )
        self.num_generated = self.staged("num_generated", (config.num_slots,), torch.int32)
        self.prompt_len = self.staged("prompt_len", (config.num_slots,), torch.int64)
        # Lowest free slot first, so that a busy batch keeps its state compact.
        self._free_slots = list(range(config.max_num_reqs))
        heapq.heapify(self._free_slots)
        self._slot_states: list[SlotState] = []
        self._row_tables: list[tuple[StagedTensor, WriteAdded | None]] = []
        self._unpacker: BitmaskUnpacker | None = None
        self.batch_size = 0

    def staged(
        self,
        name: str,
        shape: Sequence[int],
        dtype: torch.dtype,
        *,
        fill: float | int = 0,
    ) -> StagedTensor:
        """A StagedTensor on this state's device with its pinning policy."""
        return StagedTensor(name, shape, dtype, self.device, fill=fill, pin_memory=self.pin_memory)

    @property
    def bitmask_unpacker(self) -> BitmaskUnpacker:
        """One shard-sized unpacker shared by every bitmask user of this state."""
        if self._unpacker is None:
            self._unpacker = BitmaskUnpacker(self.shard.size, self.device)
        return self._unpacker

    def row_staged(
        self,
        name: str,
        row_shape: Sequence[int],
        dtype: torch.dtype,
        *,
        fill: float | int = 0,
        write_added: WriteAdded | None = None,
    ) -> StagedTensor:
        """A row-indexed staged table `[max_num_reqs, *row_shape]` that follows the batch.

        For vLLM-style state kept by batch row: `update` resets removed rows to `fill`,
        resets an added row and calls `write_added(table, row, params, prompt_tok_ids,
        output_tok_ids)` (at the add, before the moves, as vLLM orders them), and moves
        and swaps rows as the requests move. A move costs a host row copy plus the H2D of
        the touched rows; state the device updates belongs in slots instead.
        """
        if self.num_requests:
            raise RuntimeError("register row tables before the first request is added")
        table = self.staged(name, (self.max_num_reqs, *row_shape), dtype, fill=fill)
        self._row_tables.append((table, write_added))
        return table

    def register(self, slot_state: SlotState) -> None:
        """Add a slot state; it sees every request added from now on."""
        if self.num_requests:
            raise RuntimeError("register slot states before the first request is added")
        self._slot_states.append(slot_state)

    @property
    def num_requests(self) -> int:
        return self.max_num_reqs - len(self._free_slots)

    def slot_of_row(self, row: int) -> int | None:
        """The slot of the request at `row` (host-side), or None for an empty row."""
        slot = int(self.row_to_slot.np[row])
        return None if slot == self.padding_slot else slot

    def validate(self, batch_update: BatchUpdate) -> None:
        """Raise if `batch_update` cannot be applied; changes nothing."""
        if not isinstance(batch_update, BatchUpdate):
            raise TypeError(f"expected a BatchUpdate, got {type(batch_update).__name__}")
        limit = self.max_num_reqs
        batch_size = batch_update.batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
        if not 0 <= batch_size <= limit:
            raise ValueError(f"batch_size = {batch_size} is outside [0, max_num_reqs = {limit}]")
        occupied = self.row_to_slot.np != self.padding_slot
        seen_removed: set[int] = set()
        for row in batch_update.removed:
            row = _check_row("removed row", row, limit)
            if row in seen_removed:
                raise ValueError(f"removed row {row} is listed twice")
            if not occupied[row]:
                raise ValueError(f"removed row {row} holds no request")
            seen_removed.add(row)
            occupied[row] = False
        for i, added in enumerate(batch_update.added):
            if not isinstance(added, tuple) or len(added) != 4:
                raise TypeError(f"added[{i}] must be (row, params, prompt_tok_ids, output_tok_ids)")
            row = _check_row(f"added[{i}] row", added[0], limit)
            try:
                self._validate_request(*added[1:])
            except (ValueError, TypeError) as exc:
                raise refused_request(exc, i, row) from exc
            occupied[row] = True
        for i, moved in enumerate(batch_update.moved):
            if not isinstance(moved, tuple) or len(moved) != 3:
                raise TypeError(f"moved[{i}] must be (a, b, MoveDirectionality)")
            a, b, direction = moved
            a = _check_row(f"moved[{i}] a", a, limit)
            b = _check_row(f"moved[{i}] b", b, limit)
            if not isinstance(direction, MoveDirectionality):
                raise TypeError(
                    f"moved[{i}] directionality must be a MoveDirectionality, "
                    f"got {type(direction).__name__}"
                )
            if direction is MoveDirectionality.SWAP:
                occupied[a], occupied[b] = occupied[b], occupied[a]
            elif a != b:
                occupied[b] = occupied[a]
                occupied[a] = False
        beyond = np.flatnonzero(occupied[batch_size:])
        if beyond.size:
            raise ValueError(
                f"row {batch_size + int(beyond[0])} holds a request but batch_size = {batch_size}"
            )

    def _validate_request(
        self, params: SamplingParams, prompt: Sequence[int] | None, output: Sequence[int]
    ) -> None:
        """Raise for one added request that this state cannot take."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        # Again at add time: the params' containers may have changed since construction.
        params.check()
        params.check_against(self.config)
        for slot_state in self._slot_states:
            slot_state.validate_request(params)
        vocab = self.config.vocab_size
        if prompt is not None:
            _check_tok_ids("prompt_tok_ids", prompt, vocab)
        _check_tok_ids("output_tok_ids", output, vocab)
        length = len(output) + (0 if prompt is None else len(prompt))
        if length > self.config.max_model_len:
            raise ValueError(
                f"{length} prompt and output tokens, more than max_model_len = "
                f"{self.config.max_model_len}"
            )

    def update(self, batch_update: BatchUpdate | None, *, validated: bool = False) -> None:
        """Validate (unless the caller just did), then apply `batch_update` (None = no
        change) and flush all staged state."""
        if batch_update is None:
            return
        if not validated:
            self.validate(batch_update)
        row_slot = self.row_to_slot
        pad = self.padding_slot
        for row in batch_update.removed:
            self._release(int(row_slot.np[row]))
            row_slot.write(row, pad)
            for table, _ in self._row_tables:
                table.fill_rows(row, table.fill)
        for row, params, prompt, output in batch_update.added:
            self._release(int(row_slot.np[row]))  # an add may replace the row's request
            slot = heapq.heappop(self._free_slots)
            row_slot.write(row, slot)
            self.num_generated.write(slot, len(output))
            self.prompt_len.write(slot, len(prompt or ()))
            for slot_state in self._slot_states:
                slot_state.add_request(slot, params, prompt, output)
            for table, write_added in self._row_tables:
                table.fill_rows(row, table.fill)
                if write_added is not None:
                    write_added(table, row, params, prompt, output)
        for a, b, direction in batch_update.moved:
            if a == b:  # a row swapped or moved onto itself: nothing to copy or flush
                continue
            if direction is MoveDirectionality.SWAP:
                for table in (row_slot, *(t for t, _ in self._row_tables)):
                    table.copy_rows([a, b], [b, a])
            else:
                self._release(int(row_slot.np[b]))
                for table in (row_slot, *(t for t, _ in self._row_tables)):
                    table.copy_rows([b], [a])
                    table.fill_rows(a, table.fill)
        self.batch_size = batch_update.batch_size
        self.flush()

    def _release(self, slot: int) -> None:
        if slot != self.padding_slot:
            heapq.heappush(self._free_slots, slot)

    def flush(self) -> None:
        self.row_to_slot.flush()
        self.num_generated.flush()
        self.prompt_len.flush()
        for table, _ in self._row_tables:
            table.flush()
        for slot_state in self._slot_states:
            slot_state.flush()

    def slots(self, num_rows: int) -> torch.Tensor:
        """[num_rows] int64 slot of batch rows 0..num_rows-1 (graph-safe: a view, no host
        read)."""
        if num_rows > self.max_num_reqs:
            raise ValueError(f"num_rows = {num_rows} exceeds max_num_reqs = {self.max_num_reqs}")
        return self.row_to_slot.device[:num_rows]

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """[num_rows] int64: the position of the token each row produces now (the tokens
        its request holds, prompt and committed outputs); graph-safe."""
        return self.prompt_len.device[slots] + self.num_generated.device[slots].long()

    @property
    def slot_states(self) -> tuple[SlotState, ...]:
        """The registered slot states, in registration (add) order."""
        return tuple(self._slot_states)

    def commit(self, token_ids: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Append one token per row to the device-side history (graph-safe).

        token_ids: [num_rows] integer, the token each row produced; an id outside [0, V)
            commits nothing.
        keep: [num_rows] bool or None; rows with False (e.g. a chunked-prefill step whose
            token the engine discards) commit nothing. Padded and empty rows never commit.
        """
        num_rows = token_ids.shape[0]
        slots = self.slots(num_rows)
        tokens = token_ids.long()
        # An id outside [0, V) (a bad value from the engine, which the host cannot see
        # without a sync) commits nothing, and a safe id stands in for it as an index.
        in_vocab = (tokens >= 0) & (tokens < self.config.vocab_size)
        tokens = torch.where(in_vocab, tokens, 0)
        commit = (slots != self.padding_slot) & in_vocab
        if keep is not None:
            commit = commit & keep
        # Slot states see num_generated before this token (e.g. as a ring-buffer position).
        for slot_state in self._slot_states:
            slot_state.commit(slots, tokens, commit)
        self.num_generated.device.index_add_(0, slots, commit.to(torch.int32))

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor this state keeps across steps, host and device sides, by name."""
        out = {}
        tables = (self.row_to_slot, self.num_generated, self.prompt_len)
        for staged in (*tables, *(t for t, _ in self._row_tables)):
            out[f"{staged.name}.host"] = staged.host
            out[f"{staged.name}.device"] = staged.device
        return out
