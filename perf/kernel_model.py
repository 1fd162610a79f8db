#!/usr/bin/env python
"""A cost model of the Triton step on an H200 (or, `--gpu`, an H100), computed on the CPU: an
estimate, never a measurement.

Why: a GPU is lent to some sessions only, for minutes. This model says, on any machine, what
one `Sampler` step on the Triton backend launches, how many passes over the logits it makes,
what each kernel's hot loop costs in SASS and roughly how long the step should take, so that
a change to a kernel or to the pipeline shows its cost before a GPU run, and a GPU run has a
figure to be compared with.

    python perf/kernel_model.py [--rows 1 64 256] [--vocab 151936] [--cases all top_k_top_p]
                                [--gpu {h200,h100-sxm,h100-pcie,auto}] [--json PATH]

How: a `Sampler(SamplerConfig(backend="triton", ...))` on the CPU, loaded with the GPU
check's requests of the case (perf/gpu/measure.py `SamplerPool`, perf/gpu/cases.py), runs
`sampler(logits)` once with Triton's `JITFunction.run` replaced by tests/cuda_compile.py's
`Recorder` (each launch's signature, constexprs, options, grid and arguments; nothing runs)
and under a `TorchDispatchMode` that lists the aten ops the step runs outside the kernels.
Each distinct kernel variant is compiled for sm_90 with the launch's own specialization,
then `ptxas -v` gives its registers and spills, its metadata the shared memory, and
`nvdisasm` its SASS, whose loops (a branch back to an earlier label) are counted. This file
records, assembles and reports; the package cost_model/ holds the parts (its `__init__`).

Per launch (µs), the formula:

    est     = max(bytes / (HBM peak × achievable fraction), waves × serial) + launch overhead
    waves   = ceil(programs / (SMs × CTAs per SM))
    serial  = rounds × latency + N × warps / share / clock (outside the tile loops: the
              dependent rounds of loads and the instructions N on the program's longest
              path, cost_model/chain.py)
              + Σ over the program's tile loops: walks × tiles × (latency + I × warps /
              share / clock); a pipelined loop (its SASS copies loads with LDGSTS): latency
              + walks × tiles × max(I × warps / share / clock, latency / (S - 1)), S its
              num_stages
    tiles   = ceil(V / BLOCK_SIZE), or ceil(chunk / BLOCK_SIZE) for a kernel that splits its
              rows over programs; I = the loop body's SASS instructions (per thread per
              iteration); share = min(warps, issue rate / CTAs resident on an SM), in warp-
              instructions per clock; resident = min(CTAs per SM, ceil(issuing / SMs)),
              issuing = the programs but those that stop at once (`Work.idle`); a split
              row's merge by its last program (`Work.merging`) is left out of N and
              charged at min(warps, issue rate / max(1, resident × share merging))
    CTAs per SM = min(32, 64 // warps, 65,536 // (warps × ceil(32 × regs / 256) × 256),
                      228 KB // (shared + 1 KB))

An aten op that launches a kernel costs bytes / bandwidth + the launch overhead. The step is
the sum of its launches (a CUDA graph replays them one after another). Instructions per
element of a tile loop = I / (BLOCK_SIZE / (32 × warps)): one iteration of a thread handles
BLOCK_SIZE / (32 × warps) elements of the tile.

Bytes come from each kernel's access pattern (kernels/*.py docstrings, docs/kernels.md),
evaluated on the batch's own parameters (which rows have penalties, top-k, ...). Passes per
program over its row of each tensor:

    kernel           logits [B, V] float32          other tensors
    process_logits   raw source: 1 read (+ the      counts row (V bytes) and prompt bitmask
                     biased tokens); float32 out:   (V/8) with penalties; allowed bitmask
                     1 write + the sparse stores    always, grammar's with HAS_GRAMMAR; stop
                     (bias, stop ids, bad words,    ids while min_tokens holds; bad-words
                     overflow entries); 1 more      blocks in use; overflow entries in use
                     read and write at a full      tile maxima written (4 bytes a
                     overflow table; no write for   tile)
                     a deferred row (no step
                     changes it), which stage 1,
                     the cut and sampling read
                     from the source instead
    candidates       filtered rows: 1 read, in      chunk statistics written; lists
                     chunks (stage 1 of top-k/      written where the buffer is used;
                     top-p); a buffered top-k row   the row's tile maxima read per
                     with the tile maxima: the      program
                     tiles at or above its floor
                     (bench rows, below) and the
                     unknown ones
    top_k_top_p      8 search passes per            chunk statistics and lists read;
                     unsettled filter, + 1 read     threshold written; per-slot k, p,
                     and 1 write with APPLY         min_p
    sample           1 read; with the tile maxima   threshold; seed and position: random
                     and a cut, the tiles holding   rows; the chunk's tile maxima; with
                     one of the filters'            a commit (the unsplit program's, or
                     survivors (bench rows) and     the merge's), commit_history's
                     the unknown ones
    logprobs         1 read of the source (the      K + 1 ids and values, rank, lse written;
                     rare second pass: never);      the row's raw-tile table read per
                     with the raw tiles, those      program
                     reaching the K-th largest
                     max or the sampled token
                     (bench rows, over the
                     sampled token)
    commit_history   none                           committing rows: one count byte read
                                                    and written, one ring entry written
    min_p            rows with min_p: 2 reads +     per-slot min_p
                     1 write
    any other        every tile loop walked once    one row of each tensor argument read

Bench rows: the filters' survivors (which sampling's shares take) and the tiles stage 1 and
logprobs read are counted on the GPU check's own rows (`cost_model.bench_rows`); without the
step's temperatures, top-k's k stands for the survivors (logprobs: a survivor of uniform
rank).

Settled rows: top-k with k <= CANDIDATES (128) and splits x PARTIAL is exact from the
merged buffer after stage 1's read, and so is top-p after it (its survivors are all in the
buffer, barring ties at the k-th value). Top-p alone, or any filter the buffer
cannot take, is charged the search's maximum, 8 passes (it stops earlier when the candidate
keys share leading digits or it decides early; the buffer settles a nucleus of up to ~127
tokens, which depends on the logits). A row the buffer settles for top-k is taken as covered
(its cut above every logit the lists left out): the sampling kernel races it over the lists
and reads none of its logits. Arguments the table does not name are charged one row read
per program: an upper bound.

Branches: an `if` inside a tile loop counts as taken (the static upper bound) unless the
access table gives the fraction of iterations that run its block: processing's penalties
and temperature (steps 5 and 6), run by the rows with a penalty or a temperature on (the
slowest program's: the largest fraction over the rows, as for every branch); the sampling
kernel's hash, run on the tiles holding a survivor (survivors / tiles of them, at least one tile of
a program's chunk); a running top-k's merge (logprobs' top K, top-k/top-p stage 1's list),
run on the tiles holding a new one of its k largest so far, for logits in random order
(`cost_model.shares.record_tiles`), here among the tiles it reads; the reductions of a
tile the table does not know, run on the unknown share of the tiles read (a walk over the
tiles `library.tiles_to_visit` lists counts those alone: its walks a row are their share).
Tiles marked unknown (+inf) are those step 7's saturated tokens fall in, at random columns,
and those where a biased, stop or banned token held the tile's max
(`cost_model.processing.unknown_tiles`); the sampling kernel's few-survivors path, run on the
hashed tiles of a top-k row holding at most FEW_SURVIVORS of its survivors (spread over the row's
tiles, Poisson). The block is found in the SASS as the instructions a
predicated branch at the `if`'s line jumps over (an else-block where the source lines it
holds are the else's), its else-block by the rest of the fraction; each instruction counts with
the product of the fractions of the blocks holding it.

Limits: static (the SASS is counted, every other branch inside a loop as taken, and no
kernel runs), no caches (every byte is an HBM byte, though the logits of a small batch sit in the
50 MB L2 between kernels), no overlap of an unpipelined loop's loads with its compute,
warps issue at the full rate, the same clock under load, and no GPU: the figures to believe
are the GPU check's. perf/README.md, "Cost model (estimate)", has the assumptions and their sources.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

# perf/ is not a package: its package cost_model/ is found through this script's folder,
# which is on sys.path when the script runs and must be put there when it is imported
HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from cost_model.access import SEARCH_PASSES, WORK, generic_work, row_bytes  # noqa: E402
from cost_model.aten_ops import AtenCounter, AtenOp  # noqa: E402
from cost_model.bench_rows import ROWS as BENCH_ROWS  # noqa: E402
from cost_model.context import tells_later  # noqa: E402
from cost_model.machine import (  # noqa: E402
    GPUS,
    H200,
    Gpu,
    aten_time,
    ctas_per_sm,
    gpu_for_device,
    launch_time,
)
from cost_model.sass import Compiler, Variant, loop_stages, pipeline_stages  # noqa: E402

DEFAULT_ROWS = (1, 64, 256)
DEFAULT_VOCAB = 151_936
DEFAULT_CASES = ("all", "top_k_top_p")


def assumptions(gpu: Gpu = H200) -> dict[str, Any]:
    """Every figure and rule the estimate rests on, printed with each report."""
    stages = pipeline_stages()
    return {
        **asdict(gpu),
        "achievable_bandwidth_tbps": round(gpu.bytes_per_us / 1e6, 3),
        "search_passes_unsettled": SEARCH_PASSES,
        "logprobs_second_pass": "never (rare: a token within an ulp of the sampled one)",
        "filters_reads": f"counted on {BENCH_ROWS} of the GPU check's rows (bench_rows.py)",
        "branches_in_loops": "all taken (static SASS count: an upper bound)",
        "caches": "none: every byte is an HBM byte",
        "programmatic_dependent_launch": (
            "compiled as sm_90 launches it (on), but every launch still costs the full "
            "launch overhead: the overlap it buys is not modelled (the GPU check times the "
            "step with it and without)"
        ),
        "loads": (
            "a loop whose SASS copies its loads asynchronously (LDGSTS) is pipelined S "
            f"stages deep (its num_stages, {stages} unless it names another): after the "
            "first tile, each tile costs the larger of its compute and latency / (S - 1); "
            "any other loop waits one latency a tile"
        ),
    }


# ---------------------------------------------------------------------------- recording


@contextmanager
def _triton_on_cpu(num_sms: int) -> Iterator[None]:
    """Lift the Triton backend's refusal of a CPU device without the interpreter
    (`config.triton_available`, also imported by perf/gpu/targets.py): in this process
    nothing runs on the device, every launch is recorded instead. And split the rows of the
    kernels that split them (processing, top-k/top-p, sampling, logprobs) as on a GPU of
    `num_sms` SMs (off CUDA the pipeline does not split), and launch them with programmatic
    dependent launch, as on sm_90 (`cuda_compile.hopper_launches`)."""
    import gpu.targets

    import graphsafe_sampler.config as config
    import graphsafe_sampler.pipelines.triton_pipeline as pipeline
    from graphsafe_sampler.kernels.logits_processing import process_splits
    from graphsafe_sampler.kernels.logprobs import logprobs_splits
    from graphsafe_sampler.kernels.sampling import sample_splits
    from graphsafe_sampler.kernels.top_k_top_p import top_k_top_p_splits

    splitters: dict[str, Callable[..., int]] = {
        "sample_splits": sample_splits,
        "top_k_top_p_splits": top_k_top_p_splits,
        "logprobs_splits": logprobs_splits,
        "process_splits": process_splits,
    }
    from cuda_compile import hopper_launches

    saved = config.triton_available, gpu.targets.triton_available
    config.triton_available = gpu.targets.triton_available = lambda device: True
    for name, splitter in splitters.items():
        setattr(
            pipeline, name, lambda rows, vocab, device, f=splitter: f(rows, vocab, device, num_sms)
        )
    try:
        with hopper_launches():
            yield
    finally:
        config.triton_available, gpu.targets.triton_available = saved
        for name, splitter in splitters.items():
            setattr(pipeline, name, splitter)


def record_step(case: str, rows: int, vocab: int, num_sms: int = H200.sms) -> list[Any]:
    """The step's events in order: each Triton launch (a cuda_compile `Launch`) and each
    aten op outside the kernels (an `AtenOp`), from one `sampler(logits)` of the GPU check's
    Sampler for (case, rows, vocab), nothing run on a device."""
    from cuda_compile import Recorder
    from gpu.cases import case_logprobs
    from gpu.measure import SamplerPool
    from triton.runtime.jit import JITFunction

    cpu = torch.device("cpu")
    events: list[Any] = []
    recorder = Recorder()
    recorder.label = f"{case} R{rows}"

    def run(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        recorder.run(self, *args, grid=grid, warmup=warmup, **kwargs)
        events.append(recorder.launches[-1])

    with _triton_on_cpu(num_sms):
        pool = SamplerPool(cpu, rows, seed=0)
        sampler = pool.get(vocab, case_logprobs(case), "triton")
        if isinstance(sampler, str):
            raise RuntimeError(sampler)
        pool.load(sampler, case, rows)
        logits = torch.zeros(rows, vocab)  # never read: no kernel runs
        original = JITFunction.run
        JITFunction.run = run
        try:
            with AtenCounter(rows, vocab, events, lambda: len(recorder.launches)):
                sampler(logits)
        finally:
            JITFunction.run = original
    return events


# ---------------------------------------------------------------------------- the model


def _launch_entry(
    launch: Any,
    variant: Variant,
    rows: int,
    vocab: int,
    gpu: Gpu,
    context: dict[str, Any] | None = None,  # what earlier launches of the step tell later ones
) -> dict[str, Any]:
    programs = math.prod(launch.grid)
    model = WORK.get(launch.kernel.__name__)
    args = {**launch.args, **(context or {})}  # the extras are the model's, never bytes
    work = model(args, launch.constexprs) if model else generic_work(variant, programs)
    read = written = logits = 0.0
    for name, value in launch.args.items():
        if not isinstance(value, torch.Tensor):
            continue
        row = row_bytes(value)
        # an argument the table does not name: one row read per program
        r = float(work.reads[name].sum()) * row if name in work.reads else programs * row
        w = float(work.writes[name].sum()) * row if name in work.writes else 0.0
        read, written = read + r, written + w
        if tuple(value.shape) == (rows, vocab):
            logits += r + w
    block = launch.constexprs.get("BLOCK_SIZE") or 1
    # a kernel that splits its rows scans `chunk` columns a program (sampling)
    tiles = math.ceil(int(launch.args.get("chunk", vocab)) / block)
    loops = []
    # the slowest program's branch fractions: the largest over the rows
    taken = {where: float(fraction.max()) for where, fraction in work.taken.items()}
    # (file, line) -> the largest expected body there, and its pipeline stages (1: none)
    tile_loops: dict[tuple[str, int], tuple[float, int]] = {}
    # (file, line) -> the most iterations a program makes of a counted loop (not a tile
    # loop; work.Work.trips), its largest expected body and its pipeline stages
    counted: dict[tuple[str, int], tuple[float, float, int]] = {}
    for loop in variant.loops:
        key = (loop.file, loop.line)
        walks = work.walks.get(key)
        trips = work.trips.get(key)
        expected = loop.instructions_with(taken)
        entry = replace(
            loop,
            walks_per_row=float(walks.max()) if walks is not None else 0.0,
            trips=float(trips.max()) if trips is not None and not loop.tile_loop else 0.0,
            expected_instructions=round(expected, 1),
        )
        loops.append(entry)
        stages = loop_stages(loop.source) if loop.pipelined else 1
        if loop.tile_loop and entry.walks_per_row:
            largest, fewest = tile_loops.get(key, (0.0, stages))
            tile_loops[key] = (max(largest, expected), min(fewest, stages))
        if entry.trips:
            _, largest, fewest = counted.get(key, (0.0, 0.0, stages))
            counted[key] = (entry.trips, max(largest, expected), min(fewest, stages))
    # the slowest program sets the wave's end: the most walks of any row, loop by loop
    serial = [
        (float(work.walks[key].max()) * tiles, instructions, stages)
        for key, (instructions, stages) in tile_loops.items()
    ]
    ctas = ctas_per_sm(variant.num_warps, variant.registers, variant.shared_bytes, gpu)
    # outside the tile loops: the longest path of the code a program runs, leaving out the
    # loops no row runs (the redo pass, a settled row's search, a sparse table's blocks past
    # its first: the access table names them) and the `if` around them
    unwalked = {
        (e.file, e.line)
        for e in loops
        if (e.tile_loop and not e.walks_per_row)
        or ((e.file, e.line) in work.walks and not float(work.walks[e.file, e.line].max()))
    }
    # and the `if`s the access table takes no row through (a rare path), in any loop
    untaken = {where for where, fraction in work.taken.items() if not float(fraction.max())}
    # and the else-blocks of those it takes every row through (a covered row's race: the
    # uncovered rows' arrival and merge)
    always = {where for where, fraction in work.taken.items() if float(fraction.min()) == 1}
    path = variant.straight_line(unwalked, untaken, set(counted), always)
    # a split row's merge, run by the row's last program to arrive (where, in some row, every
    # issuing program runs it, it is charged to all): the others' path leaves it out
    merges = {w: float(share.max()) for w, share in work.merging.items()}
    merges = {w: share for w, share in merges.items() if 0 < share < 1}
    merging = None
    if merges:
        others = variant.straight_line(unwalked, untaken | set(merges), set(counted), always)
        merging = (others.instructions, max(merges.values()))
    timing = launch_time(
        read + written, programs, ctas, variant.num_warps, serial, gpu, path.load_rounds,
        path.instructions, list(counted.values()), work.issuing(programs), merging,
    )  # fmt: skip
    return {
        "kind": "triton",
        "name": launch.kernel.__name__,
        "constexprs": launch.constexprs,
        "grid": list(launch.grid),
        "programs": programs,
        "num_warps": variant.num_warps,
        "registers": variant.registers,
        "spill_bytes": variant.spill_bytes,
        "shared_bytes": variant.shared_bytes,
        "ctas_per_sm": ctas,
        "access_model": "table" if model else "generic",
        "read_bytes": round(read),
        "write_bytes": round(written),
        "logits_passes": logits / (rows * vocab * 4),
        "loops": [asdict(loop) for loop in loops],
        "load_rounds": path.load_rounds,
        "straight_instructions": path.instructions,
        # a program's that does not merge (None: every program merges, or none does)
        "merge_free_instructions": merging[0] if merging else None,
        **asdict(timing),
    }


def _aten_entry(op: AtenOp, rows: int, vocab: int, gpu: Gpu) -> dict[str, Any]:
    timing = aten_time(op.read_bytes + op.write_bytes, gpu)
    return {
        "kind": "aten",
        "name": op.name,
        "read_bytes": op.read_bytes,
        "write_bytes": op.write_bytes,
        "logits_passes": op.logits_bytes / (rows * vocab * 4),
        **asdict(timing),
    }


def model_step(
    case: str, rows: int, vocab: int, compiler: Compiler, gpu: Gpu = H200
) -> dict[str, Any]:
    """One (case, rows): its launches in order, and the step's totals."""
    launches, free = [], []
    context: dict[str, Any] = {}
    for event in record_step(case, rows, vocab, gpu.sms):
        if isinstance(event, AtenOp):
            if event.launches:
                launches.append(_aten_entry(event, rows, vocab, gpu))
            else:
                free.append(event.name)
            continue
        launches.append(_launch_entry(event, compiler.get(event), rows, vocab, gpu, context))
        context.update(tells_later(event, context, vocab))
    triton_launches = sum(1 for entry in launches if entry["kind"] == "triton")
    return {
        "launches": launches,
        "step": {
            "launches": len(launches),
            "triton_launches": triton_launches,
            "aten_launches": len(launches) - triton_launches,
            "aten_ops_without_kernel": free,
            "logits_passes": sum(entry["logits_passes"] for entry in launches),
            "read_bytes": sum(entry["read_bytes"] for entry in launches),
            "write_bytes": sum(entry["write_bytes"] for entry in launches),
            "est_us": sum(entry["est_us"] for entry in launches),
        },
    }


@contextmanager
def at_temperature(value: float | None) -> Iterator[None]:
    """Every case's requests at temperature `value` (None: the GPU check's own)."""
    import gpu.measure

    original = gpu.measure.bench_params
    if value is not None:
        gpu.measure.bench_params = lambda *args: replace(original(*args), temperature=value)
    try:
        yield
    finally:
        gpu.measure.bench_params = original


def build_model(
    rows: Sequence[int] = DEFAULT_ROWS,
    vocab: int = DEFAULT_VOCAB,
    cases: Sequence[str] = DEFAULT_CASES,
    gpu: Gpu = H200,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    temperature: float | None = None,  # every request's (None: the GPU check's cases')
) -> dict[str, Any]:
    """The model as data (the `--json` document). Needs a process where Triton is not in
    interpreter mode: tests/cuda_compile.py, imported first, turns the interpreter off."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import cuda_compile  # noqa: F401  (before Triton: it sets TRITON_INTERPRET=0)

    compiler = Compiler(log)
    result: dict[str, Any] = {
        "schema": 1,
        "estimate": True,
        "gpu": gpu.name,
        "vocab": vocab,
        "assumptions": assumptions(gpu),
        "cases": {},
    }
    result["assumptions"]["temperature"] = "the cases' own" if temperature is None else temperature
    for case in cases:
        for b in rows:
            log(f"recording {case} B={b} V={vocab}")
            with at_temperature(temperature):
                step = model_step(case, b, vocab, compiler, gpu)
            result["cases"].setdefault(case, {})[str(b)] = step
    return result


# ---------------------------------------------------------------------------- the report


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f}"


def format_report(model: dict[str, Any]) -> str:
    out = [f"Triton step on {model['gpu']}: cost model, an ESTIMATE (not a measurement)", ""]
    out.append("Assumptions (estimate):")
    out += [f"  {k} = {v}" for k, v in model["assumptions"].items()]
    header = (
        f"  {'#':>2}  {'launch':<28} {'grid':>6} {'warps':>5} {'regs':>4} {'spill':>5} "
        f"{'smem':>6} {'CTA/SM':>6} {'waves':>5} {'read MB':>8} {'write MB':>8} "
        f"{'passes':>6} {'mem µs':>7} {'serial µs':>9} {'est µs':>7}"
    )
    for case, by_rows in model["cases"].items():
        for b, data in by_rows.items():
            out += ["", f"[{case}] B={b} V={model['vocab']:,} (estimate)", header]
            for i, e in enumerate(data["launches"], 1):
                if e["kind"] == "aten":
                    out.append(
                        f"  {i:>2}  {e['name']:<28} {'-':>6} {'-':>5} {'-':>4} {'-':>5} "
                        f"{'-':>6} {'-':>6} {'-':>5} {_mb(e['read_bytes']):>8} "
                        f"{_mb(e['write_bytes']):>8} {e['logits_passes']:>6.2f} "
                        f"{e['memory_us']:>7.2f} {'-':>9} {e['est_us']:>7.2f}"
                    )
                    continue
                grid = "x".join(map(str, e["grid"]))
                out.append(
                    f"  {i:>2}  {e['name']:<28} {grid:>6} {e['num_warps']:>5} "
                    f"{e['registers']:>4} {e['spill_bytes']:>5} {e['shared_bytes']:>6} "
                    f"{e['ctas_per_sm']:>6} {e['waves']:>5} {_mb(e['read_bytes']):>8} "
                    f"{_mb(e['write_bytes']):>8} {e['logits_passes']:>6.2f} "
                    f"{e['memory_us']:>7.2f} {e['serial_us']:>9.2f} {e['est_us']:>7.2f}"
                )
                constants = " ".join(f"{k}={v}" for k, v in e["constexprs"].items())
                out.append(f"      {constants}")
                out.append(
                    f"      outside the tile loops: {e['load_rounds']} round(s) of dependent "
                    f"loads, {e['straight_instructions']} instr on the longest path"
                    + (
                        f" ({e['merge_free_instructions']} without the merge)"
                        if e["merge_free_instructions"] is not None
                        else ""
                    )
                )
                for loop in e["loops"]:
                    per_element = (
                        f"{loop['instructions_per_element']:.2f} instr/elem "
                        f"({loop['elements_per_thread']:g} elem/thread), "
                        f"{loop['walks_per_row']:g} walk(s)/row"
                        if loop["instructions_per_element"] is not None
                        else f"{loop['trips']:g} trip(s) a program"
                        if loop["trips"]
                        else "not a tile loop"
                    )
                    expected = loop["expected_instructions"]
                    weighed = (
                        f" ({expected:g} expected)"
                        if expected is not None and expected != loop["instructions"]
                        else ""
                    )
                    out.append(
                        f"      loop {loop['file']}:{loop['line']} {loop['instructions']} instr"
                        f"{weighed}, {per_element}: {loop['source'][:60]}"
                    )
            s = data["step"]
            out.append(
                f"  step: {s['launches']} launches ({s['triton_launches']} Triton + "
                f"{s['aten_launches']} aten), {s['logits_passes']:.2f} logits passes, "
                f"{_mb(s['read_bytes'])} MB read, {_mb(s['write_bytes'])} MB written, "
                f"est {s['est_us']:.1f} µs; {len(s['aten_ops_without_kernel'])} aten ops "
                f"launch nothing"
            )
    return "\n".join(out)


def resolve_gpu(choice: str) -> Gpu:
    """`--gpu`: a preset by name, or with "auto" this machine's CUDA device
    (`machine.gpu_for_device`), the H200 where there is none (the GPU check passes "auto",
    so that on an H100 its estimates sit beside that H100's times)."""
    if choice != "auto":
        return GPUS[choice]
    import torch

    if not torch.cuda.is_available():
        return H200
    props = torch.cuda.get_device_properties(0)
    return gpu_for_device(props.name, props.multi_processor_count)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(DEFAULT_ROWS))
    parser.add_argument("--vocab", type=int, default=DEFAULT_VOCAB)
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES))
    parser.add_argument(
        "--gpu", choices=[*GPUS, "auto"], default="h200",
        help="the machine of the estimate (auto: this machine's CUDA device, else h200)",
    )  # fmt: skip
    parser.add_argument("--json", help="write the model (an estimate) here")
    parser.add_argument("--temperature", type=float, help="every request's, for what-ifs")
    args = parser.parse_args(argv)
    gpu = resolve_gpu(args.gpu)
    model = build_model(args.rows, args.vocab, args.cases, gpu, temperature=args.temperature)
    print(format_report(model), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(model, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
