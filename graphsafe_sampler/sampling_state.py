"""Per-slot sampling parameters and the counter-based RNG's inputs.

temperature, top_k, top_p: staged `[num_slots]`; seed: staged `[num_slots]` int64 (a
request's own seed, or one drawn on the host at add time from a `random.Random` seeded by
`SamplerConfig.seed`); prompt_len: staged `[num_slots]` int64, so that a row's token
position is `prompt_len + num_generated` on the device.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables

_UINT64 = 2**64
_INT64_HALF = 2**63


def _as_int64(seed: int) -> int:
    """Any seed in [-2**63, 2**64) as the int64 with the same 64 bits."""
    seed %= _UINT64
    return seed - _UINT64 if seed >= _INT64_HALF else seed


class SamplingState(SlotTables):
    """Slot state for temperature, top-k, top-p, seeds and positions."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.config = config
        # The padding slot is greedy: padded rows cost an argmax and return a valid id.
        self.temperature = self.staged("temperature", (), torch.float32, fill=0.0)
        self.top_k = self.staged("top_k", (), torch.int32)
        self.top_p = self.staged("top_p", (), torch.float32, fill=1.0)
        self.seed = self.staged("seed", (), torch.int64)
        self.prompt_len = self.staged("prompt_len", (), torch.int64)
        self.host_rng = random.Random(config.seed)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        self.temperature.write(slot, params.temperature)
        top_k = params.top_k if 0 < params.top_k < self.config.vocab_size else 0
        self.top_k.write(slot, top_k)
        self.top_p.write(slot, params.top_p)
        seed = params.seed if params.seed is not None else self.host_rng.getrandbits(64)
        self.seed.write(slot, _as_int64(seed))
        self.prompt_len.write(slot, len(prompt_tok_ids or ()))

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """[num_rows] int64 position of the token each row samples now."""
        generated = self.batch_state.num_generated.device[slots].long()
        return self.prompt_len.device[slots] + generated
