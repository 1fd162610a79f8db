"""`graphsafe-sampler demo`: the sampler inside a model runner, eager against compiled.

A tiny random-weight decoder (`examples/tiny_decoder.py`) and a `Sampler` serve a stream of
requests with mixed `SamplingParams` through a continuous-batching loop, vLLM style:

- the engine (host code, outside the compiled step) admits arriving requests into free rows
  of a persistent batch, prefills their KV cache, drops finished ones (max_tokens reached,
  EOS or a stop token) and condenses the batch by moving the last rows into the holes; every
  change goes to the sampler as one `BatchUpdate` (`BatchUpdateBuilder` -> `update_state`);
- one decode step is `model(input_ids, kv_slots, positions)` + `sampler(logits)`, one
  function (`decode_step`) run eagerly, compiled with `torch.compile(fullgraph=True)`, and on
  CUDA also captured as one `torch.cuda.CUDAGraph` per padded batch-size bucket and replayed;
- the step reads its inputs from fixed-address buffers (`DecodeInputs`) that the engine fills
  each step with one host-to-device copy, and the batch is padded up to the next bucket.

Each mode runs the same request stream from a fresh sampler with the same `SamplerConfig.seed`
(the counter-based RNG makes seeded and unseeded requests reproducible), and every step's
tokens must be identical across modes. It prints tokens/s per mode and exits non-zero when
tokens differ or a check fails (min_tokens, bad words, recompiles during the loop).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import math
import random
import statistics
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graphsafe_sampler.batch_update import BatchUpdateBuilder, MoveDirectionality
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.examples.tiny_decoder import TinyDecoder, TinyDecoderConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.sampler import Sampler

MODES = ("eager", "compiled", "cuda-graph")
# Buckets start at 2: torch.compile specialises a dimension of size 1, so a bucket of 1 would
# cost a second compile; a lone request is padded to 2 rows instead.
MIN_BUCKET = 2

# [bucket] -> the step's [bucket, 1] int32 token ids.
StepRunner = Callable[[int], torch.Tensor]


def decode_step(
    model: TinyDecoder,
    sampler: Sampler,
    input_ids: torch.Tensor,  # [num_rows] int64
    kv_slots: torch.Tensor,  # [num_rows] int64
    positions: torch.Tensor,  # [num_rows] int64
) -> torch.Tensor:
    """One decode step, the unit that is compiled and captured: the model's forward and the
    sampler's, which commits each real row's token to its request's device-side history.
    Returns [num_rows, 1] int32 token ids."""
    logits = model(input_ids, kv_slots, positions)  # [num_rows, V] float32
    return sampler(logits).sampled_token_ids


# ----------------------------------------------------------------- the request stream


@dataclass(frozen=True)
class DemoRequest:
    """One request of the stream: when it arrives, what it asks for, and its kind's name."""

    request_id: int
    arrival_step: int
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    max_tokens: int
    kind: str


def _request_params(
    kind: str, rng: random.Random, vocab_size: int, eos_token_id: int, max_tokens: int
) -> SamplingParams:
    """SamplingParams of one request kind; the token ids involved are drawn from `rng`, and
    min_tokens stays below `max_tokens` so that stop tokens and EOS get their turn."""

    def tokens(n: int) -> list[int]:
        return rng.sample(range(vocab_size - 1), n)  # never the EOS id

    seed = rng.randrange(2**63) if rng.random() < 0.5 else None  # half seeded, half not
    if kind == "greedy":
        return SamplingParams(temperature=0.0)
    if kind == "temperature":
        return SamplingParams(temperature=0.8, seed=seed)
    if kind == "top-k":
        return SamplingParams(temperature=1.0, top_k=20, seed=seed)
    if kind == "top-p":
        return SamplingParams(temperature=0.9, top_p=0.8, seed=seed)
    if kind == "min-p":
        return SamplingParams(temperature=1.0, min_p=0.1, seed=seed)
    if kind == "top-k+top-p+min-p":
        return SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.02, seed=seed)
    if kind == "penalties":
        return SamplingParams(
            temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.6
        )
    if kind == "logit-bias":
        bias = {t: rng.uniform(-8.0, 8.0) for t in tokens(8)}
        return SamplingParams(temperature=0.9, logit_bias=bias, seed=seed)
    if kind == "stop+min_tokens":
        # Strongly biased stop tokens: masked for the first min_tokens tokens, likely after.
        stop = tokens(2)
        return SamplingParams(
            temperature=1.0,
            stop_token_ids=stop,
            logit_bias=dict.fromkeys(stop, 12.0),
            min_tokens=rng.randint(min(3, max_tokens - 1), min(8, max_tokens - 1)),
            seed=seed,
        )
    if kind == "eos+min_tokens":
        return SamplingParams(
            temperature=1.0,
            logit_bias={eos_token_id: 11.0},
            min_tokens=rng.randint(min(2, max_tokens - 1), min(6, max_tokens - 1)),
            seed=seed,
        )
    if kind == "bad-words":
        words = [[t] for t in tokens(3)] + [tokens(2) for _ in range(2)]
        return SamplingParams(temperature=0.9, bad_words_token_ids=words, seed=seed)
    if kind == "ignore-eos":
        return SamplingParams(
            temperature=1.0, logit_bias={eos_token_id: 11.0}, ignore_eos=True, seed=seed
        )
    raise ValueError(f"unknown request kind {kind!r}")


REQUEST_KINDS = (
    "greedy",
    "temperature",
    "top-k",
    "top-p",
    "min-p",
    "top-k+top-p+min-p",
    "penalties",
    "logit-bias",
    "stop+min_tokens",
    "eos+min_tokens",
    "bad-words",
    "ignore-eos",
)


def make_request_stream(
    *,
    num_steps: int,
    max_num_reqs: int,
    vocab_size: int,
    eos_token_id: int,
    max_prompt_len: int,
    max_tokens: int,
    seed: int,
) -> list[DemoRequest]:
    """Requests arriving over the first 3/4 of `num_steps` (the rest lets the batch drain),
    at a rate that keeps about 3/4 of `max_num_reqs` rows busy; kinds in turn."""
    rng = random.Random(seed)
    mean_len = (4 + max_tokens) / 2
    rate = 0.75 * max_num_reqs / mean_len  # arrivals per step
    stream: list[DemoRequest] = []
    clock = 0.0
    while True:
        clock += rng.expovariate(rate)
        arrival = int(clock)
        if arrival >= max(1, (3 * num_steps) // 4):
            return stream
        kind = REQUEST_KINDS[len(stream) % len(REQUEST_KINDS)]
        prompt = tuple(rng.randrange(vocab_size - 1) for _ in range(rng.randint(1, max_prompt_len)))
        request_max_tokens = rng.randint(min(4, max_tokens), max_tokens)
        params = _request_params(kind, rng, vocab_size, eos_token_id, request_max_tokens)
        stream.append(
            DemoRequest(
                request_id=len(stream),
                arrival_step=arrival,
                prompt_token_ids=prompt,
                params=params,
                max_tokens=request_max_tokens,
                kind=kind,
            )
        )


# ----------------------------------------------------------------- the step's inputs and runners


class DecodeInputs:
    """The decode step's inputs at fixed addresses, as a captured graph needs them.

    device: [3, max_rows] int64 (input ids, KV slots, positions); a step of `bucket` rows
    reads the first `bucket` columns. host: its twin (pinned on CUDA), filled by the engine
    and sent whole in one host-to-device copy per step (a few hundred bytes). The host
    rewrites it only after reading the previous step's tokens, which waits for that step,
    so the earlier copy has finished.
    """

    def __init__(self, max_rows: int, device: torch.device, padding_kv_slot: int) -> None:
        self.padding_kv_slot = padding_kv_slot
        self.device = torch.zeros(3, max_rows, dtype=torch.int64, device=device)
        self.host = torch.zeros(3, max_rows, dtype=torch.int64, pin_memory=device.type == "cuda")

    def stage(
        self, input_ids: Sequence[int], kv_slots: Sequence[int], positions: Sequence[int]
    ) -> None:
        """Write the real rows, make every other row padding (token 0 at position 0 in the
        scratch KV slot) and copy the buffer to the device."""
        n = len(input_ids)
        host = self.host.numpy()
        host[0, :n], host[1, :n], host[2, :n] = input_ids, kv_slots, positions
        host[0, n:], host[1, n:], host[2, n:] = 0, self.padding_kv_slot, 0
        self.device.copy_(self.host, non_blocking=True)

    def views(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids, kv_slots, positions: [bucket] int64 views of the device buffer."""
        return self.device[0, :bucket], self.device[1, :bucket], self.device[2, :bucket]


def compile_decode_step(device: torch.device, *, simd: bool = False) -> Callable[..., Any]:
    """`decode_step` under `torch.compile(fullgraph=True)`.

    On CPU, `simd=False` asks inductor for scalar C++ (a per-call option; nothing global
    changes). The sampler's exact top-k/top-p is a 33-pass search, and its SIMD C++ is
    hundreds of kB that take g++ most of the compile: measured cold on 2 cores with the
    demo's defaults, the whole run took 47 s scalar against 136 s SIMD, while the compiled
    step was 8.3 ms against 3.6 ms (eager: 14.4 ms). A one-minute demo wants the former.
    """
    options: dict[str, str | int | bool | Callable[..., Any]] | None = None
    if device.type == "cpu" and not simd:
        options = {"cpp.vec_isa_ok": False}
    return torch.compile(decode_step, fullgraph=True, options=options)


def eager_runner(model: TinyDecoder, sampler: Sampler, inputs: DecodeInputs) -> StepRunner:
    def run(bucket: int) -> torch.Tensor:
        return decode_step(model, sampler, *inputs.views(bucket))

    return run


def compiled_runner(
    model: TinyDecoder, sampler: Sampler, inputs: DecodeInputs, compiled_step: Callable[..., Any]
) -> StepRunner:
    """The compiled step. The batch dimension is marked dynamic (from MIN_BUCKET up), so one
    compile serves every bucket."""
    max_rows = inputs.device.shape[1]

    def run(bucket: int) -> torch.Tensor:
        views = inputs.views(bucket)
        for view in views:
            torch._dynamo.mark_dynamic(view, 0, min=MIN_BUCKET, max=max_rows)
        out: torch.Tensor = compiled_step(model, sampler, *views)
        return out

    return run


def cuda_graph_runner(
    model: TinyDecoder,
    sampler: Sampler,
    inputs: DecodeInputs,
    compiled_step: Callable[..., Any],
    buckets: Sequence[int],
) -> StepRunner:
    """One `torch.cuda.CUDAGraph` of the compiled step per bucket, captured with no request
    in the batch (every row padding, so the captures commit nothing), largest first into one
    shared memory pool, as vLLM captures its buckets; a step is a replay."""
    step = compiled_runner(model, sampler, inputs, compiled_step)
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
    for bucket in sorted(buckets, reverse=True):
        inputs.stage([], [], [])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy inits and autotuning stay out of the capture
                step(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = step(bucket)
        graphs[bucket] = (graph, out)
    torch.cuda.synchronize()

    def run(bucket: int) -> torch.Tensor:
        graph, out = graphs[bucket]
        graph.replay()
        return out

    return run


# ----------------------------------------------------------------- the engine


@dataclass
class _Running:
    request: DemoRequest
    kv_slot: int
    output_token_ids: list[int] = field(default_factory=list)

    @property
    def next_input(self) -> tuple[int, int]:
        """(token, position) the next decode step feeds: the newest token of the sequence."""
        prompt, output = self.request.prompt_token_ids, self.output_token_ids
        token = output[-1] if output else prompt[-1]
        return token, len(prompt) + len(output) - 1


@dataclass
class RunResult:
    """What one mode's run of the stream produced.

    transcript: per step, the (request_id, token) of every row that ran, sorted by id.
    finished: request_id -> why it finished ("length", "stop", "eos").
    violations: host-side checks that failed (min_tokens, bad words, recompiles).
    batch_changes: adds, removes and moves sent to the sampler in BatchUpdates.
    """

    mode: str
    transcript: list[tuple[tuple[int, int], ...]]
    finished: dict[int, str]
    num_tokens: int
    seconds: float
    step_seconds: list[float]
    bucket_steps: Counter[int]
    violations: list[str]
    batch_changes: Counter[str]
    setup_seconds: float = 0.0
    compiles: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else math.inf


class Engine:
    """Host-side continuous batching over a persistent batch of `max_num_reqs` rows.

    Rows [0, batch_size) hold requests, vLLM style: a finished request frees its row
    (`removed_append`), an arriving one takes the lowest freed row (`pop_removed`) or the
    end of the batch, and the last rows move into the holes left (`UNIDIRECTIONAL` moves).
    Requests own a KV slot for life; slots are handed out lowest first.
    """

    def __init__(
        self,
        model: TinyDecoder,
        sampler: Sampler,
        inputs: DecodeInputs,
        runner: StepRunner,
        buckets: Sequence[int],
    ) -> None:
        if model.config.num_kv_slots < sampler.config.max_num_reqs:
            raise ValueError(
                f"the model holds {model.config.num_kv_slots} KV slots, fewer than the "
                f"sampler's max_num_reqs = {sampler.config.max_num_reqs}"
            )
        if not buckets or max(buckets) < sampler.config.max_num_reqs:
            raise ValueError(
                f"buckets {list(buckets)} do not reach max_num_reqs = {sampler.config.max_num_reqs}"
            )
        self.model = model
        self.sampler = sampler
        self.inputs = inputs
        self.runner = runner
        self.buckets = sorted(buckets)
        self.max_num_reqs = sampler.config.max_num_reqs
        self.eos_token_id = sampler.config.eos_token_id
        self.rows: list[_Running | None] = [None] * self.max_num_reqs
        self.free_kv_slots = list(range(model.config.num_kv_slots))
        self.builder = BatchUpdateBuilder()

    def bucket_for(self, batch_size: int) -> int:
        return next(b for b in self.buckets if b >= batch_size)

    def _admit(self, request: DemoRequest) -> None:
        length = len(request.prompt_token_ids) + request.max_tokens
        if not request.prompt_token_ids or length > self.model.config.max_seq_len:
            raise ValueError(
                f"request {request.request_id}: prompt ({len(request.prompt_token_ids)} tokens, "
                f"at least 1) + max_tokens ({request.max_tokens}) must fit the KV cache's "
                f"max_seq_len = {self.model.config.max_seq_len}"
            )
        row = self.builder.pop_removed()
        if row is None:
            row = self.rows.index(None)  # the batch is dense: the first empty row is its end
        kv_slot = heapq.heappop(self.free_kv_slots)
        # All prompt tokens but the last: the decode step feeds that one (see tiny_decoder).
        self.model.prefill(kv_slot, request.prompt_token_ids[:-1])
        running = _Running(request, kv_slot)
        self.rows[row] = running
        # output_token_ids is the live list the engine appends to (vLLM's contract).
        self.builder.added.append(
            (row, request.params, list(request.prompt_token_ids), running.output_token_ids)
        )

    def _condense(self) -> int:
        """Move the last requests into the holes; returns the batch size."""
        while (hole := self.builder.peek_removed()) is not None:
            last = max((r for r, q in enumerate(self.rows) if q is not None), default=-1)
            if last < hole:
                break  # the remaining holes are past the end of the batch
            self.builder.pop_removed()
            self.rows[hole], self.rows[last] = self.rows[last], None
            self.builder.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        return sum(q is not None for q in self.rows)

    def _finish_reason(self, running: _Running, token: int, violations: list[str]) -> str | None:
        params, output = running.request.params, running.output_token_ids
        rid = running.request.request_id
        for word in params.bad_words_token_ids or ():
            if output[-len(word) :] == word:
                violations.append(f"request {rid} completed bad word {word}")
        is_eos = token == self.eos_token_id
        is_stop = token in (params.stop_token_ids or ())
        if (is_eos or is_stop) and len(output) <= params.min_tokens:
            # The token was generated while fewer than min_tokens outputs existed.
            violations.append(f"request {rid} produced stop/EOS token {token} before min_tokens")
        if is_stop:
            return "stop"
        if is_eos and not params.ignore_eos:
            return "eos"
        if len(output) >= running.request.max_tokens:
            return "length"
        return None

    def run(self, stream: Sequence[DemoRequest], num_steps: int, mode: str) -> RunResult:
        """Serve `stream` for `num_steps` decode steps (timed as a whole)."""
        pending = deque(sorted(stream, key=lambda r: (r.arrival_step, r.request_id)))
        transcript: list[tuple[tuple[int, int], ...]] = []
        finished: dict[int, str] = {}
        violations: list[str] = []
        step_seconds: list[float] = []
        bucket_steps: Counter[int] = Counter()
        batch_changes: Counter[str] = Counter()
        num_tokens = 0
        start = time.perf_counter()
        for step in range(num_steps):
            while pending and pending[0].arrival_step <= step and None in self.rows:
                self._admit(pending.popleft())
            batch_size = self._condense()
            update = self.builder.get_and_reset(batch_size)
            if update is not None:
                batch_changes.update(
                    added=len(update.added), removed=len(update.removed), moved=len(update.moved)
                )
            self.sampler.update_state(update)
            if batch_size == 0:
                transcript.append(())
                continue
            running = [r for r in self.rows[:batch_size] if r is not None]
            if len(running) != batch_size:
                raise RuntimeError(f"rows [0, {batch_size}) are not all occupied after condensing")
            bucket = self.bucket_for(batch_size)
            tokens_positions = [r.next_input for r in running]
            t0 = time.perf_counter()
            self.inputs.stage(
                [t for t, _ in tokens_positions],
                [r.kv_slot for r in running],
                [p for _, p in tokens_positions],
            )
            # The engine's host read: it needs the tokens to detokenize and to stop requests.
            tokens = self.runner(bucket)[:batch_size, 0].tolist()
            step_seconds.append(time.perf_counter() - t0)
            bucket_steps[bucket] += 1
            num_tokens += batch_size
            transcript.append(
                tuple(
                    sorted((r.request.request_id, t) for r, t in zip(running, tokens, strict=True))
                )
            )
            for row, (r, token) in enumerate(zip(running, tokens, strict=True)):
                r.output_token_ids.append(token)
                reason = self._finish_reason(r, token, violations)
                if reason is not None:
                    finished[r.request.request_id] = reason
                    self.rows[row] = None
                    heapq.heappush(self.free_kv_slots, r.kv_slot)
                    self.builder.removed_append(row)
        seconds = time.perf_counter() - start
        return RunResult(
            mode=mode,
            transcript=transcript,
            finished=finished,
            num_tokens=num_tokens,
            seconds=seconds,
            step_seconds=step_seconds,
            bucket_steps=bucket_steps,
            violations=violations,
            batch_changes=batch_changes,
        )


# ----------------------------------------------------------------- options and the run


@dataclass(frozen=True)
class DemoOptions:
    """The demo's settings, checked (see `add_demo_arguments` for their meaning)."""

    steps: int = 160
    max_num_reqs: int = 16
    buckets: tuple[int, ...] = ()
    vocab: int = 4099
    hidden_size: int = 64
    num_layers: int = 2
    max_prompt_len: int = 16
    max_tokens: int = 40
    device: str = "auto"
    threads: int = 1
    seed: int = 0
    modes: tuple[str, ...] = ()
    simd: bool = False
    quiet: bool = False

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> DemoOptions:
        """Build and check the options; ValueError names the option and its limit."""
        values = {
            name: getattr(args, name) for name in cls.__dataclass_fields__ if hasattr(args, name)
        }
        return cls(**values)

    def __post_init__(self) -> None:
        for name, minimum in (
            ("steps", 1),
            ("max_num_reqs", MIN_BUCKET),
            ("vocab", 16),
            ("hidden_size", 4),
            ("num_layers", 1),
            ("max_prompt_len", 1),
            ("max_tokens", 1),
            ("threads", 1),
            ("seed", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"--{name.replace('_', '-')} must be an int, got {value!r}")
            if value < minimum:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")
        if self.vocab >= 2**31:
            raise ValueError(f"--vocab must be < 2**31, got {self.vocab}")
        if self.hidden_size % 4:
            raise ValueError(
                f"--hidden-size must be a multiple of 4 (the heads), got {self.hidden_size}"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device must be auto, cpu or cuda[:N], got {self.device!r}")
        buckets = tuple(self.buckets) or default_buckets(self.max_num_reqs)
        if list(buckets) != sorted(set(buckets)) or buckets[0] < MIN_BUCKET:
            raise ValueError(
                f"--buckets must be increasing sizes >= {MIN_BUCKET}, got {list(buckets)}"
            )
        if buckets[-1] != self.max_num_reqs:
            raise ValueError(
                f"--buckets: the largest bucket must equal --max-num-reqs = {self.max_num_reqs} "
                f"(a full batch must fit), got {buckets[-1]}"
            )
        object.__setattr__(self, "buckets", buckets)
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"--modes: unknown mode {mode!r}; choose from {', '.join(MODES)}")
        if self.modes and "eager" not in self.modes:
            raise ValueError("--modes must include eager: it is the reference the others match")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: CUDA is not available on this machine")
        return device

    def resolved_modes(self, device: torch.device) -> tuple[str, ...]:
        if self.modes:
            if "cuda-graph" in self.modes and device.type != "cuda":
                raise ValueError("--modes cuda-graph needs --device cuda")
            return self.modes
        return MODES if device.type == "cuda" else MODES[:2]


def default_buckets(max_num_reqs: int) -> tuple[int, ...]:
    """Powers of two from MIN_BUCKET below max_num_reqs, then max_num_reqs itself."""
    out = []
    size = MIN_BUCKET
    while size < max_num_reqs:
        out.append(size)
        size *= 2
    return (*out, max_num_reqs)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def _mode_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


# (flag, type, help); the default comes from DemoOptions.
_ARGUMENTS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("--steps", int, "decode steps per mode; requests arrive over the first 3/4"),
    ("--max-num-reqs", int, "rows of the persistent batch, KV slots and the largest bucket"),
    ("--buckets", _int_list,
     "padded batch sizes, comma-separated, increasing, each >= 2, the last = --max-num-reqs; "
     "one compile serves them all (default: powers of two from 2, then --max-num-reqs)"),
    ("--vocab", int,
     "vocabulary size; EOS is the last id. Small and odd: the step stays cheap on a CPU and "
     "the kernels' masked tails get exercised"),
    ("--hidden-size", int, "model width, a multiple of the 4 heads"),
    ("--num-layers", int, "transformer blocks"),
    ("--max-prompt-len", int, "prompts have 1 to this many random tokens"),
    ("--max-tokens", int, "each request's max_tokens is drawn from [4, this]"),
    ("--device", str, "auto (CUDA if available), cpu, cuda or cuda:N"),
    ("--threads", int,
     "torch intra-op CPU threads during the run: the demo's ops are tiny, and handing each "
     "to a second OpenMP thread costs more than it saves (on a busy host, many times more)"),
    ("--seed", int, "seeds the weights, the request stream and SamplerConfig.seed"),
    ("--modes", _mode_list,
     "comma-separated subset of eager,compiled,cuda-graph; eager is required "
     "(default: eager,compiled, plus cuda-graph on CUDA)"),
)  # fmt: skip


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to `parser` (the `graphsafe-sampler demo` subcommand)."""
    defaults = DemoOptions()
    parser.description = (
        "Serve a stream of requests with mixed sampling parameters through a tiny random-weight "
        "decoder and the Sampler in a continuous-batching loop, eagerly and with the decode "
        "step (model + sampler) compiled by torch.compile(fullgraph=True) (on CUDA also "
        "replayed as one CUDA graph per batch bucket); check that every step's tokens are "
        "identical and print tokens/s per mode. The defaults (vocab 4,099, 2 layers of "
        "width 64, 16 rows in buckets 2/4/8/16, one compile for all buckets, scalar C++ on "
        "CPU, one thread) keep a cold run under a minute on 2 cores, most of it the one "
        "compile; with a warm inductor cache it takes seconds. Exits 1 if tokens "
        "differ or a check fails, 2 on bad options."
    )
    for flag, kind, help_text in _ARGUMENTS:
        name = flag[2:].replace("-", "_")
        default = getattr(defaults, name)
        if name in ("buckets", "modes"):
            default = ()  # derived from the other options
        else:
            help_text += " (default %(default)s)"
        parser.add_argument(flag, type=kind, default=default, help=help_text)
    parser.add_argument(
        "--simd",
        action="store_true",
        help="on CPU, let inductor emit SIMD C++: the compiled step gets about 2x faster, the "
        "compile about 3x slower (default: scalar C++, so that a cold run takes about a minute)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only the summary table and the verdict"
    )


# ----------------------------------------------------------------- running the modes


@dataclass
class DemoSetup:
    """What every mode shares: the model (weights and KV cache; a request's cache entries
    are all written before they are read, so runs need no reset), the sampler's config
    (each mode builds a fresh Sampler from it: same seed, same unseeded draws), the stream,
    and the compiled step (None when only eager runs)."""

    options: DemoOptions
    device: torch.device
    model: TinyDecoder
    sampler_config: SamplerConfig
    stream: list[DemoRequest]
    compiled_step: Callable[..., Any] | None


def build_setup(options: DemoOptions, modes: Sequence[str] = ("eager",)) -> DemoSetup:
    """The model, the sampler config and the stream of `options`, and the compiled step if a
    mode of `modes` needs it (compiling happens at its first call)."""
    device = options.resolved_device()
    model_config = TinyDecoderConfig(
        vocab_size=options.vocab,
        hidden_size=options.hidden_size,
        num_layers=options.num_layers,
        num_heads=4,
        mlp_size=2 * options.hidden_size,
        max_seq_len=options.max_prompt_len + options.max_tokens,
        num_kv_slots=options.max_num_reqs,
        seed=options.seed,
    )
    eos = options.vocab - 1
    sampler_config = SamplerConfig(
        max_num_reqs=options.max_num_reqs,
        vocab_size=options.vocab,
        eos_token_id=eos,
        seed=options.seed,
        max_bad_word_len=4,
    )
    stream = make_request_stream(
        num_steps=options.steps,
        max_num_reqs=options.max_num_reqs,
        vocab_size=options.vocab,
        eos_token_id=eos,
        max_prompt_len=options.max_prompt_len,
        max_tokens=options.max_tokens,
        seed=options.seed,
    )
    compiled_step = None
    if any(mode != "eager" for mode in modes):
        compiled_step = compile_decode_step(device, simd=options.simd)
    model = TinyDecoder(model_config, device)
    return DemoSetup(options, device, model, sampler_config, stream, compiled_step)


def prepare_engine(setup: DemoSetup, mode: str) -> Engine:
    """A fresh sampler and engine for `mode`, warmed up (and compiled or captured) on every
    bucket. With the batch empty every row is padding, so the warm-up commits nothing."""
    options, device, model = setup.options, setup.device, setup.model
    sampler = Sampler(setup.sampler_config, device)
    sampler.update_state(None)
    inputs = DecodeInputs(options.max_num_reqs, device, model.padding_kv_slot)
    runner: StepRunner
    if mode == "eager":
        runner = eager_runner(model, sampler, inputs)
    elif setup.compiled_step is None:
        raise ValueError(f"mode {mode!r} needs a setup built with it in `modes`")
    elif mode == "compiled":
        runner = compiled_runner(model, sampler, inputs, setup.compiled_step)
    else:
        runner = cuda_graph_runner(model, sampler, inputs, setup.compiled_step, options.buckets)
    for bucket in options.buckets:
        inputs.stage([], [], [])
        runner(bucket).tolist()
    return Engine(model, sampler, inputs, runner, options.buckets)


def run_mode(setup: DemoSetup, mode: str) -> RunResult:
    """Serve the stream in `mode`; the warm-up (compile, capture) is timed apart, and a
    compile during the loop is a violation."""
    graphs_before = compiled_graphs()
    start = time.perf_counter()
    engine = prepare_engine(setup, mode)
    setup_seconds = time.perf_counter() - start
    compiles = compiled_graphs() - graphs_before
    result = engine.run(setup.stream, setup.options.steps, mode)
    result.setup_seconds, result.compiles = setup_seconds, compiles
    recompiles = compiled_graphs() - graphs_before - compiles
    if recompiles:
        result.violations.append(
            f"{mode}: {recompiles} recompile(s) while requests joined and left"
        )
    return result


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """torch's intra-op thread count set for the block, restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_modes(options: DemoOptions) -> tuple[list[RunResult], DemoSetup]:
    """Build the setup, then serve the stream once per mode (with `options.threads`
    intra-op threads)."""
    device = options.resolved_device()
    modes = options.resolved_modes(device)
    # On cuda:N, streams and graph pools must come from that device.
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with torch_threads(options.threads), on_device:
        setup = build_setup(options, modes)
        return [run_mode(setup, mode) for mode in modes], setup


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


def _print_summary(
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


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo with parsed `args` (from `add_demo_arguments`); returns the exit code:
    0 if every mode produced the same tokens and every check passed, 1 if not, 2 for bad
    options (reported on stderr)."""
    try:
        options = DemoOptions.from_namespace(args)
        options.resolved_modes(options.resolved_device())
    except (TypeError, ValueError) as exc:
        print(f"graphsafe-sampler demo: error: {exc}", file=sys.stderr)
        return 2
    results, setup = run_modes(options)
    differences = [
        diff for r in results[1:] if (diff := first_difference(results[0], r)) is not None
    ]
    _print_summary(options, setup.model, setup.stream, results, differences)
    failed = bool(differences) or any(r.violations for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m graphsafe_sampler.demo")
    add_demo_arguments(_parser)
    sys.exit(run_demo(_parser.parse_args()))
