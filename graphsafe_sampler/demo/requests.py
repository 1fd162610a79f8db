"""The demo's request stream: what a request is, and the stream the engine serves.

A `DemoRequest` is an arrival step, a prompt, `SamplingParams` of one kind and a
`max_tokens`. `make_request_stream` draws the whole stream up front from one seeded
`random.Random`, cycling through `REQUEST_KINDS` (greedy, top-k/top-p/min-p, penalties,
logit bias, stop ids and EOS with min_tokens, bad words, ignore_eos), so that every mode
serves exactly the same requests. Pure host code: no torch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from graphsafe_sampler.params import SamplingParams


@dataclass(frozen=True)
class DemoRequest:
    """One request of the stream: when it arrives, what it asks for, and its kind's name."""

    request_id: int
    arrival_step: int
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    max_tokens: int
    kind: str


def _request_params(
    kind: str, rng: random.Random, vocab_size: int, eos_token_id: int, max_tokens: int
) -> SamplingParams:
    """SamplingParams of one request kind; the token ids involved are drawn from `rng`, and
    min_tokens stays below `max_tokens` so that stop tokens and EOS get their turn."""

    def tokens(n: int) -> list[int]:
        return rng.sample(range(vocab_size - 1), n)  # never the EOS id

    seed = rng.randrange(2**63) if rng.random() < 0.5 else None  # half seeded, half not
    if kind == "greedy":
        return SamplingParams(temperature=0.0)
    if kind == "temperature":
        return SamplingParams(temperature=0.8, seed=seed)
    if kind == "top-k":
        return SamplingParams(temperature=1.0, top_k=20, seed=seed)
    if kind == "top-p":
        return SamplingParams(temperature=0.9, top_p=0.8, seed=seed)
    if kind == "min-p":
        return SamplingParams(temperature=1.0, min_p=0.1, seed=seed)
    if kind == "top-k+top-p+min-p":
        return SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.02, seed=seed)
    if kind == "penalties":
        return SamplingParams(
            temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.6
        )
    if kind == "logit-bias":
        bias = {t: rng.uniform(-8.0, 8.0) for t in tokens(8)}
        return SamplingParams(temperature=0.9, logit_bias=bias, seed=seed)
    if kind == "stop+min_tokens":
        # Strongly biased stop tokens: masked for the first min_tokens tokens, likely after.
        stop = tokens(2)
        return SamplingParams(
            temperature=1.0,
            stop_token_ids=stop,
            logit_bias=dict.fromkeys(stop, 12.0),
            min_tokens=rng.randint(min(3, max_tokens - 1), min(8, max_tokens - 1)),
            seed=seed,
        )
    if kind == "eos+min_tokens":
        return SamplingParams(
            temperature=1.0,
            logit_bias={eos_token_id: 11.0},
            min_tokens=rng.randint(min(2, max_tokens - 1), min(6, max_tokens - 1)),
            seed=seed,
        )
    if kind == "bad-words":
        words = [[t] for t in tokens(3)] + [tokens(2) for _ in range(2)]
        return SamplingParams(temperature=0.9, bad_words_token_ids=words, seed=seed)
    if kind == "ignore-eos":
        return SamplingParams(
            temperature=1.0, logit_bias={eos_token_id: 11.0}, ignore_eos=True, seed=seed
        )
    raise ValueError(f"unknown request kind {kind!r}")


REQUEST_KINDS = (
    "greedy",
    "temperature",
    "top-k",
    "top-p",
    "min-p",
    "top-k+top-p+min-p",
    "penalties",
    "logit-bias",
    "stop+min_tokens",
    "eos+min_tokens",
    "bad-words",
    "ignore-eos",
)


def make_request_stream(
    *,
    num_steps: int,
    max_num_reqs: int,
    vocab_size: int,
    eos_token_id: int,
    max_prompt_len: int,
    max_tokens: int,
    seed: int,
) -> list[DemoRequest]:
    """Requests arriving over the first 3/4 of `num_steps` (the rest lets the batch drain),
    at a rate that keeps about 3/4 of `max_num_reqs` rows busy; kinds in turn."""
    rng = random.Random(seed)
    mean_len = (4 + max_tokens) / 2
    rate = 0.75 * max_num_reqs / mean_len  # arrivals per step
    stream: list[DemoRequest] = []
    clock = 0.0
    while True:
        clock += rng.expovariate(rate)
        arrival = int(clock)
        if arrival >= max(1, (3 * num_steps) // 4):
            return stream
        kind = REQUEST_KINDS[len(stream) % len(REQUEST_KINDS)]
        prompt = tuple(rng.randrange(vocab_size - 1) for _ in range(rng.randint(1, max_prompt_len)))
        request_max_tokens = rng.randint(min(4, max_tokens), max_tokens)
        params = _request_params(kind, rng, vocab_size, eos_token_id, request_max_tokens)
        stream.append(
            DemoRequest(
                request_id=len(stream),
                arrival_step=arrival,
                prompt_token_ids=prompt,
                params=params,
                max_tokens=request_max_tokens,
                kind=kind,
            )
        )
