"""The logprobs kernel (on `kernel_device`: interpreted on CPU, compiled on CUDA) against
`stages/logprobs.py`, the PyTorch backend's step 10, in all four logprobs modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphsafe_sampler.kernels.logprobs import compute_logprobs
from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.stages.logprobs import compute_logprobs as torch_logprobs

MODES = ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]


def _gen() -> torch.Generator:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


def _torch_logprobs(
    mode: str, k: int, raw: torch.Tensor, processed: torch.Tensor, tokens: torch.Tensor
) -> LogprobsTensors:
    """The PyTorch backend's logprobs (the stage), on the inputs' device."""
    source = raw.to(torch.float32) if mode.startswith("raw") else processed
    return torch_logprobs(source, tokens, k, mode.endswith("logprobs"))


def _kernel(
    source: torch.Tensor,
    tokens: torch.Tensor,
    k: int,
    subtract_lse: bool,
    splits: int = 1,
    tiles: torch.Tensor | None = None,
    sampled: torch.Tensor | None = None,
) -> tuple[LogprobsTensors, torch.Tensor]:
    """Outputs poisoned first, so an element the kernel never wrote shows up; a split
    row's counter (a caller's, longer than the batch) is back at 0 after the launch."""
    rows, device = source.shape[0], source.device
    ids = torch.full((rows, k + 1), -7, dtype=torch.int32, device=device)
    values = torch.full((rows, k + 1), float("nan"), device=device)
    ranks = torch.full((rows,), -7, dtype=torch.int32, device=device)
    lse = torch.full((rows,), float("nan"), device=device)
    arrivals = torch.zeros(rows + 2, dtype=torch.int32, device=device)
    compute_logprobs(
        source, tokens, ids, values, ranks, lse, subtract_lse, splits, tiles, arrivals, sampled
    )  # fmt: skip
    assert not arrivals.any(), arrivals.tolist()
    return LogprobsTensors(ids, values, ranks), lse


def test_only_a_rows_last_program_merges_it(kernel_device: torch.device) -> None:
    """A split row is merged by the program that reads its last arrival: with one row's
    counter preset far past it, that row's outputs stay as they were (poisoned), and the
    other rows get the unsplit outputs."""
    gen = _gen()
    raw, _, tokens = _logits_and_tokens(3, 4099, gen, kernel_device)
    whole, _ = _kernel(raw, tokens, 5, True)
    ids = torch.full((3, 6), -7, dtype=torch.int32, device=kernel_device)
    values = torch.full((3, 6), float("nan"), device=kernel_device)
    ranks = torch.full((3,), -7, dtype=torch.int32, device=kernel_device)
    lse = torch.full((3,), float("nan"), device=kernel_device)
    arrivals = torch.tensor([0, 1000, 0], dtype=torch.int32, device=kernel_device)
    compute_logprobs(raw, tokens, ids, values, ranks, lse, True, 3, None, arrivals)
    assert arrivals.tolist() == [0, 1003, 0]
    assert (ids[1] == -7).all() and values[1].isnan().all() and ranks[1] == -7
    for r in (0, 2):
        assert torch.equal(ids[r], whole.logprob_token_ids[r])
        assert torch.equal(ranks[r], whole.selected_token_ranks[r])
    with pytest.raises(ValueError, match="arrivals"):  # int64 counters: refused
        compute_logprobs(raw, tokens, ids, values, ranks, lse, True, 3, None, arrivals.long())


def _raw_tiles(source: torch.Tensor) -> torch.Tensor:
    """The raw-tile table `process_logits` writes of `source` (tests/tile_maxima.py)."""
    from tile_maxima import raw_tiles

    return raw_tiles(source.cpu()).to(source.device)


def _logits_and_tokens(
    rows: int, vocab: int, gen: torch.Generator, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw logits; processed = raw with most tokens masked, the last row entirely; sampled
    tokens among the survivors (any token in the all-masked row). Drawn on the CPU, returned
    on `device`."""
    raw = torch.randn(rows, vocab, generator=gen) * 3
    masked = torch.rand(rows, vocab, generator=gen) < 0.6
    masked[-1] = rows > 1
    processed = torch.where(masked, float("-inf"), raw / 0.7)
    pick = torch.rand(rows, vocab, generator=gen).masked_fill(masked, -1.0)
    return raw.to(device), processed.to(device), pick.argmax(-1).to(device)


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """float32 spacing at |x| (numpy's, on the host), on x's device."""
    return torch.from_numpy(np.spacing(np.abs(x.cpu().numpy()).astype(np.float32))).to(x.device)


def _logprobs_follow_lse(got: LogprobsTensors, source: torch.Tensor, lse: torch.Tensor) -> None:
    """Each logprob is its logit minus the row's lse in one float32 subtraction, bit for bit:
    a logprob carries no error but the lse's, which is checked against a reference on its
    own (a fixed tolerance on the logprobs fails on a row shifted far from 0, where one ulp of
    the lse outweighs it)."""
    values = source.float().gather(1, got.logprob_token_ids.long())
    torch.testing.assert_close(
        got.logprobs, values - lse[:, None], rtol=0, atol=0, equal_nan=True
    )  # fmt: skip


def _check(
    got: LogprobsTensors,
    lse: torch.Tensor,
    want: LogprobsTensors,
    source: torch.Tensor,
    tokens: torch.Tensor,
    subtract_lse: bool,
) -> None:
    source = source.float()
    rows = torch.arange(source.shape[0], device=source.device)
    lse_torch = source.logsumexp(-1)
    lse_torch = torch.where(lse_torch.isfinite(), lse_torch, 0.0)
    torch.testing.assert_close(lse, lse_torch, rtol=2e-6, atol=1e-6)
    # ids: the same values as torch's at every column (torch's tie order is its own, see
    # the kernel's docstring), distinct, and torch's ids wherever a value is unique in its row
    ids, want_ids = got.logprob_token_ids.long(), want.logprob_token_ids.long()
    assert torch.equal(ids[:, 0], want_ids[:, 0])
    values = source[rows[:, None], ids]
    assert torch.equal(values, source[rows[:, None], want_ids])
    unique = (source[:, None, :] == values[:, :, None]).sum(-1) == 1
    assert torch.equal(ids[unique], want_ids[unique])
    for r in range(ids.shape[0]):
        assert ids[r, 1:].unique().numel() == ids.shape[1] - 1
    if not subtract_lse:
        assert torch.equal(got.logprobs, want.logprobs)
        assert torch.equal(got.selected_token_ranks, want.selected_token_ranks)
        return
    _logprobs_follow_lse(got, source, lse)
    # the rank is exact for the kernel's lse; torch's differs only where its own lse (a
    # few ulp away) merges or splits a token within an ulp of the sampled logprob
    shifted = source - lse[:, None]
    sampled = source[rows, tokens] - lse
    assert torch.equal(got.selected_token_ranks, (shifted >= sampled[:, None]).sum(-1).int())
    near = ((shifted - sampled[:, None]).abs() <= 4 * _ulp(sampled)[:, None]).sum(-1)
    differ = got.selected_token_ranks != want.selected_token_ranks
    assert bool((~differ | (near > 1)).all())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("rows", "vocab", "k"),
    [pytest.param(1, 111, 1, id="R1-V111-K1"), pytest.param(3, 1023, 5, id="R3-V1023-K5"),
     pytest.param(17, 4099, 20, id="R17-V4099-K20")],
)  # fmt: skip
def test_matches_torch_logprobs(
    mode: str, rows: int, vocab: int, k: int, kernel_device: torch.device
) -> None:
    gen = _gen()
    raw, processed, tokens = _logits_and_tokens(rows, vocab, gen, kernel_device)
    want = _torch_logprobs(mode, k, raw, processed, tokens)
    source = raw if mode.startswith("raw") else processed
    subtract_lse = mode.endswith("logprobs")
    got, lse = _kernel(source, tokens, k, subtract_lse)
    _check(got, lse, want, source, tokens, subtract_lse)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_raw_logits(dtype: torch.dtype, kernel_device: torch.device) -> None:
    """Raw logits come in the model's dtype; the PyTorch stage reads them as float32."""
    gen = _gen()
    raw, processed, tokens = _logits_and_tokens(3, 1023, gen, kernel_device)
    raw = raw.to(dtype)
    want = _torch_logprobs("raw_logprobs", 4, raw, processed, tokens)
    got, lse = _kernel(raw, tokens, 4, True)
    _check(got, lse, want, raw, tokens, True)


@pytest.mark.parametrize("k", [3, 20])
def test_ties_take_the_lowest_index(k: int, kernel_device: torch.device) -> None:
    """Quantised logits tie everywhere: the values are torch.topk's, the ids a stable
    descending sort's (the lowest index first among equal values)."""
    gen = _gen()
    raw = (torch.randn(5, 300, generator=gen) * 2).round().to(kernel_device)
    tokens = torch.randint(0, 300, (5,), generator=gen).to(kernel_device)
    got, _ = _kernel(raw, tokens, k, False)
    want_values, _ = raw.topk(k, dim=-1)
    assert torch.equal(got.logprobs[:, 1:], want_values)
    order = torch.sort(raw, dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(got.logprob_token_ids[:, 1:].long(), order)
    assert torch.equal(
        got.selected_token_ranks.long(), (raw >= raw.gather(1, tokens[:, None])).sum(-1)
    )


def test_a_tile_with_one_new_value_inserts_it_after_earlier_ties(
    kernel_device: torch.device,
) -> None:
    """The first 1,024-column tile fills the top 5 with 7s and 9s; each later tile holds one
    value above the 5th (the insertion, not the 5 selections), equal to some of them: it
    goes after the equal values of lower ids, as a stable descending sort puts it."""
    gen = _gen()
    rows, vocab, k = 12, 3 * 1024, 5
    raw = torch.randn(rows, vocab, generator=gen) * 0.5 - 5.0
    for r in range(rows):
        cols = torch.randperm(1024, generator=gen)
        raw[r, cols[:5]] = torch.tensor([9.0, 7.0])[torch.randint(0, 2, (5,), generator=gen)]
        for tile in (1, 2):
            col = tile * 1024 + int(torch.randint(0, 1024, (1,), generator=gen))
            raw[r, col] = float(torch.tensor([7.5, 8.0, 9.0, 9.5])[r % 4])
    raw = raw.to(kernel_device)
    tokens = torch.randint(0, vocab, (rows,), generator=gen).to(kernel_device)
    got, _ = _kernel(raw, tokens, k, False)
    order = torch.sort(raw, dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(got.logprob_token_ids[:, 1:].long(), order)
    assert torch.equal(got.logprobs[:, 1:], raw.gather(1, order))


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("with_tiles", [False, True], ids=["full-pass", "raw-tiles"])
def test_rows_of_few_values_take_them_as_a_stable_sort_does(
    splits: int, with_tiles: bool, kernel_device: torch.device
) -> None:
    """Rows of -inf but for a few values in tiles of their own, K = 5, each row's top K as
    a stable descending sort gives it (equal values, -inf included, lowest id first). With
    1 to 4 values the tiles give no floor (fewer than K finite maxima) and a tile holds one
    finite value: the top K is those values, then the lowest ids' -inf. With 5 (quantised:
    ties) the floor is the least of them, and each goes in at its rank; with a tile of ties
    besides, that tile's values reach the floor too. Last, a first tile holding the row's
    max and a value equal to the floor (the fifth tile's max, at a higher id): both go in."""
    gen = _gen()
    rows, vocab, k = 7, 9000, 5
    raw = torch.full((rows, vocab), float("-inf"))
    for r, finite in enumerate((1, 2, 3, 4, 4, 5)):
        # each in a tile of its own (the last tile holds 808 columns)
        cols = torch.randperm(9, generator=gen)[:finite] * 1024
        cols += torch.randint(0, 808, (finite,), generator=gen)
        raw[r, cols] = (torch.randn(finite, generator=gen) * 3).round()
    raw[4, 1024:2048] = 0.5  # (over a value of the row's, where one is there)
    offsets = torch.randint(0, 512, (6,), generator=gen)
    raw[6, offsets[:5] + torch.arange(5) * 1024] = torch.tensor([9.0, 8.0, 7.0, 6.0, 5.0])
    raw[6, 512 + offsets[5]] = 5.0
    raw = raw.to(kernel_device)
    tokens = raw.argmax(-1)
    tiles = _raw_tiles(raw) if with_tiles else None
    got, _ = _kernel(raw, tokens, k, False, splits, tiles)
    order = torch.sort(raw, dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(got.logprob_token_ids[:, 1:].long(), order)
    assert torch.equal(got.logprobs[:, 1:], raw.gather(1, order))


@pytest.mark.parametrize(
    ("mode", "k"), [("raw_logprobs", 20), ("processed_logits", 20), ("raw_logprobs", 65)]
)
def test_split_rows_merge_to_one_programs_outputs(
    mode: str, k: int, kernel_device: torch.device
) -> None:
    """A row split over 2 and 5 programs (chunks of whole 1,024-element tiles, the last of 3
    columns, fewer than K) merges to one program's outputs: the same ids, values and ranks
    (the logits modes bit for bit), lse within float32 rounding of its other summation
    order; and, on quantised logits that tie everywhere, the same lowest-index-first ids.
    K = 65 (128 lanes) merges the chunks' top Ks 4 chunks at a time: 5 chunks in 2 groups."""
    gen = _gen()
    raw, processed, tokens = _logits_and_tokens(3, 4099, gen, kernel_device)
    raw[1] = (raw[1] * 2).round()  # ties across the chunks
    raw[0, -3:] = raw[0].max() + 1.0  # the row's 3 largest in the last chunk (group)
    source = raw if mode.startswith("raw") else processed
    subtract_lse = mode.endswith("logprobs")
    want = _torch_logprobs(mode, k, raw, processed, tokens)
    whole, whole_lse = _kernel(source, tokens, k, subtract_lse)
    for splits in (2, 5):
        got, lse = _kernel(source, tokens, k, subtract_lse, splits)
        _check(got, lse, want, source, tokens, subtract_lse)
        assert torch.equal(got.logprob_token_ids, whole.logprob_token_ids), splits
        torch.testing.assert_close(lse, whole_lse, rtol=2e-6, atol=1e-6)
        if not subtract_lse:
            assert torch.equal(got.logprobs, whole.logprobs)
            assert torch.equal(got.selected_token_ranks, whole.selected_token_ranks)


def _hard_rows(gen: torch.Generator, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[9, vocab] raw logits over 9 tiles and a sampled token a row: random; quantised (ties
    across tiles and at the floor); a NaN; a +inf; the sampled token in a tile far below the
    rest; NaN in most tiles (fewer known tiles than K); three finite tokens among -inf;
    everything below -200 (a low shift); and one peak a tile, 10 - t in tile t, the row's
    max sampled, so that the K-th largest is the floor itself."""
    raw = torch.randn(9, vocab, generator=gen) * 3
    tokens = torch.randint(0, vocab, (9,), generator=gen)
    raw[1] = (raw[1] * 2).round()
    raw[2, 5000] = float("nan")
    raw[3, 100] = float("inf")
    raw[4, 2048:3072] -= 30.0
    tokens[4] = 2500
    raw[5, torch.arange(6) * 1024 + 7] = float("nan")
    raw[6] = float("-inf")
    raw[6, [10, 4000, 8000]] = torch.tensor([1.0, 2.0, 1.0])
    raw[7] -= 200.0
    raw[8] -= 20.0
    peaks = torch.arange(-(-vocab // 1024))
    raw[8, peaks * 1024 + 3] = 10.0 - peaks.float()
    tokens[8] = 3
    return raw, tokens


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits"])
def test_raw_tiles_give_the_full_pass_outputs(
    mode: str, splits: int, kernel_device: torch.device
) -> None:
    """With processing's raw-tile table the kernel takes the logsumexp from it and reads
    only the tiles that can hold one of the K largest or a token at or above the sampled
    one: the full pass's ids, values and ranks (the logits mode bit for bit), lse within
    float32 rounding of its other summation order, on rows built to break a wrong floor."""
    gen = _gen()
    raw, tokens = _hard_rows(gen, 9000)
    raw, tokens = raw.to(kernel_device), tokens.to(kernel_device)
    subtract_lse = mode.endswith("logprobs")
    full, full_lse = _kernel(raw, tokens, 5, subtract_lse, splits)
    got, lse = _kernel(raw, tokens, 5, subtract_lse, splits, _raw_tiles(raw))
    # the sampled values as the sampling kernel hands them over (`sampled`): the same
    # outputs; and they are what the kernel reads for the sampled token's, not the row
    sampled = raw.gather(1, tokens[:, None].long())[:, 0].to(torch.float32)
    handed, handed_lse = _kernel(raw, tokens, 5, subtract_lse, splits, _raw_tiles(raw), sampled)
    for a, b in zip((*handed, handed_lse), (*got, lse), strict=True):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    off, _ = _kernel(raw, tokens, 5, subtract_lse, splits, _raw_tiles(raw), sampled - 0.5)
    finite_sampled = sampled.isfinite()
    assert bool((off.logprobs[:, 0] != got.logprobs[:, 0])[finite_sampled].all())
    assert torch.equal(got.logprob_token_ids, full.logprob_token_ids)
    assert torch.equal(got.selected_token_ranks, full.selected_token_ranks)
    torch.testing.assert_close(lse, full_lse, rtol=2e-6, atol=1e-6)
    if subtract_lse:  # lse can be an ulp from the full pass's: 1.5e-5 at row 7's -187
        _logprobs_follow_lse(got, raw, lse)
        _logprobs_follow_lse(full, raw, full_lse)
    else:  # NaN where the sampled token is row 2's NaN (1 draw in 9,000)
        torch.testing.assert_close(got.logprobs, full.logprobs, rtol=0, atol=0, equal_nan=True)
    finite = [0, 1, 4, 7, 8]  # the rows torch's reference takes without NaN or inf
    want = _torch_logprobs(mode, 5, raw[finite], raw[finite], tokens[finite])
    _check(
        LogprobsTensors(*(None if t is None else t[finite] for t in got)), lse[finite], want,
        raw[finite],
        tokens[finite], subtract_lse,
    )  # fmt: skip


def test_raw_tiles_leave_the_tiles_below_unread(kernel_device: torch.device) -> None:
    """A tile whose max lies below the K-th largest tile max and below the sampled value is
    never read: a value planted in it that would top the row changes nothing when the table
    is the unplanted row's, while the full pass finds it."""
    gen = _gen()
    raw = torch.randn(2, 9000, generator=gen) * 3
    raw[:, 4096:5120] -= 50.0
    tokens = raw.argmax(-1)
    raw, tokens = raw.to(kernel_device), tokens.to(kernel_device)
    tiles = _raw_tiles(raw)
    clean, clean_lse = _kernel(raw, tokens, 3, True, 3, tiles)
    planted = raw.clone()
    planted[:, 4500] = 1000.0
    got, lse = _kernel(planted, tokens, 3, True, 3, tiles)
    for a, b in (
        (got.logprob_token_ids, clean.logprob_token_ids),
        (got.logprobs, clean.logprobs),
        (got.selected_token_ranks, clean.selected_token_ranks),
        (lse, clean_lse),
    ):
        assert torch.equal(a, b)  # fmt: skip
    read, _ = _kernel(planted, tokens, 3, True, 3)
    assert bool((read.logprob_token_ids[:, 1] == 4500).all())


@pytest.mark.parametrize("splits", [1, 3])
def test_rank_merges_a_neighbour_in_an_unread_tile(
    splits: int, kernel_device: torch.device
) -> None:
    """The sampled token's nearest value below sits alone in a tile the table lets the
    kernel skip (its max is below both the sampled value and the K-th tile max): that max
    still triggers the second pass, which counts the neighbour the shift merges with it,
    as the full pass does (see the test below for the rounding)."""
    gen = _gen()
    raw = torch.rand(1, 3072, generator=gen) * 1e-6 + 1e-7  # above the sampled 0.0
    raw[0, 7] = 10.0
    raw[0, 2048:] = -1.0
    raw[0, 2500] = -(2.0**-23)
    tokens = torch.tensor([1500])
    raw[0, 1500] = 0.0
    raw, tokens = raw.to(kernel_device), tokens.to(kernel_device)
    full, _ = _kernel(raw, tokens, 1, True, splits)
    got, _ = _kernel(raw, tokens, 1, True, splits, _raw_tiles(raw))
    exact = int((raw >= 0.0).sum())
    assert int(full.selected_token_ranks[0]) == exact + 1
    assert torch.equal(got.selected_token_ranks, full.selected_token_ranks)


def test_rank_counts_tokens_merged_by_the_shift(kernel_device: torch.device) -> None:
    """Tokens within 1e-6 of each other near 0, beside a max of 10: after the shift by
    lse (about 10) they round together, so the rank counts some below the sampled value
    (the kernel's second pass).

    Each sampled token sits at 0.0 with a neighbour 2**-23 below it. The shifted values are
    in [8, 16), where float32's ulp is 2**-20, and lse is a float32 there too: 0 - lse is
    exact and -2**-23 - lse rounds onto it, whatever the draw and the lse. Left to the draw,
    a sampled token that is the lowest of its rounding group has nothing below it to merge
    (about 1 run in 55)."""
    gen = _gen()
    vocab = 1023
    raw = torch.randn(2, vocab, generator=gen) * 1e-6
    raw[:, 7] = 10.0
    tokens = torch.tensor([100, 900])
    raw[[0, 1], tokens] = 0.0
    raw[[0, 1], tokens + 1] = -(2.0**-23)
    raw, tokens = raw.to(kernel_device), tokens.to(kernel_device)
    want = _torch_logprobs("raw_logprobs", 2, raw, raw, tokens)
    got, lse = _kernel(raw, tokens, 2, True)
    _check(got, lse, want, raw, tokens, True)
    exact = (raw >= raw.gather(1, tokens[:, None])).sum(-1)
    assert bool((got.selected_token_ranks.long() > exact).all())


def test_rejects_bad_input(kernel_device: torch.device) -> None:
    device = kernel_device
    source = torch.randn(2, 50).to(device)
    ids = torch.zeros(2, 3, dtype=torch.int32, device=device)
    values, lse = torch.zeros(2, 3, device=device), torch.zeros(2, device=device)
    ranks = torch.zeros(2, dtype=torch.int32, device=device)
    with pytest.raises(
        TypeError, match=r"tokens must be torch\.int32 or torch\.int64, got torch\.float32"
    ):
        tokens = torch.zeros(2, dtype=torch.float32, device=device)
        compute_logprobs(source, tokens, ids, values, ranks, lse, True)
    with pytest.raises(ValueError, match=r"logprobs must have shape \[2, 3\], got \(2, 4\)"):
        tokens = torch.zeros(2, dtype=torch.int64, device=device)
        wide = torch.zeros(2, 4, device=device)
        compute_logprobs(source, tokens, ids, wide, ranks, lse, True)
    with pytest.raises(ValueError, match=r"raw_tiles must have shape \[2, 1, 2\], got \(2, 1\)"):
        tokens = torch.zeros(2, dtype=torch.int64, device=device)
        tiles = torch.zeros(2, 1, device=device)
        compute_logprobs(source, tokens, ids, values, ranks, lse, True, 1, tiles)


def test_opcheck(kernel_device: torch.device) -> None:
    gen = _gen()
    device = kernel_device
    raw, processed, tokens = _logits_and_tokens(3, 129, gen, device)
    for source, subtract_lse in ((raw, True), (processed, False)):
        torch.library.opcheck(
            compute_logprobs,
            (
                source, tokens, torch.zeros(3, 6, dtype=torch.int32, device=device),
                torch.zeros(3, 6, device=device), torch.zeros(3, dtype=torch.int32, device=device),
                torch.zeros(3, device=device), subtract_lse,
            ),
        )  # fmt: skip
