"""The sparse phases of logits processing in Triton, after the dense pass of
kernels/logits_processing.py: the biased tokens made again (step 1 with steps 3-6), the
saturated tokens' excess (step 7) and min_tokens' stop ids set to -inf (step 2; the bad
words' are kernels/bad_words.py's). Each phase reads and writes what the one before stored,
so the kernel puts a barrier between them (docs/kernels.md, logits processing).

The key idea: the phases' tables depend on the slot alone, so the kernel loads their first
blocks together, before the first phase (`load_bias_block`, `load_excess_head`,
`load_stop_block`), and each phase starts with the logits at its tokens. A warp issues in
order, and a phase's stores wait for its data: a table loaded inside its phase waited
behind the phase before it, a memory latency a table (docs/kernels.md, logits processing:
the rounds of loads).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .library import forget_tiles, load_old, update_tiles
from .token_steps import penalise_and_scale


@triton.jit
def load_bias_block(bias_ids_ptr, bias_values_ptr, slot, num_bias, start, BLOCK: tl.constexpr):
    """The slot's logit-bias entries [start, start + BLOCK): (entry, token, value), past
    the table's C entries (0, +0.0). The ids and the values in one round of loads."""
    entry = start + tl.arange(0, BLOCK)
    in_table = entry < num_bias
    at = slot * num_bias + entry
    token = tl.load(bias_ids_ptr + at, mask=in_table, other=0)
    return entry, token, tl.load(bias_values_ptr + at, mask=in_table, other=0.0)


@triton.jit
def _bias_block(
    entry, token, value, num_bias, source_row, row_ptr, tile_row, begin, end, row,
    allowed_row, grammar_row, prompt_row, counts_row, drafts_ptr, preceding, num_drafts,
    penalties_on, repetition, frequency, presence, fix_excess, scale_on, temperature,
    SATURATED: tl.constexpr, HAS_GRAMMAR: tl.constexpr, HAS_DRAFTS: tl.constexpr,
    HAS_TILE_MAX: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """One block of `apply_bias`: its tokens' loads in one round, then the stores."""
    used = (entry < num_bias) & (value != 0.0) & (token >= begin) & (token < end)
    # an unused entry's id may lie anywhere: the bitmask words are loaded unmasked
    token = tl.where(used, token, 0)
    x = tl.load(source_row + token, mask=used, other=0.0).to(tl.float32)
    old, tile = load_old(row_ptr, tile_row, token, used, HAS_TILE_MAX, BLOCK_SIZE)
    # (the count bytes read directly: the output words' pointer and bit go unread here)
    x = penalise_and_scale(
        x, value, token, token // 32, token % 32, used, row, allowed_row, grammar_row,
        prompt_row, counts_row, counts_row, token, drafts_ptr, preceding, num_drafts, penalties_on,
        repetition, frequency, presence, fix_excess, scale_on, temperature, True, SATURATED,
        HAS_GRAMMAR, HAS_DRAFTS, True, False,
    )  # fmt: skip
    tl.store(row_ptr + token, x, mask=used)
    if HAS_TILE_MAX:
        update_tiles(tile_row, token, old, tile, x, used, BLOCK_SIZE)


@triton.jit
def _first_key(entry, token):
    """The key of entry 0 of a sparse table's first block ([BLOCK] entries and keys)."""
    return tl.sum(tl.where(entry == 0, token, 0))


@triton.jit
def _walk_goes_on(entry, token, first_key, num_entries, start):
    """Whether the walk over a sparse table whose used keys come first, unique, and whose
    unused entries repeat the first key (the bias and stop-id tables) goes on to the block
    at `start`, after making the block (`entry`, `token`): it exists, and the block made
    held no repeat of the first key past entry 0, which would end the used entries."""
    repeated = (entry < num_entries) & (entry > 0) & (token == first_key)
    return (start < num_entries) & (tl.max(repeated.to(tl.int32)) == 0)


@triton.jit
def apply_bias(
    entry, token, value,  # the first block, from load_bias_block
    bias_ids_ptr, bias_values_ptr, slot, num_bias, source_row, row_ptr, tile_row, begin,
    end, row, allowed_row, grammar_row, prompt_row, counts_row, drafts_ptr, preceding,
    num_drafts, penalties_on, repetition, frequency, presence, fix_excess, scale_on,
    temperature,
    SATURATED: tl.constexpr, HAS_GRAMMAR: tl.constexpr, HAS_DRAFTS: tl.constexpr,
    HAS_TILE_MAX: tl.constexpr, BLOCK: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """Step 1, then steps 3-6 again (IEEE division) on the biased tokens of [begin, end):
    each made from its source value plus the bias, over the dense pass's value. The table
    is the logit-bias stage's: keys unique within a slot, the used entries first, the rest
    +0.0 or repeating the first, so lanes that share a token store one value, and the
    block holding the first key again past entry 0 is the last with a used entry (a table
    of C = 1,024 entries biasing a few tokens: one block, not eight). The first block is
    the caller's, made before the loop over the rest."""
    first_key = _first_key(entry, token)
    _bias_block(
        entry, token, value, num_bias, source_row, row_ptr, tile_row, begin, end, row,
        allowed_row, grammar_row, prompt_row, counts_row, drafts_ptr, preceding, num_drafts,
        penalties_on, repetition, frequency, presence, fix_excess, scale_on, temperature,
        SATURATED, HAS_GRAMMAR, HAS_DRAFTS, HAS_TILE_MAX, BLOCK_SIZE,
    )  # fmt: skip
    start = BLOCK
    more = _walk_goes_on(entry, token, first_key, num_bias, start)
    while more:
        entry, token, value = load_bias_block(
            bias_ids_ptr, bias_values_ptr, slot, num_bias, start, BLOCK
        )  # fmt: skip
        _bias_block(
            entry, token, value, num_bias, source_row, row_ptr, tile_row, begin, end, row,
            allowed_row, grammar_row, prompt_row, counts_row, drafts_ptr, preceding,
            num_drafts, penalties_on, repetition, frequency, presence, fix_excess, scale_on,
            temperature, SATURATED, HAS_GRAMMAR, HAS_DRAFTS, HAS_TILE_MAX, BLOCK_SIZE,
        )  # fmt: skip
        start += BLOCK
        more = _walk_goes_on(entry, token, first_key, num_bias, start)


@triton.jit
def load_excess_head(overflow_token_ptr, overflow_excess_ptr, slot, num_overflow):
    """The slot's overflow table (the penalties stage's: used entries first, -1 unused):
    (its row offset, whether it is full, the first entry's token and excess). The table
    fills in order, so a used last entry means it is full (docs/kernels.md)."""
    table_row = slot.to(tl.int64) * (num_overflow + 1)
    full = tl.load(overflow_token_ptr + table_row + num_overflow - 1) >= 0
    listed = tl.load(overflow_token_ptr + table_row)
    return table_row, full, listed, tl.load(overflow_excess_ptr + table_row)


@triton.jit
def apply_excess(
    table_row, full, listed, excess,  # from load_excess_head
    overflow_token_ptr, overflow_excess_ptr, num_overflow, row_ptr, tile_row, counts_row,
    begin, end, frequency, scale_on, temperature,
    SATURATED: tl.constexpr, HAS_TILE_MAX: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """Step 7 on [begin, end): each listed saturated token's excess (count - 255) times
    the frequency penalty, then its temperature, which the dense pass left out for a byte
    of 255; its tile's entry becomes unknown. The next entry is loaded with each token's
    logit, a round of loads an entry. A full table may leave tokens at 255 without an entry:
    every byte of 255 then still lacks its temperature, listed or not, and a pass over the
    chunk gives it (never, unless E tokens of one request pass 255 outputs). With
    `scale_on` false (processing's DEFER: the readers divide), neither."""
    scale_here = scale_on & ~full
    index = 0
    while listed >= 0:
        mine = (listed >= begin) & (listed < end)
        value = tl.load(row_ptr + listed, mask=mine, other=0.0)
        following = index + 1 < num_overflow
        next_listed = tl.load(overflow_token_ptr + table_row + index + 1, mask=following, other=-1)
        next_excess = tl.load(overflow_excess_ptr + table_row + index + 1, mask=following)
        if mine:
            value = value - frequency * excess.to(tl.float32)
            if scale_here:
                value = tl.math.div_rn(value, temperature)
            tl.store(row_ptr + listed, value)
            if HAS_TILE_MAX:
                forget_tiles(tile_row, listed, listed >= begin, BLOCK_SIZE)
        index += 1
        listed, excess = next_listed, next_excess
    if scale_on & full:
        tl.debug_barrier()
        for start in range(begin, end, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            in_row = cols < end
            count = tl.load(counts_row + cols, mask=in_row, other=0).to(tl.int32)
            at_255 = in_row & (count == SATURATED)
            x = tl.load(row_ptr + cols, mask=at_255, other=0.0)
            tl.store(row_ptr + cols, tl.math.div_rn(x, temperature), mask=at_255)
            if HAS_TILE_MAX:
                forget_tiles(tile_row, start, start >= begin, BLOCK_SIZE)


@triton.jit
def load_stop_block(stop_ids_ptr, slot, num_stop, start, BLOCK: tl.constexpr):
    """The slot's stop ids [start, start + BLOCK): (entry, token); past the table's S, 0."""
    entry = start + tl.arange(0, BLOCK)
    return entry, tl.load(stop_ids_ptr + slot * num_stop + entry, mask=entry < num_stop, other=0)


@triton.jit
def load_stop_olds(
    entry, token, stopping, num_stop, row_ptr, tile_row, begin, end,
    HAS_TILE_MAX: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """(lanes to ban, their old logits, their tiles' entries) for a block of stop ids of
    [begin, end), none unless `stopping`: loaded by the caller before the bad words' phase
    stores, so that both -inf phases wait for one round of loads, not two."""
    # (tl.where, not &: the interpreter cannot & a scalar bool with a block of them)
    used = tl.where(stopping, (entry < num_stop) & (token >= begin) & (token < end), False)
    old, tile = load_old(row_ptr, tile_row, token, used, HAS_TILE_MAX, BLOCK_SIZE)
    return used, old, tile


@triton.jit
def _ban_stops(
    token, used, old, tile, row_ptr, tile_row,
    HAS_TILE_MAX: tl.constexpr, BLOCK: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    ninf = tl.full((BLOCK,), float("-inf"), tl.float32)
    tl.store(row_ptr + token, ninf, used)
    if HAS_TILE_MAX:
        update_tiles(tile_row, token, old, tile, ninf, used, BLOCK_SIZE)


@triton.jit
def ban_stop_ids(
    token, used, old, tile,  # the first block's, from load_stop_block and load_stop_olds
    stopping, stop_ids_ptr, slot, num_stop, row_ptr, tile_row, begin, end,
    HAS_TILE_MAX: tl.constexpr, BLOCK: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """Step 2's min_tokens, while `stopping`: the slot's stop ids in [begin, end) set to
    -inf, their tiles' entries kept exact; the first block loaded by the caller. The table
    is the min-tokens stage's: ids unique within a slot, the used entries first, the rest
    repeating the first, so the block holding the first id again past entry 0 is the last
    with a used entry (a table of C = 129 entries, EOS's room included, holding a few ids:
    one block of 128, not two)."""
    _ban_stops(token, used, old, tile, row_ptr, tile_row, HAS_TILE_MAX, BLOCK, BLOCK_SIZE)
    entry = tl.arange(0, BLOCK)
    first_id = _first_key(entry, token)
    start = BLOCK
    more = stopping & _walk_goes_on(entry, token, first_id, num_stop, start)
    while more:
        entry, token = load_stop_block(stop_ids_ptr, slot, num_stop, start, BLOCK)
        used, old, tile = load_stop_olds(
            entry, token, stopping, num_stop, row_ptr, tile_row, begin, end, HAS_TILE_MAX,
            BLOCK_SIZE,
        )  # fmt: skip
        _ban_stops(token, used, old, tile, row_ptr, tile_row, HAS_TILE_MAX, BLOCK, BLOCK_SIZE)
        start += BLOCK
        more = _walk_goes_on(entry, token, first_id, num_stop, start)
