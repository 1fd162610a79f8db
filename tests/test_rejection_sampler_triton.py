"""RejectionSampler on the Triton backend against the PyTorch backend, both on
`kernel_device` (the CPU through the Triton interpreter, or CUDA with the kernels compiled):
the processed logits of every speculative position, and the tokens emitted under churn with
every feature in some rows, for the same seeds."""

from __future__ import annotations

import numpy as np
import torch

import graphsafe_sampler as gs
from graphsafe_sampler import BatchUpdate, RejectionSampler, Sampler
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.bitmask import num_words, pack_token_ids
from graphsafe_sampler.pipelines import TorchPipeline
from graphsafe_sampler.pipelines.triton_pipeline import TritonPipeline
from graphsafe_sampler.testing import BatchDriver

V, S = 111, 3
CONFIG = gs.SamplerConfig(
    max_num_reqs=7, vocab_size=V, eos_token_id=3, seed=0, max_logit_bias_tokens=16,
    max_stop_token_ids=4, max_bad_word_len=4,
)  # fmt: skip


def _pair(backend: str, device: torch.device | str = "cpu") -> tuple[Sampler, RejectionSampler]:
    sampler = Sampler(gs.SamplerConfig(**{**CONFIG.__dict__, "backend": backend}), device)
    return sampler, RejectionSampler(sampler, S)


def _stage_grammar(
    rejections: list[RejectionSampler], np_rng: np.random.Generator, rows: list[int] | None = None
) -> None:
    """A random mask per position on `rows` (default: 2 random rows)."""
    if rows is None:
        rows = sorted(np_rng.choice(CONFIG.max_num_reqs, size=2, replace=False).tolist())
    masks = np.stack(
        [[pack_token_ids(np.flatnonzero(np_rng.random(V) < 0.6).tolist(), V)
          for _ in range(S + 1)] for _ in rows]
    )  # fmt: skip
    for rejection in rejections:
        rejection.stage_grammar_bitmask(masks.reshape(len(rows), S + 1, num_words(V)), rows)


def test_process_logits_of_speculative_positions_match_torch_stages(
    kernel_device: torch.device,
) -> None:
    """`Sampler.process_logits` on the Triton backend (the kernels) against the PyTorch
    stages of the same sampler, on the flattened positions a speculative step passes:
    penalties, min_tokens and bad words see the drafts before each position."""
    sampler, rejection = _pair("triton", kernel_device)
    rows = [
        SP(temperature=0.8, min_tokens=2, stop_token_ids=[7], repetition_penalty=1.3,
           frequency_penalty=0.4, presence_penalty=0.6, top_k=30, top_p=0.9, seed=1),
        SP(temperature=0.0, bad_words_token_ids=[[5, 8], [11]], logit_bias={5: 2.0, 9: -1.0}),
        SP(temperature=1.2, min_p=0.05, allowed_token_ids=list(range(0, V, 2)),
           frequency_penalty=-0.5),
    ]  # fmt: skip
    outputs = [[5, 5, 6, 40], [5], [8, 8, 8]]
    added = [(r, p, [1, 2, 40], outputs[r]) for r, p in enumerate(rows)]
    sampler.update_state(BatchUpdate(3, added=added))
    _stage_grammar([rejection], np.random.default_rng(3), rows=[1, 2])
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3 * (S + 1), V, generator=gen) * 3
    logits[: S + 1, [5, 40]] += 6.0  # request 0's penalised drafts survive its top-k/top-p
    logits = logits.to(kernel_device)
    drafts = torch.tensor([[5, 40, 7], [5, 8, 5], [8, 6, 8]], device=kernel_device)
    slots = sampler.batch_state.slots(3).repeat_interleave(S + 1)
    flat_drafts = drafts.repeat_interleave(S + 1, dim=0)
    preceding = torch.arange(S + 1, device=kernel_device).repeat(3)
    grammar = rejection.grammar.bitmask_rows(3 * (S + 1))
    assert isinstance(sampler.pipeline, TritonPipeline)
    pipelines = {"triton": sampler.pipeline, "torch": TorchPipeline(sampler.stages)}
    done = {
        name: pipeline.process(logits.clone(), slots, grammar, flat_drafts, preceding)
        for name, pipeline in pipelines.items()
    }
    got, greedy, is_greedy = (
        done["triton"].logits,
        done["triton"].greedy_tokens(),
        done["triton"].is_greedy,
    )
    want, want_greedy, want_is_greedy = (
        done["torch"].logits,
        done["torch"].greedy_tokens(),
        done["torch"].is_greedy,
    )
    assert torch.equal(is_greedy, want_is_greedy)
    both = got.isfinite() & want.isfinite()
    assert torch.equal(got[both], want[both])
    # Only request 0 (top_p 0.9) may keep a different set, and only at its top-p boundary
    # (float32 sums in another order: kernels/top_k_top_p.py); the sets are then nested.
    differ = got.isfinite() != want.isfinite()
    assert not bool(differ[S + 1 :].any())
    for row in range(S + 1):
        kept, want_kept = got[row].isfinite(), want[row].isfinite()
        assert bool((kept <= want_kept).all() or (want_kept <= kept).all())
    assert torch.equal(greedy[is_greedy], want_greedy[is_greedy])
    # The drafts changed what later positions see (not only position 0's view).
    without = sampler.pipeline.process(logits.clone(), slots, grammar).logits
    moved = (without != got).any(-1).view(3, S + 1)
    assert not bool(moved[:, 0].any()) and bool(moved[:, 1:].any(-1).all())


def test_backends_emit_the_same_tokens_under_churn(kernel_device: torch.device) -> None:
    """Both backends, fed the same updates and inputs, emit the same tokens and accept the
    same drafts: processed logits equal and uniforms bit-identical, so they can differ only
    where two candidates' perturbed scores tie to the last bit (never in these steps)."""
    pairs = {backend: _pair(backend, kernel_device) for backend in ("torch", "triton")}
    drivers = {backend: BatchDriver(CONFIG, seed=21, churn=0.15) for backend in pairs}
    np_rng = np.random.default_rng(21)
    gen = torch.Generator().manual_seed(21)
    rows = CONFIG.max_num_reqs
    accepted = emitted_random = 0
    for step in range(12):
        for backend, (sampler, _) in pairs.items():
            sampler.update_state(drivers[backend].next_update())
        _stage_grammar([rejection for _, rejection in pairs.values()], np_rng)
        logits = torch.randn(rows, S + 1, V, generator=gen) * 3
        # Drafts: the target argmax (often accepted) on some rows, random ids on others.
        drafts = torch.where(
            torch.rand(rows, S, generator=gen) < 0.5,
            logits[:, :S].argmax(-1),
            torch.randint(0, V, (rows, S), generator=gen),
        )
        num = torch.randint(0, S + 1, (rows,), generator=gen)
        probs = None
        if step % 2:
            probs = torch.softmax(torch.randn(rows, S, V, generator=gen), dim=-1)
            probs = probs.to(kernel_device)
        # drawn on the host (the generator's device), then moved to the samplers'
        logits, drafts, num = (t.to(kernel_device) for t in (logits, drafts, num))
        out = {
            backend: rejection(logits, drafts, num, probs)
            for backend, (_, rejection) in pairs.items()
        }
        assert torch.equal(out["torch"].num_accepted, out["triton"].num_accepted), step
        assert torch.equal(out["torch"].output_token_ids, out["triton"].output_token_ids), step
        for backend, driver in drivers.items():
            tokens = out[backend].output_token_ids.tolist()
            for row, req in enumerate(driver.rows):
                if req is not None:
                    req.output_tok_ids.extend(t for t in tokens[row] if t >= 0)
        accepted += int(out["torch"].num_accepted.sum())
        torch_sampler = pairs["torch"][0]
        is_greedy = torch_sampler.stages.temperature.is_greedy(
            torch_sampler.batch_state.slots(rows)
        )
        emitted_random += int((~is_greedy).sum())
    # The steps exercised acceptance and random emission, not only greedy rows.
    assert accepted > 20 and emitted_random > 20
    # Both backends advanced the same device-side history.
    states = [pairs[b][0].state_tensors() for b in ("torch", "triton")]
    for name, tensor in states[0].items():
        assert torch.equal(tensor, states[1][name]), name


def test_one_row_batch(kernel_device: torch.device) -> None:
    """A batch of one request (its slot repeated over S + 1 positions must reach the
    kernels as a contiguous tensor) emits what the PyTorch backend emits."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(1, S + 1, V, generator=gen) * 2
    drafts = torch.randint(0, V, (1, S), generator=gen)
    probs = torch.softmax(torch.randn(1, S, V, generator=gen), dim=-1)
    logits, drafts, probs = (t.to(kernel_device) for t in (logits, drafts, probs))
    num = torch.full((1,), S, device=kernel_device)
    outputs = []
    for backend in ("torch", "triton"):
        sampler, rejection = _pair(backend, kernel_device)
        params = SP(temperature=0.8, top_k=20, presence_penalty=0.5, seed=9)
        sampler.update_state(BatchUpdate(1, added=[(0, params, [1, 2], [])]))
        outputs.append(rejection(logits, drafts, num, probs).output_token_ids)
    assert torch.equal(outputs[0], outputs[1])
