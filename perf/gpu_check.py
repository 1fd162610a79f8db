#!/usr/bin/env python
"""The GPU check: one command that proves the Sampler on a real GPU and times it.

    python perf/gpu_check.py OUT_DIR [--budget-s 280] [--skip tests ...] [--cpu-smoke]

The environment report, then the parts in this order, each in its own subprocess with its
own timeout (so a hang, a crash or a slow compile costs that part only), each writing its
results as it goes:

    env         environment report (torch, triton, CUDA, driver, GPU, FlashInfer) -> env.json
    kernels     every kernel variant the package launches (tests/cuda_compile.py's list),
                compiled and run once on CUDA at a tiny shape: a compile failure shows
                first, alone, with its variant -> kernels.json
    graph       real `torch.cuda.CUDAGraph` capture of `Sampler.forward` (every feature on),
                replayed for --steps steps of random batch churn against an eager twin fed
                the same updates and logits, under `torch.cuda.set_sync_debug_mode("error")`,
                per backend and logprobs mode; plus `graphsafe_sampler.testing.
                check_graph_safety` on CUDA -> graph_check.json
    spec        speculative decoding's verification step, `RejectionSampler.forward`
                (S = 4): captured the same way and replayed for --steps steps of churn
                against an eager twin (drafts, counts, grammar masks per position, a
                commit mask), per backend, with draft_probs and without (n-gram drafts)
                -> graph_check.json; then the step timed at rows 64 first, the other
                grid rows after while its time lasts (vocab: the first of --vocabs),
                beside the floor (a captured copy of the target logits)
                -> appended to bench.json, bench.md (stage "rejection")
    tests       pytest on CUDA with TRITON_INTERPRET=0 (the tests that take the `device`
                fixture, and the kernel tests: the Sampler and RejectionSampler suites on
                the Triton backend among them) -> pytest.log, pytest.xml, tests.json
    bench       the table, rows x vocab x case (GPU default: B 1, 64, 256 at V 151,936,
                cases top_k_top_p and all), smallest shapes first, on graph replay with
                `triton.testing.do_bench_cudagraph`: the floors (a copy of the logits, and
                `amax(-1)`, one read of them), the Sampler eager and (second pass)
                compiled, each Triton launch of the step alone, and the vLLM-V1-style
                eager peer (timed eagerly, as vLLM runs its sampler) -> bench.json,
                bench.md
    flashinfer  FlashInfer's sampling functions on the same grid, when importable, each
                capped in time -> appended to bench.json, bench.md
    compiled    `torch.compile(fullgraph=True)` of the step, captured by hand in a CUDA
                graph, replayed against an eager twin -> graph_check.json

Beside the parts, on the CPU, perf/kernel_model.py computes its estimate of every launch
of the step for the grid (no device time; model.json, model.log); bench.md puts each
kernel's estimate beside its time, labelled as the estimate it is.

`summary.json` says what ran, for how long, and how it ended ("passed", "failed",
"incomplete", "timeout", "error", "skipped" with the reason). The exit status is 0 when
every part that ran passed (benchmarks pass when every case they started was timed); a part
that raised is an error, never a skip.

Time: the whole run stays under --budget-s (default 280: about 5 minutes with cold Triton
and inductor caches) plus about 15 s of interpreter start-up. Each part gets a share of
what is left (`allot`), so time a part leaves unused flows to the later ones; a part whose
allotment falls below its minimum is skipped with the reason. Inside a part, loops stop at
the part's deadline (recorded as "incomplete") and the subprocess is killed a few seconds
later if something cannot be interrupted (a compile). Benchmarks run smallest shape first,
so a cut run loses the biggest shapes.

Without a GPU, the CUDA parts are recorded as skipped ("no CUDA device"). `--cpu-smoke`
runs the CPU-side versions instead, at tiny sizes: the same replay comparison with `make_fx`
traces in place of CUDA graphs (and `SyncOpDetector` in place of the sync debug mode), the
benchmark grid timed with a wall-clock timer, and the same result files.

The code is the package `perf/gpu/` (its `__init__` lists the modules, one concern each);
this file is the entry point, and a part's subprocess runs it again with `--part`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# perf/ is not a package: its package gpu/ is found through this script's folder, which is
# on sys.path when the script runs and must be put there when it is imported (the tests).
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from gpu.run import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
