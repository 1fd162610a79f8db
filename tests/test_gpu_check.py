"""perf/gpu_check.py on a CPU-only machine: the CPU-side parts (argument parsing, the
environment report, the replay comparison with make_fx for the Sampler and the
RejectionSampler, the benchmark grid, the speculative step's cases and the result files),
the case grid, the budget and the helpers. No torch.compile here."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from perf_scripts import load_perf_script

from graphsafe_sampler import RejectionSampler, Sampler
from graphsafe_sampler.bench.results import CaseResult, Results, fill_ratios
from graphsafe_sampler.testing import MakeFxReplayer

gpu_check = load_perf_script("gpu_check")  # puts perf/ on sys.path: its package gpu/
from gpu import (  # noqa: E402
    bench_part,
    book,
    options,
    processes,
    spec_part,
    targets,
    tests_part,
)
from gpu import cases as bench_cases  # noqa: E402
from gpu import replay_check as replay  # noqa: E402

CUDA = torch.cuda.is_available()


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_cpu_smoke_run_writes_every_result(tmp_path: Path) -> None:
    # The real thing at tiny sizes: each part in its own subprocess, as on the GPU. Eight
    # replay steps: the spec checks' awkward inputs come on steps 4 to 6. One batch size
    # per benchmark (the grid's walk over sizes has tests of its own below).
    out = tmp_path / "out"
    argv = [str(out), "--cpu-smoke", "--skip", "tests", "--budget-s", "400", "--steps", "8",
            "--rows", "1", "--spec-rows", "1"]  # fmt: skip
    assert gpu_check.main(argv) == 0

    summary = _json(out / "summary.json")
    assert summary["finished"] and summary["status"] == "passed"
    parts = summary["parts"]
    assert [parts[p]["status"] for p in ("env", "graph", "bench", "spec")] == ["passed"] * 4
    assert parts["tests"] == {"status": "skipped", "reason": "--skip"}
    no_cuda = "--cpu-smoke runs the CPU versions only" if CUDA else "no CUDA device"
    assert parts["flashinfer"] == {"status": "skipped", "reason": no_cuda}
    assert parts["kernels"] == {"status": "skipped", "reason": no_cuda}
    assert list(parts) == ["env", "kernels", "graph", "spec", "tests", "bench", "flashinfer",
                           "compiled"]  # fmt: skip
    assert parts["compiled"]["status"] == "skipped"
    assert "--smoke-compile" in parts["compiled"]["reason"]
    assert parts["graph"]["log"] == "graph.log" and (out / "graph.log").exists()

    env = _json(out / "env.json")
    for key in ("torch", "triton", "flashinfer", "cuda_available", "graphsafe_sampler", "options"):
        assert key in env
    assert env["torch"] == torch.__version__ and env["options"]["cpu_smoke"] is True

    graph = _json(out / "graph_check.json")
    assert graph["schema"] == 1 and graph["status"] == "passed"
    for mode in ("raw_logprobs", "processed_logprobs"):
        check = graph["checks"][f"torch/{mode}/make_fx"]
        assert check["status"] == "passed" and check["replay"] == "make_fx"
        assert check["steps_run"] == check["steps_requested"] == 8
        assert check["logprobs_mode"] == mode and check["failures"] == []
        for counter in ("token_mismatches", "logprob_mismatches", "state_mismatches"):
            assert check[counter] == 0
    # The suite runs the kernels through the interpreter (conftest): the Triton backend
    # must have run, and a failure to build it would be a failure, never a skip.
    assert os.environ.get("TRITON_INTERPRET") == "1"
    triton = graph["checks"]["triton/raw_logprobs/make_fx"]
    assert triton["status"] == "passed", triton
    harness = graph["checks"]["harness/torch/check_graph_safety"]
    assert harness["status"] == "passed" and harness["steps_run"] == 6

    # The spec part: the RejectionSampler's replay checks, with and without draft_probs.
    assert parts["spec"]["log"] == "spec.log" and parts["spec"]["bench"]["status"] == "passed"
    for backend in ("torch", "triton"):
        for drafts in ("draft_probs", "ngram"):
            name = f"rejection/{backend}/{drafts}/make_fx"
            assert name in parts["spec"]["checks"]
            check = graph["checks"][name]
            assert check["status"] == "passed" and check["replay"] == "make_fx", name
            assert check["steps_run"] == check["steps_requested"] == 8
            assert check["backend"] == backend and check["max_spec_len"] == bench_cases.SPEC_LEN
            assert check["draft_probs"] is (drafts == "draft_probs")
            assert check["accepted_drafts"] > 0 and check["failures"] == []
            for counter in ("token_mismatches", "state_mismatches", "address_changes"):
                assert check[counter] == 0

    results = Results.read(out / "bench.json")  # the bench results schema, validated
    assert results.context["suite"] == "perf/gpu_check.py"
    assert results.context["errors"] == []
    floors = {(c.rows, c.vocab) for c in results.cases if c.provider == "clone"}
    # The speculative step's floors: requests x (S + 1) target-logits rows.
    assert floors == {(1, 1000), (5, 1000)}
    reads = {(c.rows, c.vocab) for c in results.cases if c.provider == bench_cases.READ_FLOOR}
    assert reads == floors  # the one-read floor (amax) beside every copy floor
    peer = {(c.stage, c.rows) for c in results.cases if c.provider == bench_cases.VLLM_STYLE}
    assert peer == {(case, 1) for case in bench_cases.BENCH_CASES}
    eager = {(c.stage, c.rows) for c in results.cases if c.provider == "sampler-eager"}
    spec = {(bench_cases.SPEC_STAGE, 5)}
    assert eager == {(case, 1) for case in bench_cases.BENCH_CASES} | spec
    verify = [c for c in results.cases if c.stage == bench_cases.SPEC_STAGE]
    assert {(c.extra["requests"], c.extra["max_spec_len"]) for c in verify} == {(1, 4)}
    assert all(c.extra["draft_probs"] and c.extra["first_call_s"] >= 0 for c in verify)
    for case in results.cases:
        assert case.median_us > 0 and case.ratio_to_floor is not None and case.gbps
        if case.provider == "sampler-eager":
            assert case.extra["max_num_logprobs"] == bench_cases.case_logprobs(case.stage)
    md = (out / "bench.md").read_text(encoding="utf-8")
    assert "| case | rows | vocab | floor µs | sampler-eager µs (x floor) |" in md
    # the top-k/top-p kernel with and without its candidate buffer, once on the interpreter
    kernel = [c for c in results.cases if c.provider.startswith(bench_cases.CANDIDATES_PROVIDER)]
    assert {(c.stage, c.rows, c.extra["candidates"]) for c in kernel} == {
        ("all", 1, 64),
        ("all", 1, 0),
    }
    mean_reads = {c.extra["candidates"]: c.extra["mean_reads"] for c in kernel}
    assert mean_reads[64] == 1.0 and mean_reads[0] > 1.0  # top_k 50: one read, the buffer's
    assert "## top-k/top-p kernel: candidate buffer vs search alone" in md
    # the Triton step of "all", each launch alone, in the step's order (once on the CPU)
    step = sorted(
        (c for c in results.cases if c.provider.startswith(bench_cases.KERNEL_PROVIDER)),
        key=lambda c: int(c.provider.rsplit("-", 1)[1]),
    )
    names = [c.extra["kernel"] for c in step]
    assert {c.stage for c in step} == {"all"} and names[0] == "_process_logits_kernel"
    assert names.index("_candidates_kernel") < names.index("_top_k_top_p_kernel")
    assert names.index("_top_k_top_p_kernel") < names.index("_sample_kernel")
    # the commit rides on the kernel that makes each token (sample_and_commit)
    assert names.index("_sample_kernel") < names.index("_logprobs_kernel")
    assert "_commit_history_kernel" not in names
    assert "## The Triton step, kernel by kernel" in md
    # processing's launch once more, without its store (the probe), beside it in its section
    probe = [c for c in results.cases if c.provider == bench_cases.NO_STORE_PROVIDER]
    assert [(c.stage, c.extra["index"], c.extra["kernel"]) for c in probe] == [
        ("all", 0, "_process_logits_kernel")
    ]
    assert "## Processing without its [B, V] store" in md
    # the sampler's line, the candidate buffer's two, a line per kernel of the step, the probe
    assert md.count("\n| all | ") == 1 + 2 + len(step) + 1
    assert md.count("\n| rejection | ") == 1 and "`rejection`: speculative decoding" in md


def _tiny_options(**kwargs: object) -> object:
    ns = options.build_parser().parse_args(
        ["unused", "--cpu-smoke", *map(str, kwargs.get("argv", []))]
    )
    return options.options_from_args(ns)


def test_replay_check_catches_a_value_baked_into_the_trace() -> None:
    # A step that reads host state (the batch size) bakes it into the make_fx trace, as a
    # CUDA graph would; eager reads it fresh. The comparison must notice once it changes.
    opts = _tiny_options()
    config = targets.graph_config(opts, "torch", "raw_logprobs")

    def leaky(sampler: Sampler) -> replay.StepFn:
        def step(logits: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            size = torch.full((1,), sampler.batch_state.batch_size)
            return (*replay.flatten_output(sampler(logits, mask)), size)

        return step

    check = replay.replay_check(
        lambda: Sampler(config, "cpu"),
        MakeFxReplayer,
        steps=10,
        seed=3,
        deadline=time.monotonic() + 300,
        step_fn=leaky,
    )
    assert check["status"] == "failed" and check["logprob_mismatches"] > 0
    assert check["token_mismatches"] == check["state_mismatches"] == 0
    assert check["steps_run"] == 10
    assert any("output 4: 1 elements differ" in f for f in check["failures"])


def test_spec_replay_check_catches_a_value_baked_into_the_trace() -> None:
    # The same for the speculative step: a draft count capped by the host's batch size is
    # baked into the trace; the tokens, num_accepted and the history must all notice.
    config = targets.spec_config(_tiny_options(), "torch")

    def leaky(rejection: RejectionSampler) -> replay.StepFn:
        def step(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            logits, drafts, num, probs, mask = inputs
            cap = max(rejection.sampler.batch_state.batch_size - 3, 0)
            out = rejection(logits, drafts, num.clamp(max=cap), probs, commit_mask=mask)
            return (out.output_token_ids, out.num_accepted)

        return step

    check = replay.replay_check(
        lambda: RejectionSampler(Sampler(config, "cpu"), bench_cases.SPEC_LEN),
        MakeFxReplayer,
        steps=8,
        seed=3,
        deadline=time.monotonic() + 300,
        step_fn=leaky,
        make_inputs=spec_part.SpecInputs,
        record=spec_part.record_accepted,
        output_names=replay.SPEC_OUTPUT_NAMES,
    )
    assert check["status"] == "failed" and check["steps_run"] == 8
    assert check["token_mismatches"] > 0 and check["state_mismatches"] > 0
    assert check["logprob_mismatches"] == 0 and check["max_spec_len"] == bench_cases.SPEC_LEN
    assert any(f.split(": ")[1] == "num_accepted" for f in check["failures"])


def test_replay_check_stops_at_its_deadline() -> None:
    config = targets.graph_config(_tiny_options(), "torch", "raw_logprobs")
    check = replay.replay_check(
        lambda: Sampler(config, "cpu"), MakeFxReplayer, steps=5, seed=0, deadline=0.0
    )
    assert check["status"] == "incomplete" and check["steps_run"] == 0


def test_diff_outputs_rules() -> None:
    tokens = torch.tensor([[3], [4]], dtype=torch.int32)
    ids = torch.tensor([[3, 3, 7, 9], [4, 4, 1, 2]], dtype=torch.int32)
    inf = float("inf")
    values = torch.tensor([[-0.5, -0.5, -1.0, -1.0], [-0.1, -0.1, -inf, -inf]])
    ranks = torch.tensor([1, 1], dtype=torch.int32)
    want = (tokens, ids, values, ranks)
    assert replay.diff_outputs(want, tuple(t.clone() for t in want)) == []
    # Tied (row 0, columns 2-3) and -inf (row 1) columns may name any of the tied ids.
    swapped = ids.clone()
    swapped[0, 2:] = torch.tensor([9, 7])
    swapped[1, 2:] = torch.tensor([5, 6])
    assert replay.diff_outputs(want, (tokens, swapped, values, ranks)) == []
    # Column 0 (the sampled token) never may; logprobs within tolerance; NaN == NaN.
    wrong = ids.clone()
    wrong[1, 0] = 5
    assert replay.diff_outputs(want, (tokens, wrong, values, ranks))[0].startswith(
        "logprob_token_ids: 1 elements differ, rows [1]"
    )
    nan_values = values.clone()
    nan_values[0, 0] = float("nan")
    close = nan_values + 1e-7
    assert replay.diff_outputs((tokens, ids, nan_values, ranks), (tokens, ids, close, ranks)) == []
    far = values.clone()
    far[1, 1] += 1e-3
    assert replay.diff_outputs(want, (tokens, ids, far, ranks))[0].startswith(
        "logprobs: 1 elements"
    )
    other = tokens.clone()
    other[0, 0] = 8
    assert replay.diff_outputs(want, (other, ids, values, ranks))[0].startswith("sampled_token_ids")
    assert replay.diff_outputs(want, want[:1]) == ["outputs: 1 tensors, eager gave 4"]


def test_spec_inputs_and_output_names() -> None:
    # The speculative step's inputs: every awkward value on its step, the right shapes.
    config = targets.spec_config(_tiny_options(), "torch")
    assert config.max_num_logprobs == 0 and config.logits_processors
    rows, spec, vocab = config.max_num_reqs, bench_cases.SPEC_LEN, config.vocab_size
    inputs = spec_part.SpecInputs(config, torch.device("cpu"), seed=0)
    for step in range(7):
        logits, drafts, num, probs, mask = inputs(step)
        assert logits.shape == (rows, spec + 1, vocab) and probs.shape == (rows, spec, vocab)
        assert drafts.shape == (rows, spec) and num.shape == mask.shape == (rows,)
        assert drafts.dtype == num.dtype == torch.int64 and mask.dtype == torch.bool
        assert torch.allclose(probs.sum(dim=-1), torch.ones(rows, spec))
        assert logits.isnan().any() == (step == 4) and (num > spec).any() == (step == 5)
        assert ((drafts < 0) | (drafts >= vocab)).any() == (step == 6)
    ngram = spec_part.SpecInputs(config, torch.device("cpu"), seed=0, with_probs=False)(0)
    assert [t.dim() for t in ngram] == [3, 2, 1, 1]

    # Both outputs of the verification step are tokens: a difference is a token mismatch.
    tokens = torch.tensor([[5, 6, -1], [7, -1, -1]], dtype=torch.int32)
    accepted = torch.tensor([1, 0], dtype=torch.int32)
    names = replay.SPEC_OUTPUT_NAMES
    assert replay.diff_outputs((tokens, accepted), (tokens, accepted.clone()), names) == []
    other = accepted.clone()
    other[1] = 1
    (problem,) = replay.diff_outputs((tokens, accepted), (tokens, other), names)
    assert problem.startswith("num_accepted: 1 elements differ, rows [1]")
    assert problem.split(":")[0] in replay.TOKEN_OUTPUTS


def test_case_grid_runs_big_shapes_last() -> None:
    rows, vocabs = (1024, 1, 256, 64), (151_936, 128_256)
    grid = bench_cases.case_grid(rows, vocabs, bench_cases.BENCH_CASES)
    assert len(grid) == 4 * 2 * 10 and len(set(grid)) == len(grid)
    sizes = [r * v for r, v, _ in grid]
    assert sizes == sorted(sizes)
    assert grid[0] == (1, 128_256, "penalties") and grid[-1] == (1024, 151_936, "all")
    assert [c for r, v, c in grid if (r, v) == (64, 151_936)] == list(bench_cases.BENCH_CASES)
    assert bench_cases.case_grid((2,), (8,), ("all", "greedy")) == [(2, 8, "greedy"), (2, 8, "all")]
    with pytest.raises(ValueError, match="unknown cases"):
        bench_cases.case_grid((1,), (8,), ("top_z",))

    # The compiled pass: one program per (vocab, K) for rows > 1, rows = 1 last.
    order = bench_cases.compiled_order(grid)
    assert sorted(order) == sorted(grid)
    programs = [(v, bench_cases.case_logprobs(c), r == 1) for r, v, c in order]
    changes = [p for i, p in enumerate(programs) if i == 0 or p != programs[i - 1]]
    assert len(changes) == len(set(changes)) == 8
    assert all(not single for _, _, single in changes[:4])
    assert [bench_cases.case_logprobs(c) for c in ("logprobs", "all", "greedy")] == [5, 5, 0]


def test_budget_shares_and_skip_reasons() -> None:
    parts = options.PARTS_BY_NAME
    assert options.allot(280, parts["kernels"], options.PARTS) == pytest.approx(280 * 0.10)
    later = [parts["bench"], parts["flashinfer"], parts["compiled"]]
    assert options.allot(200, parts["bench"], later) == pytest.approx(200 * 0.30 / 0.48)
    assert options.allot(200, parts["flashinfer"], later[1:]) == pytest.approx(200 * 0.08 / 0.18)
    assert options.allot(-5, parts["bench"], later) == 0.0
    assert options.allot(90, parts["compiled"], [parts["compiled"]]) == 90
    with pytest.raises(ValueError, match="not among the pending parts"):
        options.allot(10, parts["tests"], later)
    assert sum(p.share for p in options.PARTS) == pytest.approx(1.0)

    gpu = options.Options(out_dir="x", skip=("tests",))
    assert options.skip_reason(parts["tests"], gpu, cuda=True) == "--skip"
    assert options.skip_reason(parts["bench"], gpu, cuda=True) is None
    assert options.skip_reason(parts["bench"], gpu, cuda=False) == "no CUDA device"
    smoke = options.Options(out_dir="x", cpu_smoke=True)
    assert options.skip_reason(parts["graph"], smoke, cuda=False) is None
    assert options.skip_reason(parts["spec"], smoke, cuda=False) is None
    assert options.skip_reason(parts["spec"], gpu, cuda=False) == "no CUDA device"
    assert options.skip_reason(parts["flashinfer"], smoke, cuda=False) == "no CUDA device"
    assert "--smoke-compile" in options.skip_reason(parts["compiled"], smoke, cuda=False)
    smoke.smoke_compile = True
    assert options.skip_reason(parts["compiled"], smoke, cuda=False) is None


def test_a_spent_budget_skips_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert gpu_check.main([str(out), "--cpu-smoke", "--budget-s", "20"]) == 1
    summary = _json(out / "summary.json")
    assert summary["status"] == "incomplete" and summary["parts"]["env"]["status"] == "passed"
    for name in ("graph", "bench", "spec"):
        assert summary["parts"][name]["status"] == "skipped"
        assert summary["parts"][name]["reason"].startswith("budget: ")
    assert (out / "env.json").exists() and not (out / "bench.json").exists()


def test_options_defaults_and_round_trip() -> None:
    gpu = options.options_from_args(options.build_parser().parse_args(["o"]))
    # the table: B 1, 64, 256 at V 151,936, the headline cases, in about 5 minutes
    assert gpu.rows == (1, 64, 256) and gpu.vocabs == (151_936,)
    assert gpu.steps >= 100 and gpu.cases == bench_cases.HEADLINE_CASES and gpu.budget_s == 280
    # The speculative benchmark: the headline 64 requests first, then the other grid rows.
    assert gpu.spec_rows == () and spec_part.spec_bench_rows(gpu.rows) == [64, 1, 256]
    assert spec_part.spec_bench_rows((3, 2)) == [2, 3]
    smoke = _tiny_options(argv=["--rows", "2", "--skip", "tests", "bench"])
    assert smoke.rows == (2,) and smoke.vocabs == (1000,) and smoke.skip == ("tests", "bench")
    assert smoke.cases == bench_cases.BENCH_CASES
    assert smoke.spec_rows == (1, 3)
    assert options.Options.from_json(json.loads(json.dumps(smoke.to_json()))) == smoke
    with pytest.raises(SystemExit, match="--steps must be >= 1"):
        options.options_from_args(options.build_parser().parse_args(["o", "--steps", "0"]))


def test_junit_summary_names_failures_and_cpu_tensor_kernels(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" tests="4">'
        '<testcase classname="tests.test_rng" name="test_a[cuda]"/>'
        '<testcase classname="tests.test_kernel_min_p" name="test_b">'
        '<failure message="ValueError: Pointer argument (at 0) cannot be accessed from Triton '
        '(cpu tensor?)">trace</failure></testcase>'
        '<testcase classname="tests.test_staging" name="test_c"><error message="boom"/>'
        "</testcase>"
        '<testcase classname="tests.test_rng" name="test_d"><skipped message="no"/></testcase>'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    got = tests_part.summarize_junit(xml)
    assert {k: got[k] for k in ("tests", "passed", "failures", "errors", "skipped")} == {
        "tests": 4, "passed": 1, "failures": 1, "errors": 1, "skipped": 1,
    }  # fmt: skip
    assert got["failed"] == ["tests.test_kernel_min_p::test_b", "tests.test_staging::test_c"]
    assert got["note"].startswith("1 failures passed CPU tensors to compiled Triton kernels")


def test_subprocess_is_killed_at_its_timeout(tmp_path: Path) -> None:
    log = tmp_path / "sleep.log"
    cmd = [sys.executable, "-c", "print('hi', flush=True); import time; time.sleep(60)"]
    status, rc, seconds = processes.run_subprocess(cmd, 2.0, log)
    assert (status, rc) == ("timeout", None) and seconds < 20
    assert "hi" in log.read_text()
    assert processes.run_subprocess([sys.executable, "-c", "raise SystemExit(3)"], 30, log)[:2] == (
        "failed",
        3,
    )


def test_background_job_is_waited_for_then_stopped(tmp_path: Path) -> None:
    """The cost model's runner: a job that ends in time is "ok"; one still running when the
    run has no time left is stopped, its output kept."""
    env = dict(os.environ)
    log = tmp_path / "job.log"
    done = processes.Background([sys.executable, "-c", "print('model')"], log, env)
    assert done.finish(30)[:2] == ("ok", 0)
    slow = [sys.executable, "-c", "print('hi', flush=True); import time; time.sleep(60)"]
    status, rc, seconds = processes.Background(slow, log, env).finish(1.0)
    assert (status, rc) == ("timeout", None) and seconds < 20
    assert "model" in log.read_text() and "hi" in log.read_text()


def _case(stage: str, provider: str, median: float, rows: int = 64) -> CaseResult:
    extra = {"function": "fi_fn"} if provider == "flashinfer" else {}
    return CaseResult(stage, provider, rows, 128_256, "float32", median, median, median,
                      gbps=1.0, extra=extra)  # fmt: skip


def test_markdown_table_ratios_to_floor_and_flashinfer() -> None:
    cases = [
        _case("floor", "clone", 10.0),
        _case("floor", bench_cases.READ_FLOOR, 5.0),
        _case("top_k_top_p", "sampler-compiled-graph", 40.0),
        _case("top_k_top_p", "sampler-graph", 80.0),
        _case("top_k_top_p", "flashinfer", 20.0),
        _case("penalties", "sampler-compiled-graph", 30.0),
        _case("greedy", "sampler-graph", 15.0),
    ]
    fill_ratios(cases)
    book.fill_read_ratios(cases)
    book.fill_flashinfer_ratios(cases)
    assert cases[2].extra == {
        "ratio_to_read": 8.0, "ratio_to_flashinfer": 2.0, "flashinfer_ref": "top_k_top_p"
    }  # fmt: skip
    assert cases[5].extra["ratio_to_flashinfer"] == 1.5  # against FlashInfer's top-k/top-p
    md = book.format_markdown(Results({"device_name": "H200", "notes": ["a note"]}, cases))
    # the floors: MB, the copy's µs (and GB/s, none here), then the one read's µs and GB/s
    assert "| 64 | 128256 | 32.8 | 10.0 | – | 5.0 | 1.00 |" in md
    row = "| top_k_top_p | 64 | 128256 | 10.0 | 40.0 (4.00) | 80.0 (8.00) | 1.00 | 8.00 | 20.0 |"
    assert row + " fi_fn | 2.00 |" in md
    assert (
        "| penalties | 64 | 128256 | 10.0 | 30.0 (3.00) | – | 1.00 | 6.00 | – |  | 1.50 † |" in md
    )
    # greedy has no compiled case: the eager provider is its headline.
    assert "| greedy | 64 | 128256 | 10.0 | – | 15.0 (1.50) | 1.00 | 3.00 | – |  | 0.75 † |" in md
    assert md.index("| top_k_top_p |") < md.index("| greedy |") and "- a note" in md


def test_kernel_lines_carry_the_models_estimate_of_the_same_launch() -> None:
    """A timed launch of the step gets the estimate of the model's launch with the same case,
    rows, index and kernel name, and only that; a vocabulary the model was not computed for
    gets none."""
    timed = [_case("all", f"{bench_cases.KERNEL_PROVIDER}{i}", 7.0 + i) for i in range(3)]
    names = ("_process_logits_kernel", "_sample_kernel", "_x_kernel")
    for case, name in zip(timed, names, strict=True):
        case.extra.update(kernel=name, grid=[64, 5])
    launches = [{"name": "_process_logits_kernel", "est_us": 31.5},
                {"name": "_sample_kernel", "est_us": 22.7, "memory_us": 3.3, "waves": 2,
                 "serial_us": 10.35},
                {"name": "_other_kernel", "est_us": 1.0}]  # fmt: skip
    model = {"vocab": 128_256, "gpu": "NVIDIA H100 SXM (sm_90)",
             "cases": {"all": {"64": {"launches": launches}}}}  # fmt: skip
    assert book.model_estimates(model, timed[0])["est_us"] == 31.5
    assert book.model_estimates(model, timed[2]) == {}  # another kernel at that index
    assert book.model_estimates({**model, "vocab": 151_936}, timed[0]) == {}
    md = book.format_markdown(Results({}, timed), model)
    # est, then its memory time and its serial time over all waves (2 x 10.35)
    assert "| all | 64 | 128256 | 1 | _sample_kernel | 64x5 | 8.0 | – | 22.7 | 3.3 | 20.7 |" in md
    assert "| 0 | _process_logits_kernel | 64x5 | 7.0 | – | 31.5 | – | – |" in md
    assert "| all | 64 | 128256 | 2 | _x_kernel | 64x5 | 9.0 | – | – | – | – |" in md
    assert "estimate of that launch on NVIDIA H100 SXM (sm_90) (an estimate" in md
    assert "## Processing without its [B, V] store" not in md  # no probe was timed


def test_store_lines_set_the_probe_beside_processing_and_its_share_of_the_bytes() -> None:
    """The probe (processing replayed without its store) goes beside the timed launch of the
    same case, shape and index, with what it saved and the store's share of the launch's
    bytes by the model (B x V x 4 over the bytes read and written); a probe whose launch
    was not timed, or a shape the model was not computed for, gets no line or no share."""
    kernels = [_case("all", f"{bench_cases.KERNEL_PROVIDER}0", 40.0),
               _case("all", f"{bench_cases.KERNEL_PROVIDER}0", 12.0, rows=1)]  # fmt: skip
    probes = [_case("all", bench_cases.NO_STORE_PROVIDER, 30.0),
              _case("all", bench_cases.NO_STORE_PROVIDER, 11.0, rows=1),
              _case("top_k_top_p", bench_cases.NO_STORE_PROVIDER, 5.0)]  # fmt: skip
    for case in kernels + probes:
        case.extra.update(kernel="_process_logits_kernel", grid=[64, 2], index=0)
    moved = 64 * 128_256 * 4 * 2.5  # the store, 40 % of the launch's bytes
    launches = [{"name": "_process_logits_kernel", "est_us": 31.5, "read_bytes": moved * 0.6,
                 "write_bytes": moved * 0.4}]  # fmt: skip
    model = {"vocab": 128_256, "cases": {"all": {"64": {"launches": launches}}}}
    md = book.format_markdown(Results({}, kernels + probes), model)
    section = md[md.index("## Processing without its [B, V] store") :]
    assert "| all | 64 | 128256 | 40.0 | 30.0 | 10.0 | 25% | 40% |" in section
    assert "| all | 1 | 128256 | 12.0 | 11.0 | 1.0 | 8% | – |" in section  # no model at 1 row
    assert "top_k_top_p" not in section  # its launch was not timed


def test_kernels_part_runs_every_variant_and_names_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels part on a stand-in for tests/cuda_compile.py: a variant that raises is
    named, the others still run, and a kernel of kernels/ that no variant launched fails
    the part (on a GPU the list is cuda_compile's, each call compiling and running)."""
    from types import SimpleNamespace

    from gpu import kernels_part

    ran: list[str] = []

    def boom() -> None:
        raise RuntimeError("ptxas: out of registers")

    fake = SimpleNamespace(
        DEVICE=None,
        _launches=lambda: [
            ("a", lambda: ran.append("a")),
            ("b", boom),
            ("c", lambda: ran.append("c")),
        ],
        kernels_in_package=lambda: {"_never_kernel"},
    )
    monkeypatch.setattr(kernels_part, "_cuda_compile", lambda: fake)
    opts = _tiny_options(argv=[])
    opts.out_dir = str(tmp_path)
    result = kernels_part.run_kernels_part(opts, time.monotonic() + 60)
    assert ran == ["a", "c"] and torch.device("cpu") == fake.DEVICE
    assert result["status"] == "failed" and result["failed"] == ["b"]
    assert result["missing_kernels"] == ["_never_kernel"]
    doc = _json(tmp_path / kernels_part.KERNELS_JSON)
    assert [v["ok"] for v in doc["variants"]] == [True, False, True]
    assert "out of registers" in doc["variants"][1]["error"]


def test_compiled_bench_pass_compiles_once_for_every_rows_above_one(tmp_path: Path) -> None:
    # The file's one torch.compile: the compiled provider marks rows dynamic, so one program
    # serves every rows > 1 while each case reloads the sampler's state.
    # eager: the compile logic (dynamic rows, one program, state reloaded per case) is
    # Dynamo's, and AOTAutograd's trace of the Sampler with rows dynamic would take 35 s
    # more (the graph-safety tests trace it under aot_eager)
    argv = ["--smoke-compile", "--compile-backend", "eager", "--rows", "2", "3",
            "--cases", "top_k", "--backends", "torch"]  # fmt: skip
    opts = _tiny_options(argv=argv)
    opts.out_dir = str(tmp_path)
    result = bench_part.run_bench_part(opts, time.monotonic() + 900)
    assert result["status"] == "passed"
    cases = Results.read(tmp_path / "bench.json").cases
    compiled = [c for c in cases if c.provider == "sampler-compiled"]
    assert [c.rows for c in compiled] == [2, 3]
    assert [c.extra["compile_frames"] for c in compiled] == [1, 1]
    assert compiled[0].extra["first_call_s"] > compiled[1].extra["first_call_s"]


def test_a_triton_backend_that_fails_to_build_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphsafe_sampler import SamplerConfig

    config = SamplerConfig(2, 50, backend="triton")
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert isinstance(targets.sampler_or_reason(config, cpu), Sampler)

    def broken(*args: object, **kwargs: object) -> Sampler:
        raise RuntimeError("the Triton backend is broken")

    monkeypatch.setattr(targets, "Sampler", broken)
    with pytest.raises(RuntimeError, match="is broken"):
        targets.sampler_or_reason(config, cpu)
    # only a device the kernels cannot run on is a skip, with its reason
    monkeypatch.delenv("TRITON_INTERPRET")
    reason = targets.sampler_or_reason(config, cpu)
    assert isinstance(reason, str) and "needs CUDA or TRITON_INTERPRET=1" in reason


@pytest.mark.parametrize("before", [None, "1"])
def test_the_step_without_pdl_is_timed_with_it_off_and_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    from graphsafe_sampler.bench.results import run_context
    from graphsafe_sampler.kernels.dependent_launch import PDL_ENV

    if before is None:
        monkeypatch.delenv(PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(PDL_ENV, before)
    opts = _tiny_options()
    opts.out_dir = str(tmp_path)
    book_ = book.BenchBook(opts, run_context(torch.device("cpu"), suite="test"))
    seen: list[str | None] = []

    class Step:  # stands in for the Triton Sampler: what the timing reads of it
        config = type("Config", (), {"max_num_logprobs": 5})()

        def __call__(self, x: torch.Tensor) -> None:
            seen.append(os.environ.get(PDL_ENV))

    class Pool:
        def load(self, sampler: object, case: str, rows: int) -> float:
            seen.append(os.environ.get(PDL_ENV))
            return 0.01

    timer = bench_part.Timer(torch.device("cpu"), rep_ms=1, cpu_rounds=3)
    x = torch.randn(2, 64)
    bench_part._time_without_pdl(book_, timer, Pool(), Step(), x, "all")  # type: ignore[arg-type]
    assert seen and set(seen) == {"0"}  # the load, the untimed call and every timed one
    assert os.environ.get(PDL_ENV) == before
    [case] = book_.results.cases
    assert case.provider == bench_cases.NO_PDL and (case.stage, case.rows, case.vocab) == (
        "all", 2, 64,
    )  # fmt: skip
    assert case.extra["pdl"] is False and case.median_us > 0

    # a step that raises still puts the setting back
    class Broken(Step):
        def __call__(self, x: torch.Tensor) -> None:
            raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        bench_part._time_without_pdl(book_, timer, Pool(), Broken(), x, "all")  # type: ignore[arg-type]
    assert os.environ.get(PDL_ENV) == before


def test_pdl_lines_set_the_step_without_it_beside_it() -> None:
    """What programmatic dependent launch saved at a shape timed both ways, in all and a
    launch after the step's first (the model's launch count); none where one side is
    missing."""
    on = _case("all", bench_cases.TRITON_GRAPH, 30.0)
    off = _case("all", bench_cases.NO_PDL, 36.0)
    alone = _case("top_k_top_p", bench_cases.NO_PDL, 25.0)  # no PDL-on time to set it by
    model = {"vocab": 128_256, "cases": {"all": {"64": {"launches": [{}] * 5}}}}
    md = book.format_markdown(Results({}, [on, off, alone]), model)
    assert "## Programmatic dependent launch: the Triton step with it and without" in md
    assert "| all | 64 | 128256 | 30.0 | 36.0 | 6.0 | 5 | 1.50 |" in md
    assert "| top_k_top_p | 64 |" not in md.split("## Programmatic")[1]
    # without the model (another vocabulary): no launch count
    md = book.format_markdown(Results({}, [on, off]), {**model, "vocab": 151_936})
    assert "| all | 64 | 128256 | 30.0 | 36.0 | 6.0 | – | – |" in md
    assert "## Programmatic" not in book.format_markdown(Results({}, [on]), model)
