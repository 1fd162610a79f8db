"""`RecentTokens`: each slot's last few tokens, prompt and outputs, kept on the device.

A ring of `width` tokens per slot: the token at position p (counting the prompt) sits at
column p % width, and -1 stands before the first; p is the batch state's `positions`
(prompt_len + num_generated on the device, no host read). The host fills a request's ring
at add time (a resumed request brings its outputs); the commit writes each committed token
at its position. Stages that look back a fixed number
of tokens share it (the thinking budget's markers, the watermark's context).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.slot_tables import SlotTables


class RecentTokens:
    """Table (on `tables`' batch state): `{name}_recent` [num_slots, width] int64."""

    def __init__(self, tables: SlotTables, name: str, width: int) -> None:
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.width = width
        self.batch_state = tables.batch_state
        self.ring = tables.staged(f"{name}_recent", (width,), torch.int64, fill=-1)

    def add_request(
        self, slot: int, prompt_tok_ids: Sequence[int] | None, output_tok_ids: Sequence[int]
    ) -> None:
        """Host side: the request's last `width` tokens."""
        tokens = [*(prompt_tok_ids or ()), *output_tok_ids]
        ring = np.full(self.width, -1, dtype=np.int64)
        for p in range(max(0, len(tokens) - self.width), len(tokens)):
            ring[p % self.width] = tokens[p]
        self.ring.write(slot, ring)

    def last(self, slots: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """[num_rows, n] int64: each row's last n <= width tokens, oldest first (-1 before
        the first token)."""
        n = self.width if n is None else n
        positions = self.batch_state.positions(slots)[:, None] + torch.arange(
            -n, 0, device=slots.device
        )
        tokens = self.ring.device[slots].gather(1, positions.clamp(min=0) % self.width)
        return torch.where(positions < 0, -1, tokens)

    def commit(self, slots: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor) -> None:
        """Write each kept row's token at its position (before num_generated advances)."""
        column = self.batch_state.positions(slots) % self.width  # [rows]
        ring = self.ring.device
        current = ring[slots, column]
        # rows that do not commit write back what is there: duplicate (padding) slots agree
        ring.index_put_((slots, column), torch.where(keep, token_ids, current))
