"""docs/design.md §4 steps 2-6 in Triton, one program per row, in place: logit bias, min_tokens, the
allowed-token and grammar bitmasks, repetition/frequency/presence penalties, temperature.

The key idea: the sparse stores (the bias table, min_tokens' stop ids) go first, then one
dense pass reads and writes each element once; only the few saturated tokens (penalty count
byte 255, the excess in the slot's overflow table) are visited again, for their excess and
then their temperature, so no tile compares its tokens against the overflow table. All
arithmetic is float32 with IEEE division and no fused multiply-add, so the row equals the
PyTorch backend's bit for bit. Bad words and custom processors are not here. The step order,
why the excess step may skip the dense pass's temperature, the exactness and the traffic per
row: docs/kernels.md, logits processing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .constants import GREEDY_TEMPERATURE, SATURATED
from .library import check_logits, check_rows, check_table, inplace_op


@triton.jit
def _bit_is_set(words_ptr, cols, in_row):
    """Token t's bit in xgrammar's layout: bit t % 32 of int32 word t // 32."""
    words = tl.load(words_ptr + cols // 32, mask=in_row, other=-1)
    # an arithmetic shift of a negative word still leaves the wanted bit at position 0
    return ((words >> (cols % 32)) & 1) != 0


@triton.jit
def _process_logits_kernel(
    logits_ptr,  # [num_rows, V] float32, updated in place
    logits_stride,  # elements between rows
    slots_ptr,  # [num_rows] int64 row -> slot
    bias_ids_ptr,  # [num_slots, C] int32
    bias_values_ptr,  # [num_slots, C] float32 (0 = unused)
    min_tokens_ptr,  # [num_slots] int32
    num_generated_ptr,  # [num_slots] int32
    stop_ids_ptr,  # [num_slots, S] int32
    allowed_ptr,  # [num_slots, W] int32 bitmask
    grammar_ptr,  # [num_rows, W] int32 bitmask (HAS_GRAMMAR)
    counts_ptr,  # [num_slots, V] uint8: output count, 255 = saturated
    overflow_token_ptr,  # [num_slots, E + 1] int32 (-1 = unused; column E never read)
    overflow_excess_ptr,  # [num_slots, E + 1] int32: count - 255 of a saturated token
    prompt_mask_ptr,  # [num_slots, W] int32 bitmask
    repetition_ptr,  # [num_slots] float32
    frequency_ptr,  # [num_slots] float32
    presence_ptr,  # [num_slots] float32
    temperature_ptr,  # [num_slots] float32
    drafts_ptr,  # [num_rows, D] int64 (HAS_DRAFTS): drafted ids before each row's position
    num_preceding_ptr,  # [num_rows] int64 (HAS_DRAFTS): how many of them precede the row
    vocab_size,
    num_words,  # W = ceil(V / 32)
    num_bias,  # C
    num_stop,  # S
    num_overflow,  # E, the used entries' capacity (the tables have E + 1 columns)
    num_drafts,  # D
    GREEDY_BELOW: tl.constexpr,
    SATURATED: tl.constexpr,
    HAS_GRAMMAR: tl.constexpr,
    HAS_DRAFTS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr,
):
    """Steps 1-7 of docs/kernels.md, logits processing (the comments carry their numbers),
    with a barrier after each phase whose stores the next one reads or overwrites."""
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride

    # 1. logit bias: keys are unique within a slot, so no two lanes touch one token
    for start in range(0, num_bias, SPARSE_BLOCK):
        entry = start + tl.arange(0, SPARSE_BLOCK)
        used = entry < num_bias
        value = tl.load(bias_values_ptr + slot * num_bias + entry, mask=used, other=0.0)
        used &= value != 0.0
        token = tl.load(bias_ids_ptr + slot * num_bias + entry, mask=used, other=0)
        x = tl.load(row_ptr + token, mask=used, other=0.0)
        tl.store(row_ptr + token, x + value, mask=used)
    # a stop id with a bias may be stored above by another thread: -inf must land last
    tl.debug_barrier()
    # 2. min_tokens
    preceding = 0
    if HAS_DRAFTS:
        preceding = tl.load(num_preceding_ptr + row).to(tl.int32)
    if tl.load(num_generated_ptr + slot) + preceding < tl.load(min_tokens_ptr + slot):
        for start in range(0, num_stop, SPARSE_BLOCK):
            entry = start + tl.arange(0, SPARSE_BLOCK)
            used = entry < num_stop
            token = tl.load(stop_ids_ptr + slot * num_stop + entry, mask=used, other=0)
            tl.store(row_ptr + token, tl.full((SPARSE_BLOCK,), float("-inf"), tl.float32), used)
    # the dense pass below reads what other threads of this program stored above
    tl.debug_barrier()

    repetition = tl.load(repetition_ptr + slot)
    frequency = tl.load(frequency_ptr + slot)
    presence = tl.load(presence_ptr + slot)
    penalties_on = (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0)
    # with frequency 0 the excess changes nothing (l + -(0 * excess) == l): no step 7
    fix_excess = frequency != 0.0
    temperature = tl.load(temperature_ptr + slot)
    scale_on = (temperature >= GREEDY_BELOW) & (temperature != 1.0)
    allowed_row = allowed_ptr + slot * num_words
    prompt_row = prompt_mask_ptr + slot * num_words
    grammar_row = grammar_ptr + row.to(tl.int64) * num_words
    counts_row = counts_ptr + slot.to(tl.int64) * vocab_size
    for start in range(0, vocab_size, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        in_row = cols < vocab_size
        x = tl.load(row_ptr + cols, mask=in_row, other=0.0)
        # 3-4. bitmasks
        keep = _bit_is_set(allowed_row, cols, in_row)
        if HAS_GRAMMAR:
            keep &= _bit_is_set(grammar_row, cols, in_row)
        x = tl.where(keep, x, float("-inf"))
        # 5. penalties with the byte count (a saturated token is charged 255 here)
        saturated = tl.zeros((BLOCK_SIZE,), tl.int1)
        if penalties_on:
            byte = tl.load(counts_row + cols, mask=in_row, other=0).to(tl.int32)
            count = byte
            if HAS_DRAFTS:
                # clamped to the row's D drafts, as the PyTorch mask `column < preceding` is:
                # a device value past D must not read the next row's drafts
                for j in range(0, tl.minimum(preceding, num_drafts)):
                    drafted = tl.load(drafts_ptr + row.to(tl.int64) * num_drafts + j)
                    count += (cols == drafted).to(tl.int32)
            in_output = count > 0
            seen = in_output | _bit_is_set(prompt_row, cols, in_row)
            penalised = tl.where(x > 0.0, tl.math.div_rn(x, repetition), x * repetition)
            x = tl.where(seen, penalised, x)
            x = x - frequency * count.to(tl.float32)
            x = x - presence * in_output.to(tl.float32)
            # tl.where, not &: the interpreter cannot & a scalar bool with a block of them
            saturated = tl.where(fix_excess, byte == SATURATED, False)
        # 6. temperature, except where step 7 still subtracts the excess first
        if scale_on:
            x = tl.where(saturated, x, tl.math.div_rn(x, temperature))
        tl.store(row_ptr + cols, x, mask=in_row)

    # 7. the saturated tokens' excess, then their temperature
    if fix_excess:
        # step 7 reads what other threads of this program stored in the dense pass
        tl.debug_barrier()
        table_row = slot.to(tl.int64) * (num_overflow + 1)
        # the table fills in order: a used last entry means it is full (docs/kernels.md)
        full = tl.load(overflow_token_ptr + table_row + num_overflow - 1) >= 0
        scale_here = scale_on & ~full
        index = 0
        listed = tl.load(overflow_token_ptr + table_row)
        while listed >= 0:
            excess = tl.load(overflow_excess_ptr + table_row + index)
            value = tl.load(row_ptr + listed)
            value = value - frequency * excess.to(tl.float32)
            if scale_here:
                value = tl.math.div_rn(value, temperature)
            tl.store(row_ptr + listed, value)
            index += 1
            listed = tl.load(
                overflow_token_ptr + table_row + index, mask=index < num_overflow, other=-1
            )
        if scale_on & full:
            # a full table may leave tokens at 255 without an entry: every byte of 255 still
            # lacks its temperature, listed or not
            tl.debug_barrier()
            for start in range(0, vocab_size, BLOCK_SIZE):
                cols = start + tl.arange(0, BLOCK_SIZE)
                in_row = cols < vocab_size
                count = tl.load(counts_row + cols, mask=in_row, other=0).to(tl.int32)
                at_255 = in_row & (count == SATURATED)
                x = tl.load(row_ptr + cols, mask=at_255, other=0.0)
                tl.store(row_ptr + cols, tl.math.div_rn(x, temperature), mask=at_255)


def launch_process_logits(
    logits: torch.Tensor,  # [num_rows, V] float32, updated in place
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
    block_size: int = 1024,
    sparse_block: int = 128,
) -> None:
    """Launch `_process_logits_kernel` over the rows; tables must be contiguous. Allocates
    nothing, returns None."""
    num_rows, vocab_size = logits.shape
    _process_logits_kernel[(num_rows,)](
        logits,
        logits.stride(0),
        slots,
        bias_ids,
        bias_values,
        min_tokens,
        num_generated,
        stop_ids,
        allowed,
        grammar if grammar is not None else allowed,  # unread without HAS_GRAMMAR
        counts,
        overflow_token,
        overflow_excess,
        prompt_mask,
        repetition,
        frequency,
        presence,
        temperature,
        drafts if drafts is not None else slots,  # unread without HAS_DRAFTS
        num_preceding if num_preceding is not None else slots,
        vocab_size,
        allowed.shape[1],
        bias_ids.shape[1],
        stop_ids.shape[1],
        overflow_token.shape[1] - 1,
        drafts.shape[1] if drafts is not None else 0,
        GREEDY_BELOW=GREEDY_TEMPERATURE,
        SATURATED=SATURATED,
        HAS_GRAMMAR=grammar is not None,
        HAS_DRAFTS=drafts is not None,
        BLOCK_SIZE=block_size,
        SPARSE_BLOCK=sparse_block,
        # why: x - f * count must round twice, as torch's separate multiply and subtract do
        enable_fp_fusion=False,
    )


@inplace_op("process_logits", mutates_args=("logits",))
def process_logits(
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
) -> None:
    """Logit bias, min_tokens, allowed and grammar bitmasks, penalties and temperature on
    logits [num_rows, V] float32, in place, in one pass (docs/kernels.md, logits processing).

    Per slot ([num_slots, ...]): bias_ids int32 / bias_values float32 [C]; min_tokens,
    num_generated int32; stop_ids int32 [S]; allowed, prompt_mask int32 [ceil(V/32)];
    counts uint8 [V] (the output count, 255 = saturated); overflow_token (-1 unused, used
    entries first) / overflow_excess int32 [E + 1] (a saturated token's count - 255; column
    E is the commit's spare, never read): the penalties stage's layout; repetition,
    frequency, presence, temperature float32. grammar: int32 [num_rows, ceil(V/32)] by
    row, or None. drafts int64 [num_rows, D] with num_preceding int64 [num_rows] (both or
    neither): a speculative step's drafted ids, of which the first num_preceding[r] precede
    row r's position and count as output tokens for the penalties and min_tokens.
    """
    check_logits(logits)
    num_rows, vocab_size = logits.shape
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
    if (drafts is None) != (num_preceding is None):
        raise ValueError("drafts and num_preceding come together")
    if drafts is not None and num_preceding is not None:
        if drafts.dtype != torch.int64:
            raise TypeError(f"drafts must be torch.int64, got {drafts.dtype}")
        if drafts.dim() != 2 or drafts.shape[0] != num_rows or not drafts.is_contiguous():
            raise ValueError(
                f"drafts must be a contiguous [{num_rows}, D] tensor, got shape "
                f"{tuple(drafts.shape)}"
            )
        check_rows("num_preceding", num_preceding, torch.int64, num_rows)
        if drafts.shape[1] == 0:
            raise ValueError("drafts must have at least one column (D >= 1)")
    launch_process_logits(
        logits, slots, bias_ids, bias_values, min_tokens, num_generated, stop_ids, allowed,
        grammar, counts, overflow_token, overflow_excess, prompt_mask, repetition, frequency,
        presence, temperature, drafts, num_preceding,
    )  # fmt: skip
