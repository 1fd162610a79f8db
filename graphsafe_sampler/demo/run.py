"""Running the demo: the set-up every mode shares, one run per mode, and `run_demo`.

`build_setup` makes the model, the sampler's config, the request stream and (when a mode
needs it) the compiled step; `prepare_engine` builds a fresh sampler, runner and engine
for one mode and warms it up on every bucket; `run_mode` serves the stream and counts
compiles; `run_modes` does that for every mode; `run_demo` is the command's entry point
(options in, exit code out).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.demo.engine import Engine, RunResult
from graphsafe_sampler.demo.options import DemoOptions
from graphsafe_sampler.demo.report import first_difference, print_summary, write_json
from graphsafe_sampler.demo.requests import DemoRequest, make_request_stream
from graphsafe_sampler.demo.runners import (
    DecodeInputs,
    StepRunner,
    compile_decode_step,
    compiled_runner,
    cuda_graph_runner,
    eager_runner,
)
from graphsafe_sampler.examples.tiny_decoder import TinyDecoder, TinyDecoderConfig
from graphsafe_sampler.sampler import Sampler


@dataclass
class DemoSetup:
    """What every mode shares: the model (weights and KV cache; a request's cache entries
    are all written before they are read, so runs need no reset), the sampler's config
    (each mode builds a fresh Sampler from it: same seed, same unseeded draws), the stream,
    and the compiled step (None when only eager runs)."""

    options: DemoOptions
    device: torch.device
    model: TinyDecoder
    sampler_config: SamplerConfig
    stream: list[DemoRequest]
    compiled_step: Callable[..., Any] | None


def build_setup(options: DemoOptions, modes: Sequence[str] = ("eager",)) -> DemoSetup:
    """The model, the sampler config and the stream of `options`, and the compiled step if a
    mode of `modes` needs it (compiling happens at its first call)."""
    device = options.resolved_device()
    model_config = TinyDecoderConfig(
        vocab_size=options.vocab,
        hidden_size=options.hidden_size,
        num_layers=options.num_layers,
        num_heads=4,
        mlp_size=2 * options.hidden_size,
        max_seq_len=options.max_prompt_len + options.max_tokens,
        num_kv_slots=options.max_num_reqs,
        seed=options.seed,
    )
    eos = options.vocab - 1
    sampler_config = SamplerConfig(
        max_num_reqs=options.max_num_reqs,
        vocab_size=options.vocab,
        eos_token_id=eos,
        seed=options.seed,
        max_bad_word_len=4,
    )
    stream = make_request_stream(
        num_steps=options.steps,
        max_num_reqs=options.max_num_reqs,
        vocab_size=options.vocab,
        eos_token_id=eos,
        max_prompt_len=options.max_prompt_len,
        max_tokens=options.max_tokens,
        seed=options.seed,
    )
    compiled_step = None
    if any(mode != "eager" for mode in modes):
        compiled_step = compile_decode_step()
    model = TinyDecoder(model_config, device)
    return DemoSetup(options, device, model, sampler_config, stream, compiled_step)


def prepare_engine(setup: DemoSetup, mode: str) -> Engine:
    """A fresh sampler and engine for `mode`, warmed up (and compiled or captured) on every
    bucket. With the batch empty every row is padding, so the warm-up commits nothing."""
    options, device, model = setup.options, setup.device, setup.model
    sampler = Sampler(setup.sampler_config, device)
    sampler.update_state(None)
    inputs = DecodeInputs(options.max_num_reqs, device, model.padding_kv_slot)
    runner: StepRunner
    if mode == "eager":
        runner = eager_runner(model, sampler, inputs)
    elif setup.compiled_step is None:
        raise ValueError(f"mode {mode!r} needs a setup built with it in `modes`")
    elif mode == "compiled":
        runner = compiled_runner(model, sampler, inputs, setup.compiled_step)
    else:
        runner = cuda_graph_runner(model, sampler, inputs, setup.compiled_step, options.buckets)
    for bucket in options.buckets:
        inputs.stage([], [], [])
        runner(bucket).tolist()
    return Engine(model, sampler, inputs, runner, options.buckets)


def run_mode(setup: DemoSetup, mode: str) -> RunResult:
    """Serve the stream in `mode`; the warm-up (compile, capture) is timed apart, and a
    compile during the loop is a violation."""
    graphs_before = compiled_graphs()
    start = time.perf_counter()
    engine = prepare_engine(setup, mode)
    setup_seconds = time.perf_counter() - start
    compiles = compiled_graphs() - graphs_before
    result = engine.run(setup.stream, setup.options.steps, mode)
    result.setup_seconds, result.compiles = setup_seconds, compiles
    recompiles = compiled_graphs() - graphs_before - compiles
    if recompiles:
        result.violations.append(
            f"{mode}: {recompiles} recompile(s) while requests joined and left"
        )
    return result


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """torch's intra-op thread count set for the block, restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_modes(options: DemoOptions) -> tuple[list[RunResult], DemoSetup]:
    """Build the setup, then serve the stream once per mode (with `options.threads`
    intra-op threads)."""
    device = options.resolved_device()
    modes = options.resolved_modes(device)
    # On cuda:N, streams and graph pools must come from that device.
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with torch_threads(options.threads), on_device:
        setup = build_setup(options, modes)
        return [run_mode(setup, mode) for mode in modes], setup


def scalar_cpu_codegen() -> bool:
    """Make inductor write scalar C++ for every later CPU compile in this process; False
    (and nothing changed) if something was compiled already.

    The sampler's exact top-k/top-p is a 33-pass search whose SIMD C++ is hundreds of kB,
    most of a cold compile: measured on 2 cores with the demo's defaults, the whole run took
    47 s scalar against 136 s SIMD, while the compiled step was 8.3 ms against 3.6 ms
    (eager: 14.4 ms). Inductor settles the choice at its first CPU compile and keeps it for
    the process (neither a per-call option nor a config patch changes it afterwards), so
    this is a process-wide setting for the demo command's own process, never for a library
    caller's.
    """
    if compiled_graphs():
        return False
    torch._inductor.config.cpp.vec_isa_ok = False
    return True


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo with parsed `args` (from `add_demo_arguments`); returns the exit code:
    0 if every mode produced the same tokens and every check passed, 1 if not, 2 for bad
    options (reported on stderr). The command's entry point: without --simd, a compiled
    mode on CPU makes inductor's C++ scalar for the rest of the process
    (`scalar_cpu_codegen`)."""
    try:
        options = DemoOptions.from_namespace(args)
        device = options.resolved_device()
        modes = options.resolved_modes(device)
    except (TypeError, ValueError) as exc:
        print(f"graphsafe-sampler demo: error: {exc}", file=sys.stderr)
        return 2
    compiles_on_cpu = device.type == "cpu" and any(mode != "eager" for mode in modes)
    if compiles_on_cpu and not options.simd and not scalar_cpu_codegen():
        print(
            "graphsafe-sampler demo: note: inductor compiled in this process before the demo, "
            "so its C++ stays SIMD (the compile takes longer)",
            file=sys.stderr,
        )
    results, setup = run_modes(options)
    differences = [
        diff for r in results[1:] if (diff := first_difference(results[0], r)) is not None
    ]
    print_summary(options, setup.model, setup.stream, results, differences)
    if options.json_path:
        write_json(options.json_path, options, setup.stream, results, differences)
    failed = bool(differences) or any(r.violations for r in results)
    return 1 if failed else 0
