"""The PyTorch pipeline's masks and penalties (`torch_pipeline.mask_and_penalize`): the dense
stages first, then the logit bias's tokens made again from their raw logits, give exactly
what the stages applied in the order of docs/design.md give, eagerly and compiled."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from graphsafe_sampler import BatchUpdate, Sampler, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.pipelines.torch_pipeline import mask_and_penalize

VOCAB, ROWS = 300, 6


@pytest.fixture
def seed() -> int:
    seed = random.randrange(2**31)
    print(f"seed={seed}")  # shown by pytest when the test fails
    return seed


def _sampler(seed: int) -> tuple[Sampler, torch.Tensor]:
    """A batch where the bias meets every other stage: its ids masked by allowed ids, the
    grammar, bad words and min_tokens, in the prompt, output 300 times (a saturated count
    with its overflow entry), with penalties of both signs; and logits [ROWS, V] with NaN,
    +-inf, -0.0 and values whose penalty overflows float32 unless the bias pulls them in."""
    rng = np.random.default_rng(seed)
    config = SamplerConfig(
        max_num_reqs=ROWS,
        vocab_size=VOCAB,
        eos_token_id=2,
        max_model_len=2048,
        seed=seed,
        backend="torch",
    )
    sampler = Sampler(config, "cpu")
    hot = [int(t) for t in rng.choice(np.arange(10, VOCAB), size=12, replace=False)]
    a, b, c, d, e, f, g, h, i, j, k, m = hot
    # biases up to +-3e38: -3e38 * 1.2 overflows to -inf, -3e38 + 3e38 is 0
    bias = {a: 3e38, b: -5.0, c: 2.5, d: 1e-3, e: -3e38, f: 7.0, g: 0.5, h: -1.0, i: 4.0}
    params = [
        SP(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3, logit_bias=bias),
        SP(repetition_penalty=0.7, frequency_penalty=-0.4, logit_bias=bias, min_tokens=5,
           stop_token_ids=[c, d]),
        SP(logit_bias=bias, allowed_token_ids=[a, b, c, j, k, m, *range(20, 120)]),
        SP(repetition_penalty=1.5, logit_bias=bias, bad_words_token_ids=[[f], [m, g]]),
        SP(frequency_penalty=1.0, logit_bias={j: 2.0}),
        SP(),
    ]  # fmt: skip
    prompt = [a, c, h, *rng.integers(0, VOCAB, size=20).tolist()]
    output = [b] * 300 + [c] * 260 + [i, m, m, 1]  # b and c saturate: overflow entries
    sampler.update_state(
        BatchUpdate(ROWS, added=[(r, p, prompt, list(output)) for r, p in enumerate(params)])
    )
    grammar = rng.integers(-(2**31), 2**31, size=(2, (VOCAB + 31) // 32), dtype=np.int64)
    sampler.stage_grammar_bitmask(grammar.astype(np.int32), rows=[1, 3])
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, VOCAB, generator=gen) * 4
    logits[:, a] = -3e38
    logits[:, e] = 3e38
    logits[:, g] = float("nan")
    logits[:, h] = -0.0
    logits[:, i] = float("-inf")
    logits[:, k] = float("inf")
    logits[0, 5] = float("nan")
    return sampler, logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dense_first_equals_the_stages_in_order(seed: int, dtype: torch.dtype) -> None:
    sampler, logits = _sampler(seed)
    logits = logits.to(dtype)
    stages, slots = sampler.stages, sampler.batch_state.slots(ROWS)
    grammar = stages.grammar.bitmask_rows(ROWS)
    raw = logits.clone()
    fused = mask_and_penalize(stages, logits, slots, grammar)
    in_order = mask_and_penalize(stages, logits, slots, grammar, in_order=True)
    torch.testing.assert_close(logits, raw, rtol=0, atol=0, equal_nan=True)  # read only
    torch.testing.assert_close(fused, in_order, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(fused.isinf() & (fused < 0), in_order.isinf() & (in_order < 0))


def test_compiled_dense_first_equals_eager(seed: int) -> None:
    sampler, logits = _sampler(seed)
    stages, slots = sampler.stages, sampler.batch_state.slots(ROWS)
    grammar = stages.grammar.bitmask_rows(ROWS)

    def fused(logits: torch.Tensor) -> torch.Tensor:
        return mask_and_penalize(stages, logits, slots, grammar)

    compiled = torch.compile(fused, fullgraph=True, dynamic=False)
    in_order = mask_and_penalize(stages, logits, slots, grammar, in_order=True)
    torch.testing.assert_close(compiled(logits), in_order, rtol=0, atol=0, equal_nan=True)
