"""What a tile-max table holds (docs/kernels.md, tile maxima): the reference the kernel
tests compare `process_logits`' table with, and the tables they hand the consumers (stage 1
of top-k/top-p, sampling)."""

from __future__ import annotations

import torch


def exact_tile_maxima(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """[rows, ceil(V / block_size)] float32: each tile's largest value, +inf where it holds
    NaN."""
    rows, vocab = x.shape
    tiles = -(-vocab // block_size)
    padded = torch.full((rows, tiles * block_size), float("-inf"), dtype=x.dtype, device=x.device)
    padded[:, :vocab] = torch.where(torch.isnan(x), float("inf"), x)
    return padded.view(rows, tiles, block_size).amax(-1).float()


def expected_tile_maxima(x: torch.Tensor, unknown: torch.Tensor, block_size: int) -> torch.Tensor:
    """`exact_tile_maxima`, with +inf (unknown) at every tile holding a token of `unknown`
    ([rows, V] bool: the tokens a phase after the dense pass changed)."""
    exact = exact_tile_maxima(x, block_size)
    rows, vocab = unknown.shape
    tiles = exact.shape[1]
    padded = torch.zeros(rows, tiles * block_size, dtype=torch.bool, device=unknown.device)
    padded[:, :vocab] = unknown
    touched = padded.view(rows, tiles, block_size).any(-1)
    return torch.where(touched.to(exact.device), float("inf"), exact)
