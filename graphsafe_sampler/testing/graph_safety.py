"""`check_graph_safety`: the proof of docs/design.md §5 for any processor or sampler.

One call runs five checks over a random sequence of persistent-batch states:

1. **no sync ops**: every eager step runs under `SyncOpDetector`;
2. **fixed addresses**: every state tensor's `data_ptr` is the same after each update;
3. **trace once, replay anywhere**: `make_fx` traces `fn` once under the first state (module
   tensors are kept by reference, Python branches are baked in: the CPU analogue of a CUDA
   graph); after each later update the replay must equal eager bit for bit, outputs and the
   state the step leaves behind;
4. **compiles once**: `torch.compile(fn, fullgraph=True)` gives no graph break, matches eager,
   and is not recompiled as the batch churns;
5. **no state outside tensors**: `fn` on the same probe logits may give another output only
   after some state tensor changed; otherwise its per-request state lives in Python objects
   that a captured graph cannot see.

The random requests carry `extra_args`: those each custom processor's
`example_extra_args` draws, so that the replay sees every parameter a processor reads. A
processor that reads an `extra_args` key its `example_extra_args` never sets fails (the
check could not drive that parameter).

On CUDA every eager step also runs under `torch.cuda.set_sync_debug_mode("error")`, and the
same driver captures `fn` in a real `torch.cuda.CUDAGraph` and replays it after each update.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.testing.batch_driver import BatchDriver, MakeParams, random_sampling_params
from graphsafe_sampler.testing.replay import CudaGraphReplayer, MakeFxReplayer, StateTensors
from graphsafe_sampler.testing.sync_detector import GraphSafetyError, SyncOpDetector

MakeLogits = Callable[[int, torch.Generator], torch.Tensor]
Advance = Callable[[BatchDriver, Any], None]


@dataclass(frozen=True)
class GraphSafetyReport:
    """What a passing `check_graph_safety` run covered."""

    steps: int
    state_tensors: int
    compiled: bool
    compile_frames: int
    cuda_graph: bool


def _tensors(out: Any) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(out)
    if any(not isinstance(leaf, torch.Tensor) for leaf in leaves if leaf is not None):
        raise TypeError("fn must return tensors or a pytree (tuple/list/dict) of tensors")
    return [leaf for leaf in leaves if leaf is not None]


def _mismatch(expected: torch.Tensor, actual: torch.Tensor, *, exact: bool) -> str | None:
    """None if equal (bit for bit where `exact` or for non-floats), else why not."""
    try:
        if exact or not expected.is_floating_point():
            torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(actual, expected, equal_nan=True)
    except AssertionError as exc:
        return str(exc)
    return None


def _compare(what: str, expected: Any, actual: Any, *, exact: bool) -> None:
    exp, act = _tensors(expected), _tensors(actual)
    if len(exp) != len(act):
        raise GraphSafetyError(f"{what}: {len(act)} outputs, eager gave {len(exp)}")
    for i, (e, a) in enumerate(zip(exp, act, strict=True)):
        why = _mismatch(e, a, exact=exact)
        if why is not None:
            raise GraphSafetyError(f"{what}: output {i} differs from eager: {why}")


def _compare_state(
    what: str,
    expected: dict[str, torch.Tensor],
    actual: dict[str, torch.Tensor],
    *,
    exact: bool,
) -> None:
    for name, e in expected.items():
        why = _mismatch(e, actual[name], exact=exact)
        if why is not None:
            raise GraphSafetyError(f"{what}: state tensor {name!r} differs from eager's: {why}")


def default_logits(config: SamplerConfig, device: torch.device) -> MakeLogits:
    """Fresh random float32 logits with spread (never zeros)."""

    def make(num_rows: int, gen: torch.Generator) -> torch.Tensor:
        cpu = torch.randn(num_rows, config.vocab_size, generator=gen) * 4.0
        return cpu.to(device)

    return make


def _check_addresses(state: StateTensors, step: int) -> None:
    """Rule 2: update_state kept every state tensor where it was."""
    changes = state.address_changes()
    if changes.added or changes.gone:
        raise GraphSafetyError(
            f"step {step}: the set of state tensors changed (new {changes.added}, "
            f"gone {changes.gone})"
        )
    if changes.reallocated:
        raise GraphSafetyError(
            f"step {step}: state tensor {changes.reallocated[0]!r} was reallocated by "
            "update_state (update state in place; a captured graph keeps the old address)"
        )


def _default_fn(target: Any) -> Callable[[torch.Tensor], Any]:
    from graphsafe_sampler.processors.base import LogitsProcessor

    if isinstance(target, LogitsProcessor):
        return target.apply
    if hasattr(target, "forward"):
        return target.forward
    raise TypeError(f"cannot tell what to trace on {type(target).__name__}: pass fn=")


def _default_advance(target: Any) -> Advance | None:
    """Standalone slot processors: commit a random token per row, as a sampler would."""
    from graphsafe_sampler.processors.base import SlotLogitsProcessor

    if not (isinstance(target, SlotLogitsProcessor) and target._owns_batch_state):
        return None

    def advance(driver: BatchDriver, out: Any) -> None:
        num_rows = driver.config.max_num_reqs
        tokens = [driver.rng.randrange(driver.config.vocab_size) for _ in range(num_rows)]
        device = target.batch_state.device
        target.batch_state.commit(torch.tensor(tokens, device=device))
        driver.record_tokens(tokens)

    return advance


class _RecordedExtraArgs(dict[str, Any]):
    """`extra_args` that note every key a processor looks up (`get`, `[]`, `in`, `pop`,
    `setdefault`). Truthy even when empty, so that the common `(params.extra_args or
    {}).get(key)` reaches it."""

    def __init__(self, data: dict[str, Any], reads: set[str]) -> None:
        super().__init__(data)
        self._reads = reads

    def __bool__(self) -> bool:
        return True

    def get(self, key: str, default: Any = None) -> Any:
        self._reads.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._reads.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self._reads.add(key)
        return super().__contains__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self._reads.add(key)
        return super().pop(key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._reads.add(key)
        return super().setdefault(key, default)


def _custom_processors(target: Any) -> list[Any]:
    """The processors whose `extra_args` the driver must draw: the target itself, or a
    sampler's (or a rejection sampler's sampler's) custom processors."""
    from graphsafe_sampler.processors.base import LogitsProcessor

    if isinstance(target, LogitsProcessor):
        return [target]
    owner = getattr(target, "sampler", target)
    return list(getattr(getattr(owner, "stages", None), "custom", ()))


class _ExtraArgsDriver:
    """Wraps `make_params`: each request's `extra_args` get what every processor's
    `example_extra_args` draws, inside a dict that records the keys read."""

    def __init__(self, make_params: MakeParams, processors: Sequence[Any]) -> None:
        self.make_params = make_params
        self.processors = processors
        self.set_keys: set[str] = set()
        self.read_keys: set[str] = set()

    def __call__(self, rng: random.Random, config: SamplerConfig) -> Any:
        params = self.make_params(rng, config)
        extra = dict(params.extra_args or {})
        for proc in self.processors:
            example = type(proc).example_extra_args(rng, config)
            if example:
                extra.update(example)
        self.set_keys.update(extra)
        return dataclasses.replace(params, extra_args=_RecordedExtraArgs(extra, self.read_keys))

    def check(self) -> None:
        undriven = sorted(self.read_keys - self.set_keys)
        if undriven:
            names = ", ".join(type(p).__name__ for p in self.processors) or "the target"
            keys = ", ".join(f"extra_args[{k!r}]" for k in undriven)
            raise GraphSafetyError(
                f"{names} read {keys}, which no request of the check set: its graph safety "
                "under that parameter is unproven. Return example values from the processor's "
                "`example_extra_args` classmethod (or pass make_params= that sets them)"
            )


def check_graph_safety(
    target: Any,
    *,
    fn: Callable[[torch.Tensor], Any] | None = None,
    num_steps: int = 50,
    num_rows: int | None = None,
    seed: int = 0,
    make_params: MakeParams = random_sampling_params,
    make_logits: MakeLogits | None = None,
    advance: Advance | None = None,
    compile: bool = True,
    compile_backend: str = "inductor",
    cuda_graph: bool | None = None,
) -> GraphSafetyReport:
    """Prove `fn` (default `target.apply` / `target.forward`) graph-safe over `num_steps`
    random batch states; raises GraphSafetyError naming the first rule broken.

    target: has `config` (SamplerConfig), `device`, `update_state(BatchUpdate | None)` and
        `state_tensors() -> dict[str, Tensor]`; `graph_safe = False` fails at once.
    num_rows: logits rows per step (default `max_num_reqs`: rows past the batch are padding).
    make_params: random SamplingParams per added request; each one's `extra_args` are
        completed with the custom processors' `example_extra_args`.
    advance: called after each step with the driver and eager's output, e.g. to commit
        tokens; standalone slot processors get one that commits random tokens.
    compile_backend: the `torch.compile` backend of rule 4. Graph breaks and recompiles are
        Dynamo's, which every backend runs; "aot_eager" skips inductor's code generation (a
        cold inductor compile of a whole sampler takes most of a minute on 2 cores).
    cuda_graph: also capture a real CUDA graph (default: when the target is on CUDA).
    """
    if not getattr(target, "graph_safe", True):
        raise GraphSafetyError(
            f"{type(target).__name__} declares graph_safe = False: its step cannot be captured"
        )
    config: SamplerConfig = target.config
    device = torch.device(getattr(target, "device", "cpu"))
    fn = fn if fn is not None else _default_fn(target)
    num_rows = config.max_num_reqs if num_rows is None else num_rows
    make_logits = make_logits or default_logits(config, device)
    if advance is None:
        advance = _default_advance(target)
    gen = torch.Generator().manual_seed(seed)
    extra_args = _ExtraArgsDriver(make_params, _custom_processors(target))
    driver = BatchDriver(config, seed=seed, make_params=extra_args)

    target.update_state(driver.next_update())
    state = StateTensors(target)
    # The same logits every step: rule 5 compares fn's output on them across batch states.
    probe = make_logits(num_rows, torch.Generator().manual_seed(seed + 1))
    last_probe: tuple[dict[str, torch.Tensor], Any] | None = None

    def run(f: Callable[[torch.Tensor], Any], logits: torch.Tensor) -> Any:
        return f(logits.clone())

    # The sync rule first: a host read also breaks tracing, with a less telling message.
    before = state.snapshot()
    first = make_logits(num_rows, gen)
    with SyncOpDetector("first step"):
        run(fn, first)
    state.restore(before)
    try:
        traced = MakeFxReplayer(lambda x: fn(x), (make_logits(num_rows, gen),), state)
    except Exception as exc:
        raise GraphSafetyError(f"make_fx could not trace fn: {exc}") from exc

    compiled = None
    counter = None
    if compile:
        from torch._dynamo.testing import CompileCounterWithBackend

        torch._dynamo.reset()
        counter = CompileCounterWithBackend(compile_backend)
        compiled = torch.compile(fn, fullgraph=True, backend=counter)

    graph = None
    if cuda_graph is None:
        cuda_graph = device.type == "cuda"
    if cuda_graph:
        graph = CudaGraphReplayer(fn, (make_logits(num_rows, gen),), state)

    for step in range(num_steps):
        if step:
            target.update_state(driver.next_update())
        _check_addresses(state, step)
        logits = make_logits(num_rows, gen)
        before = state.snapshot()
        with SyncOpDetector(f"step {step}"), _cuda_sync_errors(device):
            eager = run(fn, logits)
        after = state.snapshot()

        state.restore(before)
        probe_out = run(fn, probe)
        if last_probe is not None:
            _check_state_in_tensors(step, last_probe, (before, probe_out), len(state.tensors))
        last_probe = (before, probe_out)

        state.restore(before)
        _compare(f"step {step}: make_fx replay", eager, traced(logits), exact=True)
        _compare_state(f"step {step}: make_fx replay", after, state.snapshot(), exact=True)

        if compiled is not None:
            state.restore(before)
            try:
                out = run(compiled, logits)
            except Exception as exc:  # a graph break under fullgraph=True, or a failed compile
                raise GraphSafetyError(
                    f"step {step}: torch.compile(fullgraph=True) failed ({type(exc).__name__}): "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}"
                ) from exc
            _compare(f"step {step}: torch.compile", eager, out, exact=False)
            _compare_state(f"step {step}: torch.compile", after, state.snapshot(), exact=False)
        if graph is not None:
            state.restore(before)
            _compare(f"step {step}: CUDA graph replay", eager, graph(logits), exact=True)
            _compare_state(f"step {step}: CUDA graph replay", after, state.snapshot(), exact=True)
        state.restore(after)
        if advance is not None:
            advance(driver, eager)

    extra_args.check()
    frames = counter.frame_count if counter is not None else 0
    if counter is not None and frames != 1:
        raise GraphSafetyError(
            f"torch.compile compiled {frames} times over {num_steps} batch states "
            "(guards on host state: something in fn reads per-request Python state)"
        )
    return GraphSafetyReport(
        steps=num_steps,
        state_tensors=len(state.tensors),
        compiled=compile,
        compile_frames=frames,
        cuda_graph=graph is not None,
    )


def _check_state_in_tensors(
    step: int,
    last: tuple[dict[str, torch.Tensor], Any],
    now: tuple[dict[str, torch.Tensor], Any],
    num_state_tensors: int,
) -> None:
    """Rule 5: the same input gives another output only if some state tensor changed."""
    (state_then, out_then), (state_now, out_now) = last, now
    if any(not torch.equal(state_then[name], state_now[name]) for name in state_now):
        return
    try:
        _compare("", out_then, out_now, exact=True)
    except GraphSafetyError:
        where = (
            "keeps no state tensors"
            if num_state_tensors == 0
            else "changed no state tensor since the last step"
        )
        raise GraphSafetyError(
            f"step {step}: fn gives another output on the same logits after update_state, "
            f"yet it {where}: its per-request state lives in Python objects, which a "
            "captured graph never sees (keep it in state tensors updated in place)"
        ) from None


@contextlib.contextmanager
def _cuda_sync_errors(device: torch.device) -> Iterator[None]:
    """On CUDA, any op that synchronises with the host raises inside the block."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    except RuntimeError as exc:
        # what the CPU-side detector cannot know: an op whose CUDA kernel syncs inside
        if "synchroniz" not in str(exc):
            raise
        raise GraphSafetyError(f"a CUDA op synchronised with the host: {exc}") from exc
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def state_fingerprint(targets: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Clones of every state tensor of `targets` (to prove a rejected update changed nothing)."""
    out = {}
    for i, target in enumerate(targets):
        for name, tensor in target.state_tensors().items():
            out[f"{i}.{name}"] = tensor.clone()
    return out
