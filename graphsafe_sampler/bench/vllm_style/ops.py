"""vLLM V1's sampling ops as it writes them: penalties rebuilt from the host lists every
step, min_p through a softmax and a boolean mask, top-k/top-p through a full sort, the
exponential race with a generator loop over seeded requests, and logprobs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphsafe_sampler.output import LogprobsTensors


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
    output_tok_ids: Sequence[Sequence[int]],
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


def force_thinking_end(
    logits: torch.Tensor,  # [rows, V] float32, updated in place
    histories: list[list[int]],  # each request's prompt and output tokens (host)
    start: tuple[int, ...],
    end: tuple[int, ...],
    budget: int,
) -> torch.Tensor:
    """The host-side way of a thinking budget (vLLM V1's logits processors keep request
    state in Python): per request, find the latest start and end sequences in its token
    list; a request whose section has spent the budget gets every token but the next end
    token masked, through index tensors built on the host."""
    rows: list[int] = []
    forced: list[int] = []
    for row, tokens in enumerate(histories):
        n = len(tokens)
        began = max((i for i in range(n - len(start) + 1)
                     if tuple(tokens[i : i + len(start)]) == start), default=-1)  # fmt: skip
        ended = max((i for i in range(n - len(end) + 1)
                     if tuple(tokens[i : i + len(end)]) == end), default=-1)  # fmt: skip
        if began < 0 or began <= ended or n - (began + len(start)) < budget:
            continue
        done = max((p for p in range(1, len(end)) if tuple(tokens[n - p :]) == end[:p]),
                   default=0)  # fmt: skip
        rows.append(row)
        forced.append(end[done])
    if rows:
        index = torch.tensor(rows, device=logits.device)
        keep = logits[index, torch.tensor(forced, device=logits.device)]
        logits[index] = float("-inf")
        logits[index, torch.tensor(forced, device=logits.device)] = keep
    return logits
