"""Dict-based float64 reference models of the built-in processors (DESIGN §4).

Each takes one row's logits (float64 numpy) and the request that owns the row (or None for
an empty or padded row) and returns the processed row. They share nothing with the
implementation: plain Python over plain data.
"""

from __future__ import annotations

import math

import numpy as np

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.testing import DriverRequest


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
