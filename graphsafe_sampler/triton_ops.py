"""The Triton kernels as `torch.library` custom ops, so `torch.compile(fullgraph=True)` and
CUDA graphs see one opaque, in-place op per kernel on any device.

`custom_op` (not `triton_op`) is the registration that also works on CPU tensors under
`TRITON_INTERPRET=1` when compiled (inductor would otherwise trace into the kernel). Each
op's fake implementation allocates nothing: the kernels work in place. Kernels are imported
inside the ops, so importing this module does not import Triton.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("graphsafe_sampler::apply_min_p", mutates_args=("logits",))
def apply_min_p(logits: torch.Tensor, slots: torch.Tensor, min_p: torch.Tensor) -> None:
    """logits [num_rows, V] float32 (in place); slots [num_rows] int64; min_p [num_slots]
    float32. Tokens below max_logit + ln(min_p) become -inf."""
    from graphsafe_sampler.kernels.min_p import apply_min_p as launch

    if logits.dtype != torch.float32:
        raise TypeError(f"logits must be float32, got {logits.dtype}")
    if logits.stride(-1) != 1:
        raise ValueError("logits rows must be contiguous (stride 1 along the vocabulary)")
    launch(logits, slots, min_p)


@apply_min_p.register_fake
def _(logits: torch.Tensor, slots: torch.Tensor, min_p: torch.Tensor) -> None:
    return None
