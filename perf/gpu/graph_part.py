"""The graph part (Sampler.forward captured once, replayed against an eager twin per
backend and logprobs mode, then `check_graph_safety` on the device) and the compiled part
(the compiled step, captured by hand on CUDA)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from graphsafe_sampler import Sampler, SamplerConfig, SamplerOutput, SamplingParams
from graphsafe_sampler.processors.base import SlotLogitsProcessor
from graphsafe_sampler.testing import (
    BatchDriver,
    CudaGraphReplayer,
    MakeFxReplayer,
    check_graph_safety,
)

from .device import Job, run_jobs
from .options import Options
from .replay_check import CompiledReplayer, MakeReplayer, replay_check
from .report import error_result, error_text, overall_status, record_check
from .targets import all_feature_params, graph_config, sampler_or_reason

GRAPH_CHECKS = (
    ("triton", "raw_logprobs", 1.0),
    ("torch", "raw_logprobs", 1.5),
    ("torch", "processed_logprobs", 1.0),
)
"""(backend, logprobs_mode, weight in the graph part's time). Triton first: while its
backend is not available it is skipped at once and its time goes to the others."""


def _harness_check(opts: Options) -> dict[str, Any]:
    """`graphsafe_sampler.testing.check_graph_safety` on the Sampler: sync ops, fixed
    addresses, make_fx replay and, on CUDA, its own CUDA-graph replay under sync errors
    (--harness-steps steps; it cannot stop early, so keep them few)."""
    from graphsafe_sampler.testing import GraphSafetyError

    started = time.monotonic()
    config = graph_config(opts, "torch", "raw_logprobs")
    sampler = Sampler(config, opts.device())
    rng = np.random.default_rng(opts.seed + 7)
    words = (config.vocab_size + 31) // 32

    def advance(driver: BatchDriver, out: SamplerOutput) -> None:
        driver.record_tokens(out.sampled_token_ids[:, 0].tolist())
        size = min(2, config.max_num_reqs)
        rows = sorted(rng.choice(config.max_num_reqs, size=size, replace=False).tolist())
        bits = rng.integers(-(2**31), 2**31, size=(len(rows), words), dtype=np.int64)
        sampler.stage_grammar_bitmask(bits.astype(np.int32), rows=rows)

    steps = opts.harness_steps
    try:
        report = check_graph_safety(
            sampler,
            fn=lambda x: sampler(x),
            num_steps=steps,
            seed=opts.seed + 7,
            make_params=all_feature_params,
            advance=advance,
            compile=False,
        )
    except GraphSafetyError as exc:
        return {"status": "failed", "failures": [error_text(exc, 2000)], "steps_requested": steps,
                "seconds": round(time.monotonic() - started, 2)}  # fmt: skip
    return {
        "status": "passed",
        "steps_requested": steps,
        "steps_run": report.steps,
        "state_tensors": report.state_tensors,
        "cuda_graph": report.cuda_graph,
        "seconds": round(time.monotonic() - started, 2),
    }


class _HistcProcessor(SlotLogitsProcessor):
    """`torch.histc` with min == max: its CUDA kernel reads the range on the host. Graph-safe
    in every other way (no state at all)."""

    def is_argmax_invariant(self) -> bool:
        return True

    def add_request(self, slot: int, params: SamplingParams, prompt: Any, output: Any) -> None:
        return None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        counts = torch.histc(logits, bins=8, min=0.0, max=0.0)
        return logits + 0.0 * counts.sum()


def _unlisted_sync_check(opts: Options) -> dict[str, Any]:
    """The graph-safety checker's limit, covered on a GPU: an op that syncs inside its CUDA
    kernel but is not on the CPU detector's list (histc, taken off the list here) must
    still fail `check_graph_safety` on CUDA, through set_sync_debug_mode("error") and the
    real CUDA-graph capture. Passed when it fails with GraphSafetyError."""
    from graphsafe_sampler.testing import GraphSafetyError, sync_detector

    device = opts.device()
    if device.type != "cuda":
        return {"status": "skipped", "reason": "CUDA only: on a CPU only the listed ops fail"}
    started = time.monotonic()
    config = SamplerConfig(4, 1000)
    proc = _HistcProcessor(config, device, False)
    listed = sync_detector.SYNC_OP_PACKETS
    sync_detector.SYNC_OP_PACKETS = frozenset(listed - {torch.ops.aten.histc})
    try:
        check_graph_safety(proc, num_steps=3, compile=False)
    except GraphSafetyError as exc:
        return {"status": "passed", "caught": error_text(exc, 500),
                "seconds": round(time.monotonic() - started, 2)}  # fmt: skip
    finally:
        sync_detector.SYNC_OP_PACKETS = listed
    return {"status": "failed", "failures": ["histc's host read passed check_graph_safety on CUDA"]}


def run_graph_part(opts: Options, deadline: float) -> dict[str, Any]:
    """The replay checks (per backend and logprobs mode) and the harness check."""
    device = opts.device()
    cuda = device.type == "cuda"
    make_replayer: MakeReplayer = CudaGraphReplayer if cuda else MakeFxReplayer
    kind = CudaGraphReplayer.kind if cuda else MakeFxReplayer.kind

    def replay_job(config: SamplerConfig) -> Callable[[float], dict[str, Any]]:
        def job(until: float) -> dict[str, Any]:
            probe = sampler_or_reason(config, device)
            if isinstance(probe, str):
                return {"status": "skipped", "reason": probe}
            del probe
            return replay_check(
                lambda: Sampler(config, device),
                make_replayer,
                steps=opts.steps,
                seed=opts.seed,
                deadline=until,
            )

        return job

    # (name, weight in the part's time, job): the harness repeats what the replay checks do.
    jobs: list[Job] = [
        (f"{backend}/{mode}/{kind}", weight, replay_job(graph_config(opts, backend, mode)))
        for backend, mode, weight in GRAPH_CHECKS
        if backend in opts.backends
    ]
    if opts.harness_steps > 0:
        jobs.append(("harness/torch/check_graph_safety", 0.6, lambda until: _harness_check(opts)))
        jobs.append(("harness/unlisted-sync-op", 0.2, lambda until: _unlisted_sync_check(opts)))
    statuses = []
    for name, check in run_jobs(jobs, deadline, device):
        record_check(opts, name, check)
        statuses.append(check["status"])
    return {"status": overall_status(statuses), "checks": [name for name, _, _ in jobs]}


def run_compiled_part(opts: Options, deadline: float) -> dict[str, Any]:
    """torch.compile(fullgraph=True) of the step, captured by hand on CUDA, against an eager
    twin over the same churn as the graph part."""
    device = opts.device()
    config = graph_config(opts, "torch", "raw_logprobs")
    name = "torch/raw_logprobs/" + ("compiled+cuda-graph" if device.type == "cuda" else "compiled")
    try:
        check = replay_check(
            lambda: Sampler(config, device),
            functools.partial(CompiledReplayer, backend=opts.compile_backend),
            steps=opts.steps,
            seed=opts.seed + 1,
            deadline=deadline,
        )
        frames = check.get("compile_frames")
        if check["status"] == "passed" and frames not in (None, 1):
            check["status"] = "failed"
            check["failures"].append(f"compiled {frames} times as the batch churned (want 1)")
    except Exception as exc:
        check = error_result(exc)
    record_check(opts, name, check)
    return {"status": check["status"], "checks": [name]}
