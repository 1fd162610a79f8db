"""The counter-based noise in Triton: `graphsafe_sampler/rng.py`'s draws as jit functions
(the row key, the token hash, the uniform and the Gumbel noise) and the race of one tile
(`race_tile`), which the sampling kernel inlines, and a kernel that writes the draws out for
the tests.

The hash is uint32 arithmetic, so hashes and uniforms are bit-identical to rng.py's; where
the Gumbel transform differs from torch's in the last bits: docs/kernels.md, sampling.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .constants import SALT_SAMPLE
from .dependent_launch import await_prior_grids, pdl_launch
from .library import INTERPRETED, check_rows, inplace_op
from .processed_rows import processed


@triton.jit
def _fmix32(x):
    """MurmurHash3's 32-bit finaliser on uint32 (wrapping multiplies, logical shifts)."""
    x ^= x >> 16
    x *= 0x85EBCA6B
    x ^= x >> 13
    x *= 0xC2B2AE35
    x ^= x >> 16
    return x


@triton.jit
def row_key(seed, position, SALT: tl.constexpr):
    """seed, position: int64 scalars -> (offset, mult) uint32, mult odd (rng.row_keys)."""
    seed_lo = _fmix32((seed & 0xFFFFFFFF).to(tl.uint32))
    # why the mask: >> of int64 copies the sign bit of negative seeds
    seed_hi = _fmix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    pos_lo = _fmix32((position & 0xFFFFFFFF).to(tl.uint32))
    pos_hi = _fmix32(((position >> 32) & 0xFFFFFFFF).to(tl.uint32))
    salt = _fmix32(tl.full((), SALT, tl.uint32))
    # xxHash32's primes, rotated by one for the second lane; IVs from pi's fraction
    offset = (
        0x243F6A88
        + 0x9E3779B1 * seed_lo
        + 0x85EBCA77 * seed_hi
        + 0xC2B2AE3D * pos_lo
        + 0x27D4EB2F * pos_hi
        + 0x165667B1 * salt
    )
    mult = (
        0x85A308D3
        + 0x85EBCA77 * seed_lo
        + 0xC2B2AE3D * seed_hi
        + 0x27D4EB2F * pos_lo
        + 0x165667B1 * pos_hi
        + 0x9E3779B1 * salt
    )
    # odd multiplier: token id -> counter is a bijection
    return _fmix32(offset.to(tl.uint32)), _fmix32(mult.to(tl.uint32)) | 1


@triton.jit
def token_hash(cols, offset, mult):
    """cols: int32 token ids -> uint32 hashes, fmix32(t * mult + offset)."""
    return _fmix32(cols.to(tl.uint32) * mult + offset)


@triton.jit
def uniform(h):
    """uint32 hash -> float32 in [2**-24, 1 - 2**-24]: (h >> 9) * 2**-23 + 2**-24, exact."""
    return (h >> 9).to(tl.float32) * 1.1920928955078125e-07 + 5.960464477539063e-08


@triton.jit
def gumbel(h):
    """uint32 hash -> float32 standard Gumbel noise, -log(-log1p(-f * 2**-32))."""
    # why the clamp: h = 0 would give e = 0, h near 2**32 would round to e = inf
    f = tl.minimum(tl.maximum(h.to(tl.float32), 0.5), 4294967040.0)
    v = f * -2.3283064365386963e-10  # -f * 2**-32, exact: a power-of-two scale
    w = 1.0 + v
    # Goldberg's log1p, log(w) * v / (w - 1) with w = 1 + v, accurate to a few ulp: Triton
    # has no portable log1p (libdevice is CUDA-only and the interpreter has none). The
    # rounding error of w cancels in log(w) / (w - 1); at w == 1, log1p(v) = v to fp32
    # precision
    log1p_v = tl.where(w == 1.0, v, tl.log(w) * (v / (w - 1.0)))
    return -tl.log(-log1p_v)


@triton.jit
def _log2_approx(x, APPROX: tl.constexpr = not INTERPRETED):
    """log2(x) by lg2.approx (one MUFU.LG2; CUDA's `__log2f`: within 2**-22 absolute on
    [0.5, 2], 2 ulp elsewhere; denormals flushed), where `tl.math.log2` is libdevice's
    accurate log2 (about 20 SASS instructions). The interpreter runs no PTX: numpy's log2
    there (within the same bound)."""
    if APPROX:
        y = tl.inline_asm_elementwise(
            "lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        y = tl.math.log2(x)
    return y


SCREEN_ERROR = tl.constexpr(2.0**-10)
"""A bound on |gumbel_screen(h) - gumbel(h)| with a margin (docs/kernels.md, sampling):
the screen's series stops at u**4 (6e-5 at most, in -log(e)), lg2.approx adds 2**-17, and
`gumbel` is a few ulp of its value from exact."""


@triton.jit
def gumbel_screen(h):
    """uint32 hash -> `gumbel(h)` within SCREEN_ERROR, for the race to find the few tokens
    of a tile that can win before it computes their noise exactly: -ln(e) with e =
    -log1p(-u), u = f 2**-32 (f as `gumbel` clamps it), by the series u (1 + u/2 + u**2/3
    + u**3/4) below u = 1/8 (relative error under u**4 / 4) and else -ln(1 - u) (1 - u is
    0.875 at most, and exact from u = 1/2), both logs approximate (`_log2_approx`): about 16
    SASS instructions an element, where `gumbel`'s two accurate logs and a division take
    about 80."""
    f = tl.minimum(tl.maximum(h.to(tl.float32), 0.5), 4294967040.0)
    u = f * 2.3283064365386963e-10  # f 2**-32, exact
    series = u * (1.0 + u * (0.5 + u * (0.3333333432674408 + u * 0.25)))
    e = tl.where(u < 0.125, series, _log2_approx(1.0 - u) * -0.6931471805599453)
    return _log2_approx(e) * -0.6931471805599453


FEW_SURVIVORS = tl.constexpr(2)
"""A tile with at most this many tokens left by the cut (its lowest and highest survivor)
hashes them alone rather than all BLOCK_SIZE of its tokens."""

GUMBEL_MAX = tl.constexpr(23.0)
"""Above every noise `gumbel` draws: -log(e) with e >= 2**-33 (rng.py's clamp of h at
0.5) is at most 33 ln 2 = 22.874, plus room for the GPU's approximate log."""


@triton.jit
def _lowest_highest(keep, cols):
    """(how many of `cols` `keep` holds, the lowest, the highest): three reductions."""
    count = tl.sum(keep.to(tl.int32), axis=0)
    low = tl.min(tl.where(keep, cols, 2147483647), axis=0)
    return count, low, tl.max(tl.where(keep, cols, -1), axis=0)


@triton.jit
def _race_few(low, high, count, start, offset, mult, row_ptr, divisor):
    """The race of a tile's `count` <= FEW_SURVIVORS tokens that can win, its lowest and
    highest (one token when they meet) -> (their best, its index; the lower on a tie), or
    (-inf, start) for none: their logits loaded again (both loads issued at once) and their
    exact noise alone, instead of the whole tile's."""
    tile_max = tl.full((), float("-inf"), tl.float32)
    tile_index = start
    if count > 0:
        low_x = processed(tl.load(row_ptr + low), divisor)
        high_x = tl.load(row_ptr + high, mask=count > 1, other=float("-inf"))
        tile_max = low_x + gumbel(token_hash(low, offset, mult))
        tile_index = low
        if count > 1:
            high_x = processed(high_x, divisor) + gumbel(token_hash(high, offset, mult))
            tile_index = tl.where(high_x > tile_max, high, low)
            tile_max = tl.maximum(tile_max, high_x)
    return tile_max, tile_index


@triton.jit
def race_tile(x, cols, start, in_row, top, best, is_random, offset, mult, row_ptr, divisor):
    """One tile of the sampling kernel's walk: its logits `x` (cut, NaN-free, -inf where
    out of the row) at `cols` from `start`, their max or bound `top`, against the walk's
    best so far -> (the tile's best, its lowest index), -inf when it cannot win: a random
    row's logits plus their noise, a greedy row's logits. `row_ptr` and `divisor` reload a
    few survivors (`processed_rows.processed`)."""
    tile_max = tl.full((), float("-inf"), tl.float32)
    tile_index = start
    if is_random:
        # a tile whose largest logit (or its bound) plus the largest noise cannot beat
        # the best (a tie keeps the earlier best) is not hashed: a tile wholly below the
        # cut, or far below the best, costs its load and a reduction or two
        if top + GUMBEL_MAX > best:
            alive = x > float("-inf")
            count = tl.sum(alive.to(tl.int32), axis=0)
            if count <= FEW_SURVIVORS:
                # a tile the cut leaves one or two tokens (top-k's usual tile)
                _, low, high = _lowest_highest(alive, cols)  # (its count is the one above)
            else:
                # the screen: every token's noise within SCREEN_ERROR. A token's exact sum
                # lies within the sums' error of its screened one (the error, plus 8 ulps
                # of the max for the sums' rounding): none can beat the best where the
                # screen's max plus twice that does not (most tiles, past a walk's first),
                # and only those within twice it of the screen's max can be the tile's best
                screened = x + gumbel_screen(token_hash(cols, offset, mult))
                screen_max = tl.max(screened, axis=0)
                error = SCREEN_ERROR + tl.abs(screen_max) * 9.5367431640625e-07  # 2**-20
                count, low, high = 0, start, start
                if screen_max + 2.0 * error > best:
                    count, low, high = _lowest_highest(
                        screened >= screen_max - 2.0 * error, cols
                    )  # fmt: skip
                # (an infinite max, a +inf logit's, takes every token's exact noise)
                count = tl.where(tl.abs(screen_max) == float("inf"), FEW_SURVIVORS + 1, count)
            if count <= FEW_SURVIVORS:
                tile_max, tile_index = _race_few(low, high, count, start, offset, mult,
                                                 row_ptr, divisor)  # fmt: skip
            else:
                x = x + gumbel(token_hash(cols, offset, mult))
                tile_max = tl.max(x, axis=0)
                tile_index = tl.min(tl.where(x == tile_max, cols, 2147483647), axis=0)
    else:
        tile_max = tl.max(x, axis=0)
        tile_index = tl.min(tl.where((x == tile_max) & in_row, cols, 2147483647), axis=0)
    return tile_max, tile_index


@triton.jit
def _rng_noise_kernel(
    seeds_ptr,  # [num_rows] int64
    positions_ptr,  # [num_rows] int64
    hashes_ptr,  # [num_rows, V] int64, written: hashes in [0, 2**32)
    uniforms_ptr,  # [num_rows, V] float32, written
    gumbels_ptr,  # [num_rows, V] float32, written
    vocab_size,
    SALT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    await_prior_grids(PDL)
    row = tl.program_id(0)
    offset, mult = row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row), SALT)
    out = row.to(tl.int64) * vocab_size
    for start in range(0, vocab_size, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        in_row = cols < vocab_size
        h = token_hash(cols, offset, mult)
        tl.store(hashes_ptr + out + cols, h.to(tl.int64), mask=in_row)
        tl.store(uniforms_ptr + out + cols, uniform(h), mask=in_row)
        tl.store(gumbels_ptr + out + cols, gumbel(h), mask=in_row)


def launch_rng_noise(
    seeds: torch.Tensor,  # [num_rows] int64
    positions: torch.Tensor,  # [num_rows] int64
    hashes: torch.Tensor,  # [num_rows, V] int64, written
    uniforms: torch.Tensor,  # [num_rows, V] float32, written
    gumbels: torch.Tensor,  # [num_rows, V] float32, written
    salt: int = SALT_SAMPLE,
    block_size: int = 1024,
) -> None:
    """Launch `_rng_noise_kernel`: the kernel's random draws, for tests and debugging.
    Outputs must be contiguous. Allocates nothing, returns None."""
    num_rows, vocab_size = hashes.shape
    _rng_noise_kernel[(num_rows,)](
        seeds,
        positions,
        hashes,
        uniforms,
        gumbels,
        vocab_size,
        SALT=salt,
        BLOCK_SIZE=block_size,
        **pdl_launch(hashes.device),
    )


@inplace_op("rng_noise", mutates_args=("hashes", "uniforms", "gumbels"))
def rng_noise(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    hashes: torch.Tensor,
    uniforms: torch.Tensor,
    gumbels: torch.Tensor,
    salt: int = 0,
) -> None:
    """The sampling kernel's draws for token ids 0..V-1 (tests and debugging).

    seeds, positions [num_rows] int64; hashes [num_rows, V] int64, uniforms and gumbels
    [num_rows, V] float32, all contiguous and written.
    """
    num_rows = seeds.shape[0]
    check_rows("seeds", seeds, torch.int64, num_rows)
    check_rows("positions", positions, torch.int64, num_rows)
    for name, t, dtype in (
        ("hashes", hashes, torch.int64),
        ("uniforms", uniforms, torch.float32),
        ("gumbels", gumbels, torch.float32),
    ):
        if t.dtype != dtype or t.dim() != 2 or t.shape != hashes.shape:
            raise ValueError(f"{name} must be {dtype} of shape {tuple(hashes.shape)}")
        if not t.is_contiguous() or t.shape[0] != num_rows:
            raise ValueError(f"{name} must be contiguous with {num_rows} rows")
    launch_rng_noise(seeds, positions, hashes, uniforms, gumbels, salt)
