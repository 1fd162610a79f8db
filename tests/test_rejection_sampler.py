"""RejectionSampler: exact greedy cases, in-step history, the float64 reference under churn,
per-position chi-square against the target distribution, the RNG streams, determinism across
layouts, graph safety, bad input, and the two backends side by side. Tests taking `backend`
run on both backends, each on its device (tests/backends.py: Triton through the interpreter
on the CPU, or compiled on CUDA in a GPU run); the chi-square runs on the PyTorch backend,
and the last section checks that the backends process every speculative position alike and
emit the same tokens. Bad words at speculative positions: tests/test_bad_words.py too."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
from backends import BACKENDS, backend_device, interpreted
from scipy import stats

import graphsafe_sampler as gs
from graphsafe_sampler import BatchUpdate, MoveDirectionality, RejectionSampler, Sampler, rng
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.batch_update import AddedRequest
from graphsafe_sampler.bitmask import num_words, pack_token_ids
from graphsafe_sampler.pipelines import TorchPipeline
from graphsafe_sampler.testing import BatchDriver, DriverRequest, check_graph_safety, reference

V = 111
S = 3
# Every feature on, at small capacities: the reference under churn and the backends' agreement.
CHURN_CONFIG = gs.SamplerConfig(
    max_num_reqs=7, vocab_size=V, eos_token_id=3, seed=0, max_logit_bias_tokens=16,
    max_stop_token_ids=4, max_bad_word_len=4,
)  # fmt: skip


def _pair(
    config: gs.SamplerConfig,
    spec: int = S,
    backend: str = "torch",
    device: torch.device | str = "cpu",
) -> tuple[Sampler, RejectionSampler]:
    sampler = Sampler(dataclasses.replace(config, backend=backend), device)
    return sampler, RejectionSampler(sampler, spec)


def _ids(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


# ----------------------------------------------------------------- exact greedy cases


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_exact_cases_and_commit(backend: str) -> None:
    config = gs.SamplerConfig(max_num_reqs=5, vocab_size=V, seed=0)
    device = backend_device(backend)
    sampler, rejection = _pair(config, backend=backend, device=device)
    greedy = SP(temperature=0.0)
    sampler.update_state(BatchUpdate(4, added=[(r, greedy, None, []) for r in range(4)]))
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, S + 1, V, generator=gen) * 3
    best = logits.argmax(dim=-1)  # [5, S + 1]
    drafts = best[:, :S].clone()
    drafts[1, 0] = (best[1, 0] + 1) % V  # row 1: the first draft is wrong
    drafts[2, 2] = (best[2, 2] + 5) % V  # row 2: the third is wrong
    num_drafts = torch.tensor([3, 3, 3, 0, 2])  # row 3: no drafts; row 4: padding
    out = rejection(logits.to(device), drafts.to(device), num_drafts.to(device))
    b = best.tolist()
    want = [
        b[0],  # all accepted, then the bonus argmax
        [b[1][0], -1, -1, -1],  # first rejected: the target's argmax instead
        [b[2][0], b[2][1], b[2][2], -1],  # mixed: two accepted, then the argmax
        [b[3][0], -1, -1, -1],  # zero drafts: the bonus at position 0
        [b[4][0], b[4][1], b[4][2], -1],  # padding: greedy on the raw logits
    ]
    assert out.output_token_ids.dtype == torch.int32
    assert out.output_token_ids.tolist() == want
    assert out.num_accepted.tolist() == [3, 0, 2, 0, 2]
    # Each request committed num_accepted + 1 tokens: counts and the generated count.
    slots = [sampler.batch_state.slot_of_row(r) for r in range(4)]
    generated = sampler.batch_state.num_generated.device
    assert [int(generated[s]) for s in slots] == [4, 1, 3, 1]
    counts = sampler.stages.penalties.counts.cpu()
    for row, slot in enumerate(slots):
        expect = Counter(t for t in want[row] if t >= 0)
        got = {t: int(counts[slot, t]) for t in range(V) if counts[slot, t]}
        assert got == dict(expect), row
    assert counts[config.padding_slot].sum() == 0


def test_commit_mask_and_no_commit() -> None:
    config = gs.SamplerConfig(max_num_reqs=3, vocab_size=V)
    sampler, rejection = _pair(config)
    sampler.update_state(
        BatchUpdate(3, added=[(r, SP(temperature=0.0), None, [1]) for r in range(3)])
    )
    logits = torch.randn(3, S + 1, V)
    drafts = logits[:, :S].argmax(dim=-1)
    num = torch.tensor([2, 2, 2])
    generated = sampler.batch_state.num_generated.device
    slots = [sampler.batch_state.slot_of_row(r) for r in range(3)]
    rejection(logits, drafts, num, commit=False)
    assert [int(generated[s]) for s in slots] == [1, 1, 1]
    rejection(logits, drafts, num, commit_mask=torch.tensor([True, False, True]))
    assert [int(generated[s]) for s in slots] == [4, 1, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_drafts_before_a_position_count_as_output(backend: str) -> None:
    # Greedy rows whose targets change within the step because of the drafts before
    # each position: min_tokens, bad words and penalties.
    eos = 9
    config = gs.SamplerConfig(max_num_reqs=3, vocab_size=V, eos_token_id=eos)
    device = backend_device(backend)
    sampler, rejection = _pair(config, backend=backend, device=device)
    rows = [
        SP(temperature=0.0, min_tokens=2),
        SP(temperature=0.0, bad_words_token_ids=[[5, 7]]),
        SP(temperature=0.0, presence_penalty=2.0),
    ]
    sampler.update_state(BatchUpdate(3, added=[(r, p, None, []) for r, p in enumerate(rows)]))
    logits = torch.zeros(3, S + 1, V)
    logits[0, :, eos], logits[0, :, 5] = 10.0, 5.0  # EOS masked at positions 0 and 1
    logits[1, 0, 5] = 10.0  # then 7 is banned right after the drafted 5
    logits[1, 1:, 7], logits[1, 1:, 8] = 10.0, 5.0
    logits[2, :, 3], logits[2, :, 4], logits[2, :, 6] = 3.0, 2.5, 2.0
    drafts = _ids([5, 5, eos], [5, 8, 7], [3, 4, 3])
    out = rejection(logits.to(device), drafts.to(device), torch.tensor([3, 3, 3]).to(device))
    assert out.output_token_ids.tolist() == [[5, 5, eos, eos], [5, 8, 7, 7], [3, 4, 6, -1]]
    # The step's tokens are history now: the Sampler's next step sees them.
    plain = sampler(torch.zeros(3, V).index_fill_(1, torch.tensor([3, 4, 6, 8]), 1.0).to(device))
    assert int(plain.sampled_token_ids[2, 0]) == 8  # 3, 4 and 6 are penalised


# ----------------------------------------------------------------- reference under churn


def _reference_position(
    logits_row: np.ndarray,
    req: DriverRequest | None,
    prefix: list[int],
    config: gs.SamplerConfig,
    allowed: np.ndarray | None,
) -> tuple[np.ndarray, int, bool]:
    """The float64 pipeline at one position: the request after its committed outputs and
    `prefix`, with this position's grammar mask (`allowed` [V] bool or None)."""
    row = logits_row.copy()
    if allowed is not None:
        row[~allowed] = -math.inf
    if req is None:
        return reference.pipeline(row, None, config)
    view = DriverRequest(req.params, req.prompt_tok_ids, [*req.output_tok_ids, *prefix])
    return reference.pipeline(row, view, config)


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_reference_under_churn(backend: str) -> None:
    config = CHURN_CONFIG
    device = backend_device(backend)
    sampler, rejection = _pair(config, backend=backend, device=device)
    driver = BatchDriver(config, seed=11, churn=0.15)
    np_rng = np.random.default_rng(11)
    gen = torch.Generator().manual_seed(11)
    rows, words = config.max_num_reqs, num_words(V)
    greedy_checked = random_checked = accepted_total = 0
    outside_support = 0
    # The interpreter runs each kernel in numpy: fewer steps there (the backends are also
    # compared step by step, test_backends_emit_the_same_tokens_under_churn).
    num_steps = 6 if interpreted(backend, device) else 30
    for step in range(num_steps):
        sampler.update_state(driver.next_update())
        logits = torch.randn(rows, S + 1, V, generator=gen) * 3
        logits64 = logits.double().numpy()
        # Per-position grammar masks on some rows.
        grammar: dict[int, np.ndarray] = {}
        for r in np_rng.choice(rows, size=int(np_rng.integers(0, 3)), replace=False).tolist():
            grammar[r] = np_rng.random((S + 1, V)) < 0.6
        if grammar:
            staged = np.stack(
                [[pack_token_ids(np.flatnonzero(m).tolist(), V) for m in grammar[r]]
                 for r in sorted(grammar)]
            )  # fmt: skip
            rejection.stage_grammar_bitmask(
                staged.reshape(len(grammar), S + 1, words), sorted(grammar)
            )
        else:
            rejection.stage_grammar_bitmask(None)

        def ref(
            r: int,
            j: int,
            prefix: list[int],
            grammar: dict[int, np.ndarray] = grammar,
            logits64: np.ndarray = logits64,
        ) -> tuple[np.ndarray, int, bool]:
            mask = grammar[r][j] if r in grammar else None
            return _reference_position(logits64[r, j], driver.rows[r], prefix, config, mask)

        # Drafts that follow the reference's most likely chain for a while, then stray.
        drafts = np_rng.integers(0, V, size=(rows, S))
        num = np_rng.integers(0, S + 1, size=rows)
        for r in range(rows):
            follow = int(np_rng.integers(0, num[r] + 1))
            for j in range(follow):
                processed, greedy, _ = ref(r, j, drafts[r, :j].tolist())
                drafts[r, j] = greedy if driver.rows[r] is None else int(np.argmax(processed))
        use_probs = step % 2 == 1
        draft_probs = None
        if use_probs:
            draft_probs = torch.softmax(torch.randn(rows, S, V, generator=gen) * 2, dim=-1)
            draft_probs = draft_probs.to(device)
        out = rejection(
            logits.to(device),
            torch.from_numpy(drafts).to(device),
            torch.from_numpy(num).to(device),
            draft_probs,
        )
        tokens = out.output_token_ids.tolist()
        accepted = out.num_accepted.tolist()
        for r in range(rows):
            a = accepted[r]
            assert 0 <= a <= num[r]
            assert tokens[r][:a] == drafts[r, :a].tolist()
            assert all(t == -1 for t in tokens[r][a + 1 :])
            _, greedy, is_greedy = ref(r, 0, [])
            if is_greedy:
                # Exact: accept while the draft is the argmax after the drafts before it.
                want = []
                for j in range(num[r] + 1):
                    _, g, _ = ref(r, j, drafts[r, :j].tolist())
                    want.append(g)
                    if j == num[r] or drafts[r, j] != g:
                        break
                assert tokens[r][: len(want)] == want, (step, r)
                greedy_checked += 1
            else:
                for j in range(a + 1):
                    processed, _, _ = ref(r, j, drafts[r, :j].tolist())
                    outside_support += int(math.isinf(processed[tokens[r][j]]))
                random_checked += 1
            accepted_total += a
            req = driver.rows[r]
            if req is not None:
                req.output_tok_ids.extend(tokens[r][: a + 1])
    assert greedy_checked > num_steps and random_checked > num_steps
    assert accepted_total > 2 * num_steps
    # float32 top-p/min_p cuts may keep a boundary token the float64 reference drops.
    assert outside_support <= 2


# ----------------------------------------------------------------- distribution


def _chi_square_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    support = expected > 0
    assert observed[~support].sum() == 0, "emitted a token outside the target's support"
    obs, exp = observed[support], expected[support]
    exp = exp * obs.sum() / exp.sum()
    merged = exp >= 5  # chi-square wants expected counts >= 5: pool the rest
    obs = np.append(obs[merged], obs[~merged].sum())
    exp = np.append(exp[merged], exp[~merged].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert len(obs) >= 3, "a target this narrow says little: widen the test's distribution"
    return float(stats.chisquare(obs, exp).pvalue)


Verify = Callable[..., gs.RejectionSamplerOutput]
CHI_VOCAB, CHI_ROWS, CHI_STEPS = 29, 1024, 100  # 102,400 trials; later positions see fewer


@pytest.fixture(scope="module")
def chi_square_rig() -> tuple[Sampler, RejectionSampler, Verify]:
    """One RejectionSampler for every chi-square case; each case swaps the whole batch for
    new requests. Eager: a step of 4,096 flattened rows takes about 40 ms here, less than
    compiling it would cost (graph replay has tests of its own)."""
    # Small capacities for the features these rows leave off: the torch backend pays for
    # every capacity slot. max_model_len too: the overflow tables hold ceil(max_model_len /
    # 255) entries a slot (514 at the default 131,072), and the 406 positions a row reaches
    # here fit in 1,024.
    config = gs.SamplerConfig(
        max_num_reqs=CHI_ROWS, vocab_size=CHI_VOCAB, seed=5, max_model_len=1024, max_bad_words=1,
        max_bad_word_len=2, max_bad_words_tokens=2, max_logit_bias_tokens=2,
        max_stop_token_ids=1,
    )  # fmt: skip
    sampler, rejection = _pair(config)
    sampler.update_state(None)
    return sampler, rejection, rejection


@pytest.mark.parametrize(
    ("params", "with_draft_probs"),
    [
        pytest.param(SP(), True, id="plain-draft_probs"),
        pytest.param(SP(), False, id="plain-ngram"),
        pytest.param(SP(temperature=1.3, top_k=7, top_p=0.9), True, id="top_k+top_p-draft_probs"),
        pytest.param(SP(temperature=1.2, min_p=0.02, top_p=0.97), False, id="min_p+top_p-ngram"),
        pytest.param(
            SP(temperature=0.9, repetition_penalty=1.3, frequency_penalty=0.4,
               presence_penalty=0.3, min_p=0.02),
            True,
            id="penalties+min_p-draft_probs",
        ),
        pytest.param(
            SP(repetition_penalty=1.2, frequency_penalty=0.5, top_k=9), False,
            id="penalties+top_k-ngram",
        ),
    ],
)  # fmt: skip
def test_emitted_tokens_follow_the_target_at_every_position(
    chi_square_rig: tuple[Sampler, RejectionSampler, Verify],
    params: SP,
    with_draft_probs: bool,
) -> None:
    sampler, _, verify = chi_square_rig
    vocab, rows, steps = CHI_VOCAB, CHI_ROWS, CHI_STEPS
    config = sampler.config
    prompt, output = [1, 2, 3], [4, 4, 9]
    removed = [r for r in range(rows) if sampler.batch_state.slot_of_row(r) is not None]
    sampler.update_state(
        BatchUpdate(
            rows,
            removed=removed,
            added=[
                (r, dataclasses.replace(params, seed=7000 + r), prompt, list(output))
                for r in range(rows)
            ],
        )
    )
    np_rng = np.random.default_rng(17)
    # A different target per position, each with a favourite token that the draft
    # distribution favours too, so that many rows reach the later positions.
    base = np_rng.normal(0.0, 1.5, size=(S + 1, vocab))
    favourite = np_rng.choice(np.arange(10, vocab), size=S + 1, replace=False)
    base[np.arange(S + 1), favourite] += 5.0
    draft_logits = base[:S] + np_rng.normal(0.0, 1.0, size=(S, vocab))
    draft_dist = np.exp(draft_logits - draft_logits.max(axis=1, keepdims=True))
    draft_dist /= draft_dist.sum(axis=1, keepdims=True)
    logits = torch.from_numpy(base).float().expand(rows, S + 1, vocab)
    draft_probs = None
    if with_draft_probs:
        draft_probs = torch.from_numpy(draft_dist).float().expand(rows, S, vocab)
    req = DriverRequest(params, prompt, list(output))
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def target(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in cache:
            processed, _, _ = _reference_position(
                base[len(prefix)], req, list(prefix), config, None
            )
            p = np.exp(processed - processed.max())
            cache[prefix] = p / p.sum()
        return cache[prefix]

    slots = sampler.batch_state.slots(rows)
    observed = np.zeros((S + 1, vocab))
    reached: Counter[tuple[int, ...]] = Counter()  # prefix -> rows that emitted after it
    for _ in range(steps):
        drafts = np.stack(
            [np_rng.choice(vocab, size=rows, p=draft_dist[j]) for j in range(S)], axis=1
        )
        num = np_rng.choice(S + 1, size=rows, p=[0.1, 0.1, 0.2, 0.6])
        out = verify(
            logits, torch.from_numpy(drafts), torch.from_numpy(num), draft_probs, commit=False
        )
        tokens = out.output_token_ids.numpy()
        for j in range(S + 1):
            emitted = tokens[:, j] >= 0
            np.add.at(observed[j], tokens[emitted, j], 1)
            reached.update(map(tuple, drafts[emitted, :j].tolist()))
        # Fresh randomness next step: every verified position moves past this step's.
        sampler.batch_state.num_generated.device[slots] += S + 1
    expected = np.zeros((S + 1, vocab))
    for prefix, count in reached.items():
        expected[len(prefix)] += count * target(prefix)
    assert observed[0].sum() == rows * steps
    assert observed[S].sum() > 1_000  # the bonus after S accepted drafts is exercised
    for j in range(S + 1):
        assert _chi_square_pvalue(observed[j], expected[j]) > 1e-3, f"position {j}"


def test_recovered_and_bonus_tokens_use_their_own_streams() -> None:
    config = gs.SamplerConfig(max_num_reqs=2, vocab_size=V)
    sampler, rejection = _pair(config)
    seed, prompt = 99, [5, 6, 7]
    sampler.update_state(BatchUpdate(2, added=[(r, SP(seed=seed), prompt, [8]) for r in range(2)]))
    start = len(prompt) + 1
    logits = torch.randn(2, S + 1, V, generator=torch.Generator().manual_seed(3))
    # Row 0: no drafts, so the bonus at position 0. Row 1: its first draft has target
    # probability 0 (rejected for sure), so the recovered token at position 0.
    logits[1, 0, 17] = float("-inf")
    drafts = _ids([0, 0, 0], [17, 1, 2])
    draft_probs = torch.softmax(torch.randn(2, S, V), dim=-1)
    out = rejection(logits, drafts, torch.tensor([0, 2]), draft_probs)

    def noise(salt: int) -> np.ndarray:
        seeds, positions = torch.tensor([seed]), torch.tensor([start])
        return rng.gumbel_noise(seeds, positions, V, salt)[0].double().numpy()

    x = logits.double().numpy()
    bonus = int(np.argmax(x[0, 0] + noise(rng.SALT_BONUS)))
    p = np.exp(x[1, 0] - np.logaddexp.reduce(x[1, 0][np.isfinite(x[1, 0])]))
    residual = np.maximum(p - draft_probs[1, 0].double().numpy(), 0.0)
    with np.errstate(divide="ignore"):
        recovered = int(np.argmax(np.log(residual) + noise(rng.SALT_RECOVER)))
    assert out.output_token_ids[:, 0].tolist() == [bonus, recovered]
    assert out.num_accepted.tolist() == [0, 0]
    assert bonus != int(np.argmax(x[0, 0] + noise(rng.SALT_SAMPLE)))  # a separate stream


# ----------------------------------------------------------------- layouts


def _step_inputs(num_rows: int, where: dict[int, int], step: int) -> tuple[torch.Tensor, ...]:
    """Inputs for `num_rows` rows with request k's data at row where[k] (others random)."""
    gen = torch.Generator().manual_seed(1000 + step)
    logits = torch.randn(num_rows, S + 1, V) * 2
    drafts = torch.randint(0, V, (num_rows, S))
    num = torch.randint(0, S + 1, (num_rows,))
    probs = torch.softmax(torch.randn(num_rows, S, V), dim=-1)
    for k, row in where.items():
        logits[row] = torch.randn(S + 1, V, generator=gen) * 2
        # The request's drafts: the target argmax chain, then a stray token.
        drafts[row] = logits[row, :S].argmax(dim=-1)
        drafts[row, k % S] = (drafts[row, k % S] + 1 + step) % V
        num[row] = (k + step) % (S + 1)
        probs[row] = torch.softmax(torch.randn(S, V, generator=gen), dim=-1)
    return logits, drafts, num, probs


@pytest.mark.parametrize("backend", BACKENDS)
def test_tokens_do_not_depend_on_row_batch_or_padding(backend: str) -> None:
    config = gs.SamplerConfig(max_num_reqs=8, vocab_size=V, seed=4)
    requests = [
        SP(temperature=0.9, top_k=30, seed=11, presence_penalty=0.5),
        SP(temperature=1.1, top_p=0.9, seed=12, min_p=0.02),
        SP(temperature=0.0, frequency_penalty=0.3),
    ]
    prompts = [[1, 2], [3], None]

    device = backend_device(backend)
    num_steps = 4 if interpreted(backend, device) else 6  # the interpreter: fewer

    def run(num_rows: int, where: dict[int, int], others: int) -> list[list[int]]:
        sampler, rejection = _pair(config, backend=backend, device=device)
        added: list[AddedRequest] = [(where[k], p, prompts[k], []) for k, p in enumerate(requests)]
        free = [r for r in range(num_rows) if r not in where.values()][:others]
        added += [(r, SP(temperature=0.7, seed=r), None, []) for r in free]
        batch = max([*where.values(), *free]) + 1
        sampler.update_state(BatchUpdate(batch, added=added))
        got = []
        for step in range(num_steps):
            inputs = (t.to(device) for t in _step_inputs(num_rows, where, step))
            out = rejection(*inputs).output_token_ids
            got.append([out[where[k]].tolist() for k in range(len(requests))])
        return got

    alone = run(3, {0: 0, 1: 1, 2: 2}, 0)
    crowded = run(8, {0: 5, 1: 2, 2: 0}, 3)  # other rows, neighbours, 2 padded rows
    assert alone == crowded

    # Moving a request between steps keeps its stream too.
    sampler, rejection = _pair(config, backend=backend, device=device)
    sampler.update_state(
        BatchUpdate(3, added=[(k, p, prompts[k], []) for k, p in enumerate(requests)])
    )
    moved = []
    where = {0: 0, 1: 1, 2: 2}
    for step in range(num_steps):
        if step == num_steps // 2:
            sampler.update_state(BatchUpdate(3, moved=[(0, 2, MoveDirectionality.SWAP)]))
            where = {0: 2, 1: 1, 2: 0}
        inputs = (t.to(device) for t in _step_inputs(3, where, step))
        out = rejection(*inputs).output_token_ids
        moved.append([out[where[k]].tolist() for k in range(len(requests))])
    assert moved == alone


# ----------------------------------------------------------------- graph safety


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_safety_of_the_rejection_sampler(backend: str) -> None:
    config = gs.SamplerConfig(
        max_num_reqs=5, vocab_size=V, eos_token_id=2, seed=0, max_logit_bias_tokens=8,
        max_stop_token_ids=4, max_bad_word_len=4,
    )  # fmt: skip
    device = backend_device(backend)
    rejection = _pair(config, backend=backend, device=device)[1]
    np_rng = np.random.default_rng(6)
    words = num_words(V)

    def make_logits(num_rows: int, gen: torch.Generator) -> torch.Tensor:
        return (torch.randn(num_rows, S + 1, V, generator=gen) * 3).to(device)

    def step(logits: torch.Tensor) -> gs.RejectionSamplerOutput:
        # Drafts derived inside the graph: the target argmax on even rows (often
        # accepted), scrambled ids on odd ones; counts and draft probabilities likewise.
        best = logits[:, :S].argmax(dim=-1)
        scrambled = (logits[:, :S, 0].abs() * 1000).long() % V
        odd = torch.arange(logits.shape[0], device=logits.device)[:, None] % 2 == 1
        drafts = torch.where(odd, scrambled, best)
        num = (logits[:, 0, 1].abs() * 10).long() % (S + 1)
        probs = torch.softmax(logits[:, :S] * 0.5, dim=-1)
        return rejection(logits, drafts, num, probs)

    def advance(driver: BatchDriver, out: gs.RejectionSamplerOutput) -> None:
        tokens, accepted = out.output_token_ids.tolist(), out.num_accepted.tolist()
        for row, req in enumerate(driver.rows):
            if req is not None:
                req.output_tok_ids.extend(tokens[row][: accepted[row] + 1])
        rows = sorted(np_rng.choice(5, size=int(np_rng.integers(0, 3)), replace=False).tolist())
        mask = np_rng.integers(-(2**31), 2**31, size=(len(rows), S + 1, words), dtype=np.int64)
        rejection.stage_grammar_bitmask(mask.astype(np.int32), rows=rows)

    # The interpreter runs each kernel in numpy: fewer steps there.
    num_steps = 3 if interpreted(backend, device) else 30
    # aot_eager: Dynamo's graph breaks and recompiles without inductor's code generation;
    # inductor's code for the whole Sampler is checked by the demo's compiled loop
    report = check_graph_safety(
        rejection, fn=step, num_steps=num_steps, seed=6, make_logits=make_logits,
        advance=advance, compile_backend="aot_eager",
    )  # fmt: skip
    assert report.compile_frames == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_ngram_drafts_trace_and_replay(backend: str) -> None:
    # The draft_probs=None path (a different graph): trace once, replay under churn.
    config = gs.SamplerConfig(max_num_reqs=4, vocab_size=V, seed=1, max_logit_bias_tokens=4,
                              max_stop_token_ids=2, max_bad_word_len=3)  # fmt: skip
    device = backend_device(backend)
    rejection = _pair(config, backend=backend, device=device)[1]
    num_steps = 3 if interpreted(backend, device) else 20  # the interpreter

    def step(logits: torch.Tensor) -> gs.RejectionSamplerOutput:
        drafts = logits[:, :S].argmax(dim=-1)
        num = (logits[:, 0, 1].abs() * 10).long() % (S + 1)
        return rejection(logits, drafts, num)

    report = check_graph_safety(
        rejection,
        fn=step,
        num_steps=num_steps,
        seed=2,
        make_logits=lambda n, gen: (torch.randn(n, S + 1, V, generator=gen) * 3).to(device),
        compile=False,
    )
    assert report.steps == num_steps


# ----------------------------------------------------------------- bad input


def _ready(
    num_rows: int = 3, backend: str = "torch", device: torch.device | str = "cpu"
) -> RejectionSampler:
    config = gs.SamplerConfig(max_num_reqs=4, vocab_size=V)
    sampler, rejection = _pair(config, backend=backend, device=device)
    sampler.update_state(
        BatchUpdate(num_rows, added=[(r, SP(temperature=0.0), None, []) for r in range(num_rows)])
    )
    return rejection


GOOD = {
    "target_logits": torch.randn(3, S + 1, V),
    "draft_token_ids": torch.zeros(3, S, dtype=torch.int64),
    "num_draft_tokens": torch.zeros(3, dtype=torch.int32),
}


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"target_logits": torch.randn(3, V)}, ValueError, "target_logits must be 3-D"),
        ({"target_logits": torch.randn(3, S, V)}, ValueError,
         rf"target_logits must have shape \[3, {S + 1}, {V}\]"),
        ({"target_logits": torch.randn(3, S + 1, V + 1)}, ValueError, "vocab_size = 111"),
        ({"target_logits": torch.randn(3, S + 1, V).double()}, TypeError,
         "target_logits must be float32 or float16 or bfloat16, got torch.float64"),
        ({"draft_token_ids": torch.zeros(3, S + 1, dtype=torch.int64)}, ValueError,
         rf"draft_token_ids must have shape \[3, {S}\]"),
        ({"draft_token_ids": torch.zeros(3, S)}, TypeError,
         "draft_token_ids must be int32 or int64, got torch.float32"),
        ({"num_draft_tokens": torch.zeros(2, dtype=torch.int64)}, ValueError,
         r"num_draft_tokens must have shape \[3\]"),
        ({"num_draft_tokens": [0, 0, 0]}, TypeError, "num_draft_tokens must be a torch.Tensor"),
        ({"draft_probs": torch.rand(3, S, V - 1)}, ValueError,
         rf"draft_probs must have shape \[3, {S}, {V}\]"),
        ({"commit_mask": torch.ones(3, dtype=torch.int64)}, TypeError,
         "commit_mask must be bool"),
        ({"target_logits": torch.randn(2, S + 1, V), "draft_token_ids": torch.zeros(2, S).long(),
          "num_draft_tokens": torch.zeros(2).long()}, ValueError,
         "target_logits have 2 rows but the batch holds 3"),
        ({"target_logits": torch.randn(5, S + 1, V), "draft_token_ids": torch.zeros(5, S).long(),
          "num_draft_tokens": torch.zeros(5).long()}, ValueError,
         "target_logits have 5 rows; forward takes 1 to max_num_reqs = 4"),
    ],
    ids=["2-D", "positions", "vocab", "float64", "draft-shape", "draft-dtype", "num-shape",
         "num-list", "probs-shape", "mask-dtype", "too-few-rows", "too-many-rows"],
)  # fmt: skip
def test_bad_input_is_refused_before_anything_runs(
    change: dict[str, object], exc: type, match: str
) -> None:
    rejection = _ready()
    before = {k: t.clone() for k, t in rejection.state_tensors().items()}
    kwargs = {**GOOD, **change}
    with pytest.raises(exc, match=match):
        rejection(**kwargs)
    after = rejection.state_tensors()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_device_values_are_clamped_or_refused(backend: str) -> None:
    device = backend_device(backend)
    rejection = _ready(backend=backend, device=device)
    logits = torch.randn(3, S + 1, V)
    best = logits.argmax(dim=-1)
    drafts = best[:, :S].clone()
    drafts[1, 1] = V + 4  # outside the vocabulary: never accepted
    drafts[2, 0] = -3
    num = torch.tensor([S + 2, 3, 3])  # more drafts than max_spec_len
    logits, drafts, num = logits.to(device), drafts.to(device), num.to(device)
    with pytest.raises(ValueError, match=rf"num_draft_tokens\[0\] = {S + 2} is outside \[0, "):
        rejection(logits, drafts, num, validate=True)
    num[0] = S
    with pytest.raises(ValueError, match=rf"draft_token_ids\[1, 1\] = {V + 4} is outside the "):
        rejection(logits, drafts, num, validate=True)
    # Unvalidated, on the device: the count is clamped to S and bad ids are rejected.
    num[0] = S + 2
    out = rejection(logits, drafts, num)
    b = best.tolist()
    assert out.output_token_ids.tolist() == [
        b[0],
        [b[1][0], b[1][1], -1, -1],
        [b[2][0], -1, -1, -1],
    ]
    assert out.num_accepted.tolist() == [S, 1, 0]
    # Draft columns past a row's count are not checked.
    drafts[0, 2] = V
    rejection(logits, drafts, torch.tensor([2, 0, 0]).to(device), validate=True)


def test_construction_errors() -> None:
    config = gs.SamplerConfig(max_num_reqs=2, vocab_size=V)
    sampler = Sampler(config, "cpu")
    with pytest.raises(ValueError, match="max_spec_len must be >= 1, got 0"):
        RejectionSampler(sampler, 0)
    with pytest.raises(TypeError, match="max_spec_len must be an int, got float"):
        RejectionSampler(sampler, 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sampler must be a Sampler, got SamplerConfig"):
        RejectionSampler(config, 2)  # type: ignore[arg-type]
    sampler.update_state(BatchUpdate(1, added=[(0, SP(), None, [])]))
    with pytest.raises(RuntimeError, match="before the first request is added"):
        RejectionSampler(sampler, 2)

    class RowIndexed(gs.AdapterLogitsProcessor):
        def new_req_logits_processor(self, params: SP):  # type: ignore[no-untyped-def]
            return None

    eager_only = Sampler(
        gs.SamplerConfig(max_num_reqs=2, vocab_size=V, logits_processors=[RowIndexed])
    )
    with pytest.raises(ValueError, match="processor RowIndexed reads its state by batch row"):
        RejectionSampler(eager_only, 2)


def test_forward_before_update_state() -> None:
    _, rejection = _pair(gs.SamplerConfig(max_num_reqs=4, vocab_size=V))
    with pytest.raises(RuntimeError, match="forward before any update_state"):
        rejection(**GOOD)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_position_grammar_bitmask(backend: str) -> None:
    config = gs.SamplerConfig(max_num_reqs=2, vocab_size=V)
    device = backend_device(backend)
    sampler, rejection = _pair(config, backend=backend, device=device)
    sampler.update_state(
        BatchUpdate(2, added=[(r, SP(temperature=0.0), None, []) for r in range(2)])
    )
    logits = torch.zeros(2, S + 1, V)
    logits[:, :, 9] = 50.0  # unconstrained positions take 9
    logits[:, :, 20] = 40.0
    logits = logits.to(device)
    # Row 1: position 1 allows only 20 and 30, position 3 only 30.
    every = pack_token_ids(range(V), V)
    masks = np.stack([every, pack_token_ids([20, 30], V), every, pack_token_ids([30], V)])
    rejection.stage_grammar_bitmask(masks[None], rows=[1])
    drafts = _ids([9, 9, 9], [9, 20, 9]).to(device)
    num = torch.tensor([3, 3]).to(device)
    out = rejection(logits, drafts, num, commit=False)
    assert out.output_token_ids.tolist() == [[9, 9, 9, 9], [9, 20, 9, 30]]
    # The Sampler's single-position mask is separate and not applied here.
    sampler.stage_grammar_bitmask(np.stack([pack_token_ids([5], V)]), rows=[0])
    out = rejection(logits, drafts, num, commit=False)
    assert out.output_token_ids[0].tolist() == [9, 9, 9, 9]
    with pytest.raises(ValueError, match=rf"must have shape \[rows, {S + 1}, 4\]"):
        rejection.stage_grammar_bitmask(np.stack([every]), rows=[0])


# ----------------------------------------------------------------- both backends, side by side
# The Triton backend against the PyTorch one, both on `kernel_device` (the CPU through the
# Triton interpreter, or CUDA with the kernels compiled): the processed logits of every
# speculative position, and the tokens emitted under churn with every feature in some rows,
# for the same seeds.


def _stage_grammar(
    rejections: list[RejectionSampler], np_rng: np.random.Generator, rows: list[int] | None = None
) -> None:
    """A random mask per position on `rows` (default: 2 random rows)."""
    if rows is None:
        rows = sorted(np_rng.choice(CHURN_CONFIG.max_num_reqs, size=2, replace=False).tolist())
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
    sampler, rejection = _pair(CHURN_CONFIG, backend="triton", device=kernel_device)
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
    from graphsafe_sampler.pipelines.triton_pipeline import TritonPipeline

    assert isinstance(sampler.pipeline, TritonPipeline)
    pipelines = {"triton": sampler.pipeline, "torch": TorchPipeline(sampler.stages)}
    done = {
        name: pipeline.process(logits.clone(), slots, grammar, flat_drafts, preceding)
        for name, pipeline in pipelines.items()
    }
    got, greedy = done["triton"].logits, done["triton"].greedy_tokens()
    want, want_greedy = done["torch"].logits, done["torch"].greedy_tokens()
    # the kernels read the temperature themselves; the stage's answer is the PyTorch one's
    assert done["triton"].is_greedy is None
    is_greedy = sampler.stages.temperature.is_greedy(slots)
    assert torch.equal(is_greedy, done["torch"].is_greedy)
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
    pairs = {
        backend: _pair(CHURN_CONFIG, backend=backend, device=kernel_device)
        for backend in ("torch", "triton")
    }
    drivers = {backend: BatchDriver(CHURN_CONFIG, seed=21, churn=0.15) for backend in pairs}
    np_rng = np.random.default_rng(21)
    gen = torch.Generator().manual_seed(21)
    rows = CHURN_CONFIG.max_num_reqs
    accepted = emitted_random = 0
    num_steps = 8 if interpreted("triton", kernel_device) else 12  # the interpreter: fewer
    for step in range(num_steps):
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
    assert accepted > 2 * num_steps and emitted_random > 2 * num_steps
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
        sampler, rejection = _pair(CHURN_CONFIG, backend=backend, device=kernel_device)
        params = SP(temperature=0.8, top_k=20, presence_penalty=0.5, seed=9)
        sampler.update_state(BatchUpdate(1, added=[(0, params, [1, 2], [])]))
        outputs.append(rejection(logits, drafts, num, probs).output_token_ids)
    assert torch.equal(outputs[0], outputs[1])
