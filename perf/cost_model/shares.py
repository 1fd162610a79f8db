"""The shares of a row's tiles a walk reads, merges or hashes, for logits at random columns:
the probabilities perf/kernel_model.py's access table (access.py) weighs loops and branches
with. Estimates for LLM-like rows, not bounds."""

from __future__ import annotations

import functools
import math

import torch


def record_tiles(kept: torch.Tensor | float, tiles: int) -> torch.Tensor:
    """The fraction of a walk's `tiles` that hold a new one of the `kept` largest logits seen
    so far, for logits in random order (a shuffled vocabulary, as the benchmark's): tile t's
    logits are a random share 1/t of the first t tiles', so it holds none of their `kept`
    largest with probability about (1 - 1/t)**kept; the mean over t = 1..tiles (about
    kept (1 + ln(tiles / kept)) of them when tiles >> kept). What a running
    top-k merges on (logprobs' top K, top-k/top-p stage 1's list): an estimate for LLM-like
    rows, not a bound."""
    return _records(kept, tiles)[0].mean(-1)


def multi_record_share(kept: torch.Tensor | float, tiles: int) -> torch.Tensor:
    """Of the tiles that hold a new one of the `kept` largest (`record_tiles`), the share
    holding two or more (the binomial count of a tile's new ones): the tiles that insert more
    than their max."""
    one_or_more, two_or_more = _records(kept, tiles)
    return two_or_more.mean(-1) / one_or_more.mean(-1)


def _records(kept: torch.Tensor | float, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., tiles]: the probability that tile t holds at least one, and at least two,
    logits above the `kept`-th largest of the tiles before it. Each of the union's largest
    lies in tile t with probability p = 1/t: at least m of tile t's logits beat the earlier
    tiles' kept-th when at least m of the union's kept + m - 1 largest are tile t's."""
    k = torch.as_tensor(kept, dtype=torch.float64).clamp(min=1.0).unsqueeze(-1)
    p = 1.0 / torch.arange(1, max(tiles, 1) + 1, dtype=torch.float64)
    one_or_more = 1.0 - (1.0 - p) ** k
    two_or_more = 1.0 - (1.0 - p) ** (k + 1) - (k + 1) * p * (1.0 - p) ** k
    return one_or_more, two_or_more


def visited_share(kept: torch.Tensor, tiles: int, unknown: torch.Tensor | None) -> torch.Tensor:
    """The fraction of a row's tiles a consumer of the tile maxima reads when it skips those
    below the `kept`-th largest logit (top-k's cut): the tiles holding one of the kept, at
    most `kept` of them, and of the others those marked unknown."""
    share = torch.clamp(kept / tiles, max=1.0)
    if unknown is not None:
        share = share + (1.0 - share) * unknown
    return share


def shared_tile_share(kept: torch.Tensor, tiles: int) -> torch.Tensor:
    """Of the tiles holding one of `kept` logits at random columns, the share holding two or
    more: P(n >= 2 | n >= 1) for n ~ Poisson(kept / tiles)."""
    rate = (kept / tiles).clamp(min=1e-9)
    none, one = torch.exp(-rate), rate * torch.exp(-rate)
    return (1.0 - none - one) / (1.0 - none)


def few_share(kept: torch.Tensor, tiles: int, few: int) -> torch.Tensor:
    """Of the tiles holding one of `kept` logits at random columns, the share holding at
    most `few`: P(n <= few | n >= 1) for n ~ Poisson(kept / tiles)."""
    rate = (kept / tiles).clamp(min=1e-9)
    term = torch.exp(-rate)
    none, at_most = term, term.clone()
    for n in range(1, few + 1):
        term = term * rate / n
        at_most = at_most + term
    return (at_most - none) / (1.0 - none)


def crowded_list_share(kept: torch.Tensor, chunks: int, ranks: int) -> torch.Tensor:
    """Per row, the probability that one of `chunks` lists holds `ranks` or more of the row's
    `kept` logits, for logits at random columns (a shuffled vocabulary): each logit in a list
    chosen uniformly, so the lists' counts are multinomial. What sends a covered row's race
    past its first `ranks` ranks of every list (kernels/list_race.py)."""
    return torch.tensor(
        [_crowded(round(float(n)), max(chunks, 1), ranks) for n in kept.flatten()],
        dtype=torch.float64,
    ).view(kept.shape)


@functools.cache
def _crowded(n: int, m: int, r: int) -> float:
    """P(max count >= r) for n balls in m bins, exactly: P(every count < r) = n! [y^n]
    (sum_{j<r} (y/m)^j / j!)^m (the exponential generating function of a bin holding fewer
    than r), 1 where n > (r - 1) m (some bin must hold r)."""
    if n < r:
        return 0.0
    if n > (r - 1) * m:
        return 1.0
    term = [1.0 / (m**j * math.factorial(j)) for j in range(r)]
    poly = [1.0] + [0.0] * n  # the power so far, to degree n
    for _ in range(m):
        poly = [sum(poly[d - j] * term[j] for j in range(min(r, d + 1))) for d in range(n + 1)]
    return min(1.0, max(0.0, 1.0 - math.factorial(n) * poly[n]))
