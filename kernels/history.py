"""The commit in Triton: one kernel appends each row's token to its request's device-side
history, as `BatchState.commit` does with the package's slot states, one program per row.

It advances the penalty count bytes (with their overflow table past 255), the bad-words ring
of recent outputs and `num_generated`, leaving every state tensor equal to the PyTorch
commit's bit for bit. The key idea: a commit is a few scalar stores per row; only a row whose
byte was 254 or 255 walks its slot's overflow entries, and no [num_rows, V] tensor is read
or written. The per-row steps are `_commit_history_kernel`'s docstring; the traffic:
docs/kernels.md, the commit.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from .constants import SATURATED
from .dependent_launch import await_prior_grids, pdl_launch
from .library import check_rows, check_table, inplace_op


@triton.jit
def _commit_history_kernel(
    slots_ptr,  # [num_rows] int64 row -> slot
    token_ids_ptr,  # [num_rows] int32 or int64 the row's token
    keep_ptr,  # [num_rows] bool: the row commits (HAS_KEEP; else every row)
    num_generated_ptr,  # [num_slots] int32, advanced
    counts_ptr,  # [num_slots, V] uint8, advanced (255 = saturated)
    output_words_ptr,  # [num_slots, ceil(W / 32)] int32: the words holding an output, advanced
    overflow_token_ptr,  # [num_slots, E + 1] int32 (-1 = unused; column E the spare)
    overflow_excess_ptr,  # [num_slots, E + 1] int32
    window_ptr,  # [num_slots, L] int32 ring of recent output tokens
    vocab_size,
    num_words,  # ceil(W / 32), W = ceil(V / 32): output_words' int32s a slot
    num_overflow,  # E
    window_len,  # L
    padding_slot,
    SATURATED: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    OVERFLOW_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per row r with slot s = slots[r] and token t = token_ids[r], when keep[r] and s is not
    the padding slot (rows must have distinct slots, except the padding slot):

    1. penalties (graphsafe_sampler/stages/penalties.py, `PenaltyState.commit`): the byte
       counts[s, t] goes up by one and stays at SATURATED = 255 past it; the commit that
       takes it from 254 to 255 writes t into the next free overflow entry (the number of
       used entries, so column E, the spare, when the table is full), and a commit at 255
       adds 1 to the excess of t's first entry (none found: nothing, the spare again);
       and bit w = t // 32 of output_words[s] (the token's 32-token word) is set (it is
       where a count of the word was above 0 already);
    2. bad words (graphsafe_sampler/stages/bad_words.py, `BadWordsState.commit`, the flat
       layout with the ring `recent_tokens` [num_slots, L]): t goes to
       window[s, num_generated[s] % L], the position read before step 3;
    3. num_generated[s] += 1.

    Every row that does not write an overflow entry stores -1 into its slot's spare column,
    as the PyTorch commit does (its branch-free index_put_ targets the spare): every state
    tensor equals the PyTorch commit's bit for bit, the spare column included.
    """
    await_prior_grids(PDL)
    row = tl.program_id(0)
    commit_row(
        row, tl.load(slots_ptr + row), tl.load(token_ids_ptr + row), keep_ptr,
        num_generated_ptr, counts_ptr, output_words_ptr, overflow_token_ptr, overflow_excess_ptr,
        window_ptr, vocab_size, num_words, num_overflow, window_len, padding_slot, SATURATED,
        HAS_KEEP, OVERFLOW_BLOCK,
    )  # fmt: skip


@triton.jit
def commit_row(
    row, slot, token, keep_ptr, num_generated_ptr, counts_ptr, output_words_ptr,
    overflow_token_ptr, overflow_excess_ptr, window_ptr, vocab_size, num_words, num_overflow,
    window_len, padding_slot,
    SATURATED: tl.constexpr, HAS_KEEP: tl.constexpr, OVERFLOW_BLOCK: tl.constexpr,
):  # fmt: skip
    """`_commit_history_kernel`'s steps for row `row`, slot `slot`, token `token` (a
    scalar): shared with the sampling kernels, which commit the token where they make it.
    Its stores follow a barrier after its loads, and so after any load the calling program
    made before it (the sampling program's read of num_generated for the position)."""
    # every load that needs only the slot and the token first, in one round (a warp
    # issues in order: a load after a use of loaded data waits a memory latency more)
    count_ptr = counts_ptr + slot * vocab_size + token
    count = tl.load(count_ptr).to(tl.int32)
    generated = tl.load(num_generated_ptr + slot)
    commit = slot != padding_slot
    if HAS_KEEP:
        commit &= tl.load(keep_ptr + row) != 0

    # 1. penalties
    table_row = slot * (num_overflow + 1)
    saturates = commit & (count == SATURATED - 1)
    grows = commit & (count == SATURATED)
    entry = num_overflow + tl.zeros((), tl.int32)  # the spare
    found = count < 0  # False, as a scalar tensor the branch below may reassign
    excess = tl.zeros((), tl.int32)
    if saturates | grows:  # a byte at 254 or 255: rare
        used = tl.zeros((), tl.int32)
        first_match = tl.full((), num_overflow, tl.int32)
        for start in range(0, num_overflow, OVERFLOW_BLOCK):
            index = start + tl.arange(0, OVERFLOW_BLOCK)
            in_table = index < num_overflow
            listed = tl.load(overflow_token_ptr + table_row + index, mask=in_table, other=-1)
            # as the PyTorch commit: every used entry counts, wherever it sits
            used += tl.sum((listed != -1).to(tl.int32), axis=0)
            hit = in_table & (listed == token)
            first_match = tl.minimum(first_match, tl.min(tl.where(hit, index, num_overflow)))
        found = first_match < num_overflow
        entry = tl.where(saturates, used, first_match)
        excess = tl.load(overflow_excess_ptr + table_row + entry)
    writes = saturates | (grows & found)
    # a row that writes nothing (and a saturation into a full table) lands in the spare; a
    # written entry holds the token (a found one held it already)
    entry_ptr = overflow_token_ptr + table_row + entry
    # every thread loads, one stores: each thread's loads of what the stores below change
    # (the count byte above all: a warp that read it after the store would take the other
    # branch, and wait at a barrier of its reductions that the rest never reach) land first
    tl.debug_barrier()
    tl.store(entry_ptr, tl.where(writes, token.to(tl.int32), -1))
    if grows & found:
        tl.store(overflow_excess_ptr + table_row + entry, excess + 1)
    if commit:
        tl.store(count_ptr, tl.minimum(count + 1, SATURATED).to(tl.uint8))
        # 2. bad words: the ring position is the token's index among the outputs
        tl.store(window_ptr + slot * window_len + generated % window_len, token.to(tl.int32))
        # 3. the generated-token count
        tl.store(num_generated_ptr + slot, generated + 1)
        # its word's bit in the output words (set already past the word's first output):
        # an atomic or, which holds no loaded int32
        word = token // 32
        held = output_words_ptr + slot * num_words + word // 32
        tl.atomic_or(held, 1 << (word % 32).to(tl.int32), sem="relaxed")


class CommitTables(NamedTuple):
    """The per-slot history a commit advances in place (`commit_history` gives the
    layouts): the batch's counter, the penalty counts, the bad-words ring."""

    num_generated: torch.Tensor  # [num_slots] int32
    counts: torch.Tensor  # [num_slots, V] uint8 (255 = saturated)
    output_words: torch.Tensor  # [num_slots, ceil(ceil(V / 32) / 32)] int32: the words output
    overflow_token: torch.Tensor  # [num_slots, E + 1] int32
    overflow_excess: torch.Tensor  # [num_slots, E + 1] int32
    window: torch.Tensor  # [num_slots, L] int32
    padding_slot: int

    def check(
        self, num_rows: int, keep: torch.Tensor | None, vocab_size: int | None = None
    ) -> None:
        """Dtypes, shapes and the padding slot, for a commit of `num_rows` rows (of tokens
        in [0, vocab_size), the counts' width, where it is known)."""
        if keep is not None:
            check_rows("keep", keep, torch.bool, num_rows)
        num_slots = self.num_generated.shape[0]
        excess_shape = (num_slots, self.overflow_token.shape[-1])
        for name, t, dtype, shape in (
            ("num_generated", self.num_generated, torch.int32, (num_slots,)),
            ("counts", self.counts, torch.uint8, (num_slots, None)),
            ("output_words", self.output_words, torch.int32, (num_slots, self.num_words())),
            ("overflow_token", self.overflow_token, torch.int32, (num_slots, None)),
            ("overflow_excess", self.overflow_excess, torch.int32, excess_shape),
            ("window", self.window, torch.int32, (num_slots, None)),
        ):
            check_table(name, t, dtype, shape)
        if vocab_size is not None and self.counts.shape[1] != vocab_size:
            raise ValueError(
                f"counts must have {vocab_size} columns (the vocabulary), got "
                f"{self.counts.shape[1]}"
            )
        if self.overflow_token.shape[1] < 2:
            raise ValueError(
                f"overflow_token must have E + 1 >= 2 columns, got {self.overflow_token.shape[1]}"
            )
        if not 0 <= self.padding_slot < num_slots:
            raise ValueError(
                f"padding_slot = {self.padding_slot} is outside the slots [0, {num_slots})"
            )

    def num_words(self) -> int:
        """ceil(W / 32) for W = ceil(V / 32): the int32s of a slot's output words, one bit a
        32-token word (V: the counts' width)."""
        return ((self.counts.shape[1] + 31) // 32 + 31) // 32

    def launch_args(
        self, keep: torch.Tensor | None, overflow_block: int = 128
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """`commit_row`'s arguments after `row, slot, token`: (the tensors and sizes, the
        constexprs), for a kernel that passes them on in this order."""
        num_overflow = self.overflow_token.shape[1] - 1
        args = (
            keep if keep is not None else self.num_generated,  # unread without HAS_KEEP
            self.num_generated, self.counts, self.output_words, self.overflow_token,
            self.overflow_excess, self.window, self.counts.shape[1], self.output_words.shape[1],
            num_overflow, self.window.shape[1], self.padding_slot,
        )  # fmt: skip
        block = min(overflow_block, max(triton.next_power_of_2(num_overflow), 2))
        constexprs = {"SATURATED": SATURATED, "HAS_KEEP": keep is not None, "OVERFLOW_BLOCK": block}
        return args, constexprs


def launch_commit_history(
    slots: torch.Tensor,  # [num_rows] int64
    token_ids: torch.Tensor,  # [num_rows] int32 or int64
    keep: torch.Tensor | None,  # [num_rows] bool, or None: every row
    num_generated: torch.Tensor,  # [num_slots] int32, advanced in place
    counts: torch.Tensor,  # [num_slots, V] uint8, advanced in place
    output_words: torch.Tensor,  # [num_slots, ceil(ceil(V / 32) / 32)] int32, in place
    overflow_token: torch.Tensor,  # [num_slots, E + 1] int32, in place
    overflow_excess: torch.Tensor,  # [num_slots, E + 1] int32, in place
    window: torch.Tensor,  # [num_slots, L] int32, in place
    padding_slot: int,
    overflow_block: int = 128,
) -> None:
    """Launch `_commit_history_kernel` over the rows; tables must be contiguous. Allocates
    nothing, returns None."""
    tables = CommitTables(
        num_generated, counts, output_words, overflow_token, overflow_excess, window, padding_slot
    )
    args, constexprs = tables.launch_args(keep, overflow_block)
    _commit_history_kernel[(slots.shape[0],)](
        slots, token_ids, *args, **constexprs, **pdl_launch(slots.device)
    )


@inplace_op(
    "commit_history",
    mutates_args=("num_generated", "counts", "output_words", "overflow_token", "overflow_excess",
                  "window"),
)  # fmt: skip
def commit_history(
    slots: torch.Tensor,
    token_ids: torch.Tensor,
    keep: torch.Tensor | None,
    num_generated: torch.Tensor,
    counts: torch.Tensor,
    output_words: torch.Tensor,
    overflow_token: torch.Tensor,
    overflow_excess: torch.Tensor,
    window: torch.Tensor,
    padding_slot: int,
) -> None:
    """`BatchState.commit` with the penalty and bad-words states, as one kernel: rows with
    keep (None: every row) whose slot is not `padding_slot` append their token.

    slots [num_rows] int64; token_ids [num_rows] int32 or int64; keep [num_rows] bool or
    None. Per slot, all written:
    num_generated int32; counts uint8 [V]; output_words int32 [ceil(ceil(V / 32) / 32)] (bit
    w: a count of the word w = t // 32 above 0); overflow_token / overflow_excess int32
    [E + 1] (the penalties' layout); window int32 [L] (the bad-words ring of recent outputs).
    """
    num_rows = slots.shape[0]
    check_rows("slots", slots, torch.int64, num_rows)
    check_rows("token_ids", token_ids, (torch.int32, torch.int64), num_rows)
    tables = CommitTables(
        num_generated, counts, output_words, overflow_token, overflow_excess, window, padding_slot
    )
    tables.check(num_rows, keep)
    launch_commit_history(slots, token_ids, keep, *tables)
