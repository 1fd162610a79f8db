"""Memory held by a BatchState with the built-in processors, by state tensor.

    python perf/state_bytes.py [--vocab 151936] [--slots 1024]

`--slots` is max_num_reqs, the request slots; every slot-indexed table has one more row,
the padding slot. The tensors are the ones `BatchState.state_tensors()` and each
processor's `state_tensors()` report (`<name>.device` and its host shadow `<name>.host`),
built on the CPU: there the "device" side is a second CPU tensor. On a CUDA device each
staged tensor also owns what its flush needs, which the CPU build does not allocate: a ring
of pinned host buffers of the tensor's full shape (plus a row index), and a device landing
area of the full shape for packed rows. They are listed separately, computed from the shapes.
Device tensors the processors keep outside `state_tensors()` (constants) are listed too.
"""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.processors import BUILTIN_LOGITS_PROCESSORS, LogitsProcessor
from graphsafe_sampler.staging import StagedTensor

# StagedTensor's default ring of pinned staging buffers (used on CUDA devices).
STAGING_RING = inspect.signature(StagedTensor.__init__).parameters["ring"].default
INDEX_BYTES = torch.empty((), dtype=torch.int64).element_size()


@dataclass
class Component:
    owner: str
    name: str
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


def build(vocab_size: int, max_num_reqs: int) -> tuple[BatchState, list[LogitsProcessor]]:
    config = SamplerConfig(max_num_reqs=max_num_reqs, vocab_size=vocab_size)
    device = torch.device("cpu")
    state = BatchState(config, device)
    processors = [
        cls(config, device, False, batch_state=state) for cls in BUILTIN_LOGITS_PROCESSORS
    ]
    return state, processors


def pair_up(owner: str, tensors: dict[str, torch.Tensor]) -> Iterator[Component]:
    """Group `<name>.device` / `<name>.host` entries; a lone tensor has no host shadow."""
    for key, tensor in tensors.items():
        if key.endswith(".host"):
            continue
        name = key.removesuffix(".device")
        yield Component(owner, name, tensor, tensors.get(f"{name}.host"))


def components(state: BatchState, processors: list[LogitsProcessor]) -> list[Component]:
    """Each tensor once: the processors' state_tensors() repeat the shared BatchState's."""
    out = list(pair_up("BatchState", state.state_tensors()))
    seen = {id(c.device) for c in out} | {id(c.host) for c in out}
    for processor in processors:
        owned = {k: t for k, t in processor.state_tensors().items() if id(t) not in seen}
        seen |= {id(t) for t in owned.values()}
        out.extend(pair_up(type(processor).__name__, owned))
    return out


def hidden_tensors(
    processors: list[LogitsProcessor], reported: set[int]
) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Tensors reachable from a processor's attributes that state_tensors() leaves out."""
    skip = (BatchState, StagedTensor, SamplerConfig, torch.device)
    for processor in processors:
        stack: list[tuple[str, object]] = [("", processor)]
        visited: set[int] = set()
        while stack:
            prefix, obj = stack.pop()
            if id(obj) in visited or not hasattr(obj, "__dict__"):
                continue
            visited.add(id(obj))
            for name, value in vars(obj).items():
                if isinstance(value, torch.Tensor):
                    if id(value) not in reported:
                        yield type(processor).__name__, f"{prefix}{name}", value
                elif not isinstance(value, skip) and hasattr(value, "__dict__"):
                    stack.append((f"{prefix}{name}.", value))


def fmt_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:,.0f} B"
    exp = min(int(math.log(n, 1024)), 3)
    return f"{n / 1024**exp:,.2f} {'BKMG'[exp]}iB"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    print(
        "  ".join(
            h.ljust(w) if i < 3 else h.rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    )
    print(line)
    for row in rows:
        cells = (
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        print("  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936, help="vocab_size (default 151936)")
    parser.add_argument(
        "--slots", type=int, default=1024, help="max_num_reqs, request slots (default 1024)"
    )
    args = parser.parse_args()

    state, processors = build(args.vocab, args.slots)
    config = state.config
    row_counts = (config.num_slots, config.max_num_reqs)
    comps = components(state, processors)

    print(
        f"BatchState + built-in processors: vocab_size = {config.vocab_size:,}, "
        f"max_num_reqs = {config.max_num_reqs:,} (slot tables have {config.num_slots:,} rows, "
        f"one the padding slot); built on CPU, torch {torch.__version__}"
    )
    print(
        f"capacities: max_logit_bias_tokens = {config.max_logit_bias_tokens}, "
        f"max_stop_token_ids = {config.max_stop_token_ids} (+1 for EOS)\n"
    )
    rows = []
    for c in comps:
        per_slot = c.per_slot(row_counts)
        rows.append(
            [
                f"{c.owner}.{c.name}",
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
    headers = ["component", "shape", "dtype", "device B", "B / slot", "host B"]
    print_table(headers, rows)
    print(
        f"\nstate_tensors(): device {fmt_bytes(device_total)}, host shadows "
        f"{fmt_bytes(host_total)}; per request slot {fmt_bytes(slot_total)} on the device "
        f"and the same again on the host"
    )

    reported = {id(c.device) for c in comps} | {id(c.host) for c in comps if c.host is not None}
    hidden = list(hidden_tensors(processors, reported))
    if hidden:
        print("\nDevice tensors outside state_tensors() (fixed, independent of the slots):")
        print_table(
            ["component", "shape", "dtype", "device B"],
            [
                [
                    f"{owner}.{name}",
                    str(tuple(t.shape)),
                    str(t.dtype).removeprefix("torch."),
                    f"{t.nbytes:,}",
                ]
                for owner, name, t in hidden
            ],
        )
        hidden_total = sum(t.nbytes for _, _, t in hidden)
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
        f"{fmt_bytes(device_total + landing)} and host {fmt_bytes(host_total + pinned)} "
        "in all."
    )


if __name__ == "__main__":
    main()
