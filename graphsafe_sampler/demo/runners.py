"""The demo's decode step and the three ways to run it.

`decode_step` is the unit that is compiled and captured: the model's forward and the
sampler's. It reads its inputs from `DecodeInputs`, fixed-address buffers that the engine
fills once a step, and a batch is padded up to a bucket of `MIN_BUCKET` rows or more. A
`StepRunner` runs the step for one bucket and returns its tokens; `MODES` names the three
runners: eager, `torch.compile(fullgraph=True)` with a dynamic batch dimension, and one
CUDA graph of the compiled step per bucket, replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphsafe_sampler.examples.tiny_decoder import TinyDecoder
from graphsafe_sampler.sampler import Sampler

MODES = ("eager", "compiled", "cuda-graph")
# Buckets start at 2: torch.compile specialises a dimension of size 1, so a bucket of 1 would
# cost a second compile; a lone request is padded to 2 rows instead.
MIN_BUCKET = 2

# [bucket] -> the step's [bucket, 1] int32 token ids.
StepRunner = Callable[[int], torch.Tensor]


def decode_step(
    model: TinyDecoder,
    sampler: Sampler,
    input_ids: torch.Tensor,  # [num_rows] int64
    kv_slots: torch.Tensor,  # [num_rows] int64
    positions: torch.Tensor,  # [num_rows] int64
) -> torch.Tensor:
    """One decode step, the unit that is compiled and captured: the model's forward and the
    sampler's, which commits each real row's token to its request's device-side history.
    Returns [num_rows, 1] int32 token ids."""
    logits = model(input_ids, kv_slots, positions)  # [num_rows, V] float32
    return sampler(logits).sampled_token_ids


class DecodeInputs:
    """The decode step's inputs at fixed addresses, as a captured graph needs them.

    device: [3, max_rows] int64 (input ids, KV slots, positions); a step of `bucket` rows
    reads the first `bucket` columns. host: its twin (pinned on CUDA), filled by the engine
    and sent whole in one host-to-device copy per step (a few hundred bytes). The host
    rewrites it only after reading the previous step's tokens, which waits for that step,
    so the earlier copy has finished.
    """

    def __init__(self, max_rows: int, device: torch.device, padding_kv_slot: int) -> None:
        self.padding_kv_slot = padding_kv_slot
        self.device = torch.zeros(3, max_rows, dtype=torch.int64, device=device)
        self.host = torch.zeros(3, max_rows, dtype=torch.int64, pin_memory=device.type == "cuda")

    def stage(
        self, input_ids: Sequence[int], kv_slots: Sequence[int], positions: Sequence[int]
    ) -> None:
        """Write the real rows, make every other row padding (token 0 at position 0 in the
        scratch KV slot) and copy the buffer to the device."""
        n = len(input_ids)
        host = self.host.numpy()
        host[0, :n], host[1, :n], host[2, :n] = input_ids, kv_slots, positions
        host[0, n:], host[1, n:], host[2, n:] = 0, self.padding_kv_slot, 0
        self.device.copy_(self.host, non_blocking=True)

    def views(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids, kv_slots, positions: [bucket] int64 views of the device buffer."""
        return self.device[0, :bucket], self.device[1, :bucket], self.device[2, :bucket]


def compile_decode_step() -> Callable[..., Any]:
    """`decode_step` under `torch.compile(fullgraph=True)`. How inductor writes its CPU C++
    (SIMD or scalar) is a per-process setting: see `run.scalar_cpu_codegen`."""
    return torch.compile(decode_step, fullgraph=True)


def eager_runner(model: TinyDecoder, sampler: Sampler, inputs: DecodeInputs) -> StepRunner:
    def run(bucket: int) -> torch.Tensor:
        return decode_step(model, sampler, *inputs.views(bucket))

    return run


def compiled_runner(
    model: TinyDecoder, sampler: Sampler, inputs: DecodeInputs, compiled_step: Callable[..., Any]
) -> StepRunner:
    """The compiled step. The batch dimension is marked dynamic (from MIN_BUCKET up), so one
    compile serves every bucket."""
    max_rows = inputs.device.shape[1]

    def run(bucket: int) -> torch.Tensor:
        views = inputs.views(bucket)
        for view in views:
            torch._dynamo.mark_dynamic(view, 0, min=MIN_BUCKET, max=max_rows)
        out: torch.Tensor = compiled_step(model, sampler, *views)
        return out

    return run


def cuda_graph_runner(
    model: TinyDecoder,
    sampler: Sampler,
    inputs: DecodeInputs,
    compiled_step: Callable[..., Any],
    buckets: Sequence[int],
) -> StepRunner:
    """One `torch.cuda.CUDAGraph` of the compiled step per bucket, captured with no request
    in the batch (every row padding, so the captures commit nothing), largest first into one
    shared memory pool, as vLLM captures its buckets; a step is a replay."""
    step = compiled_runner(model, sampler, inputs, compiled_step)
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
    for bucket in sorted(buckets, reverse=True):
        inputs.stage([], [], [])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy inits and autotuning stay out of the capture
                step(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = step(bucket)
        graphs[bucket] = (graph, out)
    torch.cuda.synchronize()

    def run(bucket: int) -> torch.Tensor:
        graph, out = graphs[bucket]
        graph.replay()
        return out

    return run
