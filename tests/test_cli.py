"""`graphsafe-sampler` (graphsafe_sampler/cli.py): bench at tiny sizes, compare's exit codes,
the demo wiring, help. Nothing here is timed; the sizes only keep the runs short."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from graphsafe_sampler.bench.results import CaseResult, Results, fill_ratios
from graphsafe_sampler.cli import build_parser, main

TINY = ["--rows", "3", "--vocab", "1000", "--steps", "2", "--warmup", "0", "--quiet"]
TINY += ["--allocator", "system"]  # the heap setting would outlive the test in this worker


def test_bench_writes_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    providers = ["--providers", "clone", "sampler-eager", "vllm-style"]
    argv = ["bench", *TINY, "--rows", "2", "4", *providers]
    status = main([*argv, "--json", str(out_json), "--plot", str(out_png)])
    assert status == 0
    printed = capsys.readouterr().out
    for provider in ("clone", "sampler-eager", "vllm-style"):
        assert provider in printed
    assert "tokens/s" in printed and "x floor" in printed
    results = Results.read(out_json)
    assert {(c.provider, c.rows) for c in results.cases} == {
        (p, r) for p in ("clone", "sampler-eager", "vllm-style") for r in (2, 4)
    }
    for c in results.cases:
        assert c.stage == "step" and c.vocab == 1000 and c.dtype == "float32"
        assert c.rounds == (10 if c.provider == "clone" else 2)  # the floor gets 5x
        assert c.ratio_to_floor is not None and c.ratio_to_vllm_style is not None
    assert results.context["device_type"] == "cpu" and results.context["wall_s"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_stage_cases_and_skipped_providers(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out_json = tmp_path / "stages.json"
    argv = ["bench", *TINY, "--stages", "top_k", "bias", "--dtype", "bfloat16", "--threads", "1"]
    argv += ["--providers", "clone", "vllm-style", "flashinfer", "--json", str(out_json)]
    threads = torch.get_num_threads()
    try:
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    assert Results.read(out_json).context["torch_threads"] == 1
    assert "skipped: flashinfer: CUDA only" in capsys.readouterr().out
    names = {c.name for c in Results.read(out_json).cases}
    assert names == {
        f"{stage}/{provider}/R3-V1000-bfloat16"
        for stage in ("top_k", "bias")
        for provider in ("clone", "vllm-style")
    }


def test_plot_without_matplotlib_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    out_json = tmp_path / "x.json"
    argv = ["bench", *TINY, "--providers", "clone", "--json", str(out_json)]
    assert main([*argv, "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'graphsafe-sampler[plot]'" in capsys.readouterr().err
    # Refused before anything ran: no results, no figure.
    assert not (tmp_path / "x.png").exists() and not out_json.exists()


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        pytest.param(["--rows", "0"], "expected an integer >= 1", id="rows-0"),
        pytest.param(["--providers", "sglang"], "invalid choice", id="provider"),
        pytest.param(["--churn", "-1"], "finite number >= 0", id="churn"),
        pytest.param(["--evict", "-1"], "expected an integer >= 0", id="evict"),
    ],
)
def test_bench_bad_arguments(argv: list[str], match: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    assert match in capsys.readouterr().err


def test_bench_rejects_an_unavailable_device(capsys: pytest.CaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert main(["bench", *TINY, "--device", "cuda", "--json", "-"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


# ----------------------------------------------------------------- compare


def write_run(
    path: Path, ours_us: float, floor_us: float = 10.0, extra: bool = False, evict_mib: int = 0
) -> str:
    def case(provider: str, median: float) -> CaseResult:
        return CaseResult("step", provider, 8, 1000, "float32", median, median, median)

    cases = [case("clone", floor_us), case("sampler-compiled", ours_us)]
    if extra:
        cases.append(case("sampler-eager", 99.0))
    fill_ratios(cases)
    context = {"device_name": "test", "commit": "abc", "evict_mib": evict_mib}
    Results(context, cases).write(path)
    return str(path)


@pytest.mark.parametrize(
    ("head_us", "threshold", "status", "word"),
    [
        pytest.param(50.0, None, 0, "ok", id="same"),
        pytest.param(60.0, None, 1, "regression", id="regression"),
        pytest.param(40.0, None, 0, "improvement", id="improvement"),
        pytest.param(60.0, "0.25", 0, "ok", id="within-threshold"),
        pytest.param(54.0, "0.05", 1, "regression", id="tight-threshold"),
    ],
)
def test_compare_exit_status(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    head_us: float,
    threshold: str | None,
    status: int,
    word: str,
) -> None:
    base = write_run(tmp_path / "base.json", 50.0)
    head = write_run(tmp_path / "head.json", head_us)
    argv = ["compare", base, head] + (["--threshold", threshold] if threshold else [])
    assert main(argv) == status
    line = next(x for x in capsys.readouterr().out.splitlines() if "sampler-compiled" in x)
    assert line.split()[-1] == word


def test_compare_reports_missing_cases(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = write_run(tmp_path / "base.json", 50.0)
    head = write_run(tmp_path / "head.json", 50.0, extra=True)
    assert main(["compare", base, head]) == 0
    assert "only in head" in capsys.readouterr().out
    assert main(["compare", head, base]) == 0
    assert "only in base" in capsys.readouterr().out


def test_compare_says_when_the_runs_evicted_the_caches_differently(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    base = write_run(tmp_path / "base.json", 50.0)
    head = write_run(tmp_path / "head.json", 50.0, evict_mib=64)
    assert main(["compare", base, head]) == 0
    out = capsys.readouterr().out
    assert "--evict 64" in out and "different --evict" in out
    assert main(["compare", head, head]) == 0
    assert "different --evict" not in capsys.readouterr().out
    # a run written before --evict existed has no such key: it evicted nothing
    older = json.loads(Path(base).read_text())
    del older["context"]["evict_mib"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert main(["compare", str(tmp_path / "older.json"), base]) == 0
    assert "different --evict" not in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "older.json"), head]) == 0
    assert "different --evict" in capsys.readouterr().out


def test_bench_evict_is_run_and_recorded(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out_json = tmp_path / "cold.json"
    argv = ["bench", *TINY, "--providers", "clone", "--evict", "1", "--json", str(out_json)]
    assert main(argv) == 0
    assert "1 MiB written before each" in capsys.readouterr().out
    assert Results.read(out_json).context["evict_mib"] == 1


def test_compare_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = write_run(tmp_path / "base.json", 50.0)
    assert main(["compare", base, str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": 1, "context": {}, "cases": [{"name": "x"}]}))
    assert main(["compare", base, str(bad)]) == 2
    assert "lacks the fields" in capsys.readouterr().err


# ----------------------------------------------------------------- demo, help, entry points


def test_demo_is_reported_unavailable_without_its_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "graphsafe_sampler.demo", None)
    assert main(["demo"]) == 2
    assert "graphsafe-sampler demo is unavailable" in capsys.readouterr().err


def test_demo_module_is_wired_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[argparse.Namespace] = []
    fake = types.ModuleType("graphsafe_sampler.demo")

    def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tokens", type=int, default=4)

    def run_demo(args: argparse.Namespace) -> int:
        calls.append(args)
        return 0

    fake.add_demo_arguments = add_demo_arguments  # type: ignore[attr-defined]
    fake.run_demo = run_demo  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "graphsafe_sampler.demo", fake)
    assert main(["demo", "--tokens", "7"]) == 0
    assert len(calls) == 1 and calls[0].tokens == 7


def subcommand_parser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


@pytest.mark.parametrize("command", ["bench", "compare"])
def test_help_explains_every_option(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for action in subcommand_parser(command)._actions:
        assert action.help, action.dest
        for option in action.option_strings:
            assert option in text, option
    if command == "bench":
        for option in ("--rows", "--vocab", "--steps", "--dtype", "--providers", "--full"):
            assert option in text


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "graphsafe_sampler", "compare", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "BASE.json" in done.stdout and "--threshold" in done.stdout


_FAULTS = """
import resource, sys, torch
from graphsafe_sampler.bench.allocator import use_allocator
print(use_allocator(sys.argv[1]))
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():
    # 41 MB each: above glibc's largest mmap threshold; two at once: above its trim one
    y = torch.empty(64, 160_000).fill_(1.0)
    z = torch.empty(64, 160_000).fill_(2.0)
    del y, z
step(); step()  # the first steps fault their buffers in, whatever the allocator
before = faults()
for _ in range(5):
    step()
print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_heap_allocator_stops_the_page_faults_of_large_buffers() -> None:
    # In its own process: the setting lasts for the process.
    runs = {}
    for allocator in ("system", "heap"):
        done = subprocess.run(
            [sys.executable, "-c", _FAULTS, allocator],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        effect, faults = done.stdout.split()
        runs[allocator] = (effect, int(faults))
    assert runs["system"][0] == "system" and runs["heap"][0] == "heap"
    buffer = 64 * 160_000 * 4 // 4096  # pages
    assert runs["system"][1] >= 10 * buffer  # each of the 10 buffers faulted in afresh
    # reused: a stray first touch, and the interpreter's own pages (one run here took
    # buffer + 1), at most
    assert runs["heap"][1] <= 2 * buffer
