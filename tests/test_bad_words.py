"""Bad words (docs/design.md §4 step 2, graphsafe_sampler/stages/bad_words.py): a word w of n
tokens bans w[n-1] when the request's last n-1 output tokens equal w[:n-1]; a one-token word
is always banned; at a speculative position the drafts before it count as output.

On both backends (tests/backends.py; the Triton backend bans in `process_logits`, and
`forward` advances the ring of recent outputs in its commit kernel, `commit_tokens` through
the stages' PyTorch commit, as on the PyTorch backend): against the host reference
(`graphsafe_sampler.testing.reference.bad_words`) over churning batches, plain and
speculative; edge cases by hand (one-token words, a word longer than the history, the ring
wrapping past `max_bad_word_len`, a token banned by two words, resumed requests); the token
capacity filled; the kernel's blocked scan against the stage's scatter. The speculative form
beside min_tokens and penalties, by hand:
test_rejection_sampler.py::test_drafts_before_a_position_count_as_output.

Fresh random inputs each run, the seed printed (shown on failure: rerun with it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from backends import BACKENDS, backend_device, interpreted

from graphsafe_sampler import BatchUpdate, RejectionSampler, Sampler, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.testing import BatchDriver, DriverRequest, reference

V = 53
L = 3  # max_bad_word_len: the ring of recent outputs wraps every 3 tokens
S = 2  # speculative drafts per step
ROWS = 6
MIN_MULTI = 10  # bans by words of 2+ tokens a churn test must see (fewer than 19 in none of
# 1,000 runs at the interpreter's step counts)


def _fresh_seed() -> int:
    seed = int(np.random.default_rng().integers(2**31))
    print(f"seed {seed}")  # fresh inputs each run; shown on failure: rerun with it
    return seed


def _config(backend: str, **overrides: object) -> SamplerConfig:
    settings: dict[str, object] = dict(
        max_num_reqs=ROWS, vocab_size=V, max_bad_word_len=L, max_bad_words=4,
        max_bad_words_tokens=10, seed=0,
    )  # fmt: skip
    settings.update(overrides)
    return SamplerConfig(backend=backend, **settings)  # type: ignore[arg-type]


def _banned(
    sampler: Sampler,
    logits: torch.Tensor,  # [rows, V], or [rows * (S + 1), V] with `rejection`
    rejection: RejectionSampler | None = None,
    drafts: torch.Tensor | None = None,  # [rows, S]
) -> list[set[int]]:
    """Each logits row's -inf tokens after the backend's pipeline (steps 2-8; the requests
    here set nothing else that masks). With `drafts`, flattened row r * (S + 1) + j is batch
    row r after its first j drafts, as `RejectionSampler` lays a step out."""
    device = sampler.device
    num = logits.shape[0]
    if drafts is None:
        slots = sampler.batch_state.slots(num)
        grammar = sampler.stages.grammar.bitmask_rows(num)
        flat_drafts = preceding = None
    else:
        assert rejection is not None
        rows = drafts.shape[0]
        slots = sampler.batch_state.slots(rows).repeat_interleave(S + 1)
        grammar = rejection.grammar.bitmask_rows(num)
        flat_drafts = drafts.to(device).repeat_interleave(S + 1, dim=0)
        preceding = torch.arange(S + 1, device=device).repeat(rows)
    x = logits.to(device, torch.float32, copy=True)
    processed = sampler.pipeline.process(x, slots, grammar, flat_drafts, preceding)
    return [set(row.nonzero().flatten().tolist()) for row in processed.logits.isneginf().cpu()]


def _banned_by_reference(req: DriverRequest | None, prefix: Sequence[int] = ()) -> set[int]:
    """The reference's banned tokens for `req` after its outputs, then `prefix`."""
    if req is None:
        return set()
    view = DriverRequest(req.params, req.prompt_tok_ids, [*req.output_tok_ids, *prefix])
    return set(np.flatnonzero(np.isneginf(reference.bad_words(np.ones(V), view))).tolist())


def _one_token_bans(req: DriverRequest | None) -> set[int]:
    words = (req.params.bad_words_token_ids or []) if req is not None else []
    return {w[0] for w in words if len(w) == 1}


# ----------------------------------------------------------------- reference under churn


class _WordDriver(BatchDriver):
    """Random churn over an almost full batch of requests whose words are drawn from a
    small alphabet (one-token words from the whole vocabulary), some resumed with outputs
    from that alphabet, as often longer than the ring as not. The alphabet holds token 0,
    the value the ring starts filled with: a word may not match that fill."""

    def __init__(self, config: SamplerConfig, alphabet: list[int], seed: int) -> None:
        def make_params(rng: random.Random, config: SamplerConfig) -> SP:
            words: list[list[int]] = []
            budget = config.max_bad_words_tokens
            for _ in range(rng.randint(0 if rng.random() < 0.1 else 1, config.max_bad_words)):
                n = rng.choice([1, 2, 2, 3, 3, 3])
                if n > budget:
                    break
                pool = range(V) if n == 1 else alphabet
                words.append([rng.choice(pool) for _ in range(n)])
                budget -= n
            temperature = 0.0 if rng.random() < 0.3 else rng.uniform(0.5, 1.5)
            return SP(temperature=temperature, seed=rng.randrange(2**31),
                      bad_words_token_ids=words or None)  # fmt: skip

        def joins(driver: BatchDriver, free: list[int]) -> list[int]:
            # Every free row, but one left empty half the time: holes to condense, padding.
            if free and driver.rng.random() < 0.5:
                return [r for r in free if r != driver.rng.choice(free)]
            return free

        super().__init__(config, seed=seed, make_params=make_params, churn=0.2, joins=joins)
        self.alphabet = alphabet

    def new_request(self) -> DriverRequest:
        req = super().new_request()
        n = self.rng.choice([0, 0, 1, 2, L + 1, 2 * L + 2])
        req.output_tok_ids = [self.rng.choice(self.alphabet) for _ in range(n)]
        return req


def _steer(
    req: DriverRequest | None, history: list[int], rng: random.Random, alphabet: list[int]
) -> int:
    """A token that mostly continues the request's word whose prefix `history` ends with
    the furthest (ties at random), so that words match, and get completed, often."""
    words = (req.params.bad_words_token_ids or []) if req is not None else []
    if not words or rng.random() < 0.15:
        return rng.choice(alphabet)
    matched = [max(k for k in range(len(w)) if history[len(history) - k :] == w[:k]) for w in words]
    best = max(matched)
    w = rng.choice([w for w, k in zip(words, matched, strict=True) if k == best])
    return w[best]


def _churn_rig(
    backend: str,
) -> tuple[random.Random, torch.Generator, list[int], Sampler, _WordDriver]:
    """(host rng, torch generator, alphabet, sampler, driver) for a churn test, from a fresh
    seed; the alphabet holds 0, the ring's initial fill."""
    seed = _fresh_seed()
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    alphabet = [0, *rng.sample(range(1, V), 3)]
    config = _config(backend)
    sampler = Sampler(config, backend_device(backend))
    return rng, gen, alphabet, sampler, _WordDriver(config, alphabet, seed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bans_match_the_reference_under_churn(backend: str) -> None:
    """Every step: each row's banned set equals the reference's after the request's outputs
    (committed by `forward`, with or without a commit mask, or several at a time by
    `commit_tokens`), and no sampled token is banned."""
    rng, gen, alphabet, sampler, driver = _churn_rig(backend)
    device = sampler.device
    multi = 0  # bans by words of 2 or more tokens: the rule's real work
    for step in range(20 if interpreted(backend, device) else 40):
        sampler.update_state(driver.next_update())
        logits = torch.randn(ROWS, V, generator=gen)
        want = [_banned_by_reference(req) for req in driver.rows]
        assert _banned(sampler, logits) == want, step
        pairs = zip(want, driver.rows, strict=True)
        multi += sum(len(w - _one_token_bans(req)) for w, req in pairs)
        if step % 3 == 2:
            # Several tokens per row in one commit (the ring wraps within it).
            n = L + 1
            ids = torch.empty(ROWS, n, dtype=torch.int64)
            for r, req in enumerate(driver.rows):
                history = list(req.output_tok_ids) if req is not None else []
                for j in range(n):
                    ids[r, j] = _steer(req, history, rng, alphabet)
                    history.append(int(ids[r, j]))
            num = torch.randint(0, n + 1, (ROWS,), generator=gen)
            sampler.commit_tokens(ids.to(device), num_tokens=num.to(device))
            for r, req in enumerate(driver.rows):
                if req is not None:
                    req.output_tok_ids.extend(ids[r, : int(num[r])].tolist())
            continue
        for r, req in enumerate(driver.rows):
            if req is not None:  # the steered token wins unless banned
                logits[r, _steer(req, req.output_tok_ids, rng, alphabet)] += 8.0
        keep = (torch.rand(ROWS, generator=gen) < 0.7) if step % 3 == 1 else None
        out = sampler(logits.to(device), None if keep is None else keep.to(device))
        tokens = out.sampled_token_ids[:, 0].cpu().tolist()
        for r, req in enumerate(driver.rows):
            assert req is None or tokens[r] not in want[r], (step, r)
        driver.record_tokens(tokens, None if keep is None else keep.tolist())
    assert multi >= MIN_MULTI, f"only {multi} bans by words of 2+ tokens: the test says little"


@pytest.mark.parametrize("backend", BACKENDS)
def test_speculative_positions_count_the_drafts_before_them(backend: str) -> None:
    """RejectionSampler steps under churn: at position j the banned set is the reference's
    after the outputs and drafts 0..j-1; no emitted token (accepted draft or not) is banned
    at its position; the commit of several tokens a row advances the ring for the next
    step."""
    rng, gen, alphabet, sampler, driver = _churn_rig(backend)
    device = sampler.device
    rejection = RejectionSampler(sampler, S)
    multi = accepted = 0
    for step in range(8 if interpreted(backend, device) else 30):
        sampler.update_state(driver.next_update())
        drafts = torch.empty(ROWS, S, dtype=torch.int64)
        logits = torch.randn(ROWS, S + 1, V, generator=gen)
        for r, req in enumerate(driver.rows):
            history = list(req.output_tok_ids) if req is not None else []
            for j in range(S + 1):
                token = _steer(req, history, rng, alphabet)
                logits[r, j, token] += 8.0  # the target favours it: often accepted
                if j < S:
                    drafts[r, j] = token
                    history.append(token)
        num = torch.randint(0, S + 1, (ROWS,), generator=gen)
        got = _banned(sampler, logits.view(ROWS * (S + 1), V), rejection, drafts)
        want = [
            [_banned_by_reference(req, drafts[r, :j].tolist()) for j in range(S + 1)]
            for r, req in enumerate(driver.rows)
        ]
        assert got == [w for row in want for w in row], step
        pairs = zip(want, driver.rows, strict=True)
        multi += sum(len(w - _one_token_bans(req)) for row, req in pairs for w in row)
        probs = None
        if step % 2:
            probs = torch.softmax(torch.randn(ROWS, S, V, generator=gen), dim=-1).to(device)
        out = rejection(logits.to(device), drafts.to(device), num.to(device), probs)
        tokens, num_accepted = out.output_token_ids.cpu().tolist(), out.num_accepted.tolist()
        for r, req in enumerate(driver.rows):
            if req is None:
                continue
            a = num_accepted[r]
            for j in range(a + 1):
                assert tokens[r][j] not in want[r][j], (step, r, j)
            req.output_tok_ids.extend(tokens[r][: a + 1])
            accepted += a
    assert multi >= MIN_MULTI, f"only {multi} bans by words of 2+ tokens: the test says little"
    assert accepted >= 5


# ----------------------------------------------------------------- edge cases by hand

# Each case: the words, the outputs at add, then steps of (tokens committed, the banned set
# after). Letters stand for distinct random tokens drawn each run; "0" is token 0, the value
# the ring starts filled with. L = 3.
EDGE_CASES = [
    pytest.param(
        ["a", "b"], "", [("", "ab"), ("c", "ab"), ("de", "ab"), ("a", "ab")],
        id="one-token-words-always-banned",
    ),
    pytest.param(
        # a word's prefix may not match the ring's initial zeros: history too short
        ["abc", "00d", "0e"], "", [("", ""), ("0", "e"), ("0", "de"), ("a", ""), ("b", "c")],
        id="word-longer-than-the-history",
    ),
    pytest.param(
        ["abc", "cab"], "",
        [("", ""), ("a", ""), ("b", "c"), ("x", ""), ("ab", "c"), ("d", ""), ("c", ""),
         ("a", "b"), ("ca", "b"), ("b", "c")],
        id="ring-wraps-past-max_bad_word_len",
    ),
    pytest.param(
        ["ab", "dab", "cb", "bd"], "",
        [("", ""), ("a", "b"), ("d", ""), ("a", "b"), ("c", "b"), ("e", ""), ("b", "d")],
        id="token-banned-by-two-words",
    ),
    pytest.param(
        # the ring is filled from the last L outputs at add, each at its index % L
        ["abc", "bd", "yzq"], "xyzab", [("", "cd"), ("e", ""), ("ab", "cd"), ("c", "")],
        id="resumed-longer-than-the-ring",
    ),
    pytest.param(
        ["0ac", "ab"], "a", [("", "b"), ("0", ""), ("a", "bc")],
        id="resumed-shorter-than-a-word",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("words", "resumed", "steps"), EDGE_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_edge_cases(
    backend: str, words: list[str], resumed: str, steps: list[tuple[str, str]]
) -> None:
    """One request (row 0; row 1 is padding) through the steps: a single token not banned
    is committed by `forward` (a greedy row, the token favoured: the backend's commit), the
    others by `commit_tokens`. After each, the banned set is the case's and the
    reference's; and with the case's next S tokens as drafts, each speculative position's
    is the reference's after the drafts before it."""
    seed = _fresh_seed()
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    letters = sorted({c for s in [*words, resumed, *(t for t, _ in steps)] for c in s} - {"0"})
    ids = dict(zip(letters, rng.sample(range(1, V), len(letters)), strict=True))
    ids["0"] = 0

    def tok(text: str) -> list[int]:
        return [ids[c] for c in text]

    def spelled(tokens: list[int]) -> str:
        return "".join(next(k for k, v in ids.items() if v == t) for t in tokens)

    device = backend_device(backend)
    sampler = Sampler(_config(backend, max_num_reqs=2), device)
    rejection = RejectionSampler(sampler, S)
    params = SP(temperature=0.0, bad_words_token_ids=[tok(w) for w in words])
    req = DriverRequest(params, None, tok(resumed))
    sampler.update_state(BatchUpdate(1, added=[(0, params, None, list(req.output_tok_ids))]))
    future = [t for text, _ in steps for t in tok(text)]
    banned: set[int] = set()
    for text, want in steps:
        commit = tok(text)
        if len(commit) == 1 and commit[0] not in banned:
            logits = torch.randn(2, V, generator=gen)
            logits[0, commit[0]] += 20.0
            assert int(sampler(logits.to(device)).sampled_token_ids[0, 0]) == commit[0]
        elif commit:
            pair, num = torch.tensor([commit, commit]), torch.tensor([len(commit), 0])
            sampler.commit_tokens(pair.to(device), num_tokens=num.to(device))
        req.output_tok_ids.extend(commit)
        history = spelled(req.output_tok_ids)
        got = _banned(sampler, torch.randn(2, V, generator=gen))
        banned = got[0]
        assert banned == set(tok(want)), f"after {history!r}"
        assert banned == _banned_by_reference(req), f"after {history!r}"
        assert got[1] == set()  # the padding row
        del future[: len(commit)]
        drafts = (future + [ids[letters[0]]] * S)[:S]
        got = _banned(sampler, torch.randn(2 * (S + 1), V, generator=gen), rejection,
                      torch.tensor([drafts, drafts]))  # fmt: skip
        for j in range(S + 1):
            where = f"after {history!r} + drafts {spelled(drafts[:j])!r}"
            assert got[j] == _banned_by_reference(req, drafts[:j]), where
            assert got[S + 1 + j] == set()  # the padding row


# ----------------------------------------------------------------- capacity


@pytest.mark.parametrize("backend", BACKENDS)
def test_words_fill_the_token_capacity_and_match_the_last_outputs(backend: str) -> None:
    vocab = 111
    singles = [[t] for t in range(20, vocab)]  # 91 one-token words
    words = [[6, 7], [5, 6, 8], [9, 6, 10], [4], *singles]
    capacity = sum(map(len, words))  # 100: every entry of the flat table used
    config = _config(
        backend, max_num_reqs=2, vocab_size=vocab, max_num_logprobs=vocab,
        logprobs_mode="processed_logits", max_bad_word_len=3, max_bad_words=len(words),
        max_bad_words_tokens=capacity,
    )  # fmt: skip
    device = backend_device(backend)
    sampler = Sampler(config, device)
    too_many = "101 tokens in total, more than max_bad_words_tokens = 100"
    with pytest.raises(ValueError, match=too_many):
        sampler.update_state(
            BatchUpdate(1, added=[(0, SP(bad_words_token_ids=[*words[:-1], [3, 19]]), None, [])])
        )
    sampler.update_state(
        BatchUpdate(2, added=[(0, SP(bad_words_token_ids=words), None, [5, 6]),
                              (1, SP(bad_words_token_ids=[[6, 7]]), None, [6, 1])])
    )  # fmt: skip
    seed = _fresh_seed()
    gen = torch.Generator().manual_seed(seed)

    def banned() -> list[set[int]]:
        out = sampler(torch.randn(2, vocab, generator=gen).to(device), commit=False)
        lp = out.logprobs_tensors
        assert lp is not None
        ids, values = lp.logprob_token_ids[:, 1:].cpu(), lp.logprobs[:, 1:].cpu()
        return [set(ids[r][values[r].isneginf()].tolist()) for r in range(2)]

    got = banned()
    assert got[0] == {7, 8, 4, *range(20, vocab)}
    assert got[1] == set()  # row 1's last output is 1, not 6
    # Row 1 now outputs 6: its word [6, 7] applies from the next step on.
    sampler.commit_tokens(torch.tensor([3, 6]).to(device))
    got = banned()
    assert got[1] == {7}
    assert got[0] == {4, *range(20, vocab)}  # row 0 ends in 3: only its one-token words


# ----------------------------------------------------------------- the kernel's blocks


@pytest.mark.parametrize(
    ("with_drafts", "splits"), [(False, 1), (True, 1), (True, 3)],
    ids=["plain", "drafts", "drafts-split"],
)  # fmt: skip
def test_kernel_carries_words_across_its_blocks(
    kernel_device: torch.device, with_drafts: bool, splits: int
) -> None:
    """`process_logits` scans the entries in blocks (8 here, 128 by default): words that
    straddle a block boundary, or fill one whole block and run into the next, must ban
    exactly what the stage's PyTorch scatter bans, on every row, with and without drafts,
    and with each row split over programs of 16-column tiles (each bans in its chunk)."""
    from tile_maxima import expected_tile_maxima

    from graphsafe_sampler.kernels.logits_processing import launch_process_logits

    seed = _fresh_seed()
    rng = random.Random(seed)
    alphabet = [0, 1, 2]  # few tokens: words match the history often
    width = 5  # max_bad_word_len, and the ring
    config = _config("triton", max_bad_word_len=width, max_bad_words=12,
                     max_bad_words_tokens=40)  # fmt: skip
    sampler = Sampler(config, kernel_device)
    added = []
    for row in range(ROWS):
        # one single-token word a row (always banned), then random ones: the premise below
        # no longer rests on the draw alone (a seed once left 6 bans on 6 rows)
        words: list[list[int]] = [[rng.randrange(V)]]
        budget = config.max_bad_words_tokens - 1
        while len(words) < config.max_bad_words and budget > 0:
            n = min(rng.choice([1, 2, 3, 4, 5, 5]), budget)
            words.append([rng.choice(alphabet) for _ in range(n - 1)] + [rng.randrange(V)])
            budget -= n
        outputs = [rng.choice(alphabet) for _ in range(rng.choice([0, 2, 3, 7, 11]))]
        added.append((row, SP(bad_words_token_ids=words), [5], outputs))
    sampler.update_state(BatchUpdate(ROWS, added=added))
    s = sampler.stages
    slots = sampler.batch_state.slots(ROWS)
    drafts = preceding = None
    if with_drafts:
        drafts = torch.tensor([[rng.choice(alphabet) for _ in range(3)] for _ in range(ROWS)])
        drafts = drafts.to(kernel_device)
        preceding = torch.tensor([rng.randint(0, 3) for _ in range(ROWS)], device=kernel_device)
    logits = torch.randn(ROWS, V, generator=torch.Generator().manual_seed(seed)).to(kernel_device)
    want = s.bad_words.apply(logits.clone(), slots, drafts, preceding)
    # each banned token its tile's max before the ban: a missed mark shows as 10
    logits = torch.where(want.isneginf(), 10.0, logits)
    got = torch.empty_like(logits)
    tile_max = torch.full((ROWS, -(-V // 16)), float("nan"), device=kernel_device)
    launch_process_logits(
        logits, got, slots, s.logit_bias.bias_ids.device, s.logit_bias.bias_values.device,
        s.min_tokens.min_tokens.device, s.batch_state.num_generated.device,
        s.min_tokens.stop_ids.device, s.allowed.allowed.device, None, s.penalties.counts,
        s.penalties.overflow_token.device, s.penalties.overflow_excess.device,
        s.penalties.prompt_mask.device, s.penalties.repetition.device,
        s.penalties.frequency.device, s.penalties.presence.device,
        s.temperature.temperature.device, drafts, preceding, s.bad_words.tokens.device,
        s.bad_words.back.device, s.bad_words.word.device, s.bad_words.window.device,
        tile_max, block_size=16, bad_block=8, splits=splits,
    )  # fmt: skip
    banned = want.isneginf()
    assert banned.sum() > ROWS  # the words match the short alphabet's histories often
    assert torch.equal(got.isneginf(), banned)
    assert torch.equal(got[~banned], logits[~banned])
    # each banned token held its tile's max and fell: its tile is unknown, the others exact
    assert torch.equal(tile_max.cpu(), expected_tile_maxima(got.cpu(), banned.cpu(), 16))


def test_bans_write_minus_inf_and_leave_every_other_logit_bit_for_bit() -> None:
    """The stage's writes: a token banned by one matched word among several that end in it
    (matched or not), and a one-token word, become min(logit, -inf) (-inf, a NaN stays NaN,
    as torch.minimum keeps it); every other logit, -0.0 and NaN included, keeps its bits,
    in rows with bans and in a row without a bad word. Many entries aim at one column: the
    writes agree whatever their order."""
    seed = _fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    sampler = Sampler(_config("torch", max_num_reqs=3, max_bad_words=5), "cpu")
    words = [[1, 2], [4, 1, 2], [3, 2], [2, 4], [7]]  # 2 ends three words, 4 one, 7 alone
    added = [
        (0, SP(bad_words_token_ids=words), None, [9, 4, 1]),  # "ab" and "dab" match: 2, 7
        (1, SP(bad_words_token_ids=words), None, [9, 3]),  # "cb" matches: 2, 7
        (2, SP(), None, [1]),  # no bad words
    ]
    sampler.update_state(BatchUpdate(3, added=added))
    banned = [{2, 7}, {2, 7}, set()]
    logits = torch.randn(3, V, generator=gen)
    logits[0, 2], logits[1, 9], logits[2, 4] = float("nan"), float("nan"), -0.0
    logits[:, 4] = torch.tensor([-0.0, 0.0, -0.0])
    slots = sampler.batch_state.slots(3)
    got = sampler.stages.bad_words.apply(logits.clone(), slots)
    for r in range(3):
        for t in range(V):
            if t in banned[r]:
                want = torch.minimum(logits[r, t], torch.tensor(float("-inf")))
                torch.testing.assert_close(got[r, t], want, rtol=0, atol=0, equal_nan=True)
            else:  # the same bits (NaN's, -0.0's)
                assert got[r, t].view(torch.int32) == logits[r, t].view(torch.int32), (r, t)
    assert bool(got[0, 2].isnan()) and got[1, 2] == float("-inf") and got[0, 7] == float("-inf")
