"""Which rows `process_logits` leaves unwritten with its DEFER tables (`defer_row`), and how
the kernels after it read a row's processed logits (docs/kernels.md, deferred rows and the
temperature on read): from the buffer or, for a row it left unwritten, from the source,
and divided by the row's temperature as they read, the logits and the tile maxima alike.
Stage 1 (kernels/candidates.py), the cut and its search (kernels/top_k_top_p.py,
kernels/radix_select.py) and sampling (kernels/sampling.py, kernels/noise.py) read through
these."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .library import check_logits, check_rows, check_table, divide_by, together


def check_deferred(
    logits: torch.Tensor, source: torch.Tensor | None, deferred: torch.Tensor | None
) -> None:
    """A reader's (source, deferred) of `process_logits`' deferred rows, both or neither:
    source [num_rows, V] float32 (the logits `logits` [num_rows, V] was processed from),
    deferred [num_rows] float32 (`load_deferred`)."""
    if (source is None) != (deferred is None):
        raise ValueError("source and deferred come together")
    if source is not None and deferred is not None:
        check_logits(source, "source")
        if source.shape != logits.shape:
            raise ValueError(
                f"source must have the shape of logits {tuple(logits.shape)}, got "
                f"{tuple(source.shape)}"
            )
        check_rows("deferred", deferred, torch.float32, logits.shape[0])


def check_defer(
    restricted: torch.Tensor | None,  # [num_slots] int32
    biased: torch.Tensor | None,  # [num_slots] int32
    grammar_on: torch.Tensor | None,  # [num_rows] bool
    deferred: torch.Tensor | None,  # [num_rows] float32, written
    num_slots: int,
    num_rows: int,
    drafts: torch.Tensor | None,
) -> tuple[torch.Tensor, ...] | None:
    """`process_logits`' DEFER tables, all four or none (and then no drafts) -> the tuple."""
    defer = together(
        "restricted, biased, grammar_on and deferred", restricted, biased, grammar_on, deferred
    )
    if defer is not None:
        if drafts is not None:
            raise ValueError("deferred rows take no drafts (a draft changes the penalties)")
        check_table("restricted", defer[0], torch.int32, (num_slots,))
        check_table("biased", defer[1], torch.int32, (num_slots,))
        check_rows("grammar_on", defer[2], torch.bool, num_rows)
        check_rows("deferred", defer[3], torch.float32, num_rows)
    return defer


@triton.jit
def defer_row(
    row, slot, penalties_on, min_tokens_met, scale_on, temperature, restricted_ptr,
    biased_ptr, grammar_on_ptr, bad_back_ptr, num_bad, deferred_ptr,
    HAS_BAD_WORDS: tl.constexpr,
):  # fmt: skip
    """`process_logits`' DEFER, for its row `row` -> (store, masks_on): a row no step but
    its temperature changes (no penalty, allowed list, grammar, bias, stop ids in force nor
    bad words) is left unwritten (store False), and its first program writes `deferred`
    (`load_deferred`: the divisor, negative where the row is written). With the flags at
    hand, the dense pass also skips the bitmasks of a row with neither an allowed list nor a
    grammar (`masks_on` False: `token_steps.penalise_and_scale`)."""
    masks_on = (tl.load(restricted_ptr + slot) != 0) | (
        tl.load(grammar_on_ptr + row).to(tl.int32) != 0
    )
    plain = ~penalties_on & min_tokens_met & ~masks_on & (tl.load(biased_ptr + slot) == 0)
    if HAS_BAD_WORDS:  # used entries first: back -1 is an empty table
        plain &= tl.load(bad_back_ptr + slot.to(tl.int64) * num_bad) < 0
    if tl.program_id(1) == 0:
        divisor = tl.where(scale_on, temperature, 1.0)
        tl.store(deferred_ptr + row, tl.where(plain, divisor, -divisor))
    return ~plain, masks_on


@triton.jit
def load_deferred(deferred_ptr, row, DEFER: tl.constexpr):
    """The row's entry of `process_logits`' deferred table -> (divisor, from_source): the
    divisor that makes what the reader reads of the row its processed logits (1: as it is;
    the temperature) and whether the row was left unwritten, to be read from the source.
    With DEFER processing applies no temperature itself (docs/kernels.md, the temperature
    on read): its entry is the divisor, negative where it wrote the row (pre-temperature)
    and positive where it left it. Without DEFER: (0.0, False), the buffer as it is. For
    `row_logits` and the divisions below. Loaded at a reader's start, with the
    row's first loads, since a warp issues in order and the loads of the row wait for it
    (loaded where the row's pointer is first needed, after the slot's parameters, it took
    a round of its own)."""
    entry = tl.zeros((), tl.float32)
    if DEFER:
        entry = tl.load(deferred_ptr + row)
    return tl.abs(entry), entry > 0.0


@triton.jit
def processed(x, divisor):
    """Logits `x` loaded from the row `row_logits` chose (or its tile maxima) -> the row's
    processed logits: x / divisor, rounded as IEEE division, where the row's temperature
    is the reader's (`load_deferred`), else x. Division by a positive divisor, rounded, is
    monotone, so a tile's max divided is the max of its logits divided. A uniform branch
    on the row: a row without one runs none of its ~17 SASS instructions an element (none
    at all without DEFER, where `divisor` is the constant 0)."""
    if (divisor != 0.0) & (divisor != 1.0):
        x = tl.math.div_rn(x, divisor)
    return x


@triton.jit
def processed_tile(x, divisor, reciprocal, fast):
    """`processed` for a tile of a walk, by `divide_by` with the divisor's hoisted
    `reciprocal` (about 7 SASS instructions an element) where the divisor and every logit of
    the tile lie in its range (`fast`: the divisor's, from `hoisted_reciprocal`), else by
    IEEE division as `processed` (a tile holding ±inf, such as a chunk's last, whose masked
    columns read -inf, or a logit past 2**104 or below 2**-100). The same quotients: a
    reduction a tile (its flag) in place of ~10 instructions an element."""
    if (divisor != 0.0) & (divisor != 1.0):
        q, outside = divide_by(x, divisor, reciprocal)
        if ~fast | (tl.max(outside.to(tl.int32), axis=0) > 0):
            q = tl.math.div_rn(x, divisor)
        x = q
    return x


@triton.jit
def processed_bounds(bounds, divisor, reciprocal, fast):
    """`processed` for the tile maxima a reader takes as bounds at a program's start
    (`tiles_to_visit`'s, a floor's), by `divide_by` with the divisor's hoisted `reciprocal`:
    +inf (unknown: a walk reads the tile and makes its max itself) where that division
    cannot vouch for the quotient, ±inf as they are. Upper bounds that may only have a
    tile read more, by selects: no IEEE division, whose inlined slow path spilled the
    sampling kernel under its register cap, and no branch, which would wait for the
    divisor's load and put every load after it a round later."""
    q, outside = divide_by(bounds, divisor, reciprocal)
    unknown = tl.where(bounds == float("-inf"), float("-inf"), float("inf"))
    # (tl.where, not |: the interpreter cannot | a scalar bool with a block of them)
    q = tl.where(tl.where(fast, outside, True), unknown, q)
    return tl.where((divisor != 0.0) & (divisor != 1.0), q, bounds)


@triton.jit
def processed_upper_bound(top, divisor, reciprocal, fast):
    """An upper bound of `processed(top, divisor)` for one tile's entry, where only a bound
    is needed (sampling's "can this tile win" test), in a few instructions, no branch:
    q = top * RN(1/d) lies within 2**-23 of top / d (two roundings), so the larger of q
    moved 2**-20 either way is at least the quotient rounded, ±inf stay ±inf, and a
    divisor outside the reciprocal's range (`fast` false) gives +inf but for -inf
    (unknown: the walk then makes the tile's max itself). A quotient in the subnormal
    range may come out an ulp low (2**-149), which no sum with the noise's bound can
    tell."""
    q = top * reciprocal
    bound = tl.maximum(q * 1.00000095367431640625, q * 0.99999904632568359375)  # 1 ± 2**-20
    bound = tl.where(fast, bound, tl.where(top == float("-inf"), float("-inf"), float("inf")))
    return tl.where((divisor != 0.0) & (divisor != 1.0), bound, top)


@triton.jit
def row_logits(logits_ptr, logits_stride, source_ptr, source_stride, from_source, row):
    """The start of the row's logits: its row of `logits_ptr`, or where processing left it
    unwritten (`load_deferred`'s from_source), its row of the source (float32, as the
    buffer), which `processed` makes the processed logits."""
    return tl.where(
        from_source,
        source_ptr + row.to(tl.int64) * source_stride,
        logits_ptr + row.to(tl.int64) * logits_stride,
    )
