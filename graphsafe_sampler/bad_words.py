"""Bad words (DESIGN §4, step 2): a token that would complete a banned sequence is -inf.

A bad word `w` of n tokens bans `w[n-1]` when the request's last n-1 *output* tokens equal
`w[:n-1]` (vLLM's rule; one-token words are always banned). Tables per slot: the words,
padded, `[num_slots, max_bad_words, L]` int32 with their lengths `[num_slots,
max_bad_words]` (0 = unused), L = max_bad_word_len; and a device-side ring of the last L
output tokens, `[num_slots, L]` int32, where generated token g sits at `g % L`. The ring is
filled from `output_tok_ids` at add time and advanced by `commit` inside the graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables


class BadWordsState(SlotTables):
    """Slot state for bad words (see the module docstring)."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.config = config
        words, length = config.max_bad_words, config.max_bad_word_len
        self.length = length
        self.words = self.staged("bad_words", (words, length), torch.int32)
        self.word_lens = self.staged("bad_word_lens", (words,), torch.int32)
        self.window = self.staged("recent_tokens", (length,), torch.int32)
        # steps back from the newest output token: 1 .. L-1
        self.back = torch.arange(1, length, device=batch_state.device)  # [L-1]
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        words = np.zeros((self.config.max_bad_words, self.length), dtype=np.int32)
        lens = np.zeros(self.config.max_bad_words, dtype=np.int32)
        for i, word in enumerate(params.bad_words_token_ids or ()):
            words[i, : len(word)] = word
            lens[i] = len(word)
        self.words.write(slot, words)
        self.word_lens.write(slot, lens)
        window = np.zeros(self.length, dtype=np.int32)
        n = len(output_tok_ids)
        for g in range(max(0, n - self.length), n):
            window[g % self.length] = output_tok_ids[g]
        self.window.write(slot, window)

    def commit(self, slots: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor) -> None:
        position = self.batch_state.num_generated.device[slots].long() % self.length  # [rows]
        window = self.window.device
        current = window[slots, position].long()
        # Rows that do not commit write back what is there, so duplicate (padding) indices
        # all carry the same value.
        window.index_put_((slots, position), torch.where(keep, token_ids, current).int())

    def apply(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        length = self.length
        words = self.words.device[slots].long()  # [rows, B, L]
        lens = self.word_lens.device[slots].long()  # [rows, B]
        prefix_len = (lens - 1).clamp_(min=0)  # [rows, B]
        generated = self.batch_state.num_generated.device[slots].long()  # [rows]
        # recent[:, j-1] = the output token j steps back (j = 1 .. L-1)
        ring_pos = (generated[:, None] - self.back) % length  # [rows, L-1]
        recent = self.window.device[slots].long().gather(1, ring_pos)  # [rows, L-1]
        have = generated[:, None] >= self.back  # [rows, L-1] that many outputs exist
        # The word's token that must sit j steps back: w[prefix_len - j], for j <= prefix_len.
        needed = prefix_len[:, :, None] - self.back  # [rows, B, L-1]
        in_prefix = needed >= 0
        expected = words.gather(2, needed.clamp(min=0))  # [rows, B, L-1]
        ok = ~in_prefix | ((expected == recent[:, None, :]) & have[:, None, :])
        match = ok.all(dim=2) & (lens > 0)  # [rows, B]
        last = words.gather(2, prefix_len[:, :, None]).squeeze(2)  # [rows, B]
        ban = torch.where(match, float("-inf"), float("inf")).to(logits.dtype)
        # amin: a token banned by any word is -inf; +inf leaves a logit as it is.
        return logits.scatter_reduce_(1, last, ban, reduce="amin")
