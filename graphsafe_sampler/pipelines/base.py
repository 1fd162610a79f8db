"""The pipeline protocol: what `Sampler.forward` and `RejectionSampler.forward` call, in
order. Two siblings implement it on the same `Stages`: `TorchPipeline` (PyTorch ops) and
`TritonPipeline` (the kernels of kernels/). Neither holds a sampler; the backend is chosen
once, when the sampler is built (`make_pipeline`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.stages import Stages


@dataclass(frozen=True)
class Processed:
    """Processed logits and what sampling needs of them.

    logits: [num_rows, V] float32, after temperature, min_p and top-k/top-p; the top-k/top-p
        mask is written unless `cut` holds it.
    cut: [num_rows] float32 or None: tokens below it are masked, though still in `logits`
        (the Triton pipeline samples with the cut rather than write the mask).
    greedy: [num_rows] int64, each row's argmax before temperature (read for greedy rows),
        or None where the pipeline's `sample` finds it itself: a greedy row keeps its
        logits through temperature, and min_p and top-k/top-p keep its maximum, so its
        argmax is the same after them (`greedy_tokens`).
    is_greedy: [num_rows] bool, or None where the pipeline's `sample` reads each row's
        temperature itself (`stages.temperature.is_greedy(slots)` gives it).
    tile_max: [num_rows, ceil(V / 1024)] float32 or None: an upper bound of each 1,024-token
        tile of `logits` (the Triton pipeline's, from processing), with which sampling skips
        the tiles below the cut unread.
    raw_tiles: [num_rows, ceil(V / 1024), 2] float32 or None: each tile of the *raw* logits'
        max (+inf where it holds NaN) and sum of exp against it, where `process` was asked
        for them (`raw_tiles=True`) and makes them (the Triton pipeline, from its one read
        of the raw logits): logprobs in the raw modes take the logsumexp from them and read
        only the tiles that can matter.
    candidate_ids: [num_rows, n] int64 or None: each row's largest logits before the
        top-k/top-p mask (the PyTorch pipeline's, from top-k/top-p), and
    covered: [num_rows] bool or None: the rows whose kept tokens are all candidates, which
        a race among the candidates samples (`SamplingState.race_covered`).
    buffer: (covered [num_rows] int32, lists [num_rows, ...] float32, ids the same int32) or
        None: the Triton pipeline's top-k/top-p stage 1 lists of each row's largest logits
        with their token ids, and 1 for each row whose kept tokens are all in them, which
        its sampling kernel races over the lists without reading the row.
    remake: (fn, operands) or None: fn(*operands) equals `logits`, and fn of some rows of
        every operand equals those rows of it (the PyTorch pipeline's, compiled): sampling
        recomputes the logits from it, so that, where nothing else reads `logits`, the
        compiled step never writes them.
    source, deferred: [num_rows, V] float32 and [num_rows] float32, or None: where
        nothing else reads `logits` (no mask written), the Triton pipeline's kernels after
        processing apply the temperature as they read: the processed row r is its row of
        `source` (the raw logits) divided by deferred[r] where deferred[r] > 0 (rows that
        only a temperature changes, or none, left unwritten in `logits`), else its row of
        `logits` divided by -deferred[r] (written without the temperature), and so are its
        tile maxima (`tile_max`).
    records: (filters [num_rows, 4] float32, keys [num_rows, 2] int64) or None: each row's
        temperature, seed and position as the Triton pipeline's processing resolved them
        from the slot tables (kernels/row_params.py), which its sampling kernel reads by
        row instead.
    sampled: (source [num_rows, V], values [num_rows] float32) or None: where the Triton
        pipeline's sampling writes each row's token's value in `source` (the raw logits, in
        the raw logprobs modes) into `values`, for its logprobs kernel to read with its first
        loads (pass `values` as `logprobs(sampled=...)`).
    """

    logits: torch.Tensor
    cut: torch.Tensor | None
    greedy: torch.Tensor | None
    is_greedy: torch.Tensor | None
    tile_max: torch.Tensor | None = None
    raw_tiles: torch.Tensor | None = None
    candidate_ids: torch.Tensor | None = None
    covered: torch.Tensor | None = None
    buffer: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    remake: tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]] | None = None
    source: torch.Tensor | None = None
    deferred: torch.Tensor | None = None
    records: tuple[torch.Tensor, torch.Tensor] | None = None
    sampled: tuple[torch.Tensor, torch.Tensor] | None = None

    def greedy_tokens(self) -> torch.Tensor:
        """[num_rows] int64, each row's greedy token (an argmax pass where not at hand)."""
        if self.greedy is not None:
            return self.greedy
        if self.cut is not None:
            raise ValueError("greedy tokens of unmasked logits: process with write_mask=True")
        return self.logits.argmax(dim=-1)


class Pipeline(Protocol):
    """The sampling step's device side; every method is graph-safe."""

    stages: Stages

    def process(
        self,
        logits: torch.Tensor,  # [num_rows, V] float32/16, bfloat16: the raw logits, read only
        slots: torch.Tensor,  # [num_rows] int64, the slot of each row's request
        grammar: torch.Tensor,  # [num_rows, ceil(V/32)] int32, each row's bitmask
        drafts: torch.Tensor | None = None,  # [num_rows, S] int64 ids in [0, V)
        num_preceding: torch.Tensor | None = None,  # [num_rows] int64 in [0, S]
        *,
        write_mask: bool = True,
        raw_tiles: bool = False,
    ) -> Processed:
        """Steps 2-8 on rows that read their request state from `slots`. With `drafts`, the
        first `num_preceding[r]` of row r's drafts precede it in the step and count as output
        tokens (penalties, bad words, min_tokens). `write_mask=False` lets a pipeline keep the
        top-k/top-p mask as `Processed.cut` instead of writing it; `raw_tiles=True` lets it
        return the raw logits' tile statistics as `Processed.raw_tiles` (for `logprobs`)."""
        ...

    def sample(self, processed: Processed, slots: torch.Tensor) -> torch.Tensor:
        """[num_rows] int32 or int64 token ids: greedy rows their argmax, random rows the
        race on the SALT_SAMPLE stream at their positions."""
        ...

    def sample_and_commit(
        self, processed: Processed, slots: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        """`sample`, then each batch row's token appended to its request's history (as
        `BatchState.commit`; keep [num_rows] bool, or None: every row): a pipeline may make
        both in one pass (the Triton one commits in the kernel that makes each token)."""
        ...

    def race_emitted(
        self,
        bonus_scores: torch.Tensor,  # [num_rows, V] float32 log-weights (-inf = never)
        recovered_scores: torch.Tensor,  # [num_rows, V] float32 log-weights
        is_bonus: torch.Tensor,  # [num_rows] bool: which of the two each row emits
        slots: torch.Tensor,  # [num_rows] int64
        positions: torch.Tensor,  # [num_rows] int64, the emitted token's position
    ) -> torch.Tensor:
        """Speculative decoding's emitted token: [num_rows] int64, a draw from
        softmax(bonus_scores) on the SALT_BONUS stream where `is_bonus`, else from
        softmax(recovered_scores) on SALT_RECOVER, for every row (the caller replaces greedy
        rows' tokens)."""
        ...

    def logprobs(
        self,
        source: torch.Tensor,
        tokens: torch.Tensor,
        subtract_lse: bool,
        raw_tiles: torch.Tensor | None = None,
        requested: torch.Tensor | None = None,
        sampled: torch.Tensor | None = None,
    ) -> LogprobsTensors:
        """Step 10 on source [num_rows, V] (raw or processed logits) for tokens [num_rows]
        int32 or int64; raw_tiles: `Processed.raw_tiles` where `source` is the raw logits
        they were made from, else None; requested: [num_rows, C] int64 chosen token ids (-1
        unused), whose values and ranks fill the `requested_*` fields, or None; sampled:
        [num_rows] float32, source[r, tokens[r]] as `Processed.sampled` holds it, or None."""
        ...
