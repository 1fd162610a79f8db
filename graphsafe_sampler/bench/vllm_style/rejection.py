"""`VllmStyleRejectionSampler`: speculative decoding's verification the way vLLM V1 runs it,
eager, the peer of `graphsafe_sampler.RejectionSampler` in perf/bench_rejection.py.

Same rule, vLLM's way: penalty tensors rebuilt every step from the host-side output lists
(each position's list extended by the drafts before it), min_p through a softmax, sort-based
top-k/top-p (`ops.py`, as the sampler peer does), softmax target probabilities at every
position, uniforms and exponentials through a per-request `torch.Generator` loop for seeded
requests, recovered tokens computed at every draft position, the bonus token sampled
separately, and a host loop over each request's drafts.
"""

from __future__ import annotations

import torch

from graphsafe_sampler.bench.vllm_style.ops import (
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    padded_tokens,
)
from graphsafe_sampler.kernels.constants import GREEDY_TEMPERATURE
from graphsafe_sampler.output import RejectionSamplerOutput
from graphsafe_sampler.testing.batch_driver import DriverRequest


class VllmStyleRejectionSampler:
    """The rejection rule over a static list of requests (see the module docstring).

    requests: live; the engine appends each step's accepted tokens to their output lists.
    """

    def __init__(self, requests: list[DriverRequest], vocab_size: int, max_spec_len: int) -> None:
        self.requests = requests
        self.vocab_size = vocab_size
        self.max_spec_len = max_spec_len
        params = [r.params for r in requests]
        self.temperature = torch.tensor([p.temperature for p in params])
        self.is_greedy = self.temperature < GREEDY_TEMPERATURE
        self.top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab_size for p in params])
        self.top_p = torch.tensor([p.top_p for p in params])
        self.min_p = torch.tensor([p.min_p for p in params])
        self.repetition = torch.tensor([p.repetition_penalty for p in params])
        self.frequency = torch.tensor([p.frequency_penalty for p in params])
        self.presence = torch.tensor([p.presence_penalty for p in params])
        self.any_penalty = any(
            p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty for p in params
        )
        # vLLM keeps one generator per seeded request, advanced by every draw.
        self.generators = {
            row: torch.Generator().manual_seed(p.seed)
            for row, p in enumerate(params)
            if p.seed is not None and not p.temperature < GREEDY_TEMPERATURE
        }

    def _penalties(self, logits: torch.Tensor, drafts: list[list[int]]) -> torch.Tensor:
        """Rebuilt from the host lists every step; position j adds the drafts before it."""
        positions = self.max_spec_len + 1
        outputs = [
            list(req.output_tok_ids) + drafts[row][:j]
            for row, req in enumerate(self.requests)
            for j in range(positions)
        ]
        prompts = [req.prompt_tok_ids or [] for req in self.requests for _ in range(positions)]
        return apply_penalties(
            logits,
            padded_tokens(prompts, self.vocab_size, logits.device),
            outputs,
            self.repetition.repeat_interleave(positions),
            self.frequency.repeat_interleave(positions),
            self.presence.repeat_interleave(positions),
        )

    def _exponentials(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Exp(1) draws [rows, ...]: global generator, then one loop over seeded requests."""
        draws = torch.empty(shape).exponential_()
        for row, gen in self.generators.items():
            draws[row].exponential_(generator=gen)
        return draws

    def processed_logits(
        self, target_logits: torch.Tensor, drafts: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (filtered logits [rows * (S + 1), V], greedy tokens [rows * (S + 1)])."""
        positions = self.max_spec_len + 1
        logits = target_logits.reshape(-1, self.vocab_size)
        if self.any_penalty:
            logits = self._penalties(logits, drafts)
        greedy = logits.argmax(dim=-1)
        temperature = torch.where(self.is_greedy, 1.0, self.temperature)
        logits = logits / temperature.repeat_interleave(positions)[:, None]
        logits = apply_min_p(logits, self.min_p.repeat_interleave(positions)[:, None])
        logits = apply_top_k_top_p(
            logits,
            self.top_k.repeat_interleave(positions),
            self.top_p.repeat_interleave(positions),
        )
        return logits, greedy

    def __call__(
        self,
        target_logits: torch.Tensor,  # [rows, S + 1, V]
        draft_token_ids: torch.Tensor,  # [rows, S]
        num_draft_tokens: torch.Tensor,  # [rows]
        draft_probs: torch.Tensor,  # [rows, S, V]
    ) -> RejectionSamplerOutput:
        rows, positions, vocab = target_logits.shape
        spec = self.max_spec_len
        drafts_host = draft_token_ids.tolist()
        num_host = num_draft_tokens.tolist()
        logits, greedy = self.processed_logits(target_logits, drafts_host)
        target_probs = logits.softmax(dim=-1).view(rows, positions, vocab)
        greedy = greedy.view(rows, positions)

        # Uniforms for acceptance: global generator, then the seeded requests' own.
        uniforms = torch.rand(rows, spec)
        for row, gen in self.generators.items():
            uniforms[row] = torch.rand(spec, generator=gen)
        index = draft_token_ids[:, :, None]
        p_target = target_probs[:, :spec].gather(2, index)[:, :, 0]
        p_draft = draft_probs.gather(2, index)[:, :, 0]
        accept_random = (p_draft > 0) & (p_target / p_draft >= uniforms)
        accept_greedy = draft_token_ids == greedy[:, :spec]
        accept = torch.where(self.is_greedy[:, None], accept_greedy, accept_random)

        # Recovered tokens at every draft position, and the bonus token, sampled up front.
        residual = (target_probs[:, :spec] - draft_probs).clamp_(min=0.0)
        recovered = residual.div_(self._exponentials((rows, spec, vocab))).argmax(dim=-1)
        recovered = torch.where(self.is_greedy[:, None], greedy[:, :spec], recovered)
        bonus_at = num_draft_tokens[:, None, None].expand(rows, 1, vocab)
        bonus_probs = target_probs.gather(1, bonus_at)[:, 0]
        bonus = bonus_probs.div_(self._exponentials((rows, vocab))).argmax(dim=-1)
        bonus = torch.where(
            self.is_greedy, greedy.gather(1, num_draft_tokens[:, None])[:, 0], bonus
        )

        output = torch.full((rows, positions), -1, dtype=torch.int32)
        accepted_counts = []
        accept_host, recovered_host = accept.tolist(), recovered.tolist()
        for row in range(rows):  # vLLM's reference path walks each request's drafts
            count = 0
            while count < num_host[row] and accept_host[row][count]:
                output[row, count] = drafts_host[row][count]
                count += 1
            last = bonus[row] if count == num_host[row] else recovered_host[row][count]
            output[row, count] = int(last)
            accepted_counts.append(count)
        return RejectionSamplerOutput(output, torch.tensor(accepted_counts, dtype=torch.int32))
