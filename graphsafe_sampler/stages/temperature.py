"""Temperature (step 6) and the greedy rows it defines (step 5): `l / T`, and a row whose
temperature is below `GREEDY_TEMPERATURE` is greedy, its token the argmax taken before this
stage. A greedy row keeps its logits (T = 1 for the stages after it), so that the processed
logprobs modes still see a distribution there.

Table: temperature, staged `[num_slots]` float32; the padding slot is greedy (0), so padded
rows cost an argmax and return a valid id.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.kernels.constants import GREEDY_TEMPERATURE
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables


class TemperatureState(SlotTables):
    """Slot state for temperature (see the module docstring)."""

    def __init__(self, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.temperature = self.staged("temperature", (), torch.float32, fill=0.0)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        self.temperature.write(slot, params.temperature)

    def is_greedy(self, slots: torch.Tensor) -> torch.Tensor:
        """[num_rows] bool for slots [num_rows] int64."""
        return self.temperature.device[slots] < GREEDY_TEMPERATURE

    def apply(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32
        slots: torch.Tensor,  # [num_rows] int64
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits / T, with greedy rows unchanged; is_greedy [num_rows] bool)."""
        divisor, is_greedy = self.divisors(slots)
        return logits / divisor[:, None], is_greedy

    def divisors(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([num_rows] float32 T, 1 on greedy rows; is_greedy [num_rows] bool)."""
        temperature = self.temperature.device[slots]
        is_greedy = temperature < GREEDY_TEMPERATURE
        return torch.where(is_greedy, 1.0, temperature), is_greedy
