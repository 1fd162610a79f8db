"""The access table's record of one launch (`Work`) and how it names a kernel's loops and
branches: by the (file, line) of their source, found in the @triton.jit function's text."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

from .sass import TILE_LOOP


@dataclass
class Work:
    """Per program (one row each): the rows of each tensor argument it reads and writes, and
    the walks over its row's tiles each tile loop makes, keyed by (file, line)."""

    reads: dict[str, torch.Tensor] = field(default_factory=dict)
    writes: dict[str, torch.Tensor] = field(default_factory=dict)
    walks: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    # the fraction of a tile loop's iterations in which the `if` at (file, line) runs its
    # block (unnamed branches: always, the static upper bound); an `if` no row takes (0)
    # is also left out of the straight-line path outside the tile loops (cost_model.chain)
    taken: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    # the iterations the slowest program of a row makes of a loop that is not a tile loop
    # but runs many times (sampling's race over the lists): charged as a tile loop is,
    # where the straight-line path (cost_model.chain) would count it once
    trips: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    # per row, the share of its programs that stop once their first loads are in, issuing
    # next to nothing (a covered row's other sampling programs): they leave the SM's issue
    # to the others (machine.launch_time's `issuing`); None: none do
    idle: torch.Tensor | None = None
    # per row, the share of its issuing programs that run the `if` at (file, line): the
    # merge of a split row's partials by its last program to arrive (`last_to_arrive`),
    # which runs once the row's other programs are done. The other programs' path leaves
    # the block out (machine.launch_time's `merging`); a share of 1, no such block
    merging: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)

    def issuing(self, programs: int) -> float | None:
        """The launch's programs that issue, `programs` over the rows less each row's idle
        share (None: all of them)."""
        if self.idle is None:
            return None
        return float((1.0 - self.idle).sum()) * programs / max(1, self.idle.shape[0])


@cache
def source_line(function: Any, statement: str, before: str | None = None) -> tuple[str, int]:
    """(file name, line) of the one line of a @triton.jit function that starts with
    `statement` (stripped); with `before`, of the last such line above the one that starts
    with `before`."""
    lines, start = inspect.getsourcelines(function.fn)
    found = [start + i for i, text in enumerate(lines) if text.strip().startswith(statement)]
    if before is not None:
        below = source_line(function, before)[1]
        found = [line for line in found if line < below][-1:]
    if len(found) != 1:
        raise ValueError(f"{statement!r} is on lines {found} of {function.fn.__name__}")
    return os.path.basename(inspect.getsourcefile(function.fn) or ""), found[0]


@cache
def tile_loop(function: Any, index: int) -> tuple[str, int]:
    """(file name, line) of the index-th tile loop in a @triton.jit function's source."""
    lines, start = inspect.getsourcelines(function.fn)
    found = [start + i for i, text in enumerate(lines) if TILE_LOOP.search(text)]
    return os.path.basename(inspect.getsourcefile(function.fn) or ""), found[index]


def fraction(mask: torch.Tensor) -> torch.Tensor:
    return mask.to(torch.float64)


def walks_past_first(ids: torch.Tensor, block: int) -> torch.Tensor:
    """Per row of a sparse table [rows, C] (used ids first, unique, the rest repeating the
    first): 1.0 where its walk goes past the first block (`sparse_phases.apply_bias` and
    `ban_stop_ids`),
    i.e. the table is wider and the first block holds no repeat of its first id."""
    repeat = (ids[:, 1:block] == ids[:, :1]).any(1)
    return fraction(~repeat & (ids.shape[1] > block))
