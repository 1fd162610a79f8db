"""The demo's options: `DemoOptions` (checked at construction) and their command line.

`add_demo_arguments` adds one flag per option to a parser (the `graphsafe-sampler demo`
subcommand), with the defaults taken from `DemoOptions`; `DemoOptions.from_namespace`
builds and checks the options from the parsed arguments. The buckets and modes left empty
are derived here (`default_buckets`, `DemoOptions.resolved_modes`), as is the device.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from graphsafe_sampler.demo.runners import MIN_BUCKET, MODES


@dataclass(frozen=True)
class DemoOptions:
    """The demo's settings, checked (see `add_demo_arguments` for their meaning)."""

    steps: int = 160
    max_num_reqs: int = 16
    buckets: tuple[int, ...] = ()
    vocab: int = 4099
    hidden_size: int = 64
    num_layers: int = 2
    max_prompt_len: int = 16
    max_tokens: int = 40
    device: str = "auto"
    threads: int = 1
    seed: int = 0
    modes: tuple[str, ...] = ()
    simd: bool = False
    quiet: bool = False
    json_path: str = ""

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> DemoOptions:
        """Build and check the options; ValueError names the option and its limit."""
        values = {
            name: getattr(args, name) for name in cls.__dataclass_fields__ if hasattr(args, name)
        }
        return cls(**values)

    def __post_init__(self) -> None:
        for name, minimum in (
            ("steps", 1),
            ("max_num_reqs", MIN_BUCKET),
            ("vocab", 16),
            ("hidden_size", 4),
            ("num_layers", 1),
            ("max_prompt_len", 1),
            ("max_tokens", 1),
            ("threads", 1),
            ("seed", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"--{name.replace('_', '-')} must be an int, got {value!r}")
            if value < minimum:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")
        if self.vocab >= 2**31:
            raise ValueError(f"--vocab must be < 2**31, got {self.vocab}")
        if self.hidden_size % 4:
            raise ValueError(
                f"--hidden-size must be a multiple of 4 (the heads), got {self.hidden_size}"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device must be auto, cpu or cuda[:N], got {self.device!r}")
        buckets = tuple(self.buckets) or default_buckets(self.max_num_reqs)
        if list(buckets) != sorted(set(buckets)) or buckets[0] < MIN_BUCKET:
            raise ValueError(
                f"--buckets must be increasing sizes >= {MIN_BUCKET}, got {list(buckets)}"
            )
        if buckets[-1] != self.max_num_reqs:
            raise ValueError(
                f"--buckets: the largest bucket must equal --max-num-reqs = {self.max_num_reqs} "
                f"(a full batch must fit), got {buckets[-1]}"
            )
        object.__setattr__(self, "buckets", buckets)
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"--modes: unknown mode {mode!r}; choose from {', '.join(MODES)}")
        if self.modes and "eager" not in self.modes:
            raise ValueError("--modes must include eager: it is the reference the others match")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: CUDA is not available on this machine")
        return device

    def resolved_modes(self, device: torch.device) -> tuple[str, ...]:
        if self.modes:
            if "cuda-graph" in self.modes and device.type != "cuda":
                raise ValueError("--modes cuda-graph needs --device cuda")
            return self.modes
        return MODES if device.type == "cuda" else MODES[:2]


def default_buckets(max_num_reqs: int) -> tuple[int, ...]:
    """Powers of two from MIN_BUCKET below max_num_reqs, then max_num_reqs itself."""
    out = []
    size = MIN_BUCKET
    while size < max_num_reqs:
        out.append(size)
        size *= 2
    return (*out, max_num_reqs)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def _mode_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


# (flag, type, help); the default comes from DemoOptions.
_ARGUMENTS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("--steps", int, "decode steps per mode; requests arrive over the first 3/4"),
    ("--max-num-reqs", int, "rows of the persistent batch, KV slots and the largest bucket"),
    ("--buckets", _int_list,
     "padded batch sizes, comma-separated, increasing, each >= 2, the last = --max-num-reqs; "
     "one compile serves them all (default: powers of two from 2, then --max-num-reqs)"),
    ("--vocab", int,
     "vocabulary size; EOS is the last id. Small and odd: the step stays cheap on a CPU and "
     "the kernels' masked tails get exercised"),
    ("--hidden-size", int, "model width, a multiple of the 4 heads"),
    ("--num-layers", int, "transformer blocks"),
    ("--max-prompt-len", int, "prompts have 1 to this many random tokens"),
    ("--max-tokens", int, "each request's max_tokens is drawn from [4, this]"),
    ("--device", str, "auto (CUDA if available), cpu, cuda or cuda:N"),
    ("--threads", int,
     "torch intra-op CPU threads during the run: the demo's ops are tiny, and handing each "
     "to a second OpenMP thread costs more than it saves (on a busy host, many times more)"),
    ("--seed", int, "seeds the weights, the request stream and SamplerConfig.seed"),
    ("--modes", _mode_list,
     "comma-separated subset of eager,compiled,cuda-graph; eager is required "
     "(default: eager,compiled, plus cuda-graph on CUDA)"),
)  # fmt: skip


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to `parser` (the `graphsafe-sampler demo` subcommand)."""
    defaults = DemoOptions()
    parser.description = (
        "Serve a stream of requests with mixed sampling parameters through a tiny random-weight "
        "decoder and the Sampler in a continuous-batching loop, eagerly and with the decode "
        "step (model + sampler) compiled by torch.compile(fullgraph=True) (on CUDA also "
        "replayed as one CUDA graph per batch bucket); check that every step's tokens are "
        "identical and print tokens/s per mode. The defaults (vocab 4,099, 2 layers of "
        "width 64, 16 rows in buckets 2/4/8/16, one compile for all buckets, scalar C++ on "
        "CPU, one thread) keep a cold run under a minute on 2 cores, most of it the one "
        "compile; with a warm inductor cache it takes seconds. Exits 1 if tokens "
        "differ or a check fails, 2 on bad options."
    )
    for flag, kind, help_text in _ARGUMENTS:
        name = flag[2:].replace("-", "_")
        default = getattr(defaults, name)
        if name in ("buckets", "modes"):
            default = ()  # derived from the other options
        else:
            help_text += " (default %(default)s)"
        parser.add_argument(flag, type=kind, default=default, help=help_text)
    parser.add_argument(
        "--simd",
        action="store_true",
        help="on CPU, let inductor emit SIMD C++: the compiled step gets about 2x faster, the "
        "compile about 3x slower (default: scalar C++, so that a cold run takes about a minute)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only the summary table and the verdict"
    )
    parser.add_argument(
        "--json",
        dest="json_path",
        metavar="PATH",
        default="",
        help="also write the summary as JSON to PATH, for scripts and CI",
    )
