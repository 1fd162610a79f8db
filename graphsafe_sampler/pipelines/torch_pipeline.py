"""The PyTorch backend: every stage's PyTorch apply, in the order of docs/design.md.

Branch-free on request state, so it runs eagerly, under `torch.compile(fullgraph=True)` and
in a CUDA graph alike. Eagerly the exact top-k/top-p search is dozens of full-size ops:
compile it.
"""

from __future__ import annotations

import torch

from graphsafe_sampler.bitmask import bits_at
from graphsafe_sampler.kernels.constants import SALT_BONUS, SALT_RECOVER
from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.pipelines.base import Processed
from graphsafe_sampler.rng import gumbels_from_hashes, hash_tokens, row_keys
from graphsafe_sampler.stages import Stages
from graphsafe_sampler.stages.logprobs import compute_logprobs


def mask_and_penalize(
    stages: Stages,
    logits: torch.Tensor,  # [num_rows, V] float32/16, bfloat16: the raw logits, read only
    slots: torch.Tensor,  # [num_rows] int64
    grammar: torch.Tensor,  # [num_rows, ceil(V/32)] int32
    drafts: torch.Tensor | None = None,  # [num_rows, S] int64 ids in [0, V)
    num_preceding: torch.Tensor | None = None,  # [num_rows] int64 in [0, S]
    *,
    in_order: bool = False,
) -> torch.Tensor:
    """Steps 2-4 (`Pipeline.process`'s arguments): [num_rows, V] float32, a new tensor.

    Every op here is token by token, so a vocabulary shard's logits (V its size) go through
    it on its own state alike (`graphsafe_sampler.distributed`). Without drafts or custom
    processors among the masks (and unless `in_order`), the same values from the dense
    stages first (`_penalize_then_patch`); else each stage in the order of docs/design.md."""
    if (drafts is None) != (num_preceding is None):
        raise ValueError("drafts and num_preceding come together")
    s = stages
    invariant = all(proc.is_argmax_invariant() for proc in s.custom)
    if drafts is None and invariant and not in_order:
        return _penalize_then_patch(s, logits, slots, grammar)
    x = logits.to(torch.float32, copy=True)  # [num_rows, V]; the raw logits stay as they are
    # Steps 2-3 are -inf masks and finite additive biases, which commute: the sparse
    # updates go first, in place on the fresh copy, then the dense masks. Each is an
    # index_put_, which inductor lowers in place: with no aten fallback between them, the
    # masks and the penalties are one pass over the copy.
    x = s.bad_words.apply(x, slots, drafts, num_preceding)
    x = s.logit_bias.apply_slots(x, slots)
    x = s.min_tokens.apply_slots(x, slots, num_preceding)
    x = s.allowed.apply_slots(x, slots)
    x = s.grammar.apply(x, grammar)
    for proc in s.custom:
        if not proc.is_argmax_invariant():
            x = proc.apply_slots(x, slots)
    if drafts is None or num_preceding is None:
        x = s.penalties.apply(x, slots)
    else:
        columns = torch.arange(drafts.shape[1], device=drafts.device)
        preceding = columns[None, :] < num_preceding[:, None]  # [rows, S]
        x = s.penalties.apply(x, slots, extra_tokens=drafts, extra_mask=preceding)
    # last: forcing overrides every mask before it (a masked forced token reads 0), and
    # commutes with temperature, after which the Triton backend applies it
    if s.thinking_budget is not None:
        x = s.thinking_budget.apply(x, slots, drafts, num_preceding)
    return x


def _penalize_then_patch(
    stages: Stages,
    logits: torch.Tensor,  # [num_rows, V] float32/16, bfloat16: the raw logits, read only
    slots: torch.Tensor,  # [num_rows] int64
    grammar: torch.Tensor,  # [num_rows, ceil(V/32)] int32
) -> torch.Tensor:
    """`mask_and_penalize` without drafts or custom processors among the masks, the same
    values in one pass over the row instead of two, the Triton kernel's order (docs/kernels.md,
    logits processing). The dense stages (the allowed ids, the grammar's mask, the
    penalties) read the raw logits and write the row once. Then the few tokens a row's
    logit bias names are made again from their raw logits, `penalize(logit + bias)` where
    no mask holds them, -inf where one does: what the bias first gives (the penalties do
    not commute with it, the masks do, and -inf stays -inf through the penalties). The
    saturated tokens' excess follows, as in order; the -inf bans (bad words, min_tokens) go
    last: nothing after a mask lifts it, and a ban keeps a NaN logit NaN (`torch.minimum`),
    as before."""
    s = stages
    x = logits.to(torch.float32)  # [num_rows, V], the raw tensor itself when float32
    allowed = s.allowed.mask(slots) & s.grammar.mask(grammar)  # [num_rows, V] bool
    x = s.penalties.penalize(torch.where(allowed, x, float("-inf")), slots)  # a new tensor
    ids, bias = s.logit_bias.entries(slots)  # [num_rows, C] each
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    biased = s.penalties.penalize_at(logits[rows, ids].to(torch.float32) + bias, ids, slots)
    unmasked = s.allowed.allows(slots, ids) & bits_at(grammar, ids)  # [num_rows, C]
    x = x.index_put_((rows, ids), torch.where(unmasked, biased, float("-inf")))
    x = s.penalties.charge_excess(x, slots, in_place=True)  # the biased tokens' too
    x = s.bad_words.apply(x, slots)
    x = s.min_tokens.apply_slots(x, slots)
    if s.thinking_budget is not None:
        x = s.thinking_budget.apply(x, slots)
    return x


def race_inputs(stages: Stages, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([num_rows] int64 seeds, [num_rows] int64 positions) that key the rows' SALT_SAMPLE
    race: the request's seed and token position, or in watermarked rows the watermark key
    and the context hash (`stages/watermark.py`)."""
    seeds = stages.sampling.seed.device[slots]
    positions = stages.batch_state.positions(slots)
    if stages.watermark is None:
        return seeds, positions
    return stages.watermark.race_inputs(slots, seeds, positions)


def emitted_race_scores(
    stages: Stages,
    bonus_scores: torch.Tensor,  # [num_rows, n] float32 log-weights
    recovered_scores: torch.Tensor,  # [num_rows, n] float32 log-weights
    is_bonus: torch.Tensor,  # [num_rows] bool
    slots: torch.Tensor,  # [num_rows] int64
    positions: torch.Tensor,  # [num_rows] int64
    token_ids: torch.Tensor,  # [n] int64: the token id of each column
) -> torch.Tensor:
    """[num_rows, n] float32: `Pipeline.race_emitted`'s scores plus each row's Gumbel noise
    on its stream (SALT_BONUS where `is_bonus`, else SALT_RECOVER), whose argmax over the
    whole row is the emitted token."""
    seeds = stages.sampling.seed.device[slots]
    keys = torch.where(
        is_bonus,
        row_keys(seeds, positions, SALT_BONUS),
        row_keys(seeds, positions, SALT_RECOVER),
    )
    scores = torch.where(is_bonus[:, None], bonus_scores, recovered_scores)
    return scores + gumbels_from_hashes(hash_tokens(keys, token_ids))


class TorchPipeline:
    """`Pipeline` through the stages' PyTorch applies."""

    def __init__(self, stages: Stages) -> None:
        self.stages = stages
        self.k = stages.batch_state.config.max_num_logprobs

    def process(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        grammar: torch.Tensor,
        drafts: torch.Tensor | None = None,
        num_preceding: torch.Tensor | None = None,
        *,
        write_mask: bool = True,
        raw_tiles: bool = False,  # never made: the PyTorch logprobs take no tiles
    ) -> Processed:
        s = self.stages
        x = mask_and_penalize(s, logits, slots, grammar, drafts, num_preceding)
        fused = torch.compiler.is_compiling() and not any(
            proc.is_argmax_invariant() for proc in s.custom
        )
        if not fused:
            # eager (where each op is its own pass), or custom processors between min_p and
            # top-k/top-p: each stage writes its logits
            greedy = x.argmax(dim=-1)  # [rows]; lowest index on ties
            x, is_greedy = s.temperature.apply(x, slots)
            x = s.min_p.apply_slots(x, slots)
            for proc in s.custom:
                if proc.is_argmax_invariant():
                    x = proc.apply_slots(x, slots)
            filtered = s.top_k_top_p.filter(x, slots)
        else:
            # compiled: temperature, min_p and top-k/top-p read x and write the filtered
            # logits once; the greedy tokens come from the filter's tile maxima
            # (`filter_scaled`, which gives the same tensors)
            divisor, is_greedy = s.temperature.divisors(slots)
            min_p = s.min_p.values(slots)
            filtered = s.top_k_top_p.filter_scaled(x, divisor, min_p, slots)
            assert filtered.greedy is not None  # filter_scaled makes it
            greedy = filtered.greedy
        return Processed(
            filtered.logits,
            None,
            greedy,
            is_greedy,
            candidate_ids=filtered.candidates.ids,
            covered=filtered.covered,
            remake=filtered.remake,
        )

    def sample(self, processed: Processed, slots: torch.Tensor) -> torch.Tensor:
        sampling = self.stages.sampling
        seeds, positions = race_inputs(self.stages, slots)
        # set by this pipeline's process
        assert processed.is_greedy is not None
        assert processed.candidate_ids is not None and processed.covered is not None
        random = sampling.race_covered(
            processed.logits,
            processed.candidate_ids,
            processed.covered,
            processed.is_greedy,
            slots,
            positions,
            remake=processed.remake,
            seeds=seeds,
        )
        return torch.where(processed.is_greedy, processed.greedy_tokens(), random)

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
        # one race over the row's own scores and stream: one [num_rows, V] noise pass
        token_ids = torch.arange(bonus_scores.shape[1], device=bonus_scores.device)
        return emitted_race_scores(
            self.stages, bonus_scores, recovered_scores, is_bonus, slots, positions, token_ids
        ).argmax(dim=-1)

    def logprobs(
        self,
        source: torch.Tensor,
        tokens: torch.Tensor,
        subtract_lse: bool,
        raw_tiles: torch.Tensor | None = None,
        requested: torch.Tensor | None = None,
        sampled: torch.Tensor | None = None,
    ) -> LogprobsTensors:
        return compute_logprobs(source.to(torch.float32), tokens, self.k, subtract_lse, requested)
