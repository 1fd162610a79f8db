"""`graphsafe-sampler demo`: the sampler inside a model runner, eager against compiled.

A tiny random-weight decoder (`examples/tiny_decoder.py`) and a `Sampler` serve a stream of
requests with mixed `SamplingParams` through a continuous-batching loop, vLLM style:

- the engine (host code, outside the compiled step) admits arriving requests into free rows
  of a persistent batch, prefills their KV cache, drops finished ones (max_tokens reached,
  EOS or a stop token) and condenses the batch by moving the last rows into the holes; every
  change goes to the sampler as one `BatchUpdate` (the one `BatchDriver` of
  graphsafe_sampler.testing keeps the batch -> `update_state`);
- one decode step is `model(input_ids, kv_slots, positions)` + `sampler(logits)`, one
  function (`decode_step`) run eagerly, compiled with `torch.compile(fullgraph=True)`, and on
  CUDA also captured as one `torch.cuda.CUDAGraph` per padded batch-size bucket and replayed;
- the step reads its inputs from fixed-address buffers (`DecodeInputs`) that the engine fills
  each step with one host-to-device copy, and the batch is padded up to the next bucket.

Each mode runs the same request stream from a fresh sampler with the same `SamplerConfig.seed`
(the counter-based RNG makes seeded and unseeded requests reproducible), and every step's
tokens must be identical across modes. It prints tokens/s per mode and exits non-zero when
tokens differ or a check fails (min_tokens, bad words, recompiles during the loop).

The package, one concern per module (imports point down this list):

- `requests.py`: the request stream (`DemoRequest`, `make_request_stream`);
- `runners.py`: the decode step, its fixed-address inputs and the eager / compiled /
  CUDA-graph step runners;
- `engine.py`: the continuous-batching engine and what a run produced (`RunResult`);
- `options.py`: `DemoOptions` and the command-line options;
- `report.py`: comparing the modes' tokens and printing the summary;
- `run.py`: the set-up the modes share, one run per mode, `run_demo`.
"""

from graphsafe_sampler.demo.engine import Engine, RunResult
from graphsafe_sampler.demo.options import DemoOptions, add_demo_arguments, default_buckets
from graphsafe_sampler.demo.report import first_difference, print_summary
from graphsafe_sampler.demo.requests import REQUEST_KINDS, DemoRequest, make_request_stream
from graphsafe_sampler.demo.run import (
    DemoSetup,
    build_setup,
    compiled_graphs,
    prepare_engine,
    run_demo,
    run_mode,
    run_modes,
    torch_threads,
)
from graphsafe_sampler.demo.runners import (
    MIN_BUCKET,
    MODES,
    DecodeInputs,
    StepRunner,
    compile_decode_step,
    compiled_runner,
    cuda_graph_runner,
    decode_step,
    eager_runner,
)

__all__ = [
    "MIN_BUCKET",
    "MODES",
    "REQUEST_KINDS",
    "DecodeInputs",
    "DemoOptions",
    "DemoRequest",
    "DemoSetup",
    "Engine",
    "RunResult",
    "StepRunner",
    "add_demo_arguments",
    "build_setup",
    "compile_decode_step",
    "compiled_graphs",
    "compiled_runner",
    "cuda_graph_runner",
    "decode_step",
    "default_buckets",
    "eager_runner",
    "first_difference",
    "make_request_stream",
    "prepare_engine",
    "print_summary",
    "run_demo",
    "run_mode",
    "run_modes",
    "torch_threads",
]
