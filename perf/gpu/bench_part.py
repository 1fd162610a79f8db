"""The bench part: the floor and the Sampler per backend, eager then compiled, each timed
on graph replay over the grid, smallest shapes first; and the top-k/top-p kernel alone."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphsafe_sampler import Sampler
from graphsafe_sampler.bench import stages
from graphsafe_sampler.bench.results import FLOOR_PROVIDER, run_context
from graphsafe_sampler.kernels.dependent_launch import PDL_ENV, pdl_supported

from .book import BenchBook, case_result
from .cases import (
    CANDIDATE_CASES,
    CANDIDATES_PROVIDER,
    KERNEL_PROVIDER,
    NO_PDL,
    NO_STORE_PROVIDER,
    VLLM_STYLE,
    case_grid,
    case_logprobs,
    compiled_order,
    provider_name,
)
from .device import cuda_alive, observed_launches, sync
from .environment import flashinfer_version
from .measure import (
    MAX_FAILURES_IN_A_ROW,
    LogitsCache,
    PeerPool,
    SamplerPool,
    Timer,
    time_floor,
)
from .options import Options

EAGER_PASS_SHARE = 0.55
"""Of the bench part's time, what the eager pass may take when a compiled pass follows."""
COMPILE_ESTIMATE_S = 60.0
"""Assumed cost of a Sampler compile until one has been measured in the run."""


def run_bench_part(opts: Options, deadline: float) -> dict[str, Any]:
    """Pass 1: the floor and the eager Sampler (each backend), graph-captured, over the whole
    grid. Pass 2, in the time left: the compiled Sampler, graph-captured (compiled_order)."""
    device = opts.device()
    started = time.monotonic()
    timer = Timer(device, opts.rep_ms, opts.cpu_rounds)
    context = run_context(device, suite="perf/gpu_check.py", timer=timer.name, rep_ms=opts.rep_ms,
                          flashinfer=flashinfer_version())  # fmt: skip
    book = BenchBook(opts, context)
    grid = case_grid(opts.rows, opts.vocabs, opts.cases)
    logits = LogitsCache(device, max(opts.rows), opts.seed)
    pool = SamplerPool(device, max(opts.rows), opts.seed)
    peers = PeerPool(device, pool)
    cuda = device.type == "cuda"
    compiling = cuda or opts.smoke_compile
    # The eager pass may take EAGER_PASS_SHARE of the part when a compiled pass follows.
    eager_until = started + (deadline - started) * (EAGER_PASS_SHARE if compiling else 1.0)
    incomplete = False
    broken = False
    failures: dict[str, int] = {}  # provider -> errors in a row

    def measure(label: str, fn: Callable[[], None], provider: str) -> None:
        """Run one measurement; an error is recorded and the part goes on. A provider that
        failed MAX_FAILURES_IN_A_ROW times in a row is not tried again."""
        nonlocal broken
        if failures.get(provider, 0) >= MAX_FAILURES_IN_A_ROW:
            return
        try:
            fn()
            failures[provider] = 0
        except Exception as exc:
            book.error(label, exc)
            failures[provider] = failures.get(provider, 0) + 1
            if failures[provider] == MAX_FAILURES_IN_A_ROW:
                book.note(
                    f"{provider} failed {MAX_FAILURES_IN_A_ROW} times in a row: not tried again"
                )
            if not cuda_alive(device):
                broken = True
                book.note("the CUDA context broke; the rest of the part was not run")

    for rows, vocab, case in grid:
        if broken:
            break
        if time.monotonic() > eager_until:
            book.note(f"eager pass stopped at {case} R{rows}-V{vocab}: its time was up")
            incomplete = True
            break
        x = logits.get(rows, vocab)
        if not book.floor_of(rows, vocab):
            floor = functools.partial(time_floor, book, timer, x)
            measure(f"floor R{rows}-V{vocab}", floor, FLOOR_PROVIDER)
        for backend in opts.backends:
            sampler = pool.get(vocab, case_logprobs(case), backend)
            kind = "sampler" if backend == "torch" else "sampler-triton"
            if isinstance(sampler, str):
                book.note(f"{provider_name(kind, device)}: {sampler}")
                continue

            def run(sampler: Sampler = sampler, kind: str = kind, x: torch.Tensor = x,
                    rows: int = rows, vocab: int = vocab, case: str = case,
                    backend: str = backend) -> None:  # fmt: skip
                update_s = pool.load(sampler, case, rows)
                timed = timer(lambda: sampler(x))
                extra = {"backend": backend, "max_num_logprobs": sampler.config.max_num_logprobs,
                         "update_s": round(update_s, 3)}  # fmt: skip
                if backend == "triton":  # whether programmatic dependent launch was on
                    extra["pdl"] = pdl_supported(device)
                book.add(case_result(case, provider_name(kind, device), rows, vocab, timed, extra))

            name = provider_name(kind, device)
            measure(f"{case} {name} R{rows}-V{vocab}", run, name)
            # the same step with programmatic dependent launch off, where it is on: at the
            # smallest rows only, where launches weigh most (its variants compile anew, a
            # few seconds a shape out of the part's budget)
            pdl_shape = rows == min(opts.rows) and case in CANDIDATE_CASES
            if backend == "triton" and pdl_shape and pdl_supported(device):
                off = functools.partial(_time_without_pdl, book, timer, pool, sampler, x, case)
                measure(f"{case} {NO_PDL} R{rows}-V{vocab}", off, NO_PDL)
            # the Triton step kernel by kernel (on the interpreter: one shape, it is slow)
            smoke_kernels = rows == min(opts.rows) and case == CANDIDATE_CASES[-1]
            if backend == "triton" and case in CANDIDATE_CASES and (cuda or smoke_kernels):
                each = functools.partial(_time_kernels, book, timer, sampler, x, case)
                measure(f"{case} {KERNEL_PROVIDER}* R{rows}-V{vocab}", each, KERNEL_PROVIDER)
        peer = peers.get(vocab, case_logprobs(case))
        if isinstance(peer, str):
            book.note(f"{VLLM_STYLE}: {peer}")
        else:
            vllm = functools.partial(_time_peer, book, timer, pool, peer, x, case)
            measure(f"{case} {VLLM_STYLE} R{rows}-V{vocab}", vllm, VLLM_STYLE)
        # on the interpreter (--cpu-smoke) the buffer costs seconds a row: one shape only
        smoke_shape = rows == min(opts.rows) and case == CANDIDATE_CASES[-1]
        if case in CANDIDATE_CASES and "triton" in opts.backends and (cuda or smoke_shape):
            ab = functools.partial(_time_candidates, book, timer, x, case)
            measure(f"{case} {CANDIDATES_PROVIDER} R{rows}-V{vocab}", ab, CANDIDATES_PROVIDER)

    if compiling and not broken and "torch" in opts.backends:
        incomplete |= _compiled_pass(opts, deadline, grid, book, timer, logits, pool, measure)
    errors = book.results.context.get("errors")
    status = "error" if broken else "failed" if errors else "incomplete" if incomplete else "passed"
    return {"status": status, "cases": len(book.results.cases), "errors": len(errors or [])}


def _time_peer(
    book: BenchBook, timer: Timer, pool: SamplerPool, peer: Any, x: torch.Tensor, case: str
) -> None:
    """The vLLM-V1-style eager peer on the case's requests, timed eagerly (vLLM runs its
    sampler after the graph; it syncs with the host); it writes into its logits, so each
    call copies them first (the copy floor of the shape)."""
    rows, vocab = x.shape
    pool.load(peer, case, rows)
    logits = torch.empty_like(x)
    timed = timer(lambda: peer(logits.copy_(x)), eager=True)
    extra = {"includes": "a copy of the logits (the peer writes into them)"}
    book.add(case_result(case, VLLM_STYLE, rows, vocab, timed, extra))


def _time_without_pdl(
    book: BenchBook, timer: Timer, pool: SamplerPool, sampler: Sampler, x: torch.Tensor,
    case: str,
) -> None:  # fmt: skip
    """The Triton Sampler's step with programmatic dependent launch off (GRAPHSAFE_SAMPLER_PDL
    =0 while it is captured and timed; its variants compile on the first call, untimed),
    provider `NO_PDL`, beside the same step with it on."""
    rows, vocab = x.shape
    saved = os.environ.get(PDL_ENV)
    os.environ[PDL_ENV] = "0"
    try:
        update_s = pool.load(sampler, case, rows)
        sampler(x)  # compiles the variants without PDL, outside the capture
        sync(timer.device)
        timed = timer(lambda: sampler(x))
    finally:
        if saved is None:
            del os.environ[PDL_ENV]
        else:
            os.environ[PDL_ENV] = saved
    extra = {"backend": "triton", "max_num_logprobs": sampler.config.max_num_logprobs,
             "update_s": round(update_s, 3), "pdl": False}  # fmt: skip
    book.add(case_result(case, NO_PDL, rows, vocab, timed, extra))


PROCESSING_KERNEL = "_process_logits_kernel"
"""The launch `_time_kernels` also replays without its [B, V] store (`NO_STORE_PROVIDER`)."""


def _time_kernels(
    book: BenchBook, timer: Timer, sampler: Sampler, x: torch.Tensor, case: str
) -> None:
    """Each Triton launch of one `sampler(x)`, recorded with its arguments and replayed
    alone (provider `step-kernel-<index>`, extra: its name and grid), in the step's order; the
    cost model's estimate of the same launch goes beside it in bench.md. Processing's launch
    is replayed once more without its dense pass's store (`NO_STORE_PROVIDER`)."""
    rows, vocab = x.shape
    with observed_launches() as launches:
        sampler(x)
    sync(timer.device)
    # the replays write what the step writes, the commit's history included (sampling
    # commits its tokens): every tensor they touch is put back afterwards
    touched = {id(t): t for _, args, _, _ in launches for t in args if isinstance(t, torch.Tensor)}
    saved = {key: t.clone() for key, t in touched.items()}
    for index, (kernel, args, grid, kwargs) in enumerate(launches):

        def launch(kernel: Any = kernel, args: Any = args, grid: Any = grid,
                   kwargs: Any = kwargs) -> None:  # fmt: skip
            kernel.run(*args, grid=grid, warmup=False, **kwargs)

        timed = timer(launch)
        shape = list(grid(kwargs) if callable(grid) else grid)
        extra = {"kernel": kernel.__name__, "grid": shape}
        book.add(case_result(case, f"{KERNEL_PROVIDER}{index}", rows, vocab, timed, extra))
    # the probe last: what it leaves (sparse tokens made from unstored logits, their tiles'
    # maxima) must not reach the replays of the kernels after processing
    for index, (kernel, args, grid, kwargs) in enumerate(launches):
        if kernel.__name__ != PROCESSING_KERNEL:
            continue

        def probe(kernel: Any = kernel, args: Any = args, grid: Any = grid,
                  kwargs: Any = kwargs) -> None:  # fmt: skip
            kernel.run(*args, grid=grid, warmup=False, **{**kwargs, "STORE_LOGITS": False})

        probe()  # compiles the variant, outside the capture
        sync(timer.device)
        shape = list(grid(kwargs) if callable(grid) else grid)
        extra = {"kernel": kernel.__name__, "grid": shape, "index": index}
        book.add(case_result(case, NO_STORE_PROVIDER, rows, vocab, timer(probe), extra))
    for key, t in touched.items():
        t.copy_(saved[key])


def _time_candidates(book: BenchBook, timer: Timer, x: torch.Tensor, case: str) -> None:
    """Time `top_k_top_p_threshold` on x at the stage's top_k and top_p (with min_p for
    "all") with the candidate buffer (one read a settled row) and with the search alone
    (candidates 0), recording each one's mean reads of a row. On CUDA the buffer is the
    kernel's default size over 1,024-element tiles, stage 1 split as the pipeline splits
    it; on the interpreter (--cpu-smoke) 64 over 128 (still enough for top_k 50; the full
    size takes seconds a row there)."""
    from graphsafe_sampler.kernels.top_k_top_p import CANDIDATES, top_k_top_p_splits
    from graphsafe_sampler.kernels.top_k_top_p import launch_top_k_top_p as launch

    device = x.device
    rows, vocab = x.shape
    candidates, block = (CANDIDATES, 1024) if device.type == "cuda" else (64, 128)
    splits = top_k_top_p_splits(rows, vocab, device)  # the pipeline's: 1 off CUDA
    slots = torch.arange(rows, device=device)
    top_k = torch.full((rows,), stages.TOP_K, dtype=torch.int32, device=device)
    top_p = torch.full((rows,), stages.TOP_P, dtype=torch.float32, device=device)
    min_p = torch.full((rows,), stages.MIN_P, device=device) if case == "all" else None
    threshold = torch.empty(rows, device=device)
    reads = torch.empty(rows, dtype=torch.int32, device=device)
    for c in (candidates, 0):
        launch(x, slots, top_k, top_p, threshold, False, min_p, reads, c, block, splits)
        mean_reads = float(reads.float().mean())  # untimed, outside any capture

        def call(c: int = c) -> None:
            launch(x, slots, top_k, top_p, threshold, False, min_p, None, c, block, splits)

        timed = timer(call)
        extra = {
            "candidates": c, "block_size": block, "splits": splits,
            "mean_reads": round(mean_reads, 2),
        }  # fmt: skip
        book.add(case_result(case, f"{CANDIDATES_PROVIDER}-c{c}", rows, vocab, timed, extra))


def _compiled_pass(
    opts: Options,
    deadline: float,
    grid: Sequence[tuple[int, int, str]],
    book: BenchBook,
    timer: Timer,
    logits: LogitsCache,
    pool: SamplerPool,
    measure: Callable[[str, Callable[[], None], str], None],
) -> bool:
    """The compiled Sampler (`torch.compile(fullgraph=True)` of `forward`, rows dynamic),
    graph-captured, in `compiled_order`; a compile starts only when its estimated cost fits
    in the time left. Returns True when some case was left out."""
    from torch._dynamo.testing import CompileCounterWithBackend

    device = timer.device
    dynamo_config = torch._dynamo.config
    for limit in ("recompile_limit", "cache_size_limit"):  # 4 samplers x 2 programs each
        if hasattr(dynamo_config, limit):
            setattr(dynamo_config, limit, max(64, getattr(dynamo_config, limit)))
    provider = provider_name("sampler-compiled", device)
    compiled: dict[tuple[int, int], tuple[Callable[..., Any], Any]] = {}
    programs: set[tuple[int, int, bool]] = set()
    estimate = COMPILE_ESTIMATE_S
    left_out = 0
    for rows, vocab, case in compiled_order(grid):
        k = case_logprobs(case)
        program = (vocab, k, rows == 1)
        left = deadline - time.monotonic()
        if program not in programs and left < estimate + 10.0:
            left_out += 1
            book.note(
                f"{provider}: not compiled for V{vocab} K{k} rows {'1' if rows == 1 else '>1'}: "
                f"a compile takes ~{estimate:.0f} s, {left:.0f} s were left"
            )
            continue
        if left < 2.0:
            left_out += 1
            continue
        sampler = pool.get(vocab, k, "torch")
        if isinstance(sampler, str):
            continue
        if (vocab, k) not in compiled:
            counter = CompileCounterWithBackend(opts.compile_backend)
            compiled[(vocab, k)] = (
                torch.compile(sampler.forward, fullgraph=True, backend=counter),
                counter,
            )
        fn, counter = compiled[(vocab, k)]
        x = logits.get(rows, vocab)

        def run(sampler: Sampler = sampler, fn: Callable[..., Any] = fn, counter: Any = counter,
                x: torch.Tensor = x, rows: int = rows, vocab: int = vocab,
                case: str = case, program: tuple[int, int, bool] = program,
                k: int = k) -> None:  # fmt: skip
            nonlocal estimate
            update_s = pool.load(sampler, case, rows)
            if rows > 1:
                torch._dynamo.maybe_mark_dynamic(x, 0)
            start = time.perf_counter()
            fn(x)  # untimed first call: compiles when the program is new
            sync(device)
            first_s = time.perf_counter() - start
            if program not in programs:
                programs.add(program)
                estimate = max(first_s * 1.2, 10.0)
            timed = timer(lambda: fn(x))
            extra = {"backend": "torch", "max_num_logprobs": k, "update_s": round(update_s, 3),
                     "first_call_s": round(first_s, 2),
                     "compile_frames": counter.frame_count}  # fmt: skip
            book.add(case_result(case, provider, rows, vocab, timed, extra))

        measure(f"{case} {provider} R{rows}-V{vocab}", run, provider)
    return left_out > 0
