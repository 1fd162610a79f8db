"""Memory held by a `Sampler`'s state, by state tensor and per request slot.

    python perf/state_bytes.py [--vocab 151936] [--slots 1024] [--processors-only]

Builds `Sampler(SamplerConfig(max_num_reqs=slots, vocab_size=vocab, max_num_logprobs=20),
'cpu')` and lists every tensor `Sampler.state_tensors()` reports, each tensor once: the
`<name>.device` side with its host shadow `<name>.host` for staged tensors, and device-only
tensors (such as `penalties.counts`) with none. `--slots` is max_num_reqs, the request
slots; every slot-indexed table has one more row, the padding slot. Built on the CPU, the
"device" side is a second CPU tensor. On a CUDA device each staged tensor also owns what its
flush needs, which the CPU build does not allocate: a ring of pinned host buffers of the
tensor's full shape (plus a row index), and a device landing area of the full shape for
packed rows. They are listed separately, computed from the shapes. Device tensors kept
outside `state_tensors()` on the sampler's sub-objects (constants such as the bitmask
unpackers' index tensors) are listed too. The penalty state is compared with vLLM V1's
output-token counts, `[max_num_reqs, V]` int32.

`--processors-only` gives the earlier view: a `BatchState` with the four built-in logits
processors alone, from `BatchState.state_tensors()` and each processor's `state_tensors()`.
"""

from __future__ import annotations

import argparse
import inspect
import math
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.processors import LogitsProcessor
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.stages import BUILTIN_LOGITS_PROCESSORS
from graphsafe_sampler.staging import StagedTensor

# StagedTensor's default ring of pinned staging buffers (used on CUDA devices).
STAGING_RING = inspect.signature(StagedTensor.__init__).parameters["ring"].default
INDEX_BYTES = torch.empty((), dtype=torch.int64).element_size()
MAX_NUM_LOGPROBS = 20
# vLLM V1 keeps output-token counts for penalties as [max_num_reqs, V] int32.
VLLM_COUNT_BYTES = torch.empty((), dtype=torch.int32).element_size()


@dataclass
class Component:
    owner: str  # the part that keeps it (e.g. "penalties"), for the per-part summary
    label: str  # the name printed (state_tensors() key without .host/.device)
    device: torch.Tensor
    host: torch.Tensor | None

    @property
    def rows(self) -> int:
        return self.device.shape[0] if self.device.dim() else 1

    def per_slot(self, row_counts: tuple[int, ...]) -> int | None:
        """Bytes per request slot (one row), or None for a fixed-size tensor."""
        if self.device.dim() and self.rows in row_counts:
            return self.device.nbytes // self.rows
        return None


def pair_up(
    tensors: dict[str, torch.Tensor],
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor | None]]:
    """Group `<name>.device` / `<name>.host` entries; a lone tensor has no host shadow."""
    for key, tensor in tensors.items():
        if key.endswith(".host"):
            continue
        name = key.removesuffix(".device")
        yield name, tensor, tensors.get(f"{name}.host")


def sampler_components(sampler: Sampler) -> list[Component]:
    """Each tensor of `Sampler.state_tensors()` once; owner = the key's first part."""
    out: list[Component] = []
    seen: set[int] = set()
    for name, device, host in pair_up(sampler.state_tensors()):
        if id(device) in seen:
            continue
        seen |= {id(device), id(host)}
        owner = name.split(".", 1)[0] if "." in name else "batch_state"
        out.append(Component(owner, name, device, host))
    return out


def build_processors(
    vocab_size: int, max_num_reqs: int
) -> tuple[BatchState, list[LogitsProcessor]]:
    config = SamplerConfig(max_num_reqs=max_num_reqs, vocab_size=vocab_size)
    device = torch.device("cpu")
    state = BatchState(config, device)
    processors: list[LogitsProcessor] = [
        cls(config, device, False, batch_state=state) for cls in BUILTIN_LOGITS_PROCESSORS
    ]
    return state, processors


def processor_components(state: BatchState, processors: list[LogitsProcessor]) -> list[Component]:
    """Each tensor once: the processors' state_tensors() repeat the shared BatchState's."""
    parts: list[tuple[str, dict[str, torch.Tensor]]] = [("BatchState", state.state_tensors())]
    parts += [(type(p).__name__, p.state_tensors()) for p in processors]
    out: list[Component] = []
    seen: set[int] = set()
    for owner, tensors in parts:
        for name, device, host in pair_up(tensors):
            if id(device) in seen:
                continue
            seen |= {id(device), id(host)}
            out.append(Component(owner, f"{owner}.{name}", device, host))
    return out


def hidden_tensors(
    roots: list[tuple[str, object]], reported: set[int]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors reachable from the roots' attributes (and lists/dicts of them) that
    state_tensors() leaves out, each once, breadth-first so each gets its shortest path.
    StagedTensors are not entered: their host/device are reported and their CUDA-only
    buffers are computed from the shapes."""
    skip = (StagedTensor, SamplerConfig, torch.device, torch.dtype, type, types.ModuleType)
    queue: deque[tuple[str, object]] = deque(roots)
    visited: set[int] = {id(obj) for _, obj in roots}
    seen = set(reported)
    while queue:
        prefix, obj = queue.popleft()
        if isinstance(obj, dict):
            items = [(str(k), v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            items = [(str(i), v) for i, v in enumerate(obj)]
        elif hasattr(obj, "__dict__"):
            items = list(vars(obj).items())
        else:
            continue
        for name, value in items:
            path = f"{prefix}{name}"
            if isinstance(value, torch.Tensor):
                if id(value) not in seen:
                    seen.add(id(value))
                    yield path, value
                continue
            walkable = isinstance(value, (dict, list, tuple)) or hasattr(value, "__dict__")
            if walkable and not isinstance(value, skip) and id(value) not in visited:
                visited.add(id(value))
                queue.append((f"{path}.", value))


def fmt_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:,.0f} B"
    exp = min(int(math.log(n, 1024)), 3)
    return f"{n / 1024**exp:,.2f} {'BKMG'[exp]}iB"


def print_table(headers: list[str], rows: list[list[str]], left: int = 3) -> None:
    """The first `left` columns are left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def print_components(comps: list[Component], row_counts: tuple[int, ...]) -> None:
    rows = []
    for c in comps:
        per_slot = c.per_slot(row_counts)
        rows.append(
            [
                c.label,
                str(tuple(c.device.shape)),
                str(c.device.dtype).removeprefix("torch."),
                f"{c.device.nbytes:,}",
                "fixed" if per_slot is None else f"{per_slot:,}",
                f"{c.host.nbytes:,}" if c.host is not None else "-",
            ]
        )
    device_total = sum(c.device.nbytes for c in comps)
    host_total = sum(c.host.nbytes for c in comps if c.host is not None)
    slot_total = sum(c.per_slot(row_counts) or 0 for c in comps)
    rows.append(["total", "", "", f"{device_total:,}", f"{slot_total:,}", f"{host_total:,}"])
    print_table(["component", "shape", "dtype", "device B", "B / slot", "host B"], rows)


def print_parts(comps: list[Component], row_counts: tuple[int, ...]) -> None:
    """Per-part subtotals (batch_state, allowed, ..., grammar), in state_tensors() order."""
    owners = list(dict.fromkeys(c.owner for c in comps))
    device_total = sum(c.device.nbytes for c in comps)
    rows = []
    for owner in owners:
        part = [c for c in comps if c.owner == owner]
        device = sum(c.device.nbytes for c in part)
        host = sum(c.host.nbytes for c in part if c.host is not None)
        per_slot = sum(c.per_slot(row_counts) or 0 for c in part)
        rows.append(
            [
                owner,
                f"{device:,}",
                f"{per_slot:,}",
                f"{host:,}",
                f"{100 * device / device_total:.1f}%",
            ]
        )
    print_table(["part", "device B", "B / slot", "host B", "of device"], rows, left=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936, help="vocab_size (default 151936)")
    parser.add_argument(
        "--slots", type=int, default=1024, help="max_num_reqs, request slots (default 1024)"
    )
    parser.add_argument(
        "--processors-only",
        action="store_true",
        help="only a BatchState with the built-in logits processors (the earlier view)",
    )
    args = parser.parse_args()

    sampler: Sampler | None = None
    if args.processors_only:
        state, processors = build_processors(args.vocab, args.slots)
        config = state.config
        comps = processor_components(state, processors)
        roots: list[tuple[str, object]] = [(f"{type(p).__name__}.", p) for p in processors]
        what = "BatchState + built-in processors"
    else:
        config = SamplerConfig(
            max_num_reqs=args.slots, vocab_size=args.vocab, max_num_logprobs=MAX_NUM_LOGPROBS
        )
        sampler = Sampler(config, "cpu")
        comps = sampler_components(sampler)
        roots = [("", sampler)]
        what = f"Sampler (max_num_logprobs = {MAX_NUM_LOGPROBS}, no custom processors)"
    row_counts = (config.num_slots, config.max_num_reqs)

    print(
        f"{what}: vocab_size = {config.vocab_size:,}, max_num_reqs = {config.max_num_reqs:,} "
        f"(slot tables have {config.num_slots:,} rows, one the padding slot); built on CPU, "
        f"torch {torch.__version__}"
    )
    print(
        f"capacities: max_logit_bias_tokens = {config.max_logit_bias_tokens}, "
        f"max_stop_token_ids = {config.max_stop_token_ids} (+1 for EOS)"
        + (
            ""
            if args.processors_only
            else f", max_bad_words = {config.max_bad_words} of up to "
            f"max_bad_word_len = {config.max_bad_word_len} tokens"
        )
        + "\n"
    )
    print_components(comps, row_counts)
    device_total = sum(c.device.nbytes for c in comps)
    host_total = sum(c.host.nbytes for c in comps if c.host is not None)
    slot_total = sum(c.per_slot(row_counts) or 0 for c in comps)
    host_slot = sum(c.per_slot(row_counts) or 0 for c in comps if c.host is not None)
    print(
        f"\nstate_tensors(): device {fmt_bytes(device_total)}, host shadows "
        f"{fmt_bytes(host_total)}; per request slot {fmt_bytes(slot_total)} on the device "
        f"and {fmt_bytes(host_slot)} on the host"
    )
    if not args.processors_only:
        print("\nBy part:")
        print_parts(comps, row_counts)

    reported = {id(c.device) for c in comps} | {id(c.host) for c in comps if c.host is not None}
    hidden = list(hidden_tensors(roots, reported))
    hidden_total = sum(t.nbytes for _, t in hidden)
    if hidden:
        print("\nDevice tensors outside state_tensors() (fixed, independent of the slots):")
        print_table(
            ["component", "shape", "dtype", "device B"],
            [
                [
                    name,
                    str(tuple(t.shape)),
                    str(t.dtype).removeprefix("torch."),
                    f"{t.nbytes:,}",
                ]
                for name, t in hidden
            ],
        )
        print(f"total {fmt_bytes(hidden_total)}")

    # What a CUDA build adds per staged tensor (StagedTensor.__init__ on an async device).
    staged = [c for c in comps if c.host is not None]
    pinned = sum(STAGING_RING * (c.device.nbytes + c.rows * INDEX_BYTES) for c in staged)
    landing = sum(c.device.nbytes + c.rows * INDEX_BYTES for c in staged)
    pinned_slot = sum(STAGING_RING * (c.per_slot(row_counts) or 0) for c in staged)
    landing_slot = sum(c.per_slot(row_counts) or 0 for c in staged)
    print(
        "\nPinned staging ring buffers exist only for CUDA devices; this CPU build has none."
        f"\nOn CUDA the same state would add: pinned host {fmt_bytes(pinned)} "
        f"(ring of {STAGING_RING} full-shape buffers + row indices per staged tensor, "
        f"{fmt_bytes(pinned_slot)} per slot) and device {fmt_bytes(landing)} "
        f"(packed-row landing area, {fmt_bytes(landing_slot)} per slot), i.e. device "
        f"{fmt_bytes(device_total + landing + hidden_total)} (constants included) and host "
        f"{fmt_bytes(host_total + pinned)} in all."
    )

    if sampler is not None:
        penalty = [c for c in comps if c.owner == "penalties"]
        pen_device = sum(c.device.nbytes for c in penalty)
        pen_host = sum(c.host.nbytes for c in penalty if c.host is not None)
        pen_slot = sum(c.per_slot(row_counts) or 0 for c in penalty)
        vllm = config.max_num_reqs * config.vocab_size * VLLM_COUNT_BYTES
        vllm_slot = config.vocab_size * VLLM_COUNT_BYTES
        names = ", ".join(c.label.removeprefix("penalties.") for c in penalty)
        print(
            f"\nPenalty state (penalties.*: {names}): device {pen_device:,} B "
            f"({fmt_bytes(pen_device)}, {pen_slot:,} B per slot), host shadows {pen_host:,} B."
            f"\nvLLM V1's penalty counts at the same size, [max_num_reqs, V] int32 = "
            f"{config.max_num_reqs:,} × {config.vocab_size:,} × {VLLM_COUNT_BYTES} = "
            f"{vllm:,} B ({vllm / 1e6:,.1f} MB, {fmt_bytes(vllm)}; {vllm_slot:,} B per slot)."
            f"\nRatio penalty state / vLLM counts: {pen_device / vllm:.3f}× on the device "
            f"({pen_slot / vllm_slot:.3f}× per slot), {(pen_device + pen_host) / vllm:.3f}× "
            "with the host shadows."
        )


if __name__ == "__main__":
    main()
