"""Structured output: the per-step grammar bitmask (xgrammar's format), staged by batch row.

The engine stages the bitmask rows of the requests that have a grammar before each step
(`Sampler.stage_grammar_bitmask`); every other row is all-ones (unconstrained). The mask
belongs to the request at its row: it moves with the request on swaps and condensing moves,
and is cleared when the request leaves or another is added at its row. Otherwise it stays in
force until the next call (`None` clears every row).

Speculative decoding verifies several positions of a request in one step, and a grammar
allows different tokens at each (position j follows the drafts before it): a
`GrammarBitmask` made with `num_positions = P` keeps P mask rows per batch row,
`[max_num_reqs, P, ceil(V/32)]`, and masks logits laid out as `[num_rows * P, V]` (row
r * P + j is batch row r, position j).

A vocabulary shard (`VocabShard`) takes the engine's whole-vocabulary bitmask and keeps the
bits of its own ids (`shard_bitmask`), re-packed from its first id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.bitmask import num_words
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.vocab_shard import VocabShard

_ALL_ALLOWED = -1


def shard_bitmask(bitmask: np.ndarray, shard: VocabShard) -> np.ndarray:
    """[..., ceil(V/32)] int32 words over the whole vocabulary -> [..., ceil(size/32)] int32
    words of the shard's ids, local id i at bit i % 32 of word i // 32 (host side).

    Word i of the shard is the whole mask's bits start + 32 i ..: the low bits of one word
    shifted down and the high bits of the next shifted up (bits past the shard's end are
    left as they come: the unpacker reads `size` bits only)."""
    words = num_words(shard.size)
    first, offset = divmod(shard.start, 32)
    whole = bitmask.view(np.uint32)[..., first : first + words + 1]
    if offset == 0:
        return np.ascontiguousarray(whole[..., :words]).view(np.int32)
    if whole.shape[-1] < words + 1:  # the shard ends in the last word
        pad = [(0, 0)] * (whole.ndim - 1) + [(0, words + 1 - whole.shape[-1])]
        whole = np.pad(whole, pad)
    low = whole[..., :words] >> np.uint32(offset)
    high = whole[..., 1:] << np.uint32(32 - offset)  # uint32: the bits past 32 drop
    return (low | high).view(np.int32)


def _check_rows(rows: object) -> list[int]:
    """Batch rows as ints; int(0.7) would silently be row 0."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, (Sequence, np.ndarray)):
        raise TypeError(
            f"grammar bitmask rows must be a sequence of ints, got {type(rows).__name__}"
        )
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)):
            raise TypeError(f"grammar bitmask rows[{i}] must be an int, got {row!r}")
        out.append(int(row))
    return out


class GrammarBitmask:
    """bitmask: staged [max_num_reqs, ceil(V/32)] int32, row-indexed (bit set = allowed);
    [max_num_reqs, P, ceil(V/32)] with `num_positions = P > 1`.

    `name` prefixes the row tables (a BatchState holds each name once).
    """

    def __init__(
        self,
        config: SamplerConfig,
        batch_state: BatchState,
        *,
        num_positions: int = 1,
        name: str = "grammar",
    ) -> None:
        if isinstance(num_positions, bool) or not isinstance(num_positions, int):
            raise TypeError(f"num_positions must be an int, got {type(num_positions).__name__}")
        if num_positions < 1:
            raise ValueError(f"num_positions must be >= 1, got {num_positions}")
        self.config = config
        self.shard = batch_state.shard
        self.words = num_words(self.shard.size)  # of the shard's ids, as held
        self.num_positions = num_positions
        # A row's mask shape, as staged (over the whole vocabulary): [W], or [P, W] per
        # position.
        staged_words = num_words(config.vocab_size)
        self.row_shape = (staged_words,) if num_positions == 1 else (num_positions, staged_words)
        held_shape = (self.words,) if num_positions == 1 else (num_positions, self.words)
        # Row tables: the batch state clears them on removes and adds and moves them with
        # their requests. `active` marks constrained rows (host bookkeeping for `stage`).
        self.bitmask = batch_state.row_staged(
            f"{name}_bitmask", held_shape, torch.int32, fill=_ALL_ALLOWED
        )
        self.active = batch_state.row_staged(f"{name}_active", (), torch.bool, fill=False)
        self.unpacker = batch_state.bitmask_unpacker

    def stage(
        self, bitmask: torch.Tensor | np.ndarray | None, rows: Sequence[int] | None = None
    ) -> None:
        """bitmask: [len(rows), ceil(V/32)] int32 (with P positions [len(rows), P,
        ceil(V/32)]) for batch `rows` (default 0..n-1), or None to clear. Validated whole
        before anything is written."""
        if bitmask is None:
            new_rows: list[int] = []
            values = np.zeros((0, self.words), dtype=np.int32)
        else:
            if isinstance(bitmask, torch.Tensor):
                if bitmask.device.type != "cpu":
                    raise ValueError("the grammar bitmask must be a host tensor (it is staged)")
                bitmask = bitmask.numpy()
            values = np.asarray(bitmask)
            if values.dtype != np.int32:
                raise TypeError(f"grammar bitmask must be int32, got {values.dtype}")
            if values.shape[1:] != self.row_shape:
                shape = ", ".join(str(n) for n in ("rows", *self.row_shape))
                raise ValueError(
                    f"grammar bitmask must have shape [{shape}], got {tuple(values.shape)}"
                )
            new_rows = list(range(values.shape[0])) if rows is None else _check_rows(rows)
            if len(new_rows) != values.shape[0]:
                raise ValueError(
                    f"grammar bitmask has {values.shape[0]} rows for {len(new_rows)} batch rows"
                )
            for r in new_rows:
                if not 0 <= r < self.config.max_num_reqs:
                    raise ValueError(
                        f"grammar bitmask row {r} is outside [0, {self.config.max_num_reqs})"
                    )
            if len(set(new_rows)) != len(new_rows):
                raise ValueError(f"grammar bitmask rows repeat a row: {new_rows}")
        stale = sorted(set(np.flatnonzero(self.active.np).tolist()) - set(new_rows))
        if stale:
            self.bitmask.fill_rows(stale, _ALL_ALLOWED)
            self.active.fill_rows(stale, False)
        if new_rows:
            if not self.shard.is_whole:
                values = shard_bitmask(values, self.shard)
            self.bitmask.np[new_rows] = values
            self.bitmask.mark_dirty(new_rows)
            self.active.fill_rows(new_rows, True)
        self.bitmask.flush()
        self.active.flush()

    def bitmask_rows(self, num_logits_rows: int) -> torch.Tensor:
        """[num_logits_rows, ceil(V/32)] int32, a view of the device table: the mask of each
        logits row of a step laid out as [num_rows * P, V] (row r * P + j = batch row r at
        position j)."""
        num_rows = num_logits_rows // self.num_positions
        return self.bitmask.device[:num_rows].reshape(num_logits_rows, self.words)

    def apply(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, updated in place
        bitmask: torch.Tensor,  # [num_rows, ceil(V/32)] int32, e.g. `bitmask_rows(num_rows)`
    ) -> torch.Tensor:
        """Tokens whose bit is clear become -inf."""
        return logits.masked_fill_(~self.mask(bitmask), float("-inf"))

    def mask(self, bitmask: torch.Tensor) -> torch.Tensor:
        """[num_rows, V] bool: the tokens `bitmask` [num_rows, ceil(V/32)] allows."""
        return self.unpacker.unpack(bitmask)
