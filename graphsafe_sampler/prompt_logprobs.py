"""Prompt logprobs: for each of N prompt positions, the logprob of the prompt token that
follows it, the top K and that token's rank (vLLM's `prompt_logprobs`; its model runner V2
takes them chunk by chunk in `sample/prompt_logprob.py`), graph-safe for a fixed N. The
caller hands the logits over (vLLM also runs the LM head chunk by chunk).

Why chunks: a prefill can hold thousands of positions, and converting all their logits to
float32 at once would take [N, V] float32 (5.0 GB at N = 8,192, V = 151,936). Each chunk
of `chunk_size` rows is converted and reduced on its own, so about one [chunk_size, V]
float32 copy (and the few same-size temporaries of `compute_logprobs`) lives at a time.
The loop over chunks is a static Python loop: N and chunk_size are host facts, so a
compiled or captured graph holds a fixed sequence of chunks, and no value is read back.

Why only the raw modes: prompt positions are not sampled, so no penalty, temperature or
filter is applied to them; "processed" has no meaning here and is refused.

Values come from the step's own logprobs stage (`compute_logprobs`, `requested_logprobs`,
`row_logsumexp`): a prompt position's values are computed as a sampled position's are in
the same raw mode on the PyTorch backend. Ids are device values, so they are never checked
on the host: a next-token or requested id outside [0, V) reads as logprob -inf with rank 0
(as a -1 column does), instead of indexing out of bounds; the ids are returned as given.
"""

from __future__ import annotations

from typing import Literal

import torch

from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.stages.logprobs import (
    compute_logprobs,
    requested_logprobs,
    row_logsumexp,
)

PromptLogprobsMode = Literal["raw_logprobs", "raw_logits"]
PROMPT_LOGPROBS_MODES: tuple[str, ...] = ("raw_logprobs", "raw_logits")

_LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)


def compute_prompt_logprobs(
    logits: torch.Tensor,  # [N, V] float32/float16/bfloat16
    next_token_ids: torch.Tensor,  # [N] int32/int64: the prompt token after each position
    num_logprobs: int,  # K >= 0
    *,
    logprob_token_ids: torch.Tensor | None = None,  # [C] or [N, C] int ids, -1 unused
    logprobs_mode: PromptLogprobsMode = "raw_logprobs",
    chunk_size: int = 1024,
) -> LogprobsTensors:
    """The logprobs of N prompt positions, `chunk_size` rows at a time.

    Returns `LogprobsTensors` with
    - logprob_token_ids [N, K + 1] int32: column 0 the next prompt token, columns 1..K the
      top K in descending order (ties among them in no set order);
    - logprobs [N, K + 1] float32: log_softmax values ("raw_logprobs") or the logits
      themselves ("raw_logits"); a row with every logit -inf gives -inf, never NaN;
    - selected_token_ranks [N] int32: 1-based, the number of tokens whose value is >= the
      next token's (compared in the returned space: the logsumexp shift can merge
      neighbouring logits);
    - requested_token_ids / requested_logprobs / requested_ranks [N, C] (int32, float32,
      int32) for `logprob_token_ids` (a [C] tensor applies to every row): the ids as given,
      their values and ranks; -inf and 0 at -1 columns. None when it is None.

    An id outside [0, V) (next token or requested) reads as -inf with rank 0.
    Host facts only are checked (types, shapes, dtypes, devices, K, chunk_size): ValueError
    or TypeError naming the argument.
    """
    _check_arguments(
        logits, next_token_ids, num_logprobs, logprob_token_ids, logprobs_mode, chunk_size
    )
    num_rows, vocab_size = logits.shape
    subtract_lse = logprobs_mode == "raw_logprobs"

    # Ids made safe to gather with; the rows they came from are marked to read -inf / 0.
    tokens = next_token_ids.to(torch.int64)  # [N]
    valid = (tokens >= 0) & (tokens < vocab_size)  # [N] bool
    tokens = torch.where(valid, tokens, 0)
    requested = None
    if logprob_token_ids is not None:
        ids = logprob_token_ids.to(torch.int64).expand(num_rows, -1)  # [N, C]
        requested = torch.where(ids < vocab_size, ids, -1)  # past V: an unused column

    parts: list[LogprobsTensors] = []
    for start in range(0, num_rows, chunk_size):  # static: N and chunk_size are host facts
        stop = min(start + chunk_size, num_rows)
        source = logits[start:stop].to(torch.float32).contiguous()  # [n, V] float32
        chunk_requested = None if requested is None else requested[start:stop]  # [n, C]
        parts.append(
            _chunk_logprobs(source, tokens[start:stop], num_logprobs, subtract_lse, chunk_requested)
        )

    token_ids = torch.cat([part.logprob_token_ids for part in parts])  # [N, K + 1]
    values = torch.cat([part.logprobs for part in parts])  # [N, K + 1]
    ranks = torch.cat([part.selected_token_ranks for part in parts])  # [N]
    # column 0 shows the id given, with -inf and rank 0 where it is outside [0, V)
    token_ids[:, 0] = next_token_ids.to(torch.int32)
    values[:, 0] = torch.where(valid, values[:, 0], float("-inf"))
    ranks = torch.where(valid, ranks, 0)

    if logprob_token_ids is None:
        return LogprobsTensors(token_ids, values, ranks)
    chosen_values = torch.cat([_present(part.requested_logprobs) for part in parts])  # [N, C]
    chosen_ranks = torch.cat([_present(part.requested_ranks) for part in parts])  # [N, C]
    chosen_ids = logprob_token_ids.expand(num_rows, -1).to(
        torch.int32, memory_format=torch.contiguous_format, copy=True
    )  # [N, C]: as given, never an alias of the caller's tensor
    return LogprobsTensors(token_ids, values, ranks, chosen_ids, chosen_values, chosen_ranks)


def _chunk_logprobs(
    source: torch.Tensor,  # [n, V] float32
    tokens: torch.Tensor,  # [n] int64, inside [0, V)
    k: int,  # K >= 0
    subtract_lse: bool,  # raw_logprobs (else raw_logits)
    requested: torch.Tensor | None,  # [n, C] int64, -1 unused, < V
) -> LogprobsTensors:
    """One chunk's logprobs, as `compute_logprobs` gives them (which needs K >= 1)."""
    if k >= 1:
        return compute_logprobs(source, tokens, k, subtract_lse, requested)
    # K = 0: column 0 and the rank alone, computed as compute_logprobs computes them, so
    # that they are bit-identical to its column 0 at any K.
    value = source.gather(1, tokens[:, None])  # [n, 1]
    lse = None
    if subtract_lse:
        lse = row_logsumexp(source)  # [n, 1]
        lse = torch.where(lse.isfinite(), lse, 0.0)
        value = value - lse
        ranks = (source - lse >= value).sum(dim=-1)  # [n]
    else:
        ranks = (source >= value).sum(dim=-1)  # [n]
    chosen: tuple[torch.Tensor | None, ...] = (None, None, None)
    if requested is not None:
        chosen = (requested.to(torch.int32), *requested_logprobs(source, requested, lse))
    return LogprobsTensors(tokens[:, None].to(torch.int32), value, ranks.to(torch.int32), *chosen)


def _present(tensor: torch.Tensor | None) -> torch.Tensor:
    """A field that is set whenever requested ids were passed."""
    assert tensor is not None
    return tensor


def _check_arguments(
    logits: object,
    next_token_ids: object,
    num_logprobs: object,
    logprob_token_ids: object,
    logprobs_mode: object,
    chunk_size: object,
) -> None:
    """Raise ValueError/TypeError naming the first bad argument (host facts only)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [num_positions, vocab_size], got {logits.dim()}-D")
    if logits.dtype not in _LOGITS_DTYPES:
        raise TypeError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
    num_rows, vocab_size = logits.shape
    if num_rows < 1:
        raise ValueError("logits must have at least 1 row (prompt position), got 0")
    if not 1 <= vocab_size < 2**31:
        raise ValueError(f"logits must have 1 to 2**31 - 1 columns (vocab_size), got {vocab_size}")

    if not isinstance(next_token_ids, torch.Tensor):
        raise TypeError(
            f"next_token_ids must be a torch.Tensor, got {type(next_token_ids).__name__}"
        )
    if next_token_ids.dtype not in _INDEX_DTYPES:
        raise TypeError(f"next_token_ids must be int32 or int64, got {next_token_ids.dtype}")
    if tuple(next_token_ids.shape) != (num_rows,):
        raise ValueError(
            f"next_token_ids must have shape [{num_rows}] (one per logits row), "
            f"got {list(next_token_ids.shape)}"
        )
    _check_device("next_token_ids", next_token_ids, logits)

    if isinstance(num_logprobs, bool) or not isinstance(num_logprobs, int):
        raise TypeError(f"num_logprobs must be an int, got {type(num_logprobs).__name__}")
    if not 0 <= num_logprobs <= vocab_size:
        raise ValueError(
            f"num_logprobs must be in [0, vocab_size = {vocab_size}], got {num_logprobs}"
        )

    if logprob_token_ids is not None:
        if not isinstance(logprob_token_ids, torch.Tensor):
            raise TypeError(
                "logprob_token_ids must be a torch.Tensor or None, "
                f"got {type(logprob_token_ids).__name__}"
            )
        if logprob_token_ids.dtype not in _INDEX_DTYPES:
            raise TypeError(
                f"logprob_token_ids must be int32 or int64, got {logprob_token_ids.dtype}"
            )
        if logprob_token_ids.dim() not in (1, 2):
            raise ValueError(
                "logprob_token_ids must be [C] or [num_positions, C], "
                f"got {logprob_token_ids.dim()}-D"
            )
        if logprob_token_ids.dim() == 2 and logprob_token_ids.shape[0] != num_rows:
            raise ValueError(
                f"logprob_token_ids must have {num_rows} rows (one per logits row), "
                f"got shape {list(logprob_token_ids.shape)}"
            )
        if logprob_token_ids.shape[-1] < 1:
            raise ValueError(
                "logprob_token_ids must have at least 1 column (pass None for none), "
                f"got shape {list(logprob_token_ids.shape)}"
            )
        _check_device("logprob_token_ids", logprob_token_ids, logits)

    if logprobs_mode not in PROMPT_LOGPROBS_MODES:
        raise ValueError(
            f"logprobs_mode must be one of {PROMPT_LOGPROBS_MODES} (prompt positions are "
            f"not processed), got {logprobs_mode!r}"
        )

    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def _check_device(name: str, tensor: torch.Tensor, logits: torch.Tensor) -> None:
    if tensor.device != logits.device:
        raise ValueError(f"{name} is on {tensor.device}, logits on {logits.device}")
