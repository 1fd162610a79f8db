"""The kernels chained as the Triton backend will chain them, eager and under
`torch.compile(fullgraph=True)` (one compile for all ops), against the PyTorch backend, on
`kernel_device` (interpreted on CPU, compiled on CUDA)."""

from __future__ import annotations

import torch
from test_kernel_logits_processing import _random_state, _torch_backend
from test_kernel_sampling import _assert_same_tokens

from graphsafe_sampler import rng
from graphsafe_sampler.kernels.logits_processing import process_logits
from graphsafe_sampler.kernels.sampling import sample_tokens
from graphsafe_sampler.kernels.top_k_top_p import top_k_top_p_threshold
from graphsafe_sampler.params import GREEDY_TEMPERATURE
from graphsafe_sampler.stages.top_k_top_p import apply_top_k_top_p


def test_chained_kernels_compile_and_match_torch_backend(kernel_device: torch.device) -> None:
    gen = torch.Generator().manual_seed(1234)
    rows, vocab, num_reqs = 5, 1023, 6
    num_slots = num_reqs + 1
    # a real PenaltyState with saturated tokens; slot 6 is the padding slot
    state = _random_state(num_reqs, vocab, gen, device=kernel_device)
    slots = torch.tensor([0, 4, 6, 5, 1], device=kernel_device)
    top_k = torch.tensor([0, 40, 0, 3, 0, 100, 0], dtype=torch.int32, device=kernel_device)
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0, 0.5, 0.95, 0.8], device=kernel_device)
    seeds = torch.randint(-(2**63), 2**63 - 1, (num_slots,), generator=gen).to(kernel_device)
    positions = torch.randint(0, 2**40, (rows,), generator=gen).to(kernel_device)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(kernel_device)

    def step(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # one write of the logits (process_logits); top-k/top-p and sampling only read
        x = torch.empty_like(logits)
        process_logits(logits, x, slots, *state.kernel_args(), None, *state.penalty_args())
        threshold = torch.empty(rows, device=logits.device)
        top_k_top_p_threshold(x, slots, top_k, top_p, threshold)
        tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
        sample_tokens(x, slots, state.temperature, seeds, positions, threshold, tokens)
        return x, tokens

    processed, eager = step(logits)
    compiled = torch.compile(step, fullgraph=True)(logits)[1]
    assert torch.equal(compiled, eager)

    # The PyTorch backend: greedy rows divide by 1, so the processed logits' argmax is the
    # greedy token before temperature; then the filters and the race.
    x = _torch_backend(logits, slots, state, None)
    assert torch.equal(processed, x)
    is_greedy = state.temperature[slots] < GREEDY_TEMPERATURE
    greedy_tokens = x.argmax(-1)
    x = apply_top_k_top_p(x, top_k[slots], top_p[slots])
    perturbed = x + rng.gumbel_noise(seeds[slots], positions, vocab, rng.SALT_SAMPLE)
    want = torch.where(is_greedy, greedy_tokens, perturbed.argmax(-1))
    assert bool(is_greedy.any()) and not bool(is_greedy.all())
    _assert_same_tokens(eager, want, torch.where(is_greedy[:, None], x, perturbed))
