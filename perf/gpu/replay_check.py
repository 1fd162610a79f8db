"""The replay check: a step captured once (a CUDA graph, a make_fx trace, or the compiled
step), replayed over random batch churn against an eager twin fed the same updates and
inputs, with host syncs forbidden; outputs and the state left behind must agree."""

from __future__ import annotations

import contextlib
import random
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from graphsafe_sampler import RejectionSampler, Sampler, SamplerConfig, SamplerOutput
from graphsafe_sampler.testing import BatchDriver, CudaGraphReplayer, MakeFxReplayer, StateTensors

from .device import no_host_sync, sync
from .report import error_text
from .targets import Target, all_feature_params

StepFn = Callable[..., tuple[torch.Tensor, ...]]
"""A captured step: its inputs positionally (the Sampler's: logits, commit mask), its
outputs a flat tuple of tensors."""
OUTPUT_NAMES = ("sampled_token_ids", "logprob_token_ids", "logprobs", "selected_token_ranks")
SPEC_OUTPUT_NAMES = ("output_token_ids", "num_accepted")
TOKEN_OUTPUTS = (OUTPUT_NAMES[0], *SPEC_OUTPUT_NAMES)
"""Outputs whose differences count as token mismatches (the others: logprob mismatches)."""
ATOL = 1e-5
RTOL = 1e-5
MAX_FAILURES_KEPT = 8


def flatten_output(out: SamplerOutput) -> tuple[torch.Tensor, ...]:
    """(tokens [rows, 1] int32[, logprob ids [rows, K+1], logprobs [rows, K+1], ranks [rows]])."""
    lp = out.logprobs_tensors
    if lp is None:
        return (out.sampled_token_ids,)
    return (out.sampled_token_ids, lp.logprob_token_ids, lp.logprobs, lp.selected_token_ranks)


def sampler_step(sampler: Sampler) -> StepFn:
    """The step a model runner captures: forward with a chunked-prefill commit mask."""

    def step(logits: torch.Tensor, commit_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return flatten_output(sampler(logits, commit_mask))

    return step


def same_values(want: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """0-dim bool: equal integers/bools; floats within ATOL + RTOL * |want|, NaN == NaN."""
    if not want.is_floating_point():
        return (want == got).all()
    close = (got - want).abs() <= ATOL + RTOL * want.abs()
    return (close | (got == want) | (got.isnan() & want.isnan())).all()


def diff_state(want: StateTensors, got: StateTensors) -> list[str]:
    """Names of state tensors whose values in `got` differ from `want`'s (the expected ones):
    integers exactly, floats within ATOL/RTOL; one host read per device."""
    verdicts: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    bad = []
    for name, expected in want.tensors.items():
        actual = got.tensors.get(name)
        if actual is None or actual.shape != expected.shape or actual.dtype != expected.dtype:
            bad.append(name)
            continue
        verdicts.setdefault(expected.device, []).append((name, same_values(expected, actual)))
    for pairs in verdicts.values():
        flags = torch.stack([flag for _, flag in pairs]).tolist()
        bad.extend(name for (name, _), ok in zip(pairs, flags, strict=True) if not ok)
    return bad


def diff_outputs(
    want: tuple[torch.Tensor, ...],
    got: tuple[torch.Tensor, ...],
    names: Sequence[str] | None = None,
) -> list[str]:
    """Why the replay's outputs differ from eager's (empty: they agree); each problem starts
    with the output's name (`names`, default the Sampler's OUTPUT_NAMES).

    Tokens, ranks and other integer outputs must be equal. Logprob token ids must be equal
    where the logprob is finite and not tied with another column of the row (ties and -inf
    columns may name any of the tied ids); logprobs must be close."""
    if len(want) != len(got):
        return [f"outputs: {len(got)} tensors, eager gave {len(want)}"]
    if names is None or len(names) != len(want):
        names = (
            OUTPUT_NAMES if len(want) in (1, 4) else tuple(f"output {i}" for i in range(len(want)))
        )
    problems = []
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w.shape != g.shape or w.dtype != g.dtype:
            problems.append(
                f"{names[i]}: {tuple(g.shape)} {g.dtype}, eager {tuple(w.shape)} {w.dtype}"
            )
            continue
        if names[i] == "logprob_token_ids":
            values = want[2]
            tied = (values[:, :, None] == values[:, None, :]).sum(-1) > 1
            excused = tied | ~values.isfinite()
            excused[:, 0] = False  # column 0 is the sampled token: always exact
            differ = (w != g) & ~excused
        elif w.is_floating_point():
            differ = ~((g - w).abs() <= ATOL + RTOL * w.abs()) & (g != w) & ~(g.isnan() & w.isnan())
        else:
            differ = w != g
        count = int(differ.sum())
        if count:
            rows = differ.reshape(differ.shape[0], -1).any(dim=1).nonzero().flatten()[:4].tolist()
            r = rows[0]
            problems.append(
                f"{names[i]}: {count} elements differ, rows {rows}; row {r}: "
                f"eager {w[r].flatten()[:6].tolist()}, replay {g[r].flatten()[:6].tolist()}"
            )
    return problems


class CompiledReplayer:
    """`torch.compile(fn, fullgraph=True)`; on CUDA the compiled step is then captured by
    hand in a CUDA graph (what an engine does), elsewhere it is called every step (and must
    not recompile as the batch churns)."""

    def __init__(
        self,
        fn: StepFn,
        example: tuple[torch.Tensor, ...],
        state: StateTensors,
        backend: str = "inductor",
    ) -> None:
        from torch._dynamo.testing import CompileCounterWithBackend

        torch._dynamo.reset()
        self.counter = CompileCounterWithBackend(backend)
        self.compiled = torch.compile(fn, fullgraph=True, backend=self.counter)
        snap = state.snapshot()
        start = time.perf_counter()
        self.compiled(*(t.clone() for t in example))
        sync(example[0].device)
        compile_s = time.perf_counter() - start
        state.restore(snap)
        self.graph: CudaGraphReplayer | None = None
        if example[0].device.type == "cuda":
            self.graph = CudaGraphReplayer(self.compiled, example, state)
        self.kind = "compiled+cuda-graph" if self.graph is not None else "compiled"
        self.info = {"compile_s": round(compile_s, 1)}

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.info["compile_frames"] = self.counter.frame_count
        if self.graph is not None:
            return self.graph(*inputs)
        return tuple(t.clone() for t in self.compiled(*(t.clone() for t in inputs)))


Replayer = CudaGraphReplayer | MakeFxReplayer | CompiledReplayer
MakeReplayer = Callable[[StepFn, tuple[torch.Tensor, ...], StateTensors], Replayer]


def update_alike(samplers: Sequence[Target], driver: BatchDriver, rng: np.random.Generator) -> None:
    """The engine's side of a step, the same for every sampler: the driver's next update,
    then a random grammar bitmask (cleared 1 time in 10, staged on a few random rows 4 in
    10). A RejectionSampler gets one mask per verified position ([rows, S + 1, words])."""
    update = driver.next_update()
    for sampler in samplers:
        sampler.update_state(update)
    config, draw = samplers[0].config, rng.random()
    if draw < 0.1:
        for sampler in samplers:
            sampler.stage_grammar_bitmask(None)
    elif draw < 0.5:
        size = int(rng.integers(1, max(2, config.max_num_reqs // 4) + 1))
        rows = sorted(rng.choice(config.max_num_reqs, size=size, replace=False).tolist())
        spec = getattr(samplers[0], "max_spec_len", None)
        positions = () if spec is None else (spec + 1,)
        words = (config.vocab_size + 31) // 32
        bits = rng.integers(-(2**31), 2**31, size=(len(rows), *positions, words), dtype=np.int64)
        for sampler in samplers:
            sampler.stage_grammar_bitmask(bits.astype(np.int32), rows=rows)


class StepInputs:
    """Fresh inputs per step, drawn on the device (no host copy per step): logits whose
    spread varies per step, with a NaN row and an all -inf row every 5th step, and a commit
    mask keeping about 1 row in 10 out (as chunked prefill does)."""

    def __init__(self, config: SamplerConfig, device: torch.device, seed: int) -> None:
        self.rows, self.vocab = config.max_num_reqs, config.vocab_size
        self.device = device
        self.gen = torch.Generator(device).manual_seed(seed)
        self.rng = random.Random(seed)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows, device, gen = self.rows, self.device, self.gen
        logits = torch.randn(rows, self.vocab, generator=gen, device=device)
        logits *= self.rng.uniform(0.5, 8.0)
        if step % 5 == 4 and rows >= 2:
            nan_row, inf_row = self.rng.sample(range(rows), 2)
            logits[nan_row] = float("nan")
            logits[inf_row] = float("-inf")
        mask = torch.rand(rows, generator=gen, device=device) >= 0.1
        return logits, mask


MakeInputs = Callable[[SamplerConfig, torch.device, int], Callable[[int], tuple[torch.Tensor, ...]]]
"""(config, device, seed) -> inputs(step): a step's inputs, in the step function's order."""
RecordTokens = Callable[[BatchDriver, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]], None]
"""(driver, eager's outputs, the step's inputs): the engine appends what was committed."""


def record_sampled(
    driver: BatchDriver, outputs: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...]
) -> None:
    """The Sampler's step: one token per row, kept where the commit mask (last input) is."""
    driver.record_tokens(outputs[0][:, 0].tolist(), inputs[-1].tolist())


def replay_check(
    make_sampler: Callable[[], Target],
    make_replayer: MakeReplayer,
    *,
    steps: int,
    seed: int,
    deadline: float,
    step_fn: Callable[[Any], StepFn] = sampler_step,
    make_inputs: MakeInputs = StepInputs,
    record: RecordTokens = record_sampled,
    output_names: Sequence[str] | None = None,
    min_steps: int = 0,
) -> dict[str, Any]:
    """Capture `step_fn(sampler)` once (`make_replayer`), then for each of `steps` random
    batch states: update both samplers alike, replay the capture on one and run the other
    eagerly on the same inputs, with host syncs forbidden around both; outputs and the
    state left behind must agree. A mismatch is recorded and the replayed sampler is reset
    to the twin's state, so each later step is judged on its own. Stops at `deadline`, once
    `min_steps` steps are done (a capture whose setup outlasted its time still gets judged).

    The defaults drive `Sampler.forward`; a RejectionSampler's check passes its step
    (`rejection_step`), inputs (`SpecInputs`), `record_accepted` and SPEC_OUTPUT_NAMES."""
    result: dict[str, Any] = {
        "status": "error",
        "steps_requested": steps,
        "steps_run": 0,
        "token_mismatches": 0,
        "logprob_mismatches": 0,
        "state_mismatches": 0,
        "address_changes": 0,
        "failures": [],
    }
    started = time.monotonic()
    replayed, eager = make_sampler(), make_sampler()
    config, device = replayed.config, replayed.device
    result.update(
        rows=config.max_num_reqs,
        vocab=config.vocab_size,
        max_num_logprobs=config.max_num_logprobs,
        logprobs_mode=config.logprobs_mode,
        backend=getattr(getattr(replayed, "sampler", replayed), "backend", config.backend),
        device=str(device),
    )
    if isinstance(replayed, RejectionSampler):
        result["max_spec_len"] = replayed.max_spec_len
    driver = BatchDriver(config, seed=seed, make_params=all_feature_params, churn=0.25)
    grammar_rng = np.random.default_rng(seed)
    inputs = make_inputs(config, device, seed)
    update_alike((replayed, eager), driver, grammar_rng)
    state, twin_state = StateTensors(replayed), StateTensors(eager)
    eager_fn = step_fn(eager)

    def fail(kind: str, message: str) -> None:
        if kind:
            result[kind] += 1
        if len(result["failures"]) < MAX_FAILURES_KEPT:
            result["failures"].append(message)

    replayer = make_replayer(step_fn(replayed), inputs(-1), state)
    result["replay"] = replayer.kind
    result["setup_s"] = round(time.monotonic() - started, 2)
    for step in range(steps):
        if step >= min_steps and time.monotonic() > deadline:
            break
        if step:
            update_alike((replayed, eager), driver, grammar_rng)
        moved = state.address_changes().names()
        if moved:
            fail("address_changes", f"step {step}: state tensors reallocated: {moved[:5]}")
        step_inputs = inputs(step)
        try:
            # On the CPU the sync guard is a TorchDispatchMode, under which torch.compile
            # refuses to run compiled code: the compiled replay goes unguarded there.
            guard = device.type == "cuda" or not isinstance(replayer, CompiledReplayer)
            with (
                no_host_sync(device, f"step {step}: replay") if guard else contextlib.nullcontext()
            ):
                got = replayer(*step_inputs)
            with no_host_sync(device, f"step {step}: eager"):
                want = eager_fn(*(t.clone() for t in step_inputs))
            sync(device)
        except Exception as exc:  # a sync, a crash: the step cannot be judged
            fail("", f"step {step}: {error_text(exc)}")
            result["error"] = traceback.format_exc()[-3000:]
            result["seconds"] = round(time.monotonic() - started, 2)
            return result
        problems = diff_outputs(want, got, output_names)
        for problem in problems:
            token = problem.split(":", 1)[0] in TOKEN_OUTPUTS
            fail("token_mismatches" if token else "logprob_mismatches", f"step {step}: {problem}")
        bad_state = diff_state(twin_state, state)
        if bad_state:
            fail("state_mismatches", f"step {step}: state differs from eager's: {bad_state[:6]}")
        if problems or bad_state:
            state.restore(twin_state.tensors)  # judge the next step on its own
        record(driver, want, step_inputs)
        if "max_spec_len" in result:  # how much of the acceptance path the steps exercised
            result["accepted_drafts"] = result.get("accepted_drafts", 0) + int(want[1].sum())
        result["steps_run"] = step + 1
    if isinstance(replayer, CompiledReplayer):  # its compile time and frames
        result.update(replayer.info)
    mismatches = sum(
        result[k]
        for k in ("token_mismatches", "logprob_mismatches", "state_mismatches", "address_changes")
    )
    if mismatches:
        result["status"] = "failed"
    elif result["steps_run"] < steps:
        result["status"] = "incomplete"
    else:
        result["status"] = "passed"
    result["seconds"] = round(time.monotonic() - started, 2)
    return result
