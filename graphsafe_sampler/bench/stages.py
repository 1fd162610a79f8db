"""Stage-alone benchmark cases: one step of docs/design.md §4's pipeline, ours beside the peers'.

Each stage is timed on the same LLM-like logits and the same per-row parameters in every
provider. Ours are the package's real stage functions, with their state where they keep
some (a `Sampler` holding one request per row supplies the slot tables):

    stage        ours                                       vllm-style
    penalties    PenaltyState.apply (device counts,         apply_penalties, rebuilt from
                 prompt bitmask)                            the host lists every call
    bias         LogitBiasLogitsProcessor.apply_slots       LogitBias.apply (index lists)
    min_p        MinPLogitsProcessor.apply_slots (log space) apply_min_p (softmax + bool mask)
    top_k,       stages/top_k_top_p.py (candidates, then    apply_top_k_top_p (full sort;
    top_p,       radix searches; eager CPU: one sort)       top-k alone: topk)
    top_k_top_p
    greedy       argmax                                     argmax
    sampling     SamplingState.race (rng.gumbel_noise)      softmax + a torch.Generator
                 (every row seeded)                         per request
    logprobs     stages/logprobs.py (K = 5, raw)            gather_logprobs (log_softmax + topk)
    thinking_    ThinkingBudgetState.apply (device ring,    a host loop over the requests'
    budget       every row forced)                          token lists, then masks by index
    logprob_     requested_logprobs (C = 8 ids a row,       log_softmax, gather, compare
    token_ids    shifted logits, C counts)
    watermark    SamplingState.race keyed by the context    the peer's seeded sampling (vLLM
                 hash (`race_inputs`, every row marked)     V1 has no watermark): a cost
                                                            reference, not the same work
    prompt_      compute_prompt_logprobs (rows = prompt     log_softmax of the whole chunk,
    logprobs     positions, K = 5)                          topk, gather, rank

FlashInfer's sampling functions join on CUDA when `flashinfer` imports, per the one table of
`bench/flashinfer.py` (top_k, top_p, top_k_top_p, min_p, sampling; they sample or
renormalise rather than mask, so read those rows as a cost reference, not the same work).

Every stage starts from the logits in the case's dtype and converts them to float32 (as the
Sampler does once per step), so bfloat16 cases include that conversion.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.bench import vllm_style
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.kernels.constants import SALT_SAMPLE
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.pipelines.torch_pipeline import race_inputs
from graphsafe_sampler.prompt_logprobs import compute_prompt_logprobs
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.stages.logprobs import compute_logprobs, requested_logprobs, row_logsumexp

STAGES = (
    "penalties",
    "bias",
    "min_p",
    "top_k",
    "top_p",
    "top_k_top_p",
    "greedy",
    "sampling",
    "logprobs",
    "thinking_budget",
    "logprob_token_ids",
    "watermark",
    "prompt_logprobs",
)
"""Stage-alone cases (rejection sampling lives in `perf/bench_rejection.py`)."""

TOP_K = 50
TOP_P = 0.9
MIN_P = 0.05
TEMPERATURE = 0.8
"""The temperature of the cases that run every feature at once (the GPU check's "all")."""
MAX_NUM_LOGPROBS = 5
BIAS_ENTRIES = 32
PROMPT_LEN = 512
OUTPUT_LEN = 128
CHOSEN_IDS = 8
THINK_START = 1
THINK_END = (2, 3)
THINKING_BUDGET = 64
WATERMARK_CONTEXT = 4

StageFn = Callable[[torch.Tensor], object]


def stage_params(stage: str, row: int) -> SamplingParams:
    """The parameters every row of a stage case carries: the stage's feature on, the rest off
    (so that the Sampler's tables hold exactly what the stage reads)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    kwargs: dict[str, Any] = {"temperature": 0.0 if stage == "greedy" else 1.0}
    if stage == "penalties":
        kwargs.update(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.5)
    elif stage == "min_p":
        kwargs["min_p"] = MIN_P
    elif stage in ("top_k", "top_k_top_p"):
        kwargs["top_k"] = TOP_K
    if stage in ("top_p", "top_k_top_p"):
        kwargs["top_p"] = TOP_P
    if stage == "sampling":
        kwargs["seed"] = 1000 + row
    if stage == "logprobs":
        kwargs["logprobs"] = MAX_NUM_LOGPROBS
    if stage == "thinking_budget":
        kwargs["thinking_token_budget"] = THINKING_BUDGET
    if stage == "logprob_token_ids":
        kwargs["logprob_token_ids"] = [(row * 131 + 7 * i) % 1000 for i in range(CHOSEN_IDS)]
    if stage == "watermark":
        kwargs["watermark_key"] = 2**40 + row
    return SamplingParams(**kwargs)


@dataclass
class StageCase:
    """The state a stage reads, built once per (stage, rows, vocab) and shared by providers."""

    stage: str
    rows: int
    vocab: int
    device: torch.device
    sampler: Sampler  # our tables: one request per row
    peer: vllm_style.VllmStyleSampler  # the peer's per-row metadata, same requests
    output_lists: list[Sequence[int]]
    prompt_lists: list[Sequence[int]]
    tokens: torch.Tensor  # [rows] int64: the "sampled" tokens the logprobs stage reports

    @classmethod
    def build(
        cls, stage: str, rows: int, vocab: int, device: torch.device | str, seed: int = 0
    ) -> StageCase:
        device = torch.device(device)
        gen = torch.Generator().manual_seed(seed)
        bias = {}
        if stage == "bias":
            ids = torch.randperm(vocab, generator=gen)[: rows * BIAS_ENTRIES].view(rows, -1)
            bias = {row: {int(t): 1.5 for t in ids[row % ids.shape[0]]} for row in range(rows)}
        added = []
        output_lists: list[Sequence[int]] = []
        prompt_lists: list[Sequence[int]] = []
        for row in range(rows):
            params = stage_params(stage, row)
            if bias:
                params = dataclasses.replace(params, logit_bias=bias[row])
            prompt = torch.randint(vocab, (PROMPT_LEN,), generator=gen).tolist()
            output = torch.randint(vocab, (OUTPUT_LEN,), generator=gen).tolist()
            if stage == "thinking_budget":
                # the template opens the section in the prompt, no marker comes after it,
                # and the output is past the budget: every row is forced
                markers = (THINK_START, *THINK_END)
                prompt = [t + len(markers) if t in markers else t for t in prompt]
                output = [t + len(markers) if t in markers else t for t in output]
                prompt[-1] = THINK_START
            output_lists.append(output)
            prompt_lists.append(prompt)
            added.append((row, params, prompt, output))
        update = BatchUpdate(rows, added=tuple(added))
        config = SamplerConfig(
            rows,
            vocab,
            max_num_logprobs=MAX_NUM_LOGPROBS,
            backend="torch",
            seed=seed,
            max_logit_bias_tokens=max(BIAS_ENTRIES, 1),
            # each stage's own tables only where its case reads them
            max_logprob_token_ids=CHOSEN_IDS if stage == "logprob_token_ids" else 0,
            reasoning_start_token_ids=(THINK_START,) if stage == "thinking_budget" else (),
            reasoning_end_token_ids=THINK_END if stage == "thinking_budget" else (),
            watermark_context_len=WATERMARK_CONTEXT if stage == "watermark" else 0,
        )
        sampler = Sampler(config, device)
        sampler.update_state(update)
        peer = vllm_style.VllmStyleSampler(config, device)
        peer.update_state(update)
        tokens = torch.randint(vocab, (rows,), generator=gen).to(device)
        return cls(stage, rows, vocab, device, sampler, peer, output_lists, prompt_lists, tokens)

    # ------------------------------------------------------------- ours

    def ours(self) -> StageFn:
        """Our stage as a function of the logits (eager; `torch.compile` it for the compiled
        provider)."""
        stages, rows = self.sampler.stages, self.rows
        slots = self.sampler.batch_state.slots(rows)
        tokens = self.tokens
        stage = self.stage
        k = self.sampler.config.max_num_logprobs

        def run(logits: torch.Tensor) -> object:
            x = logits.to(torch.float32)
            if stage == "penalties":
                return stages.penalties.apply(x, slots)
            if stage == "bias":
                return stages.logit_bias.apply_slots(x, slots)
            if stage == "min_p":
                return stages.min_p.apply_slots(x, slots)
            if stage in ("top_k", "top_p", "top_k_top_p"):
                return stages.top_k_top_p.apply(x, slots)
            if stage == "greedy":
                return x.argmax(dim=-1)
            if stage == "sampling":
                positions = stages.batch_state.positions(slots)
                return stages.sampling.race(x, slots, positions, SALT_SAMPLE)
            if stage == "thinking_budget":
                assert stages.thinking_budget is not None
                return stages.thinking_budget.apply(x, slots)
            if stage == "logprob_token_ids":
                assert stages.logprob_token_ids is not None
                ids = stages.logprob_token_ids.ids(slots)
                return requested_logprobs(x, ids, row_logsumexp(x))
            if stage == "watermark":
                seeds, positions = race_inputs(stages, slots)
                return stages.sampling.race(x, slots, positions, SALT_SAMPLE, seeds=seeds)
            if stage == "prompt_logprobs":
                return compute_prompt_logprobs(x, tokens, k)
            return compute_logprobs(x, tokens, k, subtract_lse=True)  # logprobs

        return run

    # ------------------------------------------------------------- vllm-style

    def vllm_style(self) -> StageFn:
        """The peer's way of doing the same stage, eager (see `bench.vllm_style`)."""
        peer, meta, stage = self.peer, self.peer.meta, self.stage
        outputs = self.output_lists
        tokens = self.tokens
        # the peer's host-side view of each request: prompt and output token lists
        histories = [[*p, *o] for p, o in zip(self.prompt_lists, outputs, strict=True)]
        chosen_ids = torch.tensor(
            [stage_params("logprob_token_ids", r).logprob_token_ids for r in range(self.rows)],
            device=self.device,
        )  # [rows, C]

        def run(logits: torch.Tensor) -> object:
            x = logits.to(torch.float32)
            if stage == "penalties":
                assert meta.prompt_token_ids is not None
                return vllm_style.apply_penalties(
                    x,
                    meta.prompt_token_ids,
                    outputs,
                    meta.repetition,
                    meta.frequency,
                    meta.presence,
                )
            if stage == "bias":
                return peer.logit_bias.apply(x)
            if stage == "min_p":
                return vllm_style.apply_min_p(x, peer.min_p_tensor)
            if stage in ("top_k", "top_p", "top_k_top_p"):
                return vllm_style.apply_top_k_top_p(x, meta.top_k, meta.top_p)
            if stage == "greedy":
                return x.argmax(dim=-1)
            if stage in ("sampling", "watermark"):
                return vllm_style.random_sample(x.softmax(dim=-1), meta.generators)
            if stage == "thinking_budget":
                return vllm_style.force_thinking_end(x, histories, (THINK_START,), THINK_END,
                                                     THINKING_BUDGET)  # fmt: skip
            if stage == "logprob_token_ids":
                logprobs = x.log_softmax(dim=-1)
                chosen = logprobs.gather(1, chosen_ids)
                ranks = (logprobs[:, None, :] >= chosen[:, :, None]).sum(-1)
                return chosen, ranks.to(torch.int32)
            # logprobs, and prompt_logprobs (the rows as prompt positions)
            return vllm_style.gather_logprobs(x.log_softmax(dim=-1), MAX_NUM_LOGPROBS, tokens)

        return run
