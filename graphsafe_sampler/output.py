"""What `Sampler.forward` returns. NamedTuples, so torch.compile and pytree see through them."""

from __future__ import annotations

from typing import NamedTuple

import torch


class LogprobsTensors(NamedTuple):
    """Per-row logprobs (docs/design.md §4, step 10); K = SamplerConfig.max_num_logprobs.

    logprob_token_ids: [num_rows, K + 1] int32; column 0 is the sampled token, columns
        1..K the top-K tokens in descending order.
    logprobs: [num_rows, K + 1] float32, matching logprob_token_ids (raw or processed per
        logprobs_mode; logits instead of logprobs in the *_logits modes).
    selected_token_ranks: [num_rows] int32, 1-based rank of the sampled token: the number of
        tokens whose value is >= the sampled token's.
    requested_token_ids: [num_rows, C] int32 or None: chosen ids in the order given, -1 past
        a row's own (from `Sampler.forward`: each row's `SamplingParams.logprob_token_ids`, C
        = SamplerConfig.max_logprob_token_ids, None when that is 0).
    requested_logprobs: [num_rows, C] float32 or None: their values, as `logprobs` (-inf at
        -1 columns).
    requested_ranks: [num_rows, C] int32 or None: their 1-based ranks, as
        `selected_token_ranks` (0 at -1 columns).
    """

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor
    requested_token_ids: torch.Tensor | None = None
    requested_logprobs: torch.Tensor | None = None
    requested_ranks: torch.Tensor | None = None


class SamplerOutput(NamedTuple):
    """sampled_token_ids: [num_rows, 1] int32; logprobs_tensors: None when
    max_num_logprobs == 0."""

    sampled_token_ids: torch.Tensor
    logprobs_tensors: LogprobsTensors | None


class RejectionSamplerOutput(NamedTuple):
    """What `RejectionSampler.forward` returns; S = max_spec_len.

    output_token_ids: [num_rows, S + 1] int32: a row's accepted drafts, then the token it
        emits (the target's token at the first rejection, or the bonus token when every
        draft was accepted), then -1 in the remaining columns.
    num_accepted: [num_rows] int32, accepted drafts per row; the row produced
        num_accepted + 1 tokens, the last at column num_accepted.
    """

    output_token_ids: torch.Tensor
    num_accepted: torch.Tensor
