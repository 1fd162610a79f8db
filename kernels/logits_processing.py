"""DESIGN §4 steps 2-6 in Triton, one program per row, in place: logit bias, min_tokens, the
allowed-token and grammar bitmasks, repetition/frequency/presence penalties, temperature.

Per row r with slot s = slots[r], in the PyTorch backend's order (graphsafe_sampler/sampler.py,
`process_logits`; bad words and custom processors are not here):
1. logit bias: `l[t] += bias` for the slot's sparse (bias_ids, bias_values) table; unused
   entries are (token 0, +0.0) and are skipped (adding +0.0 changes nothing but the sign of
   a -0.0 logit, which compares equal);
2. min_tokens: while num_generated[s] < min_tokens[s], the slot's stop ids (EOS included)
   become -inf; unused entries repeat the first id, so duplicate stores carry one value;
3. allowed_token_ids: tokens whose bit is clear in allowed[s] become -inf;
4. grammar: tokens whose bit is clear in grammar[r] (row-indexed, per step) become -inf;
5. penalties (penalties.py's `apply_penalties`): count = counts[s, t] + 256 * high(t), the
   low byte dense in `counts` (uint8) and the high part in the slot's E overflow entries;
   repetition `l / r` if l > 0 else `l * r` over prompt ∪ output tokens, then
   `l -= frequency * count` and `l -= presence * (count > 0)`;
6. temperature: `l / T`, except greedy rows (T < GREEDY_TEMPERATURE) and T = 1, which keep l.
Steps 1-2 are sparse stores into the row, done first (masks and finite biases commute); a
barrier orders them before the dense pass (steps 3-6), which reads and writes each element
once. The overflow entries are looked up per tile as a [BLOCK, E] compare, so the dense pass
applies the exact count at the few tokens past 255 without a second visit.

All arithmetic is float32 with IEEE division (`div_rn`) and no fused multiply-add, so the row
equals the PyTorch backend's bit for bit.

Logits traffic ([num_rows, V] float32): one read and one write per row (the dense pass), plus
at most max_logit_bias_tokens + max_stop_token_ids + 1 scattered elements. Other reads per
row: the counts row (V bytes) when a penalty is on, the allowed, prompt and grammar bitmasks
(V/8 bytes each), the sparse tables.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphsafe_sampler.params import GREEDY_TEMPERATURE


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
    counts_ptr,  # [num_slots, V] uint8: output count mod 256
    overflow_token_ptr,  # [num_slots, E] int32 (-1 = unused)
    overflow_high_ptr,  # [num_slots, E] int32: count // 256
    prompt_mask_ptr,  # [num_slots, W] int32 bitmask
    repetition_ptr,  # [num_slots] float32
    frequency_ptr,  # [num_slots] float32
    presence_ptr,  # [num_slots] float32
    temperature_ptr,  # [num_slots] float32
    vocab_size,
    num_words,  # W = ceil(V / 32)
    num_bias,  # C
    num_stop,  # S
    num_overflow,  # E
    GREEDY_BELOW: tl.constexpr,
    HAS_GRAMMAR: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr,
    OVERFLOW_BLOCK: tl.constexpr,
):
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
    # 2. min_tokens
    if tl.load(num_generated_ptr + slot) < tl.load(min_tokens_ptr + slot):
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
    temperature = tl.load(temperature_ptr + slot)
    scale_on = (temperature >= GREEDY_BELOW) & (temperature != 1.0)
    entries = tl.arange(0, OVERFLOW_BLOCK)
    overflow_token = tl.load(
        overflow_token_ptr + slot * num_overflow + entries, mask=entries < num_overflow, other=-1
    )
    overflow_high = tl.load(
        overflow_high_ptr + slot * num_overflow + entries, mask=entries < num_overflow, other=0
    )
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
        # 5. penalties
        if penalties_on:
            count = tl.load(counts_row + cols, mask=in_row, other=0).to(tl.int32)
            match = cols[:, None] == overflow_token[None, :]  # [BLOCK, E]
            count += 256 * tl.sum(tl.where(match, overflow_high[None, :], 0), axis=1)
            in_output = count > 0
            seen = in_output | _bit_is_set(prompt_row, cols, in_row)
            penalised = tl.where(x > 0.0, tl.math.div_rn(x, repetition), x * repetition)
            x = tl.where(seen, penalised, x)
            x = x - frequency * count.to(tl.float32)
            x = x - presence * in_output.to(tl.float32)
        # 6. temperature
        if scale_on:
            x = tl.math.div_rn(x, temperature)
        tl.store(row_ptr + cols, x, mask=in_row)


def process_logits(
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
    overflow_token: torch.Tensor,  # [num_slots, E] int32
    overflow_high: torch.Tensor,  # [num_slots, E] int32
    prompt_mask: torch.Tensor,  # [num_slots, W] int32
    repetition: torch.Tensor,  # [num_slots] float32
    frequency: torch.Tensor,  # [num_slots] float32
    presence: torch.Tensor,  # [num_slots] float32
    temperature: torch.Tensor,  # [num_slots] float32
    block_size: int = 1024,
    sparse_block: int = 128,
) -> None:
    """Launch `_process_logits_kernel` over the rows; tables must be contiguous. Allocates
    nothing, returns None."""
    num_rows, vocab_size = logits.shape
    num_overflow = overflow_token.shape[1]
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
        overflow_high,
        prompt_mask,
        repetition,
        frequency,
        presence,
        temperature,
        vocab_size,
        allowed.shape[1],
        bias_ids.shape[1],
        stop_ids.shape[1],
        num_overflow,
        GREEDY_BELOW=GREEDY_TEMPERATURE,
        HAS_GRAMMAR=grammar is not None,
        BLOCK_SIZE=block_size,
        SPARSE_BLOCK=sparse_block,
        OVERFLOW_BLOCK=max(triton.next_power_of_2(num_overflow), 2),
        # why: x - f * count must round twice, as torch's separate multiply and subtract do
        enable_fp_fusion=False,
    )
