"""`VocabParallelPipeline`: the sampling step on one rank's vocabulary shard.

Steps 2-4 are token by token: each rank runs them on its own columns and state
(`mask_and_penalize`). Steps 5-10 need whole rows, and take them from small exchanges
(`RowExchange`, one all-gather of `[num_rows, m]` each), never from the logits:

- greedy (step 5), min_p (7) and top-k/top-p's candidates (8), in one exchange: each
  rank's argmax, then the best over ranks (lowest global id on ties); every rank's 128
  largest logits merged into the row's, whose first is the row max that min_p needs;
- top-k/top-p (8): the total mass summed over ranks; rows the candidates do not settle take
  the exact radix searches, each pass's weights summed over ranks
  (`stages.threshold_search`, `across=`);
- the race (9): each rank's winner among its tokens, whose Gumbel noise is keyed by the
  global token id, then the best over ranks: the token a race over the row draws;
- logprobs (10): the logsumexp from the ranks' own, the top K merged from theirs, the
  sampled token's value from the rank that holds it, and the rank summed over ranks.

So every rank returns the same tokens as `Sampler` on the whole rows, bit for bit, except
where top-p's mass sum lands within float32 rounding of `top_p` times the total (the sums
run in another order), and logprobs equal up to float32 rounding. Branch-free, with no
host read, so that a CUDA graph can capture it, collectives included.
"""

from __future__ import annotations

import torch

from graphsafe_sampler.distributed.exchange import RowExchange, argmax_of, argmax_payload
from graphsafe_sampler.kernels.constants import SALT_SAMPLE
from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.pipelines.base import Processed
from graphsafe_sampler.pipelines.torch_pipeline import (
    emitted_race_scores,
    mask_and_penalize,
    race_inputs,
)
from graphsafe_sampler.rng import gumbels_from_hashes, hash_tokens, row_keys
from graphsafe_sampler.stages import Stages
from graphsafe_sampler.stages.candidates import CANDIDATES, Candidates, top_candidates
from graphsafe_sampler.stages.logprobs import row_logsumexp
from graphsafe_sampler.stages.min_p import min_p_threshold
from graphsafe_sampler.stages.threshold_search import ordered_int, ordered_value
from graphsafe_sampler.stages.top_k_top_p import top_k_top_p_cut
from graphsafe_sampler.vocab_shard import shard_range


class VocabParallelPipeline:
    """`Pipeline` on the logits of `stages.batch_state.shard`, through `exchange`."""

    def __init__(self, stages: Stages, exchange: RowExchange) -> None:
        self.stages = stages
        self.exchange = exchange
        self.shard = stages.batch_state.shard
        self.vocab_size = self.shard.vocab_size
        # the first shard is the widest (each takes the rounded-up share, the last the rest)
        start, end = shard_range(self.vocab_size, 0, exchange.world_size)
        self.widest = end - start
        self.k = stages.batch_state.config.max_num_logprobs
        device = stages.batch_state.device
        self.token_ids = torch.arange(self.shard.start, self.shard.end, device=device)  # [size]

    def _local_best(self, values: torch.Tensor) -> torch.Tensor:
        """[num_rows, 2] `argmax_payload` of this shard's argmax of values [num_rows, size]
        (the lowest index of the max, or of the first NaN), with its global id."""
        local = values.argmax(-1)  # [num_rows]
        best = values.gather(1, local[:, None])[:, 0]
        return argmax_payload(best, local + self.shard.start)

    def _global_argmax(self, values: torch.Tensor) -> torch.Tensor:
        """[num_rows] int64: `argmax` of the whole rows that `values` [num_rows, size] are
        this shard of: the best of the ranks' own, the lowest rank first on ties, NaN first."""
        return argmax_of(self.exchange.gather(self._local_best(values)))

    def _merged_top(self, gathered: torch.Tensor, n: int) -> torch.Tensor:
        """[W, num_rows, n_local] each rank's largest values (`top_candidates`) -> [num_rows,
        n]: the n largest of the whole rows, descending (exactly `topk`'s, NaN first)."""
        return gathered.permute(1, 0, 2).reshape(gathered.shape[1], -1).topk(n, dim=-1).values

    def _local_top(self, values: torch.Tensor, n: int) -> Candidates:
        """This shard's min(n, widest shard) largest values [num_rows, n_local] and their
        local ids: the same width on every rank (an all-gather needs it), a shard narrower
        than that padded with -inf at local id 0 (a -inf candidate may repeat an id)."""
        width = min(n, self.widest)
        local = top_candidates(values, min(width, self.shard.size))
        missing = width - local.values.shape[1]  # a host fact: this rank's size
        if not missing:
            return local
        rows = values.shape[0]
        pad = values.new_full((rows, missing), float("-inf"))
        ids = torch.zeros((rows, missing), dtype=local.ids.dtype, device=values.device)
        return Candidates(torch.cat([local.values, pad], 1), torch.cat([local.ids, ids], 1))

    def _merged_top_ids(self, values: torch.Tensor, n: int) -> Candidates:
        """`_merged_top` with the values' global ids: each value and id travel as one int64,
        the value's order-preserving int32 image above the id."""
        local = self._local_top(values, n)  # [num_rows, n_local]
        ids = local.ids + self.shard.start
        packed = (ordered_int(local.values).to(torch.int64) << 32) | ids
        gathered = self.exchange.gather(packed)  # [W, num_rows, n_local]
        packed = gathered.permute(1, 0, 2).reshape(ids.shape[0], -1)  # [num_rows, W n_local]
        all_values = ordered_value((packed >> 32).to(torch.int32))
        top = all_values.topk(n, dim=-1)
        return Candidates(top.values, (packed & 0xFFFFFFFF).gather(1, top.indices))

    def process(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        grammar: torch.Tensor,
        drafts: torch.Tensor | None = None,
        num_preceding: torch.Tensor | None = None,
        *,
        write_mask: bool = True,
        raw_tiles: bool = False,  # never made: the logprobs take no tiles
    ) -> Processed:
        s = self.stages
        x = mask_and_penalize(s, logits, slots, grammar, drafts, num_preceding)  # [rows, size]
        divisor, is_greedy = s.temperature.divisors(slots)
        x = x / divisor[:, None]
        # One exchange for greedy, min_p and the candidates. Greedy rows keep T = 1, so
        # their argmax here is the one before temperature (other rows never read theirs).
        # The candidates are taken before min_p's mask, which only turns the smallest of
        # them to -inf; the largest is the row max that min_p needs.
        n = min(CANDIDATES, self.vocab_size)
        local_top = self._local_top(x, n).values  # [num_rows, n_local]
        gathered = self.exchange.gather(torch.cat([self._local_best(x), local_top], dim=-1))
        greedy = argmax_of(gathered[:, :, :2])
        values = self._merged_top(gathered[:, :, 2:], n)  # [num_rows, n], NaN first
        threshold = min_p_threshold(values[:, :1], s.min_p.values(slots))
        x = x.masked_fill_(x < threshold, float("-inf"))
        values = values.masked_fill(values < threshold, float("-inf"))
        # their ids are not needed: every rank races its own columns
        candidates = Candidates(values, torch.zeros_like(values, dtype=torch.int64))
        top_k, top_p = s.top_k_top_p.top_k.device[slots], s.top_k_top_p.top_p.device[slots]
        cut = top_k_top_p_cut(
            x,
            top_k,
            top_p,
            conditional=False,
            candidates=candidates,
            across=self.exchange,
            vocab_size=self.vocab_size,
        )
        x = x.masked_fill_(x < cut, float("-inf"))
        return Processed(x, None, greedy, is_greedy)

    def sample(self, processed: Processed, slots: torch.Tensor) -> torch.Tensor:
        assert processed.greedy is not None and processed.is_greedy is not None
        keys = row_keys(*race_inputs(self.stages, slots), SALT_SAMPLE)
        scores = processed.logits + gumbels_from_hashes(hash_tokens(keys, self.token_ids))
        random = self._global_argmax(scores)
        return torch.where(processed.is_greedy, processed.greedy, random)

    def sample_and_commit(
        self, processed: Processed, slots: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        tokens = self.sample(processed, slots)
        self.stages.batch_state.commit(tokens, keep)
        return tokens

    def race_emitted(
        self,
        bonus_scores: torch.Tensor,
        recovered_scores: torch.Tensor,
        is_bonus: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        # TorchPipeline's race on this shard's columns (noise keyed by their global ids),
        # then the best over ranks
        scores = emitted_race_scores(
            self.stages, bonus_scores, recovered_scores, is_bonus, slots, positions, self.token_ids
        )
        return self._global_argmax(scores)

    def logprobs(
        self,
        source: torch.Tensor,
        tokens: torch.Tensor,
        subtract_lse: bool,
        raw_tiles: torch.Tensor | None = None,
        requested: torch.Tensor | None = None,
        sampled: torch.Tensor | None = None,
    ) -> LogprobsTensors:
        source = source.to(torch.float32)  # [num_rows, size]
        num_rows = source.shape[0]
        # the sampled token's and the chosen ids' values: their ranks'; -inf elsewhere,
        # which the max passes over
        wanted = tokens.long().reshape(num_rows, 1)
        if requested is not None:
            wanted = torch.cat([wanted, requested], dim=1)  # [num_rows, 1 + C]
        local, inside = self.shard.local(wanted)
        held = torch.where(inside, source.gather(1, local), float("-inf"))
        top = self._merged_top_ids(source, self.k)  # [num_rows, K]
        stats = [held]
        if subtract_lse:
            stats.append(row_logsumexp(source))
        gathered = self.exchange.gather(torch.cat(stats, dim=-1))  # [W, num_rows, 1 + C (+ 1)]
        found = gathered[:, :, : wanted.shape[1]].amax(0)  # [num_rows, 1 + C]
        values = torch.cat([found[:, :1], top.values], dim=1)  # [num_rows, K + 1]
        shifted = source
        if subtract_lse:
            lse = combine_logsumexp(gathered[:, :, -1:])  # [num_rows, 1]
            lse = torch.where(lse.isfinite(), lse, 0.0)
            values = values - lse
            found = found - lse
            shifted = source - lse
        # each value's count of tokens at or above it on this shard, summed over the ranks
        at_or_above = torch.stack(
            [(shifted >= found[:, j : j + 1]).sum(-1) for j in range(found.shape[1])], dim=1
        )
        counts = self.exchange.sum(at_or_above.to(torch.int32))  # [num_rows, 1 + C]
        token_ids = torch.cat([tokens.reshape(num_rows, 1), top.ids], dim=1)
        if requested is None:
            return LogprobsTensors(token_ids.to(torch.int32), values, counts[:, 0])
        used = requested >= 0
        chosen = torch.where(used, found[:, 1:], float("-inf"))
        ranks = torch.where(used, counts[:, 1:], 0)
        return LogprobsTensors(
            token_ids.to(torch.int32), values, counts[:, 0], requested.to(torch.int32), chosen,
            ranks,
        )  # fmt: skip


def combine_logsumexp(lse: torch.Tensor) -> torch.Tensor:
    """[W, num_rows, 1] the shards' logsumexps -> [num_rows, 1] the rows': NaN where any is
    NaN, +inf where any is +inf, -inf where all are -inf (as one over the row is)."""
    top = lse.amax(0)
    shift = torch.where(top.isfinite(), top, 0.0)
    return shift + torch.log(torch.exp(lse - shift).sum(0))
