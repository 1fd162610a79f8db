"""Where a decode step's time goes on a CPU: inductor's kernel profile, or aten's ops eagerly.

    .venv/bin/python perf/profile_step.py --rows 1 --vocab 151936 --steps 100
    .venv/bin/python perf/profile_step.py --rows 1 --vocab 151936 --steps 40 --eager
    .venv/bin/python perf/profile_step.py --rows 1 --vocab 151936 --steps 100 --evict 64

Builds the `graphsafe-sampler bench` step case (the churning batch, every feature on),
compiles `Sampler.forward` with inductor's per-kernel profiling on (`--eager`: runs it
uncompiled), runs `--steps` profiled steps after a warm-up, and prints the kernels and ops
by total CPU time, with the step's median wall time beside. A profile, not a benchmark:
the records cost a few µs each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile

from graphsafe_sampler.bench.allocator import ALLOCATORS, use_allocator
from graphsafe_sampler.bench.providers import CaseSpec, build_bench
from graphsafe_sampler.bench.timing import eviction_buffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--top", type=int, default=40, help="rows of the table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--eager", action="store_true", help="profile the uncompiled step (aten's ops)"
    )
    parser.add_argument(
        "--loop",
        type=int,
        default=0,
        help="instead of profiling, run this many plain steps (for `perf record -p PID`)",
    )
    parser.add_argument(
        "--evict",
        type=int,
        default=0,
        metavar="MIB",
        help="write a buffer of MIB MiB before each step (with --loop too), as "
        "`graphsafe-sampler bench --evict` does: the step's caches cold, as after a model's "
        "forward (its aten::neg_ is one row of the table)",
    )
    parser.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default="heap",
        help="the host allocator, as `graphsafe-sampler bench --allocator` (default: heap, "
        "the bench's: without it a large shape's profile is mostly page faults)",
    )
    args = parser.parse_args()
    if args.evict < 0:
        parser.error(f"--evict must be >= 0, got {args.evict}")
    print(f"allocator: {use_allocator(args.allocator)}")

    # per-kernel records (and a context guard a kernel): only for the profile
    inductor_config.cpp.enable_kernel_profile = not args.loop
    spec = CaseSpec("step", args.rows, args.vocab, torch.float32, torch.device("cpu"), args.seed)
    print(f"{'building' if args.eager else 'compiling'} {args.rows} x {args.vocab} ...", flush=True)
    bench = build_bench(spec, "sampler-eager" if args.eager else "sampler-compiled")
    for _ in range(args.warmup):
        bench.run(*bench.setup())
    evict = eviction_buffer(args.evict)
    if args.loop:
        print(f"looping {args.loop} steps", flush=True)
        for _ in range(args.loop):
            if evict is not None:
                evict.neg_()
            bench.run(*bench.setup())
        return
    walls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            if evict is not None:
                evict.neg_()
            inputs = bench.setup()
            start = time.perf_counter()
            bench.run(*inputs)
            walls.append(time.perf_counter() - start)
    print(f"step (profiled): median {statistics.median(walls) * 1e6:,.0f} µs over {args.steps}")
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
    print(table)


if __name__ == "__main__":
    main()
