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
from graphsafe_sampler.kernels.top_k_top_p import (
    candidate_lists,
    launch_top_k_top_p,
    top_k_top_p_threshold,
)
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


def test_deferred_rows_are_read_from_their_source(kernel_device: torch.device) -> None:
    """process_logits' deferred rows (left unwritten: a row no step but its temperature
    changes) read from the source, and divided, by the top-k/top-p kernels and sampling,
    and its written rows (0 and 7) read from the buffer and divided there (row 0's):
    the same cuts and tokens as with every row written, the unwritten rows poisoned with
    NaN (which a read of them would return). Split rows, the tile maxima and the candidate
    lists; top-k, top-p, both, off, greedy; temperatures on top-p alone and on a top-k
    past the buffer (the search's passes and its gather over the source)."""
    gen = torch.Generator().manual_seed(int(torch.seed() % 2**31))
    print(f"generator seed {gen.initial_seed()}")
    rows, vocab, num_reqs = 8, 5000, 8
    state = _random_state(num_reqs, vocab, gen, device=kernel_device)
    p = state.penalties
    for s in range(2, num_reqs):  # every feature off in slots 2..7: their rows are deferred
        p.repetition.device[s], p.frequency.device[s], p.presence.device[s] = 1.0, 0.0, 0.0
        state.bias_values[s] = 0.0
        state.min_tokens[s] = 0
        state.allowed[s] = -1
        state.temperature[s] = 1.0
    state.temperature[5] = 0.0  # greedy
    state.temperature[3], state.temperature[6] = 0.5, 1.3  # divided by their readers
    state.temperature[0], state.temperature[1] = 0.6, 1.0  # written rows (0: its readers')
    slots = torch.tensor([0, 2, 3, 4, 5, 6, 7, 1], device=kernel_device)
    num_slots = num_reqs + 1
    top_k = torch.tensor([40, 0, 50, 0, 7, 3, 1000, 0, 0], dtype=torch.int32)[:num_slots]
    top_p = torch.tensor([0.9, 1.0, 1.0, 0.8, 0.6, 1.0, 0.99, 1.0, 1.0])[:num_slots]
    top_k, top_p = top_k.to(kernel_device), top_p.to(kernel_device)
    seeds = torch.randint(-(2**63), 2**63 - 1, (num_slots,), generator=gen).to(kernel_device)
    positions = torch.randint(0, 2**40, (rows,), generator=gen).to(kernel_device)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(kernel_device)
    grammar = torch.full((rows, (vocab + 31) // 32), -1, dtype=torch.int32, device=kernel_device)
    restricted = (state.allowed != -1).any(1).to(torch.int32)
    biased = (state.bias_values != 0.0).any(1).to(torch.int32)
    grammar_on = torch.zeros(rows, dtype=torch.bool, device=kernel_device)
    tiles = (vocab + 1023) // 1024
    runs = []
    for defer in (False, True):
        x = torch.full_like(logits, float("nan"))
        tile_max = torch.empty(rows, tiles, device=kernel_device)
        deferred = torch.zeros(rows, device=kernel_device)
        tables = dict(restricted=restricted, biased=biased, grammar_on=grammar_on)
        process_logits(
            logits, x, slots, *state.kernel_args(), grammar, *state.penalty_args(),
            splits=2, tile_max=tile_max, **(dict(tables, deferred=deferred) if defer else {}),
        )  # fmt: skip
        read = dict(source=logits, deferred=deferred) if defer else {}
        threshold = torch.empty(rows, device=kernel_device)
        buffer = candidate_lists(rows, vocab, 2, kernel_device, 128)
        # the buffer of 128 candidates (the interpreter's default is none): stage 1's lists
        launch_top_k_top_p(x, slots, top_k, top_p, threshold, False, candidates=128, splits=2,
                           tile_max=tile_max, buffer=buffer, **read)  # fmt: skip
        tokens = torch.empty(rows, dtype=torch.int64, device=kernel_device)
        sample_tokens(x, slots, state.temperature, seeds, positions, threshold, tokens, 0,
                      None, None, 2, tile_max, None, *buffer, **read)  # fmt: skip
        runs.append((x.cpu(), threshold.cpu(), tokens.cpu(), deferred.cpu(), buffer[0].cpu()))
    (full, want_cut, want, _, want_covered), (x, cut, got, deferred, covered) = runs
    assert torch.equal(deferred, torch.tensor([-0.6, 1, 0.5, 1, 1, 1.3, 1, -1]))
    assert bool(x[1:7].isnan().all())
    assert torch.equal(full[1:7], logits[1:7].cpu() / deferred[1:7, None])
    # the written rows without their temperature, which the readers apply
    assert torch.equal(full[[0, 7]], x[[0, 7]] / -deferred[[0, 7], None])
    assert torch.equal(cut, want_cut)
    assert torch.equal(covered, want_covered)
    assert torch.equal(got, want)
