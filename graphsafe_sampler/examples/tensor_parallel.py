"""A tensor-parallel decode loop: each rank's LM head holds a shard of the vocabulary, and
each rank samples from its own logits with `VocabParallelSampler`; no rank ever holds the
whole logits. Rank 0 then runs the same requests through a one-process `Sampler` on the
whole logits and checks that every token is the same.

    torchrun --nproc-per-node 2 -m graphsafe_sampler.examples.tensor_parallel
    python -m graphsafe_sampler.examples.tensor_parallel --world-size 3   # starts the ranks

The model is the tiny random-weight decoder (`tiny_decoder.py`), its body on every rank (a
real engine splits that too) and its LM head split as vLLM splits it (`vocab_shard`). The
one-process run's logits are the ranks' columns side by side, each computed as its rank
does, so that the check is of the sampling and not of a GEMM's blocking. Requests carry
every feature (penalties, bias, allowed ids, bad words, min_tokens and stop ids, greedy
and seeded rows, min_p, top-k, top-p), and some leave and are replaced as the loop runs.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.distributed import ExchangeRecord, VocabParallelSampler, vocab_shard
from graphsafe_sampler.examples.tiny_decoder import TinyDecoder, TinyDecoderConfig
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.testing.batch_driver import BatchDriver, refill
from graphsafe_sampler.testing.distributed import run_ranks


@dataclass(frozen=True)
class Sizes:
    """requests: rows of the batch; steps: decode steps; vocab_size: the LM head's V."""

    requests: int = 6
    steps: int = 16
    vocab_size: int = 4099
    seed: int = 0


Logits = Callable[[TinyDecoder, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def decode(sampler: Sampler, model: TinyDecoder, logits_of: Logits, sizes: Sizes) -> list[int]:
    """`sizes.steps` decode steps of a batch kept full, whose requests leave at random and
    are replaced (each new one prefilled into a KV slot of its own, as an engine does);
    returns every step's tokens, row by row."""
    config = sampler.config
    # rows stay put (no swaps, no holes to condense): a row's request keeps its KV slot
    driver = BatchDriver(
        config, seed=sizes.seed, joins=refill, churn=0.2, max_swaps=0, condense=0.0
    )
    rows = config.max_num_reqs
    kv_slots = torch.arange(rows)  # the row's KV slot: a new request overwrites the old one's
    input_ids = torch.zeros(rows, dtype=torch.int64)
    positions = torch.zeros(rows, dtype=torch.int64)
    tokens: list[int] = []
    for _ in range(sizes.steps):
        update = driver.next_update()
        for row, _params, prompt, output in update.added:
            # the prompt's first tokens fill the cache; its last one is this step's input
            sequence = [*(prompt or [0]), *output]
            model.prefill(row, sequence[:-1])
            input_ids[row], positions[row] = sequence[-1], len(sequence) - 1
        sampler.update_state(update)
        logits = logits_of(model, input_ids, kv_slots, positions)
        step = sampler(logits).sampled_token_ids[:, 0].long()
        driver.record_tokens(step.tolist())
        tokens += step.tolist()
        input_ids, positions = step, positions + 1
    return tokens


def _configs(sizes: Sizes) -> tuple[SamplerConfig, TinyDecoderConfig]:
    sampler = SamplerConfig(
        max_num_reqs=sizes.requests, vocab_size=sizes.vocab_size, eos_token_id=2, seed=sizes.seed
    )
    # room for the longest prompt and resumed output the driver makes, then every step
    model = TinyDecoderConfig(
        vocab_size=sizes.vocab_size,
        num_kv_slots=sizes.requests,
        max_seq_len=16 + sizes.steps,
        seed=sizes.seed,
    )
    return sampler, model


def run_rank(rank: int, world_size: int, sizes: Sizes) -> None:
    """One rank of the tensor-parallel loop (torch.distributed initialised); rank 0 checks
    the tokens against the one-process run and prints what was exchanged."""
    sampler_config, model_config = _configs(sizes)
    vocab = sizes.vocab_size
    shards = [vocab_shard(vocab, r, world_size) for r in range(world_size)]
    sampler = VocabParallelSampler(sampler_config, device="cpu")
    record = ExchangeRecord([])
    sampler.exchange.record = record

    def own_columns(model: TinyDecoder, *inputs: torch.Tensor) -> torch.Tensor:
        return model(*inputs, vocab_range=shards[rank])  # [rows, end - start]

    split = decode(sampler, TinyDecoder(model_config), own_columns, sizes)
    if rank != 0:
        return

    def side_by_side(model: TinyDecoder, *inputs: torch.Tensor) -> torch.Tensor:
        return torch.cat([model(*inputs, vocab_range=shard) for shard in shards], dim=1)

    whole = decode(Sampler(sampler_config, "cpu"), TinyDecoder(model_config), side_by_side, sizes)
    same = sum(a == b for a, b in zip(split, whole, strict=True))
    per_step = record.bytes_sent // sizes.steps
    logits_bytes = sizes.requests * max(e - s for s, e in shards) * 4
    print(
        f"{world_size} ranks, vocabulary {vocab} split as {shards}: {sizes.steps} steps of "
        f"{sizes.requests} rows; {same} of {len(whole)} tokens equal the one-process "
        f"Sampler's.\nEach rank put {per_step:,} bytes a step into "
        f"{record.collectives // sizes.steps} all-gathers (an all-gather of the logits: "
        f"{logits_bytes:,})."
    )
    if same != len(whole):
        raise SystemExit("the tensor-parallel tokens differ from the one-process run's")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2, help="ranks to start (no torchrun)")
    parser.add_argument("--requests", type=int, default=Sizes.requests)
    parser.add_argument("--steps", type=int, default=Sizes.steps)
    parser.add_argument("--vocab-size", type=int, default=Sizes.vocab_size)
    parser.add_argument("--seed", type=int, default=Sizes.seed)
    args = parser.parse_args(argv)
    sizes = Sizes(args.requests, args.steps, args.vocab_size, args.seed)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        dist.init_process_group("gloo")
        try:
            run_rank(dist.get_rank(), dist.get_world_size(), sizes)
        finally:
            dist.destroy_process_group()
    else:
        run_ranks(run_rank, args.world_size, sizes, timeout_s=300)


if __name__ == "__main__":
    main()
