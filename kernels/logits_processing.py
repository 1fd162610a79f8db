"""docs/design.md §4 steps 2-6 in Triton, one program per row or per chunk of one: bad words,
logit bias, min_tokens, the allowed-token and grammar bitmasks, repetition/frequency/presence
penalties, temperature, from the raw logits (any float dtype) into a float32 buffer.

The key idea: one dense pass reads each raw element once and writes it once (no float32 copy
first); the few sparse tokens are then fixed up: the biased ones recomputed from their raw
value plus the bias, the saturated ones (penalty count byte 255, the excess in the slot's
overflow table) given their excess and then their temperature, and last min_tokens' stop ids
and the bad words' banned tokens set to -inf (which every other step keeps at -inf), so no
tile compares its tokens against a sparse table. All arithmetic is float32, rounded as IEEE
division rounds, and no fused multiply-add but the division's own (`library.divide_by`, by
a reciprocal computed once a row; a chunk it cannot vouch for is made again with div_rn),
so the row equals the PyTorch backend's bit for bit (with the defer tables, before its
temperature, which the readers apply). Custom processors are not here. The phases and
their order, the exactness and the traffic per row: docs/kernels.md, logits processing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bad_words import ban_bad_words, check_bad_words, load_bad_ring, load_bad_tables
from .constants import GREEDY_TEMPERATURE, SATURATED
from .dependent_launch import await_prior_grids, pdl_launch
from .library import (
    PIPELINE_STAGES,
    TILE,
    SplitPolicy,
    check_arrivals,
    check_logits,
    check_raw_tiles,
    check_rows,
    check_table,
    check_tile_max,
    hoisted_reciprocal,
    inplace_op,
    last_to_arrive,
    split_chunks,
)
from .processed_rows import check_defer, defer_row
from .row_params import check_row_params, load_slot_params, store_row_params
from .sparse_phases import (
    apply_bias,
    apply_excess,
    ban_stop_ids,
    load_bias_block,
    load_excess_head,
    load_stop_block,
    load_stop_olds,
)
from .token_steps import check_drafts, dense_tile, mark_unknown, raw_pass


@triton.jit
def _process_logits_kernel(
    source_ptr,  # [num_rows, V] float32, float16 or bfloat16, read only
    source_stride,  # elements between rows
    logits_ptr,  # [num_rows, V] float32, written
    logits_stride,  # elements between rows
    slots_ptr,  # [num_rows] int64 row -> slot
    bias_ids_ptr,  # [num_slots, C] int32
    bias_values_ptr,  # [num_slots, C] float32 (used entries first; unused: 0 or the first's)
    min_tokens_ptr,  # [num_slots] int32
    num_generated_ptr,  # [num_slots] int32
    stop_ids_ptr,  # [num_slots, S] int32 (unique, used entries first, the rest the first)
    allowed_ptr,  # [num_slots, W] int32 bitmask
    grammar_ptr,  # [num_rows, W] int32 bitmask (HAS_GRAMMAR)
    counts_ptr,  # [num_slots, V] uint8: output count, 255 = saturated
    overflow_token_ptr,  # [num_slots, E + 1] int32 (-1 = unused; column E never read)
    overflow_excess_ptr,  # [num_slots, E + 1] int32: count - 255 of a saturated token
    prompt_mask_ptr,  # [num_slots, W] int32 bitmask
    output_words_ptr,  # [num_slots, ceil(W / 32)] int32: bit w, word w holds an output
    repetition_ptr,  # [num_slots] float32
    frequency_ptr,  # [num_slots] float32
    presence_ptr,  # [num_slots] float32
    temperature_ptr,  # [num_slots] float32
    drafts_ptr,  # [num_rows, D] int64 (HAS_DRAFTS): drafted ids before each row's position
    num_preceding_ptr,  # [num_rows] int64 (HAS_DRAFTS): how many of them precede the row
    bad_tokens_ptr,  # [num_slots, T] int32 (HAS_BAD_WORDS): the bad-words stage's tables
    bad_back_ptr,  # [num_slots, T] int32
    bad_word_ptr,  # [num_slots, T] int32
    window_ptr,  # [num_slots, L] int32: the last L outputs, output g at g % L
    tile_max_ptr,  # [num_rows, ceil(V / BLOCK_SIZE)] float32, written (HAS_TILE_MAX)
    raw_tiles_ptr,  # [num_rows, ceil(V / BLOCK_SIZE), 2] float32, written (HAS_RAW_TILES)
    restricted_ptr,  # [num_slots] int32 (DEFER): 1 = an allowed-token list
    biased_ptr,  # [num_slots] int32 (DEFER): 1 = a nonzero logit bias
    grammar_on_ptr,  # [num_rows] bool (DEFER): a grammar constrains the row
    deferred_ptr,  # [num_rows] int32, written (DEFER): 1 = the row left unwritten
    # RESOLVE: the slot tables of the kernels after this one, and their rows' records
    # (kernels/row_params.py), written
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seeds_ptr,
    prompt_len_ptr,
    filters_ptr,
    keys_ptr,
    arrivals_ptr,  # [num_rows] int32 (ROW_SPARSE): 0, counted up and left 0 (`last_to_arrive`)
    vocab_size,
    num_words,  # W = ceil(V / 32)
    num_bias,  # C
    num_stop,  # S
    num_overflow,  # E, the used entries' capacity (the tables have E + 1 columns)
    num_drafts,  # D
    num_bad,  # T
    window_len,  # L
    chunk,  # columns a program processes: whole tiles (the row, unsplit)
    GREEDY_BELOW: tl.constexpr,
    SATURATED: tl.constexpr,
    HAS_GRAMMAR: tl.constexpr,
    HAS_DRAFTS: tl.constexpr,
    HAS_BAD_WORDS: tl.constexpr,
    HAS_TILE_MAX: tl.constexpr,
    HAS_RAW_TILES: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr,
    BAD_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    # False only in the GPU check's probe of what the dense pass's [B, V] store costs: the
    # logits are left unwritten but for the sparse phases' tokens, which those phases then
    # make from the unwritten ones (a wrong output, and wrong tile maxima where they act)
    STORE_LOGITS: tl.constexpr,
    # rows that every step leaves as they are go unwritten, flagged in `deferred`, and no
    # row takes its temperature (`load_deferred`: the readers divide)
    DEFER: tl.constexpr,
    RESOLVE: tl.constexpr = False,
    # the count bytes read only in the words the output words mark (`token_steps`)
    HAS_OUTPUT_WORDS: tl.constexpr = False,
    # a split row's sparse phases made by its last program to arrive, over the whole row
    ROW_SPARSE: tl.constexpr = False,
):
    """Steps 1-7 of docs/kernels.md, logits processing (the comments carry their numbers),
    from `source` into `logits`, with a barrier after each phase whose stores the next one
    reads or overwrites: the dense pass (steps 3-6), the biased tokens again from their
    source value plus the bias (steps 1, 3-6), step 7, then the -inf stores (step 2).
    With HAS_TILE_MAX the dense pass also writes each tile's largest logit, which the bias,
    stop ids and bad words keep exact (`update_tiles`) and step 7 marks unknown (+inf). With
    HAS_RAW_TILES it writes each tile's max and sum of exp of the *source* (`raw_tile_stats`),
    from which logprobs in the raw modes take the logsumexp without reading the row again.

    A row may be split over programs (grid rows x splits), each owning the whole tiles of
    [begin, end) in the dense pass. With ROW_SPARSE the row's last program to arrive then
    makes the phases after it over the whole row, once the others' stores are visible;
    without it, each program makes them on its own columns only (reading the sparse tables
    whole). Either way one program makes every store to a column after the dense pass's,
    so the barriers order them."""
    await_prior_grids(PDL)
    row = tl.program_id(0)
    begin = tl.program_id(1) * chunk
    end = tl.minimum(begin + chunk, vocab_size)
    slot = tl.load(slots_ptr + row)
    source_row = source_ptr + row.to(tl.int64) * source_stride
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    preceding = 0
    if HAS_DRAFTS:
        preceding = tl.load(num_preceding_ptr + row).to(tl.int32)
    repetition = tl.load(repetition_ptr + slot)
    frequency = tl.load(frequency_ptr + slot)
    presence = tl.load(presence_ptr + slot)
    penalties_on = (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0)
    # with frequency 0 the excess changes nothing (l + -(0 * excess) == l): no step 7
    fix_excess = frequency != 0.0
    temperature = tl.load(temperature_ptr + slot)
    scale_on = (temperature >= GREEDY_BELOW) & (temperature != 1.0)
    # step 2's, loaded with the others: after the dense pass a load here starts a round
    generated = tl.load(num_generated_ptr + slot)
    min_tokens = tl.load(min_tokens_ptr + slot)
    if RESOLVE:  # the later kernels' parameters, in this round too (stored below)
        resolved = load_slot_params(
            slot, top_k_ptr, top_p_ptr, min_p_ptr, seeds_ptr, prompt_len_ptr, vocab_size
        )
    allowed_row = allowed_ptr + slot * num_words
    prompt_row = prompt_mask_ptr + slot * num_words
    grammar_row = grammar_ptr + row.to(tl.int64) * num_words
    counts_row = counts_ptr + slot.to(tl.int64) * vocab_size
    output_row = output_words_ptr + slot * tl.cdiv(num_words, 32)
    tile_row = tile_max_ptr + row.to(tl.int64) * tl.cdiv(vocab_size, BLOCK_SIZE)
    raw_row = raw_tiles_ptr + row.to(tl.int64) * tl.cdiv(vocab_size, BLOCK_SIZE) * 2
    # DEFER: a row no step but its temperature changes (no penalty, allowed list, grammar,
    # bias, stop ids in force nor bad words) is left unwritten, for the kernels after this
    # one to read its source; no phase below touches it. The rows written and the tile
    # tables are left before the temperature, for the readers (docs/kernels.md)
    store = tl.full((), True, tl.int1)
    masks_on = tl.full((), True, tl.int1)
    if DEFER:
        store, masks_on = defer_row(
            row, slot, penalties_on, generated + preceding >= min_tokens, scale_on,
            temperature, restricted_ptr, biased_ptr, grammar_on_ptr, bad_back_ptr, num_bad,
            deferred_ptr, HAS_BAD_WORDS,
        )  # fmt: skip
        scale_on = tl.zeros((), tl.int1)  # no row's temperature here: every step's off
    if RESOLVE:  # for the kernels after this one, which load them by row (row_params.py)
        first = tl.program_id(1) == 0
        store_row_params(filters_ptr, keys_ptr, row, resolved, temperature, generated, first)
    # a deferred random row that no filter cuts (the fused path's: RESOLVE) takes no dense
    # pass: its tiles are marked unknown for sampling's walk, its table's one reader, which
    # hashes nearly all of such a row anyway (docs/kernels.md, deferred rows)
    pass_end = end
    if RESOLVE and DEFER and HAS_TILE_MAX and (not HAS_RAW_TILES):
        unread = ~store & (temperature >= GREEDY_BELOW) & (resolved[0] == 0)
        unread &= (resolved[1] >= 1.0) & (resolved[2] == 0.0)  # (a NaN top_p is off too)
        pass_end = tl.where(unread, begin, end)
        if unread:
            mark_unknown(tile_row, begin, end, BLOCK_SIZE)
    elif DEFER and HAS_RAW_TILES:  # a deferred row's pass: `raw_pass`, after the loops
        pass_end = tl.where(store, end, begin)
    # the divisors with their reciprocals, for the dense pass's divisions (token_steps'
    # `divide`); outside divide_by's range, the chunk is made again with IEEE division
    repetition_inv, repetition_in_range = hoisted_reciprocal(repetition)
    temperature_inv, temperature_in_range = hoisted_reciprocal(temperature)
    repetition_divisor = (repetition, repetition_inv)
    temperature_divisor = (temperature, temperature_inv)

    # 3-6. the dense pass: every token read once, written once. A tile holding a quotient
    # the hoisted reciprocals may round apart from IEEE division (or a NaN; with the tile
    # maxima, a +inf) has the chunk made again with IEEE division: never, for an LLM's
    # logits. The row's partial last tile goes first, alone, so that the main loop's tiles
    # are whole and unmasked (about 14 SASS instructions a tile a thread fewer), in a
    # pipelined loop of at most one tile: its loads issued at once, not in three rounds
    full_end = begin + (pass_end - begin) // BLOCK_SIZE * BLOCK_SIZE
    redo = (penalties_on & ~repetition_in_range) | (scale_on & ~temperature_in_range)
    # what every tile of the row takes besides its start and its constexprs
    row_args = (
        end, num_words, source_row, row_ptr, tile_row, raw_row, row, allowed_row, grammar_row,
        prompt_row, counts_row, output_row, drafts_ptr, preceding, num_drafts, penalties_on,
        repetition_divisor, frequency, presence, fix_excess, scale_on, temperature_divisor,
        store, masks_on,
    )  # fmt: skip
    for start in tl.range(full_end, pass_end, BLOCK_SIZE, num_stages=PIPELINE_STAGES):
        redo |= dense_tile(
            start, *row_args, SATURATED, HAS_GRAMMAR, HAS_DRAFTS, HAS_TILE_MAX, HAS_RAW_TILES,
            BLOCK_SIZE, EXACT=HAS_DRAFTS, FULL=False, STORE_LOGITS=STORE_LOGITS, DEFER=DEFER,
            HAS_OUTPUT_WORDS=HAS_OUTPUT_WORDS,
        )  # fmt: skip
    for start in tl.range(begin, full_end, BLOCK_SIZE, num_stages=PIPELINE_STAGES):
        redo |= dense_tile(
            start, *row_args, SATURATED, HAS_GRAMMAR, HAS_DRAFTS, HAS_TILE_MAX, HAS_RAW_TILES,
            BLOCK_SIZE, EXACT=HAS_DRAFTS, FULL=True, STORE_LOGITS=STORE_LOGITS, DEFER=DEFER,
            HAS_OUTPUT_WORDS=HAS_OUTPUT_WORDS,
        )  # fmt: skip
    # with drafts (the rejection sampler's rows) the first pass is already IEEE division:
    # the drafts' counts and the range checks together spilled under the register cap
    if redo & (not HAS_DRAFTS):
        tl.debug_barrier()  # the tile maxima: a first pass's entry must not land after
        for start in tl.range(begin, pass_end, BLOCK_SIZE):
            dense_tile(
                start, *row_args, SATURATED, HAS_GRAMMAR, HAS_DRAFTS, HAS_TILE_MAX,
                HAS_RAW_TILES, BLOCK_SIZE, EXACT=True, FULL=False, STORE_LOGITS=STORE_LOGITS,
                DEFER=DEFER, HAS_OUTPUT_WORDS=HAS_OUTPUT_WORDS,
            )  # fmt: skip
    if DEFER and HAS_RAW_TILES:  # the deferred rows' pass: the loops above left them none
        raw_pass(begin, tl.where(store, begin, end), source_row, tile_row, raw_row,
                 HAS_TILE_MAX, BLOCK_SIZE)  # fmt: skip
    # A deferred row (DEFER) has nothing for the phases below to do (no bias, stop ids in
    # force, bad words nor excess): it skips them, their tables' loads and their barriers;
    # without DEFER `store` is a constant and the branch folds away
    if store:
        # The sparse phases' tables (their first blocks) depend on the slot alone: loaded here,
        # in one round, and the bad words' ring in the next, beside the bias phase's loads
        # (sparse_phases.py: loaded phase by phase, each table waited behind the phase before)
        bias_block = load_bias_block(bias_ids_ptr, bias_values_ptr, slot, num_bias, 0, SPARSE_BLOCK)
        excess_head = load_excess_head(overflow_token_ptr, overflow_excess_ptr, slot, num_overflow)
        stop_block = load_stop_block(stop_ids_ptr, slot, num_stop, 0, SPARSE_BLOCK)
        if HAS_BAD_WORDS:
            bad_tables = load_bad_tables(
                slot, bad_tokens_ptr, bad_back_ptr, bad_word_ptr, num_bad, 0, BAD_BLOCK
            )
        # the biased tokens are rewritten below, by other threads than the dense pass's
        tl.debug_barrier()
        # The phases below are the row's: with ROW_SPARSE (a split row, with its counters)
        # its last program to finish the dense pass makes them over the whole row, once the
        # others' stores are visible (`last_to_arrive`: each arrival releases, the last
        # acquires), not each program on its own columns. The tables' loads above are
        # issued before the arrival, in its round; the ring's after it
        first_col, last_col = begin, end
        row_sparse = tl.full((), True, tl.int1)
        if ROW_SPARSE:
            # but a full overflow table with the temperature taken here, whose step 7 makes
            # every tile again (`apply_excess`): each program its own (never with DEFER)
            spread = excess_head[1] & fix_excess & scale_on
            row_sparse = last_to_arrive(arrivals_ptr + row, tl.num_programs(1)) | spread
            first_col = tl.where(spread, begin, 0)
            last_col = tl.where(spread, end, vocab_size)
        if row_sparse:
            if HAS_BAD_WORDS:  # the ring's round, beside the bias phase's loads
                bad_block = load_bad_ring(
                    bad_tables, row, slot, generated, preceding, window_ptr, drafts_ptr,
                    window_len, num_drafts, HAS_DRAFTS,
                )  # fmt: skip
            # 1. logit bias, then steps 3-6 again on those tokens
            apply_bias(
                *bias_block, bias_ids_ptr, bias_values_ptr, slot, num_bias, source_row,
                row_ptr, tile_row, first_col, last_col, row, allowed_row, grammar_row,
                prompt_row, counts_row, drafts_ptr, preceding, num_drafts, penalties_on,
                repetition_divisor, frequency, presence, fix_excess, scale_on,
                temperature_divisor, SATURATED, HAS_GRAMMAR, HAS_DRAFTS, HAS_TILE_MAX,
                SPARSE_BLOCK, BLOCK_SIZE,
            )  # fmt: skip
            # step 7 reads what other threads of this program stored above
            tl.debug_barrier()

            # 7. the saturated tokens' excess, then their temperature
            if fix_excess:
                apply_excess(
                    *excess_head, overflow_token_ptr, overflow_excess_ptr, num_overflow,
                    row_ptr, tile_row, counts_row, first_col, last_col, frequency, scale_on,
                    temperature, SATURATED, HAS_TILE_MAX, BLOCK_SIZE,
                )  # fmt: skip
            # a stop id or a banned token may be stored above by another thread: -inf last
            tl.debug_barrier()

            # 2. min_tokens, and bad words: both store -inf, so neither orders against the
            # other (a masked or penalised -inf stays -inf through steps 3-7, so -inf last
            # is the same), and the stop ids' old logits are loaded before the bad words'
            # stores: one round
            stopping = generated + preceding < min_tokens
            stop_entry, stop_token = stop_block
            stop_olds = load_stop_olds(
                stop_entry, stop_token, stopping, num_stop, row_ptr, tile_row, first_col,
                last_col, HAS_TILE_MAX, BLOCK_SIZE,
            )  # fmt: skip
            if HAS_BAD_WORDS:
                ban_bad_words(
                    *bad_block, row_ptr, row, slot, generated, preceding, bad_tokens_ptr,
                    bad_back_ptr, bad_word_ptr, window_ptr, drafts_ptr, tile_row, first_col,
                    last_col, num_bad, window_len, num_drafts, HAS_DRAFTS, HAS_TILE_MAX,
                    BAD_BLOCK, BLOCK_SIZE,
                )  # fmt: skip
            ban_stop_ids(
                stop_token, *stop_olds, stopping, stop_ids_ptr, slot, num_stop, row_ptr,
                tile_row, first_col, last_col, HAS_TILE_MAX, SPARSE_BLOCK, BLOCK_SIZE,
            )  # fmt: skip


process_splits = SplitPolicy(ctas_per_sm=4)
"""Programs per row for `process_logits` (`library.SplitPolicy`: at least one tile each).
4 CTAs an SM by construction: the launch caps registers at 64 (`max_registers`); uncapped,
ptxas took 72-80 without divisibility hints (3 CTAs) and 58 with them."""


def launch_process_logits(
    source: torch.Tensor,  # [num_rows, V] float32, float16 or bfloat16, read only
    logits: torch.Tensor,  # [num_rows, V] float32, written
    slots: torch.Tensor,  # [num_rows] int64
    bias_ids: torch.Tensor,  # [num_slots, C] int32
    bias_values: torch.Tensor,  # [num_slots, C] float32
    min_tokens: torch.Tensor,  # [num_slots] int32
    num_generated: torch.Tensor,  # [num_slots] int32
    stop_ids: torch.Tensor,  # [num_slots, S] int32
    allowed: torch.Tensor,  # [num_slots, W] int32
    grammar: torch.Tensor | None,  # [num_rows, W] int32, or None (no grammar)
    counts: torch.Tensor,  # [num_slots, V] uint8
    overflow_token: torch.Tensor,  # [num_slots, E + 1] int32
    overflow_excess: torch.Tensor,  # [num_slots, E + 1] int32
    prompt_mask: torch.Tensor,  # [num_slots, W] int32
    repetition: torch.Tensor,  # [num_slots] float32
    frequency: torch.Tensor,  # [num_slots] float32
    presence: torch.Tensor,  # [num_slots] float32
    temperature: torch.Tensor,  # [num_slots] float32
    drafts: torch.Tensor | None = None,  # [num_rows, D] int64 ids in [0, V)
    num_preceding: torch.Tensor | None = None,  # [num_rows] int64 in [0, D]
    bad_tokens: torch.Tensor | None = None,  # [num_slots, T] int32
    bad_back: torch.Tensor | None = None,  # [num_slots, T] int32
    bad_word: torch.Tensor | None = None,  # [num_slots, T] int32
    window: torch.Tensor | None = None,  # [num_slots, L] int32
    tile_max: torch.Tensor | None = None,  # [num_rows, ceil(V / block_size)] float32, written
    raw_tiles: torch.Tensor | None = None,  # [num_rows, ceil(V / block_size), 2], written
    block_size: int = TILE,
    sparse_block: int = 128,
    bad_block: int = 128,
    splits: int = 1,  # programs a row is split over (`process_splits`)
    store_logits: bool = True,  # False: the GPU check's probe (logits left mostly unwritten)
    # (restricted [num_slots] int32, biased [num_slots] int32, grammar_on [num_rows] bool,
    # deferred [num_rows] float32 written): leave the rows that only a temperature changes
    # (or none) unwritten
    defer: tuple[torch.Tensor, ...] | None = None,
    # (top_k, top_p, min_p, seeds, prompt_len [num_slots]; filters, keys [num_rows, ...]
    # written): the rows' records for the kernels after this one (`row_params`)
    resolve: tuple[torch.Tensor, ...] | None = None,
    output_words: torch.Tensor | None = None,  # [num_slots, ceil(W / 32)] int32: words output
    # [>= num_rows] int32, all 0 and left 0: a split row's phases after the dense pass made
    # by its last program to arrive (`library.last_to_arrive`); None: by each program
    arrivals: torch.Tensor | None = None,
) -> None:
    """Launch `_process_logits_kernel` over rows x splits; tables must be contiguous.
    Allocates nothing, returns None. store_logits False leaves out the dense pass's store
    of `logits` (only the sparse phases' tokens are written; the tile tables are), so
    that a timing shows what the [B, V] store costs: never for an output."""
    num_rows, vocab_size = logits.shape
    num_bad = bad_tokens.shape[1] if bad_tokens is not None else 0
    splits, chunk = split_chunks(vocab_size, splits, block_size)
    if arrivals is not None:
        check_arrivals(arrivals, num_rows, logits.device)
    # (not with drafts: with their counts, the last program's choice spilled 32 bytes)
    row_sparse = arrivals is not None and splits > 1 and drafts is None
    _process_logits_kernel[(num_rows, splits)](
        source, source.stride(0), logits, logits.stride(0), slots, bias_ids, bias_values,
        min_tokens, num_generated, stop_ids, allowed,
        grammar if grammar is not None else allowed,  # unread without HAS_GRAMMAR
        counts, overflow_token, overflow_excess, prompt_mask,
        output_words if output_words is not None else prompt_mask,  # unread without the mask
        repetition, frequency, presence, temperature,
        drafts if drafts is not None else slots,  # unread without HAS_DRAFTS
        num_preceding if num_preceding is not None else slots,
        bad_tokens if bad_tokens is not None else allowed,  # unread without HAS_BAD_WORDS
        bad_back if bad_back is not None else allowed,
        bad_word if bad_word is not None else allowed,
        window if window is not None else allowed,
        tile_max if tile_max is not None else logits,  # unwritten without HAS_TILE_MAX
        raw_tiles if raw_tiles is not None else logits,  # unwritten without HAS_RAW_TILES
        *(defer if defer is not None else (slots,) * 4),  # unread without DEFER
        *(resolve if resolve is not None else (slots,) * 7),  # unread without RESOLVE
        arrivals if row_sparse else slots,  # untouched without ROW_SPARSE
        vocab_size,
        allowed.shape[1],
        bias_ids.shape[1],
        stop_ids.shape[1],
        overflow_token.shape[1] - 1,
        drafts.shape[1] if drafts is not None else 0,
        num_bad,
        window.shape[1] if window is not None else 1,
        chunk,
        GREEDY_BELOW=GREEDY_TEMPERATURE,
        SATURATED=SATURATED,
        HAS_GRAMMAR=grammar is not None,
        HAS_DRAFTS=drafts is not None,
        HAS_BAD_WORDS=bad_tokens is not None,
        HAS_TILE_MAX=tile_max is not None,
        HAS_RAW_TILES=raw_tiles is not None,
        BLOCK_SIZE=block_size,
        SPARSE_BLOCK=sparse_block,
        BAD_BLOCK=min(triton.next_power_of_2(max(num_bad, 1)), bad_block),
        STORE_LOGITS=store_logits,
        DEFER=defer is not None,
        RESOLVE=resolve is not None,
        HAS_OUTPUT_WORDS=output_words is not None,
        ROW_SPARSE=row_sparse,
        # why: x - f * count must round twice, as torch's separate multiply and subtract do
        enable_fp_fusion=False,
        **pdl_launch(source.device),
        # 8 warps capped at 64 registers: 4 CTAs an SM and no spill with every feature (4
        # warps: 96 registers and a spill, once the bad-words scan joined the kernel)
        num_warps=8,
        maxnreg=process_splits.max_registers(8),
    )  # fmt: skip


@inplace_op(
    "process_logits",
    mutates_args=("logits", "tile_max", "raw_tiles", "deferred", "filters", "keys", "arrivals"),
)
def process_logits(
    source: torch.Tensor,
    logits: torch.Tensor,
    slots: torch.Tensor,
    bias_ids: torch.Tensor,
    bias_values: torch.Tensor,
    min_tokens: torch.Tensor,
    num_generated: torch.Tensor,
    stop_ids: torch.Tensor,
    allowed: torch.Tensor,
    grammar: torch.Tensor | None,
    counts: torch.Tensor,
    overflow_token: torch.Tensor,
    overflow_excess: torch.Tensor,
    prompt_mask: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    temperature: torch.Tensor,
    drafts: torch.Tensor | None = None,
    num_preceding: torch.Tensor | None = None,
    bad_tokens: torch.Tensor | None = None,
    bad_back: torch.Tensor | None = None,
    bad_word: torch.Tensor | None = None,
    window: torch.Tensor | None = None,
    splits: int = 1,
    tile_max: torch.Tensor | None = None,
    raw_tiles: torch.Tensor | None = None,
    restricted: torch.Tensor | None = None,
    biased: torch.Tensor | None = None,
    grammar_on: torch.Tensor | None = None,
    deferred: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    prompt_len: torch.Tensor | None = None,
    filters: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
    output_words: torch.Tensor | None = None,
    arrivals: torch.Tensor | None = None,
) -> None:
    """Bad words, logit bias, min_tokens, allowed and grammar bitmasks, penalties and
    temperature: `source` [num_rows, V] float32, float16 or bfloat16 (read only, its rows
    may be strided) processed into `logits` [num_rows, V] float32 (written; not overlapping
    `source`), in one pass (docs/kernels.md, logits processing).

    Per slot ([num_slots, ...]), the stages' layouts: bias_ids int32 / bias_values float32
    [C] (keys unique, used entries first, unused ones +0.0 or repeating the first);
    min_tokens, num_generated int32; stop_ids int32 [S] (unique, used entries first, unused
    ones repeating the first); allowed, prompt_mask int32 [ceil(V/32)]; counts uint8 [V]
    (the output count, 255 = saturated); overflow_token (-1 unused, used entries first) /
    overflow_excess int32 [E + 1] (a saturated token's count - 255; column E is the
    commit's spare, never read); repetition, frequency, presence, temperature float32.
    grammar: int32 [num_rows, ceil(V/32)] by row, or None. drafts int64 [num_rows, D] with
    num_preceding int64 [num_rows] (both or neither): a speculative step's drafted ids, of
    which the first num_preceding[r] precede row r's position and count as output tokens
    for the penalties, min_tokens and bad words. bad_tokens, bad_back, bad_word int32
    [num_slots, T] and window int32 [num_slots, L] (all four or none): the bad-words stage's
    layout (a word's entries contiguous, used entries first; back 0 marks the token to ban,
    -1 an unused entry; output g of a slot at g % L). splits: programs per row, each
    processing a chunk of whole tiles (`process_splits` picks it; the output does not
    depend on it). tile_max: float32 [num_rows, ceil(V / TILE)], written when given: each
    tile's largest processed logit, or +inf (unknown) where the tile holds NaN or a phase
    after the dense pass changed one of its logits (biased, stop ids, banned, saturated
    tokens; docs/kernels.md, tile maxima). raw_tiles: float32 [num_rows, ceil(V / TILE),
    2], written when given: each tile's max of `source` (+inf where it holds NaN) and sum
    of exp(source - that max), for `compute_logprobs` on it. restricted, biased int32
    [num_slots] (1: an allowed-token list, a nonzero logit bias), grammar_on bool
    [num_rows] (a grammar constrains the row) and deferred float32 [num_rows] (written),
    all four or none, and no drafts: a row no step but its temperature changes (no
    penalty, stop ids in force nor bad words either) is left unwritten, deferred[r] = the
    divisor that makes its processed logits of its `source` (its temperature, or 1), for
    the kernels after this one to read and divide (`processed_rows`); its tile tables are
    written as ever. No row then takes its temperature here: a written row, deferred[r] =
    minus its divisor, and every tile maximum are left before it, for the readers to
    divide too. The dense pass reads the allowed and grammar words only of the rows with
    an allowed list or a grammar: a row with neither must hold every bit set in both, as
    the stages keep them. top_k int32, top_p, min_p float32, seeds, prompt_len int64
    [num_slots] with filters float32 [num_rows, 4] and keys int64 [num_rows, 2] (written),
    all seven or none: the rows' records of the kernels after this one, resolved from the
    slots (kernels/row_params.py), which they then read by row. output_words int32
    [num_slots, ceil(ceil(V/32)/32)] (the penalties stage's: bit w set where a token of
    the 32-token word w has a count above 0), or None: where given, the dense pass reads
    the count bytes of the words holding an output only (the rest are 0). arrivals int32
    [>= num_rows], all 0, which the op leaves 0 (`library.last_to_arrive`): with splits >
    1, a row's phases after the dense pass are made once, by its last program to arrive;
    None: by each program on its own columns.
    """
    check_logits(logits)
    num_rows, vocab_size = logits.shape
    if source.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"source must be float32, float16 or bfloat16, got {source.dtype}")
    if source.shape != logits.shape or source.stride(1) != 1:
        raise ValueError(
            f"source must be [{num_rows}, {vocab_size}] with unit column stride, got shape "
            f"{tuple(source.shape)} and strides {source.stride()}"
        )
    check_rows("slots", slots, torch.int64, num_rows)
    num_slots, words = allowed.shape[0], (vocab_size + 31) // 32
    for name, t, dtype, shape in (
        ("bias_ids", bias_ids, torch.int32, (num_slots, None)),
        ("bias_values", bias_values, torch.float32, (num_slots, bias_ids.shape[-1])),
        ("min_tokens", min_tokens, torch.int32, (num_slots,)),
        ("num_generated", num_generated, torch.int32, (num_slots,)),
        ("stop_ids", stop_ids, torch.int32, (num_slots, None)),
        ("allowed", allowed, torch.int32, (num_slots, words)),
        ("counts", counts, torch.uint8, (num_slots, vocab_size)),
        ("overflow_token", overflow_token, torch.int32, (num_slots, None)),
        ("overflow_excess", overflow_excess, torch.int32, (num_slots, overflow_token.shape[-1])),
        ("prompt_mask", prompt_mask, torch.int32, (num_slots, words)),
        ("repetition", repetition, torch.float32, (num_slots,)),
        ("frequency", frequency, torch.float32, (num_slots,)),
        ("presence", presence, torch.float32, (num_slots,)),
        ("temperature", temperature, torch.float32, (num_slots,)),
    ):
        check_table(name, t, dtype, shape)
    if grammar is not None:
        check_table("grammar", grammar, torch.int32, (num_rows, words))
    if overflow_token.shape[1] < 2:
        raise ValueError(
            f"overflow_token must have E + 1 >= 2 columns, got {overflow_token.shape[1]}"
        )
    check_drafts(drafts, num_preceding, num_rows)
    check_bad_words(bad_tokens, bad_back, bad_word, window, num_slots)
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    if tile_max is not None:
        check_tile_max(tile_max, num_rows, vocab_size)
    if raw_tiles is not None:
        check_raw_tiles(raw_tiles, num_rows, vocab_size)
    defer = check_defer(restricted, biased, grammar_on, deferred, num_slots, num_rows, drafts)
    resolve = check_row_params(
        top_k, top_p, min_p, seeds, prompt_len, filters, keys, num_slots, num_rows
    )  # fmt: skip
    if output_words is not None:
        check_table("output_words", output_words, torch.int32, (num_slots, (words + 31) // 32))
    launch_process_logits(
        source, logits, slots, bias_ids, bias_values, min_tokens, num_generated, stop_ids,
        allowed, grammar, counts, overflow_token, overflow_excess, prompt_mask, repetition,
        frequency, presence, temperature, drafts, num_preceding, bad_tokens, bad_back,
        bad_word, window, tile_max, raw_tiles, splits=splits, defer=defer, resolve=resolve,
        output_words=output_words, arrivals=arrivals,
    )  # fmt: skip
