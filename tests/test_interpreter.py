"""The interpreter's speed-ups (conftest.py installs them with `speed_up_interpreter`).
`share_interpreter_patches`: a launch patches `triton.language` once, its helpers' calls do
not patch it again, and the values and the restored language are what Triton's interpreter
gives. `scan_in_log_steps`: the kernels' scans give what Triton's element-by-element scan
gives. `skip_unasserted_overflow_checks`: the checks it drops were never asserted, and the
values stay. `cache_numpy_dtypes`: the map it memoizes is Triton's."""

from __future__ import annotations

import dataclasses
import inspect
import os
import random

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from graphsafe_sampler.kernels.bad_words import _segment_min
from graphsafe_sampler.kernels.top_k_top_p import _minimum
from graphsafe_sampler.testing import (
    cache_numpy_dtypes,
    scan_in_log_steps,
    share_interpreter_patches,
    skip_unasserted_overflow_checks,
    speed_up_interpreter,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton interpreter is off"
)


@triton.jit
def _shift(x, by):
    return x + by


@triton.jit
def _calls_helpers(x_ptr, out_ptr, CALLS: tl.constexpr):
    # CALLS calls of a helper of this module and of two of Triton's own (tl.max, tl.sum)
    lanes = tl.arange(0, 16)
    x = tl.load(x_ptr + lanes)
    acc = tl.zeros([16], dtype=tl.float32)
    for i in tl.static_range(CALLS):
        acc = _shift(acc, tl.max(x, 0) - tl.sum(x, 0) * 0.0 + i)
    tl.store(out_ptr + lanes, acc)


def _patches_in_one_launch(monkeypatch: pytest.MonkeyPatch, calls: int) -> int:
    """How many times `inspect.getmembers` ran during one launch of `_calls_helpers`: the
    interpreter patches a module or class with it."""
    seen = [0]
    getmembers = inspect.getmembers

    def counted(*args: object, **kwargs: object) -> object:
        seen[0] += 1
        return getmembers(*args, **kwargs)  # type: ignore[arg-type]

    x = torch.randn(16, generator=torch.Generator().manual_seed(calls))
    out = torch.empty(16)
    monkeypatch.setattr(inspect, "getmembers", counted)
    _calls_helpers[(2,)](x, out, CALLS=calls)
    monkeypatch.undo()
    expected = x.max().item() * calls + sum(range(calls))
    np.testing.assert_allclose(out.numpy(), np.full(16, expected), rtol=1e-6)
    return seen[0]


def test_a_launch_patches_once_however_many_helper_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    _patches_in_one_launch(monkeypatch, 1)  # the first launch of a process patches less
    few, many = (_patches_in_one_launch(monkeypatch, calls) for calls in (1, 6))
    # Triton alone patches again on each of the 6 * 4 helper calls (tl.zeros too) of each
    # of the 2 programs, 3-4 modules and classes each time
    assert few == many
    assert 0 < many < 12


def _language() -> tuple[dict[str, object], dict[str, object]]:
    return {name: getattr(tl, name) for name in dir(tl)}, dict(vars(tl.tensor))


def test_the_language_is_restored_after_a_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    _patches_in_one_launch(monkeypatch, 2)
    module, tensor = _language()
    _patches_in_one_launch(monkeypatch, 3)
    assert _language() == (module, tensor)
    assert tl.core.is_builtin(tl.where) and tl.core.is_builtin(tl.tensor.__add__)


def test_installing_twice_changes_nothing() -> None:
    from triton.runtime import interpreter

    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    assert share_interpreter_patches()
    assert (interpreter._patch_lang, interpreter.GridExecutor.__call__) == (patch_lang, launch)
    assert getattr(patch_lang, "shares_patches", False)


# --- scan_in_log_steps --------------------------------------------------------------------


@pytest.fixture
def gen() -> torch.Generator:
    seed = random.randrange(2**31)
    print(f"seed={seed}")  # shown by pytest when the test fails
    return torch.Generator().manual_seed(seed)


@triton.jit
def _scans(word_ptr, vote_ptr, x_ptr, matched_ptr, least_ptr, AXIS: tl.constexpr):
    # [4, 64] blocks: bad words' segmented minimum along AXIS, top-p's reverse running minimum
    rows = tl.arange(0, 4)[:, None]
    columns = tl.arange(0, 64)[None, :]
    at = rows * 64 + columns
    word, vote, x = tl.load(word_ptr + at), tl.load(vote_ptr + at), tl.load(x_ptr + at)
    _, matched = tl.associative_scan((word, vote), AXIS, _segment_min)
    least = tl.associative_scan(x, AXIS, _minimum, reverse=True)
    tl.store(matched_ptr + at, matched)
    tl.store(least_ptr + at, least)


def _run_scans(gen: torch.Generator, axis: int) -> tuple[torch.Tensor, ...]:
    word = torch.randint(0, 6, (4, 64), generator=gen, dtype=torch.int32).sort(axis).values
    vote = torch.randint(0, 2, (4, 64), generator=gen, dtype=torch.int32)
    x = torch.randn(4, 64, generator=gen)
    x[1, 7], x[2, 40] = float("nan"), float("inf")
    matched, least = torch.empty_like(vote), torch.empty_like(x)
    _scans[(1,)](word, vote, x, matched, least, AXIS=axis)
    return word, vote, x, matched, least


@pytest.mark.parametrize("axis", [0, 1])
def test_log_step_scans_equal_the_element_by_element_scans(
    axis: int, gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels' own combine functions (a segmented minimum, which does not commute, and
    a reverse minimum over NaN and inf) give what Triton's element-by-element scan gives,
    and what a plain loop gives."""
    from triton.runtime import interpreter

    assert scan_in_log_steps()
    fast = interpreter.ScanOps.generic_scan
    assert getattr(fast, "in_log_steps", False)
    state = gen.get_state()
    word, vote, x, matched, least = _run_scans(gen, axis)
    monkeypatch.setattr(interpreter.ScanOps, "generic_scan", fast.element_by_element)
    gen.set_state(state)
    slow = _run_scans(gen, axis)
    monkeypatch.undo()
    assert torch.equal(slow[3], matched)
    torch.testing.assert_close(slow[4], least, rtol=0, atol=0, equal_nan=True)
    # and the plain definitions, along the scanned axis
    w, v, xs = (t.movedim(axis, -1) for t in (word, vote, x))
    want_matched, want_least = v.clone(), xs.clone()
    for i in range(1, w.shape[-1]):
        same = w[:, i] == w[:, i - 1]
        want_matched[:, i] = torch.where(same, want_matched[:, i - 1].minimum(v[:, i]), v[:, i])
    for i in range(w.shape[-1] - 2, -1, -1):
        # tl.minimum's default (propagate_nan=NONE) is, in the interpreter, numpy's fmin
        want_least[:, i] = torch.fmin(xs[:, i], want_least[:, i + 1])
    assert torch.equal(matched.movedim(axis, -1), want_matched)
    torch.testing.assert_close(least.movedim(axis, -1), want_least, rtol=0, atol=0, equal_nan=True)
    assert bool(want_matched.ne(v).any())  # runs that carried a minimum forward


# --- skip_unasserted_overflow_checks, cache_numpy_dtypes ---------------------------------


def test_every_speed_up_applies_to_this_triton() -> None:
    assert speed_up_interpreter()
    assert speed_up_interpreter()  # installing again changes nothing


@triton.jit
def _int32_ops(a_ptr, b_ptr, out_ptr):
    lanes = tl.arange(0, 64)
    a, b = tl.load(a_ptr + lanes), tl.load(b_ptr + lanes)
    tl.store(out_ptr + lanes, a * b + a - b)  # wraps around, as int32 does on a GPU


def _int32_ops_run(gen: torch.Generator) -> tuple[torch.Tensor, np.ndarray]:
    a, b = torch.randint(-(2**31), 2**31, (2, 64), generator=gen, dtype=torch.int64)
    out = torch.empty(64, dtype=torch.int32)
    _int32_ops[(1,)](a.to(torch.int32), b.to(torch.int32), out)
    a64, b64 = a.numpy(), b.numpy()
    wrapped = (((a64 * b64 + a64 - b64) + 2**31) % 2**32 - 2**31).astype(np.int32)
    return out, wrapped


def test_the_dropped_overflow_checks_were_never_asserted(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Triton's own options (checks on, `debug` off) every int32 operation's check
    reaches `device_assert`, which asserts nothing: overflowing operations wrap, no error.
    Without the checks the values are the same, and `device_assert` is never reached. With
    `debug` on the checks assert, and the speed-up leaves them on."""
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    stock = dataclasses.replace(builder.options, sanitize_overflow=True, debug=False)
    asserts = [0]
    device_assert = TritonSemantic.device_assert

    def counted(self: TritonSemantic, *args: object, **kwargs: object) -> object:
        asserts[0] += 1
        return device_assert(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(TritonSemantic, "device_assert", counted)
    monkeypatch.setattr(builder, "options", stock)
    state = gen.get_state()
    checked, wrapped = _int32_ops_run(gen)
    assert asserts[0] >= 3 and bool((checked.numpy() != 0).all())  # 3 operations checked
    np.testing.assert_array_equal(checked.numpy(), wrapped)

    assert skip_unasserted_overflow_checks()
    assert not builder.options.sanitize_overflow
    asserts[0] = 0
    gen.set_state(state)
    unchecked, _ = _int32_ops_run(gen)
    assert asserts[0] == 0
    assert torch.equal(unchecked, checked)

    monkeypatch.setattr(builder, "options", dataclasses.replace(stock, debug=True))
    assert not skip_unasserted_overflow_checks()
    assert builder.options.sanitize_overflow
    gen.set_state(state)
    with pytest.raises(Exception, match="int32 overflow detected"):
        _int32_ops_run(gen)


def test_the_cached_dtype_map_is_tritons() -> None:
    from triton.runtime import interpreter

    assert cache_numpy_dtypes() and cache_numpy_dtypes()  # idempotent
    cached = interpreter._get_np_dtype
    uncached = cached.uncached
    assert not getattr(uncached, "cached", False)
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64,
               tl.uint64, tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5,
               tl.float8e4nv]  # fmt: skip
    types = scalars + [tl.pointer_type(t) for t in scalars]
    for scalar in list(types):
        types += [tl.block_type(scalar, [4]), tl.block_type(scalar, [2, 8])]
    for _ in range(2):  # filling the cache, then from it
        for t in types:
            assert cached(t) == uncached(t), t
    assert cached(tl.float32) == np.float32 and cached(tl.pointer_type(tl.int8)) == np.uint64
