"""The logits-processing Triton kernel (interpreted on CPU) against the PyTorch backend's
stages (bit for bit) and a float64 reference of the whole sequence."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from graphsafe_sampler import triton_ops
from graphsafe_sampler.bitmask import BitmaskUnpacker, num_words, pack_token_ids
from graphsafe_sampler.params import GREEDY_TEMPERATURE
from graphsafe_sampler.penalties import apply_penalties

NUM_BIAS, NUM_STOP, NUM_OVERFLOW = 8, 5, 4


def _gen() -> torch.Generator:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


@dataclass
class State:
    """Per-slot tables in the layouts the kernel reads, plus the full counts they encode."""

    bias_ids: torch.Tensor
    bias_values: torch.Tensor
    min_tokens: torch.Tensor
    num_generated: torch.Tensor
    stop_ids: torch.Tensor
    allowed: torch.Tensor
    full_counts: torch.Tensor  # [num_slots, V] int64, the counts the next three encode
    counts: torch.Tensor
    overflow_token: torch.Tensor
    overflow_high: torch.Tensor
    prompt_mask: torch.Tensor
    repetition: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor
    temperature: torch.Tensor

    def kernel_args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.bias_ids, self.bias_values, self.min_tokens, self.num_generated,
            self.stop_ids, self.allowed,
        )  # fmt: skip

    def penalty_args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.counts, self.overflow_token, self.overflow_high, self.prompt_mask,
            self.repetition, self.frequency, self.presence, self.temperature,
        )  # fmt: skip


def _random_state(num_slots: int, vocab: int, gen: torch.Generator) -> State:
    """Slot 0 has every feature off (a padding slot); slot 1 fills every sparse table."""
    words = num_words(vocab)
    bias_ids = torch.zeros(num_slots, NUM_BIAS, dtype=torch.int32)
    bias_values = torch.zeros(num_slots, NUM_BIAS)
    stop_ids = torch.zeros(num_slots, NUM_STOP, dtype=torch.int32)
    min_tokens = torch.zeros(num_slots, dtype=torch.int32)
    num_generated = torch.randint(0, 20, (num_slots,), generator=gen, dtype=torch.int32)
    allowed = torch.full((num_slots, words), -1, dtype=torch.int32)
    prompt_mask = torch.zeros(num_slots, words, dtype=torch.int32)
    full_counts = torch.zeros(num_slots, vocab, dtype=torch.int64)
    overflow_token = torch.full((num_slots, NUM_OVERFLOW), -1, dtype=torch.int32)
    overflow_high = torch.zeros(num_slots, NUM_OVERFLOW, dtype=torch.int32)
    for s in range(1, num_slots):
        n = NUM_BIAS if s == 1 else int(torch.randint(0, NUM_BIAS + 1, (1,), generator=gen))
        n = max(n, 1) if s == 2 else n
        ids = torch.randperm(vocab, generator=gen)[:n]
        if s == 2:
            ids[0] = 0  # a real bias on token 0, next to unused (0, +0.0) entries
        bias_ids[s, :n] = ids.int()
        bias_values[s, :n] = torch.randn(n, generator=gen) * 3
        n = NUM_STOP if s == 1 else int(torch.randint(1, NUM_STOP + 1, (1,), generator=gen))
        ids = torch.randperm(vocab, generator=gen)[:n].int()
        stop_ids[s] = ids[0]  # unused entries repeat the first id
        stop_ids[s, :n] = ids
        min_tokens[s] = int(torch.randint(0, 25, (1,), generator=gen))
        if torch.rand(1, generator=gen) < 0.5:
            keep = torch.randperm(vocab, generator=gen)[: vocab // 2].tolist()
            allowed[s] = torch.from_numpy(pack_token_ids(keep, vocab))
        prompt = torch.randint(0, vocab, (vocab // 8,), generator=gen).tolist()
        prompt_mask[s] = torch.from_numpy(pack_token_ids(prompt, vocab))
        # small counts on a few tokens, and up to E tokens past 255 (256 = low byte 0)
        seen = torch.randperm(vocab, generator=gen)[: vocab // 10]
        full_counts[s, seen] = torch.randint(1, 6, (seen.numel(),), generator=gen)
        big = torch.randperm(vocab, generator=gen)[: int(torch.randint(0, 5, (1,), generator=gen))]
        big_counts = torch.tensor([256, 300, 1000, 65791])[: big.numel()]
        full_counts[s, big] = big_counts
        overflow_token[s, : big.numel()] = big.int()
        overflow_high[s, : big.numel()] = (big_counts // 256).int()
    off = torch.rand(num_slots, generator=gen) < 0.3
    off[0] = True
    repetition = torch.where(off, 1.0, torch.rand(num_slots, generator=gen) * 1.9 + 0.1)
    frequency = torch.where(off, 0.0, torch.rand(num_slots, generator=gen) * 4 - 2)
    presence = torch.where(off, 0.0, torch.rand(num_slots, generator=gen) * 4 - 2)
    temperature = torch.tensor([0.0, 1e-6, 0.5, 1.0, 1.3])[
        torch.randint(0, 5, (num_slots,), generator=gen)
    ]
    temperature[0] = 0.0
    return State(
        bias_ids, bias_values, min_tokens, num_generated, stop_ids, allowed, full_counts,
        (full_counts % 256).to(torch.uint8), overflow_token, overflow_high, prompt_mask,
        repetition, frequency, presence, temperature,
    )  # fmt: skip


def _torch_backend(
    logits: torch.Tensor, slots: torch.Tensor, state: State, grammar: torch.Tensor | None
) -> torch.Tensor:
    """The PyTorch backend's stages in its order (the processors' apply bodies)."""
    unpack = BitmaskUnpacker(logits.shape[1], logits.device).unpack
    x = logits.clone()
    x.scatter_add_(1, state.bias_ids[slots].long(), state.bias_values[slots])
    active = state.num_generated[slots] < state.min_tokens[slots]
    ban = torch.where(active, float("-inf"), float("inf"))[:, None]
    ids = state.stop_ids[slots].long()
    x.scatter_reduce_(1, ids, ban.expand_as(ids), reduce="amin")
    x.masked_fill_(~unpack(state.allowed[slots]), float("-inf"))
    if grammar is not None:
        x.masked_fill_(~unpack(grammar), float("-inf"))
    x = apply_penalties(
        x, state.full_counts[slots].int(), unpack(state.prompt_mask[slots]),
        state.repetition[slots], state.frequency[slots], state.presence[slots],
    )  # fmt: skip
    t = state.temperature[slots]
    return x / torch.where(t < GREEDY_TEMPERATURE, 1.0, t)[:, None]


def _float64_reference(
    logits: torch.Tensor, slots: torch.Tensor, state: State, grammar: torch.Tensor | None
) -> np.ndarray:
    """DESIGN §4 steps 2-6, token by token in float64, from the full counts."""
    x = logits.double().numpy().copy()
    vocab = x.shape[1]

    def bit(words: torch.Tensor, t: int) -> bool:
        return bool((int(words[t // 32]) >> (t % 32)) & 1)

    for r, s in enumerate(slots.tolist()):
        for t, b in zip(state.bias_ids[s].tolist(), state.bias_values[s].tolist(), strict=True):
            x[r, t] += b
        if state.num_generated[s] < state.min_tokens[s]:
            x[r, state.stop_ids[s].long().numpy()] = -np.inf
        rep, freq = float(state.repetition[s]), float(state.frequency[s])
        pres, temp = float(state.presence[s]), float(state.temperature[s])
        for t in range(vocab):
            if not bit(state.allowed[s], t) or (grammar is not None and not bit(grammar[r], t)):
                x[r, t] = -np.inf
            count = int(state.full_counts[s, t])
            if count > 0 or bit(state.prompt_mask[s], t):
                x[r, t] = x[r, t] / rep if x[r, t] > 0 else x[r, t] * rep
            x[r, t] -= freq * count + pres * (count > 0)
        if temp >= GREEDY_TEMPERATURE:
            x[r] /= temp
    return x


def _kernel(
    logits: torch.Tensor, slots: torch.Tensor, state: State, grammar: torch.Tensor | None
) -> torch.Tensor:
    got = logits.clone()
    triton_ops.process_logits(got, slots, *state.kernel_args(), grammar, *state.penalty_args())
    return got


@pytest.mark.parametrize(
    ("rows", "vocab"),
    [pytest.param(1, 111, id="R1-V111"), pytest.param(3, 1023, id="R3-V1023"),
     pytest.param(17, 4099, id="R17-V4099")],
)  # fmt: skip
@pytest.mark.parametrize("with_grammar", [False, True], ids=["no-grammar", "grammar"])
def test_matches_torch_backend(rows: int, vocab: int, with_grammar: bool) -> None:
    gen = _gen()
    num_slots = rows + 3
    state = _random_state(num_slots, vocab, gen)
    slots = torch.randperm(num_slots, generator=gen)[:rows]
    slots[0] = 1  # the slot whose sparse tables are full
    slots[-1] = 2  # the slot with a real bias on token 0 (a lone row: slot 2 instead of 1)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    grammar = None
    if with_grammar:
        bits = torch.rand(rows, num_words(vocab) * 32, generator=gen) < 0.8
        grammar = torch.from_numpy(
            np.packbits(bits.numpy(), axis=1, bitorder="little").view(np.int32).copy()
        )
    got = _kernel(logits, slots, state, grammar)
    assert torch.equal(got, _torch_backend(logits, slots, state, grammar))


@pytest.mark.parametrize(("rows", "vocab"), [(3, 111), (2, 1023)], ids=["R3-V111", "R2-V1023"])
def test_matches_float64_reference(rows: int, vocab: int) -> None:
    gen = _gen()
    num_slots = rows + 2
    state = _random_state(num_slots, vocab, gen)
    slots = torch.tensor([1, *torch.randperm(num_slots - 2, generator=gen)[: rows - 1].add(2)])
    logits = torch.randn(rows, vocab, generator=gen) * 4
    grammar = torch.randint(-(2**31), 2**31 - 1, (rows, num_words(vocab)), generator=gen).int()
    got = _kernel(logits, slots, state, grammar).double().numpy()
    want = _float64_reference(logits, slots, state, grammar)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=2e-5)


def test_padding_slot_changes_nothing() -> None:
    gen = _gen()
    state = _random_state(3, 333, gen)
    logits = torch.randn(4, 333, generator=gen)
    assert torch.equal(_kernel(logits, torch.zeros(4, dtype=torch.int64), state, None), logits)


def test_non_contiguous_row_stride() -> None:
    gen = _gen()
    state = _random_state(4, 300, gen)
    base = torch.randn(6, 401, generator=gen)
    before = base.clone()
    logits = base[::2, :300]  # row stride 802
    slots = torch.tensor([1, 3, 2])
    want = _torch_backend(logits, slots, state, None)
    triton_ops.process_logits(logits, slots, *state.kernel_args(), None, *state.penalty_args())
    assert torch.equal(logits, want)
    assert torch.equal(base[1::2], before[1::2])
    assert torch.equal(base[::2, 300:], before[::2, 300:])


def test_rejects_bad_input() -> None:
    state = _random_state(2, 64, torch.Generator().manual_seed(0))
    logits, slots = torch.randn(1, 64), torch.tensor([1])
    with pytest.raises(TypeError, match=r"counts must be torch\.uint8, got torch\.int32"):
        args = list(state.penalty_args())
        args[0] = args[0].int()
        triton_ops.process_logits(logits, slots, *state.kernel_args(), None, *args)
    with pytest.raises(ValueError, match=r"grammar must have shape \[1, 2\], got \(2, 2\)"):
        grammar = torch.zeros(2, 2, dtype=torch.int32)
        triton_ops.process_logits(
            logits, slots, *state.kernel_args(), grammar, *state.penalty_args()
        )


def test_opcheck() -> None:
    gen = _gen()
    state = _random_state(4, 129, gen)
    logits, slots = torch.randn(3, 129, generator=gen), torch.tensor([3, 1, 2])
    grammar = torch.full((3, num_words(129)), -1, dtype=torch.int32)
    for g in (grammar, None):
        torch.library.opcheck(
            triton_ops.process_logits,
            (logits.clone(), slots, *state.kernel_args(), g, *state.penalty_args()),
        )
