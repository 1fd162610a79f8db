"""tests/made_once.py: a fixture's file made once per run, whichever worker asks first."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from made_once import made_once


def test_the_file_is_made_once_and_a_failed_make_leaves_none(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    name = f"made-once-{uuid.uuid4().hex}.txt"  # the run's directory is shared: a fresh name
    calls: list[Path] = []

    def fail(path: Path) -> None:
        path.write_text("half", encoding="utf-8")
        raise RuntimeError("make failed")

    with pytest.raises(RuntimeError, match="make failed"):
        made_once(tmp_path_factory, name, fail)

    def make(path: Path) -> None:
        calls.append(path)
        path.write_text("whole", encoding="utf-8")

    first = made_once(tmp_path_factory, name, make)
    second = made_once(tmp_path_factory, name, make)
    assert first == second and first.name == name
    assert first.read_text(encoding="utf-8") == "whole" and len(calls) == 1
