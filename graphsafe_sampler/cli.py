"""`graphsafe-sampler`: the command line (`bench`, `compare`, `demo`).

    graphsafe-sampler bench                  # a short decode loop, table + JSON
    graphsafe-sampler bench --full           # every stage over the whole grid
    graphsafe-sampler compare BASE.json HEAD.json [--threshold 0.10]
    graphsafe-sampler demo ...               # see graphsafe_sampler/demo/

`main(argv)` returns the exit status: 0 fine, 1 a regression (compare), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable, Sequence

import torch

from graphsafe_sampler.bench.allocator import ALLOCATORS, use_allocator
from graphsafe_sampler.bench.results import DEFAULT_THRESHOLD

# The default run must finish in about 2 minutes on any machine, compile included, and
# every shape compiles the Sampler again: one shape, the compiled Sampler against the floor
# and the vLLM-style peer. Small on a CPU; on CUDA a decode batch at Llama 3's vocabulary.
CPU_DEFAULT_ROWS = (8,)
CPU_DEFAULT_VOCAB = (32_000,)
CUDA_DEFAULT_ROWS = (64,)
CUDA_DEFAULT_VOCAB = (128_256,)
DEFAULT_PROVIDERS = ("clone", "sampler-compiled", "vllm-style")
DEFAULT_STEPS = 10
FULL_ROWS = (1, 8, 64, 256)
FULL_VOCAB = (32_000, 128_256, 151_936)
FULL_DTYPES = ("float32", "bfloat16")
DEFAULT_JSON = "graphsafe-sampler-bench.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

RunCommand = Callable[[argparse.Namespace], int]


class _Formatter(argparse.HelpFormatter):
    """Appends "(default: ...)" to options that have a plain default; options whose default
    depends on the machine say so in their own help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type` that takes an integer >= minimum."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def _add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from graphsafe_sampler.bench.providers import ALL_STAGES, PROVIDERS

    parser.add_argument(
        "--stages",
        nargs="+",
        choices=ALL_STAGES,
        metavar="STAGE",
        help="cases to run: 'step' is the whole decode step over a churning batch; the others "
        f"time one stage alone ({', '.join(ALL_STAGES[1:])}). Default: step (--full: all)",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        type=_positive_int,
        metavar="N",
        help="batch rows; each value compiles the Sampler once more. Default: "
        f"{' '.join(map(str, CPU_DEFAULT_ROWS))} on CPU, "
        f"{' '.join(map(str, CUDA_DEFAULT_ROWS))} on CUDA: one shape, so that the default run "
        "ends in about 2 minutes with a cold inductor cache, the compile being most of it "
        f"(--full: {' '.join(map(str, FULL_ROWS))})",
    )
    parser.add_argument(
        "--vocab",
        nargs="+",
        type=_positive_int,
        metavar="V",
        help="vocabulary sizes. Default: "
        f"{' '.join(map(str, CPU_DEFAULT_VOCAB))} on CPU, "
        f"{' '.join(map(str, CUDA_DEFAULT_VOCAB))} on CUDA "
        f"(--full: {' '.join(map(str, FULL_VOCAB))})",
    )
    parser.add_argument(
        "--dtype",
        nargs="+",
        choices=sorted(_DTYPES),
        metavar="DTYPE",
        help="logits dtypes (float32, bfloat16, float16). Default: float32 "
        f"(--full: {' '.join(FULL_DTYPES)})",
    )
    parser.add_argument(
        "--providers",
        nargs="+",
        choices=PROVIDERS,
        metavar="NAME",
        help="implementations to time side by side: clone (logits.clone(), the floor), "
        "sampler-eager, sampler-compiled (torch.compile, fullgraph), vllm-style (the "
        "vLLM-V1-style eager peer), flashinfer (CUDA stage cases, when installed). Default: "
        f"{' '.join(DEFAULT_PROVIDERS)} (--full: all)",
    )
    parser.add_argument(
        "--steps",
        type=_positive_int,
        default=DEFAULT_STEPS,
        help="timed rounds per provider and case (decode steps for 'step'); the floor gets 5x",
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed rounds before timing (after compiling)"
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "torch", "triton"),
        default="auto",
        help="the Sampler's backend for 'step' (auto: Triton on CUDA, PyTorch elsewhere)",
    )
    parser.add_argument(
        "--device", default=None, help="torch device. Default: cuda if available, else cpu"
    )
    parser.add_argument(
        "--churn",
        type=_non_negative_float,
        default=0.1,
        help="probability that a request leaves the batch at each step (its row is refilled "
        "at once with new parameters)",
    )
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="torch intra-op threads (default: torch's choice, one per core). On a busy host "
        "every parallel op waits for descheduled workers (a 26 µs clone took 16 ms with 2 "
        "threads on a loaded 2-core machine): --threads 1 gives steadier numbers there",
    )
    parser.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default="heap",
        help="host allocator on a CPU, for every provider alike: 'heap' keeps freed memory in "
        "glibc's heap for reuse (no mmap, no trim), as an engine's caching allocator would; "
        "'system' leaves glibc as it is, and each step page-faults its [rows, V] buffers in "
        "again (perf/README.md) (default: heap)",
    )
    parser.add_argument(
        "--evict",
        type=_non_negative_int,
        default=0,
        metavar="MIB",
        help="write a buffer of MIB MiB on the device before each round, so that a round "
        "finds other data in the caches, as a decode step after the model's forward does, "
        "instead of the last round's: at least twice the last-level cache (lscpu's L3; a "
        "GPU's L2, where only the device's caches are evicted, not the host's). Every "
        "provider alike; 0 is off (default: 0)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds logits, requests and churn")
    parser.add_argument(
        "--json",
        default=DEFAULT_JSON,
        metavar="PATH",
        help="where to write the results (JSON, see `compare`); '-' writes none",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw µs/step against rows, one line per provider (needs matplotlib: "
        "pip install 'graphsafe-sampler[plot]')",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="the whole grid: every stage, rows x vocab x dtype as above, every provider "
        "(long on a CPU: one compile per stage and shape family)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _run_bench(args: argparse.Namespace) -> int:
    from graphsafe_sampler.bench.plot import plot_results, require_matplotlib
    from graphsafe_sampler.bench.providers import ALL_STAGES, PROVIDERS
    from graphsafe_sampler.bench.runner import GridSpec, format_table, run_grid

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available here")
    on_cuda = device.type == "cuda"
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.plot:
        require_matplotlib()  # before minutes of benchmarking, not after
    rows: Sequence[int]
    vocab: Sequence[int]
    dtypes: Sequence[str]
    stages: Sequence[str]
    providers: Sequence[str]
    if args.full:
        rows, vocab = FULL_ROWS, FULL_VOCAB
        dtypes, stages, providers = FULL_DTYPES, ALL_STAGES, PROVIDERS
    else:
        rows = CUDA_DEFAULT_ROWS if on_cuda else CPU_DEFAULT_ROWS
        vocab = CUDA_DEFAULT_VOCAB if on_cuda else CPU_DEFAULT_VOCAB
        dtypes, stages, providers = ("float32",), ("step",), DEFAULT_PROVIDERS
    grid = GridSpec(
        stages=tuple(args.stages or stages),
        rows=tuple(args.rows or rows),
        vocabs=tuple(args.vocab or vocab),
        dtypes=tuple(_DTYPES[d] for d in (args.dtype or dtypes)),
        providers=tuple(dict.fromkeys(args.providers or providers)),
        device=device,
        backend=args.backend,
        rounds=args.steps,
        warmup=args.warmup,
        seed=args.seed,
        churn=args.churn,
        evict_mib=args.evict,
    )
    if args.threads is not None:  # only once every argument is known to be good
        torch.set_num_threads(args.threads)
    # the GPU's buffers come from torch's caching allocator: the host's matters on a CPU only
    allocator = use_allocator(args.allocator if device.type == "cpu" else "system")
    out = sys.stdout
    print(
        f"graphsafe-sampler bench on {device} ({torch.get_num_threads()} threads, "
        f"{allocator} allocator): "
        f"stages {' '.join(grid.stages)}; rows {' '.join(map(str, grid.rows))}; "
        f"vocab {' '.join(map(str, grid.vocabs))}; "
        f"{' '.join(str(d).removeprefix('torch.') for d in grid.dtypes)}; "
        f"{grid.rounds} timed rounds each"
        + (f", {grid.evict_mib} MiB written before each" if grid.evict_mib else ""),
        file=out,
        flush=True,
    )
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > cores and torch.get_num_threads() > 1:
        print(
            f"note: the host is busy (1-minute load {load:.1f} on {cores} cores); times with "
            f"{torch.get_num_threads()} threads will be noisy, --threads 1 is steadier",
            file=out,
        )
    start = time.perf_counter()
    results, skipped = run_grid(grid, progress=not args.quiet)
    results.context["wall_s"] = round(time.perf_counter() - start, 3)
    results.context["allocator"] = allocator
    print(format_table(results), file=out)
    for note in skipped:
        print(f"skipped: {note}", file=out)
    compile_s = [c.extra["compile_s"] for c in results.cases if "compile_s" in c.extra]
    print(
        f"µs/call: median of {grid.rounds} rounds; x floor: time / logits.clone() time; "
        f"x vllm: time / the vLLM-style peer's (below 1 is faster). "
        f"{results.context['wall_s']:.0f} s in all"
        + (f", {sum(compile_s):.0f} s of it compiling" if compile_s else "")
        + f"; host load {results.context['load_avg_1min']} (1 min).",
        file=out,
    )
    if args.json != "-":
        results.write(args.json)
        print(f"wrote {os.path.abspath(args.json)}", file=out)
    if args.plot:
        plot_results(results, args.plot)
        print(f"wrote {os.path.abspath(args.plot)}", file=out)
    return 0


def _add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", metavar="BASE.json", help="results of the base run")
    parser.add_argument("head", metavar="HEAD.json", help="results of the head run")
    parser.add_argument(
        "--threshold",
        type=_non_negative_float,
        default=DEFAULT_THRESHOLD,
        help="a case regresses when its time / floor grows by more than this fraction",
    )


def _run_compare(args: argparse.Namespace) -> int:
    from graphsafe_sampler.bench.results import (
        Results,
        compare,
        format_comparison,
        has_regression,
    )

    base, head = Results.read(args.base), Results.read(args.head)
    comparisons = compare(base, head, args.threshold)
    for label, results in (("base", base), ("head", head)):
        ctx = results.context
        print(
            f"{label}: {ctx.get('device_name')}, torch {ctx.get('torch')}, "
            f"commit {ctx.get('commit')}, {ctx.get('created')}"
            + (f", --evict {ctx['evict_mib']}" if ctx.get("evict_mib") else "")
        )
    if (base.context.get("evict_mib") or 0) != (head.context.get("evict_mib") or 0):
        print("note: base and head ran with a different --evict; their ratios differ by more")
        print("      than the change: cold caches slow a small step more than its peers")
    print(format_comparison(comparisons, args.threshold))
    return 1 if has_regression(comparisons) else 0


def _add_demo_command(subparsers: argparse._SubParsersAction) -> None:
    help_text = "an end-to-end decode demo (graphsafe_sampler/demo/)"
    try:
        # Another part of the package, built separately: the CLI must work without it.
        demo = importlib.import_module("graphsafe_sampler.demo")
    except ImportError as err:
        reason = str(err)
        parser = subparsers.add_parser(
            "demo", help=f"{help_text}: unavailable in this build", formatter_class=_Formatter
        )

        def unavailable(args: argparse.Namespace) -> int:
            print(f"graphsafe-sampler demo is unavailable: {reason}", file=sys.stderr)
            return 2

        parser.set_defaults(run=unavailable)
        return
    parser = subparsers.add_parser(
        "demo", help=help_text, description=demo.__doc__, formatter_class=_Formatter
    )
    demo.add_demo_arguments(parser)
    parser.set_defaults(run=demo.run_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphsafe-sampler",
        description="graphsafe-sampler: an LLM sampler that lives inside a compiled model "
        "runner and a captured CUDA graph. Benchmarks, the regression gate and a demo.",
        formatter_class=_Formatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench = subparsers.add_parser(
        "bench",
        help="time the sampler against the floor and a vLLM-style peer; table + JSON",
        description="Builds a Sampler on the best backend for the device and runs a short "
        "decode loop over a churning persistent batch (requests join and leave with mixed "
        "sampling parameters), side by side with logits.clone() (the floor) and a "
        "vLLM-V1-style eager sampler. Prints a table (µs per step, tokens/s, GB/s, ratio to "
        "the floor and to the vLLM-style peer) and writes the results as JSON for "
        "`graphsafe-sampler compare`. On a CPU the default is one small shape, so that the "
        "run, torch.compile of the Sampler included, ends in about 2 minutes on 2 cores "
        "(the compile is most of it, warm cache or not: torch 2.13's inductor does not "
        "cache graphs that hold torch.cond).",
        formatter_class=_Formatter,
    )
    _add_bench_arguments(bench)
    bench.set_defaults(run=_run_bench)
    compare = subparsers.add_parser(
        "compare",
        help="base vs head results: exit 1 on a regression beyond the threshold",
        description="Compares two `bench` JSON files case by case. The metric is each case's "
        "time divided by the floor (logits.clone()) of its own run, so a busier or faster "
        "machine moves both sides alike. Cases missing on one side are listed, not errors. "
        "Exit status: 0 no regression, 1 a regression, 2 unreadable input.",
        formatter_class=_Formatter,
    )
    _add_compare_arguments(compare)
    compare.set_defaults(run=_run_compare)
    _add_demo_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(None if argv is None else list(argv))
    run: RunCommand = args.run
    try:
        return run(args)
    except (ValueError, TypeError, NotImplementedError, RuntimeError, OSError) as err:
        print(f"graphsafe-sampler {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
