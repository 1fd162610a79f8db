"""The flashinfer part: FlashInfer's sampling functions on the benchmark grid, appended to
bench.json beside the Sampler (a cost reference: they sample rather than mask). Which
function stands beside which case is `graphsafe_sampler.bench.flashinfer`'s table."""

from __future__ import annotations

import functools
import importlib.util
import time
from typing import Any

from graphsafe_sampler.bench.flashinfer import flashinfer_call
from graphsafe_sampler.bench.results import run_context

from .book import BenchBook, case_result
from .cases import FLASHINFER, case_grid
from .device import cuda_alive, sync
from .environment import flashinfer_version
from .measure import LogitsCache, Timer, time_floor
from .options import Options


def run_flashinfer_part(opts: Options, deadline: float) -> dict[str, Any]:
    """FlashInfer on the benchmark grid, appended to bench.json (floors timed where the
    bench part left none). The first call of each function is untimed (FlashInfer may
    JIT-compile it)."""
    if importlib.util.find_spec("flashinfer") is None:
        return {"status": "skipped", "reason": "flashinfer is not installed"}
    device = opts.device()
    timer = Timer(device, opts.rep_ms, opts.cpu_rounds)
    context = run_context(device, suite="perf/gpu_check.py", timer=timer.name, rep_ms=opts.rep_ms,
                          flashinfer=flashinfer_version())  # fmt: skip
    book = BenchBook(opts, context)
    book.results.context["flashinfer"] = flashinfer_version()
    logits = LogitsCache(device, max(opts.rows), opts.seed)
    incomplete = False
    errors = 0
    for rows, vocab, case in case_grid(opts.rows, opts.vocabs, opts.cases):
        if time.monotonic() > deadline:
            book.note(f"flashinfer stopped at {case} R{rows}-V{vocab}: its time was up")
            incomplete = True
            break
        x = logits.get(rows, vocab)
        try:
            if not book.floor_of(rows, vocab):
                time_floor(book, timer, x)
            call = flashinfer_call(case, rows, device, step=True)
            if call is None or book.has(f"{case}/{FLASHINFER}/R{rows}-V{vocab}-float32"):
                continue
            function, fn = call
            start = time.perf_counter()
            fn(x)
            sync(device)
            first_s = time.perf_counter() - start
            timed = timer(functools.partial(fn, x), fallback=True)
            extra = {"function": function, "first_call_s": round(first_s, 2)}
            book.add(case_result(case, FLASHINFER, rows, vocab, timed, extra))
        except Exception as exc:
            errors += 1
            book.error(f"flashinfer {case} R{rows}-V{vocab}", exc)
            if not cuda_alive(device):
                return {"status": "error", "reason": "the CUDA context broke"}
    status = "failed" if errors else "incomplete" if incomplete else "passed"
    return {"status": status, "errors": errors}
