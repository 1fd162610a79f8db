"""`Sampler`: the whole sampling step as one graph-safe `nn.Module` (PyTorch backend).

`update_state(batch_update)` is the host side: it validates the update whole, then writes
slot tables and flushes them (H2D copies, plus stream-ordered scatters for new requests'
count rows). `forward(logits)` is the device side: DESIGN §4's pipeline, branch-free on
request state, with no host reads, and by default it commits each row's token to the
request's device-side history (counts, generated-token count, bad-words window), inside the
graph.

Pipeline (float32): raw logprobs kept -> allowed ids, bad words, grammar bitmask ->
min_tokens, logit_bias, custom processors -> penalties -> greedy argmax -> temperature ->
min_p, custom argmax-invariant processors -> top-k, top-p -> exponential race ->
merge greedy/random per row -> logprobs -> commit.

Rows past the batch (padding) map to the padding slot: greedy, no filters, and they commit
nothing. A NaN row returns the index of its first NaN (argmax's choice); a row with every
token masked returns token 0. Both are valid ids in [0, V).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from graphsafe_sampler.bad_words import BadWordsState
from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.config import SamplerConfig, resolve_backend
from graphsafe_sampler.kernels.constants import GREEDY_TEMPERATURE, SALT_SAMPLE
from graphsafe_sampler.ops.rng import gumbel_noise
from graphsafe_sampler.ops.top_k_top_p import apply_top_k_top_p
from graphsafe_sampler.output import LogprobsTensors, SamplerOutput
from graphsafe_sampler.penalties import PenaltyState
from graphsafe_sampler.processors.allowed_token_ids import AllowedTokenIdsLogitsProcessor
from graphsafe_sampler.processors.base import LogitsProcessor
from graphsafe_sampler.processors.loading import build_logits_processors, load_logits_processors
from graphsafe_sampler.processors.logit_bias import LogitBiasLogitsProcessor
from graphsafe_sampler.processors.min_p import MinPLogitsProcessor
from graphsafe_sampler.processors.min_tokens import MinTokensLogitsProcessor
from graphsafe_sampler.sampling_state import SamplingState
from graphsafe_sampler.structured_output import GrammarBitmask

_LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)


class Sampler(nn.Module):
    """Turns `[num_rows, V]` logits into next tokens (and logprobs) inside one graph.

    config: sizes and capacities (SamplerConfig). device: where state lives and logits come
    from (default: CUDA if available, else CPU).
    """

    def __init__(self, config: SamplerConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        if not isinstance(config, SamplerConfig):
            raise TypeError(f"config must be a SamplerConfig, got {type(config).__name__}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.config = config
        self.device = torch.device(device)
        self.backend = resolve_backend(config, self.device)
        self.batch_state = BatchState(config, self.device)
        state, pin = self.batch_state, self.batch_state.pin_memory
        # Registration order is add order; the pipeline order is fixed in forward.
        self.allowed = AllowedTokenIdsLogitsProcessor(config, self.device, pin, batch_state=state)
        self.bad_words = BadWordsState(config, state)
        self.grammar = GrammarBitmask(config, state)
        self.min_tokens = MinTokensLogitsProcessor(config, self.device, pin, batch_state=state)
        self.logit_bias = LogitBiasLogitsProcessor(config, self.device, pin, batch_state=state)
        self.penalties = PenaltyState(config, state)
        self.sampling = SamplingState(config, state)
        self.min_p = MinPLogitsProcessor(config, self.device, pin, batch_state=state)
        classes = load_logits_processors(config.logits_processors)
        self.custom: list[LogitsProcessor] = build_logits_processors(
            classes, config, self.device, pin, state
        )
        self.graph_safe = all(p.graph_safe for p in self.custom)
        # The Triton backend drives the same state through the kernels (triton_backend.py).
        self._triton = None
        if self.backend == "triton":
            # imported here: the PyTorch backend never imports Triton
            from graphsafe_sampler.triton_backend import TritonPipeline

            self._triton = TritonPipeline(self)
        self._ready = False

    # ----------------------------------------------------------------- host side

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Apply one step's batch changes: validated whole first, then host writes and H2D
        copies. A rejected update raises and changes nothing (host RNG included)."""
        if batch_update is not None:
            # Everything that can reject the update runs before anything changes.
            self.batch_state.validate(batch_update)
            for proc in self.custom:
                proc.validate_update(batch_update)
        self.batch_state.update(batch_update, validated=True)
        # Slot processors on the shared state were updated above (their update_state is a
        # no-op); row-indexed ones apply the update themselves.
        for proc in self.custom:
            proc.update_state(batch_update)
        self._ready = True

    def stage_grammar_bitmask(
        self, bitmask: torch.Tensor | np.ndarray | None, rows: Sequence[int] | None = None
    ) -> None:
        """Stage this step's structured-output bitmask (int32 [len(rows), ceil(V/32)], bit
        set = allowed, xgrammar's layout) for batch `rows`; other rows are unconstrained.
        A row's mask moves with its request and is cleared when the request leaves;
        otherwise it stays in force until the next call (`None` clears every row)."""
        self.grammar.stage(bitmask, rows)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor kept across steps, by name (the graph-safety harness checks them)."""
        out = dict(self.batch_state.state_tensors())
        parts: dict[str, object] = {
            "allowed": self.allowed,
            "bad_words": self.bad_words,
            "min_tokens": self.min_tokens,
            "logit_bias": self.logit_bias,
            "penalties": self.penalties,
            "sampling": self.sampling,
            "min_p": self.min_p,
        }
        for i, proc in enumerate(self.custom):
            parts[f"custom{i}"] = proc
        for prefix, part in parts.items():
            for name, tensor in part.state_tensors().items():  # type: ignore[attr-defined]
                if not name.startswith("batch_state."):
                    out[f"{prefix}.{name}"] = tensor
        return out

    def _check_logits(self, logits: torch.Tensor) -> None:
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() != 2:
            raise ValueError(f"logits must be 2-D [num_rows, vocab_size], got {logits.dim()}-D")
        if logits.dtype not in _LOGITS_DTYPES:
            raise TypeError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
        self._check_device("logits", logits)
        rows, vocab = logits.shape
        if vocab != self.config.vocab_size:
            raise ValueError(f"logits have {vocab} columns, vocab_size is {self.config.vocab_size}")
        self._check_rows("logits", rows)

    def _check_device(self, what: str, tensor: torch.Tensor) -> None:
        if tensor.device != self.device and not (
            tensor.device.type == self.device.type == "cuda" and self.device.index is None
        ):
            raise ValueError(f"{what} are on {tensor.device}, the sampler on {self.device}")

    def _check_rows(self, what: str, rows: int) -> None:
        """Raise unless a step over `rows` batch rows can run now (host state only)."""
        if not 1 <= rows <= self.config.max_num_reqs:
            raise ValueError(
                f"{what} have {rows} rows; forward takes 1 to max_num_reqs = "
                f"{self.config.max_num_reqs}"
            )
        if not self._ready:
            raise RuntimeError("forward before any update_state: there is no batch yet")
        # Host state, so not under torch.compile (it would guard on the batch size and
        # recompile as the batch changes); eager calls and traces check it.
        if not torch.compiler.is_compiling() and rows < self.batch_state.batch_size:
            raise ValueError(
                f"{what} have {rows} rows but the batch holds {self.batch_state.batch_size}"
            )

    def _check_commit_mask(self, commit_mask: torch.Tensor | None, num_rows: int) -> None:
        """A mask that broadcast (length 1) or were not bool would commit the wrong rows."""
        if commit_mask is None:
            return
        if not isinstance(commit_mask, torch.Tensor):
            raise TypeError(f"commit_mask must be a torch.Tensor, got {type(commit_mask).__name__}")
        if commit_mask.dtype != torch.bool:
            raise TypeError(f"commit_mask must be bool, got {commit_mask.dtype}")
        if tuple(commit_mask.shape) != (num_rows,):
            raise ValueError(
                f"commit_mask must have shape [{num_rows}], got {list(commit_mask.shape)}"
            )
        self._check_device("commit_mask", commit_mask)

    def _check_commit(
        self,
        token_ids: torch.Tensor,
        num_tokens: torch.Tensor | None,
        commit_mask: torch.Tensor | None,
    ) -> None:
        """Host facts of a `commit_tokens` call: types, shapes, dtypes, devices."""
        if not isinstance(token_ids, torch.Tensor):
            raise TypeError(f"token_ids must be a torch.Tensor, got {type(token_ids).__name__}")
        if token_ids.dtype not in _INDEX_DTYPES:
            raise TypeError(f"token_ids must be int32 or int64, got {token_ids.dtype}")
        if token_ids.dim() not in (1, 2):
            raise ValueError(
                f"token_ids must be [num_rows] or [num_rows, n], got {token_ids.dim()}-D"
            )
        self._check_device("token_ids", token_ids)
        num_rows = token_ids.shape[0]
        self._check_rows("token_ids", num_rows)
        if num_tokens is not None:
            if token_ids.dim() != 2:
                raise ValueError("num_tokens needs 2-D token_ids [num_rows, n]")
            if not isinstance(num_tokens, torch.Tensor):
                raise TypeError(
                    f"num_tokens must be a torch.Tensor, got {type(num_tokens).__name__}"
                )
            if num_tokens.dtype not in _INDEX_DTYPES:
                raise TypeError(f"num_tokens must be int32 or int64, got {num_tokens.dtype}")
            if tuple(num_tokens.shape) != (num_rows,):
                raise ValueError(
                    f"num_tokens must have shape [{num_rows}], got {list(num_tokens.shape)}"
                )
            self._check_device("num_tokens", num_tokens)
        self._check_commit_mask(commit_mask, num_rows)

    def _validate_commit(self, token_ids: torch.Tensor, num_tokens: torch.Tensor | None) -> None:
        """`commit_tokens(validate=True)`: read the device values on the host (a sync)."""
        if torch.compiler.is_compiling():
            raise RuntimeError("validate=True reads device values on the host: not in a graph")
        ids = token_ids.cpu().numpy().reshape(token_ids.shape[0], -1)  # [num_rows, n]
        used = np.ones(ids.shape, dtype=bool)
        if num_tokens is not None:
            counts = num_tokens.cpu().numpy()
            bad = np.flatnonzero((counts < 0) | (counts > ids.shape[1]))
            if bad.size:
                row = int(bad[0])
                raise ValueError(
                    f"num_tokens[{row}] = {int(counts[row])} is outside [0, {ids.shape[1]}]"
                )
            used = np.arange(ids.shape[1])[None, :] < counts[:, None]
        vocab = self.config.vocab_size
        bad_ids = np.argwhere(used & ((ids < 0) | (ids >= vocab)))
        if bad_ids.size:
            row, col = (int(i) for i in bad_ids[0])
            where = f"[{row}, {col}]" if token_ids.dim() == 2 else f"[{row}]"
            raise ValueError(
                f"token_ids{where} = {int(ids[row, col])} is outside the vocabulary [0, {vocab})"
            )

    # ----------------------------------------------------------------- device side

    def forward(
        self,
        logits: torch.Tensor,
        commit_mask: torch.Tensor | None = None,
        *,
        commit: bool = True,
    ) -> SamplerOutput:
        """logits: [num_rows, V] float32/float16/bfloat16, row i = batch row i (rows past
        the batch are padding). commit_mask: optional [num_rows] bool device tensor; rows
        with False (a chunked-prefill step whose token the engine discards) keep their
        history. commit=False skips the commit for every row (e.g. the engine commits later
        with `commit_tokens`)."""
        self._check_logits(logits)
        num_rows = logits.shape[0]
        self._check_commit_mask(commit_mask, num_rows)
        config = self.config
        slots = self.batch_state.slots(num_rows)  # [num_rows] int64
        raw = logits
        x = logits.to(torch.float32, copy=True)  # [num_rows, V]; never written in place
        if self._triton is not None:
            mode = config.logprobs_mode
            processed = config.max_num_logprobs > 0 and mode.startswith("processed")
            tokens, x = self._triton.sample(x, slots, return_processed=processed)
            logprobs = None
            if config.max_num_logprobs > 0:
                source = raw if mode.startswith("raw") else x
                logprobs = self._triton.logprobs(source, tokens, mode.endswith("logprobs"))
            if commit:
                self._triton.commit(slots, tokens, commit_mask)
            return SamplerOutput(tokens.to(torch.int32)[:, None], logprobs)
        x, greedy_tokens, is_greedy = self.torch_process_logits(x, slots, self.grammar)
        positions = self.sampling.positions(slots)
        seeds = self.sampling.seed.device[slots]
        noise = gumbel_noise(seeds, positions, config.vocab_size, SALT_SAMPLE)
        random_tokens = (x + noise).argmax(dim=-1)
        tokens = torch.where(is_greedy, greedy_tokens, random_tokens)  # [num_rows] int64

        logprobs = None
        if config.max_num_logprobs > 0:
            logprobs = self._logprobs(raw, x, tokens)
        if commit:
            self.batch_state.commit(tokens, commit_mask)
        return SamplerOutput(tokens.to(torch.int32)[:, None], logprobs)

    def process_logits(
        self,
        x: torch.Tensor,  # [rows, V] float32, a fresh copy: updated in place
        slots: torch.Tensor,  # [rows] int64, the slot of each row's request
        grammar: GrammarBitmask,
        drafts: torch.Tensor | None = None,  # [rows, S] int64 ids in [0, V)
        num_preceding: torch.Tensor | None = None,  # [rows] int64 in [0, S]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """DESIGN §4 steps 2-8 on rows that read their request state from `slots`.

        Row i need not be batch row i: speculative decoding passes `[num_rows * (S + 1),
        V]` logits whose row r * (S + 1) + j is position j of batch row r, with `slots`
        repeated to match, `grammar` holding a mask per position, and `drafts` (the
        row's drafts) of which the first `num_preceding` precede the row: they count as
        output tokens for penalties, bad words and min_tokens.

        Returns (processed logits [rows, V] after temperature, min_p and top-k/top-p,
        greedy token [rows] int64 (argmax before temperature; read it for greedy rows),
        is_greedy [rows] bool). The Triton backend runs it through its kernels
        (`TritonPipeline.process_logits`) unless a custom processor is not
        argmax-invariant; the PyTorch stages are `torch_process_logits`.
        """
        if (drafts is None) != (num_preceding is None):
            raise ValueError("drafts and num_preceding come together")
        if self._triton is not None and self._triton.fused:
            return self._triton.process_logits(x, slots, grammar, drafts, num_preceding)
        return self.torch_process_logits(x, slots, grammar, drafts, num_preceding)

    def torch_process_logits(
        self,
        x: torch.Tensor,  # [rows, V] float32, a fresh copy: updated in place
        slots: torch.Tensor,  # [rows] int64, the slot of each row's request
        grammar: GrammarBitmask,
        drafts: torch.Tensor | None = None,  # [rows, S] int64 ids in [0, V)
        num_preceding: torch.Tensor | None = None,  # [rows] int64 in [0, S]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`process_logits` through the PyTorch stages, whatever the backend."""
        if (drafts is None) != (num_preceding is None):
            raise ValueError("drafts and num_preceding come together")
        # Processors find their rows through `batch_state.slots(n)`: bind this map.
        self.batch_state.bind_slots(slots)
        try:
            # Steps 2-3 are -inf masks and finite additive biases, which commute: the
            # sparse updates go first, in place on the fresh copy, then the dense masks.
            # Bad words' scatter_reduce_ (amin over duplicate tokens) falls back to aten in
            # inductor, which mutates a copy of its input: first, it mutates the fresh copy
            # itself; logit bias and min_tokens use index_put_, which inductor lowers in
            # place anywhere. (The Triton backend applies bad words first too.)
            x = self.bad_words.apply(x, slots, drafts, num_preceding)
            x = self.logit_bias.apply(x)
            x = self.min_tokens.apply(x, num_preceding)
            x = self.allowed.apply(x)
            x = grammar.apply(x)
            for proc in self.custom:
                if not proc.is_argmax_invariant():
                    x = proc.apply(x)
            if drafts is None or num_preceding is None:
                x = self.penalties.apply(x, slots)
            else:
                columns = torch.arange(drafts.shape[1], device=drafts.device)
                preceding = columns[None, :] < num_preceding[:, None]  # [rows, S]
                x = self.penalties.apply(x, slots, extra_tokens=drafts, extra_mask=preceding)

            greedy_tokens = x.argmax(dim=-1)  # [rows]; lowest index on ties
            temperature = self.sampling.temperature.device[slots]
            is_greedy = temperature < GREEDY_TEMPERATURE
            x = x / torch.where(is_greedy, 1.0, temperature)[:, None]
            x = self.min_p.apply(x)
            for proc in self.custom:
                if proc.is_argmax_invariant():
                    x = proc.apply(x)
            x = apply_top_k_top_p(
                x, self.sampling.top_k.device[slots], self.sampling.top_p.device[slots]
            )
        finally:
            self.batch_state.bind_slots(None)
        return x, greedy_tokens, is_greedy

    def commit_tokens(
        self,
        token_ids: torch.Tensor,
        num_tokens: torch.Tensor | None = None,
        commit_mask: torch.Tensor | None = None,
        *,
        validate: bool = False,
    ) -> None:
        """Graph-safe (unless `validate`): append tokens to the requests' device-side history.

        token_ids: [num_rows] (one token per row) or [num_rows, n] (up to n per row, e.g.
            accepted speculative tokens, committed in column order), int32/int64 on the
            sampler's device. An id outside [0, V) commits nothing: its row's history stays
            as it was for that token (no count, no bad-words entry, no position advance).
        num_tokens: [num_rows] int device tensor, how many of a row's n columns to commit
            (2-D only; default all n). Column j commits where j < num_tokens, so a negative
            count commits nothing and one above n commits all n.
        commit_mask: [num_rows] bool device tensor; rows with False commit nothing.
        validate: first read token_ids (and num_tokens) on the host and raise ValueError
            for an id outside [0, V) in a committed column, or a count outside [0, n] (a
            sync: eager only).
        """
        self._check_commit(token_ids, num_tokens, commit_mask)
        if validate:
            self._validate_commit(token_ids, num_tokens)
        if token_ids.dim() == 1:
            self.batch_state.commit(token_ids, commit_mask)
            return
        for j in range(token_ids.shape[1]):  # static n: unrolled into the graph
            keep = commit_mask
            if num_tokens is not None:
                column_kept = num_tokens > j
                keep = column_kept if keep is None else keep & column_kept
            self.batch_state.commit(token_ids[:, j], keep)

    def _logprobs(
        self, raw: torch.Tensor, processed: torch.Tensor, tokens: torch.Tensor
    ) -> LogprobsTensors:
        mode = self.config.logprobs_mode
        source = raw.to(torch.float32) if mode.startswith("raw") else processed
        k = self.config.max_num_logprobs
        # Top-K and the sampled value are taken on the logits, then shifted: log_softmax
        # only shifts a row, so the order is the same and no [num_rows, V] logprobs tensor
        # is written.
        top_values, top_ids = source.topk(k, dim=-1)  # [num_rows, K]
        sampled = source.gather(1, tokens[:, None])  # [num_rows, 1]
        values = torch.cat([sampled, top_values], dim=1)
        if mode.endswith("logprobs"):
            lse = source.logsumexp(dim=-1, keepdim=True)  # [num_rows, 1]
            # A row with every token masked has lse = -inf: keep its logprobs at -inf, not NaN.
            lse = torch.where(lse.isfinite(), lse, 0.0)
            values = values - lse
            # Ranks compare logprobs (as vLLM does): the shift can merge neighbouring logits.
            ranks = (source - lse >= values[:, :1]).sum(dim=-1)
        else:
            ranks = (source >= sampled).sum(dim=-1)  # [num_rows]
        return LogprobsTensors(
            torch.cat([tokens[:, None], top_ids], dim=1).to(torch.int32),
            values,
            ranks.to(torch.int32),
        )
