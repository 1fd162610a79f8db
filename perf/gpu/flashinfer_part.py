"""The flashinfer part: FlashInfer's sampling functions on the benchmark grid, appended to
bench.json beside the Sampler (a cost reference: they sample rather than mask)."""

from __future__ import annotations

import functools
import importlib.util
import time
from collections.abc import Callable
from typing import Any

import torch

from graphsafe_sampler.bench import stages
from graphsafe_sampler.bench.results import run_context

from .book import BenchBook, case_result
from .cases import FLASHINFER, case_grid
from .device import cuda_alive, sync
from .environment import flashinfer_version
from .measure import LogitsCache, Timer, time_floor
from .options import Options


def flashinfer_call(
    fi: Any, case: str, rows: int, device: torch.device
) -> tuple[str, Callable[[torch.Tensor], object]] | None:
    """FlashInfer's function for a case (name, call on float32 logits), or None where it has
    none (penalties, bias, greedy, logprobs). They sample or renormalise rather than mask,
    and ignore per-request seeds: a cost reference, not the same work."""
    top_k = torch.full((rows,), stages.TOP_K, dtype=torch.int32, device=device)
    top_p = torch.full((rows,), stages.TOP_P, dtype=torch.float32, device=device)
    min_p = torch.full((rows,), stages.MIN_P, dtype=torch.float32, device=device)
    calls: dict[str, tuple[str, Callable[[torch.Tensor], object]]] = {
        "top_k": ("top_k_sampling_from_probs",
                  lambda x: fi.top_k_sampling_from_probs(torch.softmax(x, dim=-1), top_k)),
        "top_p": ("top_p_sampling_from_probs",
                  lambda x: fi.top_p_sampling_from_probs(torch.softmax(x, dim=-1), top_p)),
        "top_k_top_p": ("top_k_top_p_sampling_from_logits",
                        lambda x: fi.top_k_top_p_sampling_from_logits(x, top_k, top_p)),
        "min_p": ("min_p_sampling_from_probs",
                  lambda x: fi.min_p_sampling_from_probs(torch.softmax(x, dim=-1), min_p)),
        "sampling": ("sampling_from_logits", lambda x: fi.sampling_from_logits(x)),
        "all": ("top_k_top_p_sampling_from_logits",
                lambda x: fi.top_k_top_p_sampling_from_logits(x / 0.8, top_k, top_p)),
    }  # fmt: skip
    return calls.get(case)


def run_flashinfer_part(opts: Options, deadline: float) -> dict[str, Any]:
    """FlashInfer on the benchmark grid, appended to bench.json (floors timed where the
    bench part left none). The first call of each function is untimed (FlashInfer may
    JIT-compile it)."""
    if importlib.util.find_spec("flashinfer") is None:
        return {"status": "skipped", "reason": "flashinfer is not installed"}
    from flashinfer import sampling as fi

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
            call = flashinfer_call(fi, case, rows, device)
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
