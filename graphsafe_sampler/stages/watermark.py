"""Watermarking (step 9): a per-request Gumbel-max watermark, and its detector.

A watermarked request's race keys its noise by (the request's watermark key, a hash of the
previous n tokens, the token id) instead of (seed, position, token id): the stream follows
the text, so whoever holds the key can recompute each token's noise from the text alone.
Each draw stays an exact sample of softmax(logits) (the race is unchanged, only its key is),
so watermarking changes no distribution; it ties the choice to the key.

Detection (`detect_watermark`): the winner of `argmax(logits - log e)` tends to have a small
exponential draw e = -log(1 - h / 2**32), i.e. a small u = h / 2**32 where h is its 32-bit
hash. Text written without the key has u uniform, so the score sum(-log u) over the m
distinct (context, token) pairs is Gamma(m, 1), and its upper tail is the p-value.
Repeated pairs are scored once: they repeat the same draw, not fresh evidence.

Tables (registered only when `SamplerConfig.watermark_context_len` = n > 0): key, staged
[num_slots] int64 (the key's 64 bits); on, staged [num_slots] bool; and a `RecentTokens`
ring of the last n tokens, advanced by `commit` on the device.

Speculative decoding's emitted tokens (`RejectionSampler`) race on their own streams and are
not watermarked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.kernels.constants import SALT_SAMPLE
from graphsafe_sampler.params import SamplingParams, seed_bits
from graphsafe_sampler.recent_tokens import RecentTokens
from graphsafe_sampler.rng import context_positions, hash_tokens, row_keys
from graphsafe_sampler.slot_tables import SlotTables


class WatermarkState(SlotTables):
    """Per-slot watermark keys and recent tokens (see the module docstring)."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.width = config.watermark_context_len
        self.key = self.staged("watermark_key", (), torch.int64)
        self.on = self.staged("watermark_on", (), torch.bool, fill=False)
        self.recent = RecentTokens(self, "watermark", self.width)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        key = params.watermark_key
        self.on.write(slot, key is not None)
        self.key.write(slot, 0 if key is None else seed_bits(key))
        self.recent.add_request(slot, prompt_tok_ids, output_tok_ids)

    def commit(self, slots: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor) -> None:
        self.recent.commit(slots, token_ids, keep)

    def context(self, slots: torch.Tensor) -> torch.Tensor:
        """[num_rows, n] int64: each row's previous n tokens, oldest first (-1 before the
        first token)."""
        return self.recent.last(slots)

    def race_inputs(
        self,
        slots: torch.Tensor,  # [num_rows] int64
        seeds: torch.Tensor,  # [num_rows] int64: the rows' own seeds
        positions: torch.Tensor,  # [num_rows] int64: the rows' token positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The (seed, position) each row's SALT_SAMPLE race is keyed by: the watermark key
        and the context hash in watermarked rows, the row's own elsewhere."""
        on = self.on.device[slots]
        keyed = torch.where(on, self.key.device[slots], seeds)
        return keyed, torch.where(on, context_positions(self.context(slots)), positions)


class WatermarkDetection(NamedTuple):
    """score: sum of -log u over the scored tokens; num_scored: the distinct (context,
    token) pairs scored; p_value: the chance that text written without the key scores at
    least `score` (1.0 when nothing was scored)."""

    score: float
    num_scored: int
    p_value: float


def detect_watermark(
    token_ids: Sequence[int],
    key: int,
    context_len: int,
    prompt_tok_ids: Sequence[int] | None = None,
) -> WatermarkDetection:
    """Score `token_ids` (a request's generated tokens) for the watermark of `key`, with the
    sampler's `watermark_context_len` and the prompt the request was added with (the first
    tokens' contexts reach into it). Host side, on the CPU."""
    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
        raise ValueError(f"context_len must be an int >= 1, got {context_len!r}")
    prompt = list(prompt_tok_ids or ())
    output = list(token_ids)
    for name, ids in (("token_ids", output), ("prompt_tok_ids", prompt)):
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 for t in ids):
            raise ValueError(f"{name} must hold token ids (ints >= 0)")
    if not output:
        return WatermarkDetection(0.0, 0, 1.0)
    history = torch.tensor([-1] * context_len + prompt + output, dtype=torch.int64)
    start = context_len + len(prompt)  # index of the first generated token in history
    index = torch.arange(start, history.shape[0])[:, None] + torch.arange(-context_len, 0)
    contexts = history[index]  # [m, n]
    positions = context_positions(contexts)  # [m]
    tokens = history[start:]  # [m]
    # scored once per distinct (context, token): a repeat redraws the same number
    pairs = torch.stack([positions, tokens], dim=1).unique(dim=0)
    keys = row_keys(torch.full_like(pairs[:, 0], seed_bits(key)), pairs[:, 0], SALT_SAMPLE)
    hashes = hash_tokens(keys, pairs[:, 1:])[:, 0].double()  # [m] in [0, 2**32)
    # u = h / 2**32, floored as the race's draws are (exponentials_from_hashes)
    u = hashes.clamp(min=0.5) / 2.0**32
    score = float(-torch.log(u).sum())
    m = pairs.shape[0]
    p_value = float(torch.special.gammaincc(torch.tensor(float(m), dtype=torch.float64),
                                            torch.tensor(score, dtype=torch.float64)))  # fmt: skip
    return WatermarkDetection(score, m, p_value)
