"""What a tile-max table holds (docs/kernels.md, tile maxima): the reference the kernel
tests compare `process_logits`' tables with, and the tables they hand the consumers (stage 1
of top-k/top-p, sampling, logprobs)."""

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
    ([rows, V] bool: tokens that held their tile's max and fell in a phase after the dense
    pass, `library.update_tiles`)."""
    exact = exact_tile_maxima(x, block_size)
    rows, vocab = unknown.shape
    tiles = exact.shape[1]
    padded = torch.zeros(rows, tiles * block_size, dtype=torch.bool, device=unknown.device)
    padded[:, :vocab] = unknown
    touched = padded.view(rows, tiles, block_size).any(-1)
    return torch.where(touched.to(exact.device), float("inf"), exact)


def raw_tiles(source: torch.Tensor, block_size: int = 1024) -> torch.Tensor:
    """[rows, ceil(V / block_size), 2] float32: each tile's max (`exact_tile_maxima`) and
    sum of exp(x - max) (a -inf max shifts by 0; NaN or +inf make it NaN), in float64."""
    x = source.double()
    rows, vocab = x.shape
    tiles = -(-vocab // block_size)
    padded = torch.full((rows, tiles * block_size), float("-inf"), dtype=x.dtype, device=x.device)
    padded[:, :vocab] = x
    top = exact_tile_maxima(x, block_size).double()
    shift = torch.where(top == float("-inf"), 0.0, top)
    sums = torch.exp(padded.view(rows, tiles, block_size) - shift[..., None]).sum(-1)
    return torch.stack([top, sums], dim=-1).float().contiguous()
