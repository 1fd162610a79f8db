"""Bad words (docs/design.md §4, step 2): a token that would complete a banned sequence is -inf.

A bad word `w` of n tokens bans `w[n-1]` when the request's last n-1 *output* tokens equal
`w[:n-1]` (vLLM's rule; one-token words are always banned).

Layout per slot, flat, so that the capacity is a number of tokens whatever the words'
lengths (T = max_bad_words_tokens, L = max_bad_word_len):
- tokens `[num_slots, T]` int32: the words one after another;
- back `[num_slots, T]` int32: how many outputs back a token must sit (n-1-i for token i of
  an n-token word; 0 marks the token to ban; -1 an unused entry);
- word `[num_slots, T]` int32: which word a token belongs to (unused entries: word 0, with
  back = -1, which never vetoes a match);
- a device-side ring of the last L output tokens, `[num_slots, L]` int32, where generated
  token g sits at `g % L`, filled from `output_tok_ids` at add time and advanced by
  `commit` inside the graph.

A vocabulary shard (`VocabShard`) keeps only the words whose last token it holds, that
token at its local id (the prefix tokens stay global: they match the window of outputs).

`apply`: each prefix token checks its ring entry; a segment-min over word ids gives each
word's match; the matched words' last tokens are scattered to -inf. [num_rows, T] work,
no loop over words.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables

_UNUSED = -1


class BadWordsState(SlotTables):
    """Slot state for bad words (see the module docstring)."""

    def __init__(self, config: SamplerConfig, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.config = config
        capacity, length = config.max_bad_words_tokens, config.max_bad_word_len
        self.capacity, self.length = capacity, length
        self.tokens = self.staged("bad_word_tokens", (capacity,), torch.int32)
        self.back = self.staged("bad_word_back", (capacity,), torch.int32, fill=_UNUSED)
        self.word = self.staged("bad_word_index", (capacity,), torch.int32)
        self.window = self.staged("recent_tokens", (length,), torch.int32)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        tokens = np.zeros(self.capacity, dtype=np.int32)
        back = np.full(self.capacity, _UNUSED, dtype=np.int32)
        word_index = np.zeros(self.capacity, dtype=np.int32)
        shard = self.batch_state.shard
        at = 0
        words = [w for w in params.bad_words_token_ids or () if shard.holds(w[-1])]
        for i, bad_word in enumerate(words):
            n = len(bad_word)
            tokens[at : at + n] = bad_word
            tokens[at + n - 1] -= shard.start  # the banned token, a column of the shard
            back[at : at + n] = np.arange(n - 1, -1, -1)
            word_index[at : at + n] = i
            at += n
        self.tokens.write(slot, tokens)
        self.back.write(slot, back)
        self.word.write(slot, word_index)
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

    def apply(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, updated in place
        slots: torch.Tensor,  # [num_rows] int64
        drafts: torch.Tensor | None = None,  # [num_rows, S] int64 ids in [0, V)
        num_preceding: torch.Tensor | None = None,  # [num_rows] int64 in [0, S]
    ) -> torch.Tensor:
        """Ban the tokens that would complete a bad word after each row's output history.

        With `drafts`, a row's history is its committed outputs followed by its first
        `num_preceding` drafts (speculative decoding: position j sees drafts 0..j-1).
        """
        tokens = self.tokens.device[slots].long()  # [rows, T]
        back = self.back.device[slots].long()  # [rows, T]
        word = self.word.device[slots].long()  # [rows, T]
        generated = self.batch_state.num_generated.device[slots].long()[:, None]  # [rows, 1]
        window = self.window.device[slots].long()  # [rows, L]
        if drafts is None:
            # The output token `back` steps before the one being sampled now.
            ring_pos = (generated - back.clamp(min=1)) % self.length
            seen = window.gather(1, ring_pos)  # [rows, T]
            exists = generated >= back
        else:
            if num_preceding is None:
                raise ValueError("drafts need num_preceding, the drafts before each row")
            # Output index of the token `back` steps before this row's position: the
            # committed outputs are 0..generated-1, then the preceding drafts.
            index = generated + num_preceding[:, None] - back.clamp(min=1)  # [rows, T]
            from_ring = window.gather(1, index % self.length)
            draft_index = (index - generated).clamp(0, drafts.shape[1] - 1)
            from_drafts = drafts.gather(1, draft_index)
            seen = torch.where(index >= generated, from_drafts, from_ring)
            exists = index >= 0
        prefix = back >= 1
        fits = (seen == tokens) & exists
        # 1 where a token lets its word match (non-prefix entries never veto), 0 where not.
        vote = (~prefix | fits).to(torch.int32)
        matched = torch.ones_like(vote).scatter_reduce_(1, word, vote, reduce="amin")
        ban = (back == 0) & (matched.gather(1, word) == 1)  # [rows, T]
        # Every entry writes min(logit, bound) at a column where all entries write the same:
        # a banned token, -inf (NaN stays NaN, as torch.minimum keeps it); the entries that
        # ban nothing aim at the row's first banned token, or in a row that bans nothing at
        # column 0 with bound +inf (the logit as it is). So index_put_ is deterministic, and
        # inductor lowers it in place, where a scatter_reduce_ falls back to aten on a copy
        # of the whole tensor. Only banned entries' tokens are read: a prefix token's global
        # id may lie past a vocabulary shard's columns.
        any_ban = ban.any(-1, keepdim=True)  # [rows, 1]
        first = tokens.gather(1, ban.to(torch.int32).argmax(-1, keepdim=True))  # [rows, 1]
        target = torch.where(ban, tokens, torch.where(any_ban, first, 0))  # [rows, T]
        bound = torch.where(any_ban, float("-inf"), float("inf")).to(logits.dtype)
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
        return logits.index_put_((rows, target), torch.minimum(logits[rows, target], bound))
