"""Steps 3-6 of logits processing on a set of tokens, in Triton: the allowed and grammar
bitmasks, the repetition, frequency and presence penalties, and the temperature, in float32
rounded as the PyTorch stage rounds (docs/kernels.md, logits processing). Shared by the
dense pass over every tile (`dense_tile`, which kernels/logits_processing.py runs, with the
tile's statistics) and the bias phase, which makes the biased tokens again
(kernels/sparse_phases.py); and a deferred row's pass, which takes no step but makes the
raw tiles (`raw_pass`). `check_drafts` checks the drafts whose counts the penalties take."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .library import PIPELINE_STAGES, check_rows, divide_by, max_or_nan, raw_tile_stats, together


def check_drafts(
    drafts: torch.Tensor | None, num_preceding: torch.Tensor | None, num_rows: int
) -> None:
    """Raise unless `drafts` (a contiguous int64 [num_rows, D >= 1]) and `num_preceding`
    (int64 [num_rows]) are both given or both None: the drafted ids whose counts the
    penalties take (`penalise_and_scale`'s HAS_DRAFTS)."""
    spec = together("drafts and num_preceding", drafts, num_preceding)
    if spec is None:
        return
    if spec[0].dtype != torch.int64:
        raise TypeError(f"drafts must be torch.int64, got {spec[0].dtype}")
    if spec[0].dim() != 2 or spec[0].shape[0] != num_rows or not spec[0].is_contiguous():
        raise ValueError(
            f"drafts must be a contiguous [{num_rows}, D] tensor, got shape {tuple(spec[0].shape)}"
        )
    check_rows("num_preceding", spec[1], torch.int64, num_rows)
    if spec[0].shape[1] == 0:
        raise ValueError("drafts must have at least one column (D >= 1)")


@triton.jit
def bit_is_set(words, bit):
    """Bit `bit` = t % 32 of the int32 `words` loaded at t // 32 (xgrammar's layout); a
    column of words [N / 32, 1] against a row `bit` [1, 32] loads each word once. The
    callers load the words of the row (a token id, a masked-off one included, is always in
    [0, V)), all of them before any is used: a warp issues in order, so a load after a use
    of loaded data waits a memory latency more."""
    # an arithmetic shift of a negative word still leaves the wanted bit at position 0
    return ((words >> bit) & 1) != 0


@triton.jit
def penalise_and_scale(
    x,  # [N] float32 logits of tokens `cols`
    bias,  # [N] float32 added to x first (the bias phase), or None (a dense pass)
    cols,  # [N] int32 token ids
    word,  # [N] (or [N / 32, 1]) int32: cols // 32, the tokens' words in the bitmasks
    bit,  # [N] (or [1, 32]) int32: cols % 32, their bits there
    in_row,  # [N] bool
    row,
    allowed_row,  # the slot's allowed bitmask
    grammar_row,  # the row's grammar bitmask (HAS_GRAMMAR)
    prompt_row,  # the slot's prompt bitmask
    counts_row,  # the slot's count bytes
    output_at,  # (HAS_OUTPUT_WORDS) pointers to the output words' int32 of each token's word
    output_bit,  # (HAS_OUTPUT_WORDS) that word's bit there: its bytes are read where it is set
    drafts_ptr,
    preceding,
    num_drafts,
    penalties_on,
    repetition,  # (d, RN(1/d)): the divisor and `library.hoisted_reciprocal`'s reciprocal
    frequency,
    presence,
    fix_excess,
    scale_on,
    temperature,  # (d, RN(1/d)), as repetition
    masks_on,  # the row's scalar: an allowed list or a grammar (GATE_MASKS)
    SATURATED: tl.constexpr,
    HAS_GRAMMAR: tl.constexpr,
    HAS_DRAFTS: tl.constexpr,
    EXACT: tl.constexpr,  # IEEE division (div_rn); else `library.divide_by`
    # the dense pass's, with the row flags: a row with no allowed list and no grammar
    # (`masks_on` False, whose words are all ones) loads no word and tests no bit
    GATE_MASKS: tl.constexpr,
    HAS_OUTPUT_WORDS: tl.constexpr = False,
):
    """Steps 3-6 on the tokens `cols` -> logits: a saturated token (byte 255, frequency on)
    is left without its temperature, which step 7 applies after its excess. A token whose
    quotient `divide_by` may not round as IEEE division (never with EXACT) comes out NaN
    (`divide`), for the caller to compute again with EXACT."""
    # 3-4. bitmasks. Gated, the loads are masked off (a scalar mask: the pipelined loop
    # still copies them ahead, zero-filled), and their words read only where `masks_on`
    if GATE_MASKS:
        # (a select, not a broadcast: the interpreter takes no broadcast view for a mask)
        gate = tl.where(masks_on, tl.full(word.shape, True, tl.int1), False)
        allowed_words = tl.load(allowed_row + word, mask=gate, other=0)
    else:
        allowed_words = tl.load(allowed_row + word)
    grammar_words = allowed_words
    if HAS_GRAMMAR:
        if GATE_MASKS:
            grammar_words = tl.load(grammar_row + word, mask=gate, other=0)
        else:
            grammar_words = tl.load(grammar_row + word)
    if HAS_OUTPUT_WORDS:
        # the output words' bits (one a 32-token word: a whole tile's in one int32), out
        # of the penalties' branch, so that the pipeline copies them ahead: the count
        # bytes then wait for their own load alone
        counting = tl.where(penalties_on, tl.full(word.shape, True, tl.int1), False)
        output_held = tl.load(output_at, mask=counting, other=0)
    if bias is not None:
        # the bias phase's tokens, a few, their loads unpipelined: the penalties' issued
        # with the words, and the bias added after them all, since the add waits for x
        # (tl.where, not &: the interpreter cannot & a scalar bool with a block of them)
        counted = tl.where(penalties_on, in_row, False)
        byte = tl.load(counts_row + cols, mask=counted, other=0).to(tl.int32)
        prompt_words = tl.load(prompt_row + word, mask=tl.where(penalties_on, word >= 0, False))
        x = x + bias
    if EXACT:  # masked first: `keep` is not held over the penalties (the same values)
        keep = _keep(allowed_words, grammar_words, bit, HAS_GRAMMAR)
        if GATE_MASKS:
            keep |= ~masks_on  # (a masked-off word is 0)
        x = tl.where(keep, x, float("-inf"))
    # 5. penalties with the byte count (a saturated token is charged 255 here)
    saturated = cols < 0
    if penalties_on:
        # a dense pass's: plain loads inside this branch, which the pipeline does not copy
        # ahead (hoisted out of the `if`, masked, it did: 295 -> 315 SASS instructions a
        # tile a thread, for one load latency less at a one-tile program, B = 1)
        if bias is None:
            counted = in_row
            if HAS_OUTPUT_WORDS:
                # only the bytes of the 32-token words holding an output: the rest are 0,
                # and a word's 32 share one mask, so a thread's loads stay one vector load
                counted = counted & bit_is_set(output_held, output_bit)
            byte = tl.load(counts_row + cols, mask=counted, other=0).to(tl.int32)
            prompt_words = tl.load(prompt_row + word)
        count = byte
        if HAS_DRAFTS:
            # clamped to the row's D drafts, as the PyTorch mask `column < preceding` is:
            # a device value past D must not read the next row's drafts
            for j in range(0, tl.minimum(preceding, num_drafts)):
                drafted = tl.load(drafts_ptr + row.to(tl.int64) * num_drafts + j)
                count += (cols == drafted).to(tl.int32)
        in_output = count > 0
        seen = in_output | bit_is_set(prompt_words, bit)
        quotient = divide(x, repetition, EXACT, POSITIVE=True)
        penalised = tl.where(x > 0.0, quotient, x * repetition[0])
        x = tl.where(seen, penalised, x)
        x = x - frequency * count.to(tl.float32)
        # presence * (1.0 or 0.0), as the PyTorch stage multiplies: the products are the
        # penalty itself and a scalar zero (-0.0 for a negative penalty), so a select
        # between them, not a conversion and a multiply an element (with the drafts'
        # counts the select spilled 4 bytes under processing's register cap)
        if HAS_DRAFTS:
            x = x - presence * in_output.to(tl.float32)
        else:
            x = x - tl.where(in_output, presence, presence * 0.0)
        # tl.where, not &: the interpreter cannot & a scalar bool with a block of them
        saturated = tl.where(fix_excess, byte == SATURATED, False)
    # 6. temperature, except where step 7 still subtracts the excess first
    if scale_on:
        x = tl.where(saturated, x, divide(x, temperature, EXACT))
    # the masks last, so that no -inf of theirs reaches a fast division (outside its
    # range): a masked token is -inf either way, since -inf stays -inf through every step
    # (penalties > 0), so its mark is dropped with it
    if not EXACT:
        if GATE_MASKS:
            if masks_on:  # a branch on the row: a row without masks skips the bit tests
                x = tl.where(
                    _keep(allowed_words, grammar_words, bit, HAS_GRAMMAR), x, float("-inf")
                )
        else:
            x = tl.where(_keep(allowed_words, grammar_words, bit, HAS_GRAMMAR), x, float("-inf"))
    return x


@triton.jit
def _keep(allowed_words, grammar_words, bit, HAS_GRAMMAR: tl.constexpr):
    """Steps 3-4: whether the allowed list and the grammar keep each token."""
    keep = bit_is_set(allowed_words, bit)
    if HAS_GRAMMAR:
        keep &= bit_is_set(grammar_words, bit)
    return keep


@triton.jit
def divide(x, divisor, EXACT: tl.constexpr, POSITIVE: tl.constexpr = False):
    """x / d for divisor = (d, RN(1/d)): `library.divide_by`, NaN where x lies outside its
    range (the mark travels with the value: a quotient the next steps drop needs no second
    pass, a kept one makes its tile's max NaN), or with EXACT IEEE division. POSITIVE: the
    caller keeps the quotient only where x > 0 (the repetition penalty's), so the range
    test is one unsigned compare of x's bits: the positive floats in [2**-100, 2**104] are
    one run of bit patterns, and each x outside it, zero and negatives included, is marked
    (a dropped one harmlessly): 2 SASS instructions an element where the magnitude tests
    take 5."""
    if EXACT:
        return tl.math.div_rn(x, divisor[0])
    else:
        quotient, outside = divide_by(x, divisor[0], divisor[1])
        if POSITIVE:
            # 2**-100 is 0x0D800000, 2**104 is 0x73800000: x's bits less the first, read
            # unsigned, past the run's length (a negative x's wrap far past it)
            offset = x.to(tl.int32, bitcast=True) - 0x0D800000
            outside = offset.to(tl.uint32, bitcast=True) > 0x66000000
        return tl.where(outside, float("nan"), quotient)


@triton.jit
def dense_tile(
    start, end, num_words, source_row, row_ptr, tile_row, raw_row, row, allowed_row,
    grammar_row, prompt_row, counts_row, output_row, drafts_ptr, preceding, num_drafts,
    penalties_on, repetition, frequency, presence, fix_excess, scale_on, temperature, store,
    masks_on,
    SATURATED: tl.constexpr, HAS_GRAMMAR: tl.constexpr, HAS_DRAFTS: tl.constexpr,
    HAS_TILE_MAX: tl.constexpr, HAS_RAW_TILES: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    EXACT: tl.constexpr, FULL: tl.constexpr, STORE_LOGITS: tl.constexpr, DEFER: tl.constexpr,
    HAS_OUTPUT_WORDS: tl.constexpr = False,
):  # fmt: skip
    """Steps 3-6 on the tile at `start`, read once and written once, with its raw and
    processed statistics -> whether the tile must be made again with EXACT: it holds NaN
    (a quotient outside the fast divisions' range, or a NaN logit) or, with HAS_TILE_MAX,
    +inf. The tile is [BLOCK_SIZE / 32, 32], a bitmask word a row: each word loaded once,
    and the bit positions loop-invariant. FULL: the tile lies inside the row (start +
    BLOCK_SIZE <= end), so no load, store or reduction is masked. STORE_LOGITS False: the
    tile's logits are not stored (its statistics are), for the GPU check's timing probe;
    with DEFER, only where `store` (the row's scalar: not a row left as it is), and without
    step 6: the logits and the tile's max are the pre-temperature ones, which the readers
    divide (docs/kernels.md, the temperature on read)."""
    WORD_COLS: tl.constexpr = min(32, BLOCK_SIZE)
    # start >= 0, told to the compiler and used in shifts: a signed // or % by a power of
    # two takes a sign fix-up, and the tile-table offsets below become induction variables
    # (254 -> 249 SASS instructions a tile a thread; either alone saved 2-3). Not with the
    # drafts' counts, whose variant it spilled (4 bytes, with the grammar)
    if not HAS_DRAFTS:
        tl.assume(start >= 0)
    tile_row_ids = tl.arange(0, BLOCK_SIZE // WORD_COLS)[:, None]
    tile_col_ids = tl.arange(0, WORD_COLS)[None, :]
    cols = start + tile_row_ids * WORD_COLS + tile_col_ids  # [BLOCK_SIZE / 32, 32]
    if FULL:  # a constant: the masks and the selects on them fold away
        in_row = tl.full([BLOCK_SIZE // WORD_COLS, WORD_COLS], True, tl.int1)
        word = (start >> 5) + tile_row_ids
    else:
        in_row = cols < end
        # clamped, not masked (a mask spilled): tokens past the end are out of `in_row`
        word = tl.minimum((start >> 5) + tile_row_ids, num_words - 1)
    bit = tile_col_ids  # [1, 32]
    if BLOCK_SIZE < 32:
        bit += start % 32
    # each word's bit in the output words, w % 32 of int32 w // 32 (the same int32 for a
    # whole 1,024-token tile, but that tile's one address and the tile row as the bit took
    # 3 SASS instructions a tile more than this)
    output_at = output_row + (word >> 5)
    output_bit = word & 31
    x = tl.load(source_row + cols, mask=in_row, other=0.0).to(tl.float32)
    if HAS_RAW_TILES:
        raw_max, raw_sum = raw_tile_stats(x, in_row)
        tl.store(raw_row + (start // BLOCK_SIZE) * 2, raw_max)
        tl.store(raw_row + (start // BLOCK_SIZE) * 2 + 1, raw_sum)
    x = penalise_and_scale(
        x, None, cols, word, bit, in_row, row, allowed_row, grammar_row, prompt_row, counts_row,
        output_at, output_bit, drafts_ptr, preceding, num_drafts, penalties_on, repetition,
        frequency, presence, fix_excess, scale_on, temperature, masks_on, SATURATED,
        HAS_GRAMMAR, HAS_DRAFTS, EXACT, GATE_MASKS=DEFER, HAS_OUTPUT_WORDS=HAS_OUTPUT_WORDS,
    )  # fmt: skip
    if STORE_LOGITS:
        if DEFER:
            # (tl.where, not &: the interpreter cannot & a scalar bool with a block)
            tl.store(row_ptr + cols, x, mask=tl.where(store, in_row, False))
        else:
            tl.store(row_ptr + cols, x, mask=in_row)
    if HAS_TILE_MAX:
        # the tile's largest logit, +inf where it holds NaN (a tile every consumer reads;
        # a marked quotient's tile is made again, with the table's entry)
        top = max_or_nan(tl.where(in_row, x, float("-inf")))
        top = tl.where(top == top, top, float("inf"))
        tl.store(tile_row + start // BLOCK_SIZE, top)
        return top == float("inf")
    else:
        top = max_or_nan(x)  # off the row: 0.0, never NaN
        return top != top


@triton.jit
def mark_unknown(tile_row, begin, end, BLOCK_SIZE: tl.constexpr):
    """+inf (unknown) at the tile-max entries of the tiles in [begin, end): what a reader
    takes for a tile it must read and reduce itself."""
    last = tl.cdiv(end, BLOCK_SIZE)
    for first in range(begin // BLOCK_SIZE, last, 128):
        tiles = first + tl.arange(0, 128)
        tl.store(tile_row + tiles, float("inf"), mask=tiles < last)


@triton.jit
def raw_pass(
    begin, end, source_row, tile_row, raw_row, HAS_TILE_MAX: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """A deferred row's dense pass where the raw tiles are made (DEFER, HAS_RAW_TILES): the
    row is its source (no step here: the readers divide), so its tile max before the
    temperature is the raw max, and each tile takes one reduction of max fewer, no bitmask
    or penalty branch and no store (docs/kernels.md, deferred rows). The partial last tile
    first, alone, so that the main loop's tiles are whole, as `dense_tile`'s are."""
    full_end = begin + (end - begin) // BLOCK_SIZE * BLOCK_SIZE
    for start in tl.range(full_end, end, BLOCK_SIZE, num_stages=PIPELINE_STAGES):
        _raw_tile(start, end, source_row, tile_row, raw_row, HAS_TILE_MAX, BLOCK_SIZE, False)
    for start in tl.range(begin, full_end, BLOCK_SIZE, num_stages=PIPELINE_STAGES):
        _raw_tile(start, end, source_row, tile_row, raw_row, HAS_TILE_MAX, BLOCK_SIZE, True)


@triton.jit
def _raw_tile(
    start, end, source_row, tile_row, raw_row, HAS_TILE_MAX: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, FULL: tl.constexpr,
):  # fmt: skip
    """`raw_pass`'s tile at `start`: its raw max and sum of exp, and that max as its entry.
    A block of [BLOCK_SIZE]: `dense_tile`'s [BLOCK_SIZE / 32, 32], the loop pipelined 3
    deep, spilled the grammar variant of the kernel (a sum may then round apart from a
    written row's, its reduction tree another: float32 rounding either way)."""
    cols = start + tl.arange(0, BLOCK_SIZE)
    in_row = tl.full([BLOCK_SIZE], True, tl.int1) if FULL else cols < end  # FULL: masks fold
    x = tl.load(source_row + cols, mask=in_row, other=0.0).to(tl.float32)
    raw_max, raw_sum = raw_tile_stats(x, in_row)
    tl.store(raw_row + (start // BLOCK_SIZE) * 2, raw_max)
    tl.store(raw_row + (start // BLOCK_SIZE) * 2 + 1, raw_sum)
    if HAS_TILE_MAX:
        tl.store(tile_row + start // BLOCK_SIZE, raw_max)
