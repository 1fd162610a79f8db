"""The min_p Triton kernel (on `kernel_device`: interpreted on CPU, compiled on CUDA) against
the PyTorch backend."""

from __future__ import annotations

import pytest
import torch

from graphsafe_sampler.kernels.min_p import apply_min_p
from graphsafe_sampler.stages.min_p import min_p_threshold


def _reference(logits: torch.Tensor, slots: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    threshold = min_p_threshold(logits, min_p[slots])
    return logits.masked_fill(logits < threshold, float("-inf"))


@pytest.mark.parametrize(
    ("rows", "vocab"),
    [pytest.param(1, 111, id="R1-V111"), pytest.param(3, 1023, id="R3-V1023"),
     pytest.param(17, 4099, id="R17-V4099")],
)  # fmt: skip
def test_matches_torch_backend(rows: int, vocab: int, kernel_device: torch.device) -> None:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    min_p = torch.rand(rows + 1, generator=gen) * 0.3
    min_p[0] = 0.0  # off
    slots = torch.randperm(rows + 1, generator=gen)[:rows]
    logits, min_p, slots = (t.to(kernel_device) for t in (logits, min_p, slots))
    got = logits.clone()
    apply_min_p(got, slots, min_p)
    want = _reference(logits, slots, min_p)
    # Bit-exact, except a logit within rounding of the cut: the interpreter's log (numpy)
    # and torch's may differ in the last bit.
    differ = torch.isinf(got) != torch.isinf(want)
    threshold = min_p_threshold(logits, min_p[slots]).expand_as(logits)
    near = (logits - threshold).abs() <= 1e-5 * threshold.abs().clamp(min=1.0)
    assert bool((~differ | near).all())
    same = ~differ
    assert torch.equal(got[same], want[same])


def test_edge_rows(kernel_device: torch.device) -> None:
    logits = torch.randn(4, 300)
    logits[0] = float("-inf")
    logits[0, 17] = 2.0  # all -inf but one
    logits[1, :5] = 1e9  # huge logits
    logits[2] = -1e9
    logits = logits.to(kernel_device)
    slots = torch.arange(4, device=kernel_device)
    min_p = torch.tensor([0.5, 0.5, 1.0, 0.0, 0.0], device=kernel_device)
    got = logits.clone()
    apply_min_p(got, slots, min_p)
    assert torch.equal(got, _reference(logits, slots, min_p))
    assert torch.isfinite(got[0]).sum() == 1 and torch.isfinite(got[1]).sum() == 5


def test_non_contiguous_row_stride(kernel_device: torch.device) -> None:
    base = torch.randn(6, 257).to(kernel_device)
    before = base.clone()
    logits = base[::2, :200]  # row stride 514, not the vocabulary size
    slots = torch.tensor([0, 1, 2], device=kernel_device)
    min_p = torch.tensor([0.2, 0.05, 0.5, 0.0], device=kernel_device)
    want = _reference(logits, slots, min_p)
    apply_min_p(logits, slots, min_p)
    assert torch.equal(logits, want)
    # Odd rows and the columns past the view are outside it: not one element may change.
    assert torch.equal(base[1::2], before[1::2])
    assert torch.equal(base[::2, 200:], before[::2, 200:])


def test_opcheck_and_compile(kernel_device: torch.device) -> None:
    logits = torch.randn(3, 129).to(kernel_device)
    slots = torch.tensor([2, 0, 1], device=kernel_device)
    min_p = torch.tensor([0.1, 0.0, 0.4, 0.0], device=kernel_device)
    torch.library.opcheck(apply_min_p, (logits.clone(), slots, min_p))

    def step(x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        apply_min_p(x, slots, min_p)
        return x

    # aot_eager: the fake and functionalization; tests/test_kernel_pipeline.py runs the ops
    # through inductor
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(logits), _reference(logits, slots, min_p))


def test_rejects_wrong_dtype(kernel_device: torch.device) -> None:
    with pytest.raises(TypeError, match=r"logits must be float32, got torch\.float16"):
        apply_min_p(
            torch.randn(2, 8).half().to(kernel_device),
            torch.tensor([0, 1], device=kernel_device),
            torch.zeros(3, device=kernel_device),
        )


def test_nan_rows_match_torch(kernel_device: torch.device) -> None:
    logits = torch.randn(2, 70)
    logits[0, 33] = float("nan")
    logits = logits.to(kernel_device)
    slots = torch.tensor([0, 1], device=kernel_device)
    min_p = torch.tensor([0.3, 0.3, 0.0], device=kernel_device)
    got = logits.clone()
    apply_min_p(got, slots, min_p)
    torch.testing.assert_close(got, _reference(logits, slots, min_p), equal_nan=True)
