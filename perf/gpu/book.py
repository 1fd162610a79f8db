"""bench.json and bench.md: the benchmark table, rewritten after every case, with the ratios
to the floor and to FlashInfer."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import torch

from graphsafe_sampler.bench.results import (
    FLOOR_PROVIDER,
    CaseResult,
    Results,
    fill_ratios,
    logits_gbps,
)

from .cases import (
    BENCH_CASES,
    CANDIDATES_PROVIDER,
    FLASHINFER,
    KERNEL_PROVIDER,
    NO_PDL,
    NO_STORE_PROVIDER,
    READ_FLOOR,
    SAMPLER_PROVIDERS,
    SPEC_STAGE,
    TRITON_GRAPH,
)
from .options import Options
from .report import BENCH_JSON, BENCH_MD, error_text, say, write_json

FLOORS = (FLOOR_PROVIDER, READ_FLOOR)
"""The two floors of a shape: the copy of the logits and their one read."""


class BenchBook:
    """bench.json and bench.md, rewritten after every case (a killed run keeps its cases)."""

    def __init__(self, opts: Options, context: dict[str, Any]) -> None:
        self.path = opts.out / BENCH_JSON
        self.md_path = opts.out / BENCH_MD
        existing = None
        if self.path.exists():
            with contextlib.suppress(ValueError, OSError):
                existing = Results.read(self.path)
        if existing is not None:
            self.results = existing
            self.results.context.update(
                {k: v for k, v in context.items() if k not in existing.context}
            )
        else:
            self.results = Results(context, [])
        self.results.context.setdefault("notes", [])
        self.results.context.setdefault("errors", [])

    def has(self, name: str) -> bool:
        return any(c.name == name for c in self.results.cases)

    def floor_of(self, rows: int, vocab: int) -> bool:
        return any(
            c.provider == FLOOR_PROVIDER and (c.rows, c.vocab) == (rows, vocab)
            for c in self.results.cases
        )

    def note(self, text: str) -> None:
        if text not in self.results.context["notes"]:
            self.results.context["notes"].append(text)
            say(text)
        self.write()

    def error(self, what: str, exc: BaseException) -> None:
        self.results.context["errors"].append(f"{what}: {error_text(exc, 800)}")
        say(f"{what}: {error_text(exc, 300)}")
        self.write()

    def add(self, case: CaseResult) -> None:
        self.results.cases.append(case)
        self.write()

    def write(self) -> None:
        fill_ratios(self.results.cases)
        fill_read_ratios(self.results.cases)
        fill_flashinfer_ratios(self.results.cases)
        write_json(self.path, self.results.to_json())
        tmp = self.md_path.with_name(self.md_path.name + ".tmp")
        tmp.write_text(format_markdown(self.results), encoding="utf-8")
        os.replace(tmp, self.md_path)


def fill_read_ratios(cases: Sequence[CaseResult]) -> None:
    """extra["ratio_to_read"]: a case's median over the one-read floor's (`amax(-1)`) of
    the same shape: how many passes over the logits the step costs."""
    reads = {(c.rows, c.vocab): c.median_us for c in cases if c.provider == READ_FLOOR}
    for c in cases:
        c.extra.pop("ratio_to_read", None)
        read = reads.get((c.rows, c.vocab))
        if read and c.provider not in FLOORS:
            c.extra["ratio_to_read"] = round(c.median_us / read, 4)


def fill_flashinfer_ratios(cases: Sequence[CaseResult]) -> None:
    """extra["ratio_to_flashinfer"]: a case's median over FlashInfer's on the same case and
    shape, or over FlashInfer's top-k/top-p sampling when FlashInfer has nothing for the
    case (extra["flashinfer_ref"] names which)."""
    peer = {
        (c.stage, c.rows, c.vocab, c.dtype): c.median_us for c in cases if c.provider == FLASHINFER
    }
    for c in cases:
        c.extra.pop("ratio_to_flashinfer", None)
        c.extra.pop("flashinfer_ref", None)
        if c.provider in (FLASHINFER, *FLOORS):
            continue
        for stage in (c.stage, "top_k_top_p"):
            ref = peer.get((stage, c.rows, c.vocab, c.dtype))
            if ref:
                c.extra["ratio_to_flashinfer"] = round(c.median_us / ref, 4)
                c.extra["flashinfer_ref"] = stage
                break


def _us(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else (f"{value:.2f}" if value < 100 else f"{value:.0f}")


def format_markdown(results: Results, model: dict[str, Any] | None = None) -> str:
    """bench.md: the floors per shape, then one line per case and shape with every
    provider's µs (and ratio to the copy floor), the headline provider's GB/s, its ratio to
    the read floor and to FlashInfer; then the Triton step kernel by kernel, beside the cost
    model's estimate (`model`: perf/kernel_model.py's document, when it was computed)."""
    ctx = results.context
    cases = results.cases
    by_key = {(c.stage, c.provider, c.rows, c.vocab): c for c in cases}
    floors = {(c.rows, c.vocab): c for c in cases if c.provider == FLOOR_PROVIDER}
    reads = {(c.rows, c.vocab): c for c in cases if c.provider == READ_FLOOR}
    present = [p for p in SAMPLER_PROVIDERS if any(c.provider == p for c in cases)]
    lines = [
        "# gpu_check benchmarks",
        "",
        f"{ctx.get('device_name', '?')} · torch {ctx.get('torch', '?')} · triton "
        f"{ctx.get('triton', '?')} · FlashInfer {ctx.get('flashinfer') or '–'} · timer "
        f"{ctx.get('timer', '?')} · {ctx.get('created', '')} · commit {ctx.get('commit')}",
        "",
        "Times are µs per call (median); `x floor` is over the floor of the same shape "
        "(one captured copy of the logits); `x read` is the headline provider over the "
        "one-read floor (`amax(-1)`); `x FI` is the headline Sampler provider over "
        "FlashInfer on the same case († over FlashInfer's top-k/top-p sampling, where "
        "FlashInfer has nothing for the case). float32 logits.",
        *(
            [
                "",
                f"`{SPEC_STAGE}`: speculative decoding's verification step (`RejectionSampler`, "
                "draft probabilities given); its rows are requests x (S + 1) target-logits rows "
                "(extra: requests, max_spec_len), so its floor is a copy of the target logits.",
            ]
            if any(c.stage == SPEC_STAGE for c in cases)
            else []
        ),
        "",
        "## Floor",
        "",
        "| rows | vocab | MB | copy µs | copy GB/s (read + write) | amax µs | amax GB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (rows, vocab), f in sorted(floors.items()):
        mb = rows * vocab * 4 / 1e6
        copy = f.extra.get("copy_gbps")
        read = reads.get((rows, vocab))
        lines.append(
            f"| {rows} | {vocab} | {mb:.3g} | {_us(f.median_us)} | {_ratio(copy)} | "
            f"{_us(read.median_us if read else None)} | {_ratio(read.gbps if read else None)} |"
        )
    table = [c for c in cases if c.provider not in FLOORS and not _is_kernel(c)]
    shapes = sorted({(c.rows, c.vocab, c.stage) for c in table},
                    key=lambda s: (s[0] * s[1], s[1], BENCH_CASES.index(s[2])
                                   if s[2] in BENCH_CASES else 99))  # fmt: skip
    head = ["case", "rows", "vocab", "floor µs"]
    head += [f"{p} µs (x floor)" for p in present]
    head += ["GB/s", "x read", "FlashInfer µs", "FlashInfer function", "x FI"]
    lines += ["", "## Cases", "", "| " + " | ".join(head) + " |",
              "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]  # fmt: skip
    for rows, vocab, stage in shapes:
        floor = floors.get((rows, vocab))
        cells = [stage, str(rows), str(vocab), _us(floor.median_us if floor else None)]
        headline = None
        for p in present:
            c = by_key.get((stage, p, rows, vocab))
            cells.append("–" if c is None else f"{_us(c.median_us)} ({_ratio(c.ratio_to_floor)})")
            headline = headline or c
        fi = by_key.get((stage, FLASHINFER, rows, vocab))
        ratio = headline.extra.get("ratio_to_flashinfer") if headline else None
        dagger = (
            " †" if headline and headline.extra.get("flashinfer_ref") not in (None, stage) else ""
        )
        cells += [
            _ratio(headline.gbps if headline else None),
            _ratio(headline.extra.get("ratio_to_read") if headline else None),
            _us(fi.median_us if fi else None),
            fi.extra.get("function", "") if fi else "",
            _ratio(ratio) + dagger if ratio is not None else "–",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    kernel_cases = [c for c in cases if c.provider.startswith(CANDIDATES_PROVIDER)]
    if kernel_cases:
        lines += ["", "## top-k/top-p kernel: candidate buffer vs search alone", "",
                  "| case | rows | vocab | candidates | µs (x floor) | mean reads of a row |",
                  "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for c in sorted(kernel_cases, key=lambda c: (c.rows * c.vocab, c.stage, c.provider)):
            lines.append(
                f"| {c.stage} | {c.rows} | {c.vocab} | {c.extra.get('candidates')} | "
                f"{_us(c.median_us)} ({_ratio(c.ratio_to_floor)}) | {c.extra.get('mean_reads')} |"
            )
    lines += _pdl_lines(cases, model)
    lines += _kernel_lines([c for c in cases if _is_kernel(c)], model)
    lines += _store_lines(cases, model)
    for title, key in (("Notes", "notes"), ("Errors", "errors")):
        if ctx.get(key):
            lines += ["", f"## {title}", ""] + [f"- {n}" for n in ctx[key]]
    return "\n".join(lines) + "\n"


def _is_kernel(case: CaseResult) -> bool:
    return case.provider.startswith(KERNEL_PROVIDER)


def _kernel_index(case: CaseResult) -> int:
    """A timed kernel's place in its step (provider `step-kernel-<index>`)."""
    return int(case.provider[len(KERNEL_PROVIDER) :])


def model_estimates(model: dict[str, Any] | None, case: CaseResult) -> dict[str, Any]:
    """The cost model's launch of the same case, rows and index as a timed kernel, when the
    model was computed for its vocabulary and names the same kernel there."""
    if not model or model.get("vocab") != case.vocab:
        return {}
    step = model.get("cases", {}).get(case.stage, {}).get(str(case.rows))
    index = _kernel_index(case)
    if not step or index >= len(step["launches"]):
        return {}
    launch = step["launches"][index]
    return launch if launch.get("name") == case.extra.get("kernel") else {}


def _pdl_lines(cases: Sequence[CaseResult], model: dict[str, Any] | None) -> list[str]:
    """The Triton step with programmatic dependent launch on and off, shape by shape: what it
    saved in all, and a launch (over the step's launches after its first, as the cost
    model counts them; – where it was not computed)."""
    on = {(c.stage, c.rows, c.vocab): c for c in cases if c.provider == TRITON_GRAPH}
    off = [c for c in cases if c.provider == NO_PDL and (c.stage, c.rows, c.vocab) in on]
    if not off:
        return []
    lines = ["", "## Programmatic dependent launch: the Triton step with it and without", "",
             "| case | rows | vocab | on µs | off µs | saved µs | launches | saved a launch µs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for c in sorted(off, key=lambda c: (c.rows * c.vocab, c.stage)):
        saved = c.median_us - on[(c.stage, c.rows, c.vocab)].median_us
        launches = None
        if model and model.get("vocab") == c.vocab:
            step = model.get("cases", {}).get(c.stage, {}).get(str(c.rows))
            launches = len(step["launches"]) if step else None
        each = saved / (launches - 1) if launches and launches > 1 else None
        lines.append(
            f"| {c.stage} | {c.rows} | {c.vocab} | "
            f"{_us(on[(c.stage, c.rows, c.vocab)].median_us)} | {_us(c.median_us)} | "
            f"{saved:.1f} | {launches or '–'} | {'–' if each is None else f'{each:.2f}'} |"
        )
    return lines


def _kernel_lines(kernels: Sequence[CaseResult], model: dict[str, Any] | None) -> list[str]:
    """The Triton step kernel by kernel, each launch timed alone, beside the cost model."""
    if not kernels:
        return []
    machine = f" on {model['gpu']}" if model and model.get("gpu") else ""
    lines = ["", "## The Triton step, kernel by kernel", "",
             "Each launch of one `Sampler` step on the Triton backend, replayed alone; `est` "
             f"is perf/kernel_model.py's estimate of that launch{machine} (an estimate, never "
             "a measurement; – where it was not computed): the larger of its memory time "
             "(`est mem`) and its programs' serial time, issue and load latency, over all "
             "their waves (`est serial`), plus a launch.", "",
             "| case | rows | vocab | # | kernel | grid | µs | x read | est µs | est mem µs "
             "| est serial µs |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    order = sorted(kernels, key=lambda c: (c.rows * c.vocab, c.stage, _kernel_index(c)))
    for c in order:
        est = model_estimates(model, c)
        serial = est["waves"] * est["serial_us"] if "serial_us" in est else None
        grid = "x".join(str(g) for g in c.extra.get("grid", []))
        lines.append(
            f"| {c.stage} | {c.rows} | {c.vocab} | {_kernel_index(c)} | "
            f"{c.extra.get('kernel')} | {grid} | {_us(c.median_us)} | "
            f"{_ratio(c.extra.get('ratio_to_read'))} | {_us(est.get('est_us'))} | "
            f"{_us(est.get('memory_us'))} | {_us(serial)} |"
        )
    return lines


def _store_lines(cases: Sequence[CaseResult], model: dict[str, Any] | None) -> list[str]:
    """Processing's launch with its dense pass's [B, V] store and without (the probe
    `NO_STORE_PROVIDER`), shape by shape: what leaving the store out saved, beside the
    store's share of the launch's bytes by the cost model (– where it was not computed)."""
    timed = {(c.stage, c.rows, c.vocab, _kernel_index(c)): c for c in cases if _is_kernel(c)}
    pairs = [
        (timed[key], c) for c in cases if c.provider == NO_STORE_PROVIDER
        and (key := (c.stage, c.rows, c.vocab, c.extra.get("index"))) in timed
    ]  # fmt: skip
    if not pairs:
        return []
    lines = ["", "## Processing without its [B, V] store", "",
             "The step's processing launch replayed alone, then again with the dense pass's "
             "store of the processed logits left out (a probe: its output is then wrong). "
             "Bound by memory, the launch saves about the store's share of its bytes (the "
             "cost model's count, an estimate); bound by issue, little.", "",
             "| case | rows | vocab | with µs | without µs | saved µs | saved | store's share "
             "of the bytes (est) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for with_store, without in sorted(pairs, key=lambda p: (p[0].rows * p[0].vocab, p[0].stage)):
        saved = with_store.median_us - without.median_us
        est = model_estimates(model, with_store)
        moved = est.get("read_bytes", 0) + est.get("write_bytes", 0)
        share = with_store.rows * with_store.vocab * 4 / moved if moved else None
        lines.append(
            f"| {with_store.stage} | {with_store.rows} | {with_store.vocab} | "
            f"{_us(with_store.median_us)} | {_us(without.median_us)} | {saved:.1f} | "
            f"{saved / with_store.median_us:.0%} | {'–' if share is None else f'{share:.0%}'} |"
        )
    return lines


def case_result(
    stage: str,
    provider: str,
    rows: int,
    vocab: int,
    timed: tuple[tuple[float, float, float], int, dict[str, Any]],
    extra: dict[str, Any],
) -> CaseResult:
    (median, p20, p80), rounds, notes = timed
    return CaseResult(
        stage=stage,
        provider=provider,
        rows=rows,
        vocab=vocab,
        dtype="float32",
        median_us=median,
        p20_us=p20,
        p80_us=p80,
        gbps=logits_gbps(rows, vocab, torch.float32, median),
        rounds=rounds,
        extra={**notes, **extra},
    )
