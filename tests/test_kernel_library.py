"""kernels/library.py's shared Triton helpers on their own (the arithmetic ones, divide_by and
hoisted_reciprocal, are tested beside processing, their one user): `tiles_to_visit`, the
tile list every consumer of the tile maxima walks, `kth_known` and `kth_known_of_few`, the
floors taken from it, `update_tiles`, which keeps the table exact through processing's
sparse phases, and `max_or_nan`, the tile maxima's reduction."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from graphsafe_sampler.kernels.library import (
    chunk_bounds,
    kth_known,
    kth_known_of_few,
    max_or_nan,
    tiles_to_visit,
    update_tiles,
)


def _gen() -> torch.Generator:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


@triton.jit
def _list_kernel(
    table_ptr, floors_ptr, visits_ptr, counts_ptr, num_tiles, chunk_tiles, stride,
    TILES_BLOCK: tl.constexpr,
):  # fmt: skip
    """Program (row, part) lists the tiles [part * chunk_tiles, ...) of its row."""
    row = tl.program_id(0)
    first = tl.program_id(1) * chunk_tiles
    last = tl.minimum(first + chunk_tiles, num_tiles)
    listed = row * num_tiles + first
    bounds = chunk_bounds(table_ptr + row * num_tiles * stride, stride, first, last, TILES_BLOCK)
    count = tiles_to_visit(
        bounds, first, last, tl.load(floors_ptr + row), visits_ptr + listed, TILES_BLOCK
    )
    tl.store(counts_ptr + row * tl.num_programs(1) + tl.program_id(1), count)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("chunk_tiles", [1, 5, 13])
def test_tiles_to_visit_lists_the_tiles_at_or_above_the_floor(
    stride: int, chunk_tiles: int, kernel_device: torch.device
) -> None:
    """Each chunk's tiles whose max is not below the row's floor, in column order, and
    nothing else written: unknown (+inf) tiles always; every tile at a -inf or NaN floor
    (the mask's own comparison); at a +inf floor only the unknown ones; a tile equal to the
    floor listed. With stride 2 (the raw-tile table: max, sum) the sums, planted above every
    floor, are never read as maxima."""
    gen = _gen()
    rows, num_tiles = 6, 13
    maxima = torch.randn(rows, num_tiles, generator=gen) * 4
    maxima[torch.rand(rows, num_tiles, generator=gen) < 0.2] = float("inf")
    maxima[1, 3] = float("-inf")  # an all -inf tile
    floors = maxima.nan_to_num(posinf=0.0).quantile(0.6, dim=1)
    floors[2] = float("-inf")
    floors[3] = float("nan")
    floors[4] = float("inf")
    floors[5] = maxima[5, 7] = 1.5  # a tile at the floor exactly
    table = maxima
    if stride == 2:
        table = torch.stack([maxima, torch.full_like(maxima, 1e30)], dim=-1)
    parts = triton.cdiv(num_tiles, chunk_tiles)
    visits = torch.full((rows, num_tiles), -7, dtype=torch.int32)
    counts = torch.full((rows, parts), -7, dtype=torch.int32)
    moved = [t.contiguous().to(kernel_device) for t in (table, floors, visits, counts)]
    block = triton.next_power_of_2(chunk_tiles)
    _list_kernel[(rows, parts)](*moved, num_tiles, chunk_tiles, stride, TILES_BLOCK=block)
    visits, counts = moved[2].cpu(), moved[3].cpu()
    for row in range(rows):
        for part in range(parts):
            first = part * chunk_tiles
            last = min(first + chunk_tiles, num_tiles)
            floor = float(floors[row])
            want = [t for t in range(first, last) if not float(maxima[row, t]) < floor]
            got = visits[row, first:last].tolist()
            assert counts[row, part] == len(want), (row, part)
            assert got[: len(want)] == want and set(got[len(want) :]) <= {-7}, (row, part)
    # the cases the floors planted: every tile, only the unknown ones, the tie
    assert counts[2].sum() == counts[3].sum() == num_tiles
    assert counts[4].sum() == int(torch.isinf(maxima[4]).logical_and(maxima[4] > 0).sum())
    assert 7 in visits[5].tolist()


@triton.jit
def _update_kernel(table_ptr, before_ptr, after_ptr, tokens_ptr, n, BLOCK_SIZE: tl.constexpr,
                   LANES: tl.constexpr):  # fmt: skip
    lanes = tl.arange(0, LANES)
    used = lanes < n
    token = tl.load(tokens_ptr + lanes, mask=used, other=0)
    old = tl.load(before_ptr + token, mask=used, other=0.0)
    new = tl.load(after_ptr + token, mask=used, other=0.0)
    entry = tl.load(table_ptr + token // BLOCK_SIZE, mask=used, other=float("inf"))
    update_tiles(table_ptr, token, old, entry, new, used, BLOCK_SIZE)


def test_update_tiles_keeps_each_entry_exact_or_unknown(kernel_device: torch.device) -> None:
    """Changed tokens, several sharing each tile: an entry becomes the new tile's exact max,
    or +inf (unknown) exactly where a token that held the tile's max fell or became NaN.
    Ties at the max, a token raised above its tile, one lowered from the max, -inf stores;
    every tile's expected entry from the rows before and after the change."""
    from tile_maxima import exact_tile_maxima

    gen = _gen()
    block, tiles = 16, 12
    vocab = block * tiles
    before = torch.round(torch.randn(1, vocab, generator=gen) * 8) / 4  # ties happen
    # drawn from the first 9 tiles: the last 3 keep exact entries (the check below), where
    # over all 12 tiles 10 or more went unknown in 4.5e-5 of the draws
    tokens = torch.randperm(9 * block, generator=gen)[:60]
    after = before.clone()
    draws = torch.rand(len(tokens), generator=gen)
    for token, draw in zip(tokens.tolist(), draws.tolist(), strict=True):
        if draw < 0.3:
            after[0, token] = float("-inf")  # a stop id or a banned token
        elif draw < 0.6:
            after[0, token] = before[0, token] + 40.0 * draw  # a bias up: may top its tile
        else:
            after[0, token] = before[0, token] - 40.0 * draw  # a bias down
    after[0, int(tokens[0])] = float("nan")
    table = exact_tile_maxima(before, block)[0]
    moved = [t.clone().to(kernel_device) for t in (table, before[0], after[0])]
    tokens_d = tokens.to(torch.int32).to(kernel_device)
    _update_kernel[(1,)](*moved, tokens_d, len(tokens), BLOCK_SIZE=block, LANES=64)
    got = moved[0].cpu()
    changed = torch.zeros(vocab, dtype=torch.bool)
    changed[tokens] = True
    at_max = before[0] == table.repeat_interleave(block)
    fell = changed & ((at_max & ~(after[0] >= before[0])) | torch.isnan(after[0]))
    unknown = fell.view(tiles, block).any(-1)
    want = torch.where(unknown, float("inf"), exact_tile_maxima(after, block)[0])
    assert torch.equal(got, want), (got, want)
    assert bool(unknown.any()) and bool(torch.isfinite(want).sum() >= 3)


@triton.jit
def _max_kernel(
    x_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, BY_OPERATOR: tl.constexpr
):  # fmt: skip
    """Program b reduces block b, [ROWS, COLS] (the dense pass's tile shape)."""
    at = tl.program_id(0) * ROWS * COLS
    block = at + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    tl.store(out_ptr + tl.program_id(0), max_or_nan(tl.load(x_ptr + block), BY_OPERATOR))


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # numpy's, on block 4
@pytest.mark.parametrize("by_operator", [True, False], ids=["operator", "vectorized"])
def test_max_or_nan_is_the_max_or_nan_where_a_block_holds_one(
    by_operator: bool, kernel_device: torch.device
) -> None:
    """Each block's max, NaN wherever it holds a NaN (at any position, beside +inf or
    alone), -inf for an all -inf block: `torch.amax`, which propagates NaN the same way.
    Both forms: the compiled one (the NaN-propagating operator) and the interpreter's. A
    NaN-ignoring max (tl.max) returns a finite max or +inf for the NaN blocks."""
    gen = _gen()
    blocks, rows, cols = 12, 32, 32
    x = torch.randn(blocks, rows * cols, generator=gen) * 8
    nan_at = torch.randint(0, rows * cols, (blocks,), generator=gen)
    for b in (1, 2, 3, 4):
        x[b, nan_at[b]] = float("nan")  # one NaN somewhere in an otherwise finite block
    x[3, (nan_at[3] + 1) % (rows * cols)] = float("inf")  # and beside a +inf
    x[4] = float("nan")
    x[5, nan_at[5]] = float("inf")  # +inf, no NaN
    x[6] = float("-inf")
    x[7, nan_at[7]] = float("-inf")
    out = torch.full((blocks,), -7.0)
    moved = [t.to(kernel_device) for t in (x, out)]
    _max_kernel[(blocks,)](*moved, ROWS=rows, COLS=cols, BY_OPERATOR=by_operator)
    got, want = moved[1].cpu(), x.amax(dim=1)
    assert want[1:5].isnan().all() and want[5] == float("inf") and want[6] == float("-inf")
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@triton.jit
def _kth_kernel(
    bounds_ptr, k_ptr, sorted_ptr, few_ptr, K: tl.constexpr, TILES: tl.constexpr,
    COMPILED_FORM: tl.constexpr,
):  # fmt: skip
    """Program r: row r's k-th largest known tile max, by `kth_known` (k from the table)
    and, for k = K, by `kth_known_of_few`; in their compiled forms (the sort, the top-k)
    or the interpreter's (the counting)."""
    tiles = tl.arange(0, TILES)
    bounds = tl.load(bounds_ptr + tl.program_id(0) * TILES + tiles)
    k = tl.load(k_ptr + tl.program_id(0))
    tl.store(sorted_ptr + tl.program_id(0), kth_known(bounds, tiles, k, COMPILED_FORM))
    tl.store(few_ptr + tl.program_id(0), kth_known_of_few(bounds, K, COMPILED_FORM))


@pytest.mark.parametrize("compiled_form", [True, False], ids=["sort", "counting"])
@pytest.mark.parametrize("k", [1, 5, 8])
def test_kth_known_is_the_kth_largest_known_max(
    k: int, compiled_form: bool, kernel_device: torch.device
) -> None:
    """The k-th largest entry of a row's tile maxima with its repeats counted, unknown
    (+inf) entries left out: the sort's (any k) and the top-k's (a constant K, logprobs')
    alike, and the interpreter's counting; -inf where fewer than k entries are known.
    Rows: random, rounded (ties at the k-th), unknown entries among the k largest, -inf
    padding past the row, and too few known."""
    gen = _gen()
    rows, tiles = 5, 256
    bounds = torch.randn(rows, tiles, generator=gen) * 4
    bounds[1] = bounds[1].round()  # ties
    top = bounds[2].topk(k + 2).indices
    bounds[2, top[: k + 1]] = float("inf")  # unknown: the k-th comes from further down
    bounds[3, 149:] = float("-inf")  # a row of 149 tiles
    bounds[4, k - 1 :] = float("inf")  # k - 1 known
    known = bounds.where(bounds < float("inf"), float("-inf"))
    want = known.sort(dim=1, descending=True).values[:, k - 1]
    assert want[4] == float("-inf")
    got = [torch.full((rows,), 7.0, device=kernel_device) for _ in range(2)]
    ks = torch.full((rows,), k, dtype=torch.int32, device=kernel_device)
    _kth_kernel[(rows,)](
        bounds.to(kernel_device), ks, *got, K=k, TILES=tiles, COMPILED_FORM=compiled_form
    )
    for value in got:
        assert torch.equal(value.cpu(), want)


@pytest.mark.parametrize("compiled_form", [True, False], ids=["sort", "counting"])
def test_kth_known_of_a_block_smaller_than_k(
    compiled_form: bool, kernel_device: torch.device
) -> None:
    """A row of fewer tiles than k (a small vocabulary's block of 4): -inf, by the sort and
    by the top-k (which takes the whole block then), and the max at k = 1; -inf at k = 0
    (`kth_known`, whose k is a runtime value)."""
    gen = _gen()
    bounds = torch.randn(2, 4, generator=gen)
    for k, want in ((5, torch.full((2,), float("-inf"))), (1, bounds.amax(dim=1))):
        got = [torch.full((2,), 7.0, device=kernel_device) for _ in range(2)]
        ks = torch.full((2,), k, dtype=torch.int32, device=kernel_device)
        _kth_kernel[(2,)](
            bounds.to(kernel_device), ks, *got, K=k, TILES=4, COMPILED_FORM=compiled_form
        )
        for value in got:
            assert torch.equal(value.cpu(), want)
    got = [torch.full((2,), 7.0, device=kernel_device) for _ in range(2)]
    zero = torch.zeros(2, dtype=torch.int32, device=kernel_device)
    _kth_kernel[(2,)](
        bounds.to(kernel_device), zero, *got, K=1, TILES=4, COMPILED_FORM=compiled_form
    )
    assert torch.equal(got[0].cpu(), torch.full((2,), float("-inf")))
