"""LLM-like benchmark logits: a few tokens hold most of the mass, then a long, heavy tail.

docs/design.md §6: top-k/top-p cost depends on the shape of the distribution (how many tokens a
nucleus holds, how far apart the top logits are), so benchmarks must not feed `randn` rows,
whose softmax is nearly flat over the whole vocabulary.

The model is Zipf's law over a shuffled vocabulary. In each row the token of rank r
(1 = most likely) gets the logit

    TOP_LOGIT - SCALE * peakedness * ln(r) + NOISE_STD * n,   n ~ N(0, 1) per token,

so that, noise aside, p(r) ∝ r^-(SCALE * peakedness): a power law, whose tail is far heavier
than a Gaussian's. Then the vocabulary is permuted at random, independently per row, so the
likely tokens sit at different, scattered ids in every row (as in a real batch, and so no
kernel gets a sorted or cache-friendly row by accident). The noise breaks exact ties and
lets neighbouring ranks swap now and then.

`peakedness` is the one knob: larger is more confident (less mass in the tail). At the
default 1.1 (Zipf exponent 1.65) and vocab 128,256, a row's top token holds about 45% of the
mass, the top 10 tokens about 84%, the top 100 about 96.5% (top 1,000: 99.2%); top-p 0.9
keeps about 20 tokens and top-p 0.95 about 60. The top logit is about 15 and about 9,000
tokens (7%) have a positive logit, which matters for the repetition penalty (it divides
positive logits and multiplies negative ones). For comparison, peakedness 0.7 (exponent
1.05) puts only about 11% on the top token, every logit is positive and top-p 0.9 keeps
about 22,000 tokens; 1.4 (exponent 2.1) puts about 62% on the top token and top-p 0.9
keeps about 5.
"""

from __future__ import annotations

import torch

TOP_LOGIT = 15.0
"""Logit of the rank-1 token before noise: the scale a real LM head produces."""
SCALE = 1.5
"""Zipf exponent per unit of peakedness (exponent = SCALE * peakedness)."""
NOISE_STD = 0.5
"""Standard deviation of the Gaussian noise added to every logit."""


def llm_like_logits(
    num_rows: int,
    vocab_size: int,
    *,
    peakedness: float = 1.1,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """[num_rows, vocab_size] logits shaped like an LLM's (see the module docstring).

    Deterministic in (num_rows, vocab_size, peakedness, seed): everything is drawn on the
    CPU from one seeded generator, in float32, and only then cast to `dtype` and moved to
    `device`, so every device and dtype gets the same values (up to the cast).
    """
    if num_rows < 1 or vocab_size < 2:
        raise ValueError(f"need num_rows >= 1 and vocab_size >= 2, got {num_rows} and {vocab_size}")
    if not peakedness > 0.0:
        raise ValueError(f"peakedness must be > 0, got {peakedness}")
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
    by_rank = (TOP_LOGIT - SCALE * peakedness * ranks.log()).to(torch.float32)  # [V]
    noise = torch.randn(num_rows, vocab_size, generator=gen)  # [num_rows, V]
    values = noise.mul_(NOISE_STD).add_(by_rank)  # values[i, r - 1]: rank r of row i
    # token_of_rank[i, r - 1] = the token id that gets rank r in row i
    token_of_rank = torch.stack(
        [torch.randperm(vocab_size, generator=gen) for _ in range(num_rows)]
    )
    logits = torch.empty_like(values).scatter_(1, token_of_rank, values)
    return logits.to(device=device, dtype=dtype)
