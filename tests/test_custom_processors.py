"""Custom processors: the graph-safe rewrite of vLLM's example, loaded three ways; plugin
errors; the adapter for request-level callables."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from graphsafe_sampler import BatchState, BatchUpdate, MoveDirectionality, SamplerConfig
from graphsafe_sampler import SamplingParams as SP
from graphsafe_sampler.examples.target_token import TargetTokenLogitsProcessor
from graphsafe_sampler.processors import (
    ENTRY_POINT_GROUP,
    AdapterLogitsProcessor,
    build_logits_processors,
    load_logits_processors,
)
from graphsafe_sampler.testing import check_graph_safety, random_sampling_params

CONFIG = SamplerConfig(max_num_reqs=5, vocab_size=97, max_num_logprobs=2)
QUALNAME = "graphsafe_sampler.examples.target_token:TargetTokenLogitsProcessor"


def _install_plugin(root: Path, name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real installed distribution (a dist-info folder on sys.path) with one entry point."""
    info = root / f"{name}_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {value}\n")
    monkeypatch.syspath_prepend(str(root))


def target_params(rng: random.Random, config: SamplerConfig) -> SP:
    params = random_sampling_params(rng, config)
    if rng.random() < 0.5:
        params = dataclasses.replace(
            params, extra_args={"target_token": rng.randrange(config.vocab_size)}
        )
    return params


def test_loaded_by_class_and_by_qualname() -> None:
    assert load_logits_processors([TargetTokenLogitsProcessor], entry_points=False) == [
        TargetTokenLogitsProcessor
    ]
    assert load_logits_processors([QUALNAME], entry_points=False) == [TargetTokenLogitsProcessor]


def test_loaded_by_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(tmp_path, "target", QUALNAME, monkeypatch)
    assert TargetTokenLogitsProcessor in load_logits_processors([])
    # Named twice (class and plugin): built once.
    assert load_logits_processors([QUALNAME]).count(TargetTokenLogitsProcessor) == 1


def test_broken_plugin_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(tmp_path, "broken", "no_such_module_xyz:Proc", monkeypatch)
    with pytest.raises(RuntimeError, match=r"plugin 'broken' \(no_such_module_xyz:Proc\) failed"):
        load_logits_processors([])


def test_plugin_that_is_not_a_processor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(tmp_path, "notproc", "graphsafe_sampler.config:SamplerConfig", monkeypatch)
    with pytest.raises(TypeError, match=r"plugin 'notproc'.*is not a LogitsProcessor subclass"):
        load_logits_processors([])


@pytest.mark.parametrize(
    ("spec", "exc", "match"),
    [
        ("graphsafe_sampler.examples.target_token", ValueError, "must be a fully-qualified"),
        ("no_such_pkg.mod:Proc", ValueError, "cannot import 'no_such_pkg.mod'"),
        ("graphsafe_sampler.examples.target_token:Nope", ValueError, "has no attribute 'Nope'"),
        ("graphsafe_sampler.config:SamplerConfig", TypeError, "is not a LogitsProcessor"),
        (int, TypeError, "is not a LogitsProcessor subclass"),
    ],
    ids=["no-colon", "bad-module", "bad-attr", "not-subclass-str", "not-subclass-class"],
)
def test_bad_specs(spec: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        load_logits_processors([spec], entry_points=False)  # type: ignore[list-item]


def test_target_token_semantics_and_shared_state() -> None:
    state = BatchState(CONFIG, "cpu")
    (proc,) = build_logits_processors(
        load_logits_processors([QUALNAME], entry_points=False),
        CONFIG,
        torch.device("cpu"),
        False,
        state,
    )
    assert proc.batch_state is state
    state.update(
        BatchUpdate(
            3,
            added=[
                (0, SP(extra_args={"target_token": 5}), None, []),
                (1, SP(), None, []),
                (2, SP(extra_args={"target_token": 96}), None, []),
            ],
            moved=[(0, 2, MoveDirectionality.SWAP)],
        )
    )
    logits = torch.randn(5, 97)
    out = proc.apply(logits.clone())
    assert torch.isinf(out[0]).sum() == 96 and out[0, 96] == logits[0, 96]
    assert torch.equal(out[1], logits[1]) and torch.equal(out[3:], logits[3:])
    assert torch.isinf(out[2]).sum() == 96 and out[2, 5] == logits[2, 5]
    with pytest.raises(ValueError, match=r"target_token'\] = 97 is outside the vocabulary"):
        state.update(BatchUpdate(4, added=[(3, SP(extra_args={"target_token": 97}), None, [])]))
    with pytest.raises(ValueError, match="must be an int token id"):
        state.update(BatchUpdate(4, added=[(3, SP(extra_args={"target_token": "a"}), None, [])]))


def test_target_token_passes_the_harness() -> None:
    proc = TargetTokenLogitsProcessor(CONFIG, torch.device("cpu"), False)
    report = check_graph_safety(proc, num_steps=50, make_params=target_params, seed=3)
    assert report.compile_frames == 1


class Tracker(AdapterLogitsProcessor):
    """Adds the number of outputs so far to token 0; with a prompt, bans the prompt's last."""

    def new_req_logits_processor(self, params: SP):  # type: ignore[no-untyped-def]
        mode = (params.extra_args or {}).get("mode")
        if mode == "count":
            return lambda out, row: (
                row + torch.nn.functional.one_hot(torch.tensor(0), row.shape[0]) * len(out)
            )
        if mode == "prompt":

            def ban_last(prompt, out, row):  # type: ignore[no-untyped-def]
                row = row.clone()
                row[prompt[-1]] = float("-inf")
                return row

            return ban_last
        return None


def test_adapter_runs_request_callables_and_follows_moves() -> None:
    proc = Tracker(CONFIG, torch.device("cpu"), False)
    out0: list[int] = [1, 2]
    proc.update_state(
        BatchUpdate(
            3,
            added=[
                (0, SP(extra_args={"mode": "count"}), None, out0),
                (1, SP(), None, []),
                (2, SP(extra_args={"mode": "prompt"}), [3, 9], []),
            ],
        )
    )
    logits = torch.randn(4, 97)
    out = proc.apply(logits.clone())
    assert out[0, 0] == logits[0, 0] + 2 and torch.equal(out[1], logits[1])
    assert out[2, 9] == float("-inf")
    out0.append(7)  # a live reference: the engine appends, the adapter sees it
    proc.update_state(BatchUpdate(3, moved=[(0, 1, MoveDirectionality.SWAP)]))
    out = proc.apply(logits.clone())
    assert out[1, 0] == logits[1, 0] + 3 and torch.equal(out[0], logits[0])
    proc.update_state(
        BatchUpdate(2, removed=[1], moved=[(2, 1, MoveDirectionality.UNIDIRECTIONAL)])
    )
    out = proc.apply(logits.clone())
    assert out[1, 9] == float("-inf") and torch.equal(out[0], logits[0])


def test_adapter_rejects_wrong_arity() -> None:
    class Bad(AdapterLogitsProcessor):
        def new_req_logits_processor(self, params: SP):  # type: ignore[no-untyped-def]
            return lambda row: row

    with pytest.raises(TypeError, match=r"takes \(output_ids, logits_row\)"):
        Bad(CONFIG, torch.device("cpu"), False).update_state(
            BatchUpdate(1, added=[(0, SP(), None, [])])
        )
