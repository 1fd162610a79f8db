"""BatchUpdate and BatchUpdateBuilder: vLLM V1's persistent-batch update protocol."""

from __future__ import annotations

import dataclasses

import pytest

from graphsafe_sampler import BatchUpdate, BatchUpdateBuilder, MoveDirectionality, SamplingParams

UNI = MoveDirectionality.UNIDIRECTIONAL
SWAP = MoveDirectionality.SWAP


# --------------------------------------------------------------------------------------------
# BatchUpdate
# --------------------------------------------------------------------------------------------


def test_batch_update_defaults_are_empty() -> None:
    update = BatchUpdate(batch_size=3)
    assert update.batch_size == 3
    assert list(update.removed) == []
    assert list(update.added) == []
    assert list(update.moved) == []


def test_batch_update_is_frozen() -> None:
    update = BatchUpdate(batch_size=1, removed=(0,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        update.batch_size = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        update.removed = ()  # type: ignore[misc]


def test_batch_update_positional_order() -> None:
    params = SamplingParams()
    update = BatchUpdate(4, [1], [(1, params, None, [])], [(0, 2, SWAP)])
    assert update.batch_size == 4
    assert update.removed == [1]
    assert update.added == [(1, params, None, [])]
    assert update.moved == [(0, 2, SWAP)]


def test_move_directionality_members() -> None:
    assert {m.name for m in MoveDirectionality} == {"UNIDIRECTIONAL", "SWAP"}
    assert UNI is not SWAP


# --------------------------------------------------------------------------------------------
# BatchUpdateBuilder: removed rows
# --------------------------------------------------------------------------------------------


def test_empty_builder() -> None:
    builder = BatchUpdateBuilder()
    assert not builder.has_removed()
    assert builder.peek_removed() is None
    assert builder.pop_removed() is None
    assert builder.added == []
    assert builder.moved == []
    assert builder.get_and_reset(0) is None


def test_empty_pop_and_peek_do_not_close_removed_append() -> None:
    builder = BatchUpdateBuilder()
    assert builder.peek_removed() is None
    assert builder.pop_removed() is None
    builder.removed_append(2)
    assert builder.pop_removed() == 2


def test_pop_removed_hands_out_the_lowest_row_first() -> None:
    builder = BatchUpdateBuilder()
    for row in (5, 1, 9, 3):
        builder.removed_append(row)
    assert builder.has_removed()
    assert [builder.pop_removed() for _ in range(4)] == [1, 3, 5, 9]
    assert not builder.has_removed()
    assert builder.pop_removed() is None
    assert builder.peek_removed() is None


def test_peek_removed_shows_the_lowest_row_without_popping() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(7)
    builder.removed_append(2)
    builder.removed_append(4)
    assert builder.peek_removed() == 2
    assert builder.peek_removed() == 2
    assert builder.has_removed()
    assert builder.pop_removed() == 2
    assert builder.peek_removed() == 4
    assert builder.pop_removed() == 4
    assert builder.peek_removed() == 7


def test_removed_is_sorted_highest_first() -> None:
    # vLLM documents `removed` as sorted in descending order, so that pop() is the lowest row.
    builder = BatchUpdateBuilder()
    for row in (3, 8, 0, 5):
        builder.removed_append(row)
    assert builder.removed == [8, 5, 3, 0]


def test_removed_append_after_pop_removed_raises() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(3)
    builder.removed_append(1)
    assert builder.pop_removed() == 1
    with pytest.raises(RuntimeError, match=r"cannot register a new removed row"):
        builder.removed_append(0)
    # The refused append changed nothing.
    assert builder.removed == [3]


def test_removed_append_after_peek_removed_raises() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(3)
    assert builder.peek_removed() == 3
    with pytest.raises(RuntimeError, match=r"cannot register a new removed row"):
        builder.removed_append(4)


def test_removed_append_after_reading_removed_raises() -> None:
    # vLLM: "Must not be called after the first time self.removed, self.pop_removed() or
    # self.peek_removed() are invoked."
    builder = BatchUpdateBuilder()
    builder.removed_append(3)
    assert builder.removed == [3]
    with pytest.raises(RuntimeError, match=r"cannot register a new removed row"):
        builder.removed_append(4)


def test_removed_append_is_open_again_after_get_and_reset() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(3)
    builder.removed_append(0)
    assert builder.pop_removed() == 0
    update = builder.get_and_reset(3)
    assert update is not None
    assert list(update.removed) == [3]
    builder.removed_append(1)
    builder.removed_append(0)
    assert builder.pop_removed() == 0


def test_removed_append_is_open_again_after_reset() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(3)
    assert builder.pop_removed() == 3
    builder.reset()
    builder.removed_append(5)
    builder.removed_append(2)
    assert builder.pop_removed() == 2


def test_get_and_reset_returning_none_still_reopens_removed_append() -> None:
    # The engine popped every removed row (to refill it) but recorded nothing else: there is
    # no update to hand out, yet the next step must be able to register removals again.
    builder = BatchUpdateBuilder()
    builder.removed_append(2)
    assert builder.pop_removed() == 2
    assert builder.get_and_reset(3) is None
    builder.removed_append(1)
    assert builder.pop_removed() == 1


def test_popped_rows_leave_the_update() -> None:
    # vLLM's InputBatch refills a popped row with an added request (or a move), so the row is
    # no longer reported as removed: the add at that row replaces the old request.
    builder = BatchUpdateBuilder()
    params = SamplingParams()
    builder.removed_append(4)
    builder.removed_append(1)
    row = builder.pop_removed()
    assert row == 1
    builder.added.append((row, params, [1, 2], []))
    update = builder.get_and_reset(5)
    assert update is not None
    assert list(update.removed) == [4]
    assert list(update.added) == [(1, params, [1, 2], [])]


def test_duplicate_removed_rows_are_recorded_as_given() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(2)
    builder.removed_append(2)
    assert builder.pop_removed() == 2
    assert builder.pop_removed() == 2
    assert builder.pop_removed() is None


# --------------------------------------------------------------------------------------------
# BatchUpdateBuilder: get_and_reset / reset
# --------------------------------------------------------------------------------------------


def test_get_and_reset_collects_removed_added_moved() -> None:
    builder = BatchUpdateBuilder()
    params = SamplingParams(temperature=0.0)
    output: list[int] = [7]
    builder.removed_append(0)
    builder.removed_append(2)
    builder.added.append((3, params, None, output))
    builder.moved.append((3, 0, UNI))
    builder.moved.append((1, 2, SWAP))
    update = builder.get_and_reset(batch_size=3)
    assert isinstance(update, BatchUpdate)
    assert update.batch_size == 3
    assert sorted(update.removed) == [0, 2]
    assert list(update.added) == [(3, params, None, output)]
    assert list(update.moved) == [(3, 0, UNI), (1, 2, SWAP)]
    # output_tok_ids stays a live reference to the request's list (docs/design.md §3).
    assert update.added[0][3] is output


@pytest.mark.parametrize(
    "record",
    [
        pytest.param("removed", id="only-removed"),
        pytest.param("added", id="only-added"),
        pytest.param("moved", id="only-moved"),
    ],
)
def test_any_single_change_makes_an_update(record: str) -> None:
    builder = BatchUpdateBuilder()
    if record == "removed":
        builder.removed_append(0)
    elif record == "added":
        builder.added.append((0, SamplingParams(), None, []))
    else:
        builder.moved.append((0, 1, SWAP))
    update = builder.get_and_reset(2)
    assert update is not None
    assert update.batch_size == 2
    assert len(getattr(update, record)) == 1
    assert builder.get_and_reset(2) is None


def test_get_and_reset_returns_none_when_nothing_changed() -> None:
    builder = BatchUpdateBuilder()
    assert builder.get_and_reset(5) is None
    assert builder.get_and_reset(0) is None


def test_get_and_reset_resets() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(1)
    builder.added.append((0, SamplingParams(), None, []))
    builder.moved.append((0, 1, SWAP))
    assert builder.get_and_reset(2) is not None
    assert not builder.has_removed()
    assert builder.removed == []
    assert builder.added == []
    assert builder.moved == []
    assert builder.get_and_reset(2) is None


def test_update_does_not_alias_the_builder() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(1)
    builder.added.append((0, SamplingParams(), None, []))
    builder.moved.append((0, 1, SWAP))
    added_list = builder.added
    moved_list = builder.moved
    update = builder.get_and_reset(2)
    assert update is not None
    # The next step's records must not leak into the update already handed out.
    builder.removed_append(0)
    builder.added.append((1, SamplingParams(), None, []))
    builder.moved.append((1, 0, UNI))
    added_list.append((5, SamplingParams(), None, []))
    moved_list.append((5, 6, UNI))
    assert list(update.removed) == [1]
    assert len(update.added) == 1
    assert list(update.moved) == [(0, 1, SWAP)]


def test_consecutive_steps_are_independent() -> None:
    builder = BatchUpdateBuilder()
    builder.removed_append(0)
    first = builder.get_and_reset(1)
    builder.moved.append((0, 1, SWAP))
    second = builder.get_and_reset(2)
    assert first is not None
    assert second is not None
    assert list(first.removed) == [0]
    assert list(first.moved) == []
    assert list(second.removed) == []
    assert list(second.moved) == [(0, 1, SWAP)]


@pytest.mark.parametrize(
    ("record", "changed"),
    [
        pytest.param(None, False, id="nothing"),
        pytest.param("removed", True, id="removed"),
        pytest.param("added", True, id="added"),
        pytest.param("moved", True, id="moved"),
    ],
)
def test_reset_forgets_and_reports_whether_anything_changed(
    record: str | None, changed: bool
) -> None:
    builder = BatchUpdateBuilder()
    if record == "removed":
        builder.removed_append(1)
    elif record == "added":
        builder.added.append((0, SamplingParams(), None, []))
    elif record == "moved":
        builder.moved.append((0, 1, UNI))
    assert builder.reset() is changed
    assert not builder.has_removed()
    assert builder.added == []
    assert builder.moved == []
    assert builder.reset() is False
    assert builder.get_and_reset(2) is None


def test_vllm_condense_sequence() -> None:
    # The pattern vLLM's InputBatch follows: remove rows, refill the lowest hole with a new
    # request, then condense by moving the last live rows into the remaining holes.
    builder = BatchUpdateBuilder()
    params = SamplingParams()
    # Batch of 6 rows; the requests at rows 1, 2 and 4 finish.
    for row in (4, 1, 2):
        builder.removed_append(row)
    # One new request takes the lowest hole.
    hole = builder.pop_removed()
    assert hole == 1
    builder.added.append((hole, params, [3], []))
    num_reqs = 6 - 3 + 1
    # condense(): move the highest live row into the lowest hole while that helps.
    last = num_reqs + len(builder.removed) - 1
    while builder.has_removed():
        while last in builder.removed:
            last -= 1
        empty = builder.peek_removed()
        assert empty is not None
        if empty >= last:
            break
        assert builder.pop_removed() == empty
        builder.moved.append((last, empty, UNI))
        last -= 1
    update = builder.get_and_reset(num_reqs)
    assert update is not None
    assert update.batch_size == 4
    assert list(update.removed) == [4]
    assert list(update.added) == [(1, params, [3], [])]
    assert list(update.moved) == [(5, 2, UNI)]
