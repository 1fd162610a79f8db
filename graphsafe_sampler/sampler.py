"""`Sampler`: the whole sampling step as one graph-safe `nn.Module`.

`update_state(batch_update)` is the host side: it validates the update whole, then writes
slot tables and flushes them (H2D copies, plus stream-ordered scatters for new requests'
count rows). `forward(logits)` is the device side: the stages in the order of
docs/design.md, branch-free on request state, with no host reads, through the pipeline of
the backend chosen at construction; by default it commits each row's token to the
request's device-side history (counts, generated-token count, bad-words window), inside the
graph.

Rows past the batch (padding) map to the padding slot: greedy, no filters, and they commit
nothing. A NaN row returns the index of its first NaN (argmax's choice); a row with every
token masked returns token 0. Both are valid ids in [0, V).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.batch_update import BatchUpdate
from graphsafe_sampler.config import SamplerConfig, resolve_backend
from graphsafe_sampler.output import SamplerOutput
from graphsafe_sampler.pipelines import Pipeline, make_pipeline
from graphsafe_sampler.stages import Stages
from graphsafe_sampler.vocab_shard import VocabShard

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
        self.batch_state = BatchState(config, self.device, shard=self._vocab_shard())
        self.stages = Stages.build(config, self.batch_state)
        self.pipeline = self._make_pipeline()
        self.graph_safe = all(p.graph_safe for p in self.stages.custom)
        self._ready = False

    def _vocab_shard(self) -> VocabShard:
        """The token ids whose logits `forward` takes (a tensor-parallel rank: its own)."""
        return VocabShard.whole(self.config.vocab_size)

    def _make_pipeline(self) -> Pipeline:
        return make_pipeline(self.backend, self.stages)

    # ----------------------------------------------------------------- host side

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Apply one step's batch changes: validated whole first, then host writes and H2D
        copies. A rejected update raises and changes nothing (host RNG included)."""
        custom = self.stages.custom
        if batch_update is not None:
            # Everything that can reject the update runs before anything changes.
            self.batch_state.validate(batch_update)
            for proc in custom:
                proc.validate_update(batch_update)
        self.batch_state.update(batch_update, validated=True)
        # Slot processors on the shared state were updated above (their update_state is a
        # no-op); row-indexed ones apply the update themselves.
        for proc in custom:
            proc.update_state(batch_update)
        self._ready = True

    def stage_grammar_bitmask(
        self, bitmask: torch.Tensor | np.ndarray | None, rows: Sequence[int] | None = None
    ) -> None:
        """Stage this step's structured-output bitmask (int32 [len(rows), ceil(V/32)], bit
        set = allowed, xgrammar's layout) for batch `rows`; other rows are unconstrained.
        A row's mask moves with its request and is cleared when the request leaves;
        otherwise it stays in force until the next call (`None` clears every row)."""
        self.stages.grammar.stage(bitmask, rows)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor kept across steps, by name (the graph-safety harness checks them)."""
        return self.stages.state_tensors()

    def _check_logits(self, logits: torch.Tensor) -> None:
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() != 2:
            raise ValueError(f"logits must be 2-D [num_rows, vocab_size], got {logits.dim()}-D")
        if logits.dtype not in _LOGITS_DTYPES:
            raise TypeError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
        self._check_device("logits", logits)
        rows, vocab = logits.shape
        columns, what = self._logits_columns()
        if vocab != columns:
            raise ValueError(f"logits have {vocab} columns, {what} is {columns}")
        self._check_rows("logits", rows)

    def _logits_columns(self) -> tuple[int, str]:
        """The width `forward` takes, and what it is (for the error message)."""
        return self.config.vocab_size, "vocab_size"

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
        k, mode = self.config.max_num_logprobs, self.config.logprobs_mode
        slots = self.batch_state.slots(num_rows)  # [num_rows] int64
        grammar = self.stages.grammar.bitmask_rows(num_rows)
        # the processed logprobs modes return the filtered logits: the mask must be written.
        # The pipeline reads the raw logits and processes them into a float32 buffer of its own
        # and the raw modes may take the raw logits' tile statistics from that one read
        raw_mode = k > 0 and mode.startswith("raw")
        processed = self.pipeline.process(
            logits,
            slots,
            grammar,
            write_mask=k > 0 and mode.startswith("processed"),
            raw_tiles=raw_mode,
        )
        # [num_rows] int32 or int64; the commit (which nothing below reads) at once, so that
        # a pipeline may make it in the kernel that makes the tokens
        if commit:
            tokens = self.pipeline.sample_and_commit(processed, slots, commit_mask)
        else:
            tokens = self.pipeline.sample(processed, slots)
        logprobs = None
        if k > 0:
            source = logits if raw_mode else processed.logits
            chosen = self.stages.logprob_token_ids
            logprobs = self.pipeline.logprobs(
                source,
                tokens,
                mode.endswith("logprobs"),
                processed.raw_tiles,
                None if chosen is None else chosen.ids(slots),
                # the sampled tokens' values in `source` (the raw modes'), where sampling
                # wrote them
                processed.sampled[1] if processed.sampled is not None else None,
            )
        return SamplerOutput(tokens.to(torch.int32)[:, None], logprobs)

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
