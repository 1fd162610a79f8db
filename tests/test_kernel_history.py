"""The commit kernel (on `kernel_device`: interpreted on CPU, compiled on CUDA) against the
PyTorch commit, `BatchState.commit` with the package's PenaltyState and BadWordsState: every
state tensor equal, step after step."""

from __future__ import annotations

import pytest
import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.kernels.history import commit_history
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.stages.bad_words import BadWordsState
from graphsafe_sampler.stages.penalties import SATURATED, PenaltyState

# max_model_len 1100: E = 5 overflow entries; a ring of 5 recent tokens
MAX_MODEL_LEN, WINDOW = 1100, 5


def _gen() -> torch.Generator:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


class History:
    """A BatchState with the two slot states whose history the commit advances, on
    `device`."""

    def __init__(self, max_num_reqs: int, vocab: int, device: torch.device | str = "cpu") -> None:
        config = SamplerConfig(
            max_num_reqs, vocab, max_model_len=MAX_MODEL_LEN, max_bad_word_len=WINDOW
        )
        self.batch = BatchState(config, device)
        self.penalties = PenaltyState(config, self.batch)
        self.bad_words = BadWordsState(config, self.batch)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every state tensor, host and device sides."""
        return {
            **self.batch.state_tensors(),
            **self.penalties.state_tensors(),
            **self.bad_words.state_tensors(),
        }

    def kernel_commit(self, token_ids: torch.Tensor, keep: torch.Tensor | None) -> None:
        p = self.penalties
        commit_history(
            self.batch.slots(token_ids.shape[0]), token_ids, keep,
            self.batch.num_generated.device, p.counts, p.output_words,
            p.overflow_token.device, p.overflow_excess.device, self.bad_words.window.device,
            self.batch.padding_slot,
        )  # fmt: skip


def _assert_commits_agree(history: History, token_ids: torch.Tensor, keep: torch.Tensor) -> None:
    """Commit through PyTorch, then from the same state through the kernel: all equal."""
    tensors = history.tensors()
    before = {name: t.clone() for name, t in tensors.items()}
    history.batch.commit(token_ids, keep)
    want = {name: t.clone() for name, t in tensors.items()}
    for name, t in tensors.items():
        t.copy_(before[name])
    history.kernel_commit(token_ids, keep)
    for name, t in tensors.items():
        assert torch.equal(t, want[name]), name


def _request(vocab: int, gen: torch.Generator) -> tuple[SamplingParams, list[int], list[int]]:
    """Resumed outputs with three tokens just under 255 and one past it (an entry at add)."""
    hot = torch.randperm(vocab, generator=gen)[:4].tolist()
    output = [hot[3]] * int(torch.randint(255, 270, (1,), generator=gen))
    for t in hot[:3]:
        output += [t] * int(torch.randint(246, 255, (1,), generator=gen))
    output += torch.randint(0, vocab, (20,), generator=gen).tolist()
    order = torch.randperm(len(output), generator=gen).tolist()
    return SamplingParams(frequency_penalty=0.5), [], [output[i] for i in order]


@pytest.mark.parametrize("vocab", [111, 1023], ids=["V111", "V1023"])
def test_matches_torch_commit_over_random_steps(vocab: int, kernel_device: torch.device) -> None:
    gen = _gen()
    max_num_reqs, batch_size, num_steps = 6, 5, 60
    history = History(max_num_reqs, vocab, kernel_device)
    hot: dict[int, list[int]] = {}  # row -> tokens it commits most

    def add(row: int) -> tuple[int, SamplingParams, list[int], list[int]]:
        params, prompt, output = _request(vocab, gen)
        counts = torch.bincount(torch.tensor(output), minlength=vocab)
        hot[row] = (
            counts.topk(4).indices.tolist() + torch.randint(0, vocab, (1,), generator=gen).tolist()
        )
        return row, params, prompt, output

    history.batch.update(BatchUpdate(batch_size, [], [add(r) for r in range(batch_size)], []))
    for step in range(num_steps):
        if step % 15 == 14:  # a request leaves and a new one takes its row (a new slot)
            row = int(torch.randint(0, batch_size, (1,), generator=gen))
            history.batch.update(BatchUpdate(batch_size, [row], [add(row)], []))
        num_rows = int(torch.randint(batch_size, max_num_reqs + 1, (1,), generator=gen))
        pick = torch.randint(0, 5, (num_rows,), generator=gen).tolist()
        token_ids = torch.tensor(
            [hot[r][pick[r]] if r in hot else pick[r] for r in range(num_rows)],
            device=kernel_device,
        )
        keep = (torch.rand(num_rows, generator=gen) < 0.85).to(kernel_device)
        _assert_commits_agree(history, token_ids, keep)
    # the steps took tokens past 255 on the device, so entries were taken and extended
    p = history.penalties
    assert int((p.overflow_token.device[:, :-1] >= 0).sum()) > batch_size
    assert int(p.overflow_excess.device.sum()) > 0


def test_matches_torch_commit_on_full_and_odd_tables(kernel_device: torch.device) -> None:
    """Crafted states the engine reaches only past max_model_len (or not at all): full
    tables (a saturation lands in the spare), saturated tokens without an entry, counts at
    254 and 255 everywhere the commits go."""
    gen = _gen()
    vocab, max_num_reqs = 37, 7
    history = History(max_num_reqs, vocab, kernel_device)
    added = [(r, *_request(vocab, gen)) for r in range(max_num_reqs)]
    history.batch.update(BatchUpdate(max_num_reqs, [], added, []))
    p = history.penalties
    capacity = p.overflow_token.device.shape[1] - 1
    for _ in range(10):
        # token 0 among them: an entry holding it is used (only -1 is unused). Drawn on the
        # host, written to the device tables.
        hot = torch.cat(
            [torch.zeros(1, dtype=torch.int64), torch.randperm(vocab - 1, generator=gen)[:7] + 1]
        )
        p.counts[:, hot.to(kernel_device)] = (
            torch.randint(SATURATED - 2, SATURATED + 1, (p.counts.shape[0], 8), generator=gen)
            .to(torch.uint8)
            .to(kernel_device)
        )
        for s in range(max_num_reqs):
            used = int(torch.randint(0, capacity + 1, (1,), generator=gen))
            table = torch.full((capacity + 1,), -1, dtype=torch.int32)
            table[:used] = hot[torch.randperm(8, generator=gen)[:used]].int()
            table[capacity] = int(torch.randint(-1, 2, (1,), generator=gen))  # spare: -1 or not
            p.overflow_token.device[s] = table.to(kernel_device)
            excess = torch.randint(0, 50, (capacity + 1,), generator=gen)
            p.overflow_excess.device[s] = excess.to(kernel_device)
        token_ids = hot[torch.randint(0, 8, (max_num_reqs,), generator=gen)].to(kernel_device)
        keep = (torch.rand(max_num_reqs, generator=gen) < 0.8).to(kernel_device)
        _assert_commits_agree(history, token_ids, keep)


def test_rejects_bad_input(kernel_device: torch.device) -> None:
    history = History(2, 50, kernel_device)
    history.batch.update(BatchUpdate(1, [], [(0, SamplingParams(), [], [1, 2])], []))
    with pytest.raises(TypeError, match=r"keep must be torch\.bool, got torch\.int64"):
        history.kernel_commit(
            torch.tensor([3], device=kernel_device), torch.tensor([1], device=kernel_device)
        )
    with pytest.raises(ValueError, match=r"padding_slot = 3 is outside the slots \[0, 3\)"):
        p = history.penalties
        commit_history(
            torch.tensor([0], device=kernel_device), torch.tensor([3], device=kernel_device),
            torch.tensor([True], device=kernel_device),
            history.batch.num_generated.device, p.counts, p.output_words,
            p.overflow_token.device, p.overflow_excess.device, history.bad_words.window.device, 3,
        )  # fmt: skip


def test_opcheck(kernel_device: torch.device) -> None:
    gen = _gen()
    history = History(4, 64, kernel_device)
    added = [(r, *_request(64, gen)) for r in range(3)]
    history.batch.update(BatchUpdate(3, [], added, []))
    p = history.penalties
    torch.library.opcheck(
        commit_history,
        (
            history.batch.slots(4), torch.tensor([5, 9, 5, 1], device=kernel_device),
            torch.tensor([True, False, True, True], device=kernel_device),
            history.batch.num_generated.device.clone(),
            p.counts.clone(), p.output_words.clone(), p.overflow_token.device.clone(),
            p.overflow_excess.device.clone(), history.bad_words.window.device.clone(),
            history.batch.padding_slot,
        ),
    )  # fmt: skip


@pytest.mark.parametrize("splits", [1, 3], ids=["whole", "split"])
@pytest.mark.parametrize("by_slot", [True, False], ids=["by_slot", "positions"])
def test_sample_and_commit_equals_sample_then_commit(
    splits: int, by_slot: bool, kernel_device: torch.device
) -> None:
    """`sample_and_commit` (the commit made by the unsplit sampling program, or by a split
    row's last program) against `sample_tokens` then `commit_history` from the same state, step
    after step: the same tokens, every state tensor equal. Positions by slot (read before
    the same kernel advances num_generated) or given; a cut, a commit mask, greedy and
    random rows; the logits favour each row's hot tokens, so the commits saturate bytes and
    take overflow entries."""
    from graphsafe_sampler.kernels.sampling import sample_and_commit, sample_tokens

    gen = _gen()
    vocab, max_num_reqs, num_rows = 3000, 6, 5  # 3 tiles of 1,024: up to 3 programs a row
    history = History(max_num_reqs, vocab, kernel_device)
    added = [(r, *_request(vocab, gen)) for r in range(num_rows)]
    history.batch.update(BatchUpdate(num_rows, [], added, []))
    p, device = history.penalties, kernel_device
    num_slots = history.batch.padding_slot + 1
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.0, 2.0, 0.0][:num_slots], device=device)
    seeds = torch.randint(0, 2**62, (num_slots,), generator=gen).to(device)
    prompt_len = torch.randint(0, 50, (num_slots,), generator=gen).to(device)
    slots = history.batch.slots(num_rows + 1)  # and one padding row, which never commits
    # each slot's most counted tokens: three just under 255, one past it (`_request`); the
    # three set to 254, so that a random row's first commit of one saturates it
    hot = [p.counts[int(s)].cpu().long().topk(4).indices for s in slots]
    for s, ids in zip(slots.tolist()[:num_rows], hot, strict=False):  # not the padding
        near = ids[p.counts[s, ids.to(device)].cpu() < SATURATED]
        p.counts[s, near.to(device)] = SATURATED - 1
    tensors = history.tensors()
    arrivals = torch.zeros(num_rows + 1, dtype=torch.int32, device=device)  # the pipeline's
    for step in range(12):
        logits = torch.randn(num_rows + 1, vocab, generator=gen) * 2
        for r, ids in enumerate(hot):
            logits[r, ids] += 12.0
        logits = logits.to(device)
        cut = torch.full((num_rows + 1,), -3.0, device=device)
        keep = (torch.rand(num_rows + 1, generator=gen) < 0.8).to(device) if step % 2 else None
        positions = None if by_slot else torch.randint(0, 2**40, (num_rows + 1,), generator=gen)
        positions = positions.to(device) if positions is not None else None
        common = (logits, slots, temperature, seeds, positions, cut)
        generated = history.batch.num_generated.device
        per_slot = (prompt_len, generated) if by_slot else (None, None)
        before = {name: t.clone() for name, t in tensors.items()}
        want_tokens = torch.empty(num_rows + 1, dtype=torch.int32, device=device)
        sample_tokens(*common, want_tokens, 0, *per_slot, splits)
        history.kernel_commit(want_tokens, keep)
        want = {name: t.clone() for name, t in tensors.items()}
        for name, t in tensors.items():
            t.copy_(before[name])
        tokens = torch.empty_like(want_tokens)
        sample_and_commit(
            *common, tokens, 0, per_slot[0], generated, splits, None, keep, p.counts,
            p.output_words, p.overflow_token.device, p.overflow_excess.device,
            history.bad_words.window.device, history.batch.padding_slot, arrivals,
        )  # fmt: skip
        assert not arrivals.any(), (step, arrivals.tolist())  # left 0 for the next step
        assert torch.equal(tokens, want_tokens), step
        for name, t in tensors.items():
            assert torch.equal(t, want[name]), (step, name)
    assert int((p.overflow_token.device[:, :-1] >= 0).sum()) > num_rows  # entries were taken


def test_sample_and_commit_opcheck_and_bad_input(kernel_device: torch.device) -> None:
    from graphsafe_sampler.kernels.sampling import sample_and_commit

    gen = _gen()
    history = History(4, 64, kernel_device)
    added = [(r, *_request(64, gen)) for r in range(3)]
    history.batch.update(BatchUpdate(3, [], added, []))
    p, device = history.penalties, kernel_device
    num_slots = history.batch.padding_slot + 1
    logits = torch.randn(4, 64, generator=gen).to(device)
    args = (
        logits, history.batch.slots(4), torch.full((num_slots,), 0.8, device=device),
        torch.arange(num_slots, device=device), None, None,
        torch.empty(4, dtype=torch.int32, device=device), 0,
        torch.zeros(num_slots, dtype=torch.int64, device=device),
    )  # fmt: skip
    tables = (
        history.batch.num_generated.device.clone(), 1, None,
        torch.tensor([True, False, True, True], device=device), p.counts.clone(),
        p.output_words.clone(), p.overflow_token.device.clone(),
        p.overflow_excess.device.clone(), history.bad_words.window.device.clone(),
        history.batch.padding_slot,
    )  # fmt: skip
    torch.library.opcheck(sample_and_commit, (*args, *tables))
    with pytest.raises(TypeError, match=r"keep must be torch\.bool, got torch\.int64"):
        sample_and_commit(*args, *tables[:3], torch.ones(4, dtype=torch.int64), *tables[4:])
    with pytest.raises(ValueError, match=r"padding_slot = 9 is outside"):
        sample_and_commit(*args, *tables[:-1], 9)
    with pytest.raises(ValueError, match=r"counts must have 64 columns \(the vocabulary\), got 63"):
        sample_and_commit(*args, *tables[:4], p.counts[:, :63].contiguous(), *tables[5:])
