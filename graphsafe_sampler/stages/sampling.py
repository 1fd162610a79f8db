"""Sampling (step 9): the race that draws each random row's token, and its inputs.

Randomness is counter-based (`rng.py`): the noise of token t in a row is a pure function of
(the request's seed, the token's position, t, the stream's salt), so a request's tokens do
not depend on its row, its neighbours, the batch size or padding, and a replayed graph draws
fresh numbers as positions advance on the device. `argmax(logits + Gumbel noise)` samples
softmax(logits) exactly; -inf tokens never win.

Tables: seed, staged `[num_slots]` int64 (a request's own seed, or one drawn on the host at
add time from a `random.Random` seeded by `SamplerConfig.seed`). A row's token position is
the batch state's `prompt_len + num_generated`, on the device.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.kernels.constants import SALT_SAMPLE
from graphsafe_sampler.params import SamplingParams, seed_bits
from graphsafe_sampler.rng import gumbel_noise, gumbel_noise_at
from graphsafe_sampler.slot_tables import SlotTables

LANE_FRACTIONS = (8, 4)
"""On a compiled CPU (`race_covered`), the rows that fit no candidate set race over the
vocabulary in the fewest lanes that hold them: a batch of B rows has min(B, max(2, B // f))
lanes for each f here, and with more such rows every row races."""


class SamplingState(SlotTables):
    """Slot state for seeds and positions (see the module docstring)."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.config = config
        self.seed = self.staged("seed", (), torch.int64)
        self.prompt_len = batch_state.prompt_len  # the kernels read it by slot
        self.host_rng = random.Random(config.seed)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        seed = params.seed if params.seed is not None else self.host_rng.getrandbits(64)
        self.seed.write(slot, seed_bits(seed))

    def race(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, processed and filtered
        slots: torch.Tensor,  # [num_rows] int64
        positions: torch.Tensor,  # [num_rows] int64
        salt: int = SALT_SAMPLE,
        seeds: torch.Tensor | None = None,  # [num_rows] int64; None: the slots' seeds
    ) -> torch.Tensor:
        """[num_rows] int64: each row's token drawn from softmax(logits) by the Gumbel-max
        race on the stream `salt` at the rows' positions (lowest index on exact ties), keyed
        by the slots' seeds or by `seeds` (a watermark's keys)."""
        seeds = self.seed.device[slots] if seeds is None else seeds
        noise = gumbel_noise(seeds, positions, logits.shape[1], salt)
        return (logits + noise).argmax(dim=-1)

    def race_candidates(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, processed and filtered
        ids: torch.Tensor,  # [num_rows, n] int64: each row's candidate token ids
        slots: torch.Tensor,  # [num_rows] int64
        positions: torch.Tensor,  # [num_rows] int64
        salt: int = SALT_SAMPLE,
        seeds: torch.Tensor | None = None,  # [num_rows] int64; None: the slots' seeds
    ) -> torch.Tensor:
        """[num_rows] int64: the race among each row's candidates alone, the token `race`
        draws wherever every token the row keeps is a candidate and its maximum is above
        -inf: the noise of a token is a function of its id, and exact ties go to the
        lowest id, as argmax gives them."""
        seeds = self.seed.device[slots] if seeds is None else seeds
        noise = gumbel_noise_at(seeds, positions, ids, salt)
        scores = logits.gather(1, ids) + noise  # [num_rows, n]
        best = scores.amax(-1, keepdim=True)
        return torch.where(scores == best, ids, logits.shape[1]).amin(-1)

    def race_covered(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, processed and filtered
        ids: torch.Tensor,  # [num_rows, n] int64 candidate token ids
        covered: torch.Tensor,  # [num_rows] bool: every kept token is a candidate
        unread: torch.Tensor,  # [num_rows] bool: rows whose random token is not read
        slots: torch.Tensor,  # [num_rows] int64
        positions: torch.Tensor,  # [num_rows] int64
        conditional: bool | None = None,
        remake: tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]] | None = None,
        seeds: torch.Tensor | None = None,  # [num_rows] int64; None: the slots' seeds
    ) -> torch.Tensor:
        """[num_rows] int64: `race` on SALT_SAMPLE, the same tokens wherever `~unread`.

        Branch-free (CUDA, eager), every row races over the vocabulary. With `conditional`
        (None: under torch.compile on a CPU, where docs/design.md allows data-dependent
        control flow), traced conditionals (`torch.cond`) race the covered rows over their
        candidates and only the rest over the vocabulary: none, the fewest lanes of
        `LANE_FRACTIONS` that hold them all, or every row (one conditional each). `remake`
        (fn, operands), where fn(*operands) is `logits` and fn of some rows of each operand
        those rows of it: the races compute their logits from it, so that `logits` itself is
        never read (and, compiled, never written where nothing else reads it)."""
        if conditional is None:
            conditional = logits.device.type == "cpu" and torch.compiler.is_compiling()
        make, sources = remake if remake is not None else (_same, (logits,))
        seeds = self.seed.device[slots] if seeds is None else seeds  # [num_rows]
        if not conditional:
            return self.race(make(*sources), slots, positions, seeds=seeds)
        num_rows = logits.shape[0]
        # No comparison of the sizes (a dynamic batch dimension would be pinned to one
        # size), and at least 2 lanes (a dynamic size that could be 1 guards on it)
        fractions = sorted(LANE_FRACTIONS, reverse=True)
        ladder = [min(num_rows, max(2, num_rows // f)) for f in fractions]
        need = ~(covered | unread)  # [num_rows]: rows that race over the vocabulary
        drawn = self.race_candidates(make(*sources), ids, slots, positions, seeds=seeds)

        # each branch takes the operands (drawn, need, slots, positions, seeds, *sources)
        def candidates_only(*ops: torch.Tensor) -> torch.Tensor:
            return ops[0].clone()

        def in_lanes(lanes: int) -> Callable[..., torch.Tensor]:
            def race_lanes(*ops: torch.Tensor) -> torch.Tensor:
                drawn, need, slots, positions, seeds, *rows_of = ops
                # the rows in need first; the lanes they leave hold other rows, whose race
                # over the vocabulary draws their candidate race's token (or an unread one)
                rows = need.to(torch.int8).argsort(descending=True, stable=True)[:lanes]
                lane_logits = make(*(source[rows] for source in rows_of))
                full = self.race(lane_logits, slots[rows], positions[rows], seeds=seeds[rows])
                return drawn.scatter(0, rows, full)

            return race_lanes

        def every_row(*ops: torch.Tensor) -> torch.Tensor:
            _, _, slots, positions, seeds, *rows_of = ops
            return self.race(make(*rows_of), slots, positions, seeds=seeds)

        # A chain of conditionals, not a nest (Dynamo and AOTAutograd trace a nested one
        # again inside each trace of its parent, 4 s of each compile): the rows in need go
        # to the first level that holds them all, and every other level passes the draws on.
        count = need.sum()
        levels = [*(in_lanes(lanes) for lanes in ladder), every_row]
        for level, (race, fewer) in enumerate(zip(levels, [0, *ladder], strict=True)):
            fits = count > fewer
            if level < len(ladder):
                fits = fits & (count <= ladder[level])
            operands = (drawn, need, slots, positions, seeds, *sources)
            drawn = torch.cond(fits, race, candidates_only, operands)
        return drawn


def _same(logits: torch.Tensor) -> torch.Tensor:
    """`race_covered`'s remake where none is given: the logits themselves."""
    return logits
