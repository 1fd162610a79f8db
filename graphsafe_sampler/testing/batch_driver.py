"""`BatchDriver`: random persistent-batch churn with vLLM's semantics, for tests and fuzzers.

It keeps its own host-side picture of the batch (row -> request, with a live output list) and
produces `BatchUpdate`s that a real engine could send: removals, adds into free rows (as
vLLM fills removed rows first), swaps, and condensing unidirectional moves. A reference model
can read `driver.rows` after each update.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from graphsafe_sampler.batch_update import AddedRequest, BatchUpdate, MoveDirectionality
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams

MakeParams = Callable[[random.Random, SamplerConfig], SamplingParams]


@dataclass
class DriverRequest:
    """What the engine knows of one request."""

    params: SamplingParams
    prompt_tok_ids: list[int] | None
    output_tok_ids: list[int] = field(default_factory=list)


def random_sampling_params(rng: random.Random, config: SamplerConfig) -> SamplingParams:
    """Random params touching every field, each feature on in some requests and off in others."""
    vocab = config.vocab_size

    def some_ids(limit: int) -> list[int]:
        return rng.sample(range(vocab), rng.randint(1, min(limit, vocab)))

    def maybe(p: float) -> bool:
        return rng.random() < p

    logit_bias = None
    if maybe(0.4):
        size = config.max_logit_bias_tokens if maybe(0.1) else rng.randint(1, 8)
        size = min(size, config.max_logit_bias_tokens)
        logit_bias = {t: rng.uniform(-5.0, 5.0) for t in some_ids(size)}
    allowed = None
    if maybe(0.25):
        allowed = some_ids(max(2, vocab // 2))
    stop_size = config.max_stop_token_ids if maybe(0.1) else min(4, config.max_stop_token_ids)
    stop = some_ids(stop_size) if maybe(0.5) else None
    bad_words = None
    if maybe(0.25):
        bad_words = [
            [rng.randrange(vocab) for _ in range(rng.randint(1, min(3, config.max_bad_word_len)))]
            for _ in range(rng.randint(1, min(3, config.max_bad_words)))
        ]
        if sum(map(len, bad_words)) > config.max_bad_words_tokens:
            bad_words = None
    return SamplingParams(
        temperature=0.0 if maybe(0.25) else rng.uniform(0.2, 1.5),
        top_p=1.0 if maybe(0.5) else rng.uniform(0.1, 1.0),
        top_k=rng.choice([0, -1, 1, 2, 5, 50]),
        min_p=0.0 if maybe(0.5) else rng.uniform(0.0, 0.3),
        presence_penalty=0.0 if maybe(0.5) else rng.uniform(-1.0, 1.0),
        frequency_penalty=0.0 if maybe(0.5) else rng.uniform(-1.0, 1.0),
        repetition_penalty=1.0 if maybe(0.5) else rng.uniform(0.5, 1.5),
        seed=rng.randrange(2**63) if maybe(0.5) else None,
        logit_bias=logit_bias,
        allowed_token_ids=allowed,
        bad_words_token_ids=bad_words,
        min_tokens=rng.choice([0, 0, 1, 3, 10]),
        stop_token_ids=stop,
        ignore_eos=maybe(0.2),
        logprobs=rng.randint(0, config.max_num_logprobs) if maybe(0.5) else None,
    )


class BatchDriver:
    """Random `BatchUpdate`s over a batch of at most `config.max_num_reqs` rows."""

    def __init__(
        self,
        config: SamplerConfig,
        *,
        seed: int = 0,
        make_params: MakeParams = random_sampling_params,
        churn: float = 0.25,
        max_prompt_len: int = 8,
    ) -> None:
        self.config = config
        self.rng = random.Random(seed)
        self.make_params = make_params
        self.churn = churn
        self.max_prompt_len = max_prompt_len
        self.rows: list[DriverRequest | None] = [None] * config.max_num_reqs
        self.batch_size = 0

    def new_request(self) -> DriverRequest:
        rng, vocab = self.rng, self.config.vocab_size
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, self.max_prompt_len))]
        # Some requests resume with outputs already generated (preemption).
        output = [rng.randrange(vocab) for _ in range(rng.choice([0, 0, 0, 2, 5]))]
        return DriverRequest(self.make_params(rng, self.config), prompt or None, output)

    def next_update(self) -> BatchUpdate:
        """A random update, already applied to `self.rows`."""
        rng = self.rng
        capacity = self.config.max_num_reqs
        removed: list[int] = []
        added: list[AddedRequest] = []
        moved: list[tuple[int, int, MoveDirectionality]] = []
        for row in range(capacity):
            if self.rows[row] is not None and rng.random() < self.churn:
                removed.append(row)
                self.rows[row] = None
        free = [r for r in range(capacity) if self.rows[r] is None]
        num_add = rng.randint(0, max(1, int(self.churn * capacity) + 1))
        for row in sorted(rng.sample(free, min(num_add, len(free)))):
            req = self.new_request()
            self.rows[row] = req
            added.append((row, req.params, req.prompt_tok_ids, req.output_tok_ids))
        for _ in range(rng.randint(0, 3)):
            a, b = rng.randrange(capacity), rng.randrange(capacity)
            moved.append((a, b, MoveDirectionality.SWAP))
            self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        if rng.random() < 0.5:
            # Condense as vLLM does: move the last requests into the lowest holes.
            while True:
                holes = [r for r, q in enumerate(self.rows) if q is None]
                last = max((r for r, q in enumerate(self.rows) if q is not None), default=-1)
                if not holes or holes[0] > last:
                    break
                moved.append((last, holes[0], MoveDirectionality.UNIDIRECTIONAL))
                self.rows[holes[0]], self.rows[last] = self.rows[last], None
        last = max((r for r, q in enumerate(self.rows) if q is not None), default=-1)
        self.batch_size = last + 1
        return BatchUpdate(self.batch_size, tuple(removed), tuple(added), tuple(moved))

    def record_tokens(self, token_ids: list[int], keep: list[bool] | None = None) -> None:
        """Append committed tokens (one per row) to the live output lists, as an engine does."""
        for row, tok in enumerate(token_ids):
            req = self.rows[row] if row < len(self.rows) else None
            if req is not None and (keep is None or keep[row]):
                req.output_tok_ids.append(tok)
