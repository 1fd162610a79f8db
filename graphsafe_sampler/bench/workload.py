"""The decode workload: a persistent batch that stays full while requests churn through it.

A real server keeps its batch full from a waiting queue: each step some requests finish and
new ones take their rows, with every mix of sampling parameters at once. `decode_driver` is
the one `BatchDriver` (graphsafe_sampler.testing) set to produce exactly those `BatchUpdate`s,
and `mixed_decode_params` draws the parameters: greedy and sampled rows side by side, top-k,
top-p, min_p, penalties, logit bias, stop ids under min_tokens, seeds and logprobs.

The driver's random choices never depend on the sampled tokens, so two drivers built with the
same arguments produce the same sequence of updates whatever their samplers draw: every
provider of a benchmark replays the same churn.
"""

from __future__ import annotations

import random
from typing import Any

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.testing.batch_driver import BatchDriver, refill

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


def decode_driver(
    num_rows: int, config: SamplerConfig, *, seed: int = 0, churn: float = 0.1
) -> BatchDriver:
    """The churning batch of the decode benchmark: `num_rows` requests, always full, each
    leaving with probability `churn` a step; prompts of up to 512 tokens (penalties read
    them) and the mixed parameters of `mixed_decode_params`.

    Every free row is refilled in the same update (`refill`: vLLM hands removed rows to new
    requests first), so `added == removed` once the batch is full; up to 3 random swaps
    follow. A full batch has no holes, so vLLM's condensing moves never occur (`condense=0`).
    """
    return BatchDriver(
        config,
        target=num_rows,
        seed=seed,
        make_params=mixed_decode_params,
        churn=churn,
        max_prompt_len=512,
        joins=refill,
        condense=0.0,
    )
