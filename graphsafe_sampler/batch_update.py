"""vLLM's persistent-batch update: `BatchUpdate`, `BatchUpdateBuilder`, `MoveDirectionality`.

An update is applied as removed, then added, then moved, in that order (vLLM V1). An added
index is the row at the time of the add; moves apply in list order; `None` means no change.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphsafe_sampler.params import SamplingParams

# (row, params, prompt token ids or None, live reference to the request's output token ids)
AddedRequest = tuple[int, SamplingParams, "Sequence[int] | None", "Sequence[int]"]
MovedRequest = tuple[int, int, "MoveDirectionality"]


def refused_request(exc: ValueError | TypeError, index: int, row: object) -> ValueError | TypeError:
    """`exc` (its kind and message) naming the added request it refuses, `added[index]`, so
    that the engine knows which request of an update to drop."""
    cls = TypeError if isinstance(exc, TypeError) else ValueError
    return cls(f"added[{index}] (row {row}): {exc}")


class MoveDirectionality(enum.Enum):
    # a -> b; row a is empty afterwards (vLLM's condense step).
    UNIDIRECTIONAL = enum.auto()
    # a <-> b.
    SWAP = enum.auto()


@dataclass(frozen=True)
class BatchUpdate:
    """Changes to the persistent batch since the last step.

    batch_size: number of rows after the update; rows >= batch_size are empty.
    removed: rows whose requests finished or were preempted.
    added: (row, params, prompt_tok_ids | None, output_tok_ids) per new request.
    moved: (a, b, directionality), applied in order after the adds.
    """

    batch_size: int
    removed: Sequence[int] = ()
    added: Sequence[AddedRequest] = ()
    moved: Sequence[MovedRequest] = ()


@dataclass
class BatchUpdateBuilder:
    """Collects one step's changes, as vLLM's builder does, then hands out a `BatchUpdate`.

    `removed_append` and `pop_removed` let the engine fill removed rows with new requests
    (vLLM's InputBatch does); `get_and_reset(batch_size)` returns None when nothing changed.
    """

    _removed: list[int] = field(default_factory=list)
    added: list[AddedRequest] = field(default_factory=list)
    moved: list[MovedRequest] = field(default_factory=list)
    _removed_sorted: bool = False

    @property
    def removed(self) -> list[int]:
        """Removed rows, highest first (vLLM's order); reading them closes `removed_append`."""
        self._sort_removed()
        return self._removed

    def _sort_removed(self) -> None:
        if not self._removed_sorted:
            # Descending, so that pop() hands out the lowest row first.
            self._removed.sort(reverse=True)
            self._removed_sorted = True

    def removed_append(self, index: int) -> None:
        if self._removed_sorted:
            raise RuntimeError(
                "cannot register a new removed row after removed, peek_removed() or "
                "pop_removed() was read in this step"
            )
        self._removed.append(index)

    def has_removed(self) -> bool:
        return bool(self._removed)

    def peek_removed(self) -> int | None:
        if not self._removed:
            return None
        self._sort_removed()
        return self._removed[-1]

    def pop_removed(self) -> int | None:
        if not self._removed:
            return None
        self._sort_removed()
        return self._removed.pop()

    def reset(self) -> bool:
        """Forget everything; returns whether anything had been recorded."""
        changed = bool(self._removed or self.added or self.moved)
        self._removed = []
        self._removed_sorted = False
        self.added = []
        self.moved = []
        return changed

    def get_and_reset(self, batch_size: int) -> BatchUpdate | None:
        if not (self._removed or self.added or self.moved):
            # Still reset: a pop_removed() that emptied the list left removed_append closed.
            self.reset()
            return None
        update = BatchUpdate(
            batch_size=batch_size,
            removed=tuple(self._removed),
            added=tuple(self.added),
            moved=tuple(self.moved),
        )
        self.reset()
        return update
