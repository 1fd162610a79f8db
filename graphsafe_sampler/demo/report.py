"""The demo's report: where two modes' tokens first differ, and the summary it prints.

`first_difference` compares two runs step by step; `print_summary` prints the set-up, a
table of tokens/s and step times per mode, why requests finished, the failed checks and
the verdict ("tokens identical: yes/no"); `write_json` writes the same for a script (`--json`).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from graphsafe_sampler.demo.engine import RunResult
from graphsafe_sampler.demo.options import DemoOptions
from graphsafe_sampler.demo.requests import DemoRequest
from graphsafe_sampler.examples.tiny_decoder import TinyDecoder


def first_difference(reference: RunResult, other: RunResult) -> str | None:
    """None if both runs produced the same tokens at every step, else where they first differ."""
    for step, (want, got) in enumerate(zip(reference.transcript, other.transcript, strict=True)):
        if want != got:
            diff = sorted(set(want) ^ set(got))
            return (
                f"step {step}: {reference.mode} and {other.mode} differ at "
                f"(request, token) {diff[:4]}"
            )
    return None


def print_summary(
    options: DemoOptions,
    model: TinyDecoder,
    stream: Sequence[DemoRequest],
    results: Sequence[RunResult],
    differences: Sequence[str],
) -> None:
    config = model.config
    eager = results[0]
    if not options.quiet:
        kinds = Counter(r.kind for r in stream)
        print(
            f"tiny decoder: {config.num_layers} layers, width {config.hidden_size}, vocab "
            f"{config.vocab_size}, random weights (seed {options.seed}); device {model.device}, "
            f"torch {torch.__version__}, {options.threads} intra-op thread(s)"
        )
        print(
            f"stream: {len(stream)} requests over {options.steps} steps, "
            f"max {options.max_num_reqs} at once, buckets {'/'.join(map(str, options.buckets))}"
        )
        print("kinds: " + ", ".join(f"{k} {n}" for k, n in kinds.items()))
        for r in results:
            if r.mode != "eager":
                print(
                    f"{r.mode}: set-up {r.setup_seconds:.1f} s untimed "
                    f"({r.compiles} compile(s) for {len(options.buckets)} buckets)"
                )
        steps_by_bucket = ", ".join(f"{b}: {n}" for b, n in sorted(eager.bucket_steps.items()))
        print(f"steps per bucket: {steps_by_bucket}")
        changes = eager.batch_changes
        print(
            f"batch updates: {changes['added']} adds, {changes['removed']} removes, "
            f"{changes['moved']} moves"
        )
    print(
        f"{'mode':<12}{'steps':>7}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}"
        f"{'step ms (median)':>18}{'speed-up':>10}"
    )
    for r in results:
        median_ms = statistics.median(r.step_seconds) * 1e3 if r.step_seconds else 0.0
        speedup = r.tokens_per_second / eager.tokens_per_second
        print(
            f"{r.mode:<12}{len(r.transcript):>7}{r.num_tokens:>8}{r.seconds:>9.2f}"
            f"{r.tokens_per_second:>10.1f}{median_ms:>18.2f}{speedup:>9.2f}x"
        )
    reasons = Counter(eager.finished.values())
    unfinished = len(stream) - len(eager.finished)
    print(
        f"requests served: {len(eager.finished)} of {len(stream)} "
        f"({', '.join(f'{k} {n}' for k, n in sorted(reasons.items()))}; "
        f"unfinished {unfinished})"
    )
    violations = [v for r in results for v in r.violations]
    if violations:
        print("checks FAILED: " + "; ".join(violations[:5]))
    elif not options.quiet:
        print("checks: min_tokens respected, no bad word completed, no recompile in the loop")
    for line in differences:
        print(line)
    print(f"tokens identical: {'no' if differences else 'yes'}")


def write_json(
    path: str,
    options: DemoOptions,
    stream: Sequence[DemoRequest],
    results: Sequence[RunResult],
    differences: Sequence[str],
) -> None:
    """The summary as JSON at `path` (schema 1): per mode its steps, tokens, timings,
    compiles, steps per bucket, batch changes, finish reasons and failed checks; the first
    difference of each mode from the first; and "identical"."""
    modes: list[dict[str, Any]] = [
        {
            "mode": r.mode,
            "steps": len(r.transcript),
            "num_tokens": r.num_tokens,
            "seconds": r.seconds,
            "setup_seconds": r.setup_seconds,
            "tokens_per_second": r.tokens_per_second,
            "step_ms_median": statistics.median(r.step_seconds) * 1e3 if r.step_seconds else 0,
            "compiles": r.compiles,
            "bucket_steps": {str(b): n for b, n in sorted(r.bucket_steps.items())},
            "batch_changes": dict(r.batch_changes),
            "finished": dict(Counter(r.finished.values())),
            "violations": list(r.violations),
        }
        for r in results
    ]
    report = {
        "schema": 1,
        "device": options.device,
        "requests": len(stream),
        "modes": modes,
        "differences": list(differences),
        "identical": not differences,
    }
    Path(path).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
