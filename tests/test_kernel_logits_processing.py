"""The logits-processing Triton kernel (on `kernel_device`: interpreted on CPU, compiled on
CUDA) against the PyTorch backend's stages (bit for bit) and a float64 reference of the whole
sequence."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.bitmask import BitmaskUnpacker, num_words, pack_token_ids
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.kernels.library import divide_by, hoisted_reciprocal
from graphsafe_sampler.kernels.logits_processing import launch_process_logits, process_logits
from graphsafe_sampler.kernels.token_steps import divide
from graphsafe_sampler.params import GREEDY_TEMPERATURE, SamplingParams
from graphsafe_sampler.stages.penalties import SATURATED, PenaltyState

NUM_BIAS, NUM_STOP = 8, 5
# max_model_len 2000: E = 8 overflow entries per slot (the table has E + 1 columns)
MAX_MODEL_LEN = 2000


def _gen() -> torch.Generator:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


@dataclass
class State:
    """Per-slot tables in the layouts the kernel reads, on the kernel's device: the
    processors' tables drawn at random, the penalty tables those of a real PenaltyState
    advanced by BatchState.commit, and the exact output counts they encode (kept on the
    host, the CPU, beside them)."""

    bias_ids: torch.Tensor
    bias_values: torch.Tensor
    min_tokens: torch.Tensor
    stop_ids: torch.Tensor
    allowed: torch.Tensor
    temperature: torch.Tensor
    batch: BatchState
    penalties: PenaltyState
    full_counts: torch.Tensor  # [num_slots, V] int64 on the CPU, every output token counted

    def kernel_args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.bias_ids, self.bias_values, self.min_tokens, self.batch.num_generated.device,
            self.stop_ids, self.allowed,
        )  # fmt: skip

    def penalty_args(self) -> tuple[torch.Tensor, ...]:
        p = self.penalties
        return (
            p.counts, p.overflow_token.device, p.overflow_excess.device, p.prompt_mask.device,
            p.repetition.device, p.frequency.device, p.presence.device, self.temperature,
        )  # fmt: skip


def _penalty_params(s: int, gen: torch.Generator) -> SamplingParams:
    """Slot 0 always has a frequency penalty (so its excess counts); others are off 30% of
    the time."""
    if s > 0 and float(torch.rand(1, generator=gen)) < 0.3:
        return SamplingParams()
    r = torch.rand(3, generator=gen).tolist()
    frequency = r[1] * 4 - 2 if s > 0 else 0.25 + r[1]
    return SamplingParams(
        repetition_penalty=r[0] * 1.9 + 0.1, frequency_penalty=frequency,
        presence_penalty=r[2] * 4 - 2,
    )  # fmt: skip


def commit_rows(batch: BatchState, tokens: list[int], full_counts: torch.Tensor) -> None:
    """Commit one token per batch row through the PyTorch commit, counting it on the host."""
    batch.commit(torch.tensor(tokens, device=batch.device))
    for row, token in enumerate(tokens):
        slot = batch.slot_of_row(row)
        if slot is not None:
            full_counts[slot, token] += 1


def penalty_state(
    num_reqs: int,
    vocab: int,
    gen: torch.Generator,
    max_model_len: int = MAX_MODEL_LEN,
    device: torch.device | str = "cpu",
) -> tuple[BatchState, PenaltyState, torch.Tensor]:
    """A real BatchState + PenaltyState holding `num_reqs` requests (rows = slots 0..n-1,
    the padding slot last), with resumed outputs and commits that take tokens past 255 both
    ways: a resumed token already past 255 (an entry from add_request) and one at 252 that
    the commits saturate (an entry taken on the device), then grow. Returns the exact counts
    [num_slots, V] int64 too, on the CPU (`device` is the state's)."""
    config = SamplerConfig(num_reqs, vocab, max_model_len=max_model_len)
    batch = BatchState(config, device)
    penalties = PenaltyState(config, batch)
    full_counts = torch.zeros(config.num_slots, vocab, dtype=torch.int64)
    added, hot = [], []
    for s in range(num_reqs):
        prompt = torch.randint(0, vocab, (vocab // 8,), generator=gen).tolist()
        tokens = torch.randperm(vocab, generator=gen)
        resumed, at_252 = int(tokens[0]), int(tokens[1])
        small = tokens[2 : 2 + min(vocab // 10, 40)].tolist()
        output = [resumed] * int(torch.randint(255, 400, (1,), generator=gen)) + [at_252] * 252
        for t in small:
            output += [t] * int(torch.randint(1, 6, (1,), generator=gen))
        output = [output[i] for i in torch.randperm(len(output), generator=gen).tolist()]
        for t in output:
            full_counts[s, t] += 1
        added.append((s, _penalty_params(s, gen), prompt, output))
        hot.append((resumed, at_252))
    batch.update(BatchUpdate(num_reqs, removed=[], added=added, moved=[]))
    for step in range(8):  # at_252 saturates on the third commit of it, then grows
        commit_rows(batch, [hot[s][step % 2 == 0] for s in range(num_reqs)], full_counts)
    return batch, penalties, full_counts


def _random_state(
    num_reqs: int,
    vocab: int,
    gen: torch.Generator,
    penalty: tuple[BatchState, PenaltyState, torch.Tensor] | None = None,
    device: torch.device | str = "cpu",
) -> State:
    """Slot 0 fills every sparse table; slot 1 (when there is one) has a real bias on token
    0; the padding slot (the last) has every feature off. `penalty`: the batch and penalty
    state to use (default `penalty_state(num_reqs, vocab, gen, device=device)`; a given one
    sets the device). The tables are drawn on the CPU, then moved to the state's device."""
    batch, penalties, full_counts = penalty or penalty_state(num_reqs, vocab, gen, device=device)
    num_slots = num_reqs + 1
    words = num_words(vocab)
    bias_ids = torch.zeros(num_slots, NUM_BIAS, dtype=torch.int32)
    bias_values = torch.zeros(num_slots, NUM_BIAS)
    stop_ids = torch.zeros(num_slots, NUM_STOP, dtype=torch.int32)
    min_tokens = torch.zeros(num_slots, dtype=torch.int32)
    generated = batch.num_generated.device.cpu()
    allowed = torch.full((num_slots, words), -1, dtype=torch.int32)
    for s in range(num_reqs):
        n = NUM_BIAS if s == 0 else int(torch.randint(0, NUM_BIAS + 1, (1,), generator=gen))
        n = max(n, 1) if s == 1 else n
        perm = torch.randperm(vocab, generator=gen)
        if s == 1:
            # a real bias on token 0, next to unused (0, +0.0) entries. Moved to the front,
            # not written over ids[0]: the keys stay unique (logit_bias is a dict; the kernel
            # relies on it), where a draw holding 0 among ids[1:n] would bias token 0 twice.
            perm = torch.cat([perm.new_zeros(1), perm[perm != 0]])
        ids = perm[:n]
        bias_ids[s, :n] = ids.int()
        bias_values[s, :n] = torch.randn(n, generator=gen) * 3
        n = NUM_STOP if s == 0 else int(torch.randint(1, NUM_STOP + 1, (1,), generator=gen))
        ids = torch.randperm(vocab, generator=gen)[:n].int()
        stop_ids[s] = ids[0]  # unused entries repeat the first id
        stop_ids[s, :n] = ids
        min_tokens[s] = generated[s] + int(torch.randint(-3, 4, (1,), generator=gen))
        if torch.rand(1, generator=gen) < 0.5:
            keep = torch.randperm(vocab, generator=gen)[: vocab // 2].tolist()
            allowed[s] = torch.from_numpy(pack_token_ids(keep, vocab))
    temperature = torch.tensor([0.0, 1e-6, 0.5, 1.0, 1.3])[
        torch.randint(0, 5, (num_slots,), generator=gen)
    ]
    temperature[0] = 1.3  # the excess goes in before a real temperature
    temperature[-1] = 0.0
    tables = (bias_ids, bias_values, min_tokens, stop_ids, allowed, temperature)
    return State(*(t.to(batch.device) for t in tables), batch, penalties, full_counts)


def _torch_backend(
    logits: torch.Tensor, slots: torch.Tensor, state: State, grammar: torch.Tensor | None
) -> torch.Tensor:
    """The PyTorch backend's stages in its order (the processors' apply bodies, then the
    package's PenaltyState.apply on the same tables)."""
    unpack = BitmaskUnpacker(logits.shape[1], logits.device).unpack
    x = logits.clone()
    x.scatter_add_(1, state.bias_ids[slots].long(), state.bias_values[slots])
    active = state.batch.num_generated.device[slots] < state.min_tokens[slots]
    ban = torch.where(active, float("-inf"), float("inf"))[:, None]
    ids = state.stop_ids[slots].long()
    x.scatter_reduce_(1, ids, ban.expand_as(ids), reduce="amin")
    x.masked_fill_(~unpack(state.allowed[slots]), float("-inf"))
    if grammar is not None:
        x.masked_fill_(~unpack(grammar), float("-inf"))
    x = state.penalties.apply(x, slots)
    t = state.temperature[slots]
    return x / torch.where(t < GREEDY_TEMPERATURE, 1.0, t)[:, None]


def _float64_reference(
    logits: torch.Tensor,
    slots: torch.Tensor,
    state: State,
    grammar: torch.Tensor | None,
    full_counts: torch.Tensor | None = None,
) -> np.ndarray:
    """docs/design.md §4 steps 2-6, token by token in float64, from the exact counts (or
    `full_counts` [num_slots, V] in their place). Reads host copies of every table: one
    device-to-host copy each, not one per element read."""
    counts = (state.full_counts if full_counts is None else full_counts).cpu()
    x = logits.double().cpu().numpy().copy()
    vocab = x.shape[1]
    p = state.penalties
    generated = state.batch.num_generated.device.cpu()
    bias_ids, bias_values = state.bias_ids.cpu(), state.bias_values.cpu()
    min_tokens, stop_ids = state.min_tokens.cpu(), state.stop_ids.cpu()
    allowed, temperature = state.allowed.cpu(), state.temperature.cpu()
    prompt_mask = p.prompt_mask.device.cpu()
    repetition, frequency = p.repetition.device.cpu(), p.frequency.device.cpu()
    presence = p.presence.device.cpu()
    grammar = None if grammar is None else grammar.cpu()

    def bit(words: torch.Tensor, t: int) -> bool:
        return bool((int(words[t // 32]) >> (t % 32)) & 1)

    for r, s in enumerate(slots.tolist()):
        for t, b in zip(bias_ids[s].tolist(), bias_values[s].tolist(), strict=True):
            x[r, t] += b
        if generated[s] < min_tokens[s]:
            x[r, stop_ids[s].long().numpy()] = -np.inf
        rep, freq = float(repetition[s]), float(frequency[s])
        pres, temp = float(presence[s]), float(temperature[s])
        for t in range(vocab):
            if not bit(allowed[s], t) or (grammar is not None and not bit(grammar[r], t)):
                x[r, t] = -np.inf
            count = int(counts[s, t])
            if count > 0 or bit(prompt_mask[s], t):
                x[r, t] = x[r, t] / rep if x[r, t] > 0 else x[r, t] * rep
            x[r, t] -= freq * count + pres * (count > 0)
        if temp >= GREEDY_TEMPERATURE:
            x[r] /= temp
    return x


def _kernel(
    logits: torch.Tensor,
    slots: torch.Tensor,
    state: State,
    grammar: torch.Tensor | None,
    splits: int = 1,
    block_size: int | None = None,
    row_sparse: bool = True,
) -> torch.Tensor:
    """The kernel's logits, as the pipeline launches it: with the output words, and a split
    row's sparse phases made by its last program (`row_sparse`: the counters, which must
    come back 0; else each program makes its own columns')."""
    got = torch.full_like(logits, float("nan"))  # every element must be written
    args = (*state.kernel_args(), grammar, *state.penalty_args())
    # the output bitmask, as the pipeline passes it: count bytes read where it marks a word
    mask = state.penalties.output_words
    arrivals = torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device)
    counters = arrivals if row_sparse else None
    if block_size is None:
        process_logits(
            logits, got, slots, *args, splits=splits, output_words=mask, arrivals=counters
        )  # fmt: skip
    else:  # the launcher: the op takes the library's tile
        launch_process_logits(
            logits, got, slots, *args, splits=splits, block_size=block_size, output_words=mask,
            arrivals=counters,
        )  # fmt: skip
    assert not bool(arrivals.any())  # left 0 for the next launch
    return got


def test_the_output_words_gate_the_count_bytes(kernel_device: torch.device) -> None:
    """With the penalties' output words (a bit a 32-token word), the dense pass reads a
    word's count bytes only where its bit is set: the same logits as without them (every
    penalised, saturated and output token of a real state's commits); with row 0's bits
    cleared its outputs lose their frequency and presence penalties (the bytes are not
    read), the other rows unchanged; and with one marked word's bit of row 0 cleared, only
    that word's 32 tokens change."""
    gen = _gen()
    rows, vocab = 3, 3000
    state = _random_state(rows, vocab, gen, device=kernel_device)
    slots = torch.arange(rows, device=kernel_device)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    args = (*state.kernel_args(), None, *state.penalty_args())
    mask = state.penalties.output_words
    cleared = mask.clone()
    cleared[0] = 0  # slot 0 always has a frequency penalty

    def run(output_words: torch.Tensor | None) -> torch.Tensor:
        got = torch.full_like(logits, float("nan"))
        process_logits(logits, got, slots, *args, output_words=output_words)
        return got.cpu()

    runs = [run(None), run(mask), run(cleared)]
    assert torch.equal(runs[1], runs[0])
    assert bool(mask[0].any()) and not torch.equal(runs[2][0], runs[0][0])
    assert torch.equal(runs[2][1:], runs[0][1:])
    # a word of row 0 that those bits changed (not one whose outputs the sparse phases
    # make, biased or banned), its one bit cleared: only its own tokens change
    words = ((runs[2][0] != runs[0][0]).nonzero()[:, 0] // 32).unique()
    word = int(words[int(torch.randint(0, len(words), (1,), generator=gen))])
    one = mask.clone()
    one[0, word // 32] &= ~(1 << (word % 32)) if word % 32 < 31 else 2**31 - 1
    changed = (run(one) != runs[0]).nonzero().tolist()
    assert changed and all(r == 0 and c // 32 == word for r, c in changed), (word, changed)


def _random_grammar(
    rows: int, vocab: int, gen: torch.Generator, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[rows, ceil(V/32)] int32 on `device`, 80% of the bits set (packed on the host)."""
    bits = torch.rand(rows, num_words(vocab) * 32, generator=gen) < 0.8
    return torch.from_numpy(
        np.packbits(bits.numpy(), axis=1, bitorder="little").view(np.int32).copy()
    ).to(device)


def _listed(state: State, slots: torch.Tensor) -> torch.Tensor:
    """[rows, V] bool on the CPU: the saturated tokens each row's overflow table lists."""
    listed = torch.zeros(slots.shape[0], state.full_counts.shape[1], dtype=torch.bool)
    overflow_token = state.penalties.overflow_token.device.cpu()
    for r, s in enumerate(slots.tolist()):
        for t in overflow_token[s, :-1].tolist():
            if t < 0:
                break
            listed[r, t] = True
    return listed


def _expose_first_saturated(state: State, grammar: torch.Tensor | None = None) -> None:
    """Keep slot 0's first listed saturated token finite in row 0 (allowed, grammar bit set,
    not a banned stop id), so the excess it carries shows in the finite logits. Drawn masks
    hide every saturated token of a row often enough to make a check on them flaky."""
    token = int(state.penalties.overflow_token.device[0, 0])
    word, bit = divmod(token, 32)
    as_int32 = torch.tensor(1 << bit, dtype=torch.int64).to(torch.int32)  # bit 31 wraps
    state.allowed[0, word] |= as_int32
    if grammar is not None:
        grammar[0, word] |= as_int32
    stops = state.stop_ids[0]
    stops[stops == token] = (token + 1) % state.full_counts.shape[1]


@pytest.mark.parametrize(
    ("rows", "vocab"),
    [pytest.param(1, 111, id="R1-V111"), pytest.param(3, 1023, id="R3-V1023"),
     pytest.param(17, 4099, id="R17-V4099")],
)  # fmt: skip
@pytest.mark.parametrize("with_grammar", [False, True], ids=["no-grammar", "grammar"])
def test_matches_torch_backend(
    rows: int, vocab: int, with_grammar: bool, kernel_device: torch.device
) -> None:
    gen = _gen()
    num_reqs = rows + 2
    state = _random_state(num_reqs, vocab, gen, device=kernel_device)
    slots = torch.randperm(num_reqs + 1, generator=gen)[:rows]  # the padding slot may be in
    slots[0] = 0  # the slot whose sparse tables are full, with a frequency penalty
    if rows > 1:
        slots[-1] = 1  # the slot with a real bias on token 0
    slots = slots.to(kernel_device)
    # every request holds saturated tokens: one from its resumed outputs, one from commits
    assert bool((state.penalties.overflow_token.device[:num_reqs, :2] >= 0).all())
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    grammar = _random_grammar(rows, vocab, gen, kernel_device) if with_grammar else None
    got = _kernel(logits, slots, state, grammar)
    assert torch.equal(got, _torch_backend(logits, slots, state, grammar))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (so -0.0 is not 0.0), any NaN matching any NaN."""
    a, b = a.cpu(), b.cpu()
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(
        a[~nan].view(torch.int32), b[~nan].view(torch.int32)
    )


@triton.jit
def _divide_kernel(x_ptr, q_ptr, outside_ptr, d, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    d_inv, _ = hoisted_reciprocal(d)
    q, outside = divide_by(x, d, d_inv)
    tl.store(q_ptr + offsets, q, mask=offsets < n)
    tl.store(outside_ptr + offsets, outside.to(tl.int8), mask=offsets < n)


def test_divide_by_rounds_as_ieee_division_in_its_range(kernel_device: torch.device) -> None:
    """`library.divide_by`, the dense pass's division by a hoisted reciprocal: bit for bit
    torch's float32 x / d (its sign of zero included) wherever it does not mark x
    `outside`, and it marks only what lies outside its proven range (2**-100 <= |x| <=
    2**104, ±0, NaN). Every mantissa of one binade (a quotient's rounding depends on the
    mantissas only, in range) for the divisors at the range's ends and a usual temperature
    and penalty; random bit patterns over every float for those, other usual divisors and
    random ones (the binade is 8 of the test's 9 million quotients a divisor)."""
    gen = _gen()
    mantissas = torch.arange(2**23, dtype=torch.int32) | 0x3F800000  # [1, 2)
    binade = mantissas.view(torch.float32)
    patterns = torch.randint(-(2**31), 2**31, (2**20,), generator=gen, dtype=torch.int64)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-40,
                             2.0**-100, -(2.0**104), 2.0**-101, 2.0**105, 3e38])  # fmt: skip
    anywhere = torch.cat([patterns.to(torch.int32).view(torch.float32), specials])
    drawn = (torch.rand(4, generator=gen) * 4 + 0.01).tolist()
    exhaustive = (2.0**-20, 2.0**20, 0.7, 1.3)
    for d in [*exhaustive, 1e-5, 1.9999999, 1 / 3, *drawn]:
        for x in (binade * -3.0, anywhere) if d in exhaustive else (anywhere,):
            d32 = float(torch.tensor(d, dtype=torch.float32))
            x = x.to(kernel_device)
            q = torch.empty_like(x)
            outside = torch.empty(x.shape, dtype=torch.int8, device=kernel_device)
            _divide_kernel[(triton.cdiv(x.numel(), 2**18),)](x, q, outside, d32, x.numel(),
                                                             BLOCK=2**18)  # fmt: skip
            x, q, outside = x.cpu(), q.cpu(), outside.cpu().bool()
            magnitude = x.abs()
            in_range = ((magnitude >= 2.0**-100) & (magnitude <= 2.0**104)) | (x == 0)
            assert torch.equal(outside, ~in_range & ~torch.isnan(x)), d
            want = x / torch.tensor(d32)
            assert _same_bits(q[~outside], want[~outside]), d


def test_divisions_outside_the_fast_range_match_torch_backend(
    kernel_device: torch.device,
) -> None:
    """A tile holding a quotient outside the hoisted reciprocal's range (huge, tiny and
    subnormal logits; ±0 inside it), and rows whose temperature or repetition penalty lies
    outside [2**-20, 2**20], are made again with IEEE division: bit for bit the PyTorch
    backend, -0.0 included, in every other tile too, with and without the tile maxima.
    ±inf and NaN go to row 1 only (outside by its temperature): a NaN makes its tile again
    whatever else it holds, so rows 0 and 2 see only the finite quotients' marks."""
    gen = _gen()
    rows, vocab = 4, 4099
    state = _random_state(rows + 1, vocab, gen, device=kernel_device)
    slots = torch.tensor([0, 2, 1, 3], device=kernel_device)
    state.temperature[torch.tensor([0, 2, 1, 3])] = torch.tensor(
        [0.7, 3e6, 1.3, 0.25], device=state.temperature.device
    )
    repetition = state.penalties.repetition.device
    repetition[3] = 2e-7  # row 3: outside the range, if its penalties are on
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    finite = [3e38, -3e38, 1e36, 1e-35, -1e-38, 1e-44, 0.0, -0.0]
    grammar = _random_grammar(rows, vocab, gen, kernel_device)
    for r in range(rows):
        nonfinite = [float("inf"), float("-inf"), float("nan")] if r == 1 else []
        planted = torch.tensor(finite + nonfinite)
        columns = torch.randperm(vocab, generator=gen)[: planted.numel()]
        logits[r, columns.to(kernel_device)] = planted.to(kernel_device)
        # the tiny ones kept by both bitmasks: their fast quotients round apart from IEEE
        # division (1e-44 / 1.3 comes out 8e-45, not 7e-45), where the huge ones' come out
        # NaN with or without the mark, and a masked token is -inf either way
        for token in columns[3:6].tolist():
            word, bit = divmod(token, 32)
            as_int32 = torch.tensor(1 << bit, dtype=torch.int64).to(torch.int32).to(kernel_device)
            grammar[r, word] |= as_int32
            state.allowed[int(slots[r]), word] |= as_int32
    logits[0, 3000:3010] = -0.0  # a tile of zeros alone, in the fast range
    want = _torch_backend(logits, slots, state, grammar)
    assert _same_bits(_kernel(logits, slots, state, grammar), want)
    got = torch.full_like(logits, float("nan"))
    tile_max = torch.empty(rows, 5, device=kernel_device)
    args = (*state.kernel_args(), grammar, *state.penalty_args())
    process_logits(logits, got, slots, *args, tile_max=tile_max)
    assert _same_bits(got, want)


@triton.jit
def _positive_divide_kernel(x_ptr, q_ptr, d, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    d_inv, _ = hoisted_reciprocal(d)
    tl.store(q_ptr + offsets, divide(x, (d, d_inv), False, POSITIVE=True), mask=offsets < n)


def test_the_repetition_quotients_range_test_marks_what_divide_by_cannot_vouch_for(
    kernel_device: torch.device,
) -> None:
    """`token_steps.divide` with POSITIVE (the repetition penalty's, kept only where x > 0):
    its one unsigned compare of x's bits marks (NaN) every positive x outside [2**-100,
    2**104], the fast range's, and no positive x inside it, whose quotient is torch's
    float32 x / d bit for bit; zero and negatives come out marked (the caller drops them).
    Random bit patterns over every float, the range's edges and their neighbours."""
    gen = _gen()
    patterns = torch.randint(-(2**31), 2**31, (2**18,), generator=gen, dtype=torch.int64)
    edges = torch.tensor([2.0**-100, 2.0**104, 1e-44, 1e-40, 1e36, 3e38, float("inf")])
    neighbours = torch.cat([edges, torch.nextafter(edges, torch.zeros(())),
                            torch.nextafter(edges, torch.full((), float("inf")))])  # fmt: skip
    x = torch.cat([patterns.to(torch.int32).view(torch.float32), neighbours, -neighbours])
    x = torch.cat([x, torch.tensor([0.0, -0.0, float("nan")])])
    for d in (1.3, 0.7, 2.0**-20, 2.0**20):
        d32 = float(torch.tensor(d, dtype=torch.float32))
        q = torch.empty_like(x).to(kernel_device)
        _positive_divide_kernel[(triton.cdiv(x.numel(), 2**16),)](
            x.to(kernel_device), q, d32, x.numel(), BLOCK=2**16
        )  # fmt: skip
        q = q.cpu()
        inside = (x >= 2.0**-100) & (x <= 2.0**104)
        assert bool(q[~inside].isnan().all()), d
        assert _same_bits(q[inside], x[inside] / torch.tensor(d32)), d


@pytest.mark.parametrize("row_sparse", [True, False], ids=["last-program", "each-program"])
@pytest.mark.parametrize("splits", [2, 5])
def test_split_rows_match_torch_backend(
    splits: int, row_sparse: bool, kernel_device: torch.device
) -> None:
    """A row split over programs (chunks of whole 1,024-element tiles; 5 tiles here), the
    phases after the dense pass made by its last program over the whole row, or by each
    program on its own columns: bit for bit the PyTorch backend, full sparse tables,
    biases, stop ids and saturated tokens spread over the chunks."""
    gen = _gen()
    rows, vocab = 4, 4099
    state = _random_state(rows + 1, vocab, gen, device=kernel_device)
    slots = torch.tensor([0, 2, 1, 3], device=kernel_device)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    grammar = _random_grammar(rows, vocab, gen, kernel_device)
    got = _kernel(logits, slots, state, grammar, splits, row_sparse=row_sparse)
    assert torch.equal(got, _torch_backend(logits, slots, state, grammar))


@pytest.mark.parametrize(("block_size", "splits"), [(16, 3), (64, 2)], ids=["B16-S3", "B64-S2"])
def test_small_tiles_match_torch_backend(
    block_size: int, splits: int, kernel_device: torch.device
) -> None:
    """The dense pass takes a tile as [BLOCK_SIZE / 32, 32], one bitmask word a row. Tiles
    narrower than a word (16) start in its middle every other tile, and a vocabulary that is
    not a whole number of words (1,023) ends inside one: bit for bit the PyTorch backend,
    with the allowed, grammar and prompt bitmasks all in play."""
    gen = _gen()
    rows, vocab = 3, 1023
    state = _random_state(rows + 1, vocab, gen, device=kernel_device)
    slots = torch.tensor([0, 2, 1], device=kernel_device)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    grammar = _random_grammar(rows, vocab, gen, kernel_device)
    got = _kernel(logits, slots, state, grammar, splits, block_size)
    assert torch.equal(got, _torch_backend(logits, slots, state, grammar))


def test_the_store_probe_stores_only_the_sparse_phases_tokens(kernel_device: torch.device) -> None:
    """store_logits=False, the GPU check's probe of what the dense pass's [B, V] store costs:
    no logit of the dense pass is stored (the buffer keeps its fill but at the sparse phases'
    tokens), and the tile tables are still written: the raw one as with the store, the
    tile maxima too wherever no sparse phase touched the tile (those phases read logits the
    probe left out)."""
    gen = _gen()
    rows, vocab, tiles = 3, 16_000, 16
    # prompts of V / 8 tokens: a longer max_model_len
    penalty = penalty_state(rows + 1, vocab, gen, max_model_len=4_000, device=kernel_device)
    state = _random_state(rows + 1, vocab, gen, penalty)
    slots = torch.tensor([0, 2, 1], device=kernel_device)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    grammar = _random_grammar(rows, vocab, gen, kernel_device)
    args = (*state.kernel_args(), grammar, *state.penalty_args())
    runs = []
    for store in (True, False):
        got = torch.full_like(logits, float("nan"))
        tile_max = torch.full((rows, tiles), -7.0, device=kernel_device)
        raw = torch.full((rows, tiles, 2), -7.0, device=kernel_device)
        launch_process_logits(logits, got, slots, *args, splits=2, tile_max=tile_max,
                              raw_tiles=raw, store_logits=store)  # fmt: skip
        runs.append((got.cpu(), tile_max.cpu(), raw.cpu()))
    (full, full_max, full_raw), (probe, probe_max, probe_raw) = runs
    assert not bool(full.isnan().any())  # with the store every logit is written
    assert torch.equal(probe_raw, full_raw)
    overflow = state.penalties.overflow_token.device.cpu()
    checked = 0
    for r, s in enumerate(slots.tolist()):
        sparse = {*state.bias_ids[s].tolist(), *state.stop_ids[s].tolist()}
        sparse |= {t for t in overflow[s].tolist() if t >= 0}
        assert set((~probe[r].isnan()).nonzero().flatten().tolist()) <= sparse
        untouched = sorted(set(range(tiles)) - {t // 1024 for t in sparse})
        assert torch.equal(probe_max[r, untouched], full_max[r, untouched])
        checked += len(untouched)
    # slot 0's tables hold up to 21 sparse tokens over the 16 tiles, the others' fewer
    assert checked >= 8, checked


@pytest.mark.parametrize(("splits", "row_sparse"), [(1, False), (3, False), (3, True)])
def test_tile_maxima(splits: int, row_sparse: bool, kernel_device: torch.device) -> None:
    """The tile-max table: each 1,024-token tile's largest processed logit exactly (+inf
    where it holds NaN), through the phases after the dense pass (`library.update_tiles`):
    a biased token or a stop id (while min_tokens holds) changes its tile's entry to the
    new max, except where it held the tile's max and fell: +inf (unknown), as at the tiles
    of the listed saturated tokens under a frequency penalty. The logits are those of the
    table-less launch. The raw-tile table: each tile's max of the raw logits (exact, +inf at
    the NaN) and its sum of exp (float32 rounding of the float64 one, NaN at the NaN).
    Split over 3 programs, the phases are made by each on its own columns, or by the last
    to arrive over the row (`row_sparse`), whose entries of the other programs' tiles then
    change."""
    from tile_maxima import exact_tile_maxima, raw_tiles

    gen = _gen()
    rows, vocab = 3, 16_000
    # prompts of V / 8 tokens: a longer max_model_len
    penalty = penalty_state(rows + 1, vocab, gen, max_model_len=4_000, device=kernel_device)
    state = _random_state(rows + 1, vocab, gen, penalty)
    slots = torch.tensor([0, 2, 1], device=kernel_device)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    logits[1, 5_000] = float("nan")  # a NaN tile
    logits = logits.to(kernel_device)
    grammar = _random_grammar(rows, vocab, gen, kernel_device)
    # row 0 (slot 0): a stop id (min_tokens in force) that was its tile's max, a biased
    # token raised above its tile, and one that was its tile's max lowered below it: the
    # first and the last leave their tiles unknown, the second its tile's exact new max
    stop = int(state.stop_ids[0, 0])
    # bias entries 0 and 1 moved to tiles of their own: no stop id, no saturated token
    # (step 7 forgets its tile) and no other bias entry; at most 5 + 2 + 6 of the 16 tiles
    # are taken, so at least 3 are free
    listed = state.penalties.overflow_token.device[0].tolist()
    others = state.stop_ids[0].tolist() + listed + state.bias_ids[0, 2:].tolist()
    free = sorted(set(range(16)) - {t // 1024 for t in others if t >= 0})
    offset = int(torch.randint(0, vocab - 15 * 1024, (2,), generator=gen)[0])
    raised, lowered = free[0] * 1024 + offset, free[1] * 1024 + offset
    state.bias_ids[0, :2] = torch.tensor([raised, lowered], dtype=torch.int32)
    state.bias_values[0, :2] = torch.tensor([1e4, -2e4])
    state.min_tokens[0] = state.batch.num_generated.device[0] + 5
    # far above what the penalties can do (a repetition penalty of 0.1 multiplies another
    # token's positive logit by 10; a frequency penalty of 1.25 takes 500 off a planted one
    # counted 400 times): the planted tokens hold their tiles' maxima whatever the draw
    logits[0, stop] = 1e4
    logits[0, lowered] = 1e4
    planted = [(0, stop), (0, raised), (0, lowered), (1, 5_000)]  # the last: the NaN
    for r, token in planted:  # allowed in both bitmasks
        word, bit = divmod(token, 32)
        as_int32 = torch.tensor(1 << bit, dtype=torch.int64).to(torch.int32)  # bit 31 wraps
        grammar[r, word] |= as_int32.to(kernel_device)
        state.allowed[int(slots[r]), word] |= as_int32.to(kernel_device)
    args = (*state.kernel_args(), grammar, *state.penalty_args())
    got = torch.full_like(logits, float("nan"))
    tile_max = torch.full((rows, 16), float("nan"), device=kernel_device)
    raw = torch.full((rows, 16, 2), -7.0, device=kernel_device)
    arrivals = torch.zeros(rows, dtype=torch.int32, device=kernel_device) if row_sparse else None
    process_logits(logits, got, slots, *args, splits=splits, tile_max=tile_max, raw_tiles=raw,
                   arrivals=arrivals)  # fmt: skip
    want_raw = raw_tiles(logits.cpu())
    assert torch.equal(raw[..., 0].cpu(), want_raw[..., 0])
    assert bool(torch.isposinf(raw[1, 4, 0])) and bool(torch.isnan(raw[1, 4, 1]))
    torch.testing.assert_close(raw[..., 1].cpu(), want_raw[..., 1], rtol=1e-5, atol=0,
                               equal_nan=True)  # fmt: skip
    torch.testing.assert_close(got, _kernel(logits, slots, state, grammar), rtol=0, atol=0,
                               equal_nan=True)  # fmt: skip
    # the row before each sparse phase: no bias and no stop ids (the dense pass), then the
    # bias without the stop ids
    no_stop = dataclasses.replace(state, min_tokens=torch.zeros_like(state.min_tokens))
    no_bias = dataclasses.replace(no_stop, bias_values=torch.zeros_like(state.bias_values))
    phases = [_kernel(logits, slots, no_bias, grammar).cpu(),
              _kernel(logits, slots, no_stop, grammar).cpu(), got.cpu()]  # fmt: skip
    unknown = torch.zeros(rows, 16, dtype=torch.bool)
    for before, after in itertools.pairwise(phases):
        # a token at its tile's max that fell: its tile is unknown from then on
        at_max = before == exact_tile_maxima(before, 1024).repeat_interleave(1024, 1)[:, :vocab]
        fell = at_max & (after < before)
        unknown |= F.pad(fell, (0, 16 * 1024 - vocab)).view(rows, 16, 1024).any(-1)
    frequency = state.penalties.frequency.device.cpu()
    overflow_token = state.penalties.overflow_token.device.cpu()
    for r, s in enumerate(slots.tolist()):
        if frequency[s] != 0.0:
            listed = overflow_token[s, :-1]
            unknown[r, (listed[listed >= 0] // 1024).long()] = True
    want = torch.where(unknown, float("inf"), exact_tile_maxima(got.cpu(), 1024))
    assert torch.equal(tile_max.cpu(), want)
    assert int(torch.isfinite(want).sum()) >= 10  # most tiles exact, not all unknown
    assert bool(torch.isposinf(want[1, 4]))  # the NaN's tile
    # the planted tokens' tiles: the stop id's and the lowered one's unknown, the raised
    # one's its new value (finite, above the rest of its tile)
    assert bool(torch.isposinf(want[0, stop // 1024])) and bool(
        torch.isposinf(want[0, lowered // 1024])
    )
    assert float(want[0, raised // 1024]) == float(got[0, raised]) > 1e3


def test_skipped_excess_is_caught(kernel_device: torch.device) -> None:
    """A kernel that ignored the overflow entries (here: fed emptied tables, as a kernel
    without step 7 would read them) differs from the PyTorch backend exactly at the
    listed saturated tokens, so test_matches_torch_backend would catch it."""
    gen = _gen()
    state = _random_state(3, 1023, gen, device=kernel_device)
    _expose_first_saturated(state)
    slots = torch.tensor([0, 2, 1, 3], device=kernel_device)
    logits = (torch.randn(4, 1023, generator=gen) * 4).to(kernel_device)
    want = _torch_backend(logits, slots, state, None)
    p = state.penalties
    p.overflow_token.device.fill_(-1)
    p.overflow_excess.device.zero_()
    broken = _kernel(logits, slots, state, None)
    # on the host, beside the exact counts
    differ, slots = (broken != want).cpu(), slots.cpu()
    listed = torch.zeros_like(differ)
    listed[:, : state.full_counts.shape[1]] = (state.full_counts[slots] > SATURATED) & (
        p.frequency.device.cpu()[slots] != 0.0
    )[:, None]
    assert bool(differ[0].any())  # slot 0: a frequency penalty and saturated tokens
    assert bool((differ <= listed).all())


@pytest.mark.parametrize(("rows", "vocab"), [(3, 111), (2, 1023)], ids=["R3-V111", "R2-V1023"])
def test_matches_float64_reference(rows: int, vocab: int, kernel_device: torch.device) -> None:
    """A tolerance match (float32 charges 255 and the excess in two roundings), tight enough
    that the byte counts alone (a kernel without the excess) fail it."""
    gen = _gen()
    num_reqs = rows + 1
    state = _random_state(num_reqs, vocab, gen, device=kernel_device)
    slots = torch.tensor([0, *torch.randperm(num_reqs - 1, generator=gen)[: rows - 1].add(1)])
    slots = slots.to(kernel_device)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    grammar = torch.randint(-(2**31), 2**31 - 1, (rows, num_words(vocab)), generator=gen).int()
    grammar = grammar.to(kernel_device)
    _expose_first_saturated(state, grammar)
    got = _kernel(logits, slots, state, grammar).double().cpu().numpy()
    want = _float64_reference(logits, slots, state, grammar)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=2e-5)
    bytes_only = _float64_reference(
        logits, slots, state, grammar, state.full_counts.clamp(max=SATURATED)
    )
    assert not np.allclose(got[finite], bytes_only[finite], rtol=2e-6, atol=2e-5)


@pytest.mark.parametrize(("vocab", "splits"), [(111, 1), (3000, 3)], ids=["V111", "V3000-S3"])
def test_full_overflow_table(vocab: int, splits: int, kernel_device: torch.device) -> None:
    """Past max_model_len the table fills and a token saturates into the spare column, with
    no entry: the kernel still equals the PyTorch backend (the extra temperature pass, over
    each program's chunk when the row is split)."""
    gen = _gen()
    num_reqs = 2
    # max_model_len 300: E = 2 entries
    config = SamplerConfig(num_reqs, vocab, max_model_len=300)
    batch = BatchState(config, kernel_device)
    penalties = PenaltyState(config, batch)
    full_counts = torch.zeros(config.num_slots, vocab, dtype=torch.int64)
    hot = torch.randperm(vocab, generator=gen)[:8].view(num_reqs, 4).tolist()
    added = []
    for s in range(num_reqs):
        output = [hot[s][0]] * 255 + torch.randint(0, vocab, (40,), generator=gen).tolist()
        for t in output:
            full_counts[s, t] += 1
        params = SamplingParams(frequency_penalty=0.7 - s, repetition_penalty=1.2)
        added.append((s, params, [], output))
    batch.update(BatchUpdate(num_reqs, removed=[], added=added, moved=[]))
    # entry 1 fills the table; the third token saturates with no entry; the fourth stays low
    for j, times in ((1, 255), (2, 300), (3, 100)):
        for _ in range(times):
            commit_rows(batch, [hot[s][j] for s in range(num_reqs)], full_counts)
    assert bool((penalties.overflow_token.device[:num_reqs, :2] >= 0).all())
    state = _random_state(num_reqs, vocab, gen, (batch, penalties, full_counts))
    state.temperature[:num_reqs] = torch.tensor([1.3, 0.5], device=kernel_device)
    slots = torch.tensor([0, 1, 2], device=kernel_device)
    logits = (torch.randn(3, vocab, generator=gen) * 4).to(kernel_device)
    assert torch.equal(
        _kernel(logits, slots, state, None, splits), _torch_backend(logits, slots, state, None)
    )


@pytest.mark.parametrize("splits", [1, 2])
def test_sparse_tables_past_their_first_block(splits: int, kernel_device: torch.device) -> None:
    """Blocks of 2 entries: slot 0's 8 biases and 5 stop ids span 4 and 3 blocks, which
    the phases walk past their first (loaded with the others, before the phases): bit for
    bit the PyTorch backend. A bias table in the logit-bias stage's layout (the unused
    entries repeating the first, the block holding that repeat the last walked) gives the
    same logits as the same biases with unused entries of +0.0."""
    gen = _gen()
    rows, vocab = 3, 1023
    state = _random_state(rows + 1, vocab, gen, device=kernel_device)
    assert bool((state.bias_values[0] != 0).all())  # slot 0: a table full of biases
    state.min_tokens[0] = state.batch.num_generated.device[0] + 1  # its stop ids: all -inf
    slots = torch.tensor([0, 2, 1], device=kernel_device)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    args = (*state.kernel_args(), None, *state.penalty_args())

    def run(bias_ids: torch.Tensor, bias_values: torch.Tensor) -> torch.Tensor:
        got = torch.full_like(logits, float("nan"))
        launch_process_logits(
            logits, got, slots, bias_ids, bias_values, *args[2:], splits=splits, sparse_block=2
        )  # fmt: skip
        return got

    got = run(state.bias_ids, state.bias_values)
    assert torch.equal(got, _torch_backend(logits, slots, state, None))
    # slot 2: 5 biases (three blocks), then 3 repeats of its first entry
    ids, values = state.bias_ids.clone(), state.bias_values.clone()
    keys = torch.randperm(vocab, generator=gen)[:5].to(kernel_device)
    ids[2], values[2] = keys[0].int(), 0.0
    ids[2, :5], values[2, :5] = keys.int(), torch.randn(5, generator=gen).to(kernel_device) + 2
    repeated_ids, repeated_values = ids.clone(), values.clone()
    repeated_values[2, 5:] = values[2, 0]
    zero_padded = dataclasses.replace(state, bias_ids=ids, bias_values=values)
    got = run(ids, values)
    assert torch.equal(got, _torch_backend(logits, slots, zero_padded, None))
    assert torch.equal(run(repeated_ids, repeated_values), got)
    # unused (+0.0) entries padded with an id outside the row are never read as tokens
    ids[1, 1:], values[1, 1:] = -1, 0.0
    padded = dataclasses.replace(state, bias_ids=ids.clamp(min=0), bias_values=values)
    assert torch.equal(run(ids, values), _torch_backend(logits, slots, padded, None))


def test_deferred_rows_are_left_unwritten_and_flagged(kernel_device: torch.device) -> None:
    """With the defer tables, a row no step but its temperature changes is not written (its
    buffer row keeps its fill), deferred[r] = its divisor (1, or the temperature), and the
    same launch without them writes that row equal to its source over the divisor (IEEE
    division). Every other row is written without its temperature, deferred[r] = minus
    its divisor: over the divisor it equals the row without the tables, and so do all the
    tile maxima (the readers divide them). Each feature alone keeps a row written: a
    penalty, a bias, stop ids in force, an allowed list, a grammar; greedy, temperature 1
    and another temperature do not. Rows split over 3 programs: the first writes the flag,
    every one leaves its chunk. With the tables, a row with no allowed list and no grammar
    takes neither bitmask."""
    gen = _gen()
    splits = 3
    rows, vocab, tiles = 10, 5000, 5
    state = _random_state(rows, vocab, gen, device=kernel_device)
    pad = rows  # the padding slot: every feature off, greedy
    p = state.penalties
    plain_slots = list(range(2, rows))
    for s in plain_slots:  # every feature off; then each row below turns one back on
        p.repetition.device[s], p.frequency.device[s], p.presence.device[s] = 1.0, 0.0, 0.0
        state.bias_values[s] = 0.0
        state.min_tokens[s] = 0
        state.allowed[s] = -1
        state.temperature[s] = 1.0
    state.temperature[3] = 0.0  # greedy: still left as it is
    p.presence.device[4] = 0.5
    state.temperature[5] = 0.7
    state.bias_values[6, 0] = 0.25
    state.min_tokens[7] = int(state.batch.num_generated.device[7]) + 1
    state.allowed[8, 3] = 0
    # written rows at a temperature, which the readers then apply: row 0 (every feature
    # on), a penalty's, a bias's and a grammar's
    state.temperature[0], state.temperature[4] = 0.8, 1.7
    state.temperature[6], state.temperature[9] = 0.3, 0.0
    slots = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], device=kernel_device)
    slots[1] = pad  # slot 1 (a real bias on token 0) is not in the batch: row 1 is padding
    grammar = torch.full((rows, num_words(vocab)), -1, dtype=torch.int32, device=kernel_device)
    grammar_on = torch.zeros(rows, dtype=torch.bool, device=kernel_device)
    grammar[9, 7], grammar_on[9] = 5, True  # a grammar row
    restricted = (state.allowed != -1).any(1).to(torch.int32)
    biased = (state.bias_values != 0.0).any(1).to(torch.int32)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    args = (*state.kernel_args(), grammar, *state.penalty_args())
    runs = []
    for defer in (False, True):
        got = torch.full_like(logits, float("nan"))
        tile_max = torch.full((rows, tiles), -7.0, device=kernel_device)
        deferred = torch.full((rows,), 7.0, device=kernel_device)
        tables = dict(restricted=restricted, biased=biased, grammar_on=grammar_on)
        process_logits(
            logits, got, slots, *args, None, None, splits=splits, tile_max=tile_max,
            **(dict(tables, deferred=deferred) if defer else {}),
        )  # fmt: skip
        runs.append((got.cpu(), tile_max.cpu(), deferred.cpu()))
    (full, full_max, _), (got, got_max, deferred) = runs
    want = torch.tensor([-0.8, 1, 1, 1, -1.7, 0.7, -0.3, -1, -1, -1], dtype=torch.float32)
    assert torch.equal(deferred, want)
    divisor = deferred.abs()
    assert torch.equal(got_max / divisor[:, None], full_max)
    for r in range(rows):
        if deferred[r] > 0:
            assert bool(got[r].isnan().all()), r
            assert torch.equal(full[r], logits[r].cpu() / divisor[r]), r
        else:
            assert torch.equal(got[r] / divisor[r], full[r]), r
    # the temperature is the readers' alone: row 0's pre-temperature values are not its
    # processed ones (which a kernel that divided twice would read)
    assert not torch.equal(got[0], full[0])
    # The flags also gate the dense pass's bitmasks: a written row with neither an allowed
    # list nor a grammar (row 4, its penalty) takes neither table, so words the
    # stages never leave there (0: every token banned) change nothing; rows 8 and 9 (an
    # allowed list, a grammar) still read theirs
    state.allowed[4], grammar[4] = 0, 0
    args = (*state.kernel_args(), grammar, *state.penalty_args())
    got = torch.full_like(logits, float("nan"))
    tile_max = torch.full((rows, tiles), -7.0, device=kernel_device)
    process_logits(
        logits, got, slots, *args, None, None, splits=splits, tile_max=tile_max,
        restricted=restricted, biased=biased, grammar_on=grammar_on, deferred=deferred,
    )  # fmt: skip
    for r in (4, 8, 9):
        assert torch.equal(got[r].cpu() / divisor[r], full[r]), r
    assert torch.equal(tile_max.cpu() / divisor[:, None], full_max)


def test_unfiltered_random_rows_are_left_unread(kernel_device: torch.device) -> None:
    """On the fused path (the defer tables and the rows' records), a deferred random row
    that top-k, top-p and min_p leave uncut is not read: its tile maxima are all +inf
    (unknown: sampling's walk, their one reader, reads and reduces such a tile itself),
    where the launch without the records writes them exact. A greedy row, a row with top-k,
    top-p or min_p on, and every row of a launch that makes the raw tiles are read as
    before; the deferred divisors are the same. Rows split over 3 programs."""
    gen = _gen()
    rows, vocab, tiles = 6, 5000, 5
    state = _random_state(rows, vocab, gen, device=kernel_device)
    p = state.penalties
    for s in range(rows):  # every feature off: each row deferred
        p.repetition.device[s], p.frequency.device[s], p.presence.device[s] = 1.0, 0.0, 0.0
        state.bias_values[s] = 0.0
        state.min_tokens[s] = 0
        state.allowed[s] = -1
    state.temperature[:rows] = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 1.0])
    num_slots = state.min_tokens.shape[0]
    top_k = torch.full((num_slots,), -1, dtype=torch.int32)
    top_p, min_p = torch.ones(num_slots), torch.zeros(num_slots)
    top_k[3], top_p[4], min_p[5] = 5, 0.9, 0.1  # rows 0 and 1 uncut, row 2 greedy
    seeds = torch.randint(-(2**62), 2**62, (num_slots,), generator=gen)
    prompt_len = torch.randint(1, 10**6, (num_slots,), generator=gen)
    tables = [t.to(kernel_device) for t in (top_k, top_p, min_p, seeds, prompt_len)]
    records = dict(zip(("top_k", "top_p", "min_p", "seeds", "prompt_len"), tables, strict=True))
    slots = torch.arange(rows, device=kernel_device)
    zeros = torch.zeros(num_slots, dtype=torch.int32, device=kernel_device)
    flags = dict(restricted=zeros, biased=zeros,
                 grammar_on=torch.zeros(rows, dtype=torch.bool, device=kernel_device))  # fmt: skip
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    args = (*state.kernel_args(), None, *state.penalty_args())
    runs = []
    for resolve, raw in ((False, False), (True, False), (True, True)):
        got = torch.full_like(logits, float("nan"))
        tile_max = torch.full((rows, tiles), -7.0, device=kernel_device)
        deferred = torch.full((rows,), 7.0, device=kernel_device)
        keys = torch.empty(rows, 2, dtype=torch.int64, device=kernel_device)
        extra = dict(records, filters=torch.empty(rows, 4, device=kernel_device), keys=keys)
        process_logits(
            logits, got, slots, *args, None, None, splits=3, tile_max=tile_max,
            deferred=deferred, **flags, **(extra if resolve else {}),
            raw_tiles=torch.empty(rows, tiles, 2, device=kernel_device) if raw else None,
        )  # fmt: skip
        runs.append((tile_max.cpu(), deferred.cpu()))
    (exact, divisors), (fused, fused_divisors), (with_raw, raw_divisors) = runs
    assert torch.equal(divisors, torch.tensor([1.0, 0.7, 1.0, 1.3, 1.0, 1.0]))
    assert torch.equal(fused_divisors, divisors) and torch.equal(raw_divisors, divisors)
    assert bool(torch.isfinite(exact).all())
    assert bool(torch.isposinf(fused[:2]).all())
    assert torch.equal(fused[2:], exact[2:])
    assert torch.equal(with_raw, exact)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf
@pytest.mark.parametrize("splits", [1, 3])
def test_deferred_rows_take_their_tile_maxima_from_the_raw_tiles(
    splits: int, kernel_device: torch.device
) -> None:
    """With the defer tables and the raw tiles, a deferred row's dense pass is its raw tiles
    alone (`token_steps.raw_pass`): its tile maxima are the raw maxima, which are its maxima
    before the temperature, and both tables equal the launch without the defer tables (the
    tile maxima over the divisor), bit for bit, beside written rows whose pass is the
    usual one; a NaN tile's entries +inf, a +inf's and a -inf row's as the usual pass
    makes them; a last tile of 5,000 - 4 x 1,024 columns. The sums of exp within float32
    rounding of float64's (on a GPU a deferred row's reduction tree is not a written
    row's). Nothing of a deferred row is written."""
    from tile_maxima import raw_tiles

    gen = _gen()
    rows, vocab, tiles = 6, 5000, 5
    state = _random_state(rows, vocab, gen, device=kernel_device)
    p = state.penalties
    for s in range(2, rows):  # rows 0 and 1 keep every feature: written
        p.repetition.device[s], p.frequency.device[s], p.presence.device[s] = 1.0, 0.0, 0.0
        state.bias_values[s] = 0.0
        state.min_tokens[s] = 0
        state.allowed[s] = -1
    state.temperature[:rows] = torch.tensor([0.8, 1.0, 1.0, 0.7, 0.0, 1.3])
    logits = torch.randn(rows, vocab, generator=gen) * 4
    logits[2, 1500], logits[3, 4999] = float("nan"), float("inf")
    logits[4] = float("-inf")
    logits = logits.to(kernel_device)
    slots = torch.arange(rows, device=kernel_device)
    flags = dict(
        restricted=(state.allowed != -1).any(1).to(torch.int32),
        biased=(state.bias_values != 0.0).any(1).to(torch.int32),
        grammar_on=torch.zeros(rows, dtype=torch.bool, device=kernel_device),
    )
    args = (*state.kernel_args(), None, *state.penalty_args())
    runs = []
    for defer in (False, True):
        got = torch.full_like(logits, float("nan"))
        tile_max = torch.full((rows, tiles), -7.0, device=kernel_device)
        raw = torch.full((rows, tiles, 2), -7.0, device=kernel_device)
        deferred = torch.full((rows,), 7.0, device=kernel_device)
        process_logits(
            logits, got, slots, *args, None, None, splits=splits, tile_max=tile_max,
            raw_tiles=raw, **(dict(flags, deferred=deferred) if defer else {}),
        )  # fmt: skip
        runs.append((got.cpu(), tile_max.cpu(), raw.cpu(), deferred.cpu()))
    (_, full_max, full_raw, _), (got, got_max, got_raw, deferred) = runs
    assert torch.equal(deferred, torch.tensor([-0.8, -1.0, 1.0, 0.7, 1.0, 1.3]))
    assert torch.equal(got_raw[..., 0], full_raw[..., 0])
    assert torch.equal(got_max / deferred.abs()[:, None], full_max)
    want = raw_tiles(logits.cpu())
    assert torch.equal(got_raw[..., 0], want[..., 0])
    torch.testing.assert_close(got_raw[..., 1], want[..., 1], rtol=1e-5, atol=0, equal_nan=True)
    assert torch.equal(got_max[2:], got_raw[2:, :, 0])
    assert bool(torch.isposinf(got_max[2, 1])) and bool(torch.isposinf(got_max[3, 4]))
    assert bool(torch.isneginf(got_max[4]).all())
    assert bool(got[2:].isnan().all()) and not bool(got[:2].isnan().any())


def test_padding_slot_changes_nothing(kernel_device: torch.device) -> None:
    gen = _gen()
    state = _random_state(2, 333, gen, device=kernel_device)
    logits = torch.randn(4, 333, generator=gen).to(kernel_device)
    slots = torch.full((4,), 2, dtype=torch.int64, device=kernel_device)
    assert torch.equal(_kernel(logits, slots, state, None), logits)


def test_non_contiguous_row_stride(kernel_device: torch.device) -> None:
    gen = _gen()
    state = _random_state(3, 300, gen, device=kernel_device)
    base = torch.randn(6, 401, generator=gen).to(kernel_device)
    before = base.clone()
    logits = base[::2, :300]  # row stride 802, read only
    out_base = torch.full((3, 700), 7.0, device=kernel_device)
    out = out_base[:, 100:400]  # row stride 700
    slots = torch.tensor([0, 2, 1], device=kernel_device)
    want = _torch_backend(logits, slots, state, None)
    process_logits(logits, out, slots, *state.kernel_args(), None, *state.penalty_args())
    assert torch.equal(out, want)
    assert torch.equal(base, before)
    assert bool((out_base[:, :100] == 7.0).all() and (out_base[:, 400:] == 7.0).all())


def test_rejects_bad_input(kernel_device: torch.device) -> None:
    state = _random_state(1, 64, torch.Generator().manual_seed(0), device=kernel_device)
    logits = torch.randn(1, 64).to(kernel_device)
    out = torch.empty_like(logits)
    slots = torch.tensor([0], device=kernel_device)
    with pytest.raises(TypeError, match=r"counts must be torch\.uint8, got torch\.int32"):
        args = list(state.penalty_args())
        args[0] = args[0].int()
        process_logits(logits, out, slots, *state.kernel_args(), None, *args)
    with pytest.raises(ValueError, match=r"grammar must have shape \[1, 2\], got \(2, 2\)"):
        grammar = torch.zeros(2, 2, dtype=torch.int32, device=kernel_device)
        process_logits(logits, out, slots, *state.kernel_args(), grammar, *state.penalty_args())
    with pytest.raises(ValueError, match=r"overflow_token must have E \+ 1 >= 2 columns, got 1"):
        args = list(state.penalty_args())
        args[1], args[2] = args[1][:, :1].contiguous(), args[2][:, :1].contiguous()
        process_logits(logits, out, slots, *state.kernel_args(), None, *args)
    with pytest.raises(TypeError, match=r"source must be float32, float16 or bfloat16"):
        process_logits(logits.double(), out, slots, *state.kernel_args(), None, *args)
    with pytest.raises(ValueError, match=r"source must be \[1, 64\] with unit column stride"):
        process_logits(logits[:, :32], out, slots, *state.kernel_args(), None, *args)


def test_opcheck(kernel_device: torch.device) -> None:
    gen = _gen()
    state = _random_state(3, 129, gen, device=kernel_device)
    logits = torch.randn(3, 129, generator=gen).to(kernel_device)
    slots = torch.tensor([3, 0, 1], device=kernel_device)
    grammar = torch.full((3, num_words(129)), -1, dtype=torch.int32, device=kernel_device)
    for g in (grammar, None):
        torch.library.opcheck(
            process_logits,
            (
                logits,
                torch.empty_like(logits),
                slots,
                *state.kernel_args(),
                g,
                *state.penalty_args(),
            ),
        )


def test_resolved_rows_hold_their_slots_parameters(kernel_device: torch.device) -> None:
    """With the slot tables of the kernels after it, processing writes each row's records
    (kernels/row_params.py) from its slot: filters (k, 0 where top-k is off at <= 0 or >= V,
    top_p, min_p, temperature) and keys (seed, prompt_len + num_generated), once a row with
    rows split over 3 programs, a padding row and a slot used twice included; the logits and
    the tile table are those of the launch without them."""
    gen = _gen()
    rows, vocab = 6, 5000
    state = _random_state(rows, vocab, gen, device=kernel_device)
    num_slots = state.min_tokens.shape[0]
    top_k = torch.randint(-3, vocab + 3, (num_slots,), generator=gen, dtype=torch.int32)
    top_k[:3] = torch.tensor([0, vocab, vocab - 1], dtype=torch.int32)  # off, off, on
    top_p, min_p = torch.rand(num_slots, generator=gen), torch.rand(num_slots, generator=gen)
    seeds = torch.randint(-(2**62), 2**62, (num_slots,), generator=gen)
    prompt_len = torch.randint(1, 10**6, (num_slots,), generator=gen)
    tables = [t.to(kernel_device) for t in (top_k, top_p, min_p, seeds, prompt_len)]
    slots = torch.tensor([2, 0, 1, rows, 4, 2], device=kernel_device)  # padding; 2 twice
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(kernel_device)
    args = (*state.kernel_args(), None, *state.penalty_args())
    runs = []
    for resolve in (False, True):
        got = torch.full_like(logits, float("nan"))
        tile_max = torch.full((rows, 5), -7.0, device=kernel_device)
        filters = torch.full((rows, 4), float("nan"), device=kernel_device)
        keys = torch.full((rows, 2), -7, dtype=torch.int64, device=kernel_device)
        records = dict(zip(("top_k", "top_p", "min_p", "seeds", "prompt_len"), tables, strict=True))
        process_logits(
            logits, got, slots, *args, None, None, splits=3, tile_max=tile_max,
            **(dict(records, filters=filters, keys=keys) if resolve else {}),
        )  # fmt: skip
        runs.append((got.cpu(), tile_max.cpu(), filters.cpu(), keys.cpu()))
    (plain, plain_max, _, _), (got, got_max, filters, keys) = runs
    assert torch.equal(got, plain) and torch.equal(got_max, plain_max)
    s = slots.cpu()
    k = torch.where((top_k[s] > 0) & (top_k[s] < vocab), top_k[s], 0).to(torch.float32)
    temperature = state.temperature.cpu()[s]
    assert torch.equal(filters, torch.stack([k, top_p[s], min_p[s], temperature], dim=1))
    position = prompt_len[s] + state.batch.num_generated.device.cpu()[s].to(torch.int64)
    assert torch.equal(keys, torch.stack([seeds[s], position], dim=1))
    with pytest.raises(ValueError, match="come together"):
        process_logits(logits, got, slots, *args, None, None, top_k=tables[0])
