"""The decode workload: a persistent batch that stays full while requests churn through it.

A real server keeps its batch full from a waiting queue: each step some requests finish and
new ones take their rows, with every mix of sampling parameters at once. `RefillingBatchDriver`
produces exactly those `BatchUpdate`s (vLLM's semantics, see `graphsafe_sampler.testing`), and
`mixed_decode_params` draws the parameters: greedy and sampled rows side by side, top-k, top-p,
min_p, penalties, logit bias, stop ids under min_tokens, seeds and logprobs.

The driver's random choices never depend on the sampled tokens, so two drivers built with the
same arguments produce the same sequence of updates whatever their samplers draw: every
provider of a benchmark replays the same churn.
"""

from __future__ import annotations

import random
from typing import Any

from graphsafe_sampler.batch_update import AddedRequest, BatchUpdate, MoveDirectionality
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.testing.batch_driver import BatchDriver, MakeParams

# (name, recipe): one sampling recipe per request, drawn uniformly; 2 of 8 are greedy.
DECODE_RECIPES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("greedy", {"temperature": 0.0}),
    ("temperature", {"temperature": 0.8}),
    ("top-k", {"temperature": 0.7, "top_k": 50}),
    ("top-p", {"temperature": 0.7, "top_p": 0.9}),
    ("top-k+top-p", {"temperature": 1.0, "top_k": 40, "top_p": 0.95}),
    ("min-p", {"temperature": 1.0, "min_p": 0.05}),
    ("greedy", {"temperature": 0.0}),
    ("top-k+top-p+min-p", {"temperature": 0.6, "top_k": 20, "top_p": 0.8, "min_p": 0.02}),
)


def mixed_decode_params(rng: random.Random, config: SamplerConfig) -> SamplingParams:
    """One request's parameters: a recipe from `DECODE_RECIPES`, then independent features.

    About a third of requests carry penalties, a quarter a logit bias (1-32 entries), a
    quarter stop ids with a min_tokens still in force, half a seed, and half ask for
    logprobs (up to `config.max_num_logprobs`).
    """
    vocab = config.vocab_size

    def some_ids(count: int) -> list[int]:
        return rng.sample(range(vocab), min(count, vocab))

    _, recipe = rng.choice(DECODE_RECIPES)
    kwargs: dict[str, Any] = dict(recipe)
    if rng.random() < 1 / 3:
        kwargs.update(
            repetition_penalty=rng.choice([1.0, 1.05, 1.1, 1.2]),
            frequency_penalty=rng.choice([0.0, 0.3, 0.5]),
            presence_penalty=rng.choice([0.0, 0.5, 1.0]),
        )
    if rng.random() < 0.25:
        size = min(rng.randint(1, 32), config.max_logit_bias_tokens)
        kwargs["logit_bias"] = {t: rng.uniform(-10.0, 10.0) for t in some_ids(size)}
    if rng.random() < 0.25:
        # Many more tokens to go than a benchmark takes steps: the mask stays on.
        stop = some_ids(min(rng.randint(1, 4), config.max_stop_token_ids))
        kwargs.update(stop_token_ids=stop, min_tokens=1000)
    if rng.random() < 0.5:
        kwargs["seed"] = rng.randrange(2**63)
    if config.max_num_logprobs > 0 and rng.random() < 0.5:
        kwargs["logprobs"] = rng.randint(1, config.max_num_logprobs)
    return SamplingParams(**kwargs)


class RefillingBatchDriver(BatchDriver):
    """A `BatchDriver` whose adds refill the batch, so it stays full under churn.

    `BatchDriver.next_update` removes each request with probability `churn` but adds
    `randint(0, churn * capacity + 1)` requests, about half as many: at churn 0.1 and 256
    rows the batch settles near 130 requests. Here every free row below `target` is
    refilled in the same update (vLLM hands removed rows to new requests first), so
    `added == removed` once the batch is full, then up to 3 random swaps follow, as in the
    base driver. A full batch has no holes, so vLLM's condensing moves never occur.
    """

    def __init__(
        self,
        config: SamplerConfig,
        *,
        target: int | None = None,
        seed: int = 0,
        make_params: MakeParams = mixed_decode_params,
        churn: float = 0.1,
        max_prompt_len: int = 8,
    ) -> None:
        super().__init__(
            config, seed=seed, make_params=make_params, churn=churn, max_prompt_len=max_prompt_len
        )
        self.target = config.max_num_reqs if target is None else target
        if not 1 <= self.target <= config.max_num_reqs:
            raise ValueError(
                f"target must be in [1, max_num_reqs = {config.max_num_reqs}], got {self.target}"
            )

    def next_update(self) -> BatchUpdate:
        rng = self.rng
        capacity = self.config.max_num_reqs
        removed = [
            r for r in range(capacity) if self.rows[r] is not None and rng.random() < self.churn
        ]
        for row in removed:
            self.rows[row] = None
        free = [r for r in range(self.target) if self.rows[r] is None]
        added: list[AddedRequest] = []
        for row in free:
            req = self.new_request()
            self.rows[row] = req
            added.append((row, req.params, req.prompt_tok_ids, req.output_tok_ids))
        moved = []
        for _ in range(rng.randint(0, 3)):
            a, b = rng.randrange(self.target), rng.randrange(self.target)
            moved.append((a, b, MoveDirectionality.SWAP))
            self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        self.batch_size = max((r + 1 for r, q in enumerate(self.rows) if q is not None), default=0)
        return BatchUpdate(self.batch_size, tuple(removed), tuple(added), tuple(moved))


def decode_driver(
    num_rows: int, config: SamplerConfig, *, seed: int = 0, churn: float = 0.1
) -> RefillingBatchDriver:
    """The churning batch of the decode benchmark: `num_rows` requests, always full, each
    leaving with probability `churn` a step; prompts of up to 512 tokens (penalties read
    them) and the mixed parameters of `mixed_decode_params`."""
    if not 0.0 <= churn <= 1.0:
        raise ValueError(f"churn must be in [0, 1], got {churn}")
    return RefillingBatchDriver(config, target=num_rows, seed=seed, churn=churn, max_prompt_len=512)
