"""The logits-processing kernel on a speculative step's positions (on `kernel_device`:
interpreted on CPU, compiled on CUDA): the drafts before a position count as output tokens
for the penalties and min_tokens, bit for bit as the PyTorch backend's
`PenaltyState.apply(extra_tokens=...)` and `MinTokensLogitsProcessor.apply(num_preceding)`
count them."""

from __future__ import annotations

import pytest
import torch
from test_kernel_logits_processing import (
    State,
    _expose_first_saturated,
    _gen,
    _random_grammar,
    _random_state,
)

from graphsafe_sampler.bitmask import BitmaskUnpacker
from graphsafe_sampler.kernels.logits_processing import process_logits
from graphsafe_sampler.params import GREEDY_TEMPERATURE


def _torch_backend(
    logits: torch.Tensor,
    slots: torch.Tensor,
    state: State,
    grammar: torch.Tensor,
    drafts: torch.Tensor,
    preceding: torch.Tensor,
) -> torch.Tensor:
    """The PyTorch backend's stages with drafts (Sampler.process_logits's order)."""
    unpack = BitmaskUnpacker(logits.shape[1], logits.device).unpack
    x = logits.clone()
    x.scatter_add_(1, state.bias_ids[slots].long(), state.bias_values[slots])
    generated = state.batch.num_generated.device[slots] + preceding
    active = generated < state.min_tokens[slots]
    ban = torch.where(active, float("-inf"), float("inf"))[:, None]
    ids = state.stop_ids[slots].long()
    x.scatter_reduce_(1, ids, ban.expand_as(ids), reduce="amin")
    x.masked_fill_(~unpack(state.allowed[slots]), float("-inf"))
    x.masked_fill_(~unpack(grammar), float("-inf"))
    columns = torch.arange(drafts.shape[1], device=drafts.device)
    x = state.penalties.apply(
        x, slots, extra_tokens=drafts, extra_mask=columns[None, :] < preceding[:, None]
    )
    t = state.temperature[slots]
    return x / torch.where(t < GREEDY_TEMPERATURE, 1.0, t)[:, None]


def _spec_rows(
    state: State, num_reqs: int, spec: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows r * (spec + 1) + j = request r after its first j drafts: (slots, drafts
    [rows, spec] int64, preceding [rows] int64), on the state's device. Each request drafts
    one of its saturated tokens (penalised by the excess too; request 0 drafts it first), a
    token of its prompt or output history and random ids, one of them twice. Drawn on the
    host, beside the exact counts."""
    vocab = state.full_counts.shape[1]
    overflow_token = state.penalties.overflow_token.device.cpu()
    slots, drafts = [], []
    for r in range(num_reqs):
        saturated = int(overflow_token[r, 0])
        seen = state.full_counts[r].nonzero().flatten()
        row = torch.randint(0, vocab, (spec,), generator=gen)
        row[0] = saturated
        row[1] = seen[int(torch.randint(0, seen.numel(), (1,), generator=gen))]
        row[-1] = row[int(torch.randint(0, spec - 1, (1,), generator=gen))]
        if r > 0:  # request 0 drafts its saturated token first (checked at every position)
            row = row[torch.randperm(spec, generator=gen)]
        for _ in range(spec + 1):
            slots.append(r)
            drafts.append(row)
    preceding = torch.arange(spec + 1).repeat(num_reqs)
    device = state.batch.device
    return (
        torch.tensor(slots, device=device),
        torch.stack(drafts).contiguous().to(device),
        preceding.to(device),
    )


@pytest.mark.parametrize(("num_reqs", "vocab", "spec"), [(2, 111, 3), (3, 1023, 4)])
def test_drafts_match_torch_backend(
    num_reqs: int, vocab: int, spec: int, kernel_device: torch.device
) -> None:
    gen = _gen()
    state = _random_state(num_reqs, vocab, gen, device=kernel_device)
    _expose_first_saturated(state)
    # min_tokens in force for the first positions of each request, lifted by its drafts
    generated = state.batch.num_generated.device[:num_reqs]
    lead = torch.randint(1, spec + 1, (num_reqs,), generator=gen).to(kernel_device)
    state.min_tokens[:num_reqs] = generated + lead
    slots, drafts, preceding = _spec_rows(state, num_reqs, spec, gen)
    rows = slots.shape[0]
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    grammar = _random_grammar(rows, vocab, gen, kernel_device)
    token = int(drafts[0, 0])  # request 0's saturated draft: allowed at all its positions
    grammar[: spec + 1, token // 32] |= torch.tensor(1 << token % 32).to(torch.int32)
    got = torch.empty_like(logits)
    process_logits(
        logits, got, slots, *state.kernel_args(), grammar, *state.penalty_args(), drafts,
        preceding,
    )  # fmt: skip
    want = _torch_backend(logits, slots, state, grammar, drafts, preceding)
    assert torch.equal(got, want)
    # The drafts changed the penalised rows: without them the kernel gives another answer.
    without = torch.empty_like(logits)
    process_logits(logits, without, slots, *state.kernel_args(), grammar, *state.penalty_args())
    changed = (without != got).any(-1).view(num_reqs, spec + 1)
    assert not bool(changed[:, 0].any())  # no draft precedes position 0
    assert bool(changed[0, 1:].all())  # slot 0: penalties on, the saturated draft unmasked


def test_bad_draft_arguments(kernel_device: torch.device) -> None:
    gen = _gen()
    state = _random_state(2, 111, gen, device=kernel_device)
    slots, drafts, preceding = _spec_rows(state, 2, 3, gen)
    logits = torch.randn(slots.shape[0], 111, generator=gen).to(kernel_device)
    out = torch.empty_like(logits)
    args = (logits, out, slots, *state.kernel_args(), None, *state.penalty_args())
    with pytest.raises(ValueError, match="drafts and num_preceding come together"):
        process_logits(*args, drafts, None)
    with pytest.raises(TypeError, match=r"drafts must be torch\.int64"):
        process_logits(*args, drafts.int(), preceding)
    with pytest.raises(ValueError, match=r"drafts must be a contiguous \[8, D\] tensor"):
        process_logits(*args, drafts[:4], preceding)
    with pytest.raises(TypeError, match=r"num_preceding must be torch\.int64"):
        process_logits(*args, drafts, preceding.int())
    with pytest.raises(ValueError, match=r"drafts must have at least one column"):
        process_logits(*args, drafts[:, :0].contiguous(), preceding)


def test_preceding_past_the_drafts_counts_each_draft_once(kernel_device: torch.device) -> None:
    """num_preceding is a device value the op cannot check: past D it counts the row's D
    drafts (the PyTorch mask `column < num_preceding` does the same), never the next
    row's, and min_tokens counts it whole, as the PyTorch processor does."""
    gen = _gen()
    num_reqs, vocab, spec = 2, 111, 3
    state = _random_state(num_reqs, vocab, gen, device=kernel_device)
    _expose_first_saturated(state)
    slots, drafts, _ = _spec_rows(state, num_reqs, spec, gen)
    rows = slots.shape[0]
    preceding = torch.full((rows,), spec + 2, dtype=torch.int64, device=kernel_device)
    generated = state.batch.num_generated.device[:num_reqs]
    state.min_tokens[:num_reqs] = generated + spec + 1  # lifted only by the whole count
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    grammar = _random_grammar(rows, vocab, gen, kernel_device)
    got = torch.empty_like(logits)
    process_logits(
        logits, got, slots, *state.kernel_args(), grammar, *state.penalty_args(), drafts,
        preceding,
    )  # fmt: skip
    assert torch.equal(got, _torch_backend(logits, slots, state, grammar, drafts, preceding))


def test_opcheck_with_drafts(kernel_device: torch.device) -> None:
    gen = _gen()
    state = _random_state(2, 129, gen, device=kernel_device)
    slots, drafts, preceding = _spec_rows(state, 2, 2, gen)
    logits = torch.randn(slots.shape[0], 129, generator=gen).to(kernel_device)
    torch.library.opcheck(
        process_logits,
        (
            logits,
            torch.empty_like(logits),
            slots,
            *state.kernel_args(),
            None,
            *state.penalty_args(),
            drafts,
            preceding,
        ),
    )
