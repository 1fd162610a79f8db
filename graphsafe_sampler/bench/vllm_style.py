"""A vLLM-V1-style eager sampler: the peer baseline of the benchmarks (docs/design.md §6).

Same semantics as `graphsafe_sampler.Sampler` (docs/design.md §4), written the way vLLM V1's
`Sampler` (`vllm/v1/sample/sampler.py`), its built-in logits processors and its persistent
`InputBatch` do the work, so that the benchmark compares designs rather than effort:

- per-request state lives in Python dicts keyed by batch row, updated from `BatchUpdate`s
  (removed, then added, then moved, in list order; SWAP and UNIDIRECTIONAL moves);
- when the batch changes, the per-row parameter tensors (temperature, top-k, top-p,
  penalties, min_p, the padded prompt-token tensor, the dense allowed-token mask) are rebuilt
  on the host and copied to the device, as vLLM's `_make_sampling_metadata` does;
- logit bias and min_tokens keep index lists built by Python loops over their dicts (vLLM's
  `LogitBiasLogitsProcessor` / `MinTokensLogitsProcessor`); min_tokens re-checks every
  request's output length on the host every step;
- penalties rebuild the output-token tensor from the Python output lists every step (padded
  with `vocab_size`, then scattered into `[rows, V + 1]` bin counts), and count the prompt
  tokens the same way (vLLM's `apply_all_penalties`);
- bad words are a Python loop over requests and words on the row's output list;
- greedy rows take `argmax`; random rows: temperature, min_p through a softmax, top-k/top-p
  through a full ascending `torch.sort` of every row, softmax, cumsum and a scatter back;
  then the exponential race with one batched `exponential_()` for unseeded rows and a
  per-request `torch.Generator` loop (`q[i].exponential_(generator=g)`) for seeded ones;
- logprobs: `log_softmax` + `topk` + a `>=` count for the rank.

It is a fair baseline: no per-token Python, every per-row loop is the one vLLM has, and the
work is batched wherever vLLM batches it. It differs from vLLM only where the semantics
demand it: top-p keeps ties at the boundary (one extra gather; vLLM's sort order decides
them), the repetition penalty divides (`l / r`, docs/design.md §4; vLLM multiplies by `1 / r`),
greedy rows keep their filter parameters (vLLM's `SamplingParams` resets them), EOS is
masked by min_tokens as docs/design.md §4 says, and an update is applied in the order of
docs/design.md §3 (vLLM's processors apply adds before removals, which its builder makes
equivalent).

Tokens come from the same distribution as the Sampler's, not the same tokens: the random
numbers differ (torch's generators here, a counter-based hash there). Greedy rows and the raw
logprobs match exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from graphsafe_sampler.batch_update import BatchUpdate, MoveDirectionality
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.output import LogprobsTensors, SamplerOutput
from graphsafe_sampler.params import GREEDY_TEMPERATURE, SamplingParams

T = TypeVar("T")


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


def _apply_dict_updates(
    entries: dict[int, T],
    batch_update: BatchUpdate | None,
    new_entry: Callable[[SamplingParams, Sequence[int], Sequence[int]], T | None],
) -> bool:
    """vLLM's `process_dict_updates`, in the order of docs/design.md §3 (removed, added,
    moved); returns whether anything changed."""
    if batch_update is None:
        return False
    changed = False
    for row in batch_update.removed:
        changed |= entries.pop(row, None) is not None
    for row, params, prompt, output in batch_update.added:
        entry = new_entry(params, prompt or (), output)
        if entry is not None:
            entries[row] = entry
            changed = True
        else:
            changed |= entries.pop(row, None) is not None
    for a, b, direction in batch_update.moved:
        a_entry, b_entry = entries.pop(a, None), entries.pop(b, None)
        if a_entry is not None:
            entries[b] = a_entry
            changed = True
        if b_entry is not None:
            changed = True
            if direction is MoveDirectionality.SWAP:
                entries[a] = b_entry
    return changed


def _device_tensor(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype, device="cpu").to(device, non_blocking=True)


class LogitBias:
    """vLLM's `LogitBiasLogitsProcessor`: index lists rebuilt from a dict on every change."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.biases: dict[int, dict[int, float]] = {}
        self.rows = self.cols = _device_tensor([], torch.int64, device)
        self.values = _device_tensor([], torch.float32, device)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if not _apply_dict_updates(
            self.biases, batch_update, lambda p, _, __: p.logit_bias or None
        ):
            return
        rows: list[int] = []
        cols: list[int] = []
        values: list[float] = []
        for row, bias in self.biases.items():
            rows.extend([row] * len(bias))
            cols.extend(bias.keys())
            values.extend(bias.values())
        self.rows = _device_tensor(rows, torch.int64, self.device)
        self.cols = _device_tensor(cols, torch.int64, self.device)
        self.values = _device_tensor(values, torch.float32, self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.biases:
            logits[self.rows, self.cols] += self.values
        return logits


class _MinTokens:
    """vLLM's `MinTokensLogitsProcessor`: stop ids (and EOS) are -inf while a request has
    fewer than min_tokens outputs; the host checks every request's length every step."""

    def __init__(self, eos_token_id: int | None, device: torch.device) -> None:
        self.eos_token_id = eos_token_id
        self.device = device
        # row -> (min_tokens, live output list, stop ids)
        self.min_toks: dict[int, tuple[int, Sequence[int], list[int]]] = {}
        self.rows = self.cols = _device_tensor([], torch.int64, device)

    def _new_entry(
        self, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]
    ) -> tuple[int, Sequence[int], list[int]] | None:
        stop_ids = set(params.stop_token_ids or ())
        if self.eos_token_id is not None:
            stop_ids.add(self.eos_token_id)
        if not params.min_tokens or len(output) >= params.min_tokens or not stop_ids:
            return None
        return params.min_tokens, output, sorted(stop_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        changed = _apply_dict_updates(self.min_toks, batch_update, self._new_entry)
        done = [row for row, (n, out, _) in self.min_toks.items() if len(out) >= n]
        for row in done:
            del self.min_toks[row]
        if not (changed or done):
            return
        rows: list[int] = []
        cols: list[int] = []
        for row, (_, _, stop_ids) in self.min_toks.items():
            rows.extend([row] * len(stop_ids))
            cols.extend(stop_ids)
        self.rows = _device_tensor(rows, torch.int64, self.device)
        self.cols = _device_tensor(cols, torch.int64, self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.min_toks:
            logits[self.rows, self.cols] = float("-inf")
        return logits


def _apply_bad_words(
    logits: torch.Tensor,  # [rows, V] float32, updated in place
    bad_words: dict[int, list[list[int]]],
    output_tok_ids: list[Sequence[int]],
) -> None:
    """vLLM's `apply_bad_words`: a Python loop over requests and their words."""
    for row, words in bad_words.items():
        past = output_tok_ids[row]
        for word in words:
            prefix_len = len(word) - 1
            if prefix_len > len(past):
                continue
            if prefix_len == 0 or list(past[-prefix_len:]) == word[:-1]:
                logits[row, word[-1]] = float("-inf")


def _bin_counts(tokens: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens: [rows, n] int64 padded with vocab_size -> counts [rows, V] int64, mask bool
    (vLLM's `get_token_bin_counts_and_mask`)."""
    counts = torch.zeros(tokens.shape[0], vocab_size + 1, dtype=torch.int64, device=tokens.device)
    counts.scatter_add_(1, tokens, torch.ones_like(tokens))
    counts = counts[:, :vocab_size]
    return counts, counts > 0


def padded_tokens(
    lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """vLLM's `make_tensor_with_pad`: a numpy array padded with vocab_size, then H2D."""
    max_len = max((len(x) for x in lists), default=0)
    padded = np.full((len(lists), max_len), vocab_size, dtype=np.int64)
    for i, tokens in enumerate(lists):
        padded[i, : len(tokens)] = tokens
    return torch.from_numpy(padded).to(device, non_blocking=True)


def apply_penalties(
    logits: torch.Tensor,  # [rows, V] float32
    prompt_token_ids: torch.Tensor,  # [rows, P] int64 padded with V
    output_tok_ids: list[Sequence[int]],
    repetition: torch.Tensor,  # [rows] float32 (1 = off)
    frequency: torch.Tensor,  # [rows] float32 (0 = off)
    presence: torch.Tensor,  # [rows] float32 (0 = off)
) -> torch.Tensor:
    """vLLM's `apply_all_penalties`: the output-token tensor and both bin counts are rebuilt
    from the host lists every step, for every row of the batch."""
    vocab_size = logits.shape[1]
    output_tokens = padded_tokens(output_tok_ids, vocab_size, logits.device)
    _, prompt_mask = _bin_counts(prompt_token_ids, vocab_size)
    output_counts, output_mask = _bin_counts(output_tokens, vocab_size)
    rep = repetition[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(prompt_mask | output_mask, penalised, logits)
    logits -= frequency[:, None] * output_counts
    logits -= presence[:, None] * output_mask
    return logits


def _apply_top_k_only(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """vLLM's `apply_top_k_only`: topk to the largest k in the batch, no sort."""
    vocab_size = logits.shape[1]
    is_off = top_k >= vocab_size
    k = top_k.masked_fill(is_off, 1)
    max_top_k = int(k.max())  # vLLM passes the tensor to topk, an implicit sync too
    kth = logits.topk(max_top_k, dim=1).values.gather(1, (k - 1)[:, None])
    kth.masked_fill_(is_off[:, None], float("-inf"))
    return logits.masked_fill_(logits < kth, float("-inf"))


def apply_min_p(
    logits: torch.Tensor,  # [rows, V] float32, updated in place
    min_p: torch.Tensor,  # [rows, 1] float32 (0 = off)
) -> torch.Tensor:
    """vLLM's `MinPLogitsProcessor.apply`: a softmax, then a boolean-mask assignment."""
    probs = logits.softmax(dim=-1)
    max_probs = probs.amax(dim=-1, keepdim=True)
    logits[probs < max_probs.mul_(min_p)] = float("-inf")
    return logits


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """vLLM's `apply_top_k_top_p`: a full ascending sort of every row."""
    if top_p is None:
        return logits if top_k is None else _apply_top_k_only(logits, top_k)
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    vocab_size = logits.shape[1]
    if top_k is not None:
        kth = logits_sort.gather(1, (vocab_size - top_k)[:, None])
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = probs_sort.cumsum_(dim=-1)
    top_p_mask = probs_sum <= 1 - top_p[:, None]
    top_p_mask[:, -1] = False  # the max always survives
    # The masked tokens are a prefix; keep every token equal to the first survivor (ties).
    first_kept = top_p_mask.sum(dim=-1, keepdim=True)
    boundary = logits_sort.gather(1, first_kept)
    logits_sort.masked_fill_(logits_sort < boundary, float("-inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """vLLM's `random_sample`: the exponential race, seeded rows one by one."""
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    return probs.div_(q).argmax(dim=-1)


def gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> LogprobsTensors:
    """vLLM's `gather_logprobs`."""
    top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)
    token_ids = token_ids[:, None]
    token_logprobs = logprobs.gather(-1, token_ids)
    ranks = (logprobs >= token_logprobs).sum(-1)
    return LogprobsTensors(
        torch.cat((token_ids, top_ids), dim=1).to(torch.int32),
        torch.cat((token_logprobs, top_logprobs), dim=1),
        ranks.to(torch.int32),
    )


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
        self.min_tokens = _MinTokens(config.eos_token_id, self.device)
        # vLLM's MinPLogitsProcessor: a dense [rows, 1] tensor, rebuilt on batch changes.
        self.min_p: dict[int, float] = {}
        self.min_p_tensor = torch.zeros(0, 1, device=self.device)
        self.meta = self._make_metadata()

    # ----------------------------------------------------------------- host side

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        changed = _apply_dict_updates(self.requests, batch_update, self._new_request)
        if batch_update is not None:
            self.batch_size = batch_update.batch_size
        self.logit_bias.update_state(batch_update)
        self.min_tokens.update_state(batch_update)
        if _apply_dict_updates(self.min_p, batch_update, lambda p, _, __: p.min_p or None):
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
            _apply_bad_words(logits, meta.bad_words, outputs)
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
