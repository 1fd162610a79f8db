"""Penalty state: byte counts that saturate at 255 plus the overflow table stay exact for any
output length up to max_model_len, at under half of vLLM's int32 counts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from graphsafe_sampler import BatchUpdate, Sampler, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.stages.penalties import SATURATED, PenaltyState, overflow_capacity


def _state(num_reqs: int, vocab: int, max_model_len: int = 4096) -> tuple[BatchState, PenaltyState]:
    config = SamplerConfig(num_reqs, vocab, max_model_len=max_model_len, seed=0)
    batch = BatchState(config, "cpu")
    return batch, PenaltyState(config, batch)


def _full_counts(state: PenaltyState, slot: int) -> np.ndarray:
    """[V] int64 exact counts rebuilt from the byte counts and the overflow table; the
    output words mark exactly the 32-token words holding a token counted, and no bit past
    the last word."""
    counts = state.counts[slot].long().numpy().copy()
    held = state.output_words[slot].numpy().view(np.uint32)
    marked = ((held[:, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(-1)
    words = -(-counts.shape[0] // 32)
    padded = np.zeros(words * 32, dtype=bool)
    padded[: counts.shape[0]] = counts > 0
    np.testing.assert_array_equal(marked[:words], padded.reshape(words, 32).any(-1))
    assert not marked[words:].any()
    tokens = state.overflow_token.device[slot, : state.capacity].numpy()
    excess = state.overflow_excess.device[slot, : state.capacity].numpy()
    used = tokens >= 0
    assert len(set(tokens[used].tolist())) == used.sum(), "a token holds two entries"
    assert (counts[tokens[used]] == SATURATED).all(), "an entry for an unsaturated token"
    counts[tokens[used]] += excess[used]
    return counts


def _penalised_reference(
    logits: np.ndarray, counts: np.ndarray, prompt: set[int], rep: float, freq: float, pres: float
) -> np.ndarray:
    out = logits.astype(np.float64).copy()
    seen = counts > 0
    seen[list(prompt)] = True
    out[seen] = np.where(out[seen] > 0, out[seen] / rep, out[seen] * rep)
    return out - freq * counts - pres * (counts > 0)


def test_counts_stay_exact_past_saturation() -> None:
    vocab, rows = 37, 5
    batch, state = _state(rows, vocab, max_model_len=2000)
    rng = np.random.default_rng()
    batch.update(BatchUpdate(rows, [], [(r, SP(), None, []) for r in range(rows)], []))
    want = [Counter() for _ in range(rows)]
    # Few distinct tokens a row, so that several of them pass 255 within ~1,500 commits.
    vocab_of_row = [rng.choice(vocab, size=2 + r, replace=False) for r in range(rows)]
    slots = batch.slots(rows)
    for _step in range(1500):
        tokens = torch.tensor([int(rng.choice(v)) for v in vocab_of_row])
        keep = torch.from_numpy(rng.random(rows) < 0.9)
        batch.commit(tokens, keep)
        for r in range(rows):
            if keep[r]:
                want[r][int(tokens[r])] += 1
    assert max(n for c in want for n in c.values()) > 2 * SATURATED, (
        "no token went far past saturation"
    )
    for r in range(rows):
        expected = np.zeros(vocab, dtype=np.int64)
        for token, n in want[r].items():
            expected[token] = n
        np.testing.assert_array_equal(_full_counts(state, int(slots[r])), expected)


def test_frequency_penalty_charges_the_exact_count() -> None:
    vocab = 29
    batch, state = _state(2, vocab, max_model_len=4096)
    params = SP(repetition_penalty=1.3, frequency_penalty=0.25, presence_penalty=0.5)
    prompt = [1, 2, 3]
    rng = np.random.default_rng()
    outputs = rng.choice([4, 5, 6], size=900).tolist()  # each about 300 times: saturated
    outputs += [7] * 254  # one short of saturation
    batch.update(BatchUpdate(2, [], [(0, params, prompt, outputs), (1, SP(), None, [])], []))
    for _ in range(3):  # 7 saturates inside the graph-safe commit; 4 grows
        batch.commit(torch.tensor([7, 8]), torch.tensor([True, True]))
        batch.commit(torch.tensor([4, 8]), torch.tensor([True, True]))
    counts = Counter(outputs) + Counter({7: 3, 4: 3})
    expected_counts = np.zeros(vocab, dtype=np.int64)
    for token, n in counts.items():
        expected_counts[token] = n
    logits = torch.from_numpy(rng.normal(0, 3, size=(2, vocab)).astype(np.float32))
    got = state.apply(logits.clone(), batch.slots(2))
    want = _penalised_reference(logits[0].numpy(), expected_counts, set(prompt), 1.3, 0.25, 0.5)
    np.testing.assert_allclose(got[0].double().numpy(), want, rtol=1e-5, atol=1e-3)
    # Row 1 counted token 8 six times and has no penalties: unchanged.
    torch.testing.assert_close(got[1], logits[1])


def test_in_step_extra_tokens_count_as_output() -> None:
    vocab = 23
    batch, state = _state(3, vocab)
    params = SP(repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.3)
    batch.update(BatchUpdate(3, [], [(r, params, [0], [r + 1]) for r in range(3)], []))
    rng = np.random.default_rng()
    logits = torch.from_numpy(rng.normal(0, 2, size=(3, vocab)).astype(np.float32))
    extra = torch.from_numpy(rng.integers(0, vocab, size=(3, 4)))
    mask = torch.from_numpy(rng.random((3, 4)) < 0.7)
    got = state.apply(logits.clone(), batch.slots(3), extra, mask)
    for r in range(3):
        counts = np.zeros(vocab, dtype=np.int64)
        counts[r + 1] += 1
        np.add.at(counts, extra[r][mask[r]].numpy(), 1)
        want = _penalised_reference(logits[r].numpy(), counts, {0}, 1.5, 0.4, 0.3)
        np.testing.assert_allclose(got[r].double().numpy(), want, rtol=1e-5, atol=1e-5)


def test_request_longer_than_max_model_len_is_rejected_unchanged() -> None:
    config = SamplerConfig(4, 50, max_model_len=100, seed=0)
    sampler = Sampler(config, "cpu")
    sampler.update_state(BatchUpdate(1, [], [(0, SP(), [1] * 40, [2] * 60)], []))  # exactly 100
    before = {k: v.clone() for k, v in sampler.state_tensors().items()}
    with pytest.raises(ValueError, match="max_model_len = 100"):
        sampler.update_state(BatchUpdate(2, [], [(1, SP(), [1] * 41, [2] * 60)], []))
    for name, tensor in sampler.state_tensors().items():
        assert torch.equal(tensor, before[name]), name


def test_resumed_request_replaces_the_slot_history() -> None:
    vocab = 31
    batch, state = _state(1, vocab, max_model_len=3000)
    batch.update(BatchUpdate(1, [], [(0, SP(), None, [5] * 700)], []))
    slot = int(batch.slots(1)[0])
    assert _full_counts(state, slot)[5] == 700
    # The request leaves; a new one resumes with other outputs in the same slot.
    outputs = [9] * 300 + [3] * 12
    batch.update(BatchUpdate(1, [0], [(0, SP(), None, outputs)], []))
    expected = np.zeros(vocab, dtype=np.int64)
    expected[9], expected[3] = 300, 12
    np.testing.assert_array_equal(_full_counts(state, int(batch.slots(1)[0])), expected)


def test_resumed_and_committed_outputs_mark_their_words() -> None:
    """At a vocabulary of several int32s of output words (5,000 tokens: 157 words), resumed
    outputs in many words, several to a word and some in the last, and commits of new
    tokens: the words' bits are exactly the words holding a count (`_full_counts`), and a
    slot's resume clears the last request's."""
    vocab, rng = 5000, np.random.default_rng()
    batch, state = _state(2, vocab)
    resumed = [*rng.choice(vocab, size=300, replace=False).tolist(), 4999, 4990, 4991]
    batch.update(BatchUpdate(2, [], [(0, SP(), None, resumed * 2), (1, SP(), None, [7])], []))
    for _ in range(5):
        batch.commit(torch.from_numpy(rng.integers(0, vocab, size=2)))
    for slot in batch.slots(2).tolist():
        _full_counts(state, int(slot))
    batch.update(BatchUpdate(2, [0], [(0, SP(), None, [33, 34, 1030])], []))
    counts = _full_counts(state, int(batch.slots(2)[0]))
    assert counts.nonzero()[0].tolist() == [33, 34, 1030]


def test_state_is_under_half_of_int32_counts() -> None:
    """The penalty state stays under half of vLLM's int32 counts, at vocab 151,936 and 1,024
    slots (device bytes per slot)."""
    vocab = 151_936
    config = SamplerConfig(8, vocab)
    batch = BatchState(config, "cpu")
    state = PenaltyState(config, batch)
    per_slot = (
        sum(t.nbytes for name, t in state.state_tensors().items() if not name.endswith(".host"))
        / config.num_slots
    )
    vllm_counts = 4 * vocab  # int32 output counts per request
    assert overflow_capacity(config) * SATURATED >= config.max_model_len
    assert per_slot <= 0.5 * vllm_counts, per_slot / vllm_counts
