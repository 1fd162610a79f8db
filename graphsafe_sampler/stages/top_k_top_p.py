"""top-k and top-p filtering (step 8), exact.

top-k (`top_k` <= 0 or >= V is off) keeps every token whose logit is >= the k-th largest,
ties included; top-p (`top_p` >= 1 is off), on the top-k survivors renormalised, keeps every
token with probability >= t, t the largest value whose kept tokens hold `top_p` of the mass
(ties kept, the row max always survives). Masked tokens become -inf. Each row's cut comes
from its largest logits, the candidates (`candidate_cut`), where they settle it, and
elsewhere from an exact method over the row: the threshold searches
(`threshold_search.py`), or eagerly on a CPU one sort of each row (`sorted_cut.py`). The
semantics in full, the passes, the alternatives measured and the exactness:
docs/kernels.md, top-k/top-p.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.slot_tables import SlotTables
from graphsafe_sampler.stages.candidates import (
    CANDIDATES,
    Candidates,
    argmax_by_tiles,
    tile_max,
    top_candidates,
)
from graphsafe_sampler.stages.min_p import min_p_threshold
from graphsafe_sampler.stages.sorted_cut import SortedRows, sort_rows, sorted_cut
from graphsafe_sampler.stages.threshold_search import (
    AcrossShards,
    top_k_threshold,
    top_p_threshold,
)


def masked_total(
    logits: torch.Tensor,  # [num_rows, V] float32
    floor: torch.Tensor,  # [num_rows, 1] float32: only logits >= floor count
    shift: torch.Tensor,  # [num_rows, 1] float32 finite
) -> torch.Tensor:
    """[num_rows, 1] float32: the sum of exp(logit - shift) over the logits >= floor, one
    pass over the rows: top-p's total mass where the candidates don't hold it."""
    return torch.where(logits >= floor, torch.exp(logits - shift), 0.0).sum(-1, keepdim=True)


RowTotal = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(logits, floor, shift, needed [num_rows, 1] bool) -> [num_rows, 1] `masked_total`, exact
at least on the rows `needed` marks: how `candidate_cut` sums the rows it must."""


def _every_row_total(
    logits: torch.Tensor, floor: torch.Tensor, shift: torch.Tensor, needed: torch.Tensor
) -> torch.Tensor:
    return masked_total(logits, floor, shift)


def _sorted_total(rows: SortedRows) -> RowTotal:
    """A `RowTotal` read off the sort: where a row can be settled (top-k off or within the
    candidates, no NaN), its floor and shift are the candidates', so its total is the same
    terms; the sort makes no second pass over the row."""

    def row_total(
        logits: torch.Tensor, floor: torch.Tensor, shift: torch.Tensor, needed: torch.Tensor
    ) -> torch.Tensor:
        return rows.total

    return row_total


def candidate_cut(
    logits: torch.Tensor,  # [num_rows, V] float32
    top_k: torch.Tensor,  # [num_rows] int; <= 0 or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; >= 1 is off
    candidates: Candidates | None = None,  # top_candidates(logits, min(CANDIDATES, V))
    across: AcrossShards | None = None,  # where `logits` are one shard of the rows
    vocab_size: int | None = None,  # the whole rows' V, with `across`
    row_total: RowTotal = _every_row_total,
) -> tuple[torch.Tensor, torch.Tensor]:
    """([num_rows, 1] float32 cut, [num_rows, 1] bool settled): the top-k then top-p cut
    from the row's CANDIDATES largest logits, exact where `settled`.

    top-k's cut is the k-th candidate (exactly the search's). top-p's weight of a candidate
    value, the mass of the tokens at or above it, is the cumulative sum of the candidates'
    masses in descending order up to the end of its run of equal values; the cut is the
    largest value whose weight reaches top_p of the row's total mass. The total is the
    candidates' own where every token at or above top-k's cut is a candidate (top-k's cut
    above the last candidate, or the row holding fewer finite logits: the same terms, so
    one pass over the row is saved), else summed over the row by `row_total`, which is
    asked only for those rows with top-p on. A row is settled when top-k is off or k <=
    CANDIDATES, and top-p is off or its cut lies strictly above the last candidate (every
    token at or above it is a candidate); never when the row holds NaN (topk ranks NaN
    first; the search leaves it out). With `across`, `logits` are one shard of the rows
    and `candidates` the whole rows' (merged from every shard's): a row's total over the
    shards is summed across them."""
    vocab_size = logits.shape[1] if vocab_size is None else vocab_size
    if candidates is None:
        candidates = top_candidates(logits, min(CANDIDATES, vocab_size))
    values = candidates.values  # [num_rows, n] descending, NaN first
    n = values.shape[1]
    last = values[:, n - 1 :]
    k = top_k.to(torch.int64)[:, None]
    k_off = (k <= 0) | (k >= vocab_size)
    kth = values.gather(1, k.clamp(1, n) - 1)
    floor = torch.where(k_off, float("-inf"), kth)
    row_max = values[:, :1]
    # as top_p_threshold: an all -inf row shifts by 0, so that its masses are 0, not NaN
    shift = torch.where(torch.isfinite(row_max), row_max, 0.0)
    mass = torch.where(values >= floor, torch.exp(values - shift), 0.0)
    p = top_p.to(torch.float32)[:, None]
    p_off = p >= 1.0
    all_in = (floor > last) | (last == float("-inf"))  # every token >= floor a candidate
    streamed = row_total(logits, floor, shift, ~all_in & ~p_off)
    if across is not None:
        streamed = across.sum(streamed)
    total = torch.where(all_in, mass.sum(-1, keepdim=True), streamed)
    # the weight at each candidate: the cumulative mass at the end of its run of ties
    run_end = torch.ones_like(values, dtype=torch.bool)
    run_end[:, :-1] = values[:, :-1] > values[:, 1:]
    ends = torch.where(run_end, mass.cumsum(-1), float("inf"))
    weight = ends.flip(-1).cummin(-1).values.flip(-1)
    reached = (weight < p * total).sum(-1, keepdim=True)  # candidates short of the target
    cut_p = values.gather(1, reached.clamp(max=n - 1))
    cut = torch.where(p_off, floor, torch.maximum(cut_p, floor))
    settled_p = p_off | ((reached < n) & (cut_p > last))
    settled = (k_off | (k <= n)) & settled_p & ~torch.isnan(row_max)
    return cut, settled


def _conditional_row_total(
    logits: torch.Tensor,  # [num_rows, V] float32: before `scale`
    scale: tuple[torch.Tensor, torch.Tensor] | None,
) -> RowTotal:
    """A `RowTotal` of `scaled_logits(logits, *scale)` (of `logits` without `scale`) that
    makes its pass only when some row needs it, in a traced conditional whose operands are
    the raw logits and `scale`: the scaled logits are never written. The rows not needed
    read 0 when no row is; `candidate_cut` never reads them."""

    def row_total(
        filtered: torch.Tensor, floor: torch.Tensor, shift: torch.Tensor, needed: torch.Tensor
    ) -> torch.Tensor:
        def streamed(logits: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            floor, shift, *scaling = rest
            if scaling:
                logits = scaled_logits(logits, *scaling)
            return masked_total(logits, floor, shift)

        def unread(logits: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(rest[0])

        operands = (logits, floor, shift, *(scale or ()))
        return torch.cond(needed.any(), streamed, unread, operands)

    return row_total


def top_k_top_p_cut(
    logits: torch.Tensor,  # [num_rows, V] float32
    top_k: torch.Tensor,  # [num_rows] int; <= 0 or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; >= 1 is off
    conditional: bool | None = None,
    candidates: Candidates | None = None,  # top_candidates of the filtered logits
    scale: tuple[torch.Tensor, torch.Tensor] | None = None,  # (temperature, threshold)
    across: AcrossShards | None = None,  # where `logits` are one shard of the rows
    vocab_size: int | None = None,  # the whole rows' V, with `across`
    sort: bool | None = None,  # None: eagerly on a CPU
) -> torch.Tensor:
    """[num_rows, 1] float32: the top-k then top-p cut (keep `logits >= cut`): the
    candidates' where they settle the row (`candidate_cut`), the exact searches' elsewhere.
    With `scale`, of `scaled_logits(logits, *scale)` rather than of `logits`. With
    `across`, of the whole rows that `logits` are one shard of (`candidates` are then the
    whole rows'), the same cut on every shard.

    Branch-free: both run, and each row takes one. `conditional` (None: under torch.compile
    on a CPU, the only place docs/design.md allows data-dependent control flow) adds a
    traced conditional (`torch.cond`, an op of the graph) that skips the searches when
    every row is settled, and another that skips top-p's pass for its total mass when no
    row with top-p on needs it (`candidate_cut`); the cut is the same. `sort` (None:
    eagerly on a CPU) finds the searched rows' cut by `sorted_cut` instead of the radix
    searches."""
    on_cpu = logits.device.type == "cpu" and across is None
    if conditional is None:
        conditional = on_cpu and torch.compiler.is_compiling()
    if sort is None:
        sort = on_cpu and not torch.compiler.is_compiling()
    # the scaled logits are remade from the operands wherever they are read, never written
    filtered = logits if scale is None else scaled_logits(logits, *scale)
    rows = None
    if sort and not conditional:
        # the candidates rank NaN first: their first is the row max, NaN where a row holds one
        rows = sort_rows(filtered, top_k, None if candidates is None else candidates.values[:, :1])
    row_total: RowTotal = _every_row_total
    if conditional:
        row_total = _conditional_row_total(logits, scale)
    elif rows is not None:
        row_total = _sorted_total(rows)
    cut, settled = candidate_cut(filtered, top_k, top_p, candidates, across, vocab_size, row_total)

    def searched(*ops: torch.Tensor) -> torch.Tensor:
        logits, top_k, top_p, cut, settled, *scaling = ops  # scaling: `scale`, if given
        if scaling:
            logits = scaled_logits(logits, *scaling)
        if sort:
            return torch.where(settled, cut, sorted_cut(logits, top_k, top_p, rows))
        floor = top_k_threshold(logits, top_k, across, vocab_size)
        # split over ranks, the candidates' first is the row max: an exchange saved
        row_max = None if across is None or candidates is None else candidates.values[:, :1]
        exact = top_p_threshold(logits, top_p, floor, across, row_max)
        return torch.where(settled, cut, exact)

    operands = (logits, top_k, top_p, cut, settled, *(scale or ()))
    if conditional:
        # both branches take the same operands; the settled one only copies the cut out
        return torch.cond(settled.all(), lambda *ops: ops[3].clone(), searched, operands)
    return searched(*operands)


def scaled_logits(
    logits: torch.Tensor,  # [num_rows, V] float32
    temperature: torch.Tensor,  # [num_rows] float32 > 0
    threshold: torch.Tensor,  # [num_rows, 1] float32 (-inf: keep all)
) -> torch.Tensor:
    """`logits / temperature` with what falls below `threshold` set to -inf (NaN kept):
    temperature, then min_p's mask, as `filter_scaled` reads them."""
    scaled = logits / temperature[:, None]
    return torch.where(scaled < threshold, float("-inf"), scaled)


def cut_scaled(
    logits: torch.Tensor,  # [num_rows, V] float32
    temperature: torch.Tensor,  # [num_rows] float32 > 0
    threshold: torch.Tensor,  # [num_rows, 1] float32: min_p's (-inf: keep all)
    cut: torch.Tensor,  # [num_rows, 1] float32: top-k/top-p's
) -> torch.Tensor:
    """`scaled_logits` with what falls below `cut` set to -inf too: `filter_scaled`'s
    logits, pointwise in the rows of every operand."""
    scaled = scaled_logits(logits, temperature, threshold)
    return torch.where(scaled < cut, float("-inf"), scaled)


class Filtered(NamedTuple):
    """`filter_top_k_top_p`'s result: logits [num_rows, V] float32, masked; the candidates
    the cut came from (before the mask); covered [num_rows] bool, where every token the row
    keeps is a candidate and its maximum is above -inf (and not NaN): a race among the
    candidates draws the token a race over the row would (`SamplingState.race_covered`);
    greedy [num_rows] int64 (`filter_scaled` only), each row's argmax before the cut;
    remake (`filter_scaled` only): (`cut_scaled`, its operands), which give `logits` again,
    or any rows of it from those rows of the operands: a consumer under torch.compile that
    recomputes them instead spares the step writing `logits` at all."""

    logits: torch.Tensor
    candidates: Candidates
    covered: torch.Tensor
    greedy: torch.Tensor | None = None
    remake: tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]] | None = None


def _covered(candidates: Candidates, cut: torch.Tensor) -> torch.Tensor:
    """[num_rows] bool: every token at or above `cut` [num_rows, 1] is a candidate, and the
    largest is above -inf."""
    last = candidates.values[:, -1:]
    # a token that is no candidate lies at or below `last`: kept only where cut <= last
    covered = ((cut > last) | (last == float("-inf"))) & (candidates.values[:, :1] > float("-inf"))
    return covered[:, 0]


def filter_top_k_top_p(
    logits: torch.Tensor,  # [num_rows, V] float32, updated in place
    top_k: torch.Tensor,  # [num_rows] int; 0, -1 (any <= 0) or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; 1.0 (any >= 1) is off
) -> Filtered:
    """Set the logits that top-k, then top-p, remove to -inf, in place; with the
    candidates and the rows they cover."""
    candidates = top_candidates(logits, min(CANDIDATES, logits.shape[1]))
    cut = top_k_top_p_cut(logits, top_k, top_p, candidates=candidates)
    logits = logits.masked_fill_(logits < cut, float("-inf"))
    return Filtered(logits, candidates, _covered(candidates, cut))


def filter_scaled(
    logits: torch.Tensor,  # [num_rows, V] float32, read only: the logits before temperature
    temperature: torch.Tensor,  # [num_rows] float32 > 0 (1 on greedy rows)
    min_p: torch.Tensor,  # [num_rows] float32 (0 = off)
    top_k: torch.Tensor,  # [num_rows] int; 0, -1 (any <= 0) or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; 1.0 (any >= 1) is off
) -> Filtered:
    """`filter_top_k_top_p` of the logits after temperature and min_p's mask
    (`scaled_logits` with `min_p_threshold` of `logits / temperature`), the same tensors,
    with one [num_rows, V] tensor written (the filtered logits, new) instead of three: the
    scaled logits are a value each pass that reads them computes again, inside the
    conditional too. One pass makes the tile maxima of `logits / temperature`, which give
    min_p's row maximum and, masked at its threshold, the candidates' first level (a tile's
    maximum survives the mask exactly when some token of it does). They also give
    `greedy`, each row's argmax of the scaled logits (on a greedy row, of `logits`:
    temperature 1 changes nothing, and min_p keeps the maximum)."""
    vocab_size = logits.shape[1]
    unmasked_max = tile_max(logits / temperature[:, None])  # [num_rows, tiles]
    threshold = min_p_threshold(unmasked_max, min_p)  # the row max is the tiles' max
    masked_max = torch.where(unmasked_max < threshold, float("-inf"), unmasked_max)
    scaled = scaled_logits(logits, temperature, threshold)
    candidates = top_candidates(scaled, min(CANDIDATES, vocab_size), masked_max)
    cut = top_k_top_p_cut(
        logits, top_k, top_p, candidates=candidates, scale=(temperature, threshold)
    )
    operands = (logits, temperature, threshold, cut)
    greedy = argmax_by_tiles(scaled, masked_max)
    covered = _covered(candidates, cut)
    return Filtered(cut_scaled(*operands), candidates, covered, greedy, (cut_scaled, operands))


def apply_top_k_top_p(
    logits: torch.Tensor,  # [num_rows, V] float32, updated in place
    top_k: torch.Tensor,  # [num_rows] int; 0, -1 (any <= 0) or >= V is off
    top_p: torch.Tensor,  # [num_rows] float32; 1.0 (any >= 1) is off
) -> torch.Tensor:
    """Set the logits that top-k, then top-p, remove to -inf, in place; returns `logits`."""
    return filter_top_k_top_p(logits, top_k, top_p).logits


class TopKTopPState(SlotTables):
    """Tables: top_k, staged [num_slots] int32 (0 = off); top_p, staged [num_slots] float32
    (1 = off)."""

    def __init__(self, batch_state: BatchState) -> None:
        super().__init__(batch_state)
        self.vocab_size = batch_state.config.vocab_size
        self.top_k = self.staged("top_k", (), torch.int32)
        self.top_p = self.staged("top_p", (), torch.float32, fill=1.0)
        batch_state.register(self)

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        # -1 and k >= V are off, as 0 is: one value, so that off rows skip alike
        top_k = params.top_k if 0 < params.top_k < self.vocab_size else 0
        self.top_k.write(slot, top_k)
        self.top_p.write(slot, params.top_p)

    def apply(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, updated in place
        slots: torch.Tensor,  # [num_rows] int64
    ) -> torch.Tensor:
        """`apply_top_k_top_p` with each row's request parameters."""
        return self.filter(logits, slots).logits

    def filter(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, updated in place
        slots: torch.Tensor,  # [num_rows] int64
    ) -> Filtered:
        """`filter_top_k_top_p` with each row's request parameters."""
        return filter_top_k_top_p(logits, self.top_k.device[slots], self.top_p.device[slots])

    def filter_scaled(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32, read only
        temperature: torch.Tensor,  # [num_rows] float32 > 0
        min_p: torch.Tensor,  # [num_rows] float32
        slots: torch.Tensor,  # [num_rows] int64
    ) -> Filtered:
        """`filter_scaled` with each row's request parameters."""
        top_k, top_p = self.top_k.device[slots], self.top_p.device[slots]
        return filter_scaled(logits, temperature, min_p, top_k, top_p)
