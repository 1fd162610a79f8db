"""The candidates: each row's largest logits, found from tile maxima instead of a top-k
over the row, and what else the tiles give (the greedy argmax, the logsumexp's sums).

Not a stage of its own: top-k/top-p (`top_k_top_p.py`), the logprobs (`logprobs.py`) and the
vocabulary-parallel pipeline take their candidates here. The tiles' layout and why it is
cheap on a CPU, and why the two small top-k's give topk's values exactly: docs/kernels.md,
"The PyTorch stage: candidates first".
"""

from __future__ import annotations

from typing import NamedTuple

import torch

CANDIDATES = 128
"""The largest logits of a row that `top_k_top_p.candidate_cut` keeps: a top-k with k up to
this, and a top-p whose nucleus lies within them, are settled from them alone."""

CANDIDATE_TILE = 32
"""Tokens a tile of `top_candidates`' first level (its maximum stands for it)."""

TILE_LANES = 16
"""Tiles a block interleaves. A block is `CANDIDATE_TILE * TILE_LANES` consecutive tokens,
viewed [CANDIDATE_TILE, TILE_LANES]: tile j of the block holds its tokens j, j + 16, ...
Why: a tile's maximum is then a column of the view, so a block's 16 maxima are one vertical
max of 32 vectors (16 float32 lanes, AVX-512's width), where a tile of 32 consecutive tokens
costs a horizontal reduction a tile (2-4x the pass on a CPU, docs/kernels.md)."""

TILE_BLOCK = CANDIDATE_TILE * TILE_LANES
"""Tokens a block of `TILE_LANES` interleaved tiles: the last block of a row is padded with
-inf."""

CANDIDATE_GROUP = 8
"""Tiles a group of `top_candidates`' threshold level (where the row has n groups or more)."""


class Candidates(NamedTuple):
    """Each row's `n` largest logits: values [num_rows, n] float32, descending (NaN first),
    and their token ids [num_rows, n] int64 (among equal values in no set order; where the
    row has fewer than n tokens above -inf, an id of a -inf value may repeat another)."""

    values: torch.Tensor
    ids: torch.Tensor


def num_tiles(length: int) -> int:
    """The tiles of a row of `length` tokens: `TILE_LANES` a block, the last padded."""
    return -(-length // TILE_BLOCK) * TILE_LANES


def tile_blocks(values: torch.Tensor) -> list[torch.Tensor]:
    """[num_rows, L] -> its blocks, [num_rows, blocks, CANDIDATE_TILE, TILE_LANES] each: the
    whole ones (a view), then a last one padded with -inf where L is no multiple of
    `TILE_BLOCK`. Tile `b * TILE_LANES + j` is column j of block b. Kept apart, not padded
    whole: a fused pad is a masked load of every token."""
    num_rows, length = values.shape
    whole = length // TILE_BLOCK
    blocks = []
    if whole:
        blocks.append(
            values[:, : whole * TILE_BLOCK].view(num_rows, whole, CANDIDATE_TILE, TILE_LANES)
        )
    if whole * TILE_BLOCK < length:
        rest = values[:, whole * TILE_BLOCK :]
        last = torch.nn.functional.pad(rest, (0, TILE_BLOCK - rest.shape[1]), value=float("-inf"))
        blocks.append(last.view(num_rows, 1, CANDIDATE_TILE, TILE_LANES))
    return blocks


def _join_tiles(per_block: list[torch.Tensor]) -> torch.Tensor:
    """[num_rows, blocks, TILE_LANES] pieces -> [num_rows, tiles], in tile order."""
    flat = [piece.flatten(1) for piece in per_block]
    return flat[0] if len(flat) == 1 else torch.cat(flat, dim=1)


def tile_max(values: torch.Tensor) -> torch.Tensor:
    """[num_rows, L] -> [num_rows, num_tiles(L)]: each tile's maximum (NaN where it holds
    one; -inf for a tile of padding alone)."""
    return _join_tiles([block.amax(2) for block in tile_blocks(values)])


def tile_exp_sums(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_rows, L] -> ([num_rows, tiles] `tile_max(values)`, [num_rows, tiles] each tile's
    sum of exp(value - shift), shift its maximum where finite, else 0: an all -inf tile
    sums to 0, not NaN). One pass: each block's maxima and sums fuse into one loop."""
    maxima, sums = [], []
    for block in tile_blocks(values):
        top = block.amax(2)  # [num_rows, blocks, TILE_LANES]
        maxima.append(top)
        sums.append(torch.exp(block - tile_shifts(top)[:, :, None, :]).sum(2))
    return _join_tiles(maxima), _join_tiles(sums)


def tile_shifts(maxima: torch.Tensor) -> torch.Tensor:
    """Tile maxima -> the shift of each tile's sum of exp (`tile_exp_sums`): its maximum
    where finite, else 0, so that an all -inf tile sums to 0, not NaN."""
    # |x| < inf, not isfinite(): inductor's CPU code tests isfinite lane by lane
    return torch.where(maxima.abs() < float("inf"), maxima, 0.0)


def tile_token_ids(tiles: torch.Tensor) -> torch.Tensor:
    """tile indices [num_rows, n] int64 -> [num_rows, n, CANDIDATE_TILE] int64: the token ids
    each tile holds, in `tile_blocks`' layout (ids >= L are the last block's padding)."""
    block, lane = tiles // TILE_LANES, tiles % TILE_LANES
    steps = torch.arange(CANDIDATE_TILE, device=tiles.device) * TILE_LANES
    return (block * TILE_BLOCK + lane)[:, :, None] + steps


def _run_max(values: torch.Tensor, width: int) -> torch.Tensor:
    """[num_rows, L] -> [num_rows, ceil(L / width)]: each run of `width` consecutive
    columns' maximum (NaN where it holds one), the last run padded with -inf."""
    num_rows, length = values.shape
    runs = -(-length // width)
    pad = runs * width - length
    padded = torch.nn.functional.pad(values, (0, pad), value=float("-inf")) if pad else values
    return padded.view(num_rows, runs, width).amax(-1)


def _at_or_above(values: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """`values` with everything below `bound` [num_rows, 1] set to -inf, NaN kept: when n
    of them reach `bound`, their top n values are unchanged."""
    # `values != values`, not isnan(): inductor's CPU code tests isnan lane by lane
    return torch.where((values >= bound) | (values != values), values, float("-inf"))


def _nth_largest(top: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[num_rows, 1]: the n-th largest value of a row from its unsorted top n (half a sorted
    top-k's cost on a CPU), their least but NaN: topk ranks NaN first. +inf where all n are
    NaN, a bound that keeps the NaN (`_at_or_above`) and so as many entries as before."""
    values = top[0]
    return torch.where(values != values, float("inf"), values).amin(-1, keepdim=True)


def top_candidates(
    logits: torch.Tensor,  # [num_rows, V]
    n: int,
    tiles: torch.Tensor | None = None,  # [num_rows, num_tiles(V)]: tile_max(logits), if at hand
    tiled: bool | None = None,  # None: with `tiles`, compiled, or off a CPU
) -> Candidates:
    """The n largest logits of each row, the values exactly `logits.topk(n)`'s.

    `tiled` (None: where `tiles` are given, under torch.compile, or off a CPU) takes them
    from the tiles as below; else one `topk` over the row, which eagerly on a CPU is the
    cheaper (at 1 x 151,936 and n = 128, 268 against 313 µs, in 1 op instead of ~30; at
    64 x 128,256, 7.3 against 10.2 ms): uncompiled, each of the tiles' small ops is a
    call of its own and the tile maxima a strided reduction.

    Two small top-k's instead of one over the row (which costs about 4 passes over it on a
    CPU): the n tiles of CANDIDATE_TILE tokens (`tile_blocks`) with the largest maxima hold
    the n largest values. Why: the n-th largest tile maximum m is at most the n-th largest value (n
    distinct tokens reach it), and every other tile lies at or below m, so every value above
    m is in a chosen tile, and so are as many copies of a value equal to m as the top n
    hold. A NaN makes its tile's maximum NaN, which both top-k's rank first, as topk does.

    Each top-k first sees its input cut at a bound that n of its entries reach (the top n
    unchanged; CPU topk is 2-3x faster on mostly -inf rows): the gathered values at m, the
    tile maxima, where the row has n groups of CANDIDATE_GROUP tiles, at the n-th largest
    group maximum (n groups each hold a tile that reaches it)."""
    num_rows, vocab_size = logits.shape
    if tiled is None:
        eager_cpu = logits.device.type == "cpu" and not torch.compiler.is_compiling()
        tiled = tiles is not None or not eager_cpu
    if num_tiles(vocab_size) <= n or not tiled:  # (a small vocabulary: one top-k is as cheap)
        values, ids = logits.topk(n, dim=-1)
        return Candidates(values, ids)
    if tiles is None:
        tiles = tile_max(logits)  # [num_rows, num_tiles]
    if -(-tiles.shape[1] // CANDIDATE_GROUP) >= n:
        group_max = _run_max(tiles, CANDIDATE_GROUP)  # [num_rows, groups]
        tiles = _at_or_above(tiles, _nth_largest(group_max.topk(n, dim=-1, sorted=False)))
    top = tiles.topk(n, dim=-1, sorted=False)  # [num_rows, n]
    nth = _nth_largest(top)
    ids = tile_token_ids(top.indices).view(num_rows, -1)  # [num_rows, n * T]
    # The last block's padding reads as -inf at id V-1: picked only among -inf values, it
    # repeats V-1 (then a candidate) or a -inf token, which no consumer tells apart.
    inside = ids < vocab_size
    ids = ids.clamp(max=vocab_size - 1)
    gathered = torch.where(inside, logits.gather(1, ids), float("-inf"))  # [num_rows, n * T]
    values, picks = _at_or_above(gathered, nth).topk(n, dim=-1)
    return Candidates(values, ids.gather(1, picks))


def argmax_by_tiles(
    values: torch.Tensor,  # [num_rows, V] float32
    tiles: torch.Tensor,  # [num_rows, num_tiles(V)]: tile_max(values)
) -> torch.Tensor:
    """[num_rows] int64: `values.argmax(-1)` (the lowest index of the maximum, or of the
    first NaN), from the first block of `TILE_BLOCK` consecutive tokens that holds it: a
    gather of one block a row instead of an argmax over the row, which costs about two max
    passes on a CPU. A block, not a tile: a block's tiles interleave, so the first tile
    that holds the maximum need not hold its lowest index."""
    num_rows, vocab_size = values.shape
    block_max = tiles.view(num_rows, -1, TILE_LANES).amax(-1)  # [num_rows, blocks], NaN kept
    row_max = block_max.amax(-1, keepdim=True)  # NaN where any block is NaN
    holds = (block_max == row_max) | (block_max != block_max)  # [num_rows, blocks]; NaN too
    first = holds.to(torch.int8).argmax(-1, keepdim=True)  # the first True: [num_rows, 1]
    ids = first * TILE_BLOCK + torch.arange(TILE_BLOCK, device=values.device)  # [num_rows, B]
    inside = ids < vocab_size  # the last block's padding is -inf, as tile_max reads it
    block = torch.where(inside, values.gather(1, ids.clamp(max=vocab_size - 1)), float("-inf"))
    return (first[:, 0] * TILE_BLOCK + block.argmax(-1)).long()
