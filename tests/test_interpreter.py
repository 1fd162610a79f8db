"""`share_interpreter_patches` (conftest.py installs it): a launch patches `triton.language`
once, its helpers' calls do not patch it again, and the values and the restored language are
what Triton's interpreter gives."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from graphsafe_sampler.testing import share_interpreter_patches

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
