"""`BatchDriver`, the one host-side batch of the tests, the bench, the demo and the GPU check:
every policy's updates, replayed with vLLM's semantics on a shadow batch, reproduce the
driver's rows; `add`, `remove` and the stop checks behave as an engine's."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.batch_update import BatchUpdate, MoveDirectionality
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.testing import (
    BatchDriver,
    DriverRequest,
    no_joins,
    refill,
    stop_reason,
)

CONFIG = SamplerConfig(8, 50, eos_token_id=49)


def _apply(shadow: list[Sequence[int] | None], update: BatchUpdate) -> None:
    """Removed, then added, then moved (vLLM V1); a row holds its request's live output list."""
    for row in update.removed:
        assert shadow[row] is not None, f"removed row {row} holds no request"
        shadow[row] = None
    for row, _, _, output in update.added:
        shadow[row] = output
    for a, b, direction in update.moved:
        if direction is MoveDirectionality.SWAP:
            shadow[a], shadow[b] = shadow[b], shadow[a]
        else:
            shadow[b], shadow[a] = shadow[a], None


def _request(max_tokens: int | None = None, **params: object) -> DriverRequest:
    return DriverRequest(SamplingParams(**params), [1, 2], max_tokens=max_tokens)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param({}, id="random-churn"),
        pytest.param({"target": 6, "joins": refill, "condense": 0.0}, id="refill"),
        pytest.param({"churn": 0.5, "pop_removed": True}, id="pop-removed"),
    ],
)
def test_updates_replay_onto_the_rows(policy: dict) -> None:
    driver = BatchDriver(CONFIG, seed=4, **policy)
    shadow: list[Sequence[int] | None] = [None] * CONFIG.max_num_reqs
    for step in range(60):
        update = driver.next_update()
        _apply(shadow, update)
        live = [None if q is None else q.output_tok_ids for q in driver.rows]
        assert all(a is b for a, b in zip(live, shadow, strict=True))  # the same live lists
        last = max((r for r, q in enumerate(driver.rows) if q is not None), default=-1)
        assert update.batch_size == driver.batch_size == last + 1
        if policy.get("joins") is refill:
            assert update.batch_size == 6
        driver.record_tokens([step] * CONFIG.max_num_reqs)


def test_serving_loop_policy() -> None:
    # The demo's: the engine adds, finished requests leave, the batch is condensed, and a
    # row freed and taken again is reported as vLLM's builder does (not in `removed`).
    driver = BatchDriver(
        CONFIG, churn=0.0, joins=no_joins, finish=True, max_swaps=0, condense=1.0,
        pop_removed=True,
    )  # fmt: skip
    rows = [driver.add(_request(max_tokens=5)) for _ in range(4)]
    assert rows == [0, 1, 2, 3]
    update = driver.next_update()
    assert update.batch_size == 4 and [a[0] for a in update.added] == rows
    assert update.removed == () and update.moved == ()
    driver.record_tokens([49, 7, 49, 7])  # EOS ends rows 0 and 2
    assert [q is None for q in driver.rows[:4]] == [True, False, True, False]
    assert driver.free_rows()[:2] == [0, 2]
    late = _request(max_tokens=1)
    assert driver.add(late) == 0  # the lowest freed row
    update = driver.next_update()
    # Row 0: overwritten by the add; row 2: by the condensing move of row 3.
    assert update.removed == () and [a[0] for a in update.added] == [0]
    assert update.moved == ((3, 2, MoveDirectionality.UNIDIRECTIONAL),)
    assert update.batch_size == 3
    driver.record_tokens([5, 5, 5])
    assert late.finish_reason == "length" and driver.rows[0] is None
    assert driver.next_update() == BatchUpdate(
        2, (), (), ((2, 0, MoveDirectionality.UNIDIRECTIONAL),)
    )
    assert driver.next_update() == BatchUpdate(2)  # nothing changed


def test_requests_added_since_the_last_update_stay_for_it() -> None:
    driver = BatchDriver(CONFIG, churn=1.0, joins=no_joins, max_swaps=0, condense=0.0)
    driver.add(_request())
    with pytest.raises(ValueError, match="row 0: its request joined since the last update"):
        driver.remove(0)
    assert [a[0] for a in driver.next_update().added] == [0]  # churn 1.0 spared it
    assert driver.next_update().removed == (0,)
    with pytest.raises(ValueError, match="row 0 holds no request"):
        driver.remove(0)
    for _ in range(CONFIG.max_num_reqs):
        driver.add(_request())
    with pytest.raises(ValueError, match="no free row: the 8 rows all hold requests"):
        driver.add(_request())


def test_stop_reason() -> None:
    eos = 49  # CONFIG's
    req = _request(max_tokens=3, stop_token_ids=[eos, 7])
    assert stop_reason(req, eos, eos) == "stop"  # a stop token first, even when it is EOS
    assert stop_reason(_request(max_tokens=3), eos, eos) == "eos"
    assert stop_reason(_request(max_tokens=3, ignore_eos=True), eos, eos) is None
    long = _request(max_tokens=2)
    long.output_tok_ids.extend([3, 4])
    assert stop_reason(long, 4, eos) == "length"
    assert stop_reason(_request(), 4, None) is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target": 0}, r"target must be in \[1, max_num_reqs = 8\], got 0"),
        ({"target": 9}, "got 9"),
        ({"churn": -0.1}, r"churn must be in \[0, 1\], got -0.1"),
        ({"condense": 2.0}, r"condense must be in \[0, 1\], got 2.0"),
        ({"max_swaps": -1}, "max_swaps must be >= 0, got -1"),
    ],
)
def test_bad_policies_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchDriver(CONFIG, **kwargs)


def test_popped_removals_and_swaps_give_updates_a_batch_state_takes() -> None:
    # A swap carries a request whose removal is pending to another row: that removal must
    # stay in the update (nothing overwrites the request there), or the state keeps it.
    refused = 0
    for seed in range(40):
        driver = BatchDriver(
            CONFIG, seed=seed, churn=0.0, joins=no_joins, finish=True, max_swaps=1,
            condense=1.0, pop_removed=True,
        )  # fmt: skip
        state = BatchState(CONFIG, "cpu")
        shadow: list[Sequence[int] | None] = [None] * CONFIG.max_num_reqs
        rng = random.Random(seed)
        joined = 0
        for _step in range(40):
            while joined < 12 and driver.free_rows():  # 12 requests, then the batch drains
                driver.add(_request())
                joined += 1
            update = driver.next_update()
            try:
                state.update(update)
            except ValueError:
                refused += 1
                break
            _apply(shadow, update)
            live = [None if q is None else q.output_tok_ids for q in driver.rows]
            assert all(a is b for a, b in zip(live, shadow, strict=True))
            driver.record_tokens(
                [49 if rng.random() < 0.2 else 5 for _ in range(driver.batch_size)]
            )
    assert refused == 0
