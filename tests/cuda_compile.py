"""Compile every Triton kernel in kernels/ for a CUDA GPU, on a machine without one.

The interpreter (TRITON_INTERPRET=1), which runs the kernel tests on CPU, executes only the
branches a test's data takes, and it never type-checks, lowers or register-allocates
anything: a kernel can pass every CPU test and still fail to compile on a GPU (a shape
check in a branch no test takes, an op the GPU backend lacks). This script lowers each
kernel through Triton's real CUDA pipeline (TTIR, TTGIR, LLVM IR, PTX, and `ptxas` to a
cubin; all shipped in the triton wheel, no driver or GPU needed) for every constexpr variant
its launcher produces.

How the launches are found: `JITFunction.run` is replaced by a recorder, and each launcher in
kernels/ is called with small CPU tensors once per variant (`LAUNCHES`); the recorder turns
each call into a signature (tensor dtypes, int widths) plus its constexprs and launch
options (num_warps, enable_fp_fusion), which `triton.compile` takes with a CUDA target.

It also checks that a kernel launched with `enable_fp_fusion=False` has no fused multiply-add
in its PTX but those its source writes (`tl.fma`: its bit-identity with the PyTorch stages
depends on it), and that no variant
spills registers (`ptxas -v`: a spill is local-memory traffic in every loop iteration).
Each variant's `store_phases` (the source lines of its global stores, numbered by the
barriers of its TTGIR) let the test check that a kernel orders the stores that its threads
would otherwise race on, and its `released_stores` those another program reads after an
atomic (both `ttgir_order`'s); the interpreter, one thread, never shows such a race. The
launches are recorded as an sm_90 device makes them, with programmatic dependent launch
(`hopper_launches`), and each variant's PTX must wait for the grids before it first
(`ptx_order.waits_first`).

Run in its own process, with the interpreter off (it sets TRITON_INTERPRET=0 before Triton
is imported, and refuses to run where Triton was already imported in interpreter mode):

    python tests/cuda_compile.py [--arch 90] [--json OUT.json]

Exit status 0 when every variant compiled; the report lists each one with its time.
`tests/test_kernels_compile_for_cuda.py` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import linecache
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") == "1":
    raise RuntimeError("run tests/cuda_compile.py in a process without TRITON_INTERPRET=1")
os.environ["TRITON_INTERPRET"] = "0"
# Triton 3.9's default (fusion on, as the launchers without enable_fp_fusion get today),
# set to silence its warning that 3.10 turns it off
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch
import triton
from ptx_order import waits_first
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
from ttgir_order import fenced_stores, released_stores, store_phases

_POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.uint8: "*u8",
    torch.bool: "*i1",
}


@dataclass
class Launch:
    """One recorded launch: the kernel, its signature and constexprs, the launch options."""

    kernel: JITFunction
    label: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    grid: tuple[int, ...] = (1,)  # programs per grid axis, the grid callable evaluated
    args: dict[str, Any] = field(default_factory=dict)  # every parameter's value, by name


@dataclass
class Compiled:
    kernel: str
    label: str
    seconds: float
    ok: bool
    error: str = ""
    constexprs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    # with enable_fp_fusion=False: the PTX's fused multiply-adds by source line
    # ("file:line: code"), and whether one of them is on a line that wrote no `tl.fma`
    fma_lines: list[str] = field(default_factory=list)
    fma_in_ptx: bool | None = None
    registers: int | None = None
    spill_bytes: int | None = None  # spill stores a thread, from `ptxas -v`
    store_phases: list[list[int]] = field(default_factory=list)  # see `store_phases`
    fenced_stores: list[int] = field(default_factory=list)  # see `fenced_stores`
    released_stores: list[int] = field(default_factory=list)  # see `released_stores`
    waits_first: bool | None = None  # see `waits_first`


def _scalar_type(value: object) -> str:
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__} argument {value!r}")


class Recorder:
    """Stands in for `JITFunction.run`: records each launch, runs nothing."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.label = ""

    def run(self, kernel: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        params = kernel.params
        bound = dict(zip([p.name for p in params], args, strict=False))
        options = {
            k: kwargs.pop(k)
            for k in ("num_warps", "enable_fp_fusion", "maxnreg", "launch_pdl")
            if k in kwargs
        }
        bound.update(kwargs)  # constexprs passed by name
        signature: dict[str, str] = {}
        constexprs: dict[str, Any] = {}
        for p in params:
            value = bound.get(p.name, p.default)  # a constexpr left to its default
            if p.is_constexpr:
                signature[p.name] = "constexpr"
                constexprs[p.name] = value
            elif isinstance(value, torch.Tensor):
                signature[p.name] = _POINTER_TYPES[value.dtype]
            else:
                signature[p.name] = _scalar_type(value)
        # a grid callable gets the launch's meta (every parameter and option), as Triton's
        grid = tuple(grid({**bound, **options}) if callable(grid) else grid)
        self.launches.append(
            Launch(kernel, self.label, signature, constexprs, options, grid, bound)
        )


DEVICE = torch.device("cpu")
"""Where `_launches` puts its tensors: the CPU here (the recorder never runs a kernel);
perf/gpu/kernels_part.py sets CUDA and runs every call for real."""


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


def _i64(*shape: int) -> torch.Tensor:
    return _t(*shape, dtype=torch.int64)


def _i32(*shape: int) -> torch.Tensor:
    return _t(*shape, dtype=torch.int32)


def _launches() -> list[tuple[str, Callable[[], None]]]:
    """(label, call) for every constexpr variant the package launches (and the tests' extras:
    the read counter, the search-only top-k/top-p)."""
    from graphsafe_sampler.kernels import (
        history,
        logits_processing,
        logprobs,
        min_p,
        noise,
        sampling,
        top_k_top_p,
    )

    rows, vocab, slots_n = 3, 300, 4
    words = (vocab + 31) // 32
    x, slots = _t(rows, vocab), _i64(rows)
    calls: list[tuple[str, Callable[[], None]]] = []

    # the pipeline always passes the bad-words tables, and the tile-max table unless custom
    # processors run (and the raw-tile table in the raw logprobs modes); the kernel tests
    # also launch without either. Last, the GPU check's probe without the store of "all"
    # (the Sampler's with a float32 source and no mask written, deferring the rows no step
    # changes, with the raw tiles or without; then with a half-precision source, which it
    # does not defer: these three resolve the rows' parameters for the kernels after them).
    # `sparse`: a split row (2 tiles) whose last program makes the phases after the dense
    # pass (ROW_SPARSE), as the Sampler launches a split row on a GPU
    for grammar, drafts, bad_words, tiles, raw, store, defer, sparse in (
        (False, False, True, True, False, True, False, False),
        (True, False, True, True, False, True, False, True),
        (False, True, True, True, False, True, False, False),
        (True, True, True, True, False, True, False, False),
        (False, False, True, False, False, True, False, False),
        (False, False, False, False, False, True, False, False),
        (False, False, True, True, True, True, False, False),
        (True, False, True, True, True, True, False, False),
        (True, False, True, True, True, False, False, True),
        (True, False, True, True, False, True, True, True),
        (True, False, True, True, True, True, True, True),
        (True, False, True, True, False, True, None, True),
    ):

        def process(
            grammar: bool = grammar,
            drafts: bool = drafts,
            bad: bool = bad_words,
            tiles: bool = tiles,
            raw: bool = raw,
            store: bool = store,
            defer: bool | None = defer,
            sparse: bool = sparse,
        ) -> None:
            v = 2048 if sparse else vocab
            w = (v + 31) // 32
            logits_processing.launch_process_logits(
                _t(rows, v), _t(rows, v), slots, _i32(slots_n, 8), _t(slots_n, 8), _i32(slots_n),
                _i32(slots_n), _i32(slots_n, 4), _i32(slots_n, w),
                _i32(rows, w) if grammar else None,
                _t(slots_n, v, dtype=torch.uint8), _i32(slots_n, 3), _i32(slots_n, 3),
                _i32(slots_n, w), _t(slots_n), _t(slots_n), _t(slots_n), _t(slots_n),
                _i64(rows, 2) if drafts else None, _i64(rows) if drafts else None,
                *((_i32(slots_n, 1024),) * 3 + (_i32(slots_n, 16),) if bad else (None,) * 4),
                tile_max=_t(rows, -(-v // 1024)) if tiles else None,
                raw_tiles=_t(rows, -(-v // 1024), 2) if raw else None, store_logits=store,
                defer=(
                    (_i32(slots_n), _i32(slots_n), _t(rows, dtype=torch.bool), _t(rows))
                    if defer else None
                ),
                resolve=(
                    (_i32(slots_n), _t(slots_n), _t(slots_n), _i64(slots_n), _i64(slots_n),
                     _t(rows, 4), _i64(rows, 2))
                    if defer is not False else None
                ),
                output_words=None if drafts else _i32(slots_n, (w + 31) // 32),  # pipeline's
                splits=2 if sparse else 1, arrivals=_i32(rows) if sparse else None,
            )  # fmt: skip

        label = (
            f"process_logits grammar={grammar} drafts={drafts} bad_words={bad_words} "
            f"tile_max={tiles} raw_tiles={raw}"
            + ("" if store else " store_logits=False")
            + (" defer" if defer else "")
            + (" resolve" if defer is not False else "")
            + (" row_sparse" if sparse else "")
        )
        calls.append((label, process))

    # with the tile maxima: the pipeline's (min_p folded in); without: custom processors
    for apply in (False, True):
        for has_min_p, tiles in ((False, False), (True, False), (True, True)):
            for candidates in (top_k_top_p.CANDIDATES, 0):

                def cut(
                    apply: bool = apply,
                    has_min_p: bool = has_min_p,
                    c: int = candidates,
                    tiles: bool = tiles,
                ) -> None:
                    top_k_top_p.launch_top_k_top_p(
                        x, slots, _i32(slots_n), _t(slots_n), _t(rows), apply,
                        _t(slots_n) if has_min_p else None, None, c,
                        tile_max=_t(rows, 1) if tiles else None,
                    )  # fmt: skip

                label = (
                    f"top_k_top_p apply={apply} min_p={has_min_p} candidates={candidates} "
                    f"tile_max={tiles}"
                )
                calls.append((label, cut))

    def counted() -> None:
        top_k_top_p.launch_top_k_top_p(
            x, slots, _i32(slots_n), _t(slots_n), _t(rows), False, None, _i32(rows), 16, 64
        )

    calls.append(("top_k_top_p reads= candidates=16 block=64", counted))

    # stage 1 split over the vocabulary as at B = 1 on a GPU: the cut kernel merges 64 lists
    # of 32 (the widest union it takes); and over 3, as at B = 256, with the tile maxima or
    # without (custom processors). `wide` is bound now: the sampling calls below rebind it
    wide = _t(rows, 151_936)
    # (and the Sampler's reading the rows processing deferred from the source, and the
    # filters processing resolved: `resolved`)
    for splits, tiles, defer, resolved in ((64, True, False, False), (3, True, False, False),
                                           (3, False, False, False), (3, True, True, True),
                                           (64, True, False, True)):  # fmt: skip

        def split(
            splits: int = splits, tiles: bool = tiles, wide: torch.Tensor = wide, d: bool = defer,
            resolved: bool = resolved,
        ) -> None:  # fmt: skip
            top_k_top_p.launch_top_k_top_p(
                wide, slots, _i32(slots_n), _t(slots_n), _t(rows), False, _t(slots_n),
                splits=splits, tile_max=_t(rows, 149) if tiles else None,
                source=wide if d else None, deferred=_t(rows) if d else None,
                filters=_t(rows, 4) if resolved else None,
            )  # fmt: skip

        label = f"top_k_top_p min_p=True splits={splits} tile_max={tiles}"
        label += (" defer" if defer else "") + (" resolved" if resolved else "")
        calls.append((label, split))

    from graphsafe_sampler.kernels.constants import SALT_BONUS, SALT_RECOVER, SALT_SAMPLE

    # the rejection sampler's races and the kernel tests: positions given, int64 tokens
    for threshold, salt in ((False, SALT_SAMPLE), (True, SALT_SAMPLE), (False, SALT_BONUS),
                            (False, SALT_RECOVER)):  # fmt: skip

        def sample(threshold: bool = threshold, salt: int = salt) -> None:
            sampling.launch_sample_tokens(
                x, slots, _t(slots_n), _i64(slots_n), _i64(rows), _i64(rows),
                _t(rows) if threshold else None, salt,
            )  # fmt: skip

        calls.append((f"sample_tokens threshold={threshold} salt={salt}", sample))

    # the Sampler's: positions by slot, int32 tokens, rows whole or split (4 tiles of 1,024);
    # the cut with the tile maxima (the pipeline's), or without (custom processors)
    wide = _t(rows, 4096)
    for threshold, tiles in ((False, False), (True, False), (True, True)):
        for splits in (1, 3):

            def by_slot(threshold: bool = threshold, splits: int = splits, tiles: bool = tiles):
                sampling.launch_sample_tokens(
                    wide, slots, _t(slots_n), _i64(slots_n), None, _i32(rows),
                    _t(rows) if threshold else None, SALT_SAMPLE, _i64(slots_n), _i32(slots_n),
                    splits, (_t(rows, splits), _i32(rows, splits), _i32(rows, splits)),
                    tile_max=_t(rows, 4) if tiles else None,
                    visits=_i32(rows, 4) if tiles else None, arrivals=_i32(rows),
                )  # fmt: skip

            label = f"sample_tokens threshold={threshold} by_slot splits={splits} tile_max={tiles}"
            calls.append((label, by_slot))

    # sample_and_commit: the Sampler's step, the commit in the unsplit sampling program or
    # in a split row's last program, with a commit mask or without; the covered rows raced
    # over stage 1's lists (4 chunks' lists of 32, as at B = 256; 64, as at B = 1)
    # (with the rows' keys processing resolved: `keyed`; handing logprobs the tokens' raw
    # values: `hand`)
    committing = (
        (1, False, 4, False, False, False), (3, False, 64, False, False, False),
        (3, True, 4, False, False, False), (3, False, 4, True, True, False),
        (3, False, 64, False, True, True),
    )  # fmt: skip
    for splits, keep, chunks, defer, keyed, hand in committing:

        def committed(
            splits: int = splits, keep: bool = keep, chunks: int = chunks, d: bool = defer,
            keyed: bool = keyed, hand: bool = hand,
        ) -> None:  # fmt: skip
            generated = _i32(slots_n)  # the positions' and the commit's
            sampling.launch_sample_tokens(
                wide, slots, _t(slots_n), _i64(slots_n), None, _i32(rows), _t(rows),
                SALT_SAMPLE, _i64(slots_n), generated, splits,
                (_t(rows, splits), _i32(rows, splits), _i32(rows, splits)),
                tile_max=_t(rows, 4), visits=_i32(rows, 4),
                commit=history.CommitTables(
                    generated, _t(slots_n, 4096, dtype=torch.uint8), _i32(slots_n, 4),
                    _i32(slots_n, 3), _i32(slots_n, 3), _i32(slots_n, 8), slots_n - 1,
                ),
                keep=_t(rows, dtype=torch.bool) if keep else None, arrivals=_i32(rows),
                buffer=(_i32(rows), _t(rows, chunks, 32), _i32(rows, chunks, 32)),
                defer=(wide, _t(rows)) if d else None,
                keyed=(_t(rows, 4), _i64(rows, 2)) if keyed else None,
                # the raw modes': each token's raw value, for logprobs
                hand=(_t(rows, 4096, dtype=torch.bfloat16), _t(rows)) if hand else None,
            )  # fmt: skip

        label = f"sample_and_commit splits={splits} keep={keep} lists={chunks}x32"
        label += (" defer" if defer else "") + (" keyed" if keyed else "")
        label += " hand" if hand else ""
        calls.append((label, committed))

    def rng() -> None:
        noise.launch_rng_noise(
            _i64(rows), _i64(rows), _i64(rows, vocab), _t(rows, vocab), _t(rows, vocab)
        )

    calls.append(("rng_noise", rng))

    # the raw modes take the raw-tile table (any dtype; two of them here)
    for dtype, subtract_lse, raw in (
        (torch.float32, False, False), (torch.float32, True, False),
        (torch.bfloat16, False, False), (torch.bfloat16, True, False),
        (torch.float16, False, False), (torch.float16, True, False),
        (torch.float32, True, True), (torch.bfloat16, False, True),
    ):  # fmt: skip

        def lp(
            dtype: torch.dtype = dtype, subtract_lse: bool = subtract_lse, raw: bool = raw
        ) -> None:
            logprobs.launch_logprobs(
                _t(rows, vocab, dtype=dtype), _i64(rows), _i32(rows, 6), _t(rows, 6),
                _i32(rows), _t(rows), subtract_lse, tiles=_t(rows, 1, 2) if raw else None,
                visits=_i32(rows, 1) if raw else None,
            )  # fmt: skip

        label = f"compute_logprobs {dtype} subtract_lse={subtract_lse} raw_tiles={raw}"
        calls.append((label, lp))

    # split rows (a GPU's small batch): chunks' partials, merged by each row's last
    # program; K 20; with the raw tiles, the Sampler's, the sampled values from sampling
    for raw in (False, True):

        def split_lp(raw: bool = raw) -> None:
            partials = (_t(rows, 64, 4), _t(rows, 64, 32), _i32(rows, 64, 32))
            logprobs.launch_logprobs(
                _t(rows, 151_936), _i64(rows), _i32(rows, 21), _t(rows, 21), _i32(rows),
                _t(rows), True, 1024, 64, partials, _t(rows, 149, 2) if raw else None,
                _i32(rows, 149) if raw else None, _i32(rows), _t(rows) if raw else None,
            )  # fmt: skip

        calls.append(
            (f"compute_logprobs splits=64 K=20 subtract_lse=True raw_tiles={raw}", split_lp)
        )

    calls.append(("apply_min_p", lambda: min_p.launch_min_p(x, slots, _t(slots_n))))

    def commit() -> None:
        history.launch_commit_history(
            slots, _i64(rows), _t(rows, dtype=torch.bool), _i32(slots_n),
            _t(slots_n, vocab, dtype=torch.uint8), _i32(slots_n, (words + 31) // 32),
            _i32(slots_n, 3),
            _i32(slots_n, 3), _i32(slots_n, 8), slots_n - 1,
        )  # fmt: skip

    calls.append(("commit_history", commit))
    return calls


@contextlib.contextmanager
def hopper_launches() -> Iterator[None]:
    """Have the launchers decide programmatic dependent launch as on an sm_90 device (on: the
    `PDL` constexpr and `launch_pdl`, kernels/dependent_launch.py), which this CPU's tensors
    would turn off: the variants recorded are the ones a Hopper GPU compiles."""
    from graphsafe_sampler.kernels import dependent_launch

    saved = dependent_launch.pdl_supported
    dependent_launch.pdl_supported = lambda device, *args, **kwargs: True  # type: ignore[assignment]
    try:
        yield
    finally:
        dependent_launch.pdl_supported = saved  # type: ignore[assignment]


def record() -> list[Launch]:
    """Every launch of `_launches`, recorded without running anything, as on sm_90."""
    recorder = Recorder()
    original = JITFunction.run

    def run(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        recorder.run(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = run  # type: ignore[method-assign]
    try:
        with hopper_launches():
            for label, call in _launches():
                recorder.label = label
                call()
    finally:
        JITFunction.run = original  # type: ignore[method-assign]
    return recorder.launches


def ptxas_usage(log: str) -> tuple[int | None, int | None]:
    """(registers, spill-store bytes) a thread, from the report of `ptxas -v`."""
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return (
        int(registers.group(1)) if registers else None,
        int(spills.group(1)) if spills else None,
    )


def compile_with_ptxas_log(
    src: ASTSource, target: GPUTarget, options: dict[str, Any]
) -> tuple[Any, str]:
    """`triton.compile` for a CUDA target, and the report of the `ptxas -v` it runs to build
    the cubin (Triton prints it to stdout when `knobs.nvidia.dump_ptxas_log` is set): the
    usage of the cubin Triton builds, with its own flags, from the one ptxas run. Always
    compiled: a variant found in Triton's cache would run no ptxas, and report nothing."""
    from triton import knobs

    out = io.StringIO()
    with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(out):
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        compiled = triton.compile(src, target=target, options=options)
    return compiled, out.getvalue()


def fma_lines(ptx: str) -> list[str]:
    """The source lines ("file:line: code") of the float32 fused multiply-adds in `ptx`, by
    the `.loc` before each (its `.file` table names the file)."""
    files = dict(re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M))
    found, here = set(), ("", 0)
    for text in ptx.splitlines():
        if loc := re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", text):
            here = (files.get(loc.group(1), ""), int(loc.group(2)))
        elif "fma.rn.f32" in text and here[0]:
            code = linecache.getline(here[0], here[1]).strip()
            found.add(f"{os.path.basename(here[0])}:{here[1]}: {code}")
    return sorted(found)


def compile_launch(launch: Launch, arch: int) -> Compiled:
    kernel = launch.kernel
    names = kernel.arg_names
    constexprs = {(names.index(k),): v for k, v in launch.constexprs.items()}
    src = ASTSource(fn=kernel, signature=launch.signature, constexprs=constexprs)
    options = {"num_warps": 4, **launch.options}
    start = time.perf_counter()
    result = Compiled(
        kernel.__name__, launch.label, 0.0, False,
        constexprs=dict(launch.constexprs), options=options,
    )  # fmt: skip
    try:
        compiled, log = compile_with_ptxas_log(src, GPUTarget("cuda", arch, 32), options)
        result.ok = True
        result.registers, result.spill_bytes = ptxas_usage(log)
        result.store_phases = store_phases(compiled.asm["ttgir"])
        result.fenced_stores = fenced_stores(compiled.asm["ttgir"])
        result.released_stores = released_stores(compiled.asm["ttgir"])
        result.waits_first = waits_first(compiled.asm["ptx"])
        if options.get("enable_fp_fusion") is False:
            result.fma_lines = fma_lines(compiled.asm["ptx"])
            result.fma_in_ptx = any("tl.fma(" not in line for line in result.fma_lines)
    except Exception as exc:  # reported, not raised: every variant gets compiled
        result.error = f"{type(exc).__name__}: {exc}"[-3000:]
    result.seconds = round(time.perf_counter() - start, 2)
    return result


def kernels_in_package() -> set[str]:
    """Names of every `@triton.jit` function in kernels/ whose name ends in `_kernel`."""
    import importlib
    import pkgutil

    import graphsafe_sampler.kernels as package

    names = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and name.endswith("_kernel"):
                names.add(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability (90: H100/H200)")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    results = []
    launches = record()
    # a launch whose kernel, signature, constexprs and options another one had compiles to
    # the same cubin (`compile_launch` gives triton.compile nothing else): its report is
    # that one's, under its own label (12 of the 67 launches, about 15% of the run)
    done: dict[str, Compiled] = {}
    for i, launch in enumerate(launches, 1):
        key = repr(
            (launch.kernel.__name__, sorted(launch.signature.items()),
             sorted(launch.constexprs.items()), sorted(launch.options.items()))
        )  # fmt: skip
        same = key in done
        if same:
            result = replace(done[key], label=launch.label, seconds=0.0)
        else:
            result = done[key] = compile_launch(launch, args.arch)
        results.append(result)
        status = "ok" if result.ok else "FAILED"
        usage = f"{result.registers} regs, {result.spill_bytes} B spilled"
        print(f"[{i}/{len(launches)}] {status} {result.seconds:6.2f} s  {usage:24}  {launch.label}"
              f"{'  (compiled above)' if same else ''}", flush=True)  # fmt: skip
        if result.error:
            print(f"    {result.error[:1000]}", flush=True)
    covered = {r.kernel for r in results}
    missing = sorted(kernels_in_package() - covered)
    fused = [r.label for r in results if r.fma_in_ptx]
    spilled = [r.label for r in results if r.spill_bytes]
    # a kernel launched early (launch_pdl) must wait first; one that waits, be launched so
    unordered = [
        r.label
        for r in results
        if r.ok and (r.waits_first is not True or r.options.get("launch_pdl") is not True)
    ]
    report = {
        "arch": args.arch,
        "triton": triton.__version__,
        "results": [asdict(r) for r in results],
        "missing_kernels": missing,
        "fma_despite_no_fusion": fused,
        "spilled": spilled,
        "pdl_unordered": unordered,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    failed = [r.label for r in results if not r.ok]
    problems = (
        ("failed", failed),
        ("never launched", missing),
        ("fma", fused),
        ("spilled", spilled),
        ("not waiting first under programmatic dependent launch", unordered),
    )
    for what, items in problems:
        if items:
            print(f"{what}: {', '.join(items)}", flush=True)
    total = sum(r.seconds for r in results)
    print(f"{len(results) - len(failed)}/{len(results)} variants compiled for sm_{args.arch} "
          f"in {total:.0f} s", flush=True)  # fmt: skip
    return 1 if failed or missing or fused or spilled or unordered else 0


if __name__ == "__main__":
    sys.exit(main())
