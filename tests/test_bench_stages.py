"""The benchmark cases compare the same work: ours and the vLLM-style peer agree per stage,
and the churning decode workload replays identically for every provider."""

from __future__ import annotations

import pytest
import torch

from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.bench.providers import CaseSpec, ProviderUnavailable, build_bench
from graphsafe_sampler.bench.stages import MAX_NUM_LOGPROBS, STAGES, StageCase
from graphsafe_sampler.bench.workload import decode_driver
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.output import LogprobsTensors

ROWS, VOCAB = 5, 1023


@pytest.fixture(params=STAGES)
def stage_case(request: pytest.FixtureRequest) -> StageCase:
    return StageCase.build(request.param, ROWS, VOCAB, "cpu", seed=1)


def test_stage_matches_vllm_style(stage_case: StageCase) -> None:
    logits = llm_like_logits(ROWS, VOCAB, seed=2)
    ours = stage_case.ours()(logits.clone())
    theirs = stage_case.vllm_style()(logits.clone())
    stage = stage_case.stage
    if stage in ("penalties", "bias"):
        assert isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor)
        assert not torch.equal(ours, logits), "the stage changed nothing"
        torch.testing.assert_close(ours, theirs)
    elif stage in ("min_p", "top_k", "top_p", "top_k_top_p"):
        assert isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor)
        kept = ours > float("-inf")
        assert torch.equal(kept, theirs > float("-inf"))
        assert 0 < int(kept.sum()) < ROWS * VOCAB, "the filter kept all or nothing"
    elif stage == "greedy":
        assert isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor)
        assert torch.equal(ours, theirs)
    elif stage == "sampling":
        # Different random numbers, same distribution: both draw valid, likely tokens.
        for tokens in (ours, theirs):
            assert isinstance(tokens, torch.Tensor) and tokens.shape == (ROWS,)
            assert bool(((tokens >= 0) & (tokens < VOCAB)).all())
    elif stage == "watermark":
        # ours keyed by the watermark, theirs the peer's plain sampling: both valid tokens
        for tokens in (ours, theirs):
            assert isinstance(tokens, torch.Tensor) and tokens.shape == (ROWS,)
            assert bool(((tokens >= 0) & (tokens < VOCAB)).all())
    elif stage == "thinking_budget":
        assert isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor)
        # every row's section is past its budget: one token kept a row, the same on both
        assert torch.equal((ours > float("-inf")).sum(-1), torch.ones(ROWS, dtype=torch.long))
        torch.testing.assert_close(ours, theirs)
    elif stage == "logprob_token_ids":
        assert isinstance(ours, tuple) and isinstance(theirs, tuple)
        torch.testing.assert_close(ours[0], theirs[0], rtol=1e-4, atol=1e-4)
        assert torch.equal(ours[1], theirs[1])
    else:
        assert stage in ("logprobs", "prompt_logprobs")
        assert isinstance(ours, LogprobsTensors) and isinstance(theirs, LogprobsTensors)
        assert ours.logprobs.shape == (ROWS, MAX_NUM_LOGPROBS + 1)
        torch.testing.assert_close(ours.logprob_token_ids, theirs.logprob_token_ids)
        torch.testing.assert_close(ours.logprobs, theirs.logprobs, rtol=1e-4, atol=1e-4)


def test_decode_driver_keeps_the_batch_full_and_replays_identically() -> None:
    config = SamplerConfig(16, VOCAB, max_num_logprobs=5)
    a = decode_driver(12, config, seed=3, churn=0.3)
    b = decode_driver(12, config, seed=3, churn=0.3)
    for step in range(6):
        ua, ub = a.next_update(), b.next_update()
        assert ua.batch_size == ub.batch_size == 12
        assert ua.removed == ub.removed and ua.moved == ub.moved
        assert [(r, p) for r, p, *_ in ua.added] == [(r, p) for r, p, *_ in ub.added]
        if step:
            assert len(ua.added) == len(ua.removed)
        # Different tokens on each side: the churn must not depend on them.
        a.record_tokens([1] * 12)
        b.record_tokens([2] * 12)
    params = [r.params for r in a.rows if r is not None]
    assert any(p.is_greedy for p in params) and not all(p.is_greedy for p in params)


def test_decode_driver_rejects_bad_input() -> None:
    config = SamplerConfig(4, VOCAB)
    with pytest.raises(ValueError, match="churn"):
        decode_driver(4, config, churn=1.5)
    with pytest.raises(ValueError, match="target"):
        decode_driver(5, config)


def test_step_bench_runs_decode_steps() -> None:
    # Both providers serve the same churning workload; each step's tokens reach the
    # requests' output lists, and greedy requests produce the same tokens on both.
    spec = CaseSpec("step", 6, VOCAB, torch.float32, torch.device("cpu"), churn=0.5)
    served = {}
    for provider in ("sampler-eager", "vllm-style"):
        bench = build_bench(spec, provider)
        driver = bench.workload
        for _ in range(4):
            tokens = bench.run(*bench.setup())
            assert isinstance(tokens, torch.Tensor) and tokens.shape == (6,)
            assert bool(((tokens >= 0) & (tokens < VOCAB)).all())
            assert [req.output_tok_ids[-1] for req in driver.rows] == tokens.tolist()
        served[provider] = [(req.params, list(req.output_tok_ids)) for req in driver.rows]
    greedy = 0
    for (params, ours), (their_params, theirs) in zip(*served.values(), strict=True):
        assert params == their_params
        if params.is_greedy:
            greedy += 1
            assert ours == theirs
    assert greedy > 0


def test_clone_bench_copies_the_logits() -> None:
    spec = CaseSpec("step", 3, VOCAB, torch.float32, torch.device("cpu"))
    bench = build_bench(spec, "clone")
    (logits,) = bench.setup()
    out = bench.run(logits)
    assert isinstance(out, torch.Tensor) and torch.equal(out, logits)
    assert out.data_ptr() != logits.data_ptr()


def test_flashinfer_is_unavailable_on_cpu() -> None:
    spec = CaseSpec("top_k", 2, VOCAB, torch.float32, torch.device("cpu"))
    with pytest.raises(ProviderUnavailable, match="CUDA only"):
        build_bench(spec, "flashinfer")


def test_compiled_stage_matches_eager() -> None:
    # One compile (argmax: the cheapest stage) covers the compiled provider's path.
    spec = CaseSpec("greedy", 4, VOCAB, torch.float32, torch.device("cpu"))
    bench = build_bench(spec, "sampler-compiled")
    assert bench.info["compile_s"] >= 0
    (logits,) = bench.setup()
    tokens = bench.run(logits)
    assert isinstance(tokens, torch.Tensor) and torch.equal(tokens, logits.argmax(dim=-1))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param({"stage": "sort"}, ValueError, "stage must be one of", id="stage"),
        pytest.param({"rows": 0}, ValueError, "rows >= 1", id="rows"),
    ],
)
def test_case_spec_rejects_bad_input(kwargs: dict, error: type, match: str) -> None:
    args = {"stage": "step", "rows": 2, "vocab": VOCAB, "dtype": torch.float32}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        CaseSpec(device=torch.device("cpu"), **args)


def test_the_compiled_provider_compiles_with_the_recommended_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from graphsafe_sampler import compile_options
    from graphsafe_sampler.bench import providers

    seen: list[dict[str, object]] = []

    def fake_compile(fn, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs)
        return fn

    monkeypatch.setattr(providers.torch, "compile", fake_compile)
    providers._compile(lambda x: x + 1, (torch.ones(2),), torch.device("cpu"))
    assert seen == [{"fullgraph": True, "options": compile_options("cpu")}]
