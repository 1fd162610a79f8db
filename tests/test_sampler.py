"""Sampler: the docs/design.md §4 pipeline against the float64 reference, seeded determinism across
layouts, sampling statistics, graph safety, bad input, and the two backends side by side.
Tests taking `backend` run on both backends, each on its device (tests/backends.py: the
Triton backend on CUDA in a GPU run); the cross-backend sections at the end build both
samplers on `kernel_device`; the others run on the PyTorch backend, on the CPU. Bad words:
tests/test_bad_words.py."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
import torch
from backends import BACKENDS, backend_device, interpreted
from scipy import stats

import graphsafe_sampler as gs
from graphsafe_sampler import BatchUpdate, MoveDirectionality, Sampler, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.examples.target_token import TargetTokenLogitsProcessor
from graphsafe_sampler.kernels.constants import SALT_SAMPLE
from graphsafe_sampler.processors.base import SlotLogitsProcessor
from graphsafe_sampler.rng import gumbel_noise
from graphsafe_sampler.testing import BatchDriver, check_graph_safety, kernel_launches, reference

V = 111


def _config(backend: str, *args: Any, **kwargs: Any) -> SamplerConfig:
    return SamplerConfig(*args, backend=backend, **kwargs)


def _processed(out: gs.SamplerOutput, rows: int) -> np.ndarray:
    """Rebuild [rows, V] processed logits from the K = V logprobs columns."""
    lp = out.logprobs_tensors
    assert lp is not None
    full = np.full((rows, V), np.nan)
    ids = lp.logprob_token_ids[:, 1:].long().cpu().numpy()
    vals = lp.logprobs[:, 1:].double().cpu().numpy()
    np.put_along_axis(full, ids, vals, axis=1)
    return full


@pytest.mark.parametrize("backend", BACKENDS)
def test_pipeline_matches_reference_under_churn(backend: str) -> None:
    config = _config(backend,
        max_num_reqs=17, vocab_size=V, eos_token_id=3, max_num_logprobs=V,
        logprobs_mode="processed_logits", max_logit_bias_tokens=16, max_stop_token_ids=4,
        max_bad_word_len=4, seed=0, max_logprob_token_ids=4,
        reasoning_start_token_ids=(5,), reasoning_end_token_ids=(6, 7), watermark_context_len=3,
    )  # fmt: skip
    device = backend_device(backend)
    sampler = Sampler(config, device)
    driver = BatchDriver(config, seed=5, churn=0.15)
    gen = torch.Generator().manual_seed(5)
    boundary = 0
    # The interpreter pays K = V logprobs selections per row and step: fewer steps there.
    for _step in range(3 if interpreted(backend, device) else 40):
        sampler.update_state(driver.next_update())
        logits = torch.randn(17, V, generator=gen) * 3
        out = sampler(logits.to(device))
        got = _processed(out, 17)
        tokens = out.sampled_token_ids[:, 0].tolist()
        for r, req in enumerate(driver.rows):
            want, greedy, is_greedy = reference.pipeline(logits[r].double().numpy(), req, config)
            if is_greedy:
                assert tokens[r] == greedy, (r, req)
            else:
                assert not math.isinf(want[tokens[r]]), "sampled a masked token"
            finite_got, finite_want = np.isfinite(got[r]), np.isfinite(want)
            boundary += int((finite_got != finite_want).sum())
            both = finite_got & finite_want
            np.testing.assert_allclose(got[r][both], want[both], rtol=1e-5, atol=1e-5)
        driver.record_tokens(tokens)
    assert boundary <= 2, f"{boundary} tokens masked differently from the reference"


def _run(sampler: Sampler, row: int, num_rows: int, steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        logits = torch.linspace(-2.0, 2.0, V).repeat(num_rows, 1).to(sampler.device)
        out.append(int(sampler(logits).sampled_token_ids[row, 0]))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_tokens_do_not_depend_on_row_batch_or_padding(backend: str) -> None:
    config = _config(backend, max_num_reqs=9, vocab_size=V, seed=1)
    params = SP(temperature=1.3, top_k=40, top_p=0.9, seed=1234)
    device = backend_device(backend)
    a = Sampler(config, device)
    a.update_state(BatchUpdate(1, added=[(0, params, [5, 6], [])]))
    alone = _run(a, 0, 1, 12)
    b = Sampler(config, device)
    b.update_state(
        BatchUpdate(
            6,
            added=[(r, SP(temperature=0.7, seed=r), None, []) for r in range(5)]
            + [(5, params, [5, 6], [])],
            moved=[(5, 2, MoveDirectionality.SWAP)],
        )
    )
    crowded = _run(b, 2, 9, 12)  # row 2, a full batch, 3 padded rows
    assert alone == crowded
    assert len(set(alone)) > 3  # really random


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(SP(), id="plain"),
        pytest.param(SP(top_k=9), id="top_k"),
        pytest.param(SP(top_p=0.7), id="top_p"),
        pytest.param(SP(top_k=20, top_p=0.8), id="top_k+top_p"),
        pytest.param(SP(min_p=0.1), id="min_p"),
        pytest.param(
            SP(
                temperature=0.7, repetition_penalty=1.4, frequency_penalty=0.3, presence_penalty=0.2
            ),
            id="penalties+temperature",
        ),
    ],
)
def test_chi_square_against_reference_distribution(params: SP) -> None:
    vocab, rows, steps = 64, 1024, 200  # 204,800 draws
    # Small capacities for the features these rows leave off: the torch backend pays for
    # every capacity slot, and 200 steps of 1,024 rows must stay quick. max_model_len too:
    # the overflow tables hold ceil(max_model_len / 255) entries a slot (514 at the default),
    # and the 206 positions a row reaches here fit in 512.
    config = SamplerConfig(
        max_num_reqs=rows, vocab_size=vocab, seed=11, max_model_len=512, max_bad_words=1,
        max_bad_word_len=2, max_bad_words_tokens=2, max_logit_bias_tokens=2,
        max_stop_token_ids=1,
    )  # fmt: skip
    sampler = Sampler(config, "cpu")
    prompt = [1, 2, 3]
    output = [4, 4, 9]
    sampler.update_state(
        BatchUpdate(
            rows,
            added=[
                (r, dataclasses.replace(params, seed=1000 + r), prompt, list(output))
                for r in range(rows)
            ],
        )
    )
    base = torch.from_numpy(np.random.default_rng(3).normal(0, 1.5, vocab)).float()
    req = reference.DriverRequest(params, prompt, list(output))
    probs_logits, _, _ = reference.pipeline(base.double().numpy(), req, config)
    want = np.exp(probs_logits - probs_logits.max())
    want /= want.sum()
    counts = np.zeros(vocab)
    logits = base.repeat(rows, 1)
    for _ in range(steps):
        # commit=False: the distribution stays fixed; positions must still differ, so
        # advance them through the generated count alone (no token enters the counts).
        toks = sampler(logits, commit=False).sampled_token_ids[:, 0].numpy()
        np.add.at(counts, toks, 1)
        sampler.batch_state.num_generated.device[:rows] += 1
    support = want > 0
    assert counts[~support].sum() == 0, "drew a token outside the support"
    expected = want[support] * counts.sum()
    merged = expected >= 5  # chi-square needs expected counts >= 5; pool the rest
    obs = np.append(counts[support][merged], counts[support][~merged].sum())
    exp = np.append(expected[merged], expected[~merged].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp).pvalue > 1e-3


MAX_TRITON_LAUNCHES = 8


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_a_triton_step_launches_a_handful_of_kernels(
    kernel_device: torch.device, mode: str
) -> None:
    """Every feature reachable (logprobs, grammar rows, bad words, penalties, ...): the
    Triton step is its 4 ops (processing, the cut, sampling with the commit, logprobs), no
    copy of the logits and no per-stage PyTorch glue (each glue op is one more launch, and
    one more node of the CUDA graph)."""
    config = SamplerConfig(
        backend="triton", max_num_reqs=6, vocab_size=V, eos_token_id=2, max_num_logprobs=3,
        logprobs_mode=mode, seed=0,
    )  # fmt: skip
    sampler = Sampler(config, kernel_device)
    driver = BatchDriver(config, seed=3)
    sampler.update_state(driver.next_update())
    words = (V + 31) // 32
    sampler.stage_grammar_bitmask(np.full((2, words), -1, dtype=np.int32), rows=[0, 3])
    logits = torch.randn(6, V).to(kernel_device)
    launches = kernel_launches(lambda x: sampler(x), logits)
    assert len(launches) <= MAX_TRITON_LAUNCHES, launches
    kernels = [name for name in launches if name.startswith("graphsafe_sampler.")]
    assert kernels == launches and len(set(kernels)) == 4, launches


def test_kernel_launches_counts_kernels_not_views() -> None:
    def step(x: torch.Tensor) -> torch.Tensor:
        y = x.view(-1)[:3]  # views: no kernel
        z = torch.empty_like(y)  # an allocation: no kernel
        return z.copy_(y) + 1  # a copy and an add: two

    assert kernel_launches(step, torch.randn(2, 4)) == ["aten.copy_.default", "aten.add.Tensor"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_safety_of_the_whole_sampler(backend: str) -> None:
    """On CUDA (the Triton backend in a GPU run), check_graph_safety also captures and
    replays a real CUDA graph."""
    config = _config(backend,
        max_num_reqs=6, vocab_size=V, eos_token_id=2, max_num_logprobs=3, seed=0,
        max_logit_bias_tokens=8, max_stop_token_ids=4, max_bad_word_len=4,
        max_logprob_token_ids=3, reasoning_start_token_ids=(5,), reasoning_end_token_ids=(6, 7),
        watermark_context_len=2,
    )  # fmt: skip
    device = backend_device(backend)
    sampler = Sampler(config, device)
    rng = np.random.default_rng(4)
    words = (V + 31) // 32

    def advance(driver: BatchDriver, out: gs.SamplerOutput) -> None:
        # The engine side of a step: record tokens, stage the next grammar bitmask rows.
        driver.record_tokens(out.sampled_token_ids[:, 0].tolist())
        rows = sorted(rng.choice(6, size=int(rng.integers(0, 4)), replace=False).tolist())
        mask = rng.integers(-(2**31), 2**31, size=(len(rows), words), dtype=np.int64)
        sampler.stage_grammar_bitmask(mask.astype(np.int32), rows=rows)

    # The interpreter runs each kernel in numpy, one program per row: fewer steps there.
    num_steps = 5 if interpreted(backend, device) else 50
    # Dynamo's trace (aot_eager) is what graph safety needs; inductor's code for the whole
    # Sampler is checked against eager by the demo's compiled loop (tests/test_demo.py).
    report = check_graph_safety(
        sampler, num_steps=num_steps, seed=4, fn=lambda x: sampler(x), advance=advance,
        compile_backend="aot_eager",
    )  # fmt: skip
    assert report.compile_frames == 1


@pytest.mark.parametrize(
    ("logits", "exc", "match"),
    [
        (torch.randn(3, V, dtype=torch.float64), TypeError, "float32, float16 or bfloat16"),
        (torch.randn(V), ValueError, "must be 2-D"),
        (torch.randn(3, V + 1), ValueError, f"{V + 1} columns, vocab_size is {V}"),
        (torch.randn(5, V), ValueError, "5 rows; forward takes 1 to max_num_reqs = 4"),
        ([[0.0] * V], TypeError, "must be a torch.Tensor"),
    ],
    ids=["float64", "1-D", "vocab", "too-many-rows", "list"],
)
def test_bad_logits(logits: object, exc: type, match: str) -> None:
    sampler = Sampler(SamplerConfig(max_num_reqs=4, vocab_size=V), "cpu")
    sampler.update_state(None)
    with pytest.raises(exc, match=match):
        sampler(logits)


def test_forward_before_update_state() -> None:
    sampler = Sampler(SamplerConfig(max_num_reqs=4, vocab_size=V), "cpu")
    with pytest.raises(RuntimeError, match="forward before any update_state"):
        sampler(torch.randn(2, V))


# The interpreter's numpy log of an all-masked row's zero mass (the lse becomes -inf, then 0).
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_fully_masked_rows_give_the_documented_ids(backend: str) -> None:
    # sampler.py: "A NaN row returns the index of its first NaN (argmax's choice); a row with
    # every token masked returns token 0", greedy or random, on both backends, logprobs on;
    # such a row commits its token like any other, and padded rows commit nothing.
    device = backend_device(backend)
    config = _config(backend, max_num_reqs=9, vocab_size=V, max_num_logprobs=5)
    sampler = Sampler(config, device)
    seed = int(np.random.default_rng().integers(2**31))
    print(f"logits seed {seed}")  # fresh logits each run; shown on failure: rerun with it
    logits = torch.randn(9, V, generator=torch.Generator().manual_seed(seed)) * 3
    masked = SP(allowed_token_ids=[5], bad_words_token_ids=[[5]])  # allowed, then banned
    rows = [
        SP(seed=0, top_p=0.5),  # random, one NaN at column 7
        SP(seed=1, top_p=0.5),  # random, every logit -inf
        SP(seed=2, top_p=0.5),  # random, every logit NaN
        SP(temperature=0.0),  # greedy, NaN at columns 12 and 60
        dataclasses.replace(masked, seed=4, top_p=0.5),  # random, every token masked
        dataclasses.replace(masked, temperature=0.0),  # greedy, every token masked
        SP(seed=6, top_p=0.5),  # random, finite up to column 40, NaN from there on
    ]
    sampler.update_state(BatchUpdate(7, added=[(r, p, None, []) for r, p in enumerate(rows)]))
    logits[0, 7] = float("nan")
    logits[1] = float("-inf")
    logits[2] = float("nan")
    logits[3, [12, 60]] = float("nan")
    # The only allowed token is each masked row's best: a row that kept it would take it.
    logits[4:6, 5] = logits[4:6].amax(dim=1) + 1.0
    logits[6, 40:] = float("nan")
    generated = sampler.batch_state.num_generated.device
    before = generated.clone()
    toks = sampler(logits.to(device)).sampled_token_ids[:, 0].cpu()
    assert toks[:7].tolist() == [7, 0, 0, 12, 0, 0, 40]
    assert ((toks >= 0) & (toks < V)).all()  # rows 7-8 are padding
    grew = (generated - before).cpu()
    slots = [sampler.batch_state.slot_of_row(r) for r in range(7)]
    assert grew[slots].tolist() == [1] * 7 and int(grew.sum()) == 7


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_logits_and_rng_draws_stay_in_range(backend: str) -> None:
    device = backend_device(backend)
    sampler = Sampler(_config(backend, max_num_reqs=2, vocab_size=V, max_num_logprobs=2), device)
    sampler.update_state(BatchUpdate(2, added=[(0, SP(seed=5), None, []), (1, SP(), None, [])]))
    out = sampler(torch.randn(2, V).bfloat16().to(device))
    assert out.logprobs_tensors is not None
    assert (
        out.logprobs_tensors.logprob_token_ids[:, 0].tolist()
        == out.sampled_token_ids[:, 0].tolist()
    )
    assert (out.logprobs_tensors.selected_token_ranks.cpu() >= 1).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_commit_masks_and_multi_token_commits_enter_history(backend: str) -> None:
    config = _config(backend, max_num_reqs=4, vocab_size=V, max_num_logprobs=V,
                           logprobs_mode="processed_logits")  # fmt: skip
    device = backend_device(backend)
    sampler = Sampler(config, device)
    pen = SP(temperature=0.0, presence_penalty=1.0)
    sampler.update_state(BatchUpdate(3, added=[(r, pen, None, []) for r in range(3)]))
    logits = torch.randn(4, V)
    # Row 1 is a chunked-prefill row this step: its token must not count.
    out = sampler(logits.to(device), commit_mask=torch.tensor([True, False, True, True]).to(device))
    first = out.sampled_token_ids[:, 0].cpu()
    gen = sampler.batch_state.num_generated.device
    slots = [sampler.batch_state.slot_of_row(r) for r in range(3)]
    assert [int(gen[s]) for s in slots] == [1, 0, 1]
    processed = _processed(sampler(logits.to(device), commit=False), 4)
    assert processed[0, int(first[0])] == pytest.approx(float(logits[0, int(first[0])]) - 1.0)
    assert processed[1, int(first[1])] == pytest.approx(float(logits[1, int(first[1])]))
    # Speculative decoding: a variable number of tokens per row.
    drafts = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13], [1, 1, 1]])
    counts = sampler.stages.penalties.counts
    before = counts.clone()  # the sampled tokens above may be any of the drafted ids
    sampler.commit_tokens(drafts.to(device), num_tokens=torch.tensor([3, 0, 2, 3]).to(device))
    assert [int(gen[s]) for s in slots] == [4, 0, 3]
    added = (counts - before).cpu()
    assert added[slots[0], [5, 6, 7]].tolist() == [1, 1, 1] and added[slots[0]].sum() == 3
    assert added[slots[1]].sum() == 0
    assert added[slots[2], [11, 12]].tolist() == [1, 1] and added[slots[2]].sum() == 2
    assert added.sum() == 5  # the padded row commits nothing


@pytest.mark.parametrize("backend", BACKENDS)
def test_grammar_bitmask_rows_and_clearing(backend: str) -> None:
    from graphsafe_sampler.bitmask import pack_token_ids

    config = _config(backend, max_num_reqs=3, vocab_size=V, max_num_logprobs=V,
                           logprobs_mode="processed_logits")  # fmt: skip
    device = backend_device(backend)
    sampler = Sampler(config, device)
    sampler.update_state(BatchUpdate(3, added=[(r, SP(seed=r), None, []) for r in range(3)]))
    mask = np.stack([pack_token_ids([3, 50], V)])
    sampler.stage_grammar_bitmask(mask, rows=[1])
    logits = torch.randn(3, V).to(device)
    for _ in range(5):
        out = sampler(logits)
        assert int(out.sampled_token_ids[1, 0]) in (3, 50)
        got = _processed(out, 3)
        assert np.isfinite(got[1]).sum() == 2 and np.isfinite(got[[0, 2]]).all()
    sampler.stage_grammar_bitmask(None)
    assert np.isfinite(_processed(sampler(logits), 3)).all()
    with pytest.raises(TypeError, match="grammar bitmask must be int32, got int64"):
        sampler.stage_grammar_bitmask(mask.astype(np.int64), rows=[1])
    with pytest.raises(ValueError, match=r"must have shape \[rows, 4\]"):
        sampler.stage_grammar_bitmask(np.zeros((1, 5), dtype=np.int32), rows=[1])
    with pytest.raises(ValueError, match=r"grammar bitmask row 3 is outside \[0, 3\)"):
        sampler.stage_grammar_bitmask(mask, rows=[3])


@pytest.mark.parametrize(
    "mode", ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_modes(backend: str, mode: str) -> None:
    k = 4
    config = _config(backend, max_num_reqs=5, vocab_size=V, max_num_logprobs=k, logprobs_mode=mode)
    device = backend_device(backend)
    sampler = Sampler(config, device)
    params = [SP(temperature=0.0), SP(temperature=0.8, top_k=5, seed=1), SP(min_p=0.2, seed=2)]
    sampler.update_state(BatchUpdate(3, added=[(r, p, None, []) for r, p in enumerate(params)]))
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(seed)) * 2
    out = sampler(logits.to(device))
    assert out.logprobs_tensors is not None
    lp = gs.LogprobsTensors(*(None if t is None else t.cpu() for t in out.logprobs_tensors))
    assert lp.logprobs.shape == (5, k + 1)
    tokens = out.sampled_token_ids[:, 0].cpu()
    assert torch.equal(lp.logprob_token_ids[:, 0], tokens)
    for r in range(3):
        req = reference.DriverRequest(params[r], None, [])
        raw = logits[r].double().numpy()
        source = raw if mode.startswith("raw") else reference.pipeline(raw, req, config)[0]
        # a float32 logprob is logit - lse, off by a few ulp of the larger: an absolute
        # error that a logprob near 0 (a dominant token) does not shrink
        atol = 0.0
        if mode.endswith("logprobs"):
            finite = np.isfinite(source)
            lse = np.log(np.exp(source[finite] - source[finite].max()).sum()) + source.max()
            values = source - lse
            atol = 8 * float(np.spacing(np.float32(max(abs(lse), np.abs(source[finite]).max()))))
        else:
            values = source
        order = np.argsort(-values, kind="stable")[:k]
        np.testing.assert_allclose(
            lp.logprobs[r, 1:].double().numpy(), values[order], rtol=1e-5, atol=atol
        )  # fmt: skip
        finite = np.isfinite(values[order])  # ties at -inf come in any order
        got_ids = lp.logprob_token_ids[r, 1:].numpy()
        assert got_ids[finite].tolist() == order[finite].tolist()
        sampled = values[int(tokens[r])]
        assert lp.logprobs[r, 0].item() == pytest.approx(sampled, rel=1e-5, abs=atol)
        # float32 rounding may merge a neighbour within 1e-6 below the sampled value into it,
        # or not: the rank lies between the two float64 counts (equal almost always)
        rank = lp.selected_token_ranks[r].item()
        assert int((values >= sampled).sum()) <= rank <= int((values >= sampled - 1e-6).sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_rows_touch_no_request_state(backend: str) -> None:
    config = _config(backend, max_num_reqs=6, vocab_size=V, seed=2)
    device = backend_device(backend)
    sampler = Sampler(config, device)
    sampler.update_state(BatchUpdate(2, added=[(r, SP(), [1], []) for r in range(2)]))
    before = {k: t.clone() for k, t in sampler.state_tensors().items()}
    sampler(torch.randn(6, V).to(device))  # 2 requests, 4 padded rows
    after = sampler.state_tensors()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {
        "num_generated.device", "penalties.counts", "penalties.output_words",
        "bad_words.recent_tokens.device",
    }  # fmt: skip
    live = [sampler.batch_state.slot_of_row(r) for r in range(2)]
    others = [s for s in range(config.num_slots) if s not in live]
    for key in changed:
        assert torch.equal(before[key][others], after[key][others]), key


def test_custom_processors_run_inside_the_sampler() -> None:
    from graphsafe_sampler.testing import GraphSafetyError

    config = SamplerConfig(
        max_num_reqs=3,
        vocab_size=V,
        logits_processors=["graphsafe_sampler.examples.target_token:TargetTokenLogitsProcessor"],
    )
    sampler = Sampler(config, "cpu")
    (proc,) = sampler.stages.custom
    assert isinstance(proc, TargetTokenLogitsProcessor) and proc.batch_state is sampler.batch_state
    assert sampler.graph_safe
    sampler.update_state(
        BatchUpdate(
            2,
            added=[
                (0, SP(seed=1, extra_args={"target_token": 42}), None, []),
                (1, SP(seed=2), None, []),
            ],
        )
    )
    for _ in range(3):
        tokens = sampler(torch.randn(3, V)).sampled_token_ids[:, 0]
        assert int(tokens[0]) == 42
    with pytest.raises(ValueError, match=r"target_token'\] = 111 is outside the vocabulary"):
        sampler.update_state(
            BatchUpdate(3, added=[(2, SP(extra_args={"target_token": V}), None, [])])
        )

    class Boost(gs.AdapterLogitsProcessor):
        def new_req_logits_processor(self, params: SP):  # type: ignore[no-untyped-def]
            return None

    eager_only = Sampler(SamplerConfig(max_num_reqs=3, vocab_size=V, logits_processors=[Boost]))
    assert not eager_only.graph_safe
    with pytest.raises(GraphSafetyError, match="declares graph_safe = False"):
        check_graph_safety(eager_only)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grammar_mask_follows_its_request(backend: str) -> None:
    from graphsafe_sampler.bitmask import pack_token_ids

    config = _config(backend, max_num_reqs=3, vocab_size=V)
    device = backend_device(backend)
    sampler = Sampler(config, device)
    logits = torch.zeros(3, V)
    logits[:, 9] = 50.0  # unconstrained rows take token 9
    logits = logits.to(device)
    sampler.update_state(
        BatchUpdate(2, added=[(r, SP(temperature=0.0), None, []) for r in range(2)])
    )
    sampler.stage_grammar_bitmask(np.stack([pack_token_ids([5], V)]), rows=[1])
    assert sampler(logits).sampled_token_ids[:2, 0].tolist() == [9, 5]
    # Row 0 leaves; the constrained request condenses from row 1 to row 0: its mask goes too.
    uni = MoveDirectionality.UNIDIRECTIONAL
    sampler.update_state(BatchUpdate(1, removed=[0], moved=[(1, 0, uni)]))
    assert sampler(logits).sampled_token_ids[0, 0].item() == 5
    # It finishes and a new request takes row 0 without a restage: no stale grammar.
    sampler.update_state(BatchUpdate(1, added=[(0, SP(temperature=0.0), None, [])]))
    assert sampler(logits).sampled_token_ids[0, 0].item() == 9


def test_rejected_update_leaves_the_whole_sampler_untouched() -> None:
    from graphsafe_sampler.testing import state_fingerprint

    class WrongArity(gs.AdapterLogitsProcessor):
        def new_req_logits_processor(self, params: SP):  # type: ignore[no-untyped-def]
            return (lambda row: row) if params.extra_args else None

    sampler = Sampler(SamplerConfig(max_num_reqs=4, vocab_size=V, logits_processors=[WrongArity]))
    sampler.update_state(BatchUpdate(1, added=[(0, SP(), None, [])]))  # unseeded: host RNG
    before = state_fingerprint([sampler])
    rng_before = sampler.stages.sampling.host_rng.getstate()
    bad = BatchUpdate(
        3,
        added=[(1, SP(), [1, 2], []), (2, SP(extra_args={"x": 1}), None, [])],
        moved=[(0, 1, MoveDirectionality.SWAP)],
    )
    with pytest.raises(TypeError, match=r"takes \(output_ids, logits_row\)"):
        sampler.update_state(bad)
    after = state_fingerprint([sampler])
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert sampler.stages.sampling.host_rng.getstate() == rng_before
    assert sampler.batch_state.num_requests == 1
    with pytest.raises(TypeError, match="params must be SamplingParams"):
        sampler.update_state(BatchUpdate(2, added=[(1, {"temperature": 1.0}, None, [])]))


def test_fewer_rows_than_the_batch_is_refused() -> None:
    sampler = Sampler(SamplerConfig(max_num_reqs=4, vocab_size=V), "cpu")
    sampler.update_state(BatchUpdate(3, added=[(r, SP(), None, []) for r in range(3)]))
    with pytest.raises(ValueError, match="logits have 2 rows but the batch holds 3"):
        sampler(torch.randn(2, V))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_row_has_minus_inf_logprobs_not_nan(backend: str) -> None:
    from graphsafe_sampler.bitmask import num_words

    config = _config(backend, max_num_reqs=2, vocab_size=V, max_num_logprobs=3,
                           logprobs_mode="processed_logprobs")  # fmt: skip
    device = backend_device(backend)
    sampler = Sampler(config, device)
    sampler.update_state(BatchUpdate(2, added=[(r, SP(seed=r), None, []) for r in range(2)]))
    sampler.stage_grammar_bitmask(np.zeros((1, num_words(V)), dtype=np.int32), rows=[0])
    lp = sampler(torch.randn(2, V).to(device)).logprobs_tensors
    assert lp is not None
    logprobs = lp.logprobs.cpu()
    assert not logprobs.isnan().any()
    assert torch.isneginf(logprobs[0]).all() and torch.isfinite(logprobs[1]).all()


def test_commit_mask_and_multi_token_commits_are_graph_safe() -> None:
    # The engine-facing commit paths inside one traced/compiled step: a chunked-prefill
    # mask and a speculative commit of a variable number of tokens per row, all on device.
    config = SamplerConfig(max_num_reqs=5, vocab_size=V, seed=3, max_bad_word_len=3,
                           max_logit_bias_tokens=4, max_stop_token_ids=2)  # fmt: skip
    sampler = Sampler(config, "cpu")

    def step(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keep = logits[:, 0] > 0  # data-dependent, but only as a tensor
        out = sampler(logits, commit_mask=keep)
        drafts = logits[:, :3].abs().mul(7).long() % V  # [rows, 3]
        num_tokens = (logits[:, 1] > 0).long() + (logits[:, 2] > 0).long()
        sampler.commit_tokens(drafts, num_tokens=num_tokens, commit_mask=keep)
        return out.sampled_token_ids, drafts

    report = check_graph_safety(sampler, fn=step, num_steps=30, seed=8, compile_backend="aot_eager")
    assert report.compile_frames == 1


# ----------------------------------------------------------------- both backends, step by step
# The Triton backend against the PyTorch one on the same inputs: tokens, logprobs and the
# whole device-side state after every commit. Both samplers live on `kernel_device`: the
# CPU, the kernels through the Triton interpreter, or CUDA, the kernels compiled. Small odd
# sizes.


def _rich_config(rows: int, vocab: int, backend: str, **overrides: object) -> SamplerConfig:
    """Every feature's capacity, small (the cross-backend tests)."""
    settings: dict[str, object] = dict(
        eos_token_id=3, max_num_logprobs=5, max_logit_bias_tokens=16, max_stop_token_ids=4,
        max_bad_word_len=4, max_bad_words_tokens=32, max_model_len=4096, seed=0,
    )  # fmt: skip
    settings.update(overrides)
    return SamplerConfig(rows, vocab, backend=backend, **settings)  # type: ignore[arg-type]


def _assert_near_ties(
    sampler: Sampler, logits: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor
) -> int:
    """Rows where the backends' tokens differ must be random rows whose two candidates tie
    in the race's perturbed score `processed logit + Gumbel noise` to within the kernel's
    Gumbel rounding (a few ulp: its noise is a few ulp from the PyTorch one). Anything else
    is a bug. Scores from `sampler`, the PyTorch one, before its commit. Returns how many."""
    differ = (ours != theirs).nonzero().flatten().tolist()
    if not differ:
        return 0
    num_rows = logits.shape[0]
    slots = sampler.batch_state.slots(num_rows)
    grammar = sampler.stages.grammar.bitmask_rows(num_rows)
    processed = sampler.pipeline.process(logits.to(torch.float32, copy=True), slots, grammar)
    x, is_greedy = processed.logits, processed.is_greedy
    noise = gumbel_noise(
        sampler.stages.sampling.seed.device[slots],
        sampler.batch_state.positions(slots),
        sampler.config.vocab_size,
        SALT_SAMPLE,
    )
    scores = (x + noise).double().cpu()
    for row in differ:
        assert not bool(is_greedy[row]), f"greedy row {row} differs: {ours[row]} vs {theirs[row]}"
        a, b = scores[row, int(ours[row])], scores[row, int(theirs[row])]
        assert torch.isfinite(b) and abs(a - b) <= 1e-5 * max(1.0, abs(float(a))), (
            f"row {row}: tokens {int(ours[row])} vs {int(theirs[row])} score {float(a)} vs "
            f"{float(b)}, not a near tie"
        )
    return len(differ)


@pytest.mark.parametrize(
    ("rows", "vocab", "mode", "candidates", "splits"),
    [
        pytest.param(3, 111, "raw_logprobs", None, None, id="R3-V111-raw_logprobs"),
        pytest.param(17, 1023, "processed_logits", None, None, id="R17-V1023-processed_logits"),
        pytest.param(5, 4099, "processed_logprobs", None, None, id="R5-V4099-processed_logprobs"),
        # the top-k/top-p kernel's candidate buffer (off by default under the interpreter),
        # small enough that some rows' top-k lie beyond it
        pytest.param(3, 111, "processed_logprobs", 16, None, id="R3-V111-candidates16"),
        # and with the cut (the mask unwritten): the rows it covers raced over its lists
        pytest.param(4, 111, "raw_logprobs", 16, None, id="R4-V111-candidates16-raced"),
        # every kernel's rows split over 3 programs, as on a GPU's small batch (off CUDA the
        # policies give 1): the sampling and logprobs rows merged by their last program,
        # through the pipeline's counters, step after step
        pytest.param(4, 2053, "raw_logprobs", None, 3, id="R4-V2053-raw_logprobs-split3"),
    ],
)
def test_backends_agree_step_by_step(
    rows: int,
    vocab: int,
    mode: str,
    candidates: int | None,
    splits: int | None,
    kernel_device: torch.device,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    covered: list[torch.Tensor] = []  # each step's rows raced over stage 1's lists
    if candidates is not None:
        from graphsafe_sampler.kernels import top_k_top_p
        from graphsafe_sampler.pipelines import triton_pipeline

        monkeypatch.setattr(top_k_top_p, "default_candidates", lambda: candidates)
        lists = triton_pipeline.candidate_lists

        def kept(*args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            made = lists(*args)
            covered.append(made[0])
            return made

        monkeypatch.setattr(triton_pipeline, "candidate_lists", kept)
    counted: list[str] = []
    if splits is not None:
        from graphsafe_sampler.kernels import library, logprobs, sampling
        from graphsafe_sampler.pipelines import triton_pipeline

        for policy in ("process_splits", "top_k_top_p_splits", "sample_splits",
                       "logprobs_splits"):  # fmt: skip
            monkeypatch.setattr(triton_pipeline, policy, lambda *_args: splits)

        def persistent(
            arrivals: torch.Tensor | None, num_rows: int, device: torch.device
        ) -> torch.Tensor:
            # the pipeline's own counters, never a buffer filled for the step
            assert arrivals is samplers["triton"].pipeline.arrivals  # type: ignore[attr-defined]
            counted.append("op")
            return library.arrival_counters(arrivals, num_rows, device)

        for module in (sampling, logprobs):
            monkeypatch.setattr(module, "arrival_counters", persistent)
    samplers = {
        b: Sampler(_rich_config(rows, vocab, b, logprobs_mode=mode), kernel_device)
        for b in ("torch", "triton")
    }
    assert samplers["triton"].backend == "triton"
    # fresh draws each run; shown on failure: rerun with them
    driver_seed, gen_seed = int(np.random.default_rng().integers(10**6)), torch.seed() % 2**31
    print(f"driver seed {driver_seed}, generator seed {gen_seed}")
    driver = BatchDriver(samplers["torch"].config, seed=driver_seed)
    gen = torch.Generator().manual_seed(gen_seed)
    words = (vocab + 31) // 32
    mismatches = 0
    eligible = 0  # rows the buffer can cover: top-k on and within it
    for _step in range(12):
        update = driver.next_update()
        grammar_rows = sorted(set(torch.randint(0, rows, (2,), generator=gen).tolist()))
        grammar = torch.randint(-(2**31), 2**31 - 1, (len(grammar_rows), words), generator=gen)
        logits = (torch.randn(rows, vocab, generator=gen) * 3).to(kernel_device)
        for sampler in samplers.values():
            sampler.update_state(update)
            sampler.stage_grammar_bitmask(grammar.to(torch.int32).numpy(), grammar_rows)
        # the Triton sampler commits through its kernel; the PyTorch one after the check
        triton_before = {k: t.clone() for k, t in samplers["triton"].state_tensors().items()}
        a = samplers["torch"](logits.clone(), commit=False)
        b = samplers["triton"](logits.clone())
        if candidates is not None:
            k = samplers["triton"].stages.top_k_top_p.top_k.device[
                samplers["triton"].batch_state.slots(rows)
            ]
            eligible += int(((k >= 1) & (k <= candidates)).sum())
        tokens = a.sampled_token_ids[:, 0]
        differ = _assert_near_ties(samplers["torch"], logits, tokens, b.sampled_token_ids[:, 0])
        samplers["torch"].commit_tokens(tokens)
        if differ:
            # a near tie: the Triton sampler takes the PyTorch tokens instead, so that the
            # histories stay equal and the comparison goes on
            for name, tensor in samplers["triton"].state_tensors().items():
                tensor.copy_(triton_before[name])
            samplers["triton"].commit_tokens(tokens)
        mismatches += differ
        assert a.logprobs_tensors is not None and b.logprobs_tensors is not None
        same = (a.sampled_token_ids == b.sampled_token_ids)[:, 0]
        torch.testing.assert_close(
            b.logprobs_tensors.logprobs[same], a.logprobs_tensors.logprobs[same],
            rtol=1e-5, atol=1e-5,
        )  # fmt: skip
        assert torch.equal(
            b.logprobs_tensors.selected_token_ranks[same],
            a.logprobs_tensors.selected_token_ranks[same],
        )
        want = samplers["torch"].state_tensors()
        for name, tensor in samplers["triton"].state_tensors().items():
            assert torch.equal(tensor, want[name]), name
        # the split rows' counters (sampling's and logprobs'), left at 0 for the next step
        assert not samplers["triton"].pipeline.arrivals.any()
        assert len(counted) == (2 if splits is not None else 0)
        counted.clear()
        driver.record_tokens(tokens.tolist())
    print(f"{mismatches} near-tie mismatches over 12 steps of {rows} rows")
    if candidates is not None and not mode.startswith("processed"):
        # the sampling kernel raced some rows over the lists alone, step after step, where
        # the draws gave any row a top-k the buffer holds (the driver's k is 0, 1, 2, 5 or
        # 50: about 1 run in 20 draws none of 1, 2 and 5 in 12 steps of 4 rows)
        print(f"{eligible} rows with 1 <= k <= {candidates}")
        assert len(covered) == 12
        assert sum(int(c.sum()) for c in covered) > 0 or not eligible, covered


@pytest.mark.parametrize("max_num_logprobs", [5, 0])
def test_rows_no_step_changes_are_read_from_the_logits(
    max_num_logprobs: int, kernel_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Triton backend leaves the rows no step but their temperature changes unwritten
    in its buffer (top-k, top-p, min_p, any temperature, and nothing else), and the kernels
    after processing read them from the logits, divided; the rows it writes (rows 6 and
    7), it writes without their temperature, which those kernels apply. Every float32
    `torch.empty` is NaN here (an unwritten row read returns NaN), and the tokens,
    logprobs and histories still equal the PyTorch backend's, step after step; the flags
    show which rows were left. Without logprobs (no raw tiles), processing does not even
    read the random rows no filter cuts (rows 3 and 5): sampling's walk reduces their
    tiles itself."""
    real_empty = torch.empty

    def poisoned(*size: Any, **kwargs: Any) -> torch.Tensor:
        made = real_empty(*size, **kwargs)
        return made.fill_(float("nan")) if made.dtype == torch.float32 else made

    monkeypatch.setattr(torch, "empty", poisoned)
    rows, vocab = 8, 2053
    samplers = {
        b: Sampler(
            _rich_config(
                rows, vocab, b, logprobs_mode="raw_logprobs", max_num_logprobs=max_num_logprobs
            ),
            kernel_device,
        )
        for b in ("torch", "triton")
    }
    params = [
        SP(seed=1, top_k=20), SP(seed=2, top_p=0.8), SP(temperature=0.0), SP(seed=4),
        SP(seed=5, top_k=5, top_p=0.9, min_p=0.05), SP(seed=6, temperature=0.7),
        SP(seed=7, frequency_penalty=0.5, temperature=0.8),
        SP(seed=8, logit_bias={3: 2.0}, temperature=1.3),
    ]  # fmt: skip
    update = BatchUpdate(rows, added=[(r, p, list(range(r + 1)), []) for r, p in enumerate(params)])
    gen = torch.Generator().manual_seed(int(torch.seed() % 2**31))
    print(f"generator seed {gen.initial_seed()}")
    for sampler in samplers.values():
        sampler.update_state(update)
    for _step in range(4):
        logits = (torch.randn(rows, vocab, generator=gen) * 3).to(kernel_device)
        a = samplers["torch"](logits.clone(), commit=False)
        b = samplers["triton"](logits.clone())
        tokens = a.sampled_token_ids[:, 0]
        assert _assert_near_ties(samplers["torch"], logits, tokens, b.sampled_token_ids[:, 0]) == 0
        samplers["torch"].commit_tokens(tokens)
        deferred = samplers["triton"].pipeline.deferred  # type: ignore[attr-defined]
        # the written rows (6, 7: a penalty, a bias) at their temperature negated: their
        # readers divide them too
        want = torch.tensor([1, 1, 1, 1, 1, 0.7, -0.8, -1.3], device=deferred.device)
        assert torch.equal(deferred[:rows], want)
        if max_num_logprobs:
            assert a.logprobs_tensors is not None and b.logprobs_tensors is not None
            torch.testing.assert_close(
                b.logprobs_tensors.logprobs, a.logprobs_tensors.logprobs, rtol=1e-5, atol=1e-5
            )
        want = samplers["torch"].state_tensors()
        for name, tensor in samplers["triton"].state_tensors().items():
            assert torch.equal(tensor, want[name]), name


def test_the_near_tie_check_refuses_other_mismatches() -> None:
    sampler = Sampler(_rich_config(3, 111, "torch"), "cpu")
    params = [SP(seed=1), SP(temperature=0.0), SP(seed=3, top_k=3)]
    sampler.update_state(BatchUpdate(3, added=[(r, p, None, []) for r, p in enumerate(params)]))
    logits = torch.randn(3, 111) * 3
    tokens = sampler(logits.clone(), commit=False).sampled_token_ids[:, 0]
    assert _assert_near_ties(sampler, logits, tokens, tokens.clone()) == 0
    for row, match in ((0, "not a near tie"), (1, "greedy row 1 differs"), (2, "not a near tie")):
        theirs = tokens.clone()
        theirs[row] = (tokens[row] + 1) % 111
        with pytest.raises(AssertionError, match=match):
            _assert_near_ties(sampler, logits, tokens, theirs)


# ----------------------------------------------------------------- custom processors, both backends
# A custom processor changes the Triton backend's path: one that is not argmax-invariant runs
# inside the fused kernel's span (the unfused path); an argmax-invariant one must see
# min_p's mask written before it.


def test_custom_processor_before_penalties_takes_the_unfused_path(
    kernel_device: torch.device,
) -> None:
    """A custom non-argmax-invariant processor runs between logit bias and penalties, inside
    the fused kernel's span: the Triton backend then processes with the PyTorch stages and
    samples, takes logprobs and commits with kernels. Tokens still agree."""
    vocab, rows = 111, 4
    out = {}
    for backend in ("torch", "triton"):
        config = _rich_config(rows, vocab, backend, logits_processors=[TargetTokenLogitsProcessor])
        sampler = Sampler(config, kernel_device)
        assert not getattr(sampler.pipeline, "fused", False)
        params = [
            SP(seed=1, extra_args={"target_token": 17}),
            SP(seed=2, top_k=5, frequency_penalty=0.5),
            SP(temperature=0.0),
            SP(seed=4, top_p=0.8, extra_args={"target_token": 40}),
        ]
        sampler.update_state(
            BatchUpdate(rows, added=[(r, p, [1, 2], []) for r, p in enumerate(params)])
        )
        gen = torch.Generator().manual_seed(9)
        steps = [
            sampler((torch.randn(rows, vocab, generator=gen) * 2).to(kernel_device))
            for _ in range(4)
        ]
        out[backend] = torch.cat([s.sampled_token_ids for s in steps], dim=1)
    assert torch.equal(out["torch"], out["triton"])
    assert (out["triton"][0] == 17).all() and (out["triton"][3] == 40).all()


class ShiftByLogsumexp(SlotLogitsProcessor):
    """Argmax-invariant but value-changing: subtracts each row's logsumexp over the tokens
    still finite, so what it returns depends on min_p's mask being applied before it."""

    def is_argmax_invariant(self) -> bool:
        return True

    def add_request(self, slot: int, params: SP, prompt: object, output: object) -> None:
        return None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        lse = logits.logsumexp(dim=-1, keepdim=True)
        return logits - torch.where(lse.isfinite(), lse, 0.0)


def test_argmax_invariant_custom_processor_sees_min_p_applied(
    kernel_device: torch.device,
) -> None:
    """With a custom argmax-invariant processor the Triton backend keeps the fused kernels
    but writes min_p's mask before the processor (it cannot fold min_p into the cut): the
    processed logits, which the processor shifted by a logsumexp over min_p's survivors,
    equal the PyTorch backend's."""
    vocab, rows = 111, 3
    params = [
        SP(seed=1, min_p=0.1),
        SP(seed=2, min_p=0.3, top_k=20),
        SP(temperature=0.0, min_p=0.5),
    ]
    out = {}
    for backend in ("torch", "triton"):
        config = _rich_config(
            rows, vocab, backend, logits_processors=[ShiftByLogsumexp],
            max_num_logprobs=vocab, logprobs_mode="processed_logits",
        )  # fmt: skip
        sampler = Sampler(config, kernel_device)
        if backend == "triton":
            from graphsafe_sampler.pipelines.triton_pipeline import TritonPipeline

            assert isinstance(sampler.pipeline, TritonPipeline)
            assert sampler.pipeline.fused and not sampler.pipeline.fold_min_p
        sampler.update_state(
            BatchUpdate(rows, added=[(r, p, [1, 2], []) for r, p in enumerate(params)])
        )
        gen = torch.Generator().manual_seed(4)
        out[backend] = sampler((torch.randn(rows, vocab, generator=gen) * 3).to(kernel_device))
    lp = {b: o.logprobs_tensors for b, o in out.items()}
    assert lp["torch"] is not None and lp["triton"] is not None
    torch.testing.assert_close(lp["triton"].logprobs, lp["torch"].logprobs, rtol=1e-6, atol=1e-6)
    finite = lp["torch"].logprobs.isfinite()  # ties at -inf come in any order
    assert torch.equal(
        lp["triton"].logprob_token_ids[finite], lp["torch"].logprob_token_ids[finite]
    )
    assert torch.equal(out["triton"].sampled_token_ids, out["torch"].sampled_token_ids)
    # min_p masked some tokens in every row, so the shift really saw its mask
    assert bool(lp["torch"].logprobs[:, 1:].isneginf().any(-1).all())


# ----------------------------------------------------------------- backend resolution


def test_backend_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Sampler(SamplerConfig(2, 50, backend="auto"), "cpu").backend == "torch"
    assert Sampler(SamplerConfig(2, 50, backend="torch"), "cpu").backend == "torch"
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="backend='triton' needs a CUDA device"):
        Sampler(SamplerConfig(2, 50, backend="triton"), "cpu")
