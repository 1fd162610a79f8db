"""kernels/processed_rows.py's division of processing's pre-temperature tile maxima on read
(docs/kernels.md, the temperature on read), against float32 IEEE division; the readers'
logits and tokens through it are tested with each reader (test_kernel_pipeline.py,
test_kernel_sampling.py, test_sampler.py)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from graphsafe_sampler.kernels.library import hoisted_reciprocal
from graphsafe_sampler.kernels.processed_rows import processed_bounds, processed_upper_bound


def _gen() -> torch.Generator:
    seed = torch.seed() % 2**31
    print(f"generator seed {seed}")  # shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


@triton.jit
def _bounds_kernel(t_ptr, divisors_ptr, out_ptr, n, BLOCK: tl.constexpr, FORM: tl.constexpr):
    """Program r divides the entries t[0:n] by divisors[r]: FORM 0 `processed_bounds`, 1
    `processed_upper_bound` (a scalar at a time, as a walk's)."""
    r = tl.program_id(0)
    divisor = tl.load(divisors_ptr + r)
    reciprocal, fast = hoisted_reciprocal(divisor)
    cols = tl.arange(0, BLOCK)
    t = tl.load(t_ptr + cols, mask=cols < n, other=0.0)
    if FORM == 1:
        for i in range(0, n):
            top = processed_upper_bound(tl.load(t_ptr + i), divisor, reciprocal, fast)
            tl.store(out_ptr + r * n + i, top)
    else:
        bounds = processed_bounds(t, divisor, reciprocal, fast)
        tl.store(out_ptr + r * n + cols, bounds, mask=cols < n)


@pytest.mark.parametrize("form", [0, 1], ids=["bounds", "upper"])
def test_pre_temperature_maxima_divided_as_bounds(form: int, kernel_device: torch.device) -> None:
    """The readers' division of processing's pre-temperature tile maxima (the temperature
    on read), against float32 IEEE division: `processed_bounds` is the quotient exactly
    wherever the fast division vouches for it (|t| in [2**-100, 2**104], the divisor in
    [2**-20, 2**20]) and +inf (unknown) elsewhere, ±inf as they are;
    `processed_upper_bound` is never below the quotient and within 2**-18 of it above, +inf
    (but -inf) where the divisor is out of range. A divisor of 0 (no DEFER) or 1 leaves t as it is.
    Fresh LLM-like values and the edges: zeros, subnormal, tiny and huge magnitudes."""
    gen = _gen()
    t = torch.cat([
        torch.randn(200, generator=gen) * 6,
        torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e-35, -3e-33, 2e31, -5e32, 3e38, -3e38]),
        torch.tensor([float("inf"), float("-inf")]),
    ])  # fmt: skip
    divisors = torch.tensor([0.7, 1.3, 0.2, 1.7e-3, 5e-7, 3e6, 1.0, 0.0])  # 5e-7, 3e6: outside
    out = torch.full((divisors.shape[0], t.shape[0]), -7.0)
    moved = [x.to(kernel_device) for x in (t, divisors, out)]
    _bounds_kernel[(divisors.shape[0],)](*moved, t.shape[0], BLOCK=256, FORM=form)
    got = moved[2].cpu()
    for r, d in enumerate(divisors.tolist()):
        if d in (0.0, 1.0):
            assert torch.equal(got[r], t), d
            continue
        want = t / d  # float32, rounded as IEEE division
        in_range = 2.0**-20 <= d <= 2.0**20
        assert bool((got[r] >= want).all()), d  # every entry an upper bound
        assert torch.equal(got[r][t.isinf()], want[t.isinf()]), d  # ±inf stay
        finite = torch.isfinite(got[r]) & torch.isfinite(want)
        if form == 1:
            # (finite, but for a quotient at float32's edge, whose bound may round to inf)
            assert not in_range or bool(finite[want.abs() < 1e38].all()), d
            assert in_range or bool((got[r][t != float("-inf")] == float("inf")).all()), d
            slack = (got[r] - want)[finite].double()
            assert bool((slack <= want[finite].double().abs() * 2.0**-18 + 2.0**-149).all()), d
        else:
            vouched = (t.abs() >= 2.0**-100) & (t.abs() <= 2.0**104) | (t == 0.0)
            vouched &= torch.tensor(in_range)
            assert torch.equal(got[r][vouched], want[vouched]), d
            assert bool((got[r][~vouched & t.isfinite()] == float("inf")).all()), d
