"""The race restricted to the top-k/top-p candidates (SamplingState.race_candidates and
race_covered, graphsafe_sampler/stages/sampling.py): on every covered row it draws the token
the race over the vocabulary draws, and on a compiled CPU the traced conditionals that skip
the vocabulary-wide race give the branch-free tokens on every read row.

Fresh random inputs each run (the seed is printed); the distribution itself is the full
race's, whose statistics tests/test_sampler.py checks.
"""

from __future__ import annotations

import random

import pytest
import torch

from graphsafe_sampler import BatchUpdate, Sampler, SamplerConfig, SamplingParams
from graphsafe_sampler.rng import gumbel_noise_at
from graphsafe_sampler.stages.sampling import LANE_FRACTIONS, SamplingState
from graphsafe_sampler.stages.top_k_top_p import filter_top_k_top_p

NUM_ROWS, VOCAB = 16, 4160  # 130 tiles of 32: the candidates' two-level path


@pytest.fixture
def gen() -> torch.Generator:
    seed = random.randrange(2**31)
    print(f"seed={seed}")  # shown by pytest when the test fails
    return torch.Generator().manual_seed(seed)


def _sampling(gen: torch.Generator) -> tuple[SamplingState, torch.Tensor, torch.Tensor]:
    """(state, slots, positions) of NUM_ROWS seeded requests at random positions."""
    config = SamplerConfig(NUM_ROWS, VOCAB, backend="torch")
    sampler = Sampler(config, "cpu")
    seeds = torch.randint(2**62, (NUM_ROWS,), generator=gen).tolist()
    prompts = torch.randint(1, 50, (NUM_ROWS,), generator=gen).tolist()
    added = [
        (r, SamplingParams(seed=s), [1] * p, [])
        for r, (s, p) in enumerate(zip(seeds, prompts, strict=True))
    ]
    sampler.update_state(BatchUpdate(NUM_ROWS, added=added))
    slots = sampler.batch_state.slots(NUM_ROWS)
    sampling = sampler.stages.sampling
    return sampling, slots, sampler.batch_state.positions(slots)


def _batch(gen: torch.Generator, num_full: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, top_k, top_p): LLM-like rows with top-k and/or top-p, but for the first
    `num_full`, flat rows that keep their whole vocabulary (a race among their candidates
    would rarely draw the token of the race over it)."""
    rank = torch.arange(1, VOCAB + 1, dtype=torch.float32)
    slope = torch.rand(NUM_ROWS, 1, generator=gen) * 2.5 + 1.0
    values = -slope * rank.log() + torch.randn(NUM_ROWS, VOCAB, generator=gen) * 0.5
    logits = values.gather(1, torch.rand(NUM_ROWS, VOCAB, generator=gen).argsort(-1))
    top_k = torch.randint(1, 120, (NUM_ROWS,), generator=gen, dtype=torch.int32)
    top_p = torch.rand(NUM_ROWS, generator=gen) * 0.9 + 0.05
    off_k = torch.rand(NUM_ROWS, generator=gen) < 0.3
    top_k[off_k] = 0
    top_p[~off_k & (torch.rand(NUM_ROWS, generator=gen) < 0.5)] = 1.0
    top_k[:num_full], top_p[:num_full] = 0, 1.0
    logits[:num_full] = torch.randn(num_full, VOCAB, generator=gen) * 0.5
    return logits, top_k, top_p


def test_the_candidates_race_draws_the_full_race_token_on_covered_rows(
    gen: torch.Generator,
) -> None:
    sampling, slots, positions = _sampling(gen)
    covered_rows = 0
    for _ in range(20):
        logits, top_k, top_p = _batch(gen, num_full=3)
        filtered = filter_top_k_top_p(logits, top_k, top_p)
        full = sampling.race(filtered.logits, slots, positions)
        some = sampling.race_candidates(filtered.logits, filtered.candidates.ids, slots, positions)
        covered = filtered.covered
        assert not bool(covered[:3].any())  # the vocabulary-wide rows
        assert torch.equal(some[covered], full[covered])
        covered_rows += int(covered.sum())
        positions = positions + 1  # fresh noise
    assert covered_rows > 150  # most filtered rows are covered


def test_a_tie_goes_to_the_lowest_id_as_argmax_gives_it(gen: torch.Generator) -> None:
    """Two candidates with the same score (one token's logit placed so that its noise
    brings it level with another's): the lower id wins, in either order of the ids."""
    sampling, slots, positions = _sampling(gen)
    logits = torch.full((NUM_ROWS, VOCAB), float("-inf"))
    ids = torch.tensor([[700, 20]] * NUM_ROWS)
    g = gumbel_noise_at(sampling.seed.device[slots], positions, ids, 0x5EED)
    # level where float32 rounding allows: logit(20) + g(20) == logit(700) + g(700)
    logits[:, 20] = 1.0
    logits[:, 700] = (1.0 + g[:, 1]) - g[:, 0]
    level = logits[:, 700] + g[:, 0] == logits[:, 20] + g[:, 1]
    for order in (ids, ids.flip(-1)):
        got = sampling.race_candidates(logits, order, slots, positions, salt=0x5EED)
        full = sampling.race(logits, slots, positions, salt=0x5EED)
        assert torch.equal(got, full)
        assert bool((got[level] == 20).all())
    assert bool(level.any())


def test_compiled_conditional_race_equals_branch_free(gen: torch.Generator) -> None:
    """Traced once with the conditionals (torch.cond ops in the graph, not branches baked in
    at trace time), the race gives the branch-free tokens on every row it reads, with no
    row that needs the vocabulary, with as many as each rung of lanes holds and one more,
    and with every row."""
    from torch._dynamo.testing import CompileCounterWithBackend

    sampling, slots, positions = _sampling(gen)
    counter = CompileCounterWithBackend("aot_eager")
    graphs: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return counter(gm, inputs)

    def step(logits, ids, covered, unread, slots, positions):  # type: ignore[no-untyped-def]
        return sampling.race_covered(logits, ids, covered, unread, slots, positions, True)

    compiled = torch.compile(step, backend=recording, fullgraph=True)
    ladder = sorted(min(NUM_ROWS, max(2, NUM_ROWS // f)) for f in LANE_FRACTIONS)
    assert len(set(ladder)) == len(ladder) and ladder[-1] < NUM_ROWS  # a branch each here
    for num_full in (0, 0, *[n + extra for n in ladder for extra in (0, 1)], NUM_ROWS):
        logits, top_k, top_p = _batch(gen, num_full)
        filtered = filter_top_k_top_p(logits, top_k, top_p)
        unread = torch.rand(NUM_ROWS, generator=gen) < 0.2  # greedy rows: never read
        unread[:num_full] = False  # so that at least num_full rows need the vocabulary
        args = (filtered.logits, filtered.candidates.ids, filtered.covered, unread)
        got = compiled(*args, slots, positions)
        want = sampling.race(filtered.logits, slots, positions)
        assert torch.equal(got[~unread], want[~unread]), num_full
        positions = positions + 1
    assert counter.frame_count == 1
    targets = [node.target for node in graphs[0].graph.nodes]
    # a chain, one conditional a level, none nested in another's branches
    assert targets.count(torch.ops.higher_order.cond) == len(LANE_FRACTIONS) + 1
    for name, branch in graphs[0].named_modules():
        if name:
            assert torch.ops.higher_order.cond not in {n.target for n in branch.graph.nodes}
