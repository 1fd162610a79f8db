"""`compute_prompt_logprobs`: prompt positions' logprobs, top K and ranks, in chunks.

Against a float64 reference (log_softmax in float64 of the input's values) on fresh random
inputs each run, the seed printed (shown on failure: rerun with it): every chunk layout
(N below, at and off a multiple of chunk_size), float32/bfloat16/float16 input, K = 0, 1
and V, both raw modes, requested ids [C] and [N, C] with -1 columns, rows holding -inf, ids
outside the vocabulary. Then: results bit-identical across chunk sizes (on a CPU), no
float32 tensor larger than a chunk, strided logits, no host read (`SyncOpDetector`),
torch.compile (fullgraph) equal to eager, and every validation error.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graphsafe_sampler.output import LogprobsTensors
from graphsafe_sampler.prompt_logprobs import PromptLogprobsMode, compute_prompt_logprobs
from graphsafe_sampler.stages.candidates import CANDIDATE_TILE
from graphsafe_sampler.testing import SyncOpDetector

V = 1000  # 32 tiles: top_candidates' tiled path for small K, its plain topk for K = V
MODES: tuple[PromptLogprobsMode, ...] = ("raw_logprobs", "raw_logits")


def _generator() -> torch.Generator:
    seed = random.randrange(2**31)
    print(f"seed {seed}")  # fresh inputs each run; shown on failure: rerun with it
    return torch.Generator().manual_seed(seed)


def _inputs(
    gen: torch.Generator, n: int, vocab: int = V, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits [n, vocab], next ids [n] int64, requested ids [n, 4] int32 (-1 columns)."""
    logits = (torch.randn(n, vocab, generator=gen) * 3).to(dtype)
    next_ids = torch.randint(0, vocab, (n,), generator=gen)
    requested = torch.randint(0, vocab, (n, 4), generator=gen, dtype=torch.int32)
    requested[:, 3] = -1
    requested[::2, 2] = -1  # rows with 1 and 2 unused columns
    return logits, next_ids, requested


def _reference(logits: torch.Tensor, mode: PromptLogprobsMode) -> torch.Tensor:
    """[N, V] float64: what every returned value should be (a row all -inf: all -inf)."""
    x = logits.double()
    if mode == "raw_logits":
        return x
    dead = (x == float("-inf")).all(dim=-1, keepdim=True)
    return torch.where(dead, float("-inf"), torch.log_softmax(torch.where(dead, 0.0, x), -1))


def _rank_band(
    ref: torch.Tensor, value: torch.Tensor, mode: PromptLogprobsMode
) -> tuple[torch.Tensor, ...]:
    """(least, most) [N, ...] ranks float32 may give a value [N, ...] of rows ref [N, V]:
    float32 may merge a neighbour within rounding into the value, or not (exact for logits)."""
    tol = 0.0 if mode == "raw_logits" else 1e-5
    band = tol * (1 + value.abs().nan_to_num(posinf=0.0))
    least = (ref[:, None, :] >= (value + band)[..., None]).sum(-1)
    most = (ref[:, None, :] >= (value - band)[..., None]).sum(-1)
    return least, most


def _check(
    out: LogprobsTensors,
    logits: torch.Tensor,
    next_ids: torch.Tensor,
    k: int,
    mode: PromptLogprobsMode,
    requested: torch.Tensor | None,
) -> None:
    """Every field of `out` against the float64 reference."""
    n, vocab = logits.shape
    ref = _reference(logits.cpu(), mode)
    tol = 0.0 if mode == "raw_logits" else 1e-5  # the logits themselves are exact
    ids, values, ranks = (t.cpu() for t in out[:3])
    next_ids = next_ids.cpu().long()
    assert ids.shape == values.shape == (n, k + 1) and ranks.shape == (n,)
    assert (ids.dtype, values.dtype, ranks.dtype) == (torch.int32, torch.float32, torch.int32)
    assert torch.equal(ids[:, 0].long(), next_ids)
    want = ref.gather(1, next_ids[:, None])  # [n, 1]
    torch.testing.assert_close(values[:, :1].double(), want, rtol=tol, atol=tol)
    least, most = _rank_band(ref, want, mode)
    assert ((least[:, 0] <= ranks) & (ranks <= most[:, 0])).all(), (least, ranks, most)
    if k:
        top = values[:, 1:].double()  # [n, K]
        torch.testing.assert_close(top, ref.topk(k, dim=-1).values, rtol=tol, atol=tol)
        assert (top[:, :-1] >= top[:, 1:]).all()  # descending
        top_ids = ids[:, 1:].long()
        assert ((top_ids >= 0) & (top_ids < vocab)).all()
        # the ids are the values' tokens
        torch.testing.assert_close(ref.gather(1, top_ids), top, rtol=tol, atol=tol)
        for row in range(n):  # distinct ids among the finite ones (-inf ones may repeat)
            finite = top_ids[row][top[row].isfinite()]
            assert finite.unique().numel() == finite.numel(), row
    if requested is None:
        assert out.requested_token_ids is None and out.requested_logprobs is None
        assert out.requested_ranks is None
        return
    chosen = requested.cpu().long().expand(n, -1)  # [n, C]
    assert out.requested_token_ids is not None and out.requested_logprobs is not None
    assert out.requested_ranks is not None
    got_ids = out.requested_token_ids.cpu()
    got_values = out.requested_logprobs.cpu()
    got_ranks = out.requested_ranks.cpu()
    assert got_ids.dtype == got_ranks.dtype == torch.int32
    assert got_values.dtype == torch.float32
    assert torch.equal(got_ids.long(), chosen)
    used = (chosen >= 0) & (chosen < vocab)
    want_chosen = torch.where(used, ref.gather(1, chosen.clamp(0, vocab - 1)), float("-inf"))
    torch.testing.assert_close(got_values.double(), want_chosen, rtol=tol, atol=tol)
    least, most = _rank_band(ref, want_chosen, mode)
    inside = (least <= got_ranks) & (got_ranks <= most)
    assert torch.where(used, inside, got_ranks == 0).all(), (least, got_ranks, most)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"]
)
@pytest.mark.parametrize(
    ("n", "chunk_size"),
    [(5, 16), (13, 4), (12, 4), (7, 1)],
    ids=["below-one-chunk", "last-chunk-partial", "whole-chunks", "chunk-of-1"],
)
def test_matches_the_float64_reference(
    device: torch.device, n: int, chunk_size: int, dtype: torch.dtype, mode: PromptLogprobsMode
) -> None:
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, n, dtype=dtype)
    logits, next_ids, requested = logits.to(device), next_ids.to(device), requested.to(device)
    out = compute_prompt_logprobs(
        logits,
        next_ids,
        3,
        logprob_token_ids=requested,
        logprobs_mode=mode,
        chunk_size=chunk_size,
    )
    _check(out, logits, next_ids, 3, mode, requested)


@pytest.mark.parametrize("mode", MODES)
def test_k_0_is_column_0_of_any_k_bit_for_bit(
    device: torch.device, mode: PromptLogprobsMode
) -> None:
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, 9, dtype=torch.bfloat16)
    logits, next_ids, requested = logits.to(device), next_ids.to(device), requested.to(device)
    outs = {
        k: compute_prompt_logprobs(
            logits,
            next_ids.int(),
            k,
            logprob_token_ids=requested,
            logprobs_mode=mode,
            chunk_size=4,
        )
        for k in (0, 1, 5)
    }
    _check(outs[0], logits, next_ids, 0, mode, requested)
    for k in (1, 5):
        assert torch.equal(outs[k].logprob_token_ids[:, :1], outs[0].logprob_token_ids)
        assert torch.equal(outs[k].logprobs[:, :1], outs[0].logprobs)
        for a, b in zip(outs[k][2:], outs[0][2:], strict=True):
            assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            assert torch.equal(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_k_equal_to_the_vocabulary(device: torch.device, mode: PromptLogprobsMode) -> None:
    """K = V (vLLM's prompt_logprobs = -1): every token, sorted."""
    gen = _generator()
    logits, next_ids, _ = _inputs(gen, 6, vocab=70)
    logits, next_ids = logits.to(device), next_ids.to(device)
    out = compute_prompt_logprobs(logits, next_ids, 70, logprobs_mode=mode, chunk_size=4)
    _check(out, logits, next_ids, 70, mode, None)
    assert torch.equal(
        out.logprob_token_ids[:, 1:].sort(-1).values.cpu(),
        torch.arange(70)[None].expand(6, -1).int(),
    )


@pytest.mark.parametrize("mode", MODES)
def test_requested_ids_of_one_row_apply_to_every_row(
    device: torch.device, mode: PromptLogprobsMode
) -> None:
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, 10)
    logits, next_ids = logits.to(device), next_ids.to(device)
    one_row = requested[1].long().to(device)  # [C] with a -1 column

    def run(ids: torch.Tensor | None) -> LogprobsTensors:
        return compute_prompt_logprobs(
            logits, next_ids, 2, logprob_token_ids=ids, logprobs_mode=mode, chunk_size=3
        )

    shared, expanded, without = run(one_row), run(one_row.expand(10, -1).clone()), run(None)
    _check(shared, logits, next_ids, 2, mode, one_row)
    for a, b in zip(shared, expanded, strict=True):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        assert torch.equal(a, b)
    assert shared.requested_token_ids is not None
    assert shared.requested_token_ids.is_contiguous()
    for a, b in zip(shared[:3], without[:3], strict=True):  # the top K and ranks unchanged
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_rows_with_minus_inf(device: torch.device, mode: PromptLogprobsMode) -> None:
    """Masked entries, a row with one finite logit, a row all -inf (its logprobs -inf,
    never NaN, its rank V), next and requested ids at -inf entries (rank V)."""
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, 11)
    logits[torch.rand(11, V, generator=gen) < 0.4] = float("-inf")
    logits[0] = float("-inf")
    logits[1] = float("-inf")
    logits[1, 17] = 2.5
    next_ids[2] = 5
    logits[2, 5] = float("-inf")
    requested[3, 0] = 7
    logits[3, 7] = float("-inf")
    logits, next_ids, requested = logits.to(device), next_ids.to(device), requested.to(device)
    out = compute_prompt_logprobs(
        logits, next_ids, 3, logprob_token_ids=requested, logprobs_mode=mode, chunk_size=4
    )
    _check(out, logits, next_ids, 3, mode, requested)
    assert out.requested_logprobs is not None and out.requested_ranks is not None
    assert not out.logprobs.isnan().any() and not out.requested_logprobs.isnan().any()
    assert (out.logprobs[0] == float("-inf")).all() and out.selected_token_ranks[0] == V
    assert out.logprob_token_ids[1, 1] == 17 and out.logprobs[1, 2:].eq(float("-inf")).all()
    if mode == "raw_logprobs":
        assert out.logprobs[1, 1] == 0.0
    assert out.logprobs[2, 0] == float("-inf") and out.selected_token_ranks[2] == V
    assert out.requested_logprobs[3, 0] == float("-inf") and out.requested_ranks[3, 0] == V


@pytest.mark.parametrize("mode", MODES)
def test_ids_outside_the_vocabulary_read_minus_inf_with_rank_0(
    device: torch.device, mode: PromptLogprobsMode
) -> None:
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, 6)
    good = next_ids.clone()
    next_ids[[1, 3, 4]] = torch.tensor([-1, V, V + 1000])
    requested[:, 1] = torch.tensor([V, -2, V + 7, 0, -1, 2**31 - 1], dtype=torch.int32)
    logits, next_ids, requested = logits.to(device), next_ids.to(device), requested.to(device)

    def run(ids: torch.Tensor) -> LogprobsTensors:
        return compute_prompt_logprobs(
            logits, ids, 2, logprob_token_ids=requested, logprobs_mode=mode, chunk_size=4
        )

    out, clean = run(next_ids), run(good.to(device))
    bad = torch.zeros(6, dtype=torch.bool, device=device)
    bad[[1, 3, 4]] = True
    assert torch.equal(out.logprob_token_ids[:, 0], next_ids.int())  # as given
    assert (out.logprobs[bad, 0] == float("-inf")).all()
    assert (out.selected_token_ranks[bad] == 0).all()
    assert torch.equal(out.logprobs[~bad], clean.logprobs[~bad])
    assert torch.equal(out.logprob_token_ids[:, 1:], clean.logprob_token_ids[:, 1:])
    assert out.requested_token_ids is not None and out.requested_logprobs is not None
    assert out.requested_ranks is not None
    assert torch.equal(out.requested_token_ids, requested)  # as given
    outside = torch.tensor([True, True, True, False, True, True], device=device)
    assert (out.requested_logprobs[outside, 1] == float("-inf")).all()
    assert (out.requested_ranks[outside, 1] == 0).all()
    _check(
        out._replace(
            logprob_token_ids=clean.logprob_token_ids,
            logprobs=clean.logprobs,
            selected_token_ranks=clean.selected_token_ranks,
        ),
        logits,
        good,
        2,
        mode,
        requested,
    )


def test_strided_logits_give_the_same_result(device: torch.device) -> None:
    """Logits as a column slice of a wider tensor, or a transpose: as if contiguous."""
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, 9)
    logits, next_ids, requested = logits.to(device), next_ids.to(device), requested.to(device)
    wider = torch.cat([logits, torch.zeros(9, 24, device=device)], dim=1)[:, :V]
    transposed = logits.t().contiguous().t()
    assert not wider.is_contiguous() and not transposed.is_contiguous()
    outs = [
        compute_prompt_logprobs(x, next_ids, 3, logprob_token_ids=requested, chunk_size=4)
        for x in (logits, wider, transposed)
    ]
    for out in outs[1:]:
        for a, b in zip(outs[0], out, strict=True):
            assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            assert torch.equal(a, b)


def test_results_do_not_depend_on_chunk_size() -> None:
    """Bit for bit on a CPU, ties and -inf included: every op reduces row by row in the same
    order whatever the number of rows. Not asserted on CUDA, where a reduction's strategy
    (and so its rounding) can change with the number of rows."""
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, 23, dtype=torch.bfloat16)  # many exact ties
    logits[torch.rand(23, V, generator=gen) < 0.2] = float("-inf")
    logits[4] = float("-inf")
    for mode in MODES:
        for k in (0, 4):
            outs = [
                compute_prompt_logprobs(
                    logits,
                    next_ids,
                    k,
                    logprob_token_ids=requested,
                    logprobs_mode=mode,
                    chunk_size=chunk_size,
                )
                for chunk_size in (1, 3, 8, 23, 1024)
            ]
            for out in outs[1:]:
                for name, a, b in zip(out._fields, outs[0], out, strict=True):
                    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                    assert torch.equal(a, b), (mode, k, name)


class _LargestFloat32(TorchDispatchMode):
    """Records the most elements of any float32 tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in _tensors(out):
            if t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


@pytest.mark.parametrize("k", [0, 3])
def test_float32_work_is_bounded_by_a_chunk(k: int) -> None:
    """No op makes a float32 tensor larger than one chunk's (padded to whole tiles)."""
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, 64, dtype=torch.bfloat16)
    chunk_size = 8
    with _LargestFloat32() as seen:
        compute_prompt_logprobs(
            logits, next_ids, k, logprob_token_ids=requested, chunk_size=chunk_size
        )
    padded = -(-V // CANDIDATE_TILE) * CANDIDATE_TILE
    assert 0 < seen.largest <= chunk_size * padded, seen.largest


@pytest.mark.parametrize("mode", MODES)
def test_no_host_reads(mode: PromptLogprobsMode) -> None:
    gen = _generator()
    logits, next_ids, requested = _inputs(gen, 9, dtype=torch.float16)
    for k in (0, 2):
        for ids in (requested, requested[0], None):
            with SyncOpDetector("compute_prompt_logprobs"):
                compute_prompt_logprobs(
                    logits, next_ids, k, logprob_token_ids=ids, logprobs_mode=mode, chunk_size=4
                )


def test_compiled_equals_eager() -> None:
    """One graph holding both modes and both K paths (K = 0 and K >= 1), [C] and [N, C]
    requested ids, a partial last chunk: ids and ranks equal, values within float32
    rounding (inductor may sum the logsumexp in another order)."""
    gen = _generator()
    # V = 64: the top K from one topk (the tiled path costs more kernels to compile, and
    # the Sampler's compiled tests cover it)
    logits, next_ids, requested = _inputs(gen, 5, vocab=64, dtype=torch.bfloat16)
    logits[1, :40] = float("-inf")
    logits[4] = float("-inf")

    def both(
        x: torch.Tensor, t: torch.Tensor, r: torch.Tensor
    ) -> tuple[LogprobsTensors, LogprobsTensors]:
        return (
            compute_prompt_logprobs(x, t, 2, logprob_token_ids=r, chunk_size=3),
            compute_prompt_logprobs(
                x, t, 0, logprob_token_ids=r[0], logprobs_mode="raw_logits", chunk_size=3
            ),
        )

    # the one compile of this file: a single small shape
    compiled = torch.compile(both, fullgraph=True, dynamic=False)(logits, next_ids, requested)
    eager = both(logits, next_ids, requested)
    for got, want in zip(compiled, eager, strict=True):
        for name, a, b in zip(want._fields, got, want, strict=True):
            assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            if a.is_floating_point():
                torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)
            else:
                assert torch.equal(a, b), name


def _valid() -> dict[str, Any]:
    return {
        "logits": torch.zeros(4, 10),
        "next_token_ids": torch.zeros(4, dtype=torch.int64),
        "num_logprobs": 2,
        "logprob_token_ids": None,
        "logprobs_mode": "raw_logprobs",
        "chunk_size": 2,
    }


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"logits": [[0.0] * 10] * 4}, TypeError, "logits must be a torch.Tensor, got list"),
        ({"logits": torch.zeros(4, 10, 1)}, ValueError, r"logits must be 2-D .* got 3-D"),
        ({"logits": torch.zeros(4, 10, dtype=torch.float64)}, TypeError, "got torch.float64"),
        ({"logits": torch.zeros(4, 10, dtype=torch.int32)}, TypeError, "logits must be float32"),
        (
            {"logits": torch.zeros(0, 10), "next_token_ids": torch.zeros(0, dtype=torch.int64)},
            ValueError,
            "at least 1 row",
        ),
        ({"logits": torch.zeros(4, 0), "num_logprobs": 0}, ValueError, "columns .* got 0"),
        ({"next_token_ids": [0, 0, 0, 0]}, TypeError, "next_token_ids must be a torch.Tensor"),
        (
            {"next_token_ids": torch.zeros(4)},
            TypeError,
            "next_token_ids must be int32 or int64, got torch.float32",
        ),
        ({"next_token_ids": torch.zeros(4, dtype=torch.int16)}, TypeError, "torch.int16"),
        (
            {"next_token_ids": torch.zeros(5, dtype=torch.int64)},
            ValueError,
            r"next_token_ids must have shape \[4\] .* got \[5\]",
        ),
        ({"next_token_ids": torch.zeros(4, 1, dtype=torch.int64)}, ValueError, r"got \[4, 1\]"),
        (
            {"next_token_ids": torch.zeros(4, dtype=torch.int64, device="meta")},
            ValueError,
            "next_token_ids is on meta, logits on cpu",
        ),
        ({"num_logprobs": 2.0}, TypeError, "num_logprobs must be an int, got float"),
        ({"num_logprobs": True}, TypeError, "num_logprobs must be an int, got bool"),
        (
            {"num_logprobs": -1},
            ValueError,
            r"num_logprobs must be in \[0, vocab_size = 10\], got -1",
        ),
        ({"num_logprobs": 11}, ValueError, r"in \[0, vocab_size = 10\], got 11"),
        (
            {"logprob_token_ids": [1, 2]},
            TypeError,
            "logprob_token_ids must be a torch.Tensor or None, got list",
        ),
        (
            {"logprob_token_ids": torch.zeros(2)},
            TypeError,
            "logprob_token_ids must be int32 or int64, got torch.float32",
        ),
        (
            {"logprob_token_ids": torch.zeros(4, 2, 1, dtype=torch.int64)},
            ValueError,
            r"logprob_token_ids must be \[C\] or \[num_positions, C\], got 3-D",
        ),
        (
            {"logprob_token_ids": torch.zeros(3, 2, dtype=torch.int64)},
            ValueError,
            r"logprob_token_ids must have 4 rows .* got shape \[3, 2\]",
        ),
        (
            {"logprob_token_ids": torch.zeros(0, dtype=torch.int64)},
            ValueError,
            r"at least 1 column \(pass None for none\), got shape \[0\]",
        ),
        (
            {"logprob_token_ids": torch.zeros(4, 0, dtype=torch.int64)},
            ValueError,
            r"got shape \[4, 0\]",
        ),
        (
            {"logprob_token_ids": torch.zeros(2, dtype=torch.int64, device="meta")},
            ValueError,
            "logprob_token_ids is on meta, logits on cpu",
        ),
        (
            {"logprobs_mode": "processed_logprobs"},
            ValueError,
            r"logprobs_mode must be one of \('raw_logprobs', 'raw_logits'\) \(prompt positions "
            r"are not processed\), got 'processed_logprobs'",
        ),
        ({"logprobs_mode": "processed_logits"}, ValueError, "got 'processed_logits'"),
        ({"logprobs_mode": "logprobs"}, ValueError, "got 'logprobs'"),
        ({"logprobs_mode": None}, ValueError, "got None"),
        ({"chunk_size": 0}, ValueError, "chunk_size must be >= 1, got 0"),
        ({"chunk_size": -3}, ValueError, "chunk_size must be >= 1, got -3"),
        ({"chunk_size": 2.5}, TypeError, "chunk_size must be an int, got float"),
        ({"chunk_size": False}, TypeError, "chunk_size must be an int, got bool"),
    ],
)
def test_bad_arguments_raise_naming_them(
    change: dict[str, Any], error: type[Exception], match: str
) -> None:
    kwargs = _valid() | change
    logits, next_ids, k = (
        kwargs.pop("logits"),
        kwargs.pop("next_token_ids"),
        kwargs.pop("num_logprobs"),
    )
    with pytest.raises(error, match=match):
        compute_prompt_logprobs(logits, next_ids, k, **kwargs)


def test_valid_arguments_pass() -> None:
    """The base of the error cases is itself accepted (so each case fails for its change)."""
    kwargs = _valid()
    out = compute_prompt_logprobs(
        kwargs.pop("logits"), kwargs.pop("next_token_ids"), kwargs.pop("num_logprobs"), **kwargs
    )
    assert out.logprobs.shape == (4, 3)
