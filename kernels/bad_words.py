"""The bad-words rule in Triton, a phase of `process_logits` (kernels/logits_processing.py):
a word's last token is banned (-inf) where the outputs before the row end with the word's
prefix. The slot's words are a flat table of entries (token, steps back from the position
sampled now, word id), each word's entries contiguous and the used ones first; one
associative scan per block of entries decides every word at once (docs/kernels.md, logits
processing).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .library import check_table, load_old, together, update_tiles


def check_bad_words(
    bad_tokens: torch.Tensor | None,  # [num_slots, T] int32
    bad_back: torch.Tensor | None,  # [num_slots, T] int32
    bad_word: torch.Tensor | None,  # [num_slots, T] int32
    window: torch.Tensor | None,  # [num_slots, L] int32
    num_slots: int,
) -> None:
    """A launch's bad-words tables (the stage's layout), all four or none."""
    tables = together(
        "bad_tokens, bad_back, bad_word and window", bad_tokens, bad_back, bad_word, window
    )
    if tables is None:
        return
    num_bad = tables[0].shape[-1]
    for name, table, shape in zip(
        ("bad_tokens", "bad_back", "bad_word", "window"), tables,
        ((num_slots, None), (num_slots, num_bad), (num_slots, num_bad), (num_slots, None)),
        strict=True,
    ):  # fmt: skip
        check_table(name, table, torch.int32, shape)
    if num_bad == 0 or tables[3].shape[1] == 0:
        raise ValueError("the bad-words tables need T >= 1 entries and a window of L >= 1")


@triton.jit
def _segment_min(word_a, vote_a, word_b, vote_b):
    """Scan operator: the running minimum of the votes within a run of equal word ids."""
    return word_b, tl.where(word_a == word_b, tl.minimum(vote_a, vote_b), vote_b)


@triton.jit
def load_bad_block(
    row, slot, generated, preceding, bad_tokens_ptr, bad_back_ptr, bad_word_ptr, window_ptr,
    drafts_ptr, num_bad, window_len, num_drafts, start,
    HAS_DRAFTS: tl.constexpr, BAD_BLOCK: tl.constexpr,
):  # fmt: skip
    """The slot's entries [start, start + BAD_BLOCK) (past T: back -1, unused) and the
    outputs they look back at: (entry, back, token, word, index, seen, drafted), `index`
    the output `back` steps before the position sampled now (committed outputs, then this
    row's preceding drafts), `seen` the ring's entry there and `drafted` this row's draft
    there (HAS_DRAFTS). Two rounds of loads, the tables (`load_bad_tables`) then the ring
    (`load_bad_ring`), and nothing waits for the second here: the caller issues the bias
    phase's loads beside it."""
    tables = load_bad_tables(slot, bad_tokens_ptr, bad_back_ptr, bad_word_ptr, num_bad, start,
                             BAD_BLOCK)  # fmt: skip
    return load_bad_ring(
        tables, row, slot, generated, preceding, window_ptr, drafts_ptr, window_len, num_drafts,
        HAS_DRAFTS,
    )  # fmt: skip


@triton.jit
def load_bad_tables(
    slot, bad_tokens_ptr, bad_back_ptr, bad_word_ptr, num_bad, start, BAD_BLOCK: tl.constexpr
):
    """`load_bad_block`'s first round: (entry, back, token, word) of the entries [start,
    start + BAD_BLOCK), for `load_bad_ring`."""
    table = slot.to(tl.int64) * num_bad
    entry = start + tl.arange(0, BAD_BLOCK)
    used = entry < num_bad
    back = tl.load(bad_back_ptr + table + entry, mask=used, other=-1)
    token = tl.load(bad_tokens_ptr + table + entry, mask=used, other=0)
    word = tl.load(bad_word_ptr + table + entry, mask=used, other=-1)
    return entry, back, token, word


@triton.jit
def load_bad_ring(
    tables, row, slot, generated, preceding, window_ptr, drafts_ptr, window_len, num_drafts,
    HAS_DRAFTS: tl.constexpr,
):  # fmt: skip
    """`load_bad_block`'s second round, from `load_bad_tables`' (entry, back, token, word):
    the block's (entry, back, token, word, index, seen, drafted)."""
    entry, back, token, word = tables
    # a floor modulo, as torch's %
    index = generated + preceding - tl.maximum(back, 1)
    ring = index % window_len
    ring = tl.where(ring < 0, ring + window_len, ring)
    used = back >= 0  # (past T: back -1)
    seen = tl.load(window_ptr + slot.to(tl.int64) * window_len + ring, mask=used, other=-1)
    drafted = seen
    if HAS_DRAFTS:
        column = tl.minimum(tl.maximum(index - generated, 0), num_drafts - 1)
        drafted = tl.load(
            drafts_ptr + row.to(tl.int64) * num_drafts + column, mask=used, other=-1
        ).to(tl.int32)
    return entry, back, token, word, index, seen, drafted


@triton.jit
def ban_bad_words(
    entry,
    back,
    token,
    word,
    index,
    seen,
    drafted,  # the first block, from load_bad_block
    row_ptr,  # this row's logits
    row,
    slot,
    generated,  # int32: the slot's committed outputs
    preceding,  # int32: this row's drafts before it (0 without drafts)
    bad_tokens_ptr,  # [num_slots, T] int32
    bad_back_ptr,  # [num_slots, T] int32: outputs back; 0 = the token to ban; -1 = unused
    bad_word_ptr,  # [num_slots, T] int32: the word of each entry
    window_ptr,  # [num_slots, L] int32: output g at g % L
    drafts_ptr,  # [num_rows, D] int64 (HAS_DRAFTS)
    tile_row,  # this row's tile maxima (HAS_TILE_MAX)
    begin,  # the program's columns: [begin, end)
    end,
    num_bad,  # T
    window_len,  # L
    num_drafts,  # D
    HAS_DRAFTS: tl.constexpr,
    HAS_TILE_MAX: tl.constexpr,
    BAD_BLOCK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Store -inf on each word's last token where the outputs before this row end with the
    word's prefix (the bad-words stage's rule and layout: a word's entries are contiguous,
    used entries first), for the tokens in [begin, end). A scan of the entries' votes per
    run of equal word ids gives, at a word's last entry, whether every entry of its word
    matched; a word spanning two blocks carries the previous block's last run. Used entries
    come first: a block whose last entry is unused is the last one walked."""
    carry_word, carry_vote, more = _ban_block(
        entry, back, token, word, index, seen, drafted, -1, 1, 0, row_ptr, generated,
        tile_row, begin, end, num_bad, HAS_DRAFTS, HAS_TILE_MAX, BAD_BLOCK, BLOCK_SIZE,
    )  # fmt: skip
    start = BAD_BLOCK
    more &= start < num_bad
    while more:
        entry, back, token, word, index, seen, drafted = load_bad_block(
            row, slot, generated, preceding, bad_tokens_ptr, bad_back_ptr, bad_word_ptr,
            window_ptr, drafts_ptr, num_bad, window_len, num_drafts, start, HAS_DRAFTS,
            BAD_BLOCK,
        )  # fmt: skip
        carry_word, carry_vote, more = _ban_block(
            entry, back, token, word, index, seen, drafted, carry_word, carry_vote, start,
            row_ptr, generated, tile_row, begin, end, num_bad, HAS_DRAFTS, HAS_TILE_MAX,
            BAD_BLOCK, BLOCK_SIZE,
        )  # fmt: skip
        start += BAD_BLOCK
        more &= start < num_bad


@triton.jit
def _ban_block(
    entry, back, token, word, index, seen, drafted, carry_word, carry_vote, start, row_ptr,
    generated, tile_row, begin, end, num_bad,
    HAS_DRAFTS: tl.constexpr, HAS_TILE_MAX: tl.constexpr, BAD_BLOCK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """One block of `ban_bad_words` -> (the word and vote its last entry carries into the
    next block, whether its last entry is used: a next block may hold used entries)."""
    used = entry < num_bad
    if HAS_DRAFTS:
        seen = tl.where(index >= generated, drafted, seen)
        exists = index >= 0
    else:
        exists = generated >= back
    # 1 where an entry lets its word match: not a prefix token, or it is seen there
    vote = ((back < 1) | ((seen == token) & exists)).to(tl.int32)
    _, matched = tl.associative_scan((word, vote), 0, _segment_min)
    matched = tl.where(word == carry_word, tl.minimum(matched, carry_vote), matched)
    last = entry == start + BAD_BLOCK - 1
    ban = used & (back == 0) & (matched == 1) & (token >= begin) & (token < end)
    old, tile = load_old(row_ptr, tile_row, token, ban, HAS_TILE_MAX, BLOCK_SIZE)
    ninf = tl.full((BAD_BLOCK,), float("-inf"), tl.float32)
    tl.store(row_ptr + token, ninf, ban)
    if HAS_TILE_MAX:
        update_tiles(tile_row, token, old, tile, ninf, ban, BLOCK_SIZE)
    carry_word = tl.sum(tl.where(last, word, 0))
    carry_vote = tl.sum(tl.where(last, matched, 0))
    return carry_word, carry_vote, tl.sum(tl.where(last, back, 0)) >= 0
