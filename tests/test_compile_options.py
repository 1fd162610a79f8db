"""compile_options: its guard filter keeps every guard a decode step's inputs can fail and
drops only those on code (globals, function code, method shadowing). Each case counts
compiles (CompileCounter, the eager backend) with and without the filter."""

from __future__ import annotations

import sys

import torch
from torch._dynamo.testing import CompileCounter

from graphsafe_sampler import Sampler, SamplerConfig, compile_options
from graphsafe_sampler.compile_options import skip_code_guards
from graphsafe_sampler.testing import BatchDriver

V = 257
SCALE = 2.0  # read by `_scaled`, a module constant the filter stops guarding


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * SCALE


def _compile(fn, counter: CompileCounter, *, filtered: bool = True):  # type: ignore[no-untyped-def]
    options = {"guard_filter_fn": skip_code_guards} if filtered else {}
    return torch.compile(fn, fullgraph=True, backend=counter, options=options)


def test_the_cpu_options_carry_the_filter() -> None:
    assert compile_options("cpu") == {"cpp_wrapper": True, "guard_filter_fn": skip_code_guards}
    assert compile_options(torch.device("cuda", 0)) == {}


def test_a_patched_global_is_what_the_filter_gives_up() -> None:
    # Without the filter the new constant fails a guard and compiles again; with it the
    # first compile goes on running (what compile_options documents it gives up).
    module = sys.modules[__name__]
    x = torch.randn(8)
    for filtered, compiles, result in ((False, 2, 3.0), (True, 1, 2.0)):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = _compile(_scaled, counter, filtered=filtered)
        torch.testing.assert_close(compiled(x), x * 2.0)
        try:
            module.SCALE = 3.0  # type: ignore[attr-defined]
            torch.testing.assert_close(compiled(x), x * result)
        finally:
            module.SCALE = 2.0  # type: ignore[attr-defined]
        assert counter.frame_count == compiles, filtered


def test_a_samplers_arguments_and_config_stay_guarded() -> None:
    # Churning state compiles once; commit=False (an argument) and a sampler of another
    # config each compile again, and each equals its eager twin.
    torch._dynamo.reset()
    counter = CompileCounter()
    seed = int(torch.randint(0, 2**31, ()))
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)

    def build(max_num_logprobs: int) -> tuple[Sampler, Sampler, BatchDriver]:
        config = SamplerConfig(4, V, max_num_logprobs=max_num_logprobs, seed=seed)
        ours, twin = Sampler(config), Sampler(config)
        return ours, twin, BatchDriver(config, seed=seed, churn=0.3)

    def step(ours: Sampler, compiled, twin: Sampler, driver: BatchDriver, logits, **kw):  # type: ignore[no-untyped-def]
        update = driver.next_update()
        ours.update_state(update)
        twin.update_state(update)
        got = compiled(logits, **kw)
        want = twin.forward(logits, **kw)
        torch.testing.assert_close(got.sampled_token_ids, want.sampled_token_ids, rtol=0, atol=0)
        assert (got.logprobs_tensors is None) == (want.logprobs_tensors is None)
        if got.logprobs_tensors is not None and want.logprobs_tensors is not None:
            torch.testing.assert_close(
                got.logprobs_tensors.logprobs, want.logprobs_tensors.logprobs
            )
        driver.record_tokens(want.sampled_token_ids[:, 0].tolist())

    ours, twin, driver = build(2)
    compiled = _compile(ours.forward, counter)
    for _ in range(3):
        step(ours, compiled, twin, driver, torch.randn(4, V, generator=gen) * 3)
    assert counter.frame_count == 1, "churning state recompiled"
    step(ours, compiled, twin, driver, torch.randn(4, V, generator=gen) * 3, commit=False)
    assert counter.frame_count == 2, "commit=False reused the committing graph"
    ours, twin, driver = build(0)  # no logprobs: another graph
    step(ours, _compile(ours.forward, counter), twin, driver, torch.randn(4, V, generator=gen) * 3)
    assert counter.frame_count == 3, "a sampler of another config reused the graph"
