"""The demo: the tiny decoder's KV-cache decode against a float64 full-sequence forward, the
continuous-batching loop (batch-invariant tokens, compiled = eager, one compile for every
bucket), and its options."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from graphsafe_sampler.demo import (
    DemoOptions,
    DemoSetup,
    Engine,
    RunResult,
    add_demo_arguments,
    build_setup,
    first_difference,
    prepare_engine,
    run_demo,
)
from graphsafe_sampler.demo import run as demo_run
from graphsafe_sampler.examples.tiny_decoder import TinyDecoder, TinyDecoderConfig

V = 101


def _model(seed: int = 3) -> TinyDecoder:
    config = TinyDecoderConfig(
        vocab_size=V, hidden_size=16, num_layers=2, num_heads=4, mlp_size=24,
        max_seq_len=14, num_kv_slots=3, seed=seed,
    )  # fmt: skip
    return TinyDecoder(config)


# ----------------------------------------------------------------- the model


def _reference_logits(model: TinyDecoder, tokens: list[int]) -> np.ndarray:
    """[T, V] float64 logits of a plain full-sequence forward: every position attends to
    every earlier one, recomputed from scratch, one head at a time. No cache."""
    p = {name: t.detach().double().numpy() for name, t in model.named_parameters()}
    heads, dh = model.config.num_heads, model.config.head_dim

    def norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w

    n = len(tokens)
    h = p["embed_tokens"][tokens] + p["embed_positions"][:n]  # [T, d]
    for i in range(model.config.num_layers):
        w = {k.split(".", 2)[2]: v for k, v in p.items() if k.startswith(f"layers.{i}.")}
        q, k, v = np.split(norm(h, w["attn_norm"]) @ w["qkv_proj"].T, 3, axis=-1)
        attn = np.zeros_like(h)
        for head in range(heads):
            cols = slice(head * dh, (head + 1) * dh)
            for t in range(n):
                scores = k[: t + 1, cols] @ q[t, cols] / math.sqrt(dh)  # [t + 1]
                weights = np.exp(scores - scores.max())
                attn[t, cols] = (weights / weights.sum()) @ v[: t + 1, cols]
        h = h + attn @ w["o_proj"].T
        gate, up = np.split(norm(h, w["mlp_norm"]) @ w["gate_up_proj"].T, 2, axis=-1)
        h = h + (gate / (1.0 + np.exp(-gate)) * up) @ w["down_proj"].T
    return norm(h, p["final_norm"]) @ p["lm_head"].T


def test_decode_with_kv_cache_matches_full_sequence_forward() -> None:
    model = _model()
    gen = torch.Generator().manual_seed(11)
    # Poison the cache: entries past a row's position must get exactly zero weight.
    model.k_cache.copy_(torch.randn(model.k_cache.shape, generator=gen) * 100)
    model.v_cache.copy_(torch.randn(model.v_cache.shape, generator=gen) * 100)
    rng = random.Random(11)
    lengths, prefilled = [14, 9, 12], [0, 3, 6]
    seqs = [[rng.randrange(V) for _ in range(n)] for n in lengths]
    want = [_reference_logits(model, seq) for seq in seqs]
    for slot, (seq, n) in enumerate(zip(seqs, prefilled, strict=True)):
        got = model.prefill(slot, seq[:n]).double().numpy()
        np.testing.assert_allclose(got, want[slot][:n], rtol=1e-4, atol=1e-4)

    pad = model.padding_kv_slot
    positions = list(prefilled)
    checked = 0
    while any(pos < n for pos, n in zip(positions, lengths, strict=True)):
        live = [s for s in range(3) if positions[s] < lengths[s]]
        rng.shuffle(live)  # requests change rows from step to step
        rows = live + [None] * (4 - len(live))  # padded to a bucket of 4 rows
        ids = [seqs[s][positions[s]] if s is not None else rng.randrange(V) for s in rows]
        slots = [s if s is not None else pad for s in rows]
        pos = [positions[s] if s is not None else 0 for s in rows]
        logits = model(torch.tensor(ids), torch.tensor(slots), torch.tensor(pos))
        assert logits.shape == (4, V) and logits.dtype == torch.float32
        for row, s in enumerate(live):
            np.testing.assert_allclose(
                logits[row].double().numpy(), want[s][positions[s]], rtol=1e-4, atol=1e-4
            )
            positions[s] += 1
            checked += 1
    assert checked == sum(lengths) - sum(prefilled)


def test_model_rejects_bad_input() -> None:
    model = _model()
    with pytest.raises(ValueError, match="hidden_size = 10 must be a multiple of num_heads = 4"):
        TinyDecoderConfig(hidden_size=10, num_heads=4)
    with pytest.raises(ValueError, match="max_seq_len must be >= 1, got 0"):
        TinyDecoderConfig(max_seq_len=0)
    with pytest.raises(TypeError, match="vocab_size must be an int, got float"):
        TinyDecoderConfig(vocab_size=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kv_slot = 3 is outside \[0, 3\)"):
        model.prefill(3, [1])
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 101\)"):
        model.prefill(0, [5, V])
    with pytest.raises(ValueError, match="15 tokens exceed max_seq_len = 14"):
        model.prefill(0, [1] * 15)
    ids = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(
        ValueError, match=r"kv_slots must be a 1-D int64 tensor, got 1-D torch\.int32"
    ):
        model(ids, ids.int(), ids)
    with pytest.raises(ValueError, match="positions has 3 rows, input_ids has 2"):
        model(ids, ids, torch.zeros(3, dtype=torch.int64))


# ----------------------------------------------------------------- the loop


def _stream_options(**overrides: object) -> DemoOptions:
    base = dict(
        steps=40, max_num_reqs=4, buckets=(2, 4), vocab=V, hidden_size=16, num_layers=1,
        max_prompt_len=6, max_tokens=8, seed=5,
    )  # fmt: skip
    base.update(overrides)
    return DemoOptions(**base)  # type: ignore[arg-type]


def _served(setup: DemoSetup, steps: int) -> RunResult:
    return prepare_engine(setup, "eager").run(setup.stream, steps, "eager")


def _outputs(result: RunResult) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for step in result.transcript:
        for request_id, token in step:
            out.setdefault(request_id, []).append(token)
    return out


def test_tokens_do_not_depend_on_the_batch() -> None:
    """Each request served alone gives the tokens it got in the churning batch: rows, KV
    slots, moves, padding and neighbours change nothing (eager; seeds drawn in add order)."""
    options = _stream_options()
    setup = build_setup(options)
    stream = setup.stream
    batched = _served(setup, options.steps)
    assert not batched.violations
    assert len(batched.finished) == len(stream) >= 12  # every kind of request served
    assert set(batched.bucket_steps) == {2, 4}
    assert batched.batch_changes["moved"] > 0 and batched.batch_changes["removed"] > 0
    assert {"length", "stop", "eos"} <= set(batched.finished.values())

    # One request at a time through one sampler: unseeded requests draw their seeds in the
    # same (arrival) order as in the batch.
    alone_stream = [dataclasses.replace(r, arrival_step=i * 20) for i, r in enumerate(stream)]
    alone = _served(dataclasses.replace(setup, stream=alone_stream), 20 * len(stream))
    assert max(Counter(len(step) for step in alone.transcript)) <= 1
    assert _outputs(alone) == _outputs(batched)


def test_engine_rejects_what_does_not_fit() -> None:
    setup = build_setup(_stream_options())
    engine = prepare_engine(setup, "eager")
    too_long = dataclasses.replace(setup.stream[0], prompt_token_ids=(1,) * 10, max_tokens=5)
    with pytest.raises(
        ValueError, match=r"max_tokens \(5\) must fit the KV cache's max_seq_len = 14"
    ):
        engine.run([too_long], 3, "eager")
    small_model = TinyDecoder(dataclasses.replace(setup.model.config, num_kv_slots=2))
    with pytest.raises(ValueError, match="2 KV slots, fewer than the sampler's max_num_reqs = 4"):
        Engine(small_model, engine.sampler, engine.inputs, engine.runner, (2, 4))
    with pytest.raises(ValueError, match=r"buckets \[2\] do not reach max_num_reqs = 4"):
        Engine(setup.model, engine.sampler, engine.inputs, engine.runner, (2,))


def test_compiled_loop_matches_eager_and_compiles_once(tmp_path: Path) -> None:
    """The file's one torch.compile, run as the command in its own process (its scalar C++
    is a per-process setting of inductor's): a dynamic batch dimension serves both buckets,
    nothing recompiles as requests join, leave and move, and every step's tokens equal
    eager's."""
    o = _stream_options()
    report = tmp_path / "demo.json"
    argv = [
        "--steps", str(o.steps), "--max-num-reqs", str(o.max_num_reqs), "--buckets", "2,4",
        "--vocab", str(o.vocab), "--hidden-size", str(o.hidden_size),
        "--num-layers", str(o.num_layers), "--max-prompt-len", str(o.max_prompt_len),
        "--max-tokens", str(o.max_tokens), "--seed", str(o.seed), "--device", "cpu",
        "--modes", "eager,compiled", "--quiet", "--json", str(report),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "graphsafe_sampler", "demo", *argv],
        capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "note:" not in done.stderr  # the compile was scalar, as the command asks
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["identical"] and result["differences"] == []
    eager, compiled = result["modes"]
    assert (eager["mode"], compiled["mode"]) == ("eager", "compiled")
    assert compiled["compiles"] == 1
    assert eager["violations"] == [] and compiled["violations"] == []  # no recompile either
    assert set(compiled["bucket_steps"]) == {"2", "4"}
    assert compiled["batch_changes"]["moved"] > 0
    assert compiled["num_tokens"] == eager["num_tokens"] > 0
    assert sum(compiled["finished"].values()) == result["requests"]
    assert "tokens identical: yes" in done.stdout


def test_scalar_codegen_is_refused_once_something_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    # Inductor keeps its first CPU compile's choice for the process: changing the setting
    # after that would only claim what it cannot do.
    monkeypatch.setattr(demo_run, "compiled_graphs", lambda: 1)
    before = torch._inductor.config.cpp.vec_isa_ok
    assert demo_run.scalar_cpu_codegen() is False
    assert torch._inductor.config.cpp.vec_isa_ok == before


def test_first_difference_names_the_step() -> None:
    def result(transcript: list[tuple[tuple[int, int], ...]], mode: str) -> RunResult:
        return RunResult(
            mode=mode, transcript=transcript, finished={}, num_tokens=0, seconds=1.0,
            step_seconds=[], bucket_steps=Counter(), violations=[], batch_changes=Counter(),
        )  # fmt: skip

    a = result([((0, 5),), ((0, 7), (1, 2))], "eager")
    b = result([((0, 5),), ((0, 7), (1, 3))], "compiled")
    assert first_difference(a, a) is None
    assert first_difference(a, b) == (
        "step 1: eager and compiled differ at (request, token) [(1, 2), (1, 3)]"
    )


# ----------------------------------------------------------------- options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    return parser


def test_default_arguments() -> None:
    options = DemoOptions.from_namespace(_parser().parse_args([]))
    assert options == DemoOptions()
    assert options.buckets == (2, 4, 8, 16) and options.vocab == 4099
    parsed = _parser().parse_args(["--max-num-reqs", "12", "--modes", "eager"])
    assert DemoOptions.from_namespace(parsed).buckets == (2, 4, 8, 12)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        pytest.param({"buckets": (4, 2)}, ValueError, "increasing sizes >= 2", id="unsorted"),
        pytest.param({"buckets": (1, 4)}, ValueError, r"increasing sizes >= 2, got \[1, 4\]",
                     id="bucket-1"),
        pytest.param({"buckets": (2, 8), "max_num_reqs": 16}, ValueError,
                     "largest bucket must equal --max-num-reqs = 16", id="too-small"),
        pytest.param({"modes": ("compiled",)}, ValueError, "must include eager", id="no-eager"),
        pytest.param({"modes": ("eager", "fast")}, ValueError, "unknown mode 'fast'",
                     id="bad-mode"),
        pytest.param({"steps": 0}, ValueError, "--steps must be >= 1, got 0", id="steps"),
        pytest.param({"vocab": 8}, ValueError, "--vocab must be >= 16, got 8", id="vocab"),
        pytest.param({"max_num_reqs": 1, "buckets": (1,)}, ValueError,
                     "--max-num-reqs must be >= 2", id="one-row"),
        pytest.param({"hidden_size": 18}, ValueError, "multiple of 4", id="width"),
        pytest.param({"device": "tpu"}, ValueError, "--device must be auto, cpu or cuda",
                     id="device"),
        pytest.param({"threads": True}, TypeError, "--threads must be an int", id="threads"),
    ],
)  # fmt: skip
def test_bad_options_rejected(overrides: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        DemoOptions(**overrides)


def test_run_demo_reports_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["--buckets", "2,8", "--max-num-reqs", "4"])
    assert run_demo(args) == 2
    assert "error: --buckets: the largest bucket must equal --max-num-reqs = 4" in (
        capsys.readouterr().err
    )
    if not torch.cuda.is_available():
        args = _parser().parse_args(["--modes", "eager,cuda-graph", "--device", "cpu"])
        assert run_demo(args) == 2
        assert "--modes cuda-graph needs --device cuda" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--buckets", "2,x"])
    assert "expected comma-separated ints, got '2,x'" in capsys.readouterr().err


def test_run_demo_eager_summary(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(
        ["--modes", "eager", "--steps", "12", "--max-num-reqs", "4", "--vocab", "67",
         "--hidden-size", "8", "--num-layers", "1", "--max-tokens", "5", "--device", "cpu"]
    )  # fmt: skip
    assert run_demo(args) == 0
    out = capsys.readouterr().out
    assert "eager" in out and "tokens/s" in out and "requests served:" in out
    assert out.rstrip().endswith("tokens identical: yes")
