"""What the filtering kernels read on the benchmark's own rows: per parameter set, the tokens
the filters keep and the tiles each consumer of the tile maxima reads, counted on rows of
`graphsafe_sampler.bench.logits.llm_like_logits` (the GPU check's logits) filtered by the
library's PyTorch reference. perf/kernel_model.py's access table (access.py) takes these in
place of the analytic shares, which take top-k's k as every row's survivors and so read
min_p's and top-p's cuts as absent.

Counted, not timed: which tiles a kernel's rule reads, on the same rows the GPU check feeds
it. The rows' penalties, bias and bans are left out (the bench puts them on about 700 of
151,936 tokens, at random ids), and so are ties (the rows' noise breaks them)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

TEMPERATURES = "model:temperatures"
"""A pseudo-argument perf/kernel_model.py hands the launches after processing: per row, the
temperature its slot's table holds (from the processing launch), with which the filters'
launches count their reads on the benchmark's rows (`row_counts`)."""

FILTERS = "model:filters"
"""A pseudo-argument perf/kernel_model.py hands the launches after stage 1's (top-k/top-p's
first): per row, (temperature, top_k, top_p, min_p) [rows, 4] float64 (`row_filters`), with
which logprobs counts its reads on the benchmark's rows."""

ROWS = 8
"""Benchmark rows the counts average over (seeded: the same rows every run)."""
SEED = 0


@dataclass(frozen=True)
class RowCounts:
    """Means over the rows, for one parameter set."""

    survivors: float  # tokens the filters keep (min_p, then top-k, then top-p)
    candidate_tiles: float  # tiles at or above stage 1's floor (top-k rows: `_tile_floor`)
    kth_sorted: float  # rows `_tile_floor` sorts for: k maxima reach min_p's floor, or no min_p
    logprobs_tiles: float  # tiles logprobs reads with the raw tiles, over the sampled token


@functools.cache
def bench_row_counts(
    vocab: int,
    block: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    logprobs_k: int,
) -> RowCounts:
    """The counts for rows whose filters are (top_k <= 0 or >= V: off; top_p >= 1: off;
    min_p 0: off), at `temperature` (below 1e-5: greedy, one survivor), with `logprobs_k`
    top logprobs (logprobs reads the tiles whose raw max reaches the K-th largest raw tile
    max or the sampled token's raw logit, `_from_tiles`; the sampled token drawn from the
    filtered softmax)."""
    from graphsafe_sampler.bench.logits import llm_like_logits
    from graphsafe_sampler.stages.min_p import min_p_threshold
    from graphsafe_sampler.stages.top_k_top_p import top_k_top_p_cut

    # float32, as the kernels hold them: the processed logits are the raw over temperature
    raw = llm_like_logits(ROWS, vocab, seed=SEED)  # [R, V] float32
    greedy = temperature < 1e-5
    processed = raw / (1.0 if greedy else temperature)
    scaled = processed
    if min_p > 0.0:
        floor = min_p_threshold(scaled, torch.full((ROWS,), min_p, dtype=torch.float32))
        scaled = torch.where(scaled < floor, float("-inf"), scaled)
    k_on = 0 < top_k < vocab
    cut = scaled.amax(-1, keepdim=True)  # [R, 1]: greedy keeps the max
    if not greedy:
        cut = top_k_top_p_cut(
            scaled,
            torch.full((ROWS,), top_k if k_on else 0, dtype=torch.int64),
            torch.full((ROWS,), top_p, dtype=torch.float32),
            conditional=False,
            sort=True,
        )
    kept = (scaled >= cut) & (scaled > float("-inf"))  # [R, V]: min_p's -inf are out
    tiles = math.ceil(vocab / block)
    pad = tiles * block - vocab

    def tile_max(values: torch.Tensor) -> torch.Tensor:  # [R, V] -> [R, tiles]
        padded = torch.nn.functional.pad(values, (0, pad), value=float("-inf"))
        return padded.view(ROWS, tiles, block).amax(-1)

    processed_max = tile_max(processed)
    raw_max = tile_max(raw)
    # stage 1's floor for a top-k row: the k-th largest tile max, raised to max + ln(min_p)
    floor = torch.full((ROWS, 1), float("-inf"))
    if min_p > 0.0:
        floor = processed_max.amax(-1, keepdim=True) + math.log(min_p)
    # the k-th tile max is sorted for where k maxima reach min_p's floor (-inf: always)
    sorted_rows = ((processed_max >= floor).sum(-1) >= top_k) | (floor[:, 0] == float("-inf"))
    if k_on and top_k <= tiles:  # fewer tiles than k: no floor (`kth_known`: -inf)
        floor = torch.maximum(floor, processed_max.topk(top_k, dim=-1).values[:, -1:])
    candidate = (processed_max >= floor).sum(-1).double()
    # logprobs: E over the sampled token t of the tiles reaching min(raw[t], K-th raw max)
    probs = torch.softmax(torch.where(kept, scaled, float("-inf")).double(), dim=-1)  # [R, V]
    kth = torch.full((ROWS, 1), float("inf"))  # K = 0: no floor
    if logprobs_k > 0:
        kth = raw_max.topk(min(logprobs_k, tiles), dim=-1).values[:, -1:]
    reads = torch.zeros(ROWS, dtype=torch.float64)
    for row in range(ROWS):
        ids = kept[row].nonzero().flatten()
        lowest = torch.minimum(raw[row, ids], kth[row])  # [kept]
        reached = (raw_max[row][None, :] >= lowest[:, None]).sum(-1).double()
        reads[row] = (probs[row, ids] * reached).sum() / probs[row, ids].sum()
    return RowCounts(
        survivors=float(kept.sum(-1).double().mean()),
        candidate_tiles=float(candidate.mean()),
        kth_sorted=float(sorted_rows.double().mean()),
        logprobs_tiles=float(reads.mean()),
    )


def row_filters(a: dict[str, Any], c: dict[str, Any]) -> torch.Tensor | None:
    """[rows, 4] float64 (temperature, top_k, top_p, min_p) from a top-k/top-p launch (stage
    1's or the cut's) and the processing launch's temperatures; None without those."""
    temperature = a.get(TEMPERATURES)
    if temperature is None:
        return None
    slots = a["slots_ptr"]
    min_p = a["min_p_ptr"][slots] if c["HAS_MIN_P"] else torch.zeros(slots.shape[0])
    return torch.stack(
        [temperature, a["top_k_ptr"][slots], a["top_p_ptr"][slots], min_p], dim=-1
    ).to(torch.float64)


def row_counts(
    filters: torch.Tensor, vocab: int, block: int, field: str, logprobs_k: int = 0
) -> torch.Tensor:
    """[rows] float64: per row, the `RowCounts` field `field` of `bench_row_counts` for its
    filters (counted once a distinct set)."""
    return torch.tensor(
        [
            getattr(bench_row_counts(vocab, block, float(t), int(k), float(p), float(m),
                                     logprobs_k), field)
            for t, k, p, m in filters.tolist()
        ],
        dtype=torch.float64,
    )  # fmt: skip
