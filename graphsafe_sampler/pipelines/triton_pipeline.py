"""The Triton backend: the step through the kernels of kernels/ (their `torch.library`
ops), on the same stage tables as the PyTorch backend.

The key idea: write as little of [num_rows, V] as possible. One kernel does bad words, logit
bias, min_tokens, the bitmasks, penalties and temperature in one pass, in place; min_p and
top-k/top-p become one per-row cut that the sampling kernel applies on the fly (the mask is
written only where a caller needs it); logprobs need no log-softmax. Same semantics as the
PyTorch backend, tested side by side. With a custom processor that is not argmax-invariant
(it runs in the middle of the fused pass), processing is the PyTorch pipeline's and only
sampling, logprobs and the commit use kernels. The steps with their reads and writes, and
where the backends' results may differ: docs/kernels.md, the Triton step.
"""

from __future__ import annotations

import torch

from graphsafe_sampler.kernels.constants import SALT_BONUS, SALT_RECOVER, SALT_SAMPLE
from graphsafe_sampler.kernels.library import tile_count
from graphsafe_sampler.kernels.logits_processing import process_logits, process_splits
from graphsafe_sampler.kernels.logprobs import compute_logprobs, logprobs_splits
from graphsafe_sampler.kernels.min_p import apply_min_p
from graphsafe_sampler.kernels.row_params import FILTERS, KEYS
from graphsafe_sampler.kernels.sampling import sample_and_commit, sample_splits, sample_tokens
from graphsafe_sampler.kernels.top_k_top_p import (
    apply_top_k_top_p,
    candidate_lists,
    top_k_top_p_splits,
    top_k_top_p_threshold,
)
from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.pipelines.base import Processed
from graphsafe_sampler.pipelines.torch_pipeline import TorchPipeline, race_inputs
from graphsafe_sampler.slot_tables import SlotTables
from graphsafe_sampler.stages import Stages
from graphsafe_sampler.stages.logprobs import requested_logprobs


class TritonPipeline:
    """`Pipeline` through the kernels (module docstring)."""

    def __init__(self, stages: Stages) -> None:
        self.stages = stages
        self.k = stages.batch_state.config.max_num_logprobs
        self.fused = all(p.is_argmax_invariant() for p in stages.custom)
        # the unfused path processes with the PyTorch stages (a sibling, on the same stages)
        self.unfused = TorchPipeline(stages)
        # min_p's cut is folded into the top-k/top-p kernel (never written) unless custom
        # argmax-invariant processors, which run between the two, must see it applied
        self.fold_min_p = not stages.custom
        # sample_and_commit covers BatchState's own counter and these two states; any other
        # slot state with a commit hook (a custom processor's history) needs the PyTorch commit
        hooks = [
            state
            for state in stages.batch_state.slot_states
            if type(state).commit is not SlotTables.commit
            and state is not stages.penalties
            and state is not stages.bad_words
        ]
        self.commit_kernel = not hooks
        # the split rows' counters of the processing, sampling and logprobs kernels (each
        # launch leaves them 0): persistent, so that no step fills them; a launch of more
        # rows than a Sampler's max_num_reqs (none calls these) would have the ops allocate
        # its own (processing: none, each program making its own columns' phases)
        batch_state = stages.batch_state
        self.arrivals = torch.zeros(
            batch_state.max_num_reqs, dtype=torch.int32, device=batch_state.device
        )
        # processing's divisors of the rows it leaves unwritten (`_defer`), each step's
        self.deferred = torch.zeros(
            batch_state.max_num_reqs, dtype=torch.float32, device=batch_state.device
        )

    def _arrivals(self, num_rows: int, splits: int) -> torch.Tensor | None:
        """The counters for a launch of `splits` programs a row (none for whole rows)."""
        if splits == 1 or num_rows > self.arrivals.shape[0]:
            return None
        return self.arrivals

    def _defer(
        self, logits: torch.Tensor, drafts: torch.Tensor | None, write_mask: bool
    ) -> dict[str, torch.Tensor]:
        """`process_logits`' tables for leaving the rows no step but their temperature changes
        unwritten (read from `logits` after it, and divided), where nothing but the kernels
        that know it reads the buffer: no mask written (the processed logprobs modes), no
        drafts, a float32 source (the buffer's type), and none of the stages that run on
        the buffer between the kernels (custom processors, the thinking budget). Else
        none."""
        s, num_rows = self.stages, logits.shape[0]
        if (
            write_mask or drafts is not None or logits.dtype != torch.float32
            or s.custom or s.thinking_budget is not None or num_rows > self.deferred.shape[0]
        ):  # fmt: skip
            return {}
        return {
            "restricted": s.allowed.restricted.device,
            "biased": s.logit_bias.biased.device,
            "grammar_on": s.grammar.active.device[:num_rows],
            "deferred": self.deferred[:num_rows],
        }

    def process(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        grammar: torch.Tensor,
        drafts: torch.Tensor | None = None,
        num_preceding: torch.Tensor | None = None,
        *,
        write_mask: bool = True,
        raw_tiles: bool = False,
    ) -> Processed:
        if not self.fused:
            done = self.unfused.process(logits, slots, grammar, drafts, num_preceding)
            # the sampling kernel finds the greedy rows' argmax itself
            return Processed(done.logits.contiguous(), None, None, done.is_greedy)
        s = self.stages
        # processing reads the raw logits once and writes this buffer once: no copy first;
        # a row only a temperature changes it may leave unwritten, for the kernels to read
        # from logits and divide
        x = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        defer = self._defer(logits, drafts, write_mask)
        # and each tile's max, for the kernels after it to skip the tiles below their cut;
        # only where nothing but a mask changes x in between (a custom processor might not)
        tile_max = None
        # (the thinking budget may raise a masked forced token to 0: no bounds then)
        if not s.custom and s.thinking_budget is None:
            tile_max = torch.empty(
                (logits.shape[0], tile_count(logits.shape[1])), dtype=torch.float32,
                device=logits.device,
            )  # fmt: skip
        # the raw logits' tile statistics, from the same read, for logprobs in the raw modes
        raw = None
        if raw_tiles:
            shape = (logits.shape[0], tile_count(logits.shape[1]), 2)
            raw = torch.empty(shape, dtype=torch.float32, device=logits.device)
        # the rows' filters, temperatures, seeds and positions, which processing resolves
        # from the slots for stage 1 and sampling to read by row (kernels/row_params.py);
        # not with a mask written (sampled otherwise) nor a watermark (keys of its own)
        resolve: dict[str, torch.Tensor] = {}
        if not write_mask and s.watermark is None:
            num_rows = logits.shape[0]
            resolve = {
                "top_k": s.top_k_top_p.top_k.device,
                "top_p": s.top_k_top_p.top_p.device,
                "min_p": s.min_p.min_p.device,
                "seeds": s.sampling.seed.device,
                "prompt_len": s.sampling.prompt_len.device,
                "filters": torch.empty(
                    num_rows, FILTERS.value, dtype=torch.float32, device=logits.device
                ),
                "keys": torch.empty(num_rows, KEYS.value, dtype=torch.int64, device=logits.device),
            }
        splits = process_splits(*logits.shape, logits.device)
        process_logits(
            logits,
            x,
            slots,
            s.logit_bias.bias_ids.device,
            s.logit_bias.bias_values.device,
            s.min_tokens.min_tokens.device,
            s.batch_state.num_generated.device,
            s.min_tokens.stop_ids.device,
            s.allowed.allowed.device,
            grammar,
            s.penalties.counts,
            s.penalties.overflow_token.device,
            s.penalties.overflow_excess.device,
            s.penalties.prompt_mask.device,
            s.penalties.repetition.device,
            s.penalties.frequency.device,
            s.penalties.presence.device,
            s.temperature.temperature.device,
            drafts,
            num_preceding,
            s.bad_words.tokens.device,
            s.bad_words.back.device,
            s.bad_words.word.device,
            s.bad_words.window.device,
            splits,
            tile_max,
            raw,
            **defer,
            **resolve,
            # (not with drafts: with their counts, its loads spilled the kernel's registers)
            output_words=s.penalties.output_words if drafts is None else None,
            # a split row's phases after the dense pass, made once by its last program
            arrivals=self._arrivals(logits.shape[0], splits),
        )
        if s.thinking_budget is not None:
            # a sparse decision, a dense mask: one more pass over x, only where the config
            # has reasoning sequences; after temperature, with which it commutes
            x = s.thinking_budget.apply(x, slots, drafts, num_preceding)
        if not self.fold_min_p:
            apply_min_p(x, slots, s.min_p.min_p.device)
        for proc in s.custom:  # all argmax-invariant on the fused path
            x = proc.apply_slots(x, slots)
        cut = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        top_k, top_p = s.top_k_top_p.top_k.device, s.top_k_top_p.top_p.device
        min_p = s.min_p.min_p.device if self.fold_min_p else None
        splits = top_k_top_p_splits(*x.shape, x.device)
        if write_mask:
            apply_top_k_top_p(x, slots, top_k, top_p, cut, min_p, splits, tile_max)
            # is_greedy: the kernels read the temperature themselves (greedy_rows when
            # needed); the tile maxima stay upper bounds under the mask
            return Processed(x, None, None, None, tile_max, raw)
        # stage 1's lists with their ids: sampling races the rows they cover over them
        buffer = candidate_lists(*x.shape, splits, x.device)
        source, deferred = (logits, defer["deferred"]) if defer else (None, None)
        filters = resolve.get("filters")
        top_k_top_p_threshold(
            x, slots, top_k, top_p, cut, min_p, splits, tile_max, *buffer, source, deferred,
            filters,
        )  # fmt: skip
        records = (resolve["filters"], resolve["keys"]) if resolve else None
        # the sampled tokens' raw values, which sampling writes for logprobs in the raw modes
        sampled = None
        if raw_tiles:
            sampled = (logits, torch.empty(x.shape[0], dtype=torch.float32, device=x.device))
        return Processed(
            x, cut, None, None, tile_max, raw, buffer=buffer, source=source, deferred=deferred,
            records=records, sampled=sampled,
        )  # fmt: skip

    def sample(self, processed: Processed, slots: torch.Tensor) -> torch.Tensor:
        return self._sample(processed, slots, None, commit=False)

    def sample_and_commit(
        self, processed: Processed, slots: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        if not self.commit_kernel:  # a slot state with a commit hook: the PyTorch commit
            tokens = self._sample(processed, slots, None, commit=False)
            self.stages.batch_state.commit(tokens, keep)
            return tokens
        return self._sample(processed, slots, keep, commit=True)

    def _sample(
        self, processed: Processed, slots: torch.Tensor, keep: torch.Tensor | None, commit: bool
    ) -> torch.Tensor:
        """[num_rows] int32, the output's type; with `commit`, each row's token committed
        by the kernel that makes it (`sample_and_commit`)."""
        s = self.stages
        num_rows, vocab = processed.logits.shape
        tokens = torch.empty(num_rows, dtype=torch.int32, device=slots.device)
        splits = sample_splits(num_rows, vocab, slots.device)
        generated = s.batch_state.num_generated.device
        seeds, positions = s.sampling.seed.device, None
        prompt_len: torch.Tensor | None = s.sampling.prompt_len.device
        if s.watermark is not None:
            # watermarked slots race keyed by their watermark key and each row's context
            # hash: the kernel reads seeds by slot and takes the positions by row
            wm = s.watermark
            seeds = torch.where(wm.on.device, wm.key.device, seeds)  # [num_slots]
            _, positions = race_inputs(s, slots)
            prompt_len = None
        args = (
            processed.logits, slots, s.temperature.temperature.device, seeds, positions,
            processed.cut, tokens, SALT_SAMPLE, prompt_len,
        )  # fmt: skip
        buffer = processed.buffer if processed.buffer is not None else (None, None, None)
        read = (processed.source, processed.deferred)  # the unwritten rows', or None
        # processing's records of the rows (their slots' values), read by row, or None
        records = processed.records if processed.records is not None else (None, None)
        hand = processed.sampled if processed.sampled is not None else (None, None)
        if not commit:
            by_slot = generated if positions is None else None
            arrivals = self._arrivals(num_rows, splits)
            sample_tokens(
                *args, by_slot, splits, processed.tile_max, arrivals, *buffer, *read, *records,
                *hand,
            )  # fmt: skip
            return tokens
        sample_and_commit(
            *args, generated, splits, processed.tile_max, keep, s.penalties.counts,
            s.penalties.output_words, s.penalties.overflow_token.device,
            s.penalties.overflow_excess.device, s.bad_words.window.device,
            s.batch_state.config.padding_slot,
            self._arrivals(num_rows, splits), *buffer, *read, *records, *hand,
        )  # fmt: skip
        return tokens

    def _race(
        self,
        scores: torch.Tensor,  # [num_rows, V] float32
        slots: torch.Tensor,  # [num_rows] int64
        positions: torch.Tensor,  # [num_rows] int64
        salt: int,
    ) -> torch.Tensor:
        """[num_rows] int64: greedy rows' argmax, other rows' race on stream `salt`."""
        tokens = torch.empty(scores.shape[0], dtype=torch.int64, device=scores.device)
        sample_tokens(
            scores,
            slots,
            self.stages.temperature.temperature.device,
            self.stages.sampling.seed.device,
            positions,
            None,
            tokens,
            salt,
        )
        return tokens

    def race_emitted(
        self,
        bonus_scores: torch.Tensor,
        recovered_scores: torch.Tensor,
        is_bonus: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        # the stream is a launch constant: one race per stream, merged per row
        bonus = self._race(bonus_scores.contiguous(), slots, positions, SALT_BONUS)
        recovered = self._race(recovered_scores.contiguous(), slots, positions, SALT_RECOVER)
        return torch.where(is_bonus, bonus, recovered)

    def logprobs(
        self,
        source: torch.Tensor,
        tokens: torch.Tensor,
        subtract_lse: bool,
        raw_tiles: torch.Tensor | None = None,
        requested: torch.Tensor | None = None,
        sampled: torch.Tensor | None = None,
    ) -> LogprobsTensors:
        num_rows, device = source.shape[0], source.device
        token_ids = torch.empty(num_rows, self.k + 1, dtype=torch.int32, device=device)
        values = torch.empty(num_rows, self.k + 1, dtype=torch.float32, device=device)
        ranks = torch.empty(num_rows, dtype=torch.int32, device=device)
        lse = torch.empty(num_rows, dtype=torch.float32, device=device)
        splits = logprobs_splits(*source.shape, device)
        compute_logprobs(
            source, tokens, token_ids, values, ranks, lse, subtract_lse, splits, raw_tiles,
            self._arrivals(num_rows, splits), sampled,
        )  # fmt: skip
        if requested is None:
            return LogprobsTensors(token_ids, values, ranks)
        # the chosen ids: a gather and C counts, in PyTorch, with the kernel's logsumexp (0
        # where not finite, as requested_logprobs takes it)
        shift = lse[:, None] if subtract_lse else None
        chosen = requested_logprobs(source.to(torch.float32), requested, shift)
        return LogprobsTensors(token_ids, values, ranks, requested.to(torch.int32), *chosen)
