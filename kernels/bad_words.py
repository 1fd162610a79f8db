"""The bad-words rule in Triton, a phase of `process_logits` (kernels/logits_processing.py):
a word's last token is banned (-inf) where the outputs before the row end with the word's
prefix. The slot's words are a flat table of entries (token, steps back from the position
sampled now, word id), each word's entries contiguous and the used ones first; one
associative scan per block of entries decides every word at once (docs/kernels.md, logits
processing).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .library import update_tiles


@triton.jit
def _segment_min(word_a, vote_a, word_b, vote_b):
    """Scan operator: the running minimum of the votes within a run of equal word ids."""
    return word_b, tl.where(word_a == word_b, tl.minimum(vote_a, vote_b), vote_b)


@triton.jit
def ban_bad_words(
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
    matched; a word spanning two blocks carries the previous block's last run."""
    table = slot.to(tl.int64) * num_bad
    carry_word = -1
    carry_vote = 1
    for start in range(0, num_bad, BAD_BLOCK):
        # used entries come first: a block that starts unused has none
        if tl.load(bad_back_ptr + table + start) >= 0:
            entry = start + tl.arange(0, BAD_BLOCK)
            used = entry < num_bad
            back = tl.load(bad_back_ptr + table + entry, mask=used, other=-1)
            token = tl.load(bad_tokens_ptr + table + entry, mask=used, other=0)
            word = tl.load(bad_word_ptr + table + entry, mask=used, other=-1)
            # the output `back` steps before the position sampled now (committed outputs,
            # then this row's preceding drafts); a floor modulo, as torch's %
            index = generated + preceding - tl.maximum(back, 1)
            ring = index % window_len
            ring = tl.where(ring < 0, ring + window_len, ring)
            seen = tl.load(window_ptr + slot.to(tl.int64) * window_len + ring, mask=used, other=-1)
            if HAS_DRAFTS:
                column = tl.minimum(tl.maximum(index - generated, 0), num_drafts - 1)
                drafted = tl.load(
                    drafts_ptr + row.to(tl.int64) * num_drafts + column, mask=used, other=-1
                ).to(tl.int32)
                seen = tl.where(index >= generated, drafted, seen)
                exists = index >= 0
            else:
                exists = generated >= back
            # 1 where an entry lets its word match: not a prefix token, or it is seen there
            vote = ((back < 1) | ((seen == token) & exists)).to(tl.int32)
            _, matched = tl.associative_scan((word, vote), 0, _segment_min)
            matched = tl.where(word == carry_word, tl.minimum(matched, carry_vote), matched)
            last = entry == start + BAD_BLOCK - 1
            carry_word = tl.sum(tl.where(last, word, 0))
            carry_vote = tl.sum(tl.where(last, matched, 0))
            ban = used & (back == 0) & (matched == 1) & (token >= begin) & (token < end)
            old = tl.load(row_ptr + token, mask=ban, other=0.0)
            ninf = tl.full((BAD_BLOCK,), float("-inf"), tl.float32)
            tl.store(row_ptr + token, ninf, ban)
            if HAS_TILE_MAX:
                update_tiles(tile_row, token, old, ninf, ban, BLOCK_SIZE)
