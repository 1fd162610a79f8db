"""`BatchDriver`: the one host-side model of a persistent batch, producing vLLM's updates.

Every engine-like tool here drives its samplers through it: the tests, fuzzers and
`check_graph_safety` (random churn), the benchmarks' workload (a batch kept full), the demo's
serving loop (requests arriving from a stream, leaving when they finish) and the GPU check.
It keeps row -> `DriverRequest` (params, prompt, the live output list) and hands every change
since the last update out as one `BatchUpdate` with vLLM V1's semantics: removed, then added,
then moved; new requests take free rows; condensing moves the last requests into the lowest
holes. `record_tokens` appends each step's committed tokens to the live output lists.

What differs between those users is policy, set at construction:

- who leaves: each request with probability `churn` per update, and, with `finish=True`,
  every request that finishes (`stop_reason`); an engine may also `remove` rows itself;
- who joins: `joins` picks the free rows that new random requests (`new_request`) take each
  update: `random_joins` (a random number, into random free rows), `refill` (every free row
  below `target`, so that the batch stays full) or `no_joins` (an engine that `add`s its own);
- the layout after that: up to `max_swaps` random swaps, then vLLM's condensing with
  probability `condense`;
- how a row freed and taken again in one update reads: listed in `removed` and then added
  or moved into (the default), or, with `pop_removed`, as vLLM's `BatchUpdateBuilder` reports
  it (`pop_removed()`): not in `removed`, the add or the move overwriting the request there.
  A sampler must take both.

The defaults are the random churn of the tests: rows are swapped, condensed or left with holes.
The driver's random choices never depend on the recorded tokens (unless `finish` is set), so
two drivers built alike produce the same updates whatever their samplers draw.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from graphsafe_sampler.batch_update import AddedRequest, BatchUpdate, MoveDirectionality
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams

MakeParams = Callable[[random.Random, SamplerConfig], SamplingParams]
Joins = Callable[["BatchDriver", list[int]], list[int]]
"""(driver, free rows below its target, ascending) -> the rows new requests take, ascending."""


@dataclass
class DriverRequest:
    """What the engine knows of one request.

    max_tokens: outputs after which it finishes (None: no limit). request_id: the engine's
    name for it, where it has one. finish_reason: why it left, once it finished.
    """

    params: SamplingParams
    prompt_tok_ids: list[int] | None
    output_tok_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = None
    request_id: int = 0
    finish_reason: str | None = None


def random_sampling_params(rng: random.Random, config: SamplerConfig) -> SamplingParams:
    """Random params touching every field, each feature on in some requests and off in others."""
    vocab = config.vocab_size

    def some_ids(limit: int) -> list[int]:
        return rng.sample(range(vocab), rng.randint(1, min(limit, vocab)))

    def maybe(p: float) -> bool:
        return rng.random() < p

    logit_bias = None
    if maybe(0.4):
        size = config.max_logit_bias_tokens if maybe(0.1) else rng.randint(1, 8)
        size = min(size, config.max_logit_bias_tokens)
        logit_bias = {t: rng.uniform(-5.0, 5.0) for t in some_ids(size)}
    allowed = None
    if maybe(0.25):
        allowed = some_ids(max(2, vocab // 2))
    stop_size = config.max_stop_token_ids if maybe(0.1) else min(4, config.max_stop_token_ids)
    stop = some_ids(stop_size) if maybe(0.5) else None
    bad_words = None
    if maybe(0.25):
        bad_words = [
            [rng.randrange(vocab) for _ in range(rng.randint(1, min(3, config.max_bad_word_len)))]
            for _ in range(rng.randint(1, min(3, config.max_bad_words)))
        ]
        if sum(map(len, bad_words)) > config.max_bad_words_tokens:
            bad_words = None
    # drawn only where the config has room, so that other configs draw as they always did
    chosen = None
    if config.max_logprob_token_ids and maybe(0.6):
        chosen = some_ids(config.max_logprob_token_ids)
    budget = None
    if config.has_reasoning and maybe(0.6):
        budget = rng.randint(0, 6)
    watermark = None
    if config.watermark_context_len and maybe(0.5):
        watermark = rng.randrange(2**64)
    return SamplingParams(
        temperature=0.0 if maybe(0.25) else rng.uniform(0.2, 1.5),
        top_p=1.0 if maybe(0.5) else rng.uniform(0.1, 1.0),
        top_k=rng.choice([0, -1, 1, 2, 5, 50]),
        min_p=0.0 if maybe(0.5) else rng.uniform(0.0, 0.3),
        presence_penalty=0.0 if maybe(0.5) else rng.uniform(-1.0, 1.0),
        frequency_penalty=0.0 if maybe(0.5) else rng.uniform(-1.0, 1.0),
        repetition_penalty=1.0 if maybe(0.5) else rng.uniform(0.5, 1.5),
        seed=rng.randrange(2**63) if maybe(0.5) else None,
        logit_bias=logit_bias,
        allowed_token_ids=allowed,
        bad_words_token_ids=bad_words,
        min_tokens=rng.choice([0, 0, 1, 3, 10]),
        stop_token_ids=stop,
        ignore_eos=maybe(0.2),
        logprobs=rng.randint(0, config.max_num_logprobs) if maybe(0.5) else None,
        logprob_token_ids=chosen,
        thinking_token_budget=budget,
        watermark_key=watermark,
    )


def random_joins(driver: BatchDriver, free: list[int]) -> list[int]:
    """0 to about `churn * target` requests, into random free rows: rows left empty below the
    batch's end give the condensing and the samplers' padding rows work."""
    rng = driver.rng
    num = rng.randint(0, max(1, int(driver.churn * driver.target) + 1))
    return sorted(rng.sample(free, min(num, len(free))))


def refill(driver: BatchDriver, free: list[int]) -> list[int]:
    """Every free row: a server refilling its batch from a waiting queue keeps it full."""
    return free


def no_joins(driver: BatchDriver, free: list[int]) -> list[int]:
    """None: the engine `add`s its own requests (the demo's arrivals)."""
    return []


def stop_reason(req: DriverRequest, token: int, eos_token_id: int | None) -> str | None:
    """Why `req` finishes on `token`, just appended (None: it goes on): a stop token, EOS
    unless ignore_eos, or max_tokens outputs, checked in that order. No min_tokens gate: the
    sampler masks stop tokens and EOS until then."""
    params = req.params
    if token in (params.stop_token_ids or ()):
        return "stop"
    if token == eos_token_id and not params.ignore_eos:
        return "eos"
    if req.max_tokens is not None and len(req.output_tok_ids) >= req.max_tokens:
        return "length"
    return None


def open_reasoning_sections(driver: BatchDriver, start_ids: Sequence[int], seed: int) -> None:
    """Half of `driver`'s new requests get prompts that end with `start_ids`, as a chat
    template that opens a reasoning section does: their thinking budgets then run out within
    a few steps, and the forced end shows."""
    rng = random.Random(seed)
    make = driver.new_request

    def new_request() -> DriverRequest:
        req = make()
        if rng.random() < 0.5:
            req.prompt_tok_ids = [*(req.prompt_tok_ids or ()), *start_ids]
        return req

    driver.new_request = new_request  # type: ignore[method-assign]


class BatchDriver:
    """A persistent batch of `config.max_num_reqs` rows, of which rows [0, target) are used,
    and the `BatchUpdate`s that change it (the policies: see the module docstring)."""

    def __init__(
        self,
        config: SamplerConfig,
        *,
        seed: int = 0,
        make_params: MakeParams = random_sampling_params,
        churn: float = 0.25,
        max_prompt_len: int = 8,
        target: int | None = None,
        joins: Joins = random_joins,
        finish: bool = False,
        max_swaps: int = 3,
        condense: float = 0.5,
        pop_removed: bool = False,
    ) -> None:
        self.target = config.max_num_reqs if target is None else target
        if not 1 <= self.target <= config.max_num_reqs:
            raise ValueError(
                f"target must be in [1, max_num_reqs = {config.max_num_reqs}], got {self.target}"
            )
        for name, p in (("churn", churn), ("condense", condense)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        if max_swaps < 0:
            raise ValueError(f"max_swaps must be >= 0, got {max_swaps}")
        self.config = config
        self.rng = random.Random(seed)
        self.make_params = make_params
        self.churn = churn
        self.max_prompt_len = max_prompt_len
        self.joins = joins
        self.finish = finish
        self.max_swaps = max_swaps
        self.condense = condense
        self.pop_removed = pop_removed
        self.rows: list[DriverRequest | None] = [None] * config.max_num_reqs
        self.batch_size = 0
        # Changes since the last update, made by `add` and `remove` (and `record_tokens`).
        self._removed: list[int] = []
        self._added: list[AddedRequest] = []
        self._swapped: set[int] = set()  # rows a swap touched since the last update

    def new_request(self) -> DriverRequest:
        """A random request: a prompt of up to `max_prompt_len` tokens, `make_params`."""
        rng, vocab = self.rng, self.config.vocab_size
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, self.max_prompt_len))]
        # Some requests resume with outputs already generated (preemption).
        output = [rng.randrange(vocab) for _ in range(rng.choice([0, 0, 0, 2, 5]))]
        return DriverRequest(self.make_params(rng, self.config), prompt or None, output)

    def free_rows(self) -> list[int]:
        """Rows below `target` that hold no request, ascending."""
        return [r for r in range(self.target) if self.rows[r] is None]

    def add(self, req: DriverRequest) -> int:
        """`req` joins in the lowest free row (vLLM hands out removed rows first, then the
        end of a condensed batch); returns the row. It is in the next update."""
        free = self.free_rows()
        if not free:
            raise ValueError(f"no free row: the {self.target} rows all hold requests")
        self._put(free[0], req)
        return free[0]

    def _taken(self, row: int) -> None:
        """A request is put or moved into `row`: with `pop_removed`, a removal there since
        the last update leaves the update, whose add or move overwrites the request; not
        once a swap has touched the row (the swap carries the request to be removed
        elsewhere, where nothing would overwrite it)."""
        if self.pop_removed and row in self._removed and row not in self._swapped:
            self._removed.remove(row)

    def _put(self, row: int, req: DriverRequest) -> None:
        self._taken(row)
        self.rows[row] = req
        # output_tok_ids is the live list that record_tokens appends to (vLLM's contract).
        self._added.append((row, req.params, req.prompt_tok_ids, req.output_tok_ids))

    def _joined(self) -> set[int]:
        """Rows whose requests joined since the last update."""
        return {row for row, *_ in self._added}

    def remove(self, row: int) -> None:
        """The request at `row` leaves (finished, preempted); the row is free at once and the
        removal is in the next update."""
        if self.rows[row] is None:
            raise ValueError(f"row {row} holds no request")
        if row in self._joined():
            raise ValueError(f"row {row}: its request joined since the last update")
        self.rows[row] = None
        self._removed.append(row)

    def next_update(self) -> BatchUpdate:
        """Every change since the last update, the policies' included, as one update, already
        applied to `self.rows`."""
        rng = self.rng
        joined = self._joined()  # requests `add`ed since the last update stay for this one
        for row, req in enumerate(self.rows):
            if req is not None and row not in joined and rng.random() < self.churn:
                self.remove(row)
        for row in self.joins(self, self.free_rows()):
            self._put(row, self.new_request())
        moved: list[tuple[int, int, MoveDirectionality]] = []
        for _ in range(rng.randint(0, self.max_swaps) if self.max_swaps else 0):
            a, b = rng.randrange(self.target), rng.randrange(self.target)
            moved.append((a, b, MoveDirectionality.SWAP))
            self._swapped.update((a, b))
            self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        # A certain outcome takes no draw, so that fixed policies leave the sequence alone.
        if self.condense == 1.0 or (self.condense > 0.0 and rng.random() < self.condense):
            # Condense as vLLM does: move the last requests into the lowest holes.
            while True:
                holes = [r for r, q in enumerate(self.rows) if q is None]
                last = max((r for r, q in enumerate(self.rows) if q is not None), default=-1)
                if not holes or holes[0] > last:
                    break
                moved.append((last, holes[0], MoveDirectionality.UNIDIRECTIONAL))
                self._taken(holes[0])
                self.rows[holes[0]], self.rows[last] = self.rows[last], None
        self.batch_size = max((r + 1 for r, q in enumerate(self.rows) if q is not None), default=0)
        update = BatchUpdate(
            self.batch_size, tuple(self._removed), tuple(self._added), tuple(moved)
        )
        self._removed, self._added = [], []
        self._swapped.clear()
        return update

    def record_tokens(self, token_ids: Sequence[int], keep: Sequence[bool] | None = None) -> None:
        """Append committed tokens (one per row) to the live output lists, as an engine does;
        with `finish`, a request that finishes on its token leaves (`remove`), its
        `finish_reason` set."""
        for row, tok in enumerate(token_ids):
            req = self.rows[row] if row < len(self.rows) else None
            if req is None or (keep is not None and not keep[row]):
                continue
            req.output_tok_ids.append(tok)
            if self.finish:
                req.finish_reason = stop_reason(req, tok, self.config.eos_token_id)
                if req.finish_reason is not None:
                    self.remove(row)
