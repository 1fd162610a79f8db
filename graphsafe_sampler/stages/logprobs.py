"""Logprobs (step 10): column 0 the sampled token, columns 1..K the top K in descending
order, and the sampled token's rank, from the raw or the processed logits.

The top K and the sampled value are taken on the logits, then shifted by the row's
logsumexp in the *_logprobs modes: log_softmax only shifts a row, so the order is the same
and no [num_rows, V] logprobs tensor is written. Ranks compare logprobs, as vLLM does (the
shift can merge neighbouring logits). A row with every token masked has logsumexp -inf: its
logprobs stay -inf, never NaN.
"""

from __future__ import annotations

import torch

from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.stages.candidates import (
    tile_exp_sums,
    tile_max,
    tile_shifts,
    top_candidates,
)


def compute_logprobs(
    source: torch.Tensor,  # [num_rows, V] float32, raw or processed logits
    tokens: torch.Tensor,  # [num_rows] int64, the sampled tokens
    k: int,  # K = max_num_logprobs >= 1
    subtract_lse: bool,  # the *_logprobs modes (else *_logits)
    requested: torch.Tensor | None = None,  # [num_rows, C] int64 chosen ids, -1 unused
) -> LogprobsTensors:
    # One read of the row for each tile's maximum and sum of exp against it, which give
    # the top K's first level and the logsumexp; a second for the ranks.
    # [num_rows, tiles] each: maxima, and sums of exp against them (the logsumexp's, fused)
    tiles, sums = tile_exp_sums(source) if subtract_lse else (tile_max(source), None)
    # the top K: exactly topk's values (ties among them in no set order), at about a
    # quarter of its cost over a CPU row (`top_candidates`)
    top_values, top_ids = top_candidates(source, k, tiles)  # [num_rows, K]
    sampled = source.gather(1, tokens[:, None])  # [num_rows, 1]
    values = torch.cat([sampled, top_values], dim=1)  # [num_rows, K + 1]
    lse = None
    if subtract_lse:
        assert sums is not None
        lse = _logsumexp(tiles, sums)  # [num_rows, 1]
        lse = torch.where(lse.isfinite(), lse, 0.0)
        values = values - lse
        ranks = (source - lse >= values[:, :1]).sum(dim=-1)
    else:
        ranks = (source >= sampled).sum(dim=-1)  # [num_rows]
    chosen: tuple[torch.Tensor | None, ...] = (None, None, None)
    if requested is not None:
        chosen = (requested.to(torch.int32), *requested_logprobs(source, requested, lse))
    return LogprobsTensors(
        torch.cat([tokens[:, None], top_ids], dim=1).to(torch.int32),
        values,
        ranks.to(torch.int32),
        *chosen,
    )


def requested_logprobs(
    source: torch.Tensor,  # [num_rows, V] float32, raw or processed logits
    ids: torch.Tensor,  # [num_rows, C] int64 token ids, -1 where unused
    lse: torch.Tensor | None,  # [num_rows, 1] float32 logsumexp (None: the *_logits modes)
) -> tuple[torch.Tensor, torch.Tensor]:
    """The values and 1-based ranks of chosen token ids (`SamplingParams.logprob_token_ids`):
    ([num_rows, C] float32, [num_rows, C] int32), -inf and 0 where an id is -1.

    Values as `compute_logprobs` gives them (the logit, minus the row's logsumexp with
    `lse`); a rank is the number of tokens whose value is >= the id's, compared in the
    same space as the values (the shift can merge neighbouring logits). One comparison
    per column: C is a small static capacity (inductor does not merge the C sums into one
    read).
    """
    used = ids >= 0
    values = source.gather(1, ids.clamp(min=0))  # [num_rows, C]
    shifted = source
    if lse is not None:
        lse = torch.where(lse.isfinite(), lse, 0.0)
        values = values - lse
        shifted = source - lse
    ranks = torch.stack(
        [(shifted >= values[:, j : j + 1]).sum(dim=-1) for j in range(ids.shape[1])], dim=1
    )  # [num_rows, C]
    values = torch.where(used, values, float("-inf"))
    return values, torch.where(used, ranks, 0).to(torch.int32)


def row_logsumexp(source: torch.Tensor) -> torch.Tensor:
    """[num_rows, V] float32 -> [num_rows, 1]: `torch.logsumexp` of each row as
    `compute_logprobs` takes it (from tiles), non-finite where it is."""
    return _logsumexp(*tile_exp_sums(source))


def _logsumexp(
    tiles: torch.Tensor,  # [num_rows, tiles]: tile_max(source)
    sums: torch.Tensor,  # [num_rows, tiles]: tile_exp_sums(source)'s sums
) -> torch.Tensor:
    """[num_rows, 1]: each row's logsumexp from its tiles (sum over tiles of the tile's sum
    of exp against its maximum, times exp(tile max - row max)); not finite where the row
    holds NaN or +inf, or is all -inf, as `torch.logsumexp` is there."""
    shift = tile_shifts(tiles)  # the shifts `sums` were taken against
    row_max = tiles.amax(-1, keepdim=True)  # [num_rows, 1]
    row_shift = torch.where(row_max.isfinite(), row_max, 0.0)
    total = (sums * torch.exp(shift - row_shift)).sum(-1, keepdim=True)
    return row_shift + torch.log(total)
