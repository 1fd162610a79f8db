"""A tiny decoder-only transformer whose decode step is graph-safe, for the demo and benchmarks.

Random weights from a seed; nothing is downloaded. Llama-shaped, only small: token and
learned position embeddings, `num_layers` pre-norm blocks (RMSNorm -> causal self-attention
-> residual, RMSNorm -> SwiGLU MLP -> residual), a final RMSNorm and an LM head.

The KV cache is preallocated per *KV slot* (the engine gives each running request one):
`k_cache`/`v_cache` are `[num_layers, num_kv_slots + 1, max_seq_len, num_heads, head_dim]`
buffers that are only ever written in place, so their addresses are fixed for a captured
graph. The extra slot (`padding_kv_slot`) is scratch for the padded rows of a batch bucket.

Two entry points:

- `forward(input_ids, kv_slots, positions)` is the decode step: one token per row of a
  padded batch, static shapes, positions held in a device tensor. It writes each row's key
  and value at `(kv_slot, position)` with `index_put_` and attends over that slot's cache
  masked to positions `<= position`. No host reads, no data-dependent shapes: it can be
  compiled with `torch.compile(fullgraph=True)` and captured in a CUDA graph with the
  sampler.
- `prefill(kv_slot, token_ids)` is eager host-driven code for one request: a full causal
  forward over its prompt that fills the slot's cache. The engine prefills all prompt tokens
  but the last, then feeds the last one to the decode step, whose logits give the first
  output token; so every sampled token comes out of the decode step, and the sampler's
  token positions (`len(prompt) + len(output)`) line up with the cache's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class TinyDecoderConfig:
    """Sizes of a `TinyDecoder`, fixed for its life (they decide the cache's shape).

    vocab_size: LM-head width V. hidden_size: model width (a multiple of num_heads).
    num_layers, num_heads: transformer blocks and attention heads per block.
    mlp_size: SwiGLU inner width. max_seq_len: KV-cache capacity per slot, prompt and
    output tokens together. num_kv_slots: requests whose caches are held at once.
    logit_scale: standard deviation of the LM head's logits on random inputs (random
    weights give nearly flat logits; a few units of spread make sampling look like an LLM's).
    seed: seeds the random weights.
    """

    vocab_size: int = 4099
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_size: int = 128
    max_seq_len: int = 96
    num_kv_slots: int = 16
    logit_scale: float = 3.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "mlp_size",
            "max_seq_len",
            "num_kv_slots",
        ):
            _check_positive(name, getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size = {self.hidden_size} must be a multiple of "
                f"num_heads = {self.num_heads}"
            )
        if isinstance(self.logit_scale, bool) or not isinstance(self.logit_scale, (int, float)):
            raise TypeError(f"logit_scale must be a float, got {type(self.logit_scale).__name__}")
        if not 0.0 < self.logit_scale < math.inf:
            raise ValueError(f"logit_scale must be positive and finite, got {self.logit_scale}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x: [..., d]; weight: [d]. Llama's RMSNorm."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


class DecoderBlock(nn.Module):
    """One pre-norm block: causal self-attention and a SwiGLU MLP, each with a residual."""

    def __init__(self, config: TinyDecoderConfig, gen: torch.Generator) -> None:
        super().__init__()
        d, m = config.hidden_size, config.mlp_size

        def weight(rows: int, cols: int) -> nn.Parameter:
            # 1/sqrt(fan_in) keeps the residual stream at unit scale through random layers.
            return nn.Parameter(torch.randn(rows, cols, generator=gen) / math.sqrt(cols))

        self.attn_norm = nn.Parameter(1.0 + 0.1 * torch.randn(d, generator=gen))
        self.qkv_proj = weight(3 * d, d)  # [3d, d]: q, k, v stacked
        self.o_proj = weight(d, d)
        self.mlp_norm = nn.Parameter(1.0 + 0.1 * torch.randn(d, generator=gen))
        self.gate_up_proj = weight(2 * m, d)  # [2m, d]: gate, up stacked
        self.down_proj = weight(d, m)
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim

    def qkv(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: [n, d] -> q, k, v, each [n, num_heads, head_dim]."""
        qkv = F.linear(rms_norm(h, self.attn_norm), self.qkv_proj)
        q, k, v = qkv.view(h.shape[0], 3, self.num_heads, self.head_dim).unbind(dim=1)
        return q, k, v

    def finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """h: [n, d] residual stream; attn: [n, num_heads, head_dim] attention output."""
        h = h + F.linear(attn.reshape(h.shape), self.o_proj)
        gate, up = F.linear(rms_norm(h, self.mlp_norm), self.gate_up_proj).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, self.down_proj)


class TinyDecoder(nn.Module):
    """A random-weight decoder-only transformer with a per-slot KV cache (see module doc).

    Buffers (fixed addresses, written in place):
    k_cache, v_cache: [num_layers, num_kv_slots + 1, max_seq_len, num_heads, head_dim] float32.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor

    def __init__(self, config: TinyDecoderConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        if not isinstance(config, TinyDecoderConfig):
            raise TypeError(f"config must be a TinyDecoderConfig, got {type(config).__name__}")
        self.config = config
        # Weights are drawn on the CPU from one generator, so a seed gives the same model on
        # every device.
        gen = torch.Generator().manual_seed(config.seed)
        d, v = config.hidden_size, config.vocab_size
        self.embed_tokens = nn.Parameter(torch.randn(v, d, generator=gen))
        self.embed_positions = nn.Parameter(0.5 * torch.randn(config.max_seq_len, d, generator=gen))
        self.layers = nn.ModuleList(DecoderBlock(config, gen) for _ in range(config.num_layers))
        self.final_norm = nn.Parameter(torch.ones(d))
        self.lm_head = nn.Parameter(torch.randn(v, d, generator=gen) * config.logit_scale / d**0.5)
        cache_shape = (
            config.num_layers,
            config.num_kv_slots + 1,
            config.max_seq_len,
            config.num_heads,
            config.head_dim,
        )
        self.register_buffer("k_cache", torch.zeros(cache_shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache_shape), persistent=False)
        self.to(device)
        self.requires_grad_(False)
        self.scale = 1.0 / math.sqrt(config.head_dim)

    @property
    def padding_kv_slot(self) -> int:
        """The scratch KV slot that padded rows write to and read from."""
        return self.config.num_kv_slots

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def _blocks(self) -> Iterable[DecoderBlock]:
        return cast("Iterable[DecoderBlock]", self.layers)

    def _logits(self, h: torch.Tensor, vocab_range: tuple[int, int] | None = None) -> torch.Tensor:
        """h: [n, d] -> [n, V] float32 logits, or [n, end - start], those of token ids
        [start, end) alone (`vocab_range`: a vocab-parallel LM head's shard)."""
        head = self.lm_head if vocab_range is None else self.lm_head[slice(*vocab_range)]
        return F.linear(rms_norm(h, self.final_norm), head)

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_rows] int64: each row's newest token
        kv_slots: torch.Tensor,  # [num_rows] int64: each row's KV slot (padding_kv_slot if padded)
        positions: torch.Tensor,  # [num_rows] int64: the input token's position in its sequence
        vocab_range: tuple[int, int] | None = None,  # (start, end): those columns only
    ) -> torch.Tensor:
        """The decode step: writes each row's K/V at (kv_slot, position), returns [num_rows, V]
        float32 logits of the next token (with `vocab_range`, [num_rows, end - start]: the
        logits of ids [start, end), as a rank of a vocab-parallel LM head computes them).
        Graph-safe: shapes are static, nothing is read on the host. Positions must be <
        max_seq_len and real rows' kv_slots distinct (the engine's bookkeeping; checking
        values here would read the device)."""
        for name, t in (("input_ids", input_ids), ("kv_slots", kv_slots), ("positions", positions)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 1 or t.dtype != torch.int64:
                raise ValueError(f"{name} must be a 1-D int64 tensor, got {t.dim()}-D {t.dtype}")
            if t.shape != input_ids.shape:
                raise ValueError(
                    f"{name} has {t.shape[0]} rows, input_ids has {input_ids.shape[0]}"
                )
        config = self.config
        h = self.embed_tokens[input_ids] + self.embed_positions[positions]  # [R, d]
        # Key positions a row may attend to: its own and earlier ones ([R, S]).
        visible = torch.arange(config.max_seq_len, device=h.device)[None, :] <= positions[:, None]
        for i, layer in enumerate(self._blocks()):
            q, k, v = layer.qkv(h)  # [R, H, Dh] each
            k_cache, v_cache = self.k_cache[i], self.v_cache[i]  # [slots + 1, S, H, Dh] views
            k_cache.index_put_((kv_slots, positions), k)
            v_cache.index_put_((kv_slots, positions), v)
            keys, values = k_cache[kv_slots], v_cache[kv_slots]  # [R, S, H, Dh]
            scores = torch.einsum("rhd,rshd->rhs", q, keys) * self.scale  # [R, H, S]
            # -inf, not a large negative: a masked key gets exactly zero weight, so stale
            # cache entries past a row's position can never leak into its output.
            scores = scores.masked_fill(~visible[:, None, :], -math.inf)
            attn = torch.einsum("rhs,rshd->rhd", scores.softmax(dim=-1), values)  # [R, H, Dh]
            h = layer.finish(h, attn)
        return self._logits(h, vocab_range)

    @torch.no_grad()
    def prefill(self, kv_slot: int, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Eager full causal forward over one request's first tokens, positions 0..T-1:
        fills `kv_slot`'s cache there and returns their [T, V] float32 logits (T may be 0)."""
        config = self.config
        if isinstance(kv_slot, bool) or not isinstance(kv_slot, int):
            raise TypeError(f"kv_slot must be an int, got {type(kv_slot).__name__}")
        if not 0 <= kv_slot < config.num_kv_slots:
            raise ValueError(f"kv_slot = {kv_slot} is outside [0, {config.num_kv_slots})")
        ids = torch.as_tensor(token_ids, dtype=torch.int64).to(self.device)
        if ids.dim() != 1:
            raise ValueError(f"token_ids must be 1-D, got {ids.dim()}-D")
        num_tokens = ids.shape[0]
        if num_tokens > config.max_seq_len:
            raise ValueError(f"{num_tokens} tokens exceed max_seq_len = {config.max_seq_len}")
        if num_tokens and not bool(((ids >= 0) & (ids < config.vocab_size)).all()):
            raise ValueError(f"token_ids hold ids outside the vocabulary [0, {config.vocab_size})")
        h = self.embed_tokens[ids] + self.embed_positions[:num_tokens]  # [T, d]
        causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=h.device).tril()
        for i, layer in enumerate(self._blocks()):
            q, k, v = layer.qkv(h)  # [T, H, Dh]
            self.k_cache[i, kv_slot, :num_tokens] = k
            self.v_cache[i, kv_slot, :num_tokens] = v
            scores = torch.einsum("thd,shd->hts", q, k) * self.scale  # [H, T, T]
            scores = scores.masked_fill(~causal, -math.inf)
            attn = torch.einsum("hts,shd->thd", scores.softmax(dim=-1), v)  # [T, H, Dh]
            h = layer.finish(h, attn)
        return self._logits(h)
