"""The spec part: speculative decoding's verification step (`RejectionSampler.forward`)
captured once and replayed against an eager twin, with the draft model's probabilities and
with n-gram drafts; then the step timed like the bench part's cases."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphsafe_sampler import RejectionSampler, Sampler, SamplerConfig
from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.bench.results import run_context
from graphsafe_sampler.testing import BatchDriver, CudaGraphReplayer, MakeFxReplayer

from .book import BenchBook, case_result
from .cases import SPEC_LEN, SPEC_STAGE, provider_name
from .device import Job, cuda_alive, run_jobs, sync
from .environment import flashinfer_version
from .measure import MAX_FAILURES_IN_A_ROW, SamplerPool, Timer, time_floor
from .options import Options
from .replay_check import SPEC_OUTPUT_NAMES, MakeReplayer, StepFn, replay_check
from .report import overall_status, record_check
from .targets import rejection_or_reason, spec_config

DRAFT_NOISE = 1.0
"""Draft model = target logits + Gaussian noise of this standard deviation (as in
perf/bench_rejection.py)."""


class SpecInputs:
    """Fresh inputs per verification step, drawn on the device: target logits
    [rows, S + 1, V] whose spread varies per step (a NaN row and an all -inf row every 5th
    step); a draft model's logits (the target's plus noise), whose softmax is draft_probs
    [rows, S, V] (`with_probs`; n-gram drafts otherwise); drafts drawn from them, or on
    about half the rows the target's argmax (so greedy rows accept runs of them), with an id
    outside the vocabulary every 7th step; num_draft_tokens in [0, S] (S + 2 on one row
    every 6th step: clamped on the device); a commit mask keeping about 1 row in 10 out.
    Returns (target_logits, draft_token_ids, num_draft_tokens[, draft_probs], commit_mask)."""

    def __init__(
        self,
        config: SamplerConfig,
        device: torch.device,
        seed: int,
        *,
        spec_len: int = SPEC_LEN,
        with_probs: bool = True,
    ) -> None:
        self.rows, self.vocab, self.spec = config.max_num_reqs, config.vocab_size, spec_len
        self.with_probs = with_probs
        self.device = device
        self.gen = torch.Generator(device).manual_seed(seed)
        self.rng = random.Random(seed)

    def __call__(self, step: int) -> tuple[torch.Tensor, ...]:
        rows, spec, vocab = self.rows, self.spec, self.vocab
        device, gen, rng = self.device, self.gen, self.rng
        logits = torch.randn(rows, spec + 1, vocab, generator=gen, device=device)
        logits *= rng.uniform(0.5, 8.0)
        if step % 5 == 4 and rows >= 2:
            nan_row, inf_row = rng.sample(range(rows), 2)
            logits[nan_row] = float("nan")
            logits[inf_row] = float("-inf")
        finite = torch.where(logits[:, :spec].isfinite(), logits[:, :spec], 0.0)
        noise = torch.randn(rows, spec, vocab, generator=gen, device=device)
        draft_logits = finite + DRAFT_NOISE * noise
        uniform = torch.rand(rows, spec, vocab, generator=gen, device=device)
        gumbel = -(-uniform.clamp_min(1e-20).log()).log()
        sampled = (draft_logits + gumbel).argmax(dim=-1)  # a draw from softmax(draft_logits)
        take_best = torch.rand(rows, 1, generator=gen, device=device) < 0.5
        drafts = torch.where(take_best, finite.argmax(dim=-1), sampled)
        if step % 7 == 6:
            drafts[rng.randrange(rows), rng.randrange(spec)] = rng.choice([-1, vocab + 3])
        num = torch.randint(0, spec + 1, (rows,), generator=gen, device=device)
        if step % 6 == 5:
            num[rng.randrange(rows)] = spec + 2
        mask = torch.rand(rows, generator=gen, device=device) >= 0.1
        if self.with_probs:
            return logits, drafts, num, torch.softmax(draft_logits, dim=-1), mask
        return logits, drafts, num, mask


def rejection_step(with_probs: bool) -> Callable[[RejectionSampler], StepFn]:
    """The speculative step a model runner captures: verify the drafts (with or without
    the draft model's probabilities), committing under a commit mask."""

    def make(rejection: RejectionSampler) -> StepFn:
        if with_probs:

            def step(
                target_logits: torch.Tensor,
                draft_token_ids: torch.Tensor,
                num_draft_tokens: torch.Tensor,
                draft_probs: torch.Tensor,
                commit_mask: torch.Tensor,
            ) -> tuple[torch.Tensor, ...]:
                out = rejection(target_logits, draft_token_ids, num_draft_tokens, draft_probs,
                                commit_mask=commit_mask)  # fmt: skip
                return (out.output_token_ids, out.num_accepted)

            return step

        def ngram_step(
            target_logits: torch.Tensor,
            draft_token_ids: torch.Tensor,
            num_draft_tokens: torch.Tensor,
            commit_mask: torch.Tensor,
        ) -> tuple[torch.Tensor, ...]:
            out = rejection(target_logits, draft_token_ids, num_draft_tokens,
                            commit_mask=commit_mask)  # fmt: skip
            return (out.output_token_ids, out.num_accepted)

        return ngram_step

    return make


def record_accepted(
    driver: BatchDriver, outputs: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...]
) -> None:
    """The speculative step: a row's accepted drafts and its emitted token, kept where the
    commit mask (last input) is."""
    tokens, accepted, keep = outputs[0].tolist(), outputs[1].tolist(), inputs[-1].tolist()
    for row, req in enumerate(driver.rows):
        if req is not None and keep[row]:
            req.output_tok_ids.extend(tokens[row][: accepted[row] + 1])


SPEC_HEADLINE_ROWS = 64
"""The headline case: 64 requests (S = SPEC_LEN, the first of --vocabs: 128,256 on a GPU)."""
SPEC_CHECK_WEIGHT = 1.0
SPEC_BENCH_WEIGHT = 2.0
"""Weights in the spec part's time: each replay check, and the benchmark (last)."""
SPEC_SETUP_S = 5.0
"""Added to the estimate of a benchmark shape: a capture and its replays per backend."""
SPEC_MIN_STEPS = 8
"""Steps a spec replay check runs even past its time: its setup (kernel compiles, the
capture) may outlast its share, and steps 4-6 bring the NaN/-inf rows, an over-long draft
count and an out-of-vocabulary draft (`SpecInputs`)."""


def spec_bench_rows(rows: Sequence[int]) -> list[int]:
    """The speculative benchmark's request counts (--spec-rows, default the grid's --rows)
    in run order: the headline 64 first when present, then the others, smallest first."""
    ordered = sorted(set(rows))
    if SPEC_HEADLINE_ROWS in ordered:
        ordered.remove(SPEC_HEADLINE_ROWS)
        ordered.insert(0, SPEC_HEADLINE_ROWS)
    return ordered


def spec_bench_inputs(
    rows: int, vocab: int, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """perf/bench_rejection.py's case at `rows` requests: LLM-like target logits
    [rows, S + 1, V], a draft model's probabilities [rows, S, V] (the target plus Gaussian
    noise, softmaxed), drafts drawn from them; S drafts per row, 0 to S - 1 on every eighth
    (rows 7, 15, ...). Returns (target_logits, draft_token_ids, num_draft_tokens,
    draft_probs), in `RejectionSampler.forward`'s order."""
    spec, positions = SPEC_LEN, SPEC_LEN + 1
    flat = llm_like_logits(rows * positions, vocab, seed=seed, device=device)
    target = flat.view(rows, positions, vocab)
    gen = torch.Generator(device).manual_seed(seed)
    noise = torch.randn(rows, spec, vocab, generator=gen, device=device)
    draft_probs = torch.softmax(noise.mul_(DRAFT_NOISE).add_(target[:, :spec]), dim=-1)
    del noise
    drafts = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=gen).view(rows, spec)
    num = torch.full((rows,), spec, dtype=torch.int64, device=device)
    short = num[7::8]
    short.copy_(torch.arange(short.numel(), device=device) % spec)
    sync(device)  # the timers run on side streams
    return target, drafts, num, draft_probs


def _spec_bench(opts: Options, deadline: float) -> dict[str, Any]:
    """The verification step timed like the bench part's cases (graph replay on CUDA),
    beside the floor of its target logits, appended to bench.json: `spec_bench_rows`
    requests at the first vocabulary, per backend. A shape starts only when its estimate
    (the largest shape so far, scaled by rows, first calls left out) fits in the time left;
    a provider that failed MAX_FAILURES_IN_A_ROW times in a row is not tried again."""
    device = opts.device()
    timer = Timer(device, opts.rep_ms, opts.cpu_rounds)
    context = run_context(device, suite="perf/gpu_check.py", timer=timer.name, rep_ms=opts.rep_ms,
                          flashinfer=flashinfer_version())  # fmt: skip
    book = BenchBook(opts, context)
    vocab = opts.vocabs[0]
    order = spec_bench_rows(opts.spec_rows or opts.rows)
    pool = SamplerPool(device, max(order), opts.seed)
    per_row_s: float | None = None  # host seconds per request row, from the largest shape
    largest = 0
    failures: dict[str, int] = {}  # provider -> errors in a row (as in the bench part)
    cases = errors = 0
    incomplete = False
    for rows in order:
        left = deadline - time.monotonic()
        estimate = SPEC_SETUP_S * len(opts.backends) + (per_row_s or 0.0) * rows
        if left < estimate:
            book.note(f"{SPEC_STAGE} stopped before {rows} requests: ~{estimate:.0f} s needed, "
                      f"{left:.0f} s left")  # fmt: skip
            incomplete = True
            break
        flat = rows * (SPEC_LEN + 1)
        start = time.monotonic()
        first_calls_s = 0.0
        try:
            inputs = spec_bench_inputs(rows, vocab, device, opts.seed)
            if not book.floor_of(flat, vocab):
                time_floor(book, timer, inputs[0].view(flat, vocab))
        except Exception as exc:
            errors += 1
            book.error(f"{SPEC_STAGE} inputs/floor R{flat}-V{vocab}", exc)
            if not cuda_alive(device):
                return {"status": "error", "reason": "the CUDA context broke", "cases": cases}
            continue
        for backend in opts.backends:
            kind = "sampler" if backend == "torch" else "sampler-triton"
            name = provider_name(kind, device)
            rejection = pool.get_rejection(vocab, backend, SPEC_LEN)
            if isinstance(rejection, str):
                book.note(f"{SPEC_STAGE} {name}: {rejection}")
                continue
            if failures.get(name, 0) >= MAX_FAILURES_IN_A_ROW:
                continue
            try:
                update_s = pool.load(rejection, SPEC_STAGE, rows)
                first = time.perf_counter()
                out = rejection(*inputs)  # untimed: kernel compiles, lazy inits
                accepted = float(out.num_accepted.float().mean())
                first_s = time.perf_counter() - first
                first_calls_s += first_s
                timed = timer(functools.partial(rejection, *inputs))
                extra = {"backend": backend, "requests": rows, "max_spec_len": SPEC_LEN,
                         "draft_probs": True, "max_num_logprobs": 0,
                         "update_s": round(update_s, 3), "first_call_s": round(first_s, 2),
                         "accepted_per_request": round(accepted, 2)}  # fmt: skip
                book.add(case_result(SPEC_STAGE, name, flat, vocab, timed, extra))
                cases += 1
                failures[name] = 0
            except Exception as exc:
                errors += 1
                failures[name] = failures.get(name, 0) + 1
                book.error(f"{SPEC_STAGE} {name} R{flat}-V{vocab}", exc)
                if failures[name] == MAX_FAILURES_IN_A_ROW:
                    book.note(f"{SPEC_STAGE} {name} failed {MAX_FAILURES_IN_A_ROW} times in a row: "
                              "not tried again")  # fmt: skip
                if not cuda_alive(device):
                    return {"status": "error", "reason": "the CUDA context broke", "cases": cases}
        del inputs
        if rows >= largest:
            largest = rows
            per_row_s = max(0.0, time.monotonic() - start - first_calls_s) / rows
    status = "failed" if errors else "incomplete" if incomplete else "passed"
    return {"status": status, "cases": cases, "errors": errors, "vocab": vocab, "rows": order}


def run_spec_part(opts: Options, deadline: float) -> dict[str, Any]:
    """The RejectionSampler: its replay checks (per backend, with the draft model's
    probabilities and with n-gram drafts) into graph_check.json, then its benchmark into
    bench.json (`_spec_bench`)."""
    device = opts.device()
    cuda = device.type == "cuda"
    make_replayer: MakeReplayer = CudaGraphReplayer if cuda else MakeFxReplayer
    kind = CudaGraphReplayer.kind if cuda else MakeFxReplayer.kind

    def replay_job(backend: str, with_probs: bool) -> Callable[[float], dict[str, Any]]:
        config = spec_config(opts, backend)

        def job(until: float) -> dict[str, Any]:
            probe = rejection_or_reason(config, device)
            if isinstance(probe, str):
                return {"status": "skipped", "reason": probe}
            del probe

            def make() -> RejectionSampler:
                return RejectionSampler(Sampler(config, device), SPEC_LEN)

            check = replay_check(
                make,
                make_replayer,
                steps=opts.steps,
                seed=opts.seed,
                deadline=until,
                step_fn=rejection_step(with_probs),
                make_inputs=functools.partial(SpecInputs, with_probs=with_probs),
                record=record_accepted,
                output_names=SPEC_OUTPUT_NAMES,
                min_steps=min(SPEC_MIN_STEPS, opts.steps),
            )
            return {**check, "draft_probs": with_probs}

        return job

    # (name, weight in the part's time, job); triton first, as in the graph part.
    jobs: list[Job] = [
        (f"{SPEC_STAGE}/{backend}/{drafts}/{kind}", SPEC_CHECK_WEIGHT,
         replay_job(backend, with_probs))
        for backend in ("triton", "torch")
        if backend in opts.backends
        for drafts, with_probs in (("draft_probs", True), ("ngram", False))
    ]  # fmt: skip
    jobs.append(("bench", SPEC_BENCH_WEIGHT, lambda until: _spec_bench(opts, until)))
    checks: list[str] = []
    statuses = []
    bench: dict[str, Any] = {}
    for name, result in run_jobs(jobs, deadline, device):
        if name == "bench":
            bench = result
        else:
            record_check(opts, name, result)
            checks.append(name)
        statuses.append(result["status"])
    return {"status": overall_status(statuses), "checks": checks, "bench": bench}
