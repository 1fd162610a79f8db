"""BatchState: vLLM's persistent-batch semantics, slots that never move, atomic rejection."""

from __future__ import annotations

import random

import pytest
import torch

from graphsafe_sampler import (
    BatchState,
    BatchUpdate,
    MoveDirectionality,
    SamplerConfig,
    SamplingParams,
)
from graphsafe_sampler.stages import BUILTIN_LOGITS_PROCESSORS
from graphsafe_sampler.staging import StagedTensor
from graphsafe_sampler.testing import BatchDriver, state_fingerprint

SWAP = MoveDirectionality.SWAP
UNI = MoveDirectionality.UNIDIRECTIONAL
CONFIG = SamplerConfig(max_num_reqs=8, vocab_size=101, eos_token_id=2, max_num_logprobs=3)


def _add(row: int, **kw: object) -> tuple:
    return (row, SamplingParams(**kw), [1, 2], [])  # type: ignore[arg-type]


def _slots(state: BatchState) -> list[int | None]:
    return [state.slot_of_row(r) for r in range(state.max_num_reqs)]


def test_remove_add_move_order_and_slots_never_move() -> None:
    state = BatchState(CONFIG, "cpu")
    state.update(BatchUpdate(3, added=[_add(0), _add(1), _add(2)]))
    assert _slots(state)[:3] == [0, 1, 2]
    # removed first, then the add reuses the freed slot, then moves apply in order.
    state.update(
        BatchUpdate(
            3,
            removed=[1],
            added=[_add(1, temperature=0.5)],
            moved=[(0, 2, SWAP), (2, 1, SWAP)],
        )
    )
    # after add: rows 0,1,2 -> slots 0,1,2; swap(0,2): 2,1,0; swap(2,1): 2,0,1
    assert _slots(state)[:3] == [2, 0, 1]
    assert state.row_to_slot.device[:3].tolist() == [2, 0, 1]
    # A unidirectional move empties its source.
    state.update(BatchUpdate(2, removed=[0], moved=[(2, 0, UNI)]))
    assert _slots(state)[:3] == [1, 0, None]
    assert state.row_to_slot.device[2].item() == CONFIG.padding_slot
    assert state.num_requests == 2


def test_add_replaces_and_unidirectional_overwrite_free_slots() -> None:
    state = BatchState(CONFIG, "cpu")
    state.update(BatchUpdate(2, added=[_add(0), _add(1)]))
    state.update(BatchUpdate(2, added=[_add(0)]))  # replaces row 0's request
    assert state.num_requests == 2
    state.update(BatchUpdate(1, moved=[(1, 0, UNI)]))  # row 0's request dropped
    assert state.num_requests == 1
    assert _slots(state)[:2] == [1, None]


def test_num_generated_starts_at_output_length_and_commits_on_device() -> None:
    state = BatchState(CONFIG, "cpu")
    state.update(
        BatchUpdate(
            3,
            added=[
                (0, SamplingParams(), None, [5, 6, 7]),
                (2, SamplingParams(), [1], []),
            ],
        )
    )
    gen = state.num_generated.device
    assert gen[state.slot_of_row(0)].item() == 3 and gen[state.slot_of_row(2)].item() == 0
    before_padding = gen[CONFIG.padding_slot].item()
    tokens = torch.tensor([4, 4, 4, 4])  # 4 rows: row 1 empty, row 3 past the batch
    state.commit(tokens, keep=torch.tensor([True, True, False, True]))
    assert gen[state.slot_of_row(0)].item() == 4
    assert gen[state.slot_of_row(2)].item() == 0  # excluded (chunked prefill)
    assert gen[CONFIG.padding_slot].item() == before_padding  # empty rows commit nothing
    state.commit(tokens)
    assert gen[state.slot_of_row(2)].item() == 1
    # A move keeps the history with the request.
    state.update(BatchUpdate(3, moved=[(0, 2, SWAP)]))
    assert gen[state.slot_of_row(2)].item() == 5


def _full_state() -> tuple[BatchState, list]:
    state = BatchState(CONFIG, "cpu")
    procs = [
        cls(CONFIG, torch.device("cpu"), False, batch_state=state)
        for cls in BUILTIN_LOGITS_PROCESSORS
    ]
    return state, procs


BAD_UPDATES = [
    pytest.param(
        BatchUpdate(9),
        ValueError,
        r"batch_size = 9 is outside \[0, max_num_reqs = 8\]",
        id="batch-size-over",
    ),
    pytest.param(
        BatchUpdate(4, removed=[6]), ValueError, "removed row 6 holds no request", id="remove-empty"
    ),
    pytest.param(
        BatchUpdate(4, removed=[0, 0]),
        ValueError,
        "removed row 0 is listed twice",
        id="remove-twice",
    ),
    pytest.param(
        BatchUpdate(4, removed=[8]),
        ValueError,
        r"removed row = 8 is outside",
        id="remove-out-of-range",
    ),
    pytest.param(
        BatchUpdate(5, added=[_add(4, top_k=3), (5, SamplingParams(), None, [])]),
        ValueError,
        "row 5 holds a request but batch_size = 5",
        id="beyond-batch",
    ),
    pytest.param(
        BatchUpdate(5, added=[_add(4), (3, SamplingParams(logit_bias={101: 1.0}), None, [])]),
        ValueError,
        r"logit_bias key\[0\] = 101 is outside the vocabulary \[0, 101\)",
        id="bias-vocab",
    ),
    pytest.param(
        BatchUpdate(5, added=[_add(4, logprobs=4)]),
        ValueError,
        "logprobs = 4 exceeds max_num_logprobs = 3",
        id="logprobs",
    ),
    pytest.param(
        BatchUpdate(5, added=[(4, SamplingParams(), [1, 101], [])]),
        ValueError,
        r"prompt_tok_ids holds token id 101, outside the vocabulary",
        id="prompt-vocab",
    ),
    pytest.param(
        BatchUpdate(5, added=[(4, SamplingParams(), None, [-1])]),
        ValueError,
        r"output_tok_ids holds token id -1",
        id="output-negative",
    ),
    pytest.param(
        BatchUpdate(5, added=[(4, {"temperature": 1.0}, None, [])]),
        TypeError,
        "params must be SamplingParams",
        id="params-type",
    ),
    pytest.param(
        BatchUpdate(4, moved=[(0, 9, SWAP)]),
        ValueError,
        r"moved\[0\] b = 9",
        id="move-out-of-range",
    ),
    pytest.param(
        BatchUpdate(4, moved=[(0, 1, "swap")]),
        TypeError,
        "must be a MoveDirectionality",
        id="move-direction",
    ),
    # Valid removes and adds, then a bad move: nothing of the first two may stick.
    pytest.param(
        BatchUpdate(5, removed=[1], added=[_add(4, seed=3)], moved=[(0, 8, SWAP)]),
        ValueError,
        r"moved\[0\] b = 8",
        id="late-error",
    ),
]


@pytest.mark.parametrize(("update", "exc", "match"), BAD_UPDATES)
def test_rejected_update_changes_nothing(update: BatchUpdate, exc: type, match: str) -> None:
    state, procs = _full_state()
    state.update(
        BatchUpdate(4, added=[_add(r, logit_bias={r: 1.5}, min_tokens=2) for r in range(4)])
    )
    state.commit(torch.arange(8))
    before = state_fingerprint([state, *procs])
    free_before = sorted(state._free_slots)
    with pytest.raises(exc, match=match):
        state.update(update)
    after = state_fingerprint([state, *procs])
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    assert sorted(state._free_slots) == free_before
    assert not state.row_to_slot.has_pending()


def test_state_tensors_keep_their_addresses_under_churn() -> None:
    state, procs = _full_state()
    tensors = {
        f"{i}.{k}": t for i, p in enumerate([state, *procs]) for k, t in p.state_tensors().items()
    }
    ptrs = {k: t.data_ptr() for k, t in tensors.items()}
    driver = BatchDriver(CONFIG, seed=2)
    rng = random.Random(0)
    for _ in range(50):
        state.update(driver.next_update())
        state.commit(torch.tensor([rng.randrange(101) for _ in range(8)]))
    now = {
        f"{i}.{k}": t for i, p in enumerate([state, *procs]) for k, t in p.state_tensors().items()
    }
    assert {k: t.data_ptr() for k, t in now.items()} == ptrs


def test_register_after_requests_is_refused() -> None:
    state, _ = _full_state()
    state.update(BatchUpdate(1, added=[_add(0)]))
    with pytest.raises(RuntimeError, match="before the first request"):
        BUILTIN_LOGITS_PROCESSORS[0](CONFIG, torch.device("cpu"), False, batch_state=state)


def test_forward_rows_beyond_capacity_rejected() -> None:
    state = BatchState(CONFIG, "cpu")
    with pytest.raises(ValueError, match="num_rows = 9 exceeds max_num_reqs = 8"):
        state.slots(9)


def test_unidirectional_move_onto_itself_keeps_the_request() -> None:
    state = BatchState(CONFIG, "cpu")
    state.update(BatchUpdate(2, added=[_add(0), _add(1)]))
    with pytest.raises(ValueError, match="row 1 holds a request but batch_size = 1"):
        state.update(BatchUpdate(1, moved=[(1, 1, UNI)]))
    state.update(BatchUpdate(2, moved=[(1, 1, UNI)]))
    assert _slots(state)[:2] == [0, 1]


def test_a_row_moved_onto_itself_copies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A swap or move of a row with itself (a batch of one row gets them from a driver that
    swaps random pairs) is a no-op: no table copies a row, so nothing is flushed again."""
    state = BatchState(CONFIG, "cpu")
    table = state.row_staged("temperature", (), torch.float32, fill=1.0)
    state.update(BatchUpdate(2, added=[_add(0), _add(1)]))
    table.write(1, 0.5)
    state.flush()
    before = state_fingerprint([state])
    copied: list[str] = []
    original = StagedTensor.copy_rows

    def counting(self: StagedTensor, dst, src) -> None:  # type: ignore[no-untyped-def]
        copied.append(self.name)
        original(self, dst, src)

    monkeypatch.setattr(StagedTensor, "copy_rows", counting)
    state.update(BatchUpdate(2, moved=[(0, 0, SWAP), (1, 1, SWAP), (1, 1, UNI)]))
    assert copied == []
    assert _slots(state)[:2] == [0, 1]
    after = state_fingerprint([state])
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())
    state.update(BatchUpdate(2, moved=[(0, 1, SWAP)]))  # a real swap still copies
    assert "row_to_slot" in copied and _slots(state)[:2] == [1, 0]


def test_row_tables_follow_requests_through_churn() -> None:
    # vLLM-style row-indexed state: removes reset, adds write, moves and swaps carry rows.
    state = BatchState(CONFIG, "cpu")

    def write_added(table, row, params, prompt, output) -> None:  # type: ignore[no-untyped-def]
        table.write(row, params.temperature)

    temperature = state.row_staged("temperature", (), torch.float32, fill=-1.0,
                                   write_added=write_added)  # fmt: skip
    assert "temperature.device" in state.state_tensors()
    driver = BatchDriver(CONFIG, seed=9, churn=0.3)
    for _ in range(300):
        state.update(driver.next_update())
        want = [-1.0 if req is None else req.params.temperature for req in driver.rows]
        assert temperature.device.tolist() == pytest.approx(want)
    with pytest.raises(RuntimeError, match="before the first request"):
        state.row_staged("late", (), torch.float32)
