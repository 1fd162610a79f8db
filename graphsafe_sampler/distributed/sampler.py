"""`VocabParallelSampler`: a `Sampler` for one rank of a vocabulary-parallel LM head.

With tensor parallelism each of W ranks computes the logits of its own token ids
(`vocab_shard`). Engines gather the full `[num_rows, V]` logits to sample (vLLM V1), or
trade them all-to-all (vLLM's Model Runner V2): B * V * 4 bytes over the interconnect every
step. Here each rank samples from its own columns and the ranks trade row statistics of
`[num_rows, small]` size (`VocabParallelPipeline`): since every random draw is keyed by the
global token id, every rank returns the tokens `Sampler` draws from the whole rows.

Each rank keeps the request state of its own ids only: penalty counts and the prompt
bitmask, the bias entries, allowed ids and stop ids of its tokens, the bad words ending in
them and its words of the grammar bitmask. Every rank takes the same `BatchUpdate`s,
validates them against the whole vocabulary, and so refuses bad input alike.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.distributed.exchange import RowExchange, ShardExchange
from graphsafe_sampler.distributed.pipeline import VocabParallelPipeline, combine_logsumexp
from graphsafe_sampler.pipelines import Pipeline
from graphsafe_sampler.rejection_sampler import RejectionSampler
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.vocab_shard import VocabShard, shard_range


def vocab_shard(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """(start, end): the token ids whose logits rank `rank` of `world_size` holds, as vLLM's
    `VocabParallelEmbedding` splits them: the vocabulary padded to a multiple of 64, an
    equal share a rank in rank order, padding left out (so the last shards may be shorter).
    Where `world_size` does not divide the padded size, each rank takes the rounded-up
    share. ValueError where a rank would hold no token."""
    return shard_range(vocab_size, rank, world_size)


class VocabParallelSampler(Sampler):
    """`Sampler` on this rank's columns of the logits.

    config: as for `Sampler`, with `vocab_size` the whole vocabulary V (custom logits
        processors, which see whole rows, are not supported).
    process_group: the tensor-parallel group whose ranks hold the shards, in rank order
        (default: the whole world); `torch.distributed` must be initialised.
    device: where state lives and logits come from (default: CUDA if available, else CPU).
    exchange: the exchange to trade row statistics through, instead of one over
        `process_group` (e.g. a `LoopbackExchange`, which counts a step's bytes in one
        process).

    `forward(local_logits [num_rows, end - start])` returns the same `SamplerOutput` on
    every rank: the tokens of `Sampler(config)` on the whole rows with the same seeds, and
    logprobs equal up to float32 rounding. `update_state`, `stage_grammar_bitmask` (the
    whole vocabulary's bitmask), `commit_tokens` and the commit mask are `Sampler`'s, called
    alike on every rank.
    """

    def __init__(
        self,
        config: SamplerConfig,
        process_group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        *,
        exchange: RowExchange | None = None,
    ) -> None:
        if not isinstance(config, SamplerConfig):
            raise TypeError(f"config must be a SamplerConfig, got {type(config).__name__}")
        if config.logits_processors:
            raise ValueError(
                "custom logits processors see whole rows: VocabParallelSampler takes none"
            )
        if config.backend == "triton":
            raise ValueError("VocabParallelSampler runs the PyTorch backend: use 'torch' or 'auto'")
        # read by the hooks Sampler.__init__ calls
        self.exchange = ShardExchange(process_group) if exchange is None else exchange
        super().__init__(dataclasses.replace(config, backend="torch"), device)

    def _vocab_shard(self) -> VocabShard:
        exchange, vocab = self.exchange, self.config.vocab_size
        return VocabShard(vocab, *vocab_shard(vocab, exchange.rank, exchange.world_size))

    def _make_pipeline(self) -> Pipeline:
        return VocabParallelPipeline(self.stages, self.exchange)

    @property
    def shard(self) -> VocabShard:
        """This rank's token ids [start, end)."""
        return self.batch_state.shard

    def _logits_columns(self) -> tuple[int, str]:
        shard = self.shard
        return shard.size, f"the width of this rank's shard [{shard.start}, {shard.end})"


class VocabParallelRejectionSampler(RejectionSampler):
    """`RejectionSampler` on this rank's columns: the speculative step of a
    `VocabParallelSampler`, whose request state it shares.

    `forward(target_logits [num_rows, S + 1, end - start], draft_token_ids,
    num_draft_tokens, draft_probs [num_rows, S, end - start] | None)` returns the same
    `RejectionSamplerOutput` on every rank: that of `RejectionSampler` on the whole rows
    (draft ids are global). Its row statistics (the logsumexp at each draft position, the
    target's and the draft's probability of each draft, whether a residual has mass, the
    emitted race) come from the ranks' own through the sampler's exchange.
    """

    def __init__(self, sampler: VocabParallelSampler, max_spec_len: int) -> None:
        if not isinstance(sampler, VocabParallelSampler):
            raise TypeError(f"sampler must be a VocabParallelSampler, got {type(sampler).__name__}")
        super().__init__(sampler, max_spec_len)
        self.exchange = sampler.exchange
        self.shard = sampler.shard

    def _logsumexp(self, x: torch.Tensor) -> torch.Tensor:
        local = x.logsumexp(dim=-1)  # [num_rows, S]
        return combine_logsumexp(self.exchange.gather(local)[..., None])[..., 0]

    def _at(self, values: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        # the value at the rank that holds the token; -inf elsewhere, which the max passes over
        local, inside = self.shard.local(token_ids)
        held = values.gather(2, local[:, :, None])[:, :, 0].float()
        return self.exchange.max(torch.where(inside, held, float("-inf")))

    def _any(self, mask: torch.Tensor) -> torch.Tensor:
        return self.exchange.max(mask.to(torch.int32)) > 0

    def _token_ids(self, device: torch.device) -> torch.Tensor:
        return torch.arange(self.shard.start, self.shard.end, device=device)
