"""Vocab-parallel sampling (graphsafe_sampler.distributed): the shard split, the shard's
state, and, on 2 and 3 gloo ranks on this machine, `VocabParallelSampler` and
`VocabParallelRejectionSampler` against `Sampler` and `RejectionSampler` on the whole rows
(graphsafe_sampler.testing.distributed.compare_all: tokens, logprobs, ranks, state,
refusals, a make_fx trace replayed across batches, no sync op)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from perf_scripts import load_perf_script

from graphsafe_sampler import Sampler, SamplerConfig
from graphsafe_sampler.bitmask import BitmaskUnpacker, num_words
from graphsafe_sampler.distributed import (
    LoopbackExchange,
    VocabParallelRejectionSampler,
    VocabParallelSampler,
    vocab_shard,
)
from graphsafe_sampler.examples.tensor_parallel import main
from graphsafe_sampler.stages.grammar import shard_bitmask
from graphsafe_sampler.stages.threshold_search import top_k_threshold, top_p_threshold
from graphsafe_sampler.testing.distributed import Comparison, compare_all, run_ranks
from graphsafe_sampler.testing.reference import is_top_p_set_within
from graphsafe_sampler.vocab_shard import VocabShard


@pytest.mark.parametrize("vocab_size", [151_936, 128_256, 32_000])
@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_shards_are_vllms_split(vocab_size: int, world_size: int) -> None:
    # vLLM: the vocabulary padded to a multiple of 64, padded / W ids a rank, padding left out
    padded = -(-vocab_size // 64) * 64
    per_rank = padded // world_size
    shards = [vocab_shard(vocab_size, r, world_size) for r in range(world_size)]
    for rank, (start, end) in enumerate(shards):
        assert start == rank * per_rank
        assert end == min(start + per_rank, vocab_size)
    assert shards[0][0] == 0 and shards[-1][1] == vocab_size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(shards))


def test_uneven_shards_round_up_and_the_last_is_shorter() -> None:
    assert [vocab_shard(1000, r, 3) for r in range(3)] == [(0, 342), (342, 684), (684, 1000)]
    assert [vocab_shard(50, r, 2) for r in range(2)] == [(0, 32), (32, 50)]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((100, 0, 8), ValueError, "leaves the last rank no token"),
        ((1000, 3, 3), ValueError, r"rank = 3 is outside \[0, world_size = 3\)"),
        ((1000, -1, 2), ValueError, "rank = -1"),
        ((1000, 0, 0), ValueError, "world_size must be >= 1"),
        ((0, 0, 1), ValueError, "vocab_size must be >= 1"),
        ((1000.0, 0, 1), TypeError, "vocab_size must be an int"),
        ((1000, True, 2), TypeError, "rank must be an int"),
    ],
)
def test_bad_splits_are_refused(args: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        vocab_shard(*args)


def test_shard_maps_global_ids_to_its_columns() -> None:
    shard = VocabShard(1000, 342, 684)
    assert shard.size == 342 and not shard.is_whole and VocabShard.whole(1000).is_whole
    assert shard.local_ids([0, 342, 500, 683, 684, 999, 400]).tolist() == [0, 158, 341, 58]
    local, inside = shard.local(torch.tensor([341, 342, 683, 684]))
    assert local.tolist() == [0, 0, 341, 0] and inside.tolist() == [False, True, True, False]
    with pytest.raises(ValueError, match="not a non-empty range"):
        VocabShard(1000, 500, 500)


@pytest.mark.parametrize(
    ("start", "end"), [(0, 1000), (342, 684), (684, 1000), (64, 96), (7, 8), (996, 1000)]
)
def test_a_shards_grammar_words_hold_its_bits(start: int, end: int) -> None:
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    vocab = 1000
    words = rng.integers(-(2**31), 2**31, size=(2, 3, num_words(vocab)), dtype=np.int64)
    words = words.astype(np.int32)
    held = shard_bitmask(words, VocabShard(vocab, start, end))
    assert held.shape == (2, 3, num_words(end - start))
    whole = BitmaskUnpacker(vocab, torch.device("cpu")).unpack(torch.from_numpy(words[0]))
    part = BitmaskUnpacker(end - start, torch.device("cpu")).unpack(torch.from_numpy(held[0]))
    assert torch.equal(part, whole[:, start:end])


def test_the_sampler_needs_torch_distributed() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        VocabParallelSampler(SamplerConfig(4, 1000))


# Every feature on: logit bias, allowed ids, stop ids and EOS, bad words, grammar, penalties,
# greedy and seeded rows, min_p, top-k past the candidates and wide top-p on flat rows.
_CONFIG = dict(
    max_num_reqs=6,
    vocab_size=1000,
    eos_token_id=5,
    seed=1,
    max_model_len=64,
    max_num_logprobs=3,
    max_logprob_token_ids=4,
    reasoning_start_token_ids=(7,),
    reasoning_end_token_ids=(998, 3),
    watermark_context_len=2,
)


@pytest.mark.parametrize(
    ("world_size", "cases"),
    [
        pytest.param(2, [("raw_logprobs", 1000)], id="W2-raw_logprobs"),
        # odd world, uneven last shard, shards that start mid-word of the bitmasks; then
        # shards narrower than the candidates, the last narrower than the others (107, 107,
        # 86): every rank's exchanges must still be the same width. One spawn for both.
        pytest.param(3, [("processed_logprobs", 1000), ("raw_logits", 300)], id="W3"),
    ],
)
def test_vocab_parallel_sampler_equals_sampler_on_the_whole_rows(
    world_size: int, cases: list[tuple[str, int]]
) -> None:
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    specs = []
    for mode, vocab_size in cases:
        config = {**_CONFIG, "logprobs_mode": mode, "vocab_size": vocab_size}
        if vocab_size < 1000:
            config["reasoning_end_token_ids"] = (vocab_size - 2, 3)
        specs.append(Comparison(config, steps=5, seed=seed))
    run_ranks(compare_all, world_size, *specs, timeout_s=240)


def test_a_step_exchanges_row_statistics_not_the_vocabulary() -> None:
    # every exchange is [num_rows, m] with m independent of V: bytes grow with the rows, and
    # not at all with the vocabulary (past the candidates), at every world size
    tp_bytes = load_perf_script("tp_bytes")
    for world in (2, 3):
        small = tp_bytes.step_bytes(rows=2, vocab=4000, world=world)
        assert small.collectives == 23  # every feature on, logprobs too
        assert tp_bytes.step_bytes(rows=4, vocab=4000, world=world).contributed == (
            2 * small.contributed
        )
        wide = tp_bytes.step_bytes(rows=2, vocab=8000, world=world)
        assert (wide.collectives, wide.contributed) == (small.collectives, small.contributed)
        assert small.received == (world - 1) * small.contributed < small.all_gather_received


def test_the_tensor_parallel_example_matches_one_process(capfd: pytest.CaptureFixture[str]) -> None:
    main(["--world-size", "2", "--requests", "3", "--steps", "6", "--vocab-size", "1000"])
    out = capfd.readouterr().out
    assert "18 of 18 tokens equal the one-process Sampler's" in out, out


def _loopback_sampler(config: SamplerConfig, world: int = 3, rank: int = 1) -> VocabParallelSampler:
    return VocabParallelSampler(config, device="cpu", exchange=LoopbackExchange(world, rank))


def test_forward_takes_this_ranks_columns() -> None:
    sampler = _loopback_sampler(SamplerConfig(4, 1000))
    assert (sampler.shard.start, sampler.shard.end) == (342, 684)
    sampler.update_state(None)
    logits = torch.randn(4, 1000) * 4
    with pytest.raises(
        ValueError, match=r"1000 columns, the width of this rank's shard \[342, 684\) is 342"
    ):
        sampler(logits)
    assert sampler(logits[:, 342:684].contiguous()).sampled_token_ids.shape == (4, 1)


def test_what_a_vocab_split_cannot_serve_is_refused() -> None:
    with pytest.raises(ValueError, match="runs the PyTorch backend"):
        _loopback_sampler(SamplerConfig(4, 1000, backend="triton"))
    with pytest.raises(ValueError, match="custom logits processors see whole rows"):
        _loopback_sampler(
            SamplerConfig(
                4,
                1000,
                logits_processors=[
                    "graphsafe_sampler.examples.target_token:TargetTokenLogitsProcessor"
                ],
            )
        )
    with pytest.raises(TypeError, match="must be a VocabParallelSampler"):
        VocabParallelRejectionSampler(Sampler(SamplerConfig(4, 1000), "cpu"), 2)


def _awkward_rows(seed: int) -> torch.Tensor:
    """[6, 300] float32: LLM-like rows, ties, both zeros, NaN, +inf and -inf among them."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(6, 300, generator=gen) * 3.0
    rows[1, :100] = 1.5  # a long tie
    rows[2, ::3] = 0.0
    rows[2, 1::3] = -0.0
    rows[3, 7] = float("nan")
    rows[4, 10:20] = float("inf")
    rows[5, 50:] = float("-inf")
    return rows


def test_the_split_search_finds_the_single_device_thresholds() -> None:
    # the histogram radix search of a shard (`across`), on a world of one, against the
    # masked-sum search: every threshold equal, NaN, zeros of both signs and infinities too
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    rng = random.Random(seed)
    logits = _awkward_rows(seed)
    one = LoopbackExchange(1)
    top_k = torch.tensor([rng.choice([0, 1, 5, 150, 299, 300]) for _ in range(6)])
    top_p = torch.tensor([rng.choice([0.0, 0.3, 0.9, 0.999, 1.0]) for _ in range(6)])
    top_k[3] = 150  # the NaN row: a NaN must not count as a token at any threshold
    floor = top_k_threshold(logits, top_k)
    split_floor = top_k_threshold(logits, top_k, one, vocab_size=300)
    torch.testing.assert_close(split_floor, floor, rtol=0, atol=0, equal_nan=True)
    expected = top_p_threshold(logits, top_p, floor)
    split = top_p_threshold(logits, top_p, floor, one)
    # the two searches add float32 masses in different orders: where top_p lies within
    # rounding of a cumulative mass (top_p 0.999 on a row's tail: 3e-3 of the runs) they
    # may cut a boundary token apart, and both sets must then be valid top-p sets within
    # 1e-5 (test_top_k_top_p's MASS_TOL), NaN left out; the +inf row's cut stays exact
    for row in range(6):
        both_nan = bool((split[row].isnan() & expected[row].isnan()).all())
        if torch.equal(split[row], expected[row]) or both_nan:
            continue
        assert row != 4 and 0.0 < float(top_p[row]) < 1.0, (row, split[row], expected[row])
        x = torch.where(logits[row] >= floor[row], logits[row], float("-inf")).double().numpy()
        for threshold in (split[row], expected[row]):
            kept = (logits[row] >= threshold).numpy()  # below the floor: fails
            assert is_top_p_set_within(kept, x, float(top_p[row]), 1e-5), (row, threshold)
