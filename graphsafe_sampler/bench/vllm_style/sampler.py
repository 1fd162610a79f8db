"""`VllmStyleSampler`: the step the way vLLM V1's `Sampler` and `InputBatch` run it (the
package docstring says how and why)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.bench.vllm_style.ops import (
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    gather_logprobs,
    padded_tokens,
    random_sample,
)
from graphsafe_sampler.bench.vllm_style.processors import (
    LogitBias,
    MinTokens,
    apply_bad_words,
    apply_dict_updates,
)
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.kernels.constants import GREEDY_TEMPERATURE
from graphsafe_sampler.output import SamplerOutput
from graphsafe_sampler.params import SamplingParams


@dataclass
class _Request:
    params: SamplingParams
    prompt_tok_ids: Sequence[int]
    output_tok_ids: Sequence[int]  # the engine's live list
    generator: torch.Generator | None  # seeded random requests only, as in vLLM


@dataclass
class _Metadata:
    """What vLLM's `SamplingMetadata` holds; rebuilt only when the batch changes."""

    num_rows: int
    all_greedy: bool
    all_random: bool
    temperature: torch.Tensor  # [rows] float32; 0 for greedy and empty rows
    top_k: torch.Tensor | None  # [rows] int64, vocab_size = off; None if no row uses it
    top_p: torch.Tensor | None  # [rows] float32, 1 = off; None if no row uses it
    generators: dict[int, torch.Generator]
    no_penalties: bool
    repetition: torch.Tensor  # [rows] float32
    frequency: torch.Tensor  # [rows] float32
    presence: torch.Tensor  # [rows] float32
    prompt_token_ids: torch.Tensor | None  # [rows, max_prompt_len] int64, padded with V
    allowed_mask: torch.Tensor | None  # [rows, V] bool, True = disallowed
    bad_words: dict[int, list[list[int]]]
    max_num_logprobs: int | None


class VllmStyleSampler:
    """The baseline (see the module docstring). Not an nn.Module: vLLM's sampler keeps no
    tensors of its own across steps beyond what the host rebuilds.

    update_state(batch_update) every step (None = no change), then forward(logits) with
    exactly `batch_size` rows. forward writes into `logits` (vLLM does). The engine appends
    each step's tokens to the requests' output lists; the sampler reads them there.
    """

    def __init__(self, config: SamplerConfig, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        self.requests: dict[int, _Request] = {}
        self.batch_size = 0
        self.logit_bias = LogitBias(self.device)
        self.min_tokens = MinTokens(config.eos_token_id, self.device)
        # vLLM's MinPLogitsProcessor: a dense [rows, 1] tensor, rebuilt on batch changes.
        self.min_p: dict[int, float] = {}
        self.min_p_tensor = torch.zeros(0, 1, device=self.device)
        self.meta = self._make_metadata()

    # ----------------------------------------------------------------- host side

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        changed = apply_dict_updates(self.requests, batch_update, self._new_request)
        if batch_update is not None:
            self.batch_size = batch_update.batch_size
        self.logit_bias.update_state(batch_update)
        self.min_tokens.update_state(batch_update)
        if apply_dict_updates(self.min_p, batch_update, lambda p, _, __: p.min_p or None):
            changed = True
        if changed or self.meta.num_rows != self.batch_size:
            self.meta = self._make_metadata()

    def _new_request(
        self, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]
    ) -> _Request:
        generator = None
        if params.seed is not None and not params.is_greedy:
            generator = torch.Generator(self.device)
            generator.manual_seed(params.seed % 2**64)
        return _Request(params, prompt, output, generator)

    def _make_metadata(self) -> _Metadata:
        rows, vocab_size, device = self.batch_size, self.config.vocab_size, self.device
        temperature = np.zeros(rows, dtype=np.float32)
        top_k = np.full(rows, vocab_size, dtype=np.int64)
        top_p = np.ones(rows, dtype=np.float32)
        repetition = np.ones(rows, dtype=np.float32)
        frequency = np.zeros(rows, dtype=np.float32)
        presence = np.zeros(rows, dtype=np.float32)
        prompts: list[Sequence[int]] = [()] * rows
        generators: dict[int, torch.Generator] = {}
        bad_words: dict[int, list[list[int]]] = {}
        allowed: dict[int, list[int]] = {}
        num_logprobs: list[int] = []
        for row, req in self.requests.items():
            p = req.params
            temperature[row] = p.temperature
            if 0 < p.top_k < vocab_size:
                top_k[row] = p.top_k
            top_p[row] = p.top_p
            repetition[row] = p.repetition_penalty
            frequency[row] = p.frequency_penalty
            presence[row] = p.presence_penalty
            prompts[row] = req.prompt_tok_ids
            if req.generator is not None:
                generators[row] = req.generator
            if p.bad_words_token_ids:
                bad_words[row] = p.bad_words_token_ids
            if p.allowed_token_ids is not None:
                allowed[row] = p.allowed_token_ids
            if p.logprobs is not None:
                num_logprobs.append(p.logprobs)
        num_greedy = int((temperature < GREEDY_TEMPERATURE).sum())
        no_penalties = bool(
            (repetition == 1.0).all() and (frequency == 0.0).all() and (presence == 0.0).all()
        )
        allowed_mask = None
        if allowed:
            allowed_mask = torch.zeros(rows, vocab_size, dtype=torch.bool)
            for row, ids in allowed.items():
                allowed_mask[row] = True
                allowed_mask[row, ids] = False
            allowed_mask = allowed_mask.to(device, non_blocking=True)
        if self.min_p:
            min_p = np.zeros((rows, 1), dtype=np.float32)
            for row, value in self.min_p.items():
                min_p[row] = value
            self.min_p_tensor = torch.from_numpy(min_p).to(device, non_blocking=True)
        return _Metadata(
            num_rows=rows,
            all_greedy=num_greedy == rows,
            all_random=num_greedy == 0,
            temperature=torch.from_numpy(temperature).to(device, non_blocking=True),
            top_k=(
                torch.from_numpy(top_k).to(device, non_blocking=True)
                if (top_k < vocab_size).any()
                else None
            ),
            top_p=(
                torch.from_numpy(top_p).to(device, non_blocking=True)
                if (top_p < 1.0).any()
                else None
            ),
            generators=generators,
            no_penalties=no_penalties,
            repetition=torch.from_numpy(repetition).to(device, non_blocking=True),
            frequency=torch.from_numpy(frequency).to(device, non_blocking=True),
            presence=torch.from_numpy(presence).to(device, non_blocking=True),
            prompt_token_ids=None if no_penalties else padded_tokens(prompts, vocab_size, device),
            allowed_mask=allowed_mask,
            bad_words=bad_words,
            max_num_logprobs=max(num_logprobs) if num_logprobs else None,
        )

    def _output_lists(self) -> list[Sequence[int]]:
        out: list[Sequence[int]] = [()] * self.meta.num_rows
        for row, req in self.requests.items():
            out[row] = req.output_tok_ids
        return out

    # ----------------------------------------------------------------- per step

    def forward(self, logits: torch.Tensor) -> SamplerOutput:
        """logits: [batch_size, V]; written in place when float32 (as in vLLM)."""
        meta = self.meta
        if logits.shape[0] != meta.num_rows:
            raise ValueError(f"logits have {logits.shape[0]} rows, the batch {meta.num_rows}")
        mode = self.config.logprobs_mode
        raw = None
        if meta.max_num_logprobs is not None:
            if mode == "raw_logprobs":
                raw = logits.log_softmax(dim=-1, dtype=torch.float32)
            elif mode == "raw_logits":
                raw = logits.to(torch.float32, copy=True)
        logits = logits.to(torch.float32)
        sampled, processed = self._sample(self._process(logits, meta), meta)
        logprobs = None
        if meta.max_num_logprobs is not None:
            source = raw if raw is not None else processed
            assert source is not None
            logprobs = gather_logprobs(source, meta.max_num_logprobs, sampled)
        return SamplerOutput(sampled.to(torch.int32)[:, None], logprobs)

    __call__ = forward

    def _process(self, logits: torch.Tensor, meta: _Metadata) -> torch.Tensor:
        """docs/design.md §4 steps 2-4 (vLLM's `apply_logits_processors`), in place."""
        if meta.allowed_mask is not None:
            logits.masked_fill_(meta.allowed_mask, float("-inf"))
        outputs = None
        if meta.bad_words:
            outputs = self._output_lists()
            apply_bad_words(logits, meta.bad_words, outputs)
        logits = self.min_tokens.apply(logits)
        logits = self.logit_bias.apply(logits)
        if not meta.no_penalties:
            assert meta.prompt_token_ids is not None
            outputs = outputs if outputs is not None else self._output_lists()
            logits = apply_penalties(
                logits,
                meta.prompt_token_ids,
                outputs,
                meta.repetition,
                meta.frequency,
                meta.presence,
            )
        return logits

    def _filter(self, logits: torch.Tensor, meta: _Metadata) -> torch.Tensor:
        """docs/design.md §4 steps 6-8: temperature (greedy rows: 1), min_p, top-k, top-p."""
        temperature = meta.temperature
        if not meta.all_random:
            temperature = torch.where(temperature < GREEDY_TEMPERATURE, 1.0, temperature)
        logits = logits.div_(temperature[:, None])
        if self.min_p:
            logits = apply_min_p(logits, self.min_p_tensor)
        return apply_top_k_top_p(logits, meta.top_k, meta.top_p)

    def _sample(
        self, logits: torch.Tensor, meta: _Metadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Steps 5-9 (vLLM's `Sampler.sample` and `TopKTopPSampler.forward_native`)."""
        mode = self.config.logprobs_mode
        wants_processed = meta.max_num_logprobs is not None and mode.startswith("processed")
        greedy = None if meta.all_random else logits.argmax(dim=-1)
        if meta.all_greedy and not wants_processed:
            assert greedy is not None
            return greedy, None
        logits = self._filter(logits, meta)
        processed = None
        if wants_processed:
            # softmax below leaves `logits` as they are: no copy needed for *_logits
            processed = logits.log_softmax(dim=-1) if mode.endswith("logprobs") else logits
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        sampled = random_sample(probs, meta.generators)
        if greedy is not None:
            sampled = torch.where(meta.temperature < GREEDY_TEMPERATURE, greedy, sampled)
        return sampled, processed

    def processed_logits(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For checks: (logits after docs/design.md §4 steps 2-8, greedy tokens); reads
        `logits` only."""
        meta = self.meta
        x = self._process(logits.to(torch.float32, copy=True), meta)
        greedy = x.argmax(dim=-1)
        return self._filter(x, meta), greedy
