"""What vocab-parallel sampling sends over the interconnect, against gathering the logits.

    python perf/tp_bytes.py                       # the bytes table (one process, ~1 min)
    python perf/tp_bytes.py --measure             # and the step time on 2 gloo ranks
    python perf/tp_bytes.py --rows 1 --vocab 32000 --world 2 --json tp.json

**Bytes.** For each (rows B, vocab V, world W) one `VocabParallelSampler` step runs in this
process on a `LoopbackExchange` (a world of W ranks, all holding this rank's values) that
records the buffer of every all-gather the step makes: a rank's `[B, m]` contribution. In
a ring all-gather each rank receives W - 1 contributions; gathering the float32 logits
instead (vLLM V1) has each rank contribute its `[B, V / W]` columns. Every feature is on,
with K = 20 logprobs (raw mode). The count does not depend on the logits' values: each
exchange has a fixed shape.

**Time** (`--measure`): on W = 2 gloo ranks of this machine (127.0.0.1, one thread a rank),
the median eager step of `VocabParallelSampler` on each rank's columns against
`dist.all_gather` of the columns followed by `Sampler` (eager) on the whole rows, same batch
and logits. Both are eager PyTorch on a CPU; on GPUs the collectives are NCCL's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from graphsafe_sampler.bench.logits import llm_like_logits
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.distributed import (
    ExchangeRecord,
    LoopbackExchange,
    VocabParallelSampler,
    vocab_shard,
)
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.testing.batch_driver import BatchDriver, refill
from graphsafe_sampler.testing.distributed import run_ranks

LOGPROBS = 20


def _config(rows: int, vocab: int) -> SamplerConfig:
    return SamplerConfig(
        max_num_reqs=rows, vocab_size=vocab, max_num_logprobs=LOGPROBS, eos_token_id=2, seed=0
    )


@dataclass(frozen=True)
class Bytes:
    rows: int
    vocab: int
    world: int
    collectives: int
    contributed: int  # bytes one rank puts into the step's all-gathers
    received: int  # bytes one rank receives: (W - 1) contributions
    all_gather_received: int  # the same for an all-gather of the float32 logits

    @property
    def ratio(self) -> float:
        return self.all_gather_received / self.received


def step_bytes(rows: int, vocab: int, world: int) -> Bytes:
    """One step's exchange on the last rank (the shortest shard: the same buffers)."""
    config = _config(rows, vocab)
    exchange = LoopbackExchange(world, rank=world - 1)
    sampler = VocabParallelSampler(config, device="cpu", exchange=exchange)
    driver = BatchDriver(config, seed=0, joins=refill)
    sampler.update_state(driver.next_update())
    start, end = vocab_shard(vocab, world - 1, world)
    logits = llm_like_logits(rows, vocab, seed=1)[:, start:end].contiguous()
    exchange.record = ExchangeRecord([])
    sampler(logits)
    record = exchange.record
    columns = -(-vocab // world)  # the widest shard: what an all-gather moves per rank
    return Bytes(
        rows,
        vocab,
        world,
        record.collectives,
        record.bytes_sent,
        (world - 1) * record.bytes_sent,
        (world - 1) * rows * columns * 4,
    )


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def measure_rank(rank: int, world: int, rows: int, vocab: int, steps: int, out: str) -> None:
    """On each rank: the split step against all-gather + Sampler, `steps` timed steps."""
    config = _config(rows, vocab)
    split = VocabParallelSampler(config, device="cpu")
    whole = Sampler(config, "cpu")
    driver = BatchDriver(config, seed=0, joins=refill)
    update = driver.next_update()
    split.update_state(update)
    whole.update_state(update)
    start, end = split.shard.start, split.shard.end
    times: dict[str, list[float]] = {"split": [], "gather+sampler": []}
    for step in range(steps + 1):  # the first is a warm-up
        logits = llm_like_logits(rows, vocab, seed=step)
        local = logits[:, start:end].contiguous()
        dist.barrier()
        t0 = time.perf_counter()
        split(local, commit=False)
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        gathered = [
            torch.empty(rows, e - s)
            for s, e in (vocab_shard(vocab, r, world) for r in range(world))
        ]
        dist.all_gather(gathered, local)
        whole(torch.cat(gathered, dim=1), commit=False)
        t3 = time.perf_counter()
        if step:
            times["split"].append(t1 - t0)
            times["gather+sampler"].append(t3 - t2)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({k: _median_ms(v) for k, v in times.items()}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32_000, 151_936])
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--measure", action="store_true", help="time 2 gloo ranks too")
    parser.add_argument("--measure-rows", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()

    print(f"bytes per step per rank, every feature on, K = {LOGPROBS} logprobs (float32 logits)")
    print(
        f"{'B':>4} {'V':>8} {'W':>2} {'gathers':>7} {'split: recv':>12} "
        f"{'all-gather: recv':>17} {'ratio':>8}"
    )
    table = []
    for vocab in args.vocab:
        for rows in args.rows:
            for world in args.world:
                b = step_bytes(rows, vocab, world)
                table.append({**asdict(b), "ratio": b.ratio})
                print(
                    f"{rows:>4} {vocab:>8} {world:>2} {b.collectives:>7} "
                    f"{b.received / 1e3:>10.1f} kB {b.all_gather_received / 1e6:>14.2f} MB "
                    f"{b.ratio:>7.0f}x",
                    flush=True,
                )
    measured = []
    if args.measure:
        print("\nmedian step on 2 gloo ranks of this machine (eager, one thread a rank)")
        print(f"{'B':>4} {'V':>8} {'split':>10} {'all-gather + Sampler':>21}")
        for vocab in args.vocab:
            for rows in args.measure_rows:
                with tempfile.TemporaryDirectory() as tmp:
                    out = os.path.join(tmp, "rank0.json")
                    run_ranks(measure_rank, 2, rows, vocab, args.steps, out, timeout_s=600)
                    with open(out) as f:
                        ms = json.load(f)
                measured.append({"rows": rows, "vocab": vocab, "world": 2, **ms})
                print(
                    f"{rows:>4} {vocab:>8} {ms['split']:>7.1f} ms {ms['gather+sampler']:>18.1f} ms",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": table, "measured": measured}, f, indent=1)


if __name__ == "__main__":
    main()
