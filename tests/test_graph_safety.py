"""The harness on every built-in, and negative examples that must fail it (docs/design.md §5)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest
import torch

from graphsafe_sampler import BatchUpdate, LogitsProcessor, SamplerConfig, SamplingParams
from graphsafe_sampler.processors import AdapterLogitsProcessor
from graphsafe_sampler.processors.base import SlotLogitsProcessor
from graphsafe_sampler.stages import BUILTIN_LOGITS_PROCESSORS
from graphsafe_sampler.testing import (
    GraphSafetyError,
    SyncOpDetector,
    assert_no_sync,
    check_graph_safety,
    random_sampling_params,
)

CONFIG = SamplerConfig(
    max_num_reqs=6, vocab_size=111, eos_token_id=4, max_num_logprobs=2, max_stop_token_ids=5,
    max_logit_bias_tokens=16,
)  # fmt: skip


@pytest.mark.parametrize("cls", BUILTIN_LOGITS_PROCESSORS, ids=lambda c: c.__name__)
def test_builtin_processors_are_graph_safe(cls: type[SlotLogitsProcessor]) -> None:
    proc = cls(CONFIG, torch.device("cpu"), False)
    report = check_graph_safety(proc, num_steps=50, seed=7)
    assert report.steps == 50 and report.compile_frames == 1
    assert report.state_tensors >= 6  # row_to_slot, num_generated and the own tables


def target_params(rng: random.Random, config: SamplerConfig) -> SamplingParams:
    params = random_sampling_params(rng, config)
    if rng.random() < 0.5:
        params = dataclasses.replace(
            params, extra_args={"target_token": rng.randrange(config.vocab_size)}
        )
    return params


class VllmDocTargetProcessor(LogitsProcessor):
    """vLLM's documentation example as written: dict state, a host branch and index tensors
    built from the dict inside apply. Correct eagerly; wrong once captured."""

    def __init__(self, config: SamplerConfig, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self.req_info: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.req_info.pop(row, None)
        for row, params, _, _ in batch_update.added:
            target = (params.extra_args or {}).get("target_token")
            if target is None:
                self.req_info.pop(row, None)
            else:
                self.req_info[row] = target
        for a, b, _direction in batch_update.moved:
            a_info, b_info = self.req_info.pop(a, None), self.req_info.pop(b, None)
            if a_info is not None:
                self.req_info[b] = a_info
            if b_info is not None and _direction.name == "SWAP":
                self.req_info[a] = b_info

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.req_info:
            return logits
        rows_list = list(self.req_info)
        rows = torch.tensor(rows_list, dtype=torch.long, device=logits.device)
        cols = torch.tensor([self.req_info[r] for r in rows_list], device=logits.device)
        kept = logits[rows, cols]
        logits[rows] = float("-inf")
        logits[rows, cols] = kept
        return logits


def test_the_default_recipe_fails_a_processor_it_cannot_drive() -> None:
    # vLLM's example reads extra_args["target_token"] and declares no example values: with
    # no request setting it, every step would pass. The check says so instead.
    proc = VllmDocTargetProcessor(CONFIG, torch.device("cpu"), False)
    with pytest.raises(
        GraphSafetyError,
        match=r"VllmDocTargetProcessor read extra_args\['target_token'\], which no request of the "
        r"check set: .* `example_extra_args`",
    ):
        check_graph_safety(proc, num_steps=5, compile=False)


class DeclaredVllmDocTargetProcessor(VllmDocTargetProcessor):
    """The same processor, declaring the parameter it reads."""

    @classmethod
    def example_extra_args(cls, rng: random.Random, config: SamplerConfig) -> dict[str, int] | None:
        return {"target_token": rng.randrange(config.vocab_size)} if rng.random() < 0.5 else None


def test_declared_vllm_doc_processor_fails_on_its_host_built_index_tensors() -> None:
    # Driven through target_token, its apply builds index tensors from the dict on the device.
    proc = DeclaredVllmDocTargetProcessor(CONFIG, torch.device("cpu"), False)
    with pytest.raises(GraphSafetyError, match=r"tensor\(device=cpu\) moves data between devices"):
        check_graph_safety(proc, num_steps=20, compile=False)


class DictBoostProcessor(DeclaredVllmDocTargetProcessor):
    """Dict state applied through Python ints (no tensor built from it): no op is flagged,
    yet the step depends on state no tensor holds."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token in self.req_info.items():
            logits[row, token] += 5.0
        return logits


def test_state_outside_tensors_fails() -> None:
    proc = DictBoostProcessor(CONFIG, torch.device("cpu"), False)
    assert proc.state_tensors() == {}
    with pytest.raises(GraphSafetyError, match=r"step \d+: fn gives another output on the same "
                       r"logits after update_state, yet it keeps no state tensors"):  # fmt: skip
        check_graph_safety(proc, num_steps=20, compile=False)
    # the make_params route (the caller sets the key) drives it too
    proc = DictBoostProcessor(CONFIG, torch.device("cpu"), False)
    with pytest.raises(GraphSafetyError, match="yet it keeps no state tensors"):
        check_graph_safety(proc, num_steps=20, make_params=target_params, compile=False)


class HostBranchSlotProcessor(SlotLogitsProcessor):
    """Slot state done right, plus a Python count of active requests that apply branches
    on (vLLM's `if not self.req_info: return logits`): its state tensors change with the
    batch, so only the trace-once replay shows the baked-in branch."""

    @classmethod
    def example_extra_args(cls, rng: random.Random, config: SamplerConfig) -> dict[str, int] | None:
        return {"boost": rng.randrange(config.vocab_size)} if rng.random() < 0.3 else None

    def init_tables(self) -> None:
        self.boost = self.staged("boost", (), torch.int64, fill=-1)
        self.active: set[int] = set()

    def is_argmax_invariant(self) -> bool:
        return False

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        token = (params.extra_args or {}).get("boost")
        self.boost.write(slot, -1 if token is None else token)
        self.active.discard(slot)
        if token is not None:
            self.active.add(slot)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return logits
        token = self.boost.device[self.batch_state.slots(logits.shape[0])]  # [num_rows]
        bonus = torch.where(token >= 0, 5.0, 0.0)[:, None]
        return logits.scatter_add(1, token.clamp(min=0)[:, None], bonus)


def test_host_branch_processor_fails_replay() -> None:
    proc = HostBranchSlotProcessor(CONFIG, torch.device("cpu"), False)
    with pytest.raises(GraphSafetyError, match="make_fx replay: output 0 differs from eager"):
        check_graph_safety(proc, num_steps=30, seed=1, compile=False)


@pytest.mark.parametrize("filtered", [False, True], ids=["all-guards", "skip_code_guards"])
def test_host_branch_processor_recompiles(filtered: bool) -> None:
    # Caught by torch.compile too: its guards on the dict force a compile per batch state,
    # with compile_options' guard filter too (it drops guards on code, not on state).
    # Checked with the tracing and sync rules off so that the compile rule is what fails.
    proc = VllmDocTargetProcessor(CONFIG, torch.device("cpu"), False)
    from torch._dynamo.testing import CompileCounter

    from graphsafe_sampler.compile_options import skip_code_guards

    torch._dynamo.reset()
    counter = CompileCounter()
    options = {"guard_filter_fn": skip_code_guards} if filtered else {}
    compiled = torch.compile(proc.apply, fullgraph=True, backend=counter, options=options)
    for step in range(4):
        proc.update_state(
            BatchUpdate(1, added=[(0, SamplingParams(extra_args={"target_token": step}), None, [])])
        )
        compiled(torch.randn(6, 111))
    assert counter.frame_count > 1


class ItemProcessor(SlotLogitsProcessor):
    """Reads a device value on the host: `.item()` syncs (and bakes the value in)."""

    def __init__(self, config: SamplerConfig, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self.scale = self.staged("scale", (), torch.float32, fill=1.0)

    def is_argmax_invariant(self) -> bool:
        return True

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        prompt_tok_ids: Sequence[int] | None,
        output_tok_ids: Sequence[int],
    ) -> None:
        self.scale.write(slot, params.temperature)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        top = self.scale.device.max().item()
        return logits * top


def test_sync_op_fails() -> None:
    proc = ItemProcessor(CONFIG, torch.device("cpu"), False)
    with pytest.raises(GraphSafetyError, match=r"Tensor\.item\(\) reads on the host"):
        check_graph_safety(proc, num_steps=3, compile=False)


class ScaleProcessor(ItemProcessor):
    """ItemProcessor's state, applied graph-safely; subclasses break one rule each."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.scale.device[self.batch_state.slots(logits.shape[0])][:, None]


def test_scale_processor_passes() -> None:
    # the base of the negative examples below is itself graph-safe
    report = check_graph_safety(ScaleProcessor(CONFIG, torch.device("cpu"), False), num_steps=5)
    assert report.compile_frames == 1


class GraphBreakProcessor(ScaleProcessor):
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()  # a no-op eagerly and under make_fx
        return super().apply(logits)


def test_graph_break_raises_graph_safety_error() -> None:
    proc = GraphBreakProcessor(CONFIG, torch.device("cpu"), False)
    with pytest.raises(
        GraphSafetyError, match=r"torch.compile\(fullgraph=True\) failed \(Unsupported\)"
    ):
        check_graph_safety(proc, num_steps=2)


class DeviceMoveProcessor(ScaleProcessor):
    """Moves a tensor to the host inside apply: on a GPU a device-to-host copy."""

    def __init__(self, config: SamplerConfig, device: torch.device, is_pin_memory: bool, move):  # type: ignore[no-untyped-def]
        super().__init__(config, device, is_pin_memory)
        self.move = move

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return super().apply(self.move(logits))


@pytest.mark.parametrize(
    "move",
    [
        lambda t: t.to("cpu"),
        lambda t: t.to(device="cpu", copy=True),
        lambda t: t.to(torch.device("cpu"), torch.float32),
        lambda t: t + torch.tensor([0.0], device=t.device),
    ],
    ids=["to-cpu", "to-device-copy", "to-device-dtype", "tensor-on-device"],
)
def test_device_moves_inside_the_step_fail(move) -> None:  # type: ignore[no-untyped-def]
    proc = DeviceMoveProcessor(CONFIG, torch.device("cpu"), False, move)
    with pytest.raises(GraphSafetyError, match=r"\(device=cpu\) moves data between devices"):
        check_graph_safety(proc, num_steps=2, compile=False)


class ReallocatingProcessor(ItemProcessor):
    """Rebinds a state tensor in update_state: a captured graph keeps the old one."""

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        super().update_state(batch_update)
        self.offsets = torch.zeros(self.config.num_slots)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits + self.offsets[: logits.shape[0], None]


def test_reallocated_state_fails() -> None:
    proc = ReallocatingProcessor(CONFIG, torch.device("cpu"), False)
    with pytest.raises(GraphSafetyError, match="'offsets' was reallocated"):
        check_graph_safety(proc, num_steps=3, compile=False)


class AlwaysBoost(AdapterLogitsProcessor):
    def new_req_logits_processor(self, params: SamplingParams):  # type: ignore[no-untyped-def]
        return lambda out, row: row + 1.0


def test_adapter_declares_itself_not_graph_safe() -> None:
    proc = AlwaysBoost(CONFIG, torch.device("cpu"), False)
    assert AlwaysBoost.graph_safe is False
    with pytest.raises(GraphSafetyError, match="declares graph_safe = False"):
        check_graph_safety(proc)


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.nonzero(),
        lambda t: t[t > 0],
        lambda t: torch.unique(t),
        lambda t: torch.multinomial(t.abs() + 0.1, 1),
        lambda t: float(t.sum()),
        lambda t: t.masked_select(t > 0),
        lambda t: t.tolist(),
        lambda t: t.numpy(),
        lambda t: t.cpu(),
        lambda t: t[0, 0].item(),
        lambda t: t.to("cpu"),
        lambda t: t.to(device="cpu", copy=True),
        lambda t: torch.tensor([1, 2], device=t.device),
        lambda t: torch.empty(4, 5, device="meta").copy_(t),
        lambda t: torch.histc(t, bins=4),
        lambda t: torch.bincount(t.abs().long().flatten()),
        lambda t: torch.nn.functional.one_hot(t.abs().long()),
        lambda t: torch.linalg.inv(t[:, :4] + 5 * torch.eye(4)),
    ],
    ids=[
        "nonzero",
        "bool-mask-index",
        "unique",
        "multinomial",
        "item",
        "masked_select",
        "tolist",
        "numpy",
        "cpu",
        "tensor-item",
        "to-cpu",
        "to-device-copy",
        "tensor-with-device",
        "copy-across-devices",
        "histc",
        "bincount",
        "one_hot",
        "linalg-error-check",
    ],
)
def test_sync_detector_flags(op) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GraphSafetyError):
        assert_no_sync(op, torch.randn(4, 5))


def test_sync_detector_passes_graph_safe_ops() -> None:
    x = torch.randn(4, 5)
    with SyncOpDetector():
        idx = torch.tensor([0, 2])
        y = x[idx].masked_fill(x[idx] > 0, 0.0).scatter_add(1, idx[:, None], x[:2, :1])
        y.gather(1, torch.zeros(2, 1, dtype=torch.long)).softmax(-1).amax(-1)
        x.to(torch.float64).narrow(1, 1, 2).tensor_split(2, dim=1)
        torch.linalg.inv_ex(x[:, :4] + 5 * torch.eye(4))


def test_a_samplers_custom_processors_are_driven_too() -> None:
    # The check finds a Sampler's custom processors (not only a processor target): one
    # reading an undeclared extra_args key fails the same way inside a Sampler.
    from graphsafe_sampler import Sampler

    config = SamplerConfig(
        max_num_reqs=4, vocab_size=111, logits_processors=[VllmDocTargetProcessor]
    )
    sampler = Sampler(config, "cpu")
    with pytest.raises(
        GraphSafetyError, match=r"VllmDocTargetProcessor read extra_args\['target_token'\]"
    ):
        check_graph_safety(sampler, num_steps=3, compile=False)
