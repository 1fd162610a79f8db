"""Sampler(backend="triton") against the PyTorch backend, step by step on the same inputs:
tokens, logprobs and the whole device-side state after every commit. Both samplers live on
`kernel_device`: the CPU, the kernels through the Triton interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), or CUDA, the kernels compiled, with TRITON_INTERPRET=0. Small odd
sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphsafe_sampler import BatchUpdate, Sampler, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.examples.target_token import TargetTokenLogitsProcessor
from graphsafe_sampler.kernels.constants import SALT_SAMPLE
from graphsafe_sampler.pipelines.triton_pipeline import TritonPipeline
from graphsafe_sampler.processors.base import SlotLogitsProcessor
from graphsafe_sampler.rng import gumbel_noise
from graphsafe_sampler.testing import BatchDriver, check_graph_safety


def _config(rows: int, vocab: int, backend: str, **overrides: object) -> SamplerConfig:
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
        sampler.stages.sampling.positions(slots),
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
    ("rows", "vocab", "mode", "candidates"),
    [
        pytest.param(3, 111, "raw_logprobs", None, id="R3-V111-raw_logprobs"),
        pytest.param(17, 1023, "processed_logits", None, id="R17-V1023-processed_logits"),
        pytest.param(5, 4099, "processed_logprobs", None, id="R5-V4099-processed_logprobs"),
        # the top-k/top-p kernel's candidate buffer (off by default under the interpreter),
        # small enough that some rows' top-k lie beyond it
        pytest.param(3, 111, "processed_logprobs", 16, id="R3-V111-candidates16"),
    ],
)
def test_backends_agree_step_by_step(
    rows: int,
    vocab: int,
    mode: str,
    candidates: int | None,
    kernel_device: torch.device,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if candidates is not None:
        from graphsafe_sampler.kernels import top_k_top_p

        monkeypatch.setattr(top_k_top_p, "default_candidates", lambda: candidates)
    samplers = {
        b: Sampler(_config(rows, vocab, b, logprobs_mode=mode), kernel_device)
        for b in ("torch", "triton")
    }
    assert samplers["triton"].backend == "triton"
    # fresh draws each run; shown on failure: rerun with them
    driver_seed, gen_seed = int(np.random.default_rng().integers(1e6)), torch.seed() % 2**31
    print(f"driver seed {driver_seed}, generator seed {gen_seed}")
    driver = BatchDriver(samplers["torch"].config, seed=driver_seed)
    gen = torch.Generator().manual_seed(gen_seed)
    words = (vocab + 31) // 32
    mismatches = 0
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
        driver.record_tokens(tokens.tolist())
    print(f"{mismatches} near-tie mismatches over 12 steps of {rows} rows")


def test_the_near_tie_check_refuses_other_mismatches() -> None:
    sampler = Sampler(_config(3, 111, "torch"), "cpu")
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


def test_custom_processor_before_penalties_takes_the_unfused_path(
    kernel_device: torch.device,
) -> None:
    """A custom non-argmax-invariant processor runs between logit bias and penalties, inside
    the fused kernel's span: the Triton backend then processes with the PyTorch stages and
    samples, takes logprobs and commits with kernels. Tokens still agree."""
    vocab, rows = 111, 4
    out = {}
    for backend in ("torch", "triton"):
        config = _config(rows, vocab, backend, logits_processors=[TargetTokenLogitsProcessor])
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


# The interpreter's numpy log of an all-masked row's zero mass (the lse becomes -inf, then 0).
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
def test_nan_masked_and_padded_rows_give_valid_ids(kernel_device: torch.device) -> None:
    vocab = 111
    sampler = Sampler(_config(5, vocab, "triton"), kernel_device)
    sampler.update_state(
        BatchUpdate(3, added=[(r, SP(seed=r, top_p=0.5), None, []) for r in range(3)])
    )
    logits = torch.randn(5, vocab)
    logits[0, 7] = float("nan")
    logits[1] = float("-inf")
    logits[2, 40:] = float("nan")
    logits = logits.to(kernel_device)
    before = sampler.batch_state.num_generated.device.clone()
    toks = sampler(logits).sampled_token_ids[:, 0]
    assert ((toks >= 0) & (toks < vocab)).all()
    assert toks[0] == 7 and toks[1] == 0 and toks[2] == 40  # as documented for the torch backend
    # Rows 3-4 are padding: they commit nothing.
    grew = sampler.batch_state.num_generated.device - before
    assert grew.sum() == 3


def test_graph_safety_of_the_triton_sampler(kernel_device: torch.device) -> None:
    """On CUDA, check_graph_safety also captures and replays a real CUDA graph."""
    config = _config(4, 111, "triton", max_num_logprobs=3)
    sampler = Sampler(config, kernel_device)
    report = check_graph_safety(sampler, num_steps=20, seed=3, fn=lambda x: sampler(x))
    assert report.compile_frames == 1


def test_backend_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Sampler(SamplerConfig(2, 50, backend="auto"), "cpu").backend == "torch"
    assert Sampler(SamplerConfig(2, 50, backend="torch"), "cpu").backend == "torch"
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="backend='triton' needs a CUDA device"):
        Sampler(SamplerConfig(2, 50, backend="triton"), "cpu")


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
        config = _config(
            rows, vocab, backend, logits_processors=[ShiftByLogsumexp],
            max_num_logprobs=vocab, logprobs_mode="processed_logits",
        )  # fmt: skip
        sampler = Sampler(config, kernel_device)
        if backend == "triton":
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
