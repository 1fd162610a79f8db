"""The results format (`graphsafe_sampler.bench.results`) and the compare gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphsafe_sampler.bench.results import (
    CaseResult,
    Results,
    compare,
    fill_ratios,
    format_comparison,
    has_regression,
    logits_gbps,
    run_context,
)

SCHEMA_FIELDS = {
    "name",
    "stage",
    "provider",
    "rows",
    "vocab",
    "dtype",
    "median_us",
    "p20_us",
    "p80_us",
    "gbps",
    "ratio_to_floor",
    "ratio_to_vllm_style",
}


def case(provider: str, median: float, stage: str = "step", rows: int = 8) -> CaseResult:
    return CaseResult(stage, provider, rows, 1000, "float32", median, median * 0.9, median * 1.1)


def run(floor: float, ours: float, peer: float = 400.0, stage: str = "step") -> Results:
    cases = [case("clone", floor, stage), case("sampler-compiled", ours, stage)]
    cases.append(case("vllm-style", peer, stage))
    fill_ratios(cases)
    return Results({"device_name": "test"}, cases)


def test_ratios_use_the_same_run_and_shape() -> None:
    cases = [
        case("clone", 10.0),
        case("sampler-compiled", 50.0),
        case("vllm-style", 200.0),
        case("sampler-compiled", 80.0, rows=64),  # no floor or peer at 64 rows
        case("clone", 12.0, stage="top_k"),  # the floor of any stage serves the shape
        case("sampler-compiled", 30.0, stage="top_k"),
    ]
    fill_ratios(cases)
    by_name = {c.name: c for c in cases}
    ours = by_name["step/sampler-compiled/R8-V1000-float32"]
    assert ours.ratio_to_floor == pytest.approx(5.0)
    assert ours.ratio_to_vllm_style == pytest.approx(0.25)
    lonely = by_name["step/sampler-compiled/R64-V1000-float32"]
    assert lonely.ratio_to_floor is None and lonely.ratio_to_vllm_style is None
    top_k = by_name["top_k/sampler-compiled/R8-V1000-float32"]
    assert top_k.ratio_to_floor == pytest.approx(3.0)  # fastest floor of the shape: 10
    assert top_k.ratio_to_vllm_style is None  # no vllm-style top_k in this run


def test_gbps_counts_one_read_of_the_logits() -> None:
    # 8 x 1000 bfloat16 = 16,000 bytes in 16 µs: 1 GB/s.
    assert logits_gbps(8, 1000, torch.bfloat16, 16.0) == pytest.approx(1.0)
    assert logits_gbps(8, 1000, torch.float32, 0.0) is None


def test_json_round_trip_and_schema(tmp_path: Path) -> None:
    results = run(10.0, 50.0)
    results.context = run_context("cpu", suite="test")
    path = tmp_path / "r.json"
    results.write(path)
    data = json.loads(path.read_text())
    assert data["schema"] == 1
    for key in ("device_name", "torch", "triton", "commit", "created", "torch_threads"):
        assert key in data["context"]
    assert data["context"]["torch"] == torch.__version__
    for entry in data["cases"]:
        assert set(entry) >= SCHEMA_FIELDS
    back = Results.read(path)
    assert [c.to_json() for c in back.cases] == [c.to_json() for c in results.cases]


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        pytest.param(lambda d: d.update(schema=2), "schema must be 1", id="schema"),
        pytest.param(lambda d: d["cases"][0].pop("median_us"), "lacks", id="missing-field"),
        pytest.param(
            lambda d: d["cases"][0].update(median_us="fast"), "must be a number", id="bad-time"
        ),
        pytest.param(lambda d: d["cases"][0].update(name="other"), "does not match", id="bad-name"),
        pytest.param(lambda d: d["cases"].append(d["cases"][0]), "duplicate", id="duplicate"),
        pytest.param(lambda d: d.update(cases={}), "cases must be", id="cases-not-list"),
    ],
)
def test_malformed_results_are_rejected(mutate, match: str) -> None:  # type: ignore[no-untyped-def]
    data = run(10.0, 50.0).to_json()
    mutate(data)
    with pytest.raises(ValueError, match=match):
        Results.from_json(data)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        Results.read(path)


def statuses(base: Results, head: Results, threshold: float = 0.10) -> dict[str, str]:
    return {c.name: c.status for c in compare(base, head, threshold)}


def test_compare_uses_ratios_to_the_floor_not_raw_times() -> None:
    base = run(floor=10.0, ours=50.0)
    # A machine twice as busy: every time doubles, every ratio stays. No regression.
    busier = run(floor=20.0, ours=100.0, peer=800.0)
    assert set(statuses(base, busier).values()) == {"ok"}
    # Same raw time, but the floor got faster: ours is relatively 2x slower.
    slower = run(floor=5.0, ours=50.0)
    assert statuses(base, slower)["step/sampler-compiled/R8-V1000-float32"] == "regression"
    assert has_regression(compare(base, slower))
    # The floor's own case never gates.
    assert "step/clone/R8-V1000-float32" not in statuses(base, slower)


def test_compare_improvement_and_threshold() -> None:
    base = run(10.0, 50.0)
    faster = run(10.0, 40.0)  # ratio 4 vs 5: head/base 0.8
    name = "step/sampler-compiled/R8-V1000-float32"
    assert statuses(base, faster)[name] == "improvement"
    assert not has_regression(compare(base, faster))
    slightly = run(10.0, 54.0)  # +8%: inside 10%, outside 5%
    assert statuses(base, slightly)[name] == "ok"
    assert statuses(base, slightly, threshold=0.05)[name] == "regression"
    change = next(c.change for c in compare(base, slightly) if c.name == name)
    assert change == pytest.approx(1.08)


def test_compare_reports_missing_cases() -> None:
    base = run(10.0, 50.0, stage="step")
    head = Results(base.context, [c for c in base.cases if c.provider != "vllm-style"])
    head.cases.append(case("sampler-eager", 90.0))
    fill_ratios(head.cases)
    got = statuses(base, head)
    assert got["step/vllm-style/R8-V1000-float32"] == "only in base"
    assert got["step/sampler-eager/R8-V1000-float32"] == "only in head"
    assert not has_regression(compare(base, head))
    table = format_comparison(compare(base, head), 0.10)
    assert "only in base" in table and "only in head" in table


def test_compare_without_a_floor_is_reported_not_gated() -> None:
    base = Results({}, [case("sampler-compiled", 50.0)])
    head = Results({}, [case("sampler-compiled", 500.0)])
    fill_ratios(base.cases)
    fill_ratios(head.cases)
    assert statuses(base, head) == {"step/sampler-compiled/R8-V1000-float32": "no floor"}
    assert not has_regression(compare(base, head))


@pytest.mark.parametrize("threshold", [-0.1, float("nan"), float("inf")])
def test_compare_rejects_bad_thresholds(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        compare(run(10.0, 50.0), run(10.0, 50.0), threshold)
