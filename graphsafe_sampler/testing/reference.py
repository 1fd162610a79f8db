"""Float64 reference models of the stages (docs/design.md §4), importable so that users can
test their own processors and engines against them.

Each takes one row's logits (float64 numpy) and the request that owns the row (a
`DriverRequest`, or None for an empty or padded row) and returns the processed row. They
share nothing with the implementation: plain Python over plain data, dicts and sorts.
"""

from __future__ import annotations

import math

import numpy as np

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.testing.batch_driver import DriverRequest


def allowed_token_ids(row: np.ndarray, req: DriverRequest | None) -> np.ndarray:
    if req is None or req.params.allowed_token_ids is None:
        return row
    out = np.full_like(row, -math.inf)
    ids = list(req.params.allowed_token_ids)
    out[ids] = row[ids]
    return out


def min_tokens(row: np.ndarray, req: DriverRequest | None, config: SamplerConfig) -> np.ndarray:
    if req is None or len(req.output_tok_ids) >= req.params.min_tokens:
        return row
    out = row.copy()
    stop = set(req.params.stop_token_ids or ())
    if config.eos_token_id is not None:
        stop.add(config.eos_token_id)  # whatever ignore_eos says, as vLLM does
    for tok in stop:
        out[tok] = -math.inf
    return out


def logit_bias(row: np.ndarray, req: DriverRequest | None) -> np.ndarray:
    if req is None or not req.params.logit_bias:
        return row
    out = row.copy()
    for tok, bias in req.params.logit_bias.items():
        out[tok] += bias
    return out


def min_p(row: np.ndarray, req: DriverRequest | None) -> np.ndarray:
    if req is None or req.params.min_p == 0.0:
        return row
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    keep = probs >= req.params.min_p * probs.max()
    return np.where(keep, row, -math.inf)


def min_p_threshold(row: np.ndarray, req: DriverRequest | None) -> float:
    """The logit at which min_p cuts (for telling boundary cases apart)."""
    if req is None or req.params.min_p == 0.0:
        return -math.inf
    return float(row.max() + math.log(req.params.min_p))


def bad_words(row: np.ndarray, req: DriverRequest | None) -> np.ndarray:
    if req is None or not req.params.bad_words_token_ids:
        return row
    out = row.copy()
    past = req.output_tok_ids
    for word in req.params.bad_words_token_ids:
        prefix = word[:-1]
        if len(past) >= len(prefix) and (not prefix or list(past[-len(prefix) :]) == prefix):
            out[word[-1]] = -math.inf
    return out


def penalties(row: np.ndarray, req: DriverRequest | None) -> np.ndarray:
    if req is None:
        return row
    p = req.params
    out = row.copy()
    counts: dict[int, int] = {}
    for tok in req.output_tok_ids:
        counts[tok] = counts.get(tok, 0) + 1
    seen = set(req.prompt_tok_ids or ()) | set(counts)
    for tok in seen:
        out[tok] = (
            out[tok] / p.repetition_penalty if out[tok] > 0 else out[tok] * p.repetition_penalty
        )
    for tok, n in counts.items():
        out[tok] -= p.frequency_penalty * n + p.presence_penalty
    return out


def top_k_top_p(row: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    out = row.copy()
    if 0 < top_k < len(row):
        kth = np.sort(out)[::-1][top_k - 1]
        out[out < kth] = -math.inf
    if top_p < 1.0 and (out > -math.inf).any():
        finite = out > -math.inf
        probs = np.zeros_like(out)
        probs[finite] = np.exp(out[finite] - out[finite].max())
        probs /= probs.sum()
        order = np.sort(probs[finite])[::-1]
        mass = np.cumsum(order)
        t = order[min(int(np.searchsorted(mass, top_p)), len(order) - 1)]
        out[probs < t] = -math.inf
    return out


def thinking_budget_token(
    tokens: list[int], budget: int | None, start: tuple[int, ...], end: tuple[int, ...]
) -> int | None:
    """The end-sequence token forced after `tokens` (prompt and outputs), or None: the
    latest start sequence began after the latest end sequence, and `budget` or more tokens
    follow it. Scans the whole history each call (the sampler keeps running state)."""

    def latest(pattern: tuple[int, ...]) -> int:
        found = [i for i in range(len(tokens) - len(pattern) + 1)
                 if tuple(tokens[i : i + len(pattern)]) == pattern]  # fmt: skip
        return max(found, default=-1)

    if budget is None or not start:
        return None
    began, ended = latest(start), latest(end)
    if began < 0 or began <= ended or len(tokens) - (began + len(start)) < budget:
        return None
    # continue the longest proper prefix of the end sequence that the history ends with
    done = max(
        (p for p in range(1, min(len(end), len(tokens) + 1)) if tuple(tokens[-p:]) == end[:p]),
        default=0,
    )
    return end[done]


def thinking_budget(
    row: np.ndarray, req: DriverRequest | None, config: SamplerConfig
) -> np.ndarray:
    """Every token but the forced end-sequence token is -inf where the budget is spent; a
    forced token an earlier mask made -inf reads 0."""
    if req is None:
        return row
    tokens = [*(req.prompt_tok_ids or ()), *req.output_tok_ids]
    forced = thinking_budget_token(
        tokens,
        req.params.thinking_token_budget,
        tuple(config.reasoning_start_token_ids),
        tuple(config.reasoning_end_token_ids),
    )
    if forced is None:
        return row
    x = np.full_like(row, -math.inf)
    x[forced] = 0.0 if row[forced] == -math.inf else row[forced]  # forcing beats masks
    return x


def pipeline(
    row: np.ndarray, req: DriverRequest | None, config: SamplerConfig
) -> tuple[np.ndarray, int, bool]:
    """docs/design.md §4 steps 2-8 for one row: (processed logits, greedy token, is greedy)."""
    if req is None:
        return row, int(np.argmax(row)), True
    x = allowed_token_ids(row, req)
    x = bad_words(x, req)
    x = min_tokens(x, req, config)
    x = logit_bias(x, req)
    x = penalties(x, req)
    x = thinking_budget(x, req, config)
    greedy = int(np.argmax(x))
    is_greedy = req.params.temperature < 1e-5
    x = x / (1.0 if is_greedy else req.params.temperature)
    x = min_p(x, req)
    return top_k_top_p(x, req.params.top_k, req.params.top_p), greedy, is_greedy


def is_top_p_set_within(kept: np.ndarray, row: np.ndarray, top_p: float, tol: float) -> bool:
    """Whether `kept` ([V] bool) is a valid top-p set of `row` ([V] float64 logits, -inf
    where an earlier step cut: masks, min_p, top-k) for some top_p within `tol` of `top_p`:
    every token at or above its lowest value, with a mass (the softmax over the finite
    tokens) that reaches top_p - tol while the tokens above its lowest value stay under
    top_p + tol. Two float32 searches that add masses in different orders may keep sets
    that differ by the tokens at the boundary where the target lies within rounding of a
    cumulative mass; both pass this, a cut off by more than rounding does not."""
    finite = row > -math.inf
    if not kept.any() or (kept & ~finite).any():
        return False
    lowest = row[kept].min()
    if not np.array_equal(kept, finite & (row >= lowest)):
        return False
    probs = np.exp(row[finite] - row[finite].max())
    probs /= probs.sum()
    mass = float(probs[kept[finite]].sum())
    above = float(probs[(kept & (row > lowest))[finite]].sum())
    return mass >= top_p - tol and above < top_p + tol
