"""Programmatic dependent launch (kernels/dependent_launch.py): where it is on, and that every
kernel waits first and every launch passes its two arguments together. The PTX of every
variant, launched as on sm_90, is checked in test_kernels_compile_for_cuda.py."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
from pathlib import Path

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

import graphsafe_sampler.kernels as kernels
from graphsafe_sampler.kernels import dependent_launch
from graphsafe_sampler.kernels.dependent_launch import PDL_ENV, pdl_launch, pdl_supported

CUDA = torch.device("cuda", 0)


@pytest.fixture
def capability(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[int, int]]:
    """The compute capability `pdl_supported` reads for CUDA devices, set by the test (this
    machine has no GPU)."""
    current = {"value": (9, 0)}
    monkeypatch.setattr(dependent_launch, "_capability", lambda index: current["value"])
    return current


@pytest.mark.parametrize(
    ("major_minor", "expected"), [((9, 0), True), ((10, 0), True), ((8, 9), False), ((8, 0), False)]
)
def test_on_from_hopper_on(
    capability: dict[str, tuple[int, int]], major_minor: tuple[int, int], expected: bool
) -> None:
    capability["value"] = major_minor
    assert pdl_supported(CUDA, interpreted=False, setting="") is expected
    assert pdl_supported(CUDA, interpreted=False, setting="1") is expected


def test_off_where_asked_interpreted_or_off_cuda(capability: dict[str, tuple[int, int]]) -> None:
    assert pdl_supported(CUDA, interpreted=False, setting="0") is False
    assert pdl_supported(CUDA, interpreted=True, setting="1") is False
    assert pdl_supported(torch.device("cpu"), interpreted=False, setting="1") is False


@pytest.mark.parametrize("setting", ["yes", "true", "2", " 1"])
def test_a_setting_other_than_0_or_1_is_refused(setting: str) -> None:
    with pytest.raises(ValueError, match=PDL_ENV):
        pdl_supported(torch.device("cpu"), interpreted=False, setting=setting)


def test_the_environment_decides_at_each_launch(
    capability: dict[str, tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dependent_launch, "INTERPRETED", False)
    monkeypatch.setattr(dependent_launch.pdl_supported, "__defaults__", (False, None))
    monkeypatch.delenv(PDL_ENV, raising=False)
    assert pdl_launch(CUDA) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setenv(PDL_ENV, "0")
    assert pdl_launch(CUDA) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setenv(PDL_ENV, "1")
    assert pdl_launch(CUDA) == {"PDL": True, "launch_pdl": True}
    assert pdl_launch(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}


def test_interpreted_launches_are_ordinary(monkeypatch: pytest.MonkeyPatch) -> None:
    # this suite runs the kernels in Triton's interpreter, which has no griddepcontrol
    monkeypatch.setenv(PDL_ENV, "1")
    assert pdl_launch(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}


def _kernels() -> dict[str, JITFunction | InterpretedFunction]:
    """Every `@triton.jit` function in kernels/ whose name ends in `_kernel` (under the
    interpreter, which this suite runs, `triton.jit` makes an `InterpretedFunction`)."""
    found = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, (JITFunction, InterpretedFunction)) and name.endswith("_kernel"):
                found[name] = value
    return found


def test_every_kernel_waits_before_anything_else() -> None:
    found = _kernels()
    assert len(found) >= 8
    for name, kernel in found.items():
        tree = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn)))
        fn = tree.body[0]
        assert isinstance(fn, ast.FunctionDef)
        pdl = [a for a in fn.args.args if a.arg == "PDL"]
        assert pdl and ast.unparse(pdl[0].annotation or ast.Constant(None)) == "tl.constexpr", name
        body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(
            fn.body[0].value, ast.Constant
        ) else fn.body  # fmt: skip
        assert ast.unparse(body[0]) == "await_prior_grids(PDL)", name


def test_every_launch_passes_pdl_launch() -> None:
    """Each `<kernel>[grid](...)` in kernels/ takes `**pdl_launch(<a tensor's device>)`: the
    `PDL` constexpr and `launch_pdl` always equal, so no kernel starts early without its
    wait."""
    launched = set()
    for path in Path(kernels.__path__[0]).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)):
                continue
            target = node.func.value
            if not (isinstance(target, ast.Name) and target.id.endswith("_kernel")):
                continue
            launched.add(target.id)
            splats = [ast.unparse(k.value) for k in node.keywords if k.arg is None]
            assert any(s.startswith("pdl_launch(") for s in splats), f"{path.name}: {target.id}"
            assert not any(k.arg in ("PDL", "launch_pdl") for k in node.keywords), target.id
    assert launched == set(_kernels())
