"""The demo's engine: vLLM-style continuous batching on the host, around a step runner.

`Engine` keeps the persistent batch (which request holds which row and KV slot), admits
arriving requests and prefills their KV cache, finishes requests (max_tokens, EOS, stop
tokens) and condenses the batch, and sends every change to the sampler as one `BatchUpdate`.
Each step it stages the rows' inputs in `DecodeInputs`, runs the step for the batch's
bucket and reads the tokens back. A run's tokens, finish reasons and timings, with the
host-side checks that failed (min_tokens, bad words), make a `RunResult`. The step itself
is the runner's business (`runners.py`); the engine never looks inside it.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphsafe_sampler.batch_update import BatchUpdateBuilder, MoveDirectionality
from graphsafe_sampler.demo.requests import DemoRequest
from graphsafe_sampler.demo.runners import DecodeInputs, StepRunner
from graphsafe_sampler.examples.tiny_decoder import TinyDecoder
from graphsafe_sampler.sampler import Sampler


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
