"""Multi-process checks of vocab-parallel sampling, on one machine.

`run_ranks(fn, world_size, *args)` runs `fn(rank, world_size, *args)` in `world_size`
spawned processes joined in one gloo group on 127.0.0.1, bounded in time: a rank that
raises, or a run past `timeout_s`, stops every rank and raises here with the rank's
traceback. `compare_with_sampler` is such an `fn`: each rank drives a
`VocabParallelSampler` and a single-device `Sampler` through the same churning batches and
checks that they agree (tests/test_distributed.py runs it with 2 and 3 ranks).
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils import _pytree as pytree

from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.distributed import VocabParallelRejectionSampler, VocabParallelSampler
from graphsafe_sampler.output import SamplerOutput
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.pipelines.torch_pipeline import mask_and_penalize
from graphsafe_sampler.rejection_sampler import RejectionSampler
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.stages.candidates import CANDIDATES
from graphsafe_sampler.testing.batch_driver import (
    BatchDriver,
    open_reasoning_sections,
    random_sampling_params,
    refill,
)
from graphsafe_sampler.testing.graph_safety import state_fingerprint
from graphsafe_sampler.testing.reference import is_top_p_set_within, top_k_top_p
from graphsafe_sampler.testing.replay import MakeFxReplayer, StateTensors
from graphsafe_sampler.testing.sync_detector import SyncOpDetector


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(
    rank: int, fn: Callable[..., None], world_size: int, port: int, timeout_s: float, args: tuple
) -> None:
    torch.set_num_threads(1)  # W ranks share the machine's cores
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., None], world_size: int, *args: Any, timeout_s: float = 180.0
) -> None:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks (spawned processes; `fn`
    and `args` must pickle). Raises the first rank's error, or TimeoutError past
    `timeout_s`, after stopping every rank."""
    port = free_port()
    context = mp.start_processes(
        _rank_main,
        args=(fn, world_size, port, timeout_s, args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world_size} ranks still ran after {timeout_s:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)


@dataclass(frozen=True)
class Comparison:
    """What `compare_with_sampler` runs: the config's fields, the steps, the seed; and
    `grammar`, whether some rows take a structured-output bitmask each step."""

    config: dict[str, Any]
    steps: int = 6
    seed: int = 0
    grammar: bool = True


def wide_filter_params(rng: random.Random, config: SamplerConfig) -> SamplingParams:
    """`random_sampling_params`, half of them with a top-k past the candidates or a wide
    top-p alone: rows that only the exact searches settle (on flat logits)."""
    params = random_sampling_params(rng, config)
    if rng.random() < 0.5:
        top_k = rng.choice([0, 0, 2 * CANDIDATES])
        params = dataclasses.replace(
            params,
            temperature=rng.uniform(0.8, 1.5),
            top_k=top_k,
            top_p=rng.uniform(0.7, 0.99),
            min_p=0.0,
        )
    return params


def _processed(sampler: Sampler, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2-4 of `sampler`'s batch on `logits`, where every token-indexed table it holds
    (bias, allowed and stop ids, bad words, grammar words, prompt bits and counts) shows;
    and steps 2-8, where the min_p and top-k/top-p cuts show."""
    rows = logits.shape[0]
    slots = sampler.batch_state.slots(rows)
    grammar = sampler.stages.grammar.bitmask_rows(rows)
    masked = mask_and_penalize(sampler.stages, logits, slots, grammar)
    return masked, sampler.pipeline.process(logits, slots, grammar).logits


def random_bitmask(
    rng: random.Random, rows: int, vocab_size: int, positions: int | None = None
) -> tuple[list[int], np.ndarray]:
    """Some batch rows, and a random grammar bitmask for them: int32 [len(rows), W] (or
    [len(rows), positions, W]) that allows token 0, so that no row is all masked by it."""
    picked = sorted(rng.sample(range(rows), rng.randint(0, rows)))
    shape = (len(picked), *(() if positions is None else (positions,)), -(-vocab_size // 32))
    words = np.frombuffer(rng.randbytes(4 * int(np.prod(shape))), np.int32).reshape(shape)
    bitmask = words.copy()
    bitmask[..., 0] |= 1
    return picked, bitmask


def compare_with_sampler(rank: int, world_size: int, spec: Comparison) -> None:
    """On every rank: a `VocabParallelSampler` on this rank's columns against `Sampler` on
    the whole rows, over `spec.steps` churning steps with every feature on and a commit
    mask on odd steps. Tokens must be equal, logprobs within float32 rounding, ranks too
    (`_check_logprobs`), the rank's token-indexed state equal to the matching columns of
    the single-device sampler's after every step; a make_fx trace taken at the first step
    must replay every later one as eager runs it, which runs under `SyncOpDetector`; bad
    updates are refused alike on every rank (`_check_refusals`). A step whose top-p cut
    parts from the whole rows' at a boundary within rounding ends the steps on every rank
    (`_filtered_logits_agree`), the histories being free to part from there."""
    config = SamplerConfig(**spec.config)
    reference = Sampler(config, "cpu")
    sampler = VocabParallelSampler(config, device="cpu")
    start, end = sampler.shard.start, sampler.shard.end
    # a full batch of churning requests, one row short of the capacity: room for padding
    target = max(1, config.max_num_reqs - 1)
    driver = BatchDriver(
        config, seed=spec.seed, make_params=wide_filter_params, joins=refill, target=target
    )
    if config.has_reasoning:  # budgets that run out within the steps, across the shards
        open_reasoning_sections(driver, config.reasoning_start_token_ids, spec.seed)
    rng = random.Random(spec.seed)
    gen = torch.Generator().manual_seed(spec.seed)
    state = StateTensors(sampler)
    replayer: MakeFxReplayer | None = None
    vocab, rows = config.vocab_size, config.max_num_reqs
    for step in range(spec.steps):
        update = driver.next_update()
        reference.update_state(update)
        sampler.update_state(update)
        if spec.grammar:
            grammar_rows, bitmask = random_bitmask(rng, rows, vocab)
            reference.stage_grammar_bitmask(bitmask, grammar_rows)
            sampler.stage_grammar_bitmask(bitmask, grammar_rows)
        num_rows = rows  # the batch and a padded row: one shape, for the trace
        # peaked rows, which the candidates settle, and flat ones, whose nucleus passes
        # them (the exact searches)
        peakedness = rng.choice([0.1, 0.3, 1.1])
        logits = llm_like_logits(num_rows, vocab, peakedness=peakedness, seed=rng.randrange(2**31))
        where = f"rank {rank}/{world_size}, step {step}"
        own = _processed(sampler, logits[:, start:end])
        whole = _processed(reference, logits)
        _assert_equal(f"{where}: token-indexed state", own[0], whole[0][:, start:end])
        # a top-p target within float32 rounding of a cumulative mass (flat rows, about
        # 1e-3 of the runs) lets the shards' search and the whole rows' sort cut a boundary
        # token apart: both cuts checked valid, and the run ends there on every rank, since
        # the tokens and histories may part from then on
        split_boundary = _filtered_logits_agree(reference, whole, own[1], start, end, where)
        if _anywhere(split_boundary):
            break
        local = logits[:, start:end].contiguous()
        # some rows keep their history now and then (a chunked prefill's discarded token)
        commit_mask = torch.rand(rows, generator=gen) < (0.7 if step % 2 else 1.0)
        if replayer is None:  # traced once, under the first batch
            replayer = MakeFxReplayer(sampler, (local, commit_mask), state)
        # the trace replays under this batch as eager runs it, outputs and state
        before = state.snapshot()
        replayed = _clone(replayer(local, commit_mask))
        after_replay = state.snapshot()
        state.restore(before)
        expected = reference(logits, commit_mask)
        with SyncOpDetector(f"VocabParallelSampler.forward, {where}"):
            actual = sampler(local, commit_mask)
        for name, tensor in state.tensors.items():
            _assert_equal(f"{where}: state {name} after the replay", after_replay[name], tensor)
        for got, want in zip(_leaves(replayed), _leaves(actual), strict=True):
            _assert_equal(f"{where}: replayed output", got, want)
        changes = state.address_changes().names()
        assert not changes, f"{where}: state tensors moved or changed: {changes}"
        assert torch.equal(actual.sampled_token_ids, expected.sampled_token_ids), (
            f"{where}: tokens {actual.sampled_token_ids[:, 0].tolist()} != "
            f"{expected.sampled_token_ids[:, 0].tolist()}"
        )
        if config.max_num_logprobs:
            source = logits if config.logprobs_mode.startswith("raw") else whole[1]
            _check_logprobs(expected, actual, source, config.logprobs_mode, where)
        driver.record_tokens(expected.sampled_token_ids[:, 0].tolist(), commit_mask.tolist())
        _assert_equal(
            f"{where}: penalty counts after the commit",
            sampler.stages.penalties.counts,
            reference.stages.penalties.counts[:, start:end],
        )
    for name in ("num_generated",):
        own = getattr(sampler.batch_state, name).device
        assert torch.equal(own, getattr(reference.batch_state, name).device), where
    _check_refusals(sampler, f"rank {rank}/{world_size}")


def _filtered_logits_agree(
    reference: Sampler,
    whole: tuple[torch.Tensor, torch.Tensor],
    own: torch.Tensor,
    start: int,
    end: int,
    where: str,
) -> bool:
    """Whether this rank's filtered logits (`own`, [num_rows, end - start]) differ from the
    whole rows' (`whole`: `_processed` of the reference) at a top-p boundary only: False
    where they are equal; True where every row that differs keeps a nested set of the same
    values whose cut, on the whole row (the reference's own logits before top-p), is a
    valid top-p set within 1e-5 of the row's top_p (`reference.is_top_p_set_within`), as
    the reference's is. Any other difference raises."""
    theirs = whole[1][:, start:end]
    if torch.equal(own, theirs):
        return False
    rows = own.shape[0]
    slots = reference.batch_state.slots(rows)
    stages = reference.stages
    # steps 6-7 on the reference's masked rows: what top-k/top-p cut (the eager pipeline's)
    scaled, _ = stages.temperature.apply(whole[0], slots)
    before_cut = stages.min_p.apply_slots(scaled, slots)  # [num_rows, V] float32
    top_k = stages.top_k_top_p.top_k.device[slots].tolist()
    top_p = stages.top_k_top_p.top_p.device[slots].tolist()
    for r in range(rows):
        if torch.equal(own[r], theirs[r]):
            continue
        mine, ref = own[r] > float("-inf"), theirs[r] > float("-inf")
        kept_values_intact = torch.equal(own[r][mine], before_cut[r, start:end][mine])
        nested = not (mine & ~ref).any() or not (ref & ~mine).any()
        x = top_k_top_p(before_cut[r].double().numpy(), top_k[r], 1.0)  # top-k alone
        shard = np.zeros(x.shape[0], dtype=bool)
        shard[start:end] = True
        if bool((mine & ~ref).any()):  # the shards keep more: down to their lowest here
            split = x >= float(own[r][mine].min())
        else:  # fewer: above the highest value they dropped here
            split = x > float(theirs[r][ref & ~mine].max())
        whole_kept = (whole[1][r] > float("-inf")).numpy()
        explained = (
            kept_values_intact
            and nested
            and top_p[r] < 1.0
            and is_top_p_set_within(split, x, top_p[r], 1e-5)
            and is_top_p_set_within(whole_kept, x, top_p[r], 1e-5)
            and np.array_equal(split[shard], mine.numpy())
        )
        assert explained, f"{where}: filtered logits differ in row {r}, not at a top-p boundary"
    return True


def _anywhere(flag: bool) -> bool:
    """`flag` of any rank, on every rank (a collective: every rank calls it)."""
    found = torch.tensor([int(flag)])
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return bool(found.item())


def _check_refusals(sampler: VocabParallelSampler, where: str) -> None:
    """Bad input raises the same ValueError on every rank, and changes nothing: the ranks'
    states stay in step."""
    vocab = sampler.config.vocab_size
    bad = [
        SamplingParams(logit_bias={vocab - 1: 1.0, vocab: 2.0}),  # the last id of one rank
        SamplingParams(bad_words_token_ids=[[0, vocab + 3]]),
        SamplingParams(allowed_token_ids=[sampler.shard.start, vocab]),
    ]
    messages = []
    for params in bad:
        fingerprint = state_fingerprint([sampler])
        update = BatchUpdate(1, (), ((0, params, [1, 2], []),), ())
        try:
            sampler.update_state(update)
        except ValueError as exc:
            messages.append(str(exc))
        else:
            raise AssertionError(f"{where}: {params} was accepted")
        for name, tensor in state_fingerprint([sampler]).items():
            _assert_equal(f"{where}: {name} after a refused update", tensor, fingerprint[name])
    everyone: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, messages)
    assert all(m == messages for m in everyone), f"{where}: the ranks refused unlike: {everyone}"


def _leaves(out: SamplerOutput) -> list[torch.Tensor]:
    logprobs = out.logprobs_tensors
    return [out.sampled_token_ids, *(logprobs if logprobs is not None else ())]


def _clone(out: SamplerOutput) -> SamplerOutput:
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


def _assert_equal(what: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    try:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    except AssertionError as exc:
        raise AssertionError(f"{what} differ: {exc}") from None


def _check_logprobs(
    expected: SamplerOutput, actual: SamplerOutput, source: torch.Tensor, mode: str, where: str
) -> None:
    """Logprobs equal up to float32 rounding, ids equal. Ranks: equal in the *_logits
    modes; in the *_logprobs modes each sampler subtracts its own logsumexp (equal up to
    rounding), so both ranks must lie between the float64 counts of the tokens whose
    logprob reaches the sampled one's plus and minus a rounding margin.
    source: [num_rows, V] the whole rows the logprobs are of (raw or processed)."""
    e, a = expected.logprobs_tensors, actual.logprobs_tensors
    assert e is not None and a is not None
    torch.testing.assert_close(
        a.logprobs, e.logprobs, equal_nan=True, msg=lambda m: f"{where}: logprobs: {m}"
    )
    ranks = (a.selected_token_ranks, e.selected_token_ranks)
    if mode.endswith("logits"):
        assert torch.equal(*ranks), f"{where}: ranks {ranks[0].tolist()} != {ranks[1].tolist()}"
    else:
        logprobs = torch.log_softmax(source.double(), dim=-1)  # [num_rows, V]
        sampled = logprobs.gather(1, e.logprob_token_ids[:, :1].long())  # [num_rows, 1]
        margin = 1e-5 * (1.0 + sampled.abs())
        most = (logprobs >= sampled - margin).sum(-1)
        least = (logprobs >= sampled + margin).sum(-1)
        finite = sampled[:, 0].isfinite()  # a masked row's ranks are 0 or V on both sides
        for rank in ranks:
            inside = (least <= rank) & (rank <= most)
            assert bool((inside | ~finite).all()), (
                f"{where}: ranks {rank.tolist()} outside [{least.tolist()}, {most.tolist()}]"
            )
    # ids of equal values come in no set order: compare where the value is finite (a masked
    # token's -inf ties with every other one) and no other of the top K has it
    if e.requested_token_ids is not None:
        assert a.requested_token_ids is not None and a.requested_logprobs is not None
        assert torch.equal(a.requested_token_ids, e.requested_token_ids), where
        torch.testing.assert_close(
            a.requested_logprobs, e.requested_logprobs, equal_nan=True,
            msg=lambda m: f"{where}: logprobs of the chosen ids: {m}",
        )  # fmt: skip
        # the chosen ids' ranks: the same counts as the sampled token's, on their values
        assert a.requested_ranks is not None and e.requested_ranks is not None
        if mode.endswith("logits"):
            assert torch.equal(a.requested_ranks, e.requested_ranks), where
        else:
            ids = e.requested_token_ids.long()
            chosen = logprobs.gather(1, ids.clamp(min=0))  # [num_rows, C]
            margin = 1e-5 * (1.0 + chosen.abs())
            most = (logprobs[:, None, :] >= (chosen - margin)[:, :, None]).sum(-1)
            least = (logprobs[:, None, :] >= (chosen + margin)[:, :, None]).sum(-1)
            counted = (ids >= 0) & chosen.isfinite()
            for chosen_rank in (a.requested_ranks, e.requested_ranks):
                inside = (least <= chosen_rank) & (chosen_rank <= most)
                assert bool((inside | ~counted).all()), f"{where}: chosen ids' ranks"
    values = e.logprobs[:, 1:]
    unique = ((values[:, :, None] == values[:, None, :]).sum(-1) == 1) & values.isfinite()
    assert torch.equal(a.logprob_token_ids[:, 0], e.logprob_token_ids[:, 0]), where
    ids_e, ids_a = e.logprob_token_ids[:, 1:], a.logprob_token_ids[:, 1:]
    assert torch.equal(ids_a[unique], ids_e[unique]), f"{where}: top-K token ids differ"


def compare_rejection_with_sampler(rank: int, world_size: int, spec: Comparison) -> None:
    """On every rank: a `VocabParallelRejectionSampler` on this rank's columns against
    `RejectionSampler` on the whole rows, over `spec.steps` churning speculative steps with
    every feature on (per-position grammar masks, drafts often the target's argmax so that
    runs get accepted, draft probabilities on even steps). Outputs must be equal, and the
    rank's penalty counts the single-device sampler's columns."""
    config = SamplerConfig(**spec.config)
    max_spec_len = 3
    reference = RejectionSampler(Sampler(config, "cpu"), max_spec_len)
    sampler = VocabParallelSampler(config, device="cpu")
    rejection = VocabParallelRejectionSampler(sampler, max_spec_len)
    start, end = sampler.shard.start, sampler.shard.end
    driver = BatchDriver(
        config, seed=spec.seed, make_params=wide_filter_params, joins=refill, target=None
    )
    if config.has_reasoning:
        open_reasoning_sections(driver, config.reasoning_start_token_ids, spec.seed)
    rng = random.Random(spec.seed + 1)
    gen = torch.Generator().manual_seed(spec.seed)
    vocab, rows, positions = config.vocab_size, config.max_num_reqs, max_spec_len + 1
    for step in range(spec.steps):
        update = driver.next_update()
        reference.update_state(update)
        rejection.update_state(update)
        if spec.grammar:
            grammar_rows, bitmask = random_bitmask(rng, rows, vocab, positions)
            reference.stage_grammar_bitmask(bitmask, grammar_rows)
            rejection.stage_grammar_bitmask(bitmask, grammar_rows)
        logits = llm_like_logits(
            rows * positions, vocab, peakedness=rng.choice([0.3, 1.1, 2.0]), seed=step
        ).view(rows, positions, vocab)
        likely = logits[:, :max_spec_len].argmax(-1)  # [rows, S]
        guesses = torch.randint(0, vocab, (rows, max_spec_len), generator=gen)
        drafts = torch.where(torch.rand(rows, max_spec_len, generator=gen) < 0.7, likely, guesses)
        num_drafts = torch.randint(0, max_spec_len + 1, (rows,), generator=gen)
        probs = None
        if step % 2 == 0:
            probs = torch.softmax(torch.randn(rows, max_spec_len, vocab, generator=gen), -1)
        where = f"rank {rank}/{world_size}, speculative step {step}"
        expected = reference(logits, drafts, num_drafts, probs)
        actual = rejection(
            logits[:, :, start:end].contiguous(),
            drafts,
            num_drafts,
            None if probs is None else probs[:, :, start:end].contiguous(),
        )
        for got, want, what in zip(actual, expected, ("tokens", "num_accepted"), strict=True):
            assert torch.equal(got, want), f"{where}: {what} {got.tolist()} != {want.tolist()}"
        emitted = expected.output_token_ids
        driver_rows = [
            [int(t) for t in row if t >= 0] for row in emitted.tolist()
        ]  # each row's accepted drafts and its emitted token, in order
        for column in range(positions):
            driver.record_tokens(
                [row[column] if column < len(row) else -1 for row in driver_rows],
                [column < len(row) for row in driver_rows],
            )
    counts = sampler.stages.penalties.counts
    assert torch.equal(counts, reference.sampler.stages.penalties.counts[:, start:end]), (
        f"rank {rank}: penalty counts differ from the single-device sampler's columns"
    )


def compare_all(rank: int, world_size: int, *specs: Comparison) -> None:
    """`compare_with_sampler`, then `compare_rejection_with_sampler`, for each spec in turn on
    one set of ranks (one spawn: each rank's start-up is most of a short comparison's time)."""
    for spec in specs:
        compare_with_sampler(rank, world_size, spec)
        compare_rejection_with_sampler(rank, world_size, spec)
