"""The demo's engine: vLLM-style continuous batching on the host, around a step runner.

`Engine` admits arriving requests (a KV slot each, their KV cache prefilled) and serves them
until they finish (max_tokens, EOS, stop tokens). The persistent batch itself (which request
holds which row, condensing, the `BatchUpdate` the sampler gets each step) is the one
`BatchDriver` of graphsafe_sampler.testing, with the serving loop's policy: no random joins
or leaves, requests leave when they finish, the batch is always condensed. Each step the
engine stages the rows' inputs in `DecodeInputs`, runs the step for the batch's bucket and
reads the tokens back. A run's tokens, finish reasons and timings, with the
host-side checks that failed (min_tokens, bad words), make a `RunResult`. The step itself
is the runner's business (`runners.py`); the engine never looks inside it.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from graphsafe_sampler.demo.requests import DemoRequest
from graphsafe_sampler.demo.runners import DecodeInputs, StepRunner
from graphsafe_sampler.examples.tiny_decoder import TinyDecoder
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.testing.batch_driver import BatchDriver, DriverRequest, no_joins


def _next_input(req: DriverRequest) -> tuple[int, int]:
    """(token, position) the next decode step feeds: the newest token of the sequence."""
    prompt, output = req.prompt_tok_ids or [], req.output_tok_ids
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

    Rows [0, batch_size) hold requests, vLLM style (`driver`): a finished request frees its
    row, an arriving one takes the lowest freed row or the end of the batch, and the last
    rows move into the holes left. Requests own a KV slot for life; slots are handed out
    lowest first.
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
        self.eos_token_id = sampler.config.eos_token_id
        # The serving loop's policy: only arrivals join, only finished requests leave, and
        # the batch is condensed and reported as vLLM's InputBatch does.
        self.driver = BatchDriver(
            sampler.config,
            churn=0.0,
            joins=no_joins,
            finish=True,
            max_swaps=0,
            condense=1.0,
            pop_removed=True,
        )
        self.free_kv_slots = list(range(model.config.num_kv_slots))
        self.kv_slots: dict[int, int] = {}  # request_id -> KV slot

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
        kv_slot = heapq.heappop(self.free_kv_slots)
        # All prompt tokens but the last: the decode step feeds that one (see tiny_decoder).
        self.model.prefill(kv_slot, request.prompt_token_ids[:-1])
        self.kv_slots[request.request_id] = kv_slot
        prompt = list(request.prompt_token_ids)
        req = DriverRequest(
            request.params, prompt, max_tokens=request.max_tokens, request_id=request.request_id
        )
        self.driver.add(req)

    def _violations(self, req: DriverRequest, token: int) -> list[str]:
        """What the sampler should have prevented, seen in the token just appended."""
        params, output, rid = req.params, req.output_tok_ids, req.request_id
        found = [
            f"request {rid} completed bad word {word}"
            for word in params.bad_words_token_ids or ()
            if output[-len(word) :] == word
        ]
        stops = token == self.eos_token_id or token in (params.stop_token_ids or ())
        if stops and len(output) <= params.min_tokens:
            # The token was generated while fewer than min_tokens outputs existed.
            found.append(f"request {rid} produced stop/EOS token {token} before min_tokens")
        return found

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
            while pending and pending[0].arrival_step <= step and self.driver.free_rows():
                self._admit(pending.popleft())
            update = self.driver.next_update()
            if update.removed or update.added or update.moved:
                batch_changes.update(
                    added=len(update.added), removed=len(update.removed), moved=len(update.moved)
                )
                self.sampler.update_state(update)
            else:
                self.sampler.update_state(None)  # vLLM's "no change"
            batch_size = update.batch_size
            if batch_size == 0:
                transcript.append(())
                continue
            # Condensed: rows [0, batch_size) all hold requests.
            running = [r for r in self.driver.rows[:batch_size] if r is not None]
            bucket = self.bucket_for(batch_size)
            tokens_positions = [_next_input(r) for r in running]
            t0 = time.perf_counter()
            self.inputs.stage(
                [t for t, _ in tokens_positions],
                [self.kv_slots[r.request_id] for r in running],
                [p for _, p in tokens_positions],
            )
            # The engine's host read: it needs the tokens to detokenize and to stop requests.
            tokens = self.runner(bucket)[:batch_size, 0].tolist()
            step_seconds.append(time.perf_counter() - t0)
            bucket_steps[bucket] += 1
            num_tokens += batch_size
            pairs = list(zip(running, tokens, strict=True))
            transcript.append(tuple(sorted((r.request_id, t) for r, t in pairs)))
            # Appends the tokens; a request that finishes leaves its row (in the next update).
            self.driver.record_tokens(tokens)
            for r, token in pairs:
                violations.extend(self._violations(r, token))
                if r.finish_reason is not None:
                    finished[r.request_id] = r.finish_reason
                    heapq.heappush(self.free_kv_slots, self.kv_slots.pop(r.request_id))
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
