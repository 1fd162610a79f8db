"""Every Triton kernel compiles for an H100/H200 (sm_90) through Triton's real CUDA pipeline,
on this GPU-less machine: `tests/cuda_compile.py`, in its own process with the interpreter
off (this suite's conftest turns it on). The interpreter runs only the branches a test's
data takes; this catches what it cannot (a shape check in an untaken branch, an op the GPU
backend lacks), that the kernels promising bit-identity keep multiply-adds unfused, that
no variant spills registers, and that barriers order the stores the interpreter's single
thread never races on."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from made_once import made_once

HERE = Path(__file__).resolve().parent


def _ptxas() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.exists() else None


pytestmark = pytest.mark.skipif(
    _ptxas() is None, reason="this triton wheel ships no CUDA backend (ptxas)"
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The sm_90 report of every variant, compiled once a run for this module's tests,
    whichever workers run them (~1 minute), with the script's exit status under
    "returncode"."""

    def make(path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        # a cold compile, every run
        env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
        proc = subprocess.run(
            [sys.executable, str(HERE / "cuda_compile.py"), "--arch", "90", "--json", str(path)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        print(proc.stdout[-6000:], proc.stderr[-3000:])
        result = json.loads(path.read_text(encoding="utf-8"))
        result["returncode"] = proc.returncode
        path.write_text(json.dumps(result), encoding="utf-8")

    # once for all of pytest-xdist's workers that run this module's tests
    path = made_once(tmp_path_factory, "cuda_compile.json", make)
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return report


def test_every_kernel_variant_compiles_for_sm90(report: dict[str, Any]) -> None:
    assert report["returncode"] == 0
    results = report["results"]
    assert all(r["ok"] for r in results)
    assert report["missing_kernels"] == []  # every *_kernel in kernels/ was launched
    # ptxas -v: no variant spills registers to local memory
    assert report["spilled"] == [] and all(r["spill_bytes"] == 0 for r in results)
    kernels = {r["kernel"] for r in results}
    assert {"_process_logits_kernel", "_top_k_top_p_kernel", "_sample_kernel"} <= kernels
    # the candidate buffer and the search alone both compile
    buffers = {
        r["constexprs"]["CANDIDATES"] for r in results if r["kernel"] == "_top_k_top_p_kernel"
    }
    assert {128, 2, 16} <= buffers
    # stage 1's chunk lists, whole and shared out over chunks; each variant leaves room for
    # at least 2 CTAs an SM (8 warps: 65,536 registers / (8 x 32 x 2) = 128 a thread)
    stage1 = [r for r in results if r["kernel"] == "_candidates_kernel"]
    assert {128, 32, 2, 16} <= {r["constexprs"]["PARTIAL"] for r in stage1}
    assert all(r["registers"] <= 128 for r in stage1), [
        (r["label"], r["registers"]) for r in stage1
    ]
    # process_logits is bit-identical to torch's separate multiply and add: no fma in its PTX
    # but the fast division's own (`library.divide_by`), and that one outside the drafts'
    # variants (their dense pass divides as IEEE division does, in one pass); the 9th is the
    # GPU check's probe without the dense pass's store, the last three the Sampler's that
    # resolve the rows' parameters (two deferring rows)
    process = [r for r in results if r["kernel"] == "_process_logits_kernel"]
    assert len(process) == 12 and all(r["fma_in_ptx"] is False for r in process)
    for r in process:
        assert all(line.startswith("library.py:") for line in r["fma_lines"]), r["fma_lines"]
        assert bool(r["fma_lines"]) == ("drafts=False" in r["label"]), r["label"]
    # the register caps (`maxnreg`) that give the split kernels their occupancy by
    # construction: processing always, stage 1 wherever it keeps lists of CHUNK_PARTIAL;
    # ptxas keeps each variant within its cap (and no variant spills, above)
    from graphsafe_sampler.kernels.top_k_top_p import CHUNK_PARTIAL

    assert all(r["options"].get("maxnreg") == 64 for r in process)
    capped = [r for r in stage1 if r["constexprs"]["PARTIAL"] <= CHUNK_PARTIAL]
    assert capped and all(r["options"].get("maxnreg") for r in capped)
    assert all(r["registers"] <= r["options"]["maxnreg"] for r in results
               if r["options"].get("maxnreg"))  # fmt: skip


def _ordered(stores: list[list[int]], first: int, then: int) -> bool:
    """Whether every store of line `first` comes before every store of line `then`, in the
    text and with a barrier between (`cuda_compile.store_phases`' [line, phase] list, in
    text order: a lower phase orders only a store that comes first); False where either
    line has no store."""
    a = [(i, phase) for i, (line, phase) in enumerate(stores) if line == first]
    b = [(i, phase) for i, (line, phase) in enumerate(stores) if line == then]
    if not (a and b):
        return False
    return max(i for i, _ in a) < min(i for i, _ in b) and max(p for _, p in a) < min(
        p for _, p in b
    )


def _lines_of(lines: list[str], start: int, statement: str) -> list[int]:
    """The file line numbers of the source lines that begin with `statement` (a call and
    its opening parenthesis), in order."""
    return [start + i for i, line in enumerate(lines) if line.strip().startswith(statement)]


def _line_of(lines: list[str], start: int, statement: str) -> int:
    """The file line number of the one source line that begins with `statement`."""
    found = _lines_of(lines, start, statement)
    assert len(found) == 1, f"{statement!r} is on lines {found}, not on exactly one"
    return found[0]


def test_tile_lists_land_before_the_walk_reads_them(report: dict[str, Any]) -> None:
    """Every kernel that walks a tile list (`library.tiles_to_visit`) stores the list with
    its threads, then loads each entry with whichever thread the pipeline gives it: a
    barrier must order the stores before the first load, or a walk may read a stale entry
    and skip a tile the interpreter's single thread always read."""
    from graphsafe_sampler.kernels import candidates, logprobs, sampling

    listing = {
        "_candidates_kernel": (candidates._candidates_kernel, "HAS_TILE_MAX"),
        "_sample_kernel": (sampling._sample_kernel, "HAS_TILE_MAX"),
        "_logprobs_kernel": (logprobs._logprobs_kernel, "HAS_TILES"),
    }
    seen = set()
    for r in report["results"]:
        if r["kernel"] not in listing:
            continue
        kernel, flag = listing[r["kernel"]]
        if not r["constexprs"][flag]:
            continue
        lines, start = inspect.getsourcelines(kernel.fn)
        call = [start + i for i, line in enumerate(lines) if "= tiles_to_visit(" in line]
        assert len(call) == 1, r["kernel"]
        assert call[0] in r["fenced_stores"], (r["label"], r["fenced_stores"])
        seen.add(r["kernel"])
    assert seen == set(listing)


def test_split_rows_release_their_partials(report: dict[str, Any]) -> None:
    """A split row's programs write their chunk's partials, and its last program to arrive
    (`library.last_to_arrive`) reads them all: each partial's store must be ordered by a
    barrier before the arrival's atomic, which releases at GPU scope, or the last program
    may merge a partial another thread of its writer has not stored yet. So with
    processing's dense pass (its logits and tile tables: the stores of each `dense_tile`
    call, at the call's line), which a split row's last program reads and rewrites in its
    phases after it (ROW_SPARSE). The interpreter runs programs one after another and never
    shows it."""
    from graphsafe_sampler.kernels import logits_processing, logprobs, sampling

    partials = {
        "_sample_kernel": (sampling._sample_kernel, "SPLIT", 3, tuple(
            f"tl.store({t} + " for t in ("partial_best_ptr", "partial_index_ptr",
                                         "partial_nan_ptr"))),
        "_logprobs_kernel": (logprobs._logprobs_kernel, "SPLIT", 3, tuple(
            f"tl.store({t} + " for t in ("stats_ptr", "part_v_ptr", "part_i_ptr"))),
        # the pass's two loops and the redo pass
        "_process_logits_kernel": (logits_processing._process_logits_kernel, "ROW_SPARSE", 2,
                                   ("redo |= dense_tile(", "dense_tile(")),
    }  # fmt: skip
    seen = set()
    for r in report["results"]:
        if r["kernel"] not in partials or not r["constexprs"].get(partials[r["kernel"]][1]):
            continue
        kernel, _, least, starts = partials[r["kernel"]]
        lines, start = inspect.getsourcelines(kernel.fn)
        made = {line for line, _ in r["store_phases"]}  # (the redo pass: not with drafts)
        stores = [
            start + i
            for i, line in enumerate(lines)
            if line.strip().startswith(starts) and start + i in made
        ]
        assert len(stores) >= least, (r["label"], stores)
        missing = sorted(set(stores) - set(r["released_stores"]))
        assert not missing, (r["label"], missing, r["released_stores"])
        seen.add(r["kernel"])
    assert seen == set(partials)


def test_commits_store_after_a_barrier(report: dict[str, Any]) -> None:
    """Every thread of a committing program loads the history (the count byte,
    num_generated, the excess of a token at 255) and one stores it: `history.commit_row`
    puts a barrier between, or a warp that lags past the store reads the advanced count and
    takes the other branch. In the sampling program the same barrier orders the position's
    read of num_generated (at the start) before its advance, and the token's store comes
    before it."""
    from graphsafe_sampler.kernels import history, sampling

    committing = {
        "_commit_history_kernel": (history._commit_history_kernel, None),
        "_sample_kernel": (sampling._sample_kernel, "tl.store(tokens_ptr + row, token.to("),
    }
    seen = set()
    for r in report["results"]:
        if r["kernel"] not in committing or not r["constexprs"].get("COMMIT", True):
            continue
        kernel, token_store = committing[r["kernel"]]
        lines, start = inspect.getsourcelines(kernel.fn)
        found = [start + i for i, line in enumerate(lines) if "commit_row(" in line]
        assert len(found) == 1, r["kernel"]
        stores = r["store_phases"]
        commits = [phase for line, phase in stores if line == found[0]]
        assert commits and min(commits) > 0, (r["label"], stores)
        if token_store is not None:
            token = [start + i for i, line in enumerate(lines) if token_store in line]
            assert _ordered(stores, token[0], found[0]), (r["label"], stores)
        seen.add(r["kernel"])
    assert seen == set(committing)


def test_process_logits_orders_its_phases(report: dict[str, Any]) -> None:
    """The dense pass writes every token, the biased ones are rewritten, the saturated ones
    read back and rewritten (step 7), and stop ids and banned words set to -inf, each phase
    by other threads than the one before: each needs a barrier before the next, or a biased
    token may keep its unbiased value and a biased stop id may lose its -inf."""
    from graphsafe_sampler.kernels.logits_processing import _process_logits_kernel

    lines, start = inspect.getsourcelines(_process_logits_kernel.fn)
    # the sparse phases' stores, from the helpers of sparse_phases.py it inlines: the calls'
    # lines in the kernel
    bias = _line_of(lines, start, "apply_bias(")
    excess = _line_of(lines, start, "apply_excess(")
    min_tokens = _line_of(lines, start, "ban_stop_ids(")
    # the dense pass's stores, from the tile helper it inlines: the calls' lines in the
    # kernel (its first pass: the row's partial last tile, then the loop's whole tiles;
    # and the pass with IEEE division)
    tail, dense = _lines_of(lines, start, "redo |= dense_tile(")
    again = _line_of(lines, start, "dense_tile(")
    # the bad words' -inf, stored from the helper it inlines: the call's line in the kernel
    bad_words = _line_of(lines, start, "ban_bad_words(")
    process = [r for r in report["results"] if r["kernel"] == "_process_logits_kernel"]
    assert len(process) == 12
    for r in process:
        stores = r["store_phases"]
        where = f"{r['label']}: [line, phase] of the stores {stores}; dense {tail}, {dense}, bias "
        where += f"{bias}, excess {excess}, min_tokens {min_tokens}, bad words {bad_words}"
        assert _ordered(stores, dense, bias) and _ordered(stores, tail, bias), where
        assert _ordered(stores, bias, excess), where
        assert _ordered(stores, excess, min_tokens), where
        if "drafts=False" in r["label"]:  # the pass again, after its own barrier
            assert _ordered(stores, dense, again) and _ordered(stores, tail, again), where
            assert _ordered(stores, again, bias), where
        if "bad_words=True" in r["label"]:
            assert _ordered(stores, excess, bad_words), where


def test_every_kernel_waits_for_the_grids_before_it(report: dict[str, Any]) -> None:
    """Launched as on sm_90, programmatic dependent launch on: every variant passes Triton's
    `launch_pdl` with its `PDL` constexpr, and its PTX waits (`griddepcontrol.wait`) before
    any instruction that may touch global memory and before any branch, so a kernel that
    starts while the one before it still runs sees memory as an ordered launch would."""
    assert report["pdl_unordered"] == []
    for r in report["results"]:
        assert r["constexprs"]["PDL"] is True, r["label"]
        assert r["options"]["launch_pdl"] is True, r["label"]
        assert r["waits_first"] is True, r["label"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # the wait after the parameters and shared memory only: first
        ("ld.param.b64 %rd1, [k_param_0];\nst.shared.b32 [%r1], %r2;\n"
         "griddepcontrol.wait ;\nld.global.b32 %r3, [%rd1];", True),
        # a load, a predicated store, an asynchronous copy, an atomic, a generic load or a
        # branch before it: not first
        ("ld.global.nc.b32 %r3, [%rd1];\ngriddepcontrol.wait ;", False),
        ("@%p1 st.global.b32 [%rd1], %r2;\ngriddepcontrol.wait ;", False),
        ("cp.async.cg.shared.global [%r1], [%rd1], 16;\ngriddepcontrol.wait ;", False),
        ("atom.global.gpu.acq_rel.add.u32 %r1, [%rd1], 1;\ngriddepcontrol.wait ;", False),
        ("ld.b32 %r3, [%rd1];\ngriddepcontrol.wait ;", False),
        ("@%p1 bra $L__BB0_2;\ngriddepcontrol.wait ;", False),
        # no wait at all: the first access decides, and a kernel without either is None
        ("ld.global.b32 %r3, [%rd1];", False),
        ("mov.u32 %r5, %ctaid.x;\nret;", None),
    ],
)  # fmt: skip
def test_waits_first_reads_the_order_of_the_ptx(body: str, expected: bool | None) -> None:
    from ptx_order import waits_first

    head = ".version 8.7\n.target sm_90a\n.visible .entry k(\n"
    ptx = head + ".param .u64 .ptr .global k_param_0\n)\n{\n"
    assert waits_first(ptx + body.replace("\n", "\n\t") + "\n}\n") is expected


_STORE = "tt.store %p, %v : tensor<4x!tt.ptr<f32>> loc(#loc{})"
_BARRIER = "ttg.barrier all"
_ARRIVE = "%n = tt.atomic_rmw add, acq_rel, gpu, %c, %one : (!tt.ptr<i32>, i32) -> i32 loc(#loc9)"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # the barrier in the store's block, the atomic in the barrier's (the merges')
        ([_STORE.format(1), _BARRIER, _ARRIVE], [1]),
        (["scf.if %a {", _STORE.format(1), _BARRIER, "}", _ARRIVE], [1]),
        # the barrier and the atomic in a later block: every path to the atomic passes the
        # barrier after the store (processing's dense pass, then its phases' `if`)
        ([_STORE.format(1), "scf.for %i = %0 to %n step %s {", _STORE.format(2), "}",
          "scf.if %a {", _BARRIER, "scf.if %b {", _ARRIVE, "}", "}"], [1, 2]),
        # no barrier between, or one that a path to the atomic skips, or one in a loop
        ([_STORE.format(1), _ARRIVE], []),
        ([_STORE.format(1), "scf.if %a {", _BARRIER, "}", _ARRIVE], []),
        ([_STORE.format(1), "scf.if %a {", _BARRIER, "} else {", "}", _ARRIVE], []),
        ([_STORE.format(1), "scf.for %i = %0 to %n step %s {", _BARRIER, "}", _ARRIVE], []),
        # a store after the barrier, before the atomic; an atomic that does not release
        ([_BARRIER, _STORE.format(1), _ARRIVE], []),
        ([_STORE.format(1), _BARRIER, _ARRIVE.replace("acq_rel", "relaxed")], []),
    ],
)  # fmt: skip
def test_released_stores_takes_a_barrier_every_path_to_the_atomic_passes(
    body: list[str], expected: list[int]
) -> None:
    """`ttgir_order.released_stores` on hand-made TTGIR: a store counts as released only
    where a barrier ordering global memory follows it on every path to a GPU-scope acq_rel
    atomic, outside any loop body."""
    from ttgir_order import released_stores

    locs = "\n".join(f'#loc{i} = loc("k.py":{i}:4)' for i in range(1, 10))
    ttgir = "\n".join(["tt.func public @k() {", *body, "tt.return", "} loc(#loc9)", locs])
    assert released_stores(ttgir) == expected
