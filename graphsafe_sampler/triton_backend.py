"""The Triton backend: `Sampler(config)` with `backend="triton"` runs DESIGN §4 through the
kernels in `kernels/` (their `torch.library` custom ops) instead of PyTorch ops.

Per step, on a fresh float32 copy `x` of the logits ([num_rows, V]):

1. bad words: the PyTorch scatter of `bad_words.py` (sparse: a few tokens a row);
2. `process_logits`: logit bias, min_tokens, allowed ids, the grammar bitmask, penalties and
   temperature in one pass, in place (1 read + 1 write of `x`);
3. min_p: folded into step 4's cut (its statistics pass has the row max), so never written;
   with custom argmax-invariant processors, which must see min_p's mask, `apply_min_p` in
   place (2 reads + 1 write), then those processors (PyTorch);
4. top-k/top-p: `top_k_top_p_threshold` writes each row's cut ([num_rows] float32) without
   touching `x` (1 read when its 128-logit candidate buffer settles the row, else the
   search's passes too); only the `processed_*` logprobs modes, which return the filtered
   logits, write the mask (`apply_top_k_top_p`);
5. `sample_tokens`: greedy argmax or the Gumbel-max race on `ops/rng.py`'s uniforms, the cut
   applied on the fly (1 read);
6. logprobs: `compute_logprobs` (1 read of the source, no [num_rows, V] log-softmax);
7. the commit: `commit_history` (counts with their overflow table, the bad-words ring,
   `num_generated`) when no other slot state needs a commit hook, else `BatchState.commit`.

Same semantics as the PyTorch backend, tested side by side (tests/test_sampler_triton.py):
greedy tokens and the uniforms are bit-identical, processed logits equal to float32 rounding,
and random tokens equal except where two candidates' perturbed logits tie within the Gumbel
transform's last-bit rounding (the kernel's log1p is a few ulp from libm's).

Custom processors that are not argmax-invariant run between logit bias and the penalties, in
the middle of the fused pass: with any of them configured, steps 1-4 run the PyTorch stages
(`Sampler.torch_process_logits`) and only sampling, logprobs and the commit use kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from graphsafe_sampler.kernels.constants import GREEDY_TEMPERATURE, SALT_SAMPLE
from graphsafe_sampler.kernels.history import commit_history
from graphsafe_sampler.kernels.logits_processing import process_logits
from graphsafe_sampler.kernels.logprobs import compute_logprobs
from graphsafe_sampler.kernels.min_p import apply_min_p
from graphsafe_sampler.kernels.sampling import sample_tokens
from graphsafe_sampler.kernels.top_k_top_p import apply_top_k_top_p, top_k_top_p_threshold
from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.slot_tables import SlotTables

if TYPE_CHECKING:
    from graphsafe_sampler.sampler import Sampler
    from graphsafe_sampler.structured_output import GrammarBitmask


class TritonPipeline:
    """Steps 2-10 of a `Sampler` step through the Triton custom ops (module docstring)."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.fused = not any(not p.is_argmax_invariant() for p in sampler.custom)
        # min_p's cut is folded into the top-k/top-p kernel (never written) unless custom
        # argmax-invariant processors, which run between the two, must see it applied
        self.fold_min_p = not sampler.custom
        # commit_history covers BatchState's own counter and these two states; any other
        # slot state with a commit hook (a custom processor's history) needs the PyTorch commit.
        hooks = [
            s
            for s in sampler.batch_state._slot_states
            if type(s).commit is not SlotTables.commit
            and s is not sampler.penalties
            and s is not sampler.bad_words
        ]
        self.commit_kernel = not hooks

    def _filter(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        grammar: torch.Tensor,
        drafts: torch.Tensor | None = None,
        num_preceding: torch.Tensor | None = None,
        *,
        write_mask: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 1-4 of the module docstring on x [num_rows, V] float32, in place (the fused
        path): bad words, `process_logits`, `apply_min_p` when min_p is not folded into the
        cut, the argmax-invariant custom processors, then the top-k/top-p cut. grammar:
        [num_rows, ceil(V/32)] int32, row-indexed. Returns (x, cut [num_rows] float32); with
        `write_mask` the tokens below the cut are also -inf in x."""
        s = self.sampler
        x = s.bad_words.apply(x, slots, drafts, num_preceding)
        process_logits(
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
            s.sampling.temperature.device,
            drafts,
            num_preceding,
        )
        if not self.fold_min_p:
            apply_min_p(x, slots, s.min_p.min_p.device)
        s.batch_state.bind_slots(slots)  # custom processors find their rows through it
        try:
            for proc in s.custom:  # all argmax-invariant on the fused path
                x = proc.apply(x)
        finally:
            s.batch_state.bind_slots(None)
        cut = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        top_k, top_p = s.sampling.top_k.device, s.sampling.top_p.device
        min_p = s.min_p.min_p.device if self.fold_min_p else None
        op = apply_top_k_top_p if write_mask else top_k_top_p_threshold
        op(x, slots, top_k, top_p, cut, min_p)
        return x, cut

    def process_logits(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        grammar: GrammarBitmask,
        drafts: torch.Tensor | None = None,
        num_preceding: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`Sampler.process_logits` through the kernels (the fused path only): x [rows, V]
        float32, a fresh copy, updated in place; rows need not be batch rows (speculative
        decoding passes every position of every row, `grammar` holding a mask per position
        and `drafts` [rows, S] int64 with `num_preceding` [rows] int64 the drafts that
        precede each row).

        Returns (processed logits after temperature, min_p and top-k/top-p with the mask
        written, greedy tokens [rows] int64, is_greedy [rows] bool). A greedy row's token
        is its argmax (lowest index on ties): its temperature is skipped and min_p, top-k
        and top-p keep the maximum, so it equals the PyTorch backend's argmax before
        temperature. Other rows' greedy tokens are the argmax after their temperature: unused.
        """
        s = self.sampler
        num_rows = x.shape[0]
        table = grammar.bitmask.device[: num_rows // grammar.num_positions]
        table = table.reshape(num_rows, -1)
        x, _ = self._filter(x, slots, table, drafts, num_preceding, write_mask=True)
        is_greedy = s.sampling.temperature.device[slots] < GREEDY_TEMPERATURE
        return x, x.argmax(dim=-1), is_greedy

    def sample(
        self, x: torch.Tensor, slots: torch.Tensor, *, return_processed: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [num_rows, V] float32, a fresh copy (updated in place); slots [num_rows] int64.

        Returns (tokens [num_rows] int64, x): x is the processed logits, with the top-k/top-p
        mask written only when `return_processed` (otherwise tokens below the cut are still
        in x, and only the sampling skipped them)."""
        s = self.sampler
        num_rows = x.shape[0]
        cut: torch.Tensor | None = None
        if self.fused:
            grammar = s.grammar.bitmask.device[:num_rows]
            x, cut = self._filter(x, slots, grammar, write_mask=return_processed)
            if return_processed:
                cut = None  # the mask is in x
        else:
            x, _, _ = s.torch_process_logits(x, slots, s.grammar)
            x = x.contiguous()
        tokens = torch.empty(num_rows, dtype=torch.int64, device=x.device)
        positions = s.sampling.positions(slots)
        sample_tokens(
            x,
            slots,
            s.sampling.temperature.device,
            s.sampling.seed.device,
            positions,
            cut,
            tokens,
            SALT_SAMPLE,
        )
        return tokens, x

    def logprobs(
        self, source: torch.Tensor, tokens: torch.Tensor, subtract_lse: bool
    ) -> LogprobsTensors:
        """source: [num_rows, V] raw or processed logits; tokens [num_rows] int64."""
        num_rows, k = source.shape[0], self.sampler.config.max_num_logprobs
        device = source.device
        token_ids = torch.empty(num_rows, k + 1, dtype=torch.int32, device=device)
        values = torch.empty(num_rows, k + 1, dtype=torch.float32, device=device)
        ranks = torch.empty(num_rows, dtype=torch.int32, device=device)
        lse = torch.empty(num_rows, dtype=torch.float32, device=device)
        compute_logprobs(source, tokens, token_ids, values, ranks, lse, subtract_lse)
        return LogprobsTensors(token_ids, values, ranks)

    def commit(self, slots: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor | None) -> None:
        """slots, tokens: [num_rows] int64; keep: [num_rows] bool or None (all rows)."""
        s = self.sampler
        if not self.commit_kernel:
            s.batch_state.commit(tokens, keep)
            return
        if keep is None:
            keep = torch.ones_like(tokens, dtype=torch.bool)
        commit_history(
            slots,
            tokens,
            keep,
            s.batch_state.num_generated.device,
            s.penalties.counts,
            s.penalties.overflow_token.device,
            s.penalties.overflow_excess.device,
            s.bad_words.window.device,
            s.config.padding_slot,
        )
