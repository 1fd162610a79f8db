"""The sampling Triton kernel (on `kernel_device`: interpreted on CPU, compiled on CUDA)
against rng.py and the PyTorch backend."""

from __future__ import annotations

import pytest
import scipy.stats
import torch
import triton
import triton.language as tl

from graphsafe_sampler import rng
from graphsafe_sampler.kernels.constants import SALT_SAMPLE
from graphsafe_sampler.kernels.noise import SCREEN_ERROR, gumbel, gumbel_screen, rng_noise
from graphsafe_sampler.kernels.sampling import launch_sample_tokens, sample_tokens
from graphsafe_sampler.params import GREEDY_TEMPERATURE
from graphsafe_sampler.stages.threshold_search import top_k_threshold, top_p_threshold
from graphsafe_sampler.stages.top_k_top_p import apply_top_k_top_p

# Known answers shared with tests/test_rng.py: (seed, position, token id, salt) -> hash.
KNOWN_HASHES = [
    ((0, 0, 0, rng.SALT_SAMPLE), 0x420A2B0E),
    ((0, 0, 1022, rng.SALT_SAMPLE), 0x1A6BBB08),
    ((-1, 0, 0, rng.SALT_ACCEPT), 0xCA80E4DB),
    ((2**63 - 1, 2**63 - 1, 0, rng.SALT_BONUS), 0xA6CB991D),
    ((-(2**62) - 12345, 1, 5, 2**32 - 1), 0xD0460304),
]


def _gen() -> torch.Generator:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


def _noise(
    seeds: torch.Tensor, positions: torch.Tensor, vocab: int, salt: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, device = seeds.shape[0], seeds.device
    # poisoned outputs: an element the kernel never writes shows up
    hashes = torch.full((rows, vocab), -1, dtype=torch.int64, device=device)
    uniforms = torch.full((rows, vocab), float("nan"), device=device)
    gumbels = torch.full((rows, vocab), float("nan"), device=device)
    rng_noise(seeds, positions, hashes, uniforms, gumbels, salt)
    return hashes, uniforms, gumbels


@pytest.mark.parametrize("case", KNOWN_HASHES, ids=[f"kat{i}" for i in range(len(KNOWN_HASHES))])
def test_known_answers(
    case: tuple[tuple[int, int, int, int], int], kernel_device: torch.device
) -> None:
    (seed, position, token, salt), expected = case
    seeds = torch.tensor([seed], device=kernel_device)
    positions = torch.tensor([position], device=kernel_device)
    hashes, uniforms, _ = _noise(seeds, positions, token + 2, salt)
    assert hashes[0, token].item() == expected
    assert uniforms[0, token].item() == ((expected >> 9) * 2 + 1) / 2**24


@pytest.mark.parametrize("salt", [rng.SALT_SAMPLE, rng.SALT_ACCEPT, rng.SALT_RECOVER, 2**32 - 1])
def test_noise_matches_rng(salt: int, kernel_device: torch.device) -> None:
    gen = _gen()
    rows, vocab = 67, 1023
    seeds = torch.randint(-(2**63), 2**63 - 1, (rows,), generator=gen)
    positions = torch.randint(0, 2**62, (rows,), generator=gen)
    seeds[:4] = torch.tensor([0, -1, 2**63 - 1, -(2**63)])
    positions[:4] = torch.tensor([0, 2**32 - 1, 2**32, 2**63 - 1])
    seeds, positions = seeds.to(kernel_device), positions.to(kernel_device)
    hashes, uniforms, gumbels = _noise(seeds, positions, vocab, salt)
    want_hashes = rng.token_hashes(seeds, positions, vocab, salt)
    assert torch.equal(hashes, want_hashes)
    assert torch.equal(uniforms, rng.uniforms_from_hashes(want_hashes))
    # The Gumbel transform goes through two logs whose last bit is libm's: a few ulp apart.
    want_gumbels = rng.gumbel_noise(seeds, positions, vocab, salt)
    torch.testing.assert_close(gumbels, want_gumbels, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(gumbels).all()


@triton.jit
def _noise_kernel(hashes_ptr, exact_ptr, screen_ptr, N: tl.constexpr):
    cols = tl.arange(0, N)
    h = tl.load(hashes_ptr + cols).to(tl.uint32)
    tl.store(exact_ptr + cols, gumbel(h))
    tl.store(screen_ptr + cols, gumbel_screen(h))


def _noise_of(hashes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 hashes [N], N a power of two -> (`gumbel`, `gumbel_screen`) of each, float32."""
    exact, screen = torch.empty(hashes.shape), torch.empty(hashes.shape)
    _noise_kernel[(1,)](hashes.contiguous(), exact, screen, hashes.shape[0])
    return exact, screen


def test_the_screen_is_within_its_error_of_the_noise() -> None:
    """`gumbel_screen`, the race's approximate noise, lies within an eighth of SCREEN_ERROR
    of the float64 Gumbel draw (as `gumbel` does, within 1e-5), on fresh hashes and the
    edges: h = 0 and the top (the clamp), tiny h (the series' smallest u), the series'
    end (u = 1/8) and u = 1/2, where 1 - u becomes exact. The interpreter's logs are numpy's:
    this is the series and the branches' error; lg2.approx's, 2**-17 at most, is CUDA's
    documented bound (docs/kernels.md, sampling)."""
    gen = _gen()
    edges = [0, 1, 2, 3, 1000, 2**29 - 2, 2**29 - 1, 2**29, 2**29 + 1, 2**31 - 1, 2**31,
             2**32 - 257, 2**32 - 256, 2**32 - 1]  # fmt: skip
    drawn = torch.randint(0, 2**32, (2**14 - len(edges),), generator=gen)
    hashes = torch.cat([torch.tensor(edges), drawn])
    exact, screen = _noise_of(hashes)
    f = hashes.to(torch.float32).clamp(0.5, 4294967040.0).double()
    want = -torch.log(-torch.log1p(-f * 2.0**-32))
    error = (screen.double() - want).abs().max().item()
    print(f"screen error {error:.3g}, bound {SCREEN_ERROR.value:.3g}")
    assert error <= SCREEN_ERROR.value / 8
    torch.testing.assert_close(exact.double(), want, rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf
def test_a_near_tie_the_screen_misorders_takes_the_exact_noise(
    kernel_device: torch.device,
) -> None:
    """The race screens a tile by `gumbel_screen` and takes the exact noise of the tokens
    within twice its error of the screen's best. Row 0 plants a token a where the screen
    overstates the noise most (small u: its series stops early) and a token b the screen
    gets nearly right, b's exact sum above a's by half a's screen error: the screen puts
    a first, the exact noise b, and b must win (a screen trusted alone gives a). Row 1
    puts a above b by as much: a. Row 2 holds two +inf logits: the first. Every other
    token is alive far below, so that no tile is left to the cut's few survivors."""
    gen = _gen()
    vocab, rows = 1024, 3
    seeds = torch.randint(-(2**63), 2**63 - 1, (rows,), generator=gen)
    positions = torch.randint(0, 2**40, (rows,), generator=gen)
    hashes = rng.token_hashes(seeds, positions, vocab, SALT_SAMPLE)
    logits = torch.full((rows, vocab), -60.0)
    for r in range(2):
        exact, screen = _noise_of(hashes[r])
        over = (screen.double() - exact.double()).where(hashes[r] < 2**29, float("-inf"))
        a = int(over.argmax())
        b = int(torch.nonzero(hashes[r] > 2**31)[0])
        gap = float(over[a]) / 2
        assert gap > 2e-6, gap  # the screen's series error at that u: the test can tell
        logits[r, a] = -exact[a]
        logits[r, b] = -exact[b] + (gap if r == 0 else -gap)
    logits[2, [70, 900]] = float("inf")
    slots = torch.arange(rows)
    temperature = torch.ones(rows)
    moved = [t.to(kernel_device) for t in (logits, slots, temperature, seeds, positions)]
    tokens = torch.full((rows,), -1, dtype=torch.int64, device=kernel_device)
    sample_tokens(*moved[:3], *moved[3:], None, tokens)
    no_k = torch.full((rows,), -1, dtype=torch.int32, device=kernel_device)
    _, want, _ = _torch_tokens(*moved[:3], no_k, torch.ones_like(moved[2]), *moved[3:])
    assert torch.equal(tokens, want), (tokens, want)
    assert int(tokens[2]) == 70


def _torch_tokens(
    pre_temperature: torch.Tensor,  # [rows, V] float32
    slots: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sampler.py's steps 5-9 -> (filtered logits, tokens, perturbed logits)."""
    greedy_tokens = pre_temperature.argmax(dim=-1)
    t = temperature[slots]
    is_greedy = t < GREEDY_TEMPERATURE
    x = pre_temperature / torch.where(is_greedy, 1.0, t)[:, None]
    x = apply_top_k_top_p(x, top_k[slots], top_p[slots])
    perturbed = x + rng.gumbel_noise(seeds[slots], positions, x.shape[1], rng.SALT_SAMPLE)
    tokens = torch.where(is_greedy, greedy_tokens, perturbed.argmax(dim=-1))
    return x, tokens, torch.where(is_greedy[:, None], x, perturbed)


def _draw_and_reference(
    gen: torch.Generator,
    device: torch.device,
    logits: torch.Tensor,  # [rows, V] float32
    slots: torch.Tensor,
    temperature: torch.Tensor,  # [num_slots]
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Random seeds per slot and positions per row drawn from `gen`; -> ((logits, slots,
    temperature, top_k, top_p, seeds, positions) on `device`, `_torch_tokens` of them)."""
    seeds = torch.randint(-(2**63), 2**63 - 1, (temperature.shape[0],), generator=gen)
    positions = torch.randint(0, 2**40, (logits.shape[0],), generator=gen)
    moved = tuple(
        t.to(device) for t in (logits, slots, temperature, top_k, top_p, seeds, positions)
    )
    return moved, _torch_tokens(*moved)


def _assert_same_tokens(got: torch.Tensor, want: torch.Tensor, perturbed: torch.Tensor) -> int:
    """Tokens equal, except where the two winners' perturbed logits are within the noise's
    last-bit rounding (the Gumbel values are a few ulp from torch's). Returns that count."""
    differ = got != want
    rows = torch.arange(got.shape[0], device=got.device)
    gap = (perturbed[rows, want] - perturbed[rows, got]).abs()
    scale = perturbed[rows, want].abs().clamp(min=1.0)
    assert bool((~differ | (gap <= 1e-5 * scale)).all()), (got[differ], want[differ])
    return int(differ.sum())


@pytest.mark.parametrize(
    ("rows", "vocab", "splits"),
    [pytest.param(1, 111, 1, id="R1-V111"), pytest.param(3, 1023, 1, id="R3-V1023"),
     pytest.param(17, 4099, 1, id="R17-V4099"),
     # 5 tiles of 1,024 over 3 programs a row: chunks of 2, 2 and 1 tiles
     pytest.param(17, 4099, 3, id="R17-V4099-split3")],
)  # fmt: skip
@pytest.mark.parametrize("fused_threshold", [False, True], ids=["masked", "threshold"])
def test_tokens_match_torch_backend(
    rows: int, vocab: int, fused_threshold: bool, splits: int, kernel_device: torch.device
) -> None:
    gen = _gen()
    num_slots = rows + 2
    logits = torch.randn(rows, vocab, generator=gen) * 3
    slots = torch.randperm(num_slots, generator=gen)[:rows]
    temperature = torch.tensor([0.0, 1e-6, 0.5, 1.0, 1.7])[
        torch.randint(0, 5, (num_slots,), generator=gen)
    ]
    top_k = torch.randint(-1, vocab // 2, (num_slots,), generator=gen, dtype=torch.int32)
    top_p = torch.where(torch.rand(num_slots, generator=gen) < 0.5, 1.0, 0.9)
    (logits, slots, temperature, top_k, top_p, seeds, positions), reference = _draw_and_reference(
        gen, kernel_device, logits, slots, temperature, top_k, top_p
    )
    filtered, want, perturbed = reference
    tokens = torch.full((rows,), -1, dtype=torch.int64, device=kernel_device)
    if fused_threshold:
        # the unfiltered logits (after temperature) and the per-row cut instead of the mask
        t = temperature[slots]
        x = logits / torch.where(t < GREEDY_TEMPERATURE, 1.0, t)[:, None]
        cut = top_p_threshold(x, top_p[slots], top_k_threshold(x, top_k[slots]))
        sample_tokens(x, slots, temperature, seeds, positions, cut[:, 0], tokens, splits=splits)
    else:
        sample_tokens(filtered, slots, temperature, seeds, positions, None, tokens, splits=splits)
    near_ties = _assert_same_tokens(tokens, want, perturbed)
    print(f"{near_ties} of {rows} rows differ within rounding")


def test_tiles_that_cannot_win_are_skipped_not_lost(kernel_device: torch.device) -> None:
    """The kernel hashes a tile only when its max plus GUMBEL_MAX beats the best so far.
    Rows of one leader d above a flat bulk of 0s (d in [4, 14]: the bulk wins about as
    often as the leader, with tiles whose max lies 4-14 below the best) and rows cut to
    their top 3: the kernel's tokens are the float reference's. A bound below the gap
    would hand every such row to its leader; and no draw of the noise reaches the bound."""
    from graphsafe_sampler.kernels.noise import GUMBEL_MAX

    extremes = torch.tensor([0, 1, 2**31, 2**32 - 2, 2**32 - 1])
    noise = -torch.log(rng.exponentials_from_hashes(extremes).double())
    assert float(noise.max()) < GUMBEL_MAX.value - 0.1  # 33 ln 2 = 22.87 at h = 0
    gen = _gen()
    rows, vocab = 48, 4099
    logits = torch.zeros(rows, vocab)
    leader = torch.randint(0, 1024, (rows,), generator=gen)
    logits[torch.arange(rows), leader] = 4.0 + 10.0 * torch.rand(rows, generator=gen)
    logits[rows // 2 :] = torch.randn(rows - rows // 2, vocab, generator=gen) * 3
    num_slots = rows
    slots = torch.arange(rows)
    temperature = torch.ones(num_slots)
    top_k = torch.full((num_slots,), -1, dtype=torch.int32)
    top_k[rows // 2 :] = 3  # a cut: every tile without a survivor is skipped
    top_p = torch.ones(num_slots)
    (_, slots, temperature, _, _, seeds, positions), reference = _draw_and_reference(
        gen, kernel_device, logits, slots, temperature, top_k, top_p
    )
    filtered, want, perturbed = reference
    tokens = torch.full((rows,), -1, dtype=torch.int64, device=kernel_device)
    sample_tokens(filtered, slots, temperature, seeds, positions, None, tokens)
    _assert_same_tokens(tokens, want, perturbed)
    bulk_wins = int((want[: rows // 2].cpu() != leader[: rows // 2]).sum())
    print(f"the bulk won {bulk_wins} of {rows // 2} leader rows")
    assert bulk_wins > 0  # the test can tell a lost tile from a skipped one


def test_greedy_and_random_rows_merge(kernel_device: torch.device) -> None:
    gen = _gen()
    rows, vocab = 8, 300
    # below the tied maximum: an unclamped draw tops 5.0 in a greedy row ~1 run in 2,500
    logits = torch.randn(rows, vocab, generator=gen).clamp(max=4.0)
    logits[:, 7] = 5.0  # ties at the maximum: greedy takes the lowest index
    logits[:, 250] = 5.0
    logits = logits.to(kernel_device)
    slots = torch.arange(rows, device=kernel_device)
    temperature = torch.tensor([0.0, 1.0] * 4 + [0.0], device=kernel_device)
    seeds = torch.arange(rows + 1, device=kernel_device) * 1000003
    positions = torch.arange(rows, device=kernel_device) + 5
    tokens = torch.full((rows,), -1, dtype=torch.int64, device=kernel_device)
    sample_tokens(logits, slots, temperature, seeds, positions, None, tokens)
    assert tokens[0::2].tolist() == [7] * 4
    noise = rng.gumbel_noise(seeds[slots], positions, vocab, rng.SALT_SAMPLE)
    _assert_same_tokens(tokens[1::2], (logits + noise).argmax(-1)[1::2], (logits + noise)[1::2])


@pytest.mark.parametrize("splits", [1, 3])
def test_rows_keyed_by_their_records_sample_as_by_slot(
    splits: int, kernel_device: torch.device
) -> None:
    """With processing's records of the rows (kernels/row_params.py: the temperature, the
    seed and the position prompt_len + num_generated of each row's slot), read by row, the
    tokens are those of the launch that reads the slots' tables: greedy and random rows,
    shuffled slots, a cut, rows whole or split. With values_from, each token's value there
    (bfloat16 logits here) is written to `values`, by the program that makes the token."""
    gen = _gen()
    rows, vocab, num_slots = 8, 3000, 11
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(kernel_device)
    slots = torch.randperm(num_slots, generator=gen)[:rows].to(kernel_device)
    temperature = torch.rand(num_slots, generator=gen) + 0.5
    temperature[slots.cpu()[::3]] = 0.0  # greedy rows
    seeds = torch.randint(-(2**62), 2**62, (num_slots,), generator=gen)
    prompt_len = torch.randint(1, 10**6, (num_slots,), generator=gen)
    generated = torch.randint(0, 10**4, (num_slots,), generator=gen, dtype=torch.int32)
    cut = logits.kthvalue(vocab - 40, dim=1).values.contiguous()
    temperature, seeds, prompt_len, generated = (
        t.to(kernel_device) for t in (temperature, seeds, prompt_len, generated)
    )
    filters = torch.zeros(rows, 4, device=kernel_device)
    filters[:, 3] = temperature[slots]
    keys = torch.stack([seeds[slots], prompt_len[slots] + generated[slots]], dim=1)
    # and handing each token's value in other logits (the raw ones logprobs reads) over
    raw = torch.randn(rows, vocab, generator=gen).to(torch.bfloat16).to(kernel_device)
    values = torch.full((rows,), float("nan"), device=kernel_device)
    runs = []
    for keyed in (False, True):
        tokens = torch.full((rows,), -1, dtype=torch.int32, device=kernel_device)
        records = dict(filters=filters, keys=keys.contiguous()) if keyed else {}
        hand = dict(values_from=raw, values=values) if keyed else {}
        sample_tokens(
            logits, slots, temperature, seeds, None, cut, tokens, SALT_SAMPLE, prompt_len,
            generated, splits, **records, **hand,
        )  # fmt: skip
        runs.append(tokens.cpu())
    assert torch.equal(runs[0], runs[1])
    want = raw.gather(1, runs[1][:, None].long().to(kernel_device))[:, 0].to(torch.float32)
    assert torch.equal(values, want)
    with pytest.raises(ValueError, match="come together"):
        sample_tokens(
            logits, slots, temperature, seeds, None, cut, tokens, SALT_SAMPLE, prompt_len,
            generated, splits, filters=filters,
        )  # fmt: skip


def test_masked_and_nan_rows_match_torch_backend(kernel_device: torch.device) -> None:
    rows, vocab = 6, 200
    logits = torch.randn(rows, vocab)
    logits[0:2] = float("-inf")  # every token masked: token 0 (greedy, random)
    logits[2:4] = float("-inf")
    logits[2:4, 123] = -50.0  # all masked but one
    logits[4:6, 40] = float("nan")  # NaN rows: the first NaN
    logits[4:6, 33] = float("nan")
    logits = logits.to(kernel_device)
    slots = torch.arange(rows, device=kernel_device)
    temperature = torch.tensor([0.0, 0.8, 0.0, 0.8, 0.0, 0.8, 0.0], device=kernel_device)
    seeds = torch.arange(rows + 1, device=kernel_device) + 11
    positions = torch.arange(rows, device=kernel_device)
    tokens = torch.full((rows,), -1, dtype=torch.int64, device=kernel_device)
    sample_tokens(logits, slots, temperature, seeds, positions, None, tokens)
    _, want, _ = _torch_tokens(
        logits,
        slots,
        temperature,
        torch.zeros(rows + 1, dtype=torch.int32, device=kernel_device),
        torch.ones(rows + 1, device=kernel_device),
        seeds,
        positions,
    )
    assert tokens.tolist() == want.tolist() == [0, 0, 123, 123, 33, 33]


def test_split_rows_merge_exactly(kernel_device: torch.device) -> None:
    """Rows split over programs (16-column tiles here, so 13 chunks of a 200-column row at
    most) give the whole-row scan's tokens bit for bit: maxima tied across chunks (the
    lowest index), a NaN only in a later chunk (the first NaN), rows all -inf (0) or -inf
    but in the last chunk, greedy and random."""
    gen = _gen()
    rows, vocab = 8, 200
    logits = torch.randn(rows, vocab, generator=gen).clamp(max=4.0)
    logits[0:2, [37, 90, 191]] = 6.0  # ties in three chunks
    logits[2:4] = float("-inf")
    logits[4:6, 150] = float("nan")  # NaN after the maximum's chunk
    logits[4:6, 199] = float("nan")
    logits[4:6, 3] = 9.0
    logits[6:8] = float("-inf")
    logits[6:8, 197] = -40.0  # the last chunk's only finite logit
    logits = logits.to(kernel_device)
    slots = torch.arange(rows, device=kernel_device)
    temperature = torch.tensor([0.0, 0.9] * 4 + [0.0], device=kernel_device)
    seeds = torch.arange(rows + 1, device=kernel_device) * 999331 - 7
    positions = torch.arange(rows, device=kernel_device) * 3 + 1
    runs = []
    scratch = (
        torch.empty(rows, 13, device=kernel_device),
        torch.empty(rows, 13, dtype=torch.int32, device=kernel_device),
        torch.empty(rows, 13, dtype=torch.int32, device=kernel_device),
    )
    # each row's last program to finish merges; every launch leaves the counters at 0
    arrivals = torch.zeros(rows + 3, dtype=torch.int32, device=kernel_device)
    for splits in (1, 2, 3, 5, 13):
        tokens = torch.full((rows,), -1, dtype=torch.int32, device=kernel_device)
        launch_sample_tokens(
            logits, slots, temperature, seeds, positions, tokens, splits=splits,
            partials=scratch, block_size=16, arrivals=arrivals,
        )  # fmt: skip
        assert not arrivals.any(), f"{splits} splits left counters {arrivals.tolist()}"
        runs.append(tokens.cpu())
    for tokens in runs[1:]:
        assert torch.equal(tokens, runs[0])
    assert runs[0][[0, 2, 3, 4, 5, 6, 7]].tolist() == [37, 0, 0, 150, 150, 197, 197]
    # only the last program to arrive merges: a row whose counter never reads its last
    # arrival (preset far past it) is never merged, and the others are unchanged
    arrivals[3] = 1000
    tokens = torch.full((rows,), -1, dtype=torch.int32, device=kernel_device)
    launch_sample_tokens(
        logits, slots, temperature, seeds, positions, tokens, splits=3, partials=scratch,
        block_size=16, arrivals=arrivals,
    )  # fmt: skip
    assert tokens[3] == -1 and arrivals[3] == 1003
    keep = torch.arange(rows) != 3
    assert torch.equal(tokens.cpu()[keep], runs[0][keep])
    # counters of another type, too few of them, or strided: refused before any launch
    strided = torch.zeros(rows, 2, dtype=torch.int32, device=kernel_device)[:, 0]
    for wrong in (arrivals.long(), arrivals[: rows - 1], strided):
        with pytest.raises(ValueError, match="arrivals"):
            launch_sample_tokens(
                logits, slots, temperature, seeds, positions, tokens, splits=3,
                partials=scratch, block_size=16, arrivals=wrong,
            )  # fmt: skip


@pytest.mark.parametrize("splits", [1, 3])
def test_tiles_below_the_cut_are_not_read(splits: int, kernel_device: torch.device) -> None:
    """With the tile maxima (upper bounds; +inf for unknown or NaN tiles), a tile whose
    bound lies below the row's cut is skipped unread: the tokens are those without the
    table (greedy and random rows, a NaN row, a row whose cut is -inf), and raising a
    skipped tile's logit above the whole row behind the table's back changes no token,
    where the table-less kernel takes it."""
    from tile_maxima import exact_tile_maxima

    gen = _gen()
    rows, vocab, block = 6, 200, 16  # 13 tiles
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[4, 77] = float("nan")
    tile_max = exact_tile_maxima(logits, block)
    tile_max[torch.rand(tile_max.shape, generator=gen) < 0.2] = float("inf")
    # top-5 survive (contiguous: the launcher reads the cut as a [rows] vector)
    cut = logits.nan_to_num(float("-inf")).topk(5, dim=-1).values[:, -1].contiguous()
    cut[5] = float("-inf")  # no cut: every tile read
    slots = torch.arange(rows)
    temperature = torch.tensor([0.0, 0.9, 1.3, 0.0, 0.7, 1.0])
    seeds = torch.arange(rows) * 7919 + 3
    positions = torch.arange(rows) * 5 + 2
    scratch = (
        torch.empty(rows, 13, device=kernel_device),
        torch.empty(rows, 13, dtype=torch.int32, device=kernel_device),
        torch.empty(rows, 13, dtype=torch.int32, device=kernel_device),
    )
    moved = [t.to(kernel_device) for t in (logits, slots, temperature, seeds, positions)]
    cut, tile_max = cut.to(kernel_device), tile_max.to(kernel_device)
    visits = torch.full(tile_max.shape, -1, dtype=torch.int32, device=kernel_device)
    arrivals = torch.zeros(rows, dtype=torch.int32, device=kernel_device)

    def tokens(x: torch.Tensor, table: torch.Tensor | None) -> list[int]:
        out = torch.full((rows,), -1, dtype=torch.int32, device=kernel_device)
        launch_sample_tokens(
            x, *moved[1:], out, cut, splits=splits, partials=scratch, block_size=block,
            tile_max=table, visits=visits, arrivals=arrivals,
        )  # fmt: skip
        return out.tolist()

    want = tokens(moved[0], None)
    assert tokens(moved[0], tile_max) == want
    # the walk lists its tiles in the caller's scratch, [rows, tiles] int32
    for wrong in (None, visits[:, :-1], visits.to(torch.int64)):
        with pytest.raises((ValueError, TypeError), match="visits"):
            launch_sample_tokens(
                moved[0], *moved[1:], torch.empty(rows, dtype=torch.int32), cut, splits=splits,
                partials=scratch, block_size=block, tile_max=tile_max, visits=wrong,
                arrivals=arrivals,
            )  # fmt: skip
    assert want[4] == 77  # the first NaN
    # rows 0 (greedy) and 1 (random): a tile wholly below the cut, its bound kept
    lied = moved[0].clone()
    raised = []
    for r in (0, 1):
        below = (tile_max[r] < cut[r]).nonzero().flatten().tolist()
        assert below, f"row {r}: no tile below the cut"
        raised.append(below[0] * block)
        lied[r, raised[-1]] = float(logits[r].nan_to_num(0.0).max()) + 50.0
    assert tokens(lied, tile_max) == want
    assert tokens(lied, None)[:2] == raised  # read, the raised logit would win

    # process_logits' deferred rows (1-4: divisors 0.2, 1.3, 1 and 0.7), read from the
    # source and divided (`processed_rows.processed`), in the full walk and the few survivors'
    # gathers, and a written row at its temperature (5: -0.6, the buffer's pre-temperature
    # logits divided), with the tile maxima of what each reads (the pre-temperature ones):
    # the tokens of the buffer written with the quotients and their maxima, from one whose
    # deferred rows are NaN
    divisor = torch.tensor([-1.0, 0.2, 1.3, 1.0, 0.7, -0.6], device=kernel_device)
    raw = moved[0] * 2.5
    # row 1's top 5 (block 16): its max alone in tile 0 (the few survivors' gather), 3 in
    # tile 5 (the full walk), 1 in tile 9, all within the noise's bound of the max (so
    # read): the max wins but for a noise gap of 12, and a read of it left undivided (x
    # 0.2) loses
    raw[1] = torch.randn(vocab, generator=gen).to(kernel_device) * 0.1
    raw[1, [3, 80, 81, 82, 150]] = torch.tensor([50.0, 38.0, 38.0, 38.0, 37.0]) * 0.2
    pre = torch.where(divisor[:, None] > 0.0, raw, lied)  # what each row's reader reads
    written = pre / divisor.abs()[:, None]
    unwritten = torch.where(divisor[:, None] > 0.0, float("nan"), pre)
    deferred_cut = written.nan_to_num(float("-inf")).topk(5, dim=-1).values[:, -1].contiguous()
    deferred_cut[5] = float("-inf")
    tables = [exact_tile_maxima(t.cpu(), block).to(kernel_device) for t in (written, pre)]
    got = []
    for x, table, defer in ((written, tables[0], None), (unwritten, tables[1], (raw, divisor))):
        out = torch.full((rows,), -1, dtype=torch.int32, device=kernel_device)
        launch_sample_tokens(
            x, *moved[1:], out, deferred_cut, splits=splits, partials=scratch,
            block_size=block, tile_max=table, visits=visits, arrivals=arrivals, defer=defer,
        )  # fmt: skip
        got.append(out.tolist())
    assert got[0] == got[1]
    assert got[0][1] == 3 and got[0][4] == 77  # row 4's first NaN, NaN over its divisor


def test_written_rows_are_divided_on_read(kernel_device: torch.device) -> None:
    """Rows processing wrote before their temperature (the temperature on read: deferred[r]
    minus the divisor), with their tile maxima before it too: the same tokens as the rows
    written divided with their maxima divided, random and greedy, with and without a cut,
    and the source never read (NaN); rows split over 3 programs. The divisor 0.05 spreads
    the logits 20-fold, so that a walk taking an entry undivided as its tile's bound would
    skip tiles that win: the second-best tile's max before the temperature plus the
    noise's bound lies far below the best's after it."""
    from tile_maxima import exact_tile_maxima

    gen = _gen()
    rows, vocab, block, splits = 16, 1200, 16, 3  # 75 tiles
    pre = torch.randn(rows, vocab, generator=gen) * 0.5
    divisor = torch.full((rows,), 0.05)
    divisor[10:13] = torch.tensor([1.3, 0.7, 0.2])
    temperature = divisor.clone()
    temperature[13:] = 0.0  # greedy rows, read as written (divisor 1)
    divisor[13:] = 1.0
    written = pre / divisor[:, None]
    cut = torch.full((rows,), float("-inf"))
    cut[::3] = written[::3].topk(40, dim=-1).values[:, -1]  # a cut on every third row
    slots = torch.arange(rows)
    seeds = torch.arange(rows) * 7919 + 11
    positions = torch.randint(0, 2**40, (rows,), generator=gen)
    moved = [t.to(kernel_device) for t in (slots, temperature, seeds, positions, cut)]
    scratch = (
        torch.empty(rows, splits, device=kernel_device),
        torch.empty(rows, splits, dtype=torch.int32, device=kernel_device),
        torch.empty(rows, splits, dtype=torch.int32, device=kernel_device),
    )
    visits = torch.empty(rows, 75, dtype=torch.int32, device=kernel_device)
    arrivals = torch.zeros(rows, dtype=torch.int32, device=kernel_device)
    source = torch.full_like(pre, float("nan")).to(kernel_device)
    got = []
    for x, defer in ((written, None), (pre, (source, -divisor.to(kernel_device)))):
        table = exact_tile_maxima(x, block).to(kernel_device)
        out = torch.full((rows,), -1, dtype=torch.int32, device=kernel_device)
        launch_sample_tokens(
            x.to(kernel_device), moved[0], moved[1], moved[2], moved[3], out, moved[4],
            splits=splits, partials=scratch, block_size=block,
            tile_max=table, visits=visits, arrivals=arrivals, defer=defer,
        )  # fmt: skip
        got.append(out.tolist())
    assert got[0] == got[1]
    # the draws reach past the best tile: a walk that left some tile unread loses them.
    # At least 2 rows (rows 10 and 11 draw from nearly flat rows): more than 2 failed about
    # 1 seed in 50, where a third row's draw is chance (a multinomial stand-in, 4,000 seeds)
    best_tile = written.argmax(-1) // block
    assert sum(int(t) // block != int(b) for t, b in zip(got[0], best_tile, strict=True)) >= 2


def test_non_contiguous_row_stride(kernel_device: torch.device) -> None:
    gen = _gen()
    base = torch.randn(10, 517, generator=gen).to(kernel_device)
    logits = base[::2, :400]  # row stride 1034, not the vocabulary size
    slots = torch.tensor([4, 3, 2, 1, 0], device=kernel_device)
    temperature = torch.tensor([0.0, 1.0, 0.7, 0.0, 1.3, 0.0], device=kernel_device)
    seeds = torch.arange(6, device=kernel_device) * 7 - 3
    positions = torch.arange(5, device=kernel_device) * 2**33
    tokens = torch.full((5,), -1, dtype=torch.int64, device=kernel_device)
    # The kernel samples from logits already divided by the temperature (sampler.py's step 6):
    # divide in place through the strided view, keeping its row stride.
    pre_temperature = logits.clone()
    t = temperature[slots]
    logits /= torch.where(t < GREEDY_TEMPERATURE, 1.0, t)[:, None]
    assert logits.stride(0) == 1034
    sample_tokens(logits, slots, temperature, seeds, positions, None, tokens)
    _, want, perturbed = _torch_tokens(
        pre_temperature,
        slots,
        temperature,
        torch.zeros(6, dtype=torch.int32, device=kernel_device),
        torch.ones(6, device=kernel_device),
        seeds,
        positions,
    )
    _assert_same_tokens(tokens, want, perturbed)


def test_samples_follow_softmax(kernel_device: torch.device) -> None:
    """Chi-square of 512 draws (one per position) against softmax(logits) at p < 1e-3: the
    interpreter runs one program per draw, so the sample is small and the test catches gross
    errors (noise ignored, wrong sign, wrong scale); tests/test_rng.py holds the fine ones."""
    vocab, draws = 5, 512
    logits = torch.tensor([-1.5, 0.0, 0.7, -0.3, 1.0])
    probs = torch.softmax(logits.double(), -1)  # on the host, for scipy
    logits = logits.to(kernel_device)
    tokens = torch.full((draws,), -1, dtype=torch.int64, device=kernel_device)
    sample_tokens(
        logits.expand(draws, vocab),  # row stride 0: one row read by every program
        torch.zeros(draws, dtype=torch.int64, device=kernel_device),
        torch.ones(1, device=kernel_device),
        torch.tensor([20240601], device=kernel_device),
        torch.arange(draws, device=kernel_device),
        None,
        tokens,
    )
    counts = torch.bincount(tokens.cpu(), minlength=vocab).double()
    assert scipy.stats.chisquare(counts.numpy(), (probs * draws).numpy()).pvalue > 1e-3


def test_rejects_bad_input(kernel_device: torch.device) -> None:
    device = kernel_device
    tokens = torch.zeros(2, dtype=torch.int64, device=device)
    args = (
        torch.tensor([0, 1], device=device), torch.ones(2, device=device),
        torch.zeros(2, dtype=torch.int64, device=device),
    )  # fmt: skip
    positions = torch.arange(2, device=device)
    with pytest.raises(TypeError, match=r"logits must be float32, got torch\.float16"):
        half = torch.randn(2, 8).half().to(device)
        sample_tokens(half, *args, positions, None, tokens)
    with pytest.raises(TypeError, match=r"positions must be torch\.int64, got torch\.int32"):
        logits = torch.randn(2, 8).to(device)
        sample_tokens(logits, *args, positions.int(), None, tokens)
    # the launcher too reads the cut as a [rows] vector: a strided view would read others
    strided = torch.randn(2, 2, device=device)[:, 1]
    with pytest.raises(ValueError, match="threshold must be contiguous"):
        launch_sample_tokens(logits, *args, positions, tokens, strided)


def _three_rows(device: torch.device) -> tuple[torch.Tensor, ...]:
    """(logits [3, 129], slots, temperature (a greedy row), seeds, positions, int64 tokens):
    the op checks' small batch."""
    return (
        torch.randn(3, 129).to(device),
        torch.tensor([2, 0, 1], device=device),
        torch.tensor([0.0, 0.9, 1.2], device=device),
        torch.tensor([5, 6, 7], device=device),
        torch.tensor([100, 200, 300], device=device),
        torch.zeros(3, dtype=torch.int64, device=device),
    )


def test_opcheck(kernel_device: torch.device) -> None:
    device = kernel_device
    logits, slots, temperature, seeds, positions, tokens = _three_rows(device)
    cut = torch.full((3,), -1.0, device=device)
    torch.library.opcheck(
        sample_tokens, (logits, slots, temperature, seeds, positions, cut, tokens)
    )
    torch.library.opcheck(
        sample_tokens, (logits, slots, temperature, seeds, positions, None, tokens)
    )
    hashes = torch.zeros(3, 129, dtype=torch.int64, device=device)
    uniforms, gumbels = torch.zeros(3, 129, device=device), torch.zeros(3, 129, device=device)
    torch.library.opcheck(
        rng_noise,
        (seeds, positions, hashes, uniforms, gumbels),
        {"salt": rng.SALT_BONUS},
    )


@pytest.mark.parametrize("splits", [1, 3])
def test_covered_rows_race_over_the_lists(splits: int, kernel_device: torch.device) -> None:
    """Rows whose kept tokens are all in top-k/top-p's stage 1 lists (`covered`) race over
    the lists alone: the same tokens as the walk over the row, greedy and random, with the
    split rows' counters left at 0. LLM-like rows, rounded (ties, greedy maxima among them),
    under top-k within the buffer, top-p and min_p; a row holding NaN, one with top-k beyond
    the buffer and one unfiltered are not covered and walk as before. The covered rows' kept
    logits are then moved at random in the logits passed: the lists still give the true
    tokens, which the walk over the moved row would not."""
    from graphsafe_sampler.bench.logits import llm_like_logits
    from graphsafe_sampler.kernels.top_k_top_p import (
        candidate_lists,
        launch_top_k_top_p,
        partial_size,
    )

    gen = _gen()
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    rows, vocab, candidates, chunks = 12, 4096, 32, 4  # 4 chunks' lists of 8
    # rounded: ties, greedy rows' maxima among them (the lowest id wins)
    logits = torch.round(llm_like_logits(rows, vocab, peakedness=1.2, seed=seed) * 8) / 8
    logits[0, 77] = float("nan")
    slots = torch.randperm(rows + 1, generator=gen)[:rows]
    top_k = torch.randint(1, 9, (rows + 1,), generator=gen, dtype=torch.int32)
    top_p = torch.where(torch.rand(rows + 1, generator=gen) < 0.5, 0.8, 1.0)
    min_p = torch.where(torch.rand(rows + 1, generator=gen) < 0.3, 0.05, 0.0)
    top_k[slots[1]] = candidates + 1  # beyond the buffer: searched, no lists
    top_k[slots[2]], top_p[slots[2]], min_p[slots[2]] = 0, 1.0, 0.0  # unfiltered
    temperature = torch.where(torch.rand(rows + 1, generator=gen) < 0.3, 0.0, 0.9)
    seeds = torch.randint(0, 2**62, (rows + 1,), generator=gen)
    positions = torch.randint(0, 2**20, (rows,), generator=gen)
    device = kernel_device
    logits, slots, top_k, top_p, min_p, temperature, seeds, positions = (
        t.to(device) for t in (logits, slots, top_k, top_p, min_p, temperature, seeds, positions)
    )
    threshold = torch.empty(rows, device=device)
    buffer = candidate_lists(rows, vocab, chunks, device, candidates)
    assert buffer[1].shape == (rows, chunks, partial_size(candidates, chunks))
    launch_top_k_top_p(
        logits, slots, top_k, top_p, threshold, False, min_p, candidates=candidates,
        splits=chunks, buffer=buffer,
    )  # fmt: skip
    covered = buffer[0].bool().cpu()
    assert not covered[:3].any(), covered
    assert covered[3:].sum() >= rows - 5, covered  # the usual row is covered
    # each chunk's list descends (its kept logits lead it), which the race rank by rank
    # relies on
    lists = buffer[1].cpu()[covered]
    assert (lists[..., :-1] >= lists[..., 1:]).all(), lists
    scratch = (
        torch.empty(rows, splits, device=device),
        torch.empty(rows, splits, dtype=torch.int32, device=device),
        torch.empty(rows, splits, dtype=torch.int32, device=device),
    )
    arrivals = torch.zeros(rows, dtype=torch.int32, device=device)

    def draw(source: torch.Tensor, lists: tuple[torch.Tensor, ...] | None) -> torch.Tensor:
        tokens = torch.full((rows,), -1, dtype=torch.int32, device=device)
        launch_sample_tokens(
            source, slots, temperature, seeds, positions, tokens, threshold, splits=splits,
            partials=scratch, arrivals=arrivals, buffer=lists,
        )  # fmt: skip
        assert not arrivals.any(), arrivals
        return tokens.cpu()

    want = draw(logits, None)
    # the covered rows' kept logits moved apart at random in a copy that only a read of the
    # row would see (the lists keep the true ones)
    rows_of = covered.to(device)
    moved = logits[rows_of] + 50.0 * torch.rand(logits[rows_of].shape, generator=gen).to(device)
    poisoned = logits.clone()
    poisoned[rows_of] = torch.where(logits[rows_of] >= threshold[rows_of, None], moved, -1e9)
    got = draw(poisoned, buffer)
    assert torch.equal(got, want), (got, want)
    assert torch.equal(draw(logits, buffer), want)
    # what the walk gives the poisoned rows differs somewhere, or the poison proves nothing
    assert not torch.equal(draw(poisoned, None)[covered], want[covered])


@pytest.mark.parametrize("chunks", [64, 3])
def test_a_covered_race_reads_the_ranks_that_keep_a_logit_only(
    chunks: int, kernel_device: torch.device
) -> None:
    """A covered row's race takes the first ranks of every chunk's list (RACE_BLOCK / 64 of
    32 where 64 chunks share a block; all 32 for 3), and the later ones only where the last
    rank raced still keeps a logit somewhere: rows keeping fewer logits a chunk than a block
    has ranks, exactly that many, and more, random and greedy, draw what the walk over the
    same kept logits draws. The ranks past a row's first block, where it keeps fewer than
    a block's ranks a chunk, hold huge values (out of order, as no list would): read, they
    would win."""
    from graphsafe_sampler.kernels.list_race import RACE_BLOCK

    gen = _gen()
    rows, vocab, list_len = 8, 8192, 32
    device = kernel_device
    ranks = min(RACE_BLOCK // 64, list_len) if chunks == 64 else list_len
    assert ranks < list_len or chunks == 3  # the 64 chunks' case has later ranks to race
    # per row, the most logits a chunk keeps: fewer than a block's ranks (one block), as
    # many (the next block checked and found empty), more (blocks in the pipelined loop)
    most = [1, ranks // 2, ranks - 1, ranks - 1, ranks, ranks, 3 * ranks // 2, list_len - 1]
    most = [min(m, list_len) for m in most]
    values = torch.full((rows, chunks, list_len), float("-inf"))
    ids = torch.full((rows, chunks, list_len), -1, dtype=torch.int32)
    threshold = torch.zeros(rows)
    logits = torch.full((rows, vocab), -1e9)
    for r in range(rows):
        token_ids = torch.randperm(vocab, generator=gen)[: chunks * list_len].view(chunks, -1)
        # each list: descending, kept = at or above 0 (ties among them), then below
        counts = torch.randint(0, most[r] + 1, (chunks,), generator=gen)
        crowded = int(torch.randint(0, chunks, (1,), generator=gen))
        counts[crowded] = most[r]
        if most[r] > ranks:
            # the crowded list's kept logits tie at the row's max, with the row's lowest id
            # at its last kept rank: past the first block, where the greedy token is
            flat = token_ids.view(-1)
            low, at = int(flat.argmin()), crowded * list_len + most[r] - 1
            flat[low], flat[at] = flat[at].clone(), flat[low].clone()
        for c in range(chunks):
            kept = torch.round(torch.rand(int(counts[c]), generator=gen) * 15) / 4
            if c == crowded and most[r] > ranks:
                kept = torch.full((most[r],), 4.0)
            dropped = -1.0 - torch.rand(list_len - int(counts[c]), generator=gen) * 8
            column = torch.cat([kept, dropped]).sort(descending=True).values
            values[r, c], ids[r, c] = column, token_ids[c].to(torch.int32)
            logits[r, token_ids[c]] = column
        if most[r] < ranks:  # never read: past the first block's ranks
            values[r, :, ranks:] = 1e6
    slots = torch.arange(rows)
    temperature = torch.tensor([0.0, 0.8] * (rows // 2))
    seeds = torch.randint(0, 2**62, (rows,), generator=gen)
    positions = torch.randint(0, 2**20, (rows,), generator=gen)
    covered = torch.ones(rows, dtype=torch.int32)
    args = [t.to(device) for t in (slots, temperature, seeds, positions)]
    threshold, logits = threshold.to(device), logits.to(device)
    buffer = (covered.to(device), values.to(device), ids.to(device))

    def draw(lists: tuple[torch.Tensor, ...] | None) -> torch.Tensor:
        tokens = torch.full((rows,), -1, dtype=torch.int64, device=device)
        launch_sample_tokens(logits, *args[:4], tokens, threshold, buffer=lists)
        return tokens.cpu()

    assert torch.equal(draw(buffer), draw(None))


def test_candidate_lists_are_checked(kernel_device: torch.device) -> None:
    """The lists go with their flags, ids and threshold, in their dtypes and shapes:
    refused before any launch otherwise; the op's schema holds them (opcheck)."""
    from graphsafe_sampler.kernels.top_k_top_p import top_k_top_p_threshold

    device = kernel_device
    logits, slots, temperature, seeds, positions, tokens = _three_rows(device)
    cut = torch.full((3,), 1.5, device=device)
    covered = torch.tensor([1, 0, 1], dtype=torch.int32, device=device)
    values = torch.sort(logits, descending=True).values[:, :4].contiguous()
    ids = torch.sort(logits, descending=True).indices[:, :4].int().contiguous()
    args = (logits, slots, temperature, seeds, positions)
    torch.library.opcheck(
        sample_tokens, (*args, cut, tokens), {"covered": covered, "lists": values, "ids": ids}
    )
    with pytest.raises(ValueError, match="all three or none"):
        sample_tokens(*args, cut, tokens, covered=covered, lists=values)
    with pytest.raises(TypeError, match=r"ids must be torch\.int32, got torch\.int64"):
        sample_tokens(*args, cut, tokens, covered=covered, lists=values, ids=ids.long())
    with pytest.raises(ValueError, match=r"ids must have shape \[3, 4\], got \(3, 3\)"):
        sample_tokens(*args, cut, tokens, covered=covered, lists=values, ids=ids[:, :3].clone())
    with pytest.raises(ValueError, match="the threshold they were cut with"):
        sample_tokens(*args, None, tokens, covered=covered, lists=values, ids=ids)
    top_k = torch.tensor([2, 3, 4], dtype=torch.int32, device=device)
    top_p = torch.ones(3, device=device)
    with pytest.raises(ValueError, match="all three or none"):
        top_k_top_p_threshold(logits, slots, top_k, top_p, cut, covered=covered)
    with pytest.raises(ValueError, match=r"lists must have shape \[3, 1, \d+\], got \(3, 4\)"):
        top_k_top_p_threshold(
            logits, slots, top_k, top_p, cut, covered=covered, lists=values, ids=ids
        )
