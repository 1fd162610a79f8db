"""The vLLM-V1-style eager peers of the benchmarks (docs/design.md §6): `VllmStyleSampler`
(sampler.py) and `VllmStyleRejectionSampler` (rejection.py), on vLLM's processors
(processors.py) and ops (ops.py).

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

from graphsafe_sampler.bench.vllm_style.ops import (
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    force_thinking_end,
    gather_logprobs,
    padded_tokens,
    random_sample,
)
from graphsafe_sampler.bench.vllm_style.rejection import VllmStyleRejectionSampler
from graphsafe_sampler.bench.vllm_style.sampler import VllmStyleSampler

__all__ = [
    "VllmStyleRejectionSampler",
    "VllmStyleSampler",
    "apply_min_p",
    "apply_penalties",
    "apply_top_k_top_p",
    "force_thinking_end",
    "gather_logprobs",
    "padded_tokens",
    "random_sample",
]
