"""Registering a kernel launch as a `torch.library` custom op, the checks its ops share, and
the arithmetic of rows split over programs.

Every op here works in place and returns None, so its fake (what `torch.compile` and
`opcheck` run on meta tensors) allocates nothing and returns None: one generic fake serves
them all, and each op's signature is written once, on the op itself. `custom_op`, not
`triton_op`: it is the registration that also compiles on CPU tensors under the Triton
interpreter (inductor would otherwise trace into the kernel).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import triton
import triton.language as tl

F = TypeVar("F", bound=Callable[..., None])

PIPELINE_STAGES = tl.constexpr(3)
"""Stages of the software pipeline on each kernel's walk over its row's tiles
(`tl.range(..., num_stages=PIPELINE_STAGES)`): on sm_80 and later the loads of the next 2
tiles are in flight (`cp.async`) while one is computed, instead of each tile waiting out the
memory's latency alone. Costs a shared-memory buffer of 2 tiles a program."""

LISTED_STAGES = tl.constexpr(2)
"""Stages of the pipeline on a walk over a tile list (`tiles_to_visit`): each tile's address
is itself a load, so the list's entries are loaded a stage before the tiles. 3 stages, as
estimated by perf/kernel_model.py: the "all" step 0.9 us faster at B = 1, but 0.7 and 1.8
us slower at B = 64 and 256 (sampling took 68 registers, 7 CTAs an SM instead of 9), and a
logprobs variant spilled."""

RACE_STAGES = tl.constexpr(5)
"""Stages of the pipeline on the sampling kernel's race over the later ranks of a covered
row's lists (kernels/list_race.py, `race_lists`: where some list keeps more logits than
its first block of ranks holds), a block of ranks an iteration. When the race went over
the whole union (7 blocks of 256 at B = 1), estimated by perf/kernel_model.py: 7 x (0.8 +
0.1) = 6.3 us unpipelined, 0.8 + 7 x 0.4 = 3.6 at 3 stages, 0.8 + 7 x 0.2 = 2.2 at 5 (no
better at 8)."""

SEARCH_STAGES = tl.constexpr(10)
"""Stages of the pipeline on the cut kernel's passes over a row (the radix search's, the
gather's, the mask's; kernels/top_k_top_p.py): one program streams the whole row in
512-element tiles (`CUT_BLOCK`), so its loads must run further ahead than PIPELINE_STAGES
to keep up with the issue. At 5 both search passes waited on their loads, about 59 us each
at B = 1. At 10 a summing pass (top-p) is bound by its instructions, about 44 us, and a
counting pass (top-k: 92 SASS instructions a tile a thread) still waits on its loads,
about 26 us (estimated, perf/kernel_model.py's top_p case; 10 stages of 2 KB: 20 KB of
shared memory, and the cut kernel at 187-218 registers, under its cap of 256). With a
mask on every tile's load a stage took about 18 registers (about 2 now), and 6 to 8
stages spilled."""


def _no_output(*args: Any, **kwargs: Any) -> None:
    return None


def inplace_op(name: str, mutates_args: Sequence[str]) -> Callable[[F], F]:
    """`torch.library.custom_op("graphsafe_sampler::<name>")` for a function that checks its
    arguments and launches a kernel writing `mutates_args`, with the fake that writes none."""

    def register(fn: F) -> F:
        op = torch.library.custom_op(f"graphsafe_sampler::{name}", mutates_args=mutates_args)(fn)
        op.register_fake(_no_output)
        return op  # type: ignore[return-value]

    return register


def check_logits(logits: torch.Tensor, name: str = "logits") -> None:
    """[num_rows, V] float32 with rows contiguous along the vocabulary."""
    if logits.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"{name} must be 2-D [num_rows, vocab_size], got {logits.dim()}-D")
    if logits.stride(-1) != 1:
        raise ValueError(f"{name} rows must be contiguous (stride 1 along the vocabulary)")


def check_rows(
    name: str, t: torch.Tensor, dtype: torch.dtype | tuple[torch.dtype, ...], num_rows: int
) -> None:
    """A contiguous per-row vector [num_rows] of `dtype` (or one of several)."""
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must be {want}, got {t.dtype}")
    if t.shape != (num_rows,):
        raise ValueError(f"{name} must have shape ({num_rows},), got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_table(
    name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int | None, ...]
) -> None:
    """dtype, contiguity and shape (None = any size along that dimension)."""
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(
        n is not None and n != m for n, m in zip(shape, t.shape, strict=True)
    ):
        want = ", ".join("*" if n is None else str(n) for n in shape)
        raise ValueError(f"{name} must have shape [{want}], got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


TILE = 1024
"""The columns of the tiles the kernels walk a row in (their launchers' default
`block_size`); a tile-max table holds one entry per tile."""


def tile_count(vocab_size: int, block_size: int = TILE) -> int:
    """The tiles of a row: ceil(V / block_size), the columns of a tile-max table."""
    return triton.cdiv(vocab_size, block_size)


def check_tile_max(tile_max: torch.Tensor, num_rows: int, vocab_size: int) -> None:
    """A tile-max table: contiguous float32 [num_rows, ceil(V / TILE)] (docs/kernels.md,
    tile maxima)."""
    check_table("tile_max", tile_max, torch.float32, (num_rows, tile_count(vocab_size)))


def check_raw_tiles(raw_tiles: torch.Tensor, num_rows: int, vocab_size: int) -> None:
    """A raw-tile table: contiguous float32 [num_rows, ceil(V / TILE), 2], each tile's max
    and sum of exp (docs/kernels.md, tile maxima)."""
    shape = (num_rows, tile_count(vocab_size), 2)
    check_table("raw_tiles", raw_tiles, torch.float32, shape)


@triton.jit
def forget_tiles(tile_row, token, mask, BLOCK_SIZE: tl.constexpr):
    """Mark the tiles holding `token` (where `mask`) unknown in the row's tile-max table: a
    phase after the dense pass changed one of their logits in a way `update_tiles` cannot
    follow. +inf: every consumer reads the tile, and no floor is taken from it. (Reading
    those tiles again for their max would chain a load's latency per tile a program.)"""
    tl.store(tile_row + token // BLOCK_SIZE, tl.full(token.shape, float("inf"), tl.float32), mask)


@triton.jit
def load_old(row_ptr, tile_row, token, mask, HAS_TILE_MAX: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """(the logits of `token`, their tiles' entries: +inf without HAS_TILE_MAX) where `mask`
    (elsewhere 0 and +inf), for `update_tiles`: loaded together, before the phase's store,
    in one round of loads where loading the entry in `update_tiles` took a second."""
    old = tl.load(row_ptr + token, mask=mask, other=0.0)
    entry = tl.full(token.shape, float("inf"), tl.float32)
    if HAS_TILE_MAX:
        entry = tl.load(tile_row + token // BLOCK_SIZE, mask=mask, other=float("inf"))
    return old, entry


@triton.jit
def update_tiles(tile_row, token, old, entry, new, mask, BLOCK_SIZE: tl.constexpr):
    """After a phase past the dense pass changed `token`'s logit from `old` to `new` (where
    `mask`; `old` and its tile's `entry` from `load_old`, before the phase's store), keep
    the tile's entry exact: the max of the entry and `new`, unless the token held the
    tile's max and fell (the next largest is not at hand) or `new` is NaN: then +inf,
    unknown. Lanes sharing a tile combine by an atomic max, which lets a lane read the
    entry before or after another's: an entry raised by a lane is the new max whichever the
    falling token was, and +inf wins."""
    known = ((old < entry) | (new >= old)) & (new == new)
    at = tile_row + token // BLOCK_SIZE
    tl.atomic_max(at, tl.where(known, tl.maximum(entry, new), float("inf")), mask=mask)


@triton.jit
def hoisted_reciprocal(d):
    """For a row's divisor d (a scalar): (RN(1/d), in_range), `divide_by`'s reciprocal and
    whether d lies in [2**-20, 2**20], where `divide_by` is proven exact."""
    in_range = (d >= 9.5367431640625e-07) & (d <= 1048576.0)  # 2**-20, 2**20
    return tl.math.div_rn(1.0, d), in_range


@triton.jit
def divide_by(x, d, d_inv):
    """(x / d, outside) for d in [2**-20, 2**20] with d_inv = RN(1/d) computed once: the
    division rounded to nearest, as IEEE division rounds it, by one multiply and two fused
    multiply-adds (the known-divisor case of Markstein's theorem: q = RN(x d_inv) lies
    within an ulp of x / d, the residual q d - x is exact, and q - RN(residual d_inv) is
    x / d rounded), for x = ±0 (the residual's sign keeps -0.0), NaN, and 2**-100 <= |x|
    <= 2**104: there the residual is exact and x / d is normal, far from overflow. `outside`
    marks every other x (±inf included, which give NaN here), for the caller to divide
    again with `tl.math.div_rn`. About 7 SASS instructions an element, the check included,
    where div_rn inlines about 17 (a reciprocal, its refinement, and a range check)."""
    q = x * d_inv
    residual = tl.fma(q, d, -x)
    magnitude = tl.abs(x)
    outside = ((magnitude < 7.888609052210118e-31) & (x != 0.0)) | (
        magnitude > 2.028240960365167e31
    )
    return tl.fma(-residual, d_inv, q), outside


@triton.jit
def exp_ftz(x):
    """exp(x) as exp2(x log2 e), whose lowering is one MUFU.EX2 with results below 2**-126
    flushed to zero (ex2.approx.ftz), where `tl.exp` spends 4 more SASS instructions an
    element keeping them denormal. For the kernels' sums of exp against a max, where the
    largest term is 1, a flushed term changes no float32 sum."""
    return tl.math.exp2(x * 1.4426950408889634)


INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")
"""Whether Triton runs the kernels in its interpreter: read when this module is imported,
as Triton reads it when `triton.jit` wraps a kernel."""


@triton.jit
def _maximum_or_nan(a, b):
    """Reduction operator: the larger of a and b, NaN where either is (PTX max.NaN)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_or_nan(x, BY_OPERATOR: tl.constexpr = not INTERPRETED):
    """The largest element of the block x (float32, any shape), NaN where x holds one.
    Compiled, a reduction by `_maximum_or_nan`: one FMNMX.NAN a step, where `tl.max`
    (NaN-ignoring) needs each NaN made +inf first, a comparison and a select an element (16
    SASS instructions a tile a thread of the dense pass, for its two maxima). The
    interpreter runs a reduction by a jit operator element by element in Python (about
    1,000 calls a tile), so there (BY_OPERATOR False) the same value comes from two of its
    vectorized reductions, the NaN-ignoring max and a NaN count."""
    if BY_OPERATOR:
        top = tl.reduce(x, None, _maximum_or_nan)
    else:
        top = tl.where(tl.max((x != x).to(tl.int32)) > 0, float("nan"), tl.max(x))
    return top


@triton.jit
def raw_tile_stats(x, in_tile):
    """(max, sum(exp(x - max))) of a tile's raw logits `x` (float32, any shape) over
    `in_tile`: the max +inf where the tile holds NaN (an upper bound every consumer reads),
    and a -inf max shifts by 0, so that -inf - -inf never makes NaN. NaN or +inf make the
    sum NaN, as the logsumexp of the row is then."""
    top = max_or_nan(tl.where(in_tile, x, float("-inf")))
    top = tl.where(top == top, top, float("inf"))  # a scalar select, not one an element
    shift = tl.where(top == float("-inf"), 0.0, top)
    return top, tl.sum(tl.where(in_tile, exp_ftz(x - shift), 0.0))


@triton.jit
def chunk_bounds(tile_row, stride, first, last, TILES_BLOCK: tl.constexpr):
    """[TILES_BLOCK] the maxima of the chunk's tiles [first, last) (tile t's at tile_row[t *
    stride]), -inf past it, for `tiles_to_visit`. They depend on the row alone: a program
    loads them where it starts, with its other loads (a warp issues in order, so a load
    after a use of loaded data, the row's parameters say, waits a memory latency more).
    TILES_BLOCK: a power of two >= last - first."""
    tiles = first + tl.arange(0, TILES_BLOCK)
    return tl.load(tile_row + tiles * stride, mask=tiles < last, other=float("-inf"))


@triton.jit
def tiles_to_visit(bounds, first, last, floor, visits_row, TILES_BLOCK: tl.constexpr):
    """The chunk's tiles [first, last) whose max (`bounds`, from `chunk_bounds`) reaches
    `floor` (entries +inf, unknown, always; every tile when the floor is -inf or NaN),
    written in column order to visits_row[0:n] -> n. A walk over the list reads no other
    tile and pays nothing for them, where a walk over every tile that skipped some paid a
    masked load and the loop's bookkeeping for each (about 75 SASS instructions a tile a
    thread at 8 warps). A barrier orders the stores before the walk's loads of them."""
    tiles = first + tl.arange(0, TILES_BLOCK)
    in_chunk = tiles < last
    # the mask's own comparison, which a NaN floor never makes true
    keep = in_chunk & ~(bounds < floor)
    position = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    tl.store(visits_row + position, tiles, mask=keep)
    tl.debug_barrier()
    return tl.sum(keep.to(tl.int32), axis=0)


@triton.jit
def listed_tile(visits_ptr, listed, first, visit, LISTED: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """The first column of a walk's `visit`-th tile: the tile `tiles_to_visit` wrote at
    visits_ptr[listed + visit] (LISTED), or else the chunk's tiles in turn from `first`."""
    start = (first + visit) * BLOCK_SIZE
    if LISTED:
        start = tl.load(visits_ptr + listed + visit) * BLOCK_SIZE
    return start


@triton.jit
def kth_known(bounds, lanes, k, BY_SORT: tl.constexpr = not INTERPRETED):
    """The k-th largest finite (or -inf) entry of a row's tile maxima `bounds` (lanes past
    the row hold -inf), +inf entries (unknown) left out: k tiles hold a logit at or above
    it, so the row's k-th largest logit is at or above it. -inf with fewer than k such
    tiles, or k <= 0. Compiled, a sort (BY_SORT); the interpreter runs the sort's network
    a combine at a time in Python (about 0.3 s a program, 256 maxima), so there the same
    value comes from `_kth_by_counting`."""
    known = tl.where(bounds < float("inf"), bounds, float("-inf"))
    if BY_SORT:
        ordered = tl.sort(known, descending=True)
        kth = tl.max(tl.where(lanes == k - 1, ordered, float("-inf")), axis=0)
    else:
        kth = _kth_by_counting(known, k)
    return kth


@triton.jit
def kth_known_of_few(bounds, K: tl.constexpr, BY_TOP_K: tl.constexpr = not INTERPRETED):
    """`kth_known` for a constant k = K of at most 8: the K largest by a bitonic top-k
    (blocks of the next power of two, merged), not a sort of every tile. (At K = 20 the
    top 32 took 9 registers more than the sort: a CTA an SM fewer for logprobs.) The
    interpreter counts instead, as `kth_known` does."""
    tl.static_assert(K <= 8)
    known = tl.where(bounds < float("inf"), bounds, float("-inf"))
    if BY_TOP_K:
        # at most the block: with fewer tiles than K, no rank K - 1 and so -inf
        KP: tl.constexpr = min(triton.next_power_of_2(K), bounds.shape[0])
        top = tl.topk(known, KP)
        kth = tl.max(tl.where(tl.arange(0, KP) == K - 1, top, float("-inf")), axis=0)
    else:
        kth = _kth_by_counting(known, K)
    return kth


@triton.jit
def _kth_by_counting(known, k):
    """The k-th largest of `known` [N] (no NaN), repeats counted, -inf for k <= 0: the
    largest value that at least k values reach, from an [N, N] comparison (numpy-vectorized
    in the interpreter; N * N / threads compares a thread compiled, so never there)."""
    reached_by = tl.sum((known[None, :] >= known[:, None]).to(tl.int32), axis=1)
    kth = tl.max(tl.where(reached_by >= k, known, float("-inf")), axis=0)
    return tl.where(k > 0, kth, float("-inf"))


@triton.jit
def last_to_arrive(counter_ptr, programs):
    """Whether this program is the last of the `programs` that arrive at `counter_ptr` (an
    int32 each launch finds at 0): a split row's merge is made by the row's last program to
    finish, not by a launch of its own. The barrier puts every thread's stores before the
    arrival, and the arrival's atomic add (one thread's) releases them at GPU scope; the
    last arrival's acquire then makes every other program's stores visible to this
    program's loads after it. The last program sets the counter back to 0, for the next
    launch, which its stream orders after this one."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == programs - 1
    if last:
        tl.store(counter_ptr, 0)
    return last


@triton.jit
def merge_argmax(
    row, splits, partial_best_ptr, partial_index_ptr, partial_nan_ptr,
    SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """A split row's argmax: row `row`'s chunks' answers (the sampling kernel's) merged in
    column order -> its token: the first NaN if any, else the best value's lowest index
    (chunks are ordered, so the lowest chunk among equal bests); a row of -inf gives chunk
    0's start, 0."""
    part = tl.arange(0, SPLIT_BLOCK)
    used = part < splits
    at = row.to(tl.int64) * splits + part
    best = tl.load(partial_best_ptr + at, mask=used, other=float("-inf"))
    index = tl.load(partial_index_ptr + at, mask=used, other=2147483647)
    first_nan = tl.min(tl.load(partial_nan_ptr + at, mask=used, other=2147483647), axis=0)
    top = tl.max(best, axis=0)
    best_index = tl.min(tl.where(used & (best == top), index, 2147483647), axis=0)
    return tl.where(first_nan < 2147483647, first_nan, best_index)


def arrival_counters(
    arrivals: torch.Tensor | None, num_rows: int, device: torch.device
) -> torch.Tensor:
    """The split rows' counters for `last_to_arrive`: `arrivals` ([>= num_rows] int32, all
    0, which the launch leaves 0: a caller's persistent buffer, no launch a step) checked,
    or a zeroed one allocated here (one fill launch). One launch at a time may count in a
    buffer: two on different streams would count each other's programs."""
    if arrivals is None:
        return torch.zeros(num_rows, dtype=torch.int32, device=device)
    check_arrivals(arrivals, num_rows, device)
    return arrivals


def check_arrivals(arrivals: torch.Tensor, num_rows: int, device: torch.device) -> None:
    """Raise unless `arrivals` is a contiguous int32 vector of at least `num_rows` counters
    on `device` (its values, which must be 0, are the device's: not read here)."""
    if arrivals.dtype != torch.int32 or arrivals.dim() != 1 or arrivals.shape[0] < num_rows:
        raise ValueError(
            f"arrivals must be an int32 vector of at least {num_rows} counters, got "
            f"{arrivals.dtype} {tuple(arrivals.shape)}"
        )
    if not arrivals.is_contiguous() or arrivals.device != device:
        raise ValueError(f"arrivals must be contiguous on {device}")


def split_count(vocab_size: int, splits: int, block_size: int = 1024) -> int:
    """The programs a row really gets for `splits` asked: chunks of whole tiles, none
    empty."""
    return split_chunks(vocab_size, splits, block_size)[0]


def split_chunks(vocab_size: int, splits: int, block_size: int = 1024) -> tuple[int, int]:
    """(programs a row really gets, columns each reads) for `splits` asked: chunks of whole
    tiles, none empty; program p reads [p * chunk, min((p + 1) * chunk, vocab_size))."""
    tiles = triton.cdiv(vocab_size, block_size)
    chunk_tiles = triton.cdiv(tiles, max(1, min(splits, tiles)))
    return triton.cdiv(tiles, chunk_tiles), chunk_tiles * block_size


PROGRAM_OVERHEAD_TILES = 8
"""What a program costs besides its walk, in tiles: its first loads wait the memory's full
latency (the pipeline is not yet full: about 2 pipelined tiles' worth), it reads its row's
parameters and writes its partials, and a running top-k (logprobs, top-k/top-p stage 1)
starts its list again in every chunk, merging its first several tiles. Keeps `row_splits`
from cutting a row into short programs whose waves outnumber the tiles they save. 8: the
cost model's step (an estimate) is the same anywhere from 6 to 16 and 15 % slower at B =
256 with 2 or 4."""


def row_splits(
    num_rows: int,
    vocab_size: int,
    device: torch.device,
    num_sms: int | None = None,
    min_tiles: int = 1,
    max_splits: int | None = None,
    ctas_per_sm: int = 2,
    block_size: int = 1024,
    min_splits: int = 1,
) -> int:
    """Programs per row for a kernel that splits its rows over the vocabulary (a row of
    151,936 is 149 tiles, which one program would walk alone): the count s whose waves times
    walk are the shortest, ceil(num_rows * s / (num_sms * ctas_per_sm)) * (ceil(tiles / s)
    + PROGRAM_OVERHEAD_TILES), the fewest programs among equals; at least `min_tiles` tiles
    each, at most `max_splits` (one program merges a row's partials), at least
    `min_splits` where the row has the tiles for them. ctas_per_sm:
    the kernel's occupancy on sm_90 (tests/test_kernel_model.py holds each kernel's figure
    to its compiled registers). num_sms: the device's (default: asked of CUDA); off CUDA
    without it, 1 (the interpreter runs programs one after another)."""
    if num_sms is None:
        if device.type != "cuda":
            return 1
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = triton.cdiv(vocab_size, block_size)
    most = max(1, tiles // min_tiles)
    if max_splits is not None:
        most = min(most, max_splits)
    slots = num_sms * ctas_per_sm
    costs = [
        (triton.cdiv(num_rows * s, slots) * (triton.cdiv(tiles, s) + PROGRAM_OVERHEAD_TILES), s)
        for s in range(min(min_splits, most), most + 1)
    ]
    return min(costs)[1]


REGISTERS_PER_SM = 65_536
"""sm_90's register file, per SM (and the most one CTA may hold)."""


def register_cap(num_warps: int, ctas_per_sm: int) -> int:
    """The most registers a thread may hold for `ctas_per_sm` CTAs of `num_warps` warps to
    fit an SM's register file at once: what a launch passes as Triton's `maxnreg` (ptxas'
    `.maxnreg`) to hold its occupancy by construction. A multiple of 8: sm_90 allocates a
    warp's registers in units of 256."""
    return REGISTERS_PER_SM // (ctas_per_sm * num_warps * 32) // 8 * 8


@dataclass(frozen=True)
class SplitPolicy:
    """How a kernel that splits its rows over the vocabulary picks its programs per row:
    `row_splits` with the kernel's occupancy on sm_90 (`ctas_per_sm`), the fewest tiles a
    program walks, the most programs a row gets (where a merge reads them all in one
    program) and the fewest. Called as `policy(num_rows, vocab_size, device,
    num_sms=None)`; 1 off CUDA without num_sms.

    The occupancy is the kernel's own: a kernel launched with `maxnreg=policy.max_registers
    (num_warps)` has it by construction (ptxas fits every variant into the cap, and
    tests/cuda_compile.py fails any that spills to do so); for the others it is the fewest
    CTAs per SM of the compiled variants (tests/test_kernel_model.py holds it to them).
    Without a cap the registers ptxas picks move with the specialization: a vocabulary not a
    multiple of 16 compiles without divisibility hints, to other counts."""

    ctas_per_sm: int
    min_tiles: int = 1
    max_splits: int | None = None
    min_splits: int = 1

    def __call__(
        self, num_rows: int, vocab_size: int, device: torch.device, num_sms: int | None = None
    ) -> int:
        return row_splits(
            num_rows, vocab_size, device, num_sms, self.min_tiles, self.max_splits,
            self.ctas_per_sm, min_splits=self.min_splits,
        )  # fmt: skip

    def max_registers(self, num_warps: int) -> int:
        """The register cap (`maxnreg`) that gives `ctas_per_sm` CTAs of `num_warps` warps."""
        return register_cap(num_warps, self.ctas_per_sm)


def together(names: str, *tables: torch.Tensor | None) -> tuple[torch.Tensor, ...] | None:
    """Op arguments that come together (`names`, for the error: stage 1's covered, lists and
    ids; the rows' filters and keys; values_from and values) -> the tuple, or None for none
    of them."""
    if all(t is None for t in tables):
        return None
    if any(t is None for t in tables):
        every = {2: "both", 3: "all three"}.get(len(tables), f"all {len(tables)}")
        raise ValueError(f"{names} come together: {every} or none")
    return tuple(t for t in tables if t is not None)


def candidate_buffer(
    covered: torch.Tensor | None, lists: torch.Tensor | None, ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """top-k/top-p stage 1's lists as the ops take them (covered, lists, ids: all three, which
    the top-k/top-p op writes and the sampling ops read, or none) -> the triple, or None."""
    buffer = together("covered, lists and ids", covered, lists, ids)
    return None if buffer is None else (buffer[0], buffer[1], buffer[2])
