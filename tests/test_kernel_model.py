"""perf/kernel_model.py, the cost model of the Triton step on an H200 (an estimate): its
formulas on hand-computed cases, the aten-op classifier, the SASS loop finder, and the whole
model at a small vocabulary. The whole model runs in its own process, with the interpreter
off (this suite's conftest turns it on; the model compiles for sm_90 and runs nothing), as
tests/test_kernels_compile_for_cuda.py runs tests/cuda_compile.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from made_once import made_once
from perf_scripts import PERF, load_perf_script

from graphsafe_sampler.bench.logits import llm_like_logits

load_perf_script("kernel_model")  # puts perf/ on sys.path: its package cost_model/
from cost_model import access, aten_ops, bench_rows, chain, context, machine, sass  # noqa: E402

ROWS = (1, 3)
VOCAB = 4099  # not a multiple of the 1,024-element tile, nor of 16
CASES = ("all", "top_k_top_p")
VOCAB_KERNELS = {
    "_process_logits_kernel",
    "_candidates_kernel",
    "_sample_kernel",
    "_logprobs_kernel",
}
"""The kernels that walk the vocabulary in tiles on every step (the top-k/top-p cut kernel
walks it only for the rows the candidate buffer does not settle)."""


def _ptxas() -> bool:
    """Whether the triton wheel ships its CUDA backend's tools."""
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


def test_ctas_per_sm_hand_computed() -> None:
    # 192 registers: 6,144 a warp; 4 warps 24,576 -> 65,536 // 24,576 = 2
    assert machine.ctas_per_sm(4, 192, 0) == 2
    # 64 registers: 2,048 a warp; 8 warps 16,384 -> 4 (warps would allow 8)
    assert machine.ctas_per_sm(8, 64, 0) == 4
    # 33 registers: 1,056 a warp, rounded up to 1,280; 4 warps 5,120 -> 12 (warps: 16)
    assert machine.ctas_per_sm(4, 33, 0) == 12
    # shared memory: 100 KB + 1 KB reserved a CTA -> 228 KB // 101 KB = 2
    assert machine.ctas_per_sm(4, 32, 100 * 1024) == 2
    # warps: 32 a CTA -> 64 // 32 = 2 (registers would allow 4)
    assert machine.ctas_per_sm(32, 16, 0) == 2
    # the cap: 1 warp of 16 registers would fit 128 times
    assert machine.ctas_per_sm(1, 16, 0) == 32


def test_register_cap_gives_its_occupancy_and_no_more() -> None:
    """`library.register_cap`, the `maxnreg` a split kernel launches with, fits its CTAs an SM
    in the register file (by the model's allocation rule) and is the largest that does."""
    from graphsafe_sampler.kernels.library import register_cap

    assert register_cap(8, 4) == 64 and register_cap(8, 3) == 80 and register_cap(4, 7) == 72
    for warps, ctas in itertools.product((4, 8), range(1, 9)):
        cap = register_cap(warps, ctas)
        assert machine.ctas_per_sm(warps, cap, 0) >= ctas, (warps, ctas, cap)
        assert machine.ctas_per_sm(warps, cap + 8, 0) < ctas, (warps, ctas, cap)


def test_gpu_presets_by_device_name_and_sm_count() -> None:
    """A GPU check on an H100 gets an H100's estimate: the part from the device's name, its
    SMs from the device; an unknown device the H200's figures, and a name that says so."""
    h200, sxm, pcie = machine.H200, machine.H100_SXM, machine.H100_PCIE
    assert machine.gpu_for_device("NVIDIA H200", 132) is h200
    assert machine.gpu_for_device("NVIDIA H100 80GB HBM3", 132) is sxm
    assert machine.gpu_for_device("NVIDIA H100 PCIe", 114) is pcie
    assert (sxm.hbm_peak_tbps, sxm.sms, sxm.clock_ghz) == (3.35, 132, h200.clock_ghz)
    assert (pcie.hbm_peak_tbps, pcie.sms, pcie.clock_ghz) == (2.0, 114, 1.755)
    # the occupancy limits are compute capability 9.0's on all three
    for gpu in (sxm, pcie):
        assert gpu.registers_per_sm == h200.registers_per_sm
        assert gpu.shared_per_sm == h200.shared_per_sm
    slice_ = machine.gpu_for_device("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 60)
    assert slice_.sms == 60 and slice_.hbm_peak_tbps == 3.35 and "60 SMs" in slice_.name
    other = machine.gpu_for_device("NVIDIA A100-SXM4-80GB", 108)
    assert other.name.startswith("NVIDIA A100-SXM4-80GB (with the H200's figures)")
    assert other.sms == 108 and other.hbm_peak_tbps == h200.hbm_peak_tbps
    # the same memory-bound launch: its memory time in the ratio of the bandwidths
    on = [machine.launch_time(1e8, 264, 2, 8, [(1, 10, 1)], gpu) for gpu in (h200, sxm)]
    assert on[1].memory_us / on[0].memory_us == pytest.approx(4.8 / 3.35)


def test_the_temperature_option_sets_every_request_of_every_case() -> None:
    kernel_model = load_perf_script("kernel_model")
    import gpu.measure

    def gen() -> torch.Generator:  # the cases' random ids (bias, stop ids) drawn alike
        return torch.Generator().manual_seed(0)

    original = gpu.measure.bench_params
    with kernel_model.at_temperature(0.7):
        for case in CASES:
            params = gpu.measure.bench_params(case, 3, VOCAB, gen())
            assert params.temperature == 0.7
            assert params == dataclasses.replace(original(case, 3, VOCAB, gen()), temperature=0.7)
    assert gpu.measure.bench_params is original
    with kernel_model.at_temperature(None):  # the cases' own: "all" at 0.8
        assert gpu.measure.bench_params("all", 0, VOCAB, gen()).temperature == 0.8


def test_the_gpu_option_picks_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_model = load_perf_script("kernel_model")
    seen: list[machine.Gpu] = []
    temperatures: list[float | None] = []

    def fake_build(
        rows: object, vocab: object, cases: object, gpu: machine.Gpu, temperature: float | None
    ) -> dict:
        seen.append(gpu)
        temperatures.append(temperature)
        return {}

    monkeypatch.setattr(kernel_model, "build_model", fake_build)
    monkeypatch.setattr(kernel_model, "format_report", lambda model: "")
    for argv, want in (([], machine.H200), (["--gpu", "h100-pcie"], machine.H100_PCIE),
                       (["--gpu", "h100-sxm"], machine.H100_SXM)):  # fmt: skip
        assert kernel_model.main(argv) == 0
        assert seen[-1] is want
    assert kernel_model.main(["--gpu", "auto"]) == 0
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        assert seen[-1] == machine.gpu_for_device(props.name, props.multi_processor_count)
    else:
        assert seen[-1] is machine.H200
    with pytest.raises(SystemExit):
        kernel_model.main(["--gpu", "a100"])
    # and the requests' temperature, the cases' own unless given
    assert kernel_model.main(["--temperature", "0.7"]) == 0
    assert set(temperatures[:-1]) == {None} and temperatures[-1] == 0.7


def test_row_splits_hand_computed() -> None:
    """The split policies on an H200's 132 SMs at V = 151,936 (149 tiles): the count whose
    waves times walk (plus 8 tiles a program) is the shortest."""
    from graphsafe_sampler.kernels.library import SplitPolicy, row_splits

    cuda = torch.device("cuda")  # never touched: num_sms is given
    # B = 256 at 4 CTAs (528 slots): 2 chunks fill one wave, 1 x (75 + 8) = 83; 3 need two
    # waves, 2 x (50 + 8) = 116; at 3 CTAs (396 slots) 2 chunks need two waves, 2 x 83
    assert row_splits(256, 151_936, cuda, 132, ctas_per_sm=4) == 2
    assert row_splits(256, 151_936, cuda, 132, ctas_per_sm=3) == 3
    # at least 3 chunks: 4 (1,024 programs, two waves of 38 + 8) beats 3 (two waves of 58)
    assert SplitPolicy(4, 2, 64, min_splits=3)(256, 151_936, cuda, 132) == 4
    # B = 1: every tile its own program; at 2 tiles or more each, 50 chunks of 3 tiles walk
    # as long as 64 (the fewest programs among equals); a row too short for the minimum
    assert row_splits(1, 151_936, cuda, 132, ctas_per_sm=4) == 149
    assert SplitPolicy(4, 2, 64)(1, 151_936, cuda, 132) == 50
    assert SplitPolicy(4, 2, 64, min_splits=3)(512, 4_099, cuda, 132) == 2  # 5 tiles
    assert row_splits(8, 151_936, torch.device("cpu")) == 1  # the interpreter: one by one


def test_launch_time_hand_computed() -> None:
    gpu = machine.Gpu(clock_ghz=2.0)  # 3.84 TB/s achievable, 800 ns, 2 µs a launch, 132 SMs
    # 264 programs at 2 CTAs an SM: one wave, 2 resident share 4 issue slots -> 2 each; a
    # tile: 800 ns + 100 instructions × 4 warps / 2 a clock / 2 GHz = 900 ns; 10 tiles: 9 µs
    t = machine.launch_time(3.84e6, 264, 2, 4, [(10, 100, 1)], gpu)
    assert (t.waves, t.memory_us) == (1, pytest.approx(1.0))
    assert t.serial_us == pytest.approx(9.0) and t.est_us == pytest.approx(11.0)
    # 300 programs at 1 CTA an SM: 3 waves of one resident program issuing 4 a clock; a
    # tile: 800 ns + 100 × 4 / 4 / 2 GHz = 850 ns; 10 tiles: 8.5 µs a wave
    t = machine.launch_time(0, 300, 1, 4, [(10, 100, 1)], gpu)
    assert t.waves == 3 and t.est_us == pytest.approx(3 * 8.5 + 2)
    # pipelined 3 deep: the first tile's 800 ns, then each tile the larger of its 50 ns of
    # compute and 800 / 2 = 400 ns: 0.8 + 10 × 0.4 = 4.8 µs a wave; compute-bound at 1,000
    # instructions (500 ns a tile): 0.8 + 10 × 0.5 = 5.8 µs
    t = machine.launch_time(0, 300, 1, 4, [(10, 100, 3)], gpu)
    assert t.serial_us == pytest.approx(4.8)
    assert machine.launch_time(0, 300, 1, 4, [(10, 1000, 3)], gpu).serial_us == pytest.approx(5.8)
    # no tile loop: the bytes alone, 38.4 MB at 3.84 TB/s = 10 µs
    assert machine.launch_time(3.84e7, 1000, 8, 4, [], gpu).est_us == pytest.approx(12.0)
    # outside the tile loops, 3 rounds of loads (2.4 µs) and 800 instructions (800 × 4 / 4
    # / 2 GHz = 0.4 µs) before the 4.8 µs pipelined walk
    t = machine.launch_time(0, 300, 1, 4, [(10, 100, 3)], gpu, load_rounds=3, instructions=800)
    assert t.serial_us == pytest.approx(2.4 + 0.4 + 4.8)
    assert machine.aten_time(3.84e6, gpu).est_us == pytest.approx(3.0)
    # a counted loop (work.Work.trips) of 10 trips is charged as a tile loop; one of 0.25
    # expected trips (a quarter of the programs entering it) pays a quarter of the first
    # wait: 0.25 × 0.8 + 0.25 × 0.4 = 0.3 µs, where a tile loop of 0.25 tiles pays it all
    counted = machine.launch_time(0, 300, 1, 4, [], gpu, counted_loops=[(10, 100, 3)])
    assert counted.serial_us == pytest.approx(4.8)
    t = machine.launch_time(0, 300, 1, 4, [], gpu, counted_loops=[(0.25, 100, 3)])
    assert t.serial_us == pytest.approx(0.3)
    assert machine.launch_time(0, 300, 1, 4, [(0.25, 100, 3)], gpu).serial_us == pytest.approx(0.9)
    # 264 programs of which 132 stop at once (`issuing`): one issuing program an SM, at the
    # full 4 a clock, though both still take their place in the wave
    t = machine.launch_time(0, 264, 2, 4, [(10, 100, 1)], gpu, issuing=132)
    assert t.waves == 1 and t.serial_us == pytest.approx(8.5)
    # 792 programs at 6 CTAs an SM, 1,000 instructions on the longest path, 400 of them a
    # merge that 1 program in 12 runs (`merging`): the 600 shared by the 6 resident (600 ×
    # 4 × 6 / 4 / 2 GHz = 1.8 µs), then the merge's 400 at the full 4 a clock (0.5 merging
    # an SM: 400 × 4 / 4 / 2 GHz = 0.2 µs), where every program charged all 1,000 took 3 µs
    whole = machine.launch_time(0, 792, 6, 4, [], gpu, instructions=1000)
    assert whole.serial_us == pytest.approx(3.0)
    merged = machine.launch_time(0, 792, 6, 4, [], gpu, instructions=1000, merging=(600, 1 / 12))
    assert merged.serial_us == pytest.approx(1.8 + 0.2)
    # 3 merging an SM (1 in 2) share the issue as the resident programs do: 400 × 4 / (4 / 3)
    # / 2 GHz = 0.6 µs; the rounds are the longest path's either way
    t = machine.launch_time(0, 792, 6, 4, [], gpu, 2, 1000, merging=(600, 1 / 2))
    assert t.serial_us == pytest.approx(1.6 + 1.8 + 0.6)


def test_a_covered_rows_other_sampling_programs_are_idle() -> None:
    """With stage 1's lists, a covered row's programs but its first stop at once: the
    access table gives that share of the row's programs as idle (2 of 3 here), none of an
    uncovered row's; without the lists, no idle share."""
    from graphsafe_sampler.kernels import sampling

    rows, vocab, block = 2, 3 * 1024, 1024
    args: dict[str, Any] = {
        "slots_ptr": torch.tensor([0, 1]), "temperature_ptr": torch.ones(2),
        "vocab_size": vocab, "chunk": block, "list_len": 32, "num_lists": 3,
        access.COVERED: torch.tensor([1.0, 0.0], dtype=torch.float64),
        # the commit's tables (COMMIT off: unread)
        "counts_stride": vocab, "keep_ptr": torch.ones(2, dtype=torch.bool), "num_words": 3,
        "num_overflow": 2, "window_len": 4, "padding_slot": 9,
    }  # fmt: skip
    constexprs = {
        "GREEDY_BELOW": 1e-5, "BY_SLOT": True, "SPLIT": True, "HAS_THRESHOLD": True,
        "HAS_TILE_MAX": False, "BLOCK_SIZE": block, "HAS_BUFFER": True, "RANK_BLOCK": 32,
        "COMMIT": False, "HAS_KEEP": False,
    }  # fmt: skip
    work = access.WORK[sampling._sample_kernel.__name__](args, constexprs)
    assert work.idle is not None and work.idle.tolist() == pytest.approx([2 / 3, 0.0])
    plain = access.WORK[sampling._sample_kernel.__name__](args, {**constexprs, "HAS_BUFFER": False})
    assert plain.idle is None and work.idle.shape == (rows,)
    # the merge of a split row's answers is its last program's (1 of 3); the token's store
    # and commit, that one's too, but every issuing program's of a covered row (its first)
    merge = access.source_line(sampling._sample_kernel, "if finish:", "token = merge_argmax(")
    finish = access.source_line(sampling._sample_kernel, "if finish:", "tl.store(tokens_ptr")
    assert work.merging[merge].tolist() == pytest.approx([0.0, 1 / 3])
    assert work.merging[finish].tolist() == pytest.approx([1.0, 1 / 3])
    unsplit = access.WORK[sampling._sample_kernel.__name__](args, {**constexprs, "SPLIT": False})
    assert unsplit.merging == {}


def test_a_split_rows_merge_is_charged_to_its_last_program(model: dict[str, Any]) -> None:
    """A split logprobs row's merge (the `if` around it named by the access table) is run by
    the row's last program to arrive: the model's other programs' path leaves it out, and
    the launch's time charges it once an SM (`machine.launch_time`'s `merging`), where the
    longest path charged it to every program."""
    from graphsafe_sampler.kernels import logprobs as k

    vocab, block, rows = 151936, 1024, 2
    args: dict[str, Any] = {"source_ptr": torch.empty(rows, vocab), "chunk": 50 * block}
    merge = access.source_line(k._logprobs_kernel, "if last_to_arrive(")
    for split, share in ((True, 1 / 3), (False, 0.0)):
        constexprs = {"K": 5, "HAS_TILES": True, "BLOCK_SIZE": block, "SPLIT": split}
        work = access.WORK["_logprobs_kernel"](args, constexprs)
        assert work.merging[merge].tolist() == pytest.approx([share] * rows)
    # the compiled kernel (the model's, rows 3): the merge is about half its longest path
    launches = model["cases"]["all"]["3"]["launches"]
    split = next(e for e in launches if e["name"] == "_logprobs_kernel")
    assert split["grid"][1] > 1 and split["merge_free_instructions"] is not None
    assert split["merge_free_instructions"] < 0.7 * split["straight_instructions"]
    # and processing's phases after its dense pass (its last program's, ROW_SPARSE); an
    # unsplit launch, or one whose every issuing program merges (sampling's covered rows),
    # has no such path
    merging = {e["name"] for e in launches if e.get("merge_free_instructions") is not None}
    assert merging == {"_process_logits_kernel", "_logprobs_kernel"}


def test_crowded_list_share_is_the_chance_some_list_holds_a_block() -> None:
    """The probability that one of `chunks` lists holds `ranks` or more of `kept` logits at
    random columns, against a draw of the columns (the sampling race's later ranks)."""
    from cost_model.shares import crowded_list_share

    gen = torch.Generator().manual_seed(7)
    for kept, chunks, ranks in ((50, 50, 4), (50, 50, 8), (20, 12, 4), (90, 3, 32)):
        lists = torch.randint(0, chunks, (20_000, kept), generator=gen)
        counts = torch.zeros(20_000, chunks).scatter_add_(1, lists, torch.ones(20_000, kept))
        drawn = float((counts.max(1).values >= ranks).double().mean())
        share = float(crowded_list_share(torch.tensor([float(kept)]), chunks, ranks))
        assert share == pytest.approx(drawn, abs=0.015), (kept, chunks, ranks)
    # fewer logits than a block's ranks: never; more than the lists can hold short of it:
    # always; and per row
    shares = crowded_list_share(torch.tensor([[3.0, 50.0], [400.0, 0.0]]), 50, 8)
    assert shares.shape == (2, 2) and shares[0, 0] == 0 == shares[1, 1] and shares[1, 0] == 1


def test_aten_counter_counts_kernels_and_not_views() -> None:
    x = torch.ones(2, 3)
    events: list[Any] = []
    with aten_ops.AtenCounter(2, 3, events, lambda: 0):
        (x + 1).view(3, 2)
        torch.empty(4)
    ops = {op.name: op for op in events}
    add, view = ops["aten.add.Tensor"], ops["aten.view.default"]
    assert add.launches and (add.read_bytes, add.write_bytes, add.logits_bytes) == (24, 24, 48)
    assert not view.launches and view.read_bytes == view.write_bytes == 0
    assert not ops["aten.empty.memory_format"].launches


def test_aten_counter_leaves_out_ops_that_launch_triton_kernels() -> None:
    """An op during which a Triton launch was recorded (a kernel's torch.library op) is the
    kernel itself, counted by the recorder: not an aten op."""
    events: list[Any] = []
    recorded = itertools.count()
    with aten_ops.AtenCounter(2, 3, events, lambda: next(recorded)):  # a launch during every op
        torch.ones(2, 3).add_(1)
    assert events == []


SASS = """\
\t//## File "{src}", line 1
        /*0000*/                   MOV R1, R2 ;
.L_x_0:
\t//## File "{src}", line 2
        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0020*/                   BRA.DIV UR4, `(.L_x_2) ;
.L_x_1:
        /*0030*/                   FADD R3, R3, R1 ;
\t//## File "{src}", line 1
        /*0040*/              @!P0 BRA `(.L_x_0) ;
        /*0050*/                   EXIT ;
.L_x_2:
        /*0060*/                   SHFL.BFLY P0, R3, R3, 0x1, 0x1f ;
        /*0070*/                   BRA `(.L_x_1) ;
.L_x_3:
        /*0080*/                   BRA `(.L_x_3);
"""


def test_find_loops_takes_back_edges_only(tmp_path: Path) -> None:
    """One loop (0x10 to its branch back at 0x40); neither the divergence fallback's branch
    back into the body past the EXIT nor the padding branch-to-itself is one."""
    src = tmp_path / "kernel.py"
    src.write_text("for start in range(0, vocab_size, BLOCK_SIZE):\n    x = 1\n", encoding="utf-8")
    (loop,) = sass.find_loops(SASS.format(src=src), num_warps=4, block_size=1024)
    assert (loop.file, loop.line, loop.instructions, loop.tile_loop) == ("kernel.py", 1, 4, True)
    # a thread's iteration covers 1,024 / (32 × 4) = 8 elements: 4 / 8 instructions each
    assert (loop.elements_per_thread, loop.instructions_per_element) == (8, 0.5)
    assert not loop.pipelined
    # a tl.range walk whose body copies its loads asynchronously is a pipelined tile loop
    src.write_text(
        "for start in tl.range(begin, end, BLOCK_SIZE, num_stages=PIPELINE_STAGES):\n",
        encoding="utf-8",
    )
    copied = SASS.replace("IADD3 R1, R1, 0x1, RZ", "LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64]")
    (loop,) = sass.find_loops(copied.format(src=src), num_warps=4, block_size=1024)
    assert loop.tile_loop and loop.pipelined
    # so is a walk over a tile list (`library.tiles_to_visit`), one listed tile an iteration;
    # a loop over anything else is not a tile loop (new files: linecache keeps old lines)
    for name, line, tiles in (
        ("listed.py", "for visit in tl.range(0, visits, num_stages=LISTED_STAGES):", True),
        ("sparse.py", "for start in range(0, num_bias, SPARSE_BLOCK):", False),
    ):
        other = tmp_path / name
        other.write_text(line + "\n", encoding="utf-8")
        (loop,) = sass.find_loops(copied.format(src=other), num_warps=4, block_size=1024)
        assert (loop.tile_loop, loop.pipelined) == (tiles, True), name


def test_loop_stages_read_from_the_loop_line() -> None:
    """A pipelined loop's depth is its own `num_stages=`: a literal or a constant of
    kernels/library.py, PIPELINE_STAGES where the line names none."""
    from graphsafe_sampler.kernels.library import LISTED_STAGES, PIPELINE_STAGES, SEARCH_STAGES

    model = load_perf_script("kernel_model")
    listed = "for visit in tl.range(0, visits, num_stages=LISTED_STAGES):"
    assert model.loop_stages(listed) == LISTED_STAGES.value == 2
    whole = "for start in tl.range(begin, end, BLOCK_SIZE, num_stages=PIPELINE_STAGES):"
    assert model.loop_stages(whole) == PIPELINE_STAGES.value == 3
    search = "for start in tl.range(0, vocab_size, BLOCK_SIZE, num_stages=SEARCH_STAGES):"
    assert model.loop_stages(search) == SEARCH_STAGES.value == 10
    assert model.loop_stages("for start in tl.range(0, n, 8, num_stages=4):") == 4
    assert model.loop_stages("for start in tl.range(0, n, 8):") == 3


def test_find_loops_reads_the_source_beside_the_kernel(tmp_path: Path) -> None:
    """A cubin from Triton's cache names the file of the checkout that compiled it first
    (the key is the source and its first line, not its path), which may since hold other
    lines: the loop's source comes from the kernel's own directory."""
    compiled_at, here = tmp_path / "other_checkout", tmp_path / "this_checkout"
    compiled_at.mkdir()
    here.mkdir()
    (compiled_at / "kernel.py").write_text("best = 0\n    x = 1\n", encoding="utf-8")
    (here / "kernel.py").write_text("for start in range(0, vocab_size, BLOCK_SIZE):\n")
    text = SASS.format(src=compiled_at / "kernel.py")
    (stale,) = sass.find_loops(text, num_warps=4, block_size=1024)
    assert (stale.source, stale.tile_loop) == ("best = 0", False)
    (loop,) = sass.find_loops(text, num_warps=4, block_size=1024, source_dir=here)
    assert loop.tile_loop and loop.instructions_per_element == 0.5
    # a file the directory does not hold (a helper's, say) is read where the line info says
    (loop,) = sass.find_loops(text, num_warps=4, block_size=1024, source_dir=tmp_path)
    assert loop.source == "best = 0"


def test_find_loops_takes_the_loop_file_a_shared_line_hid(tmp_path: Path) -> None:
    """A back edge on line L right after an instruction inlined from line L of another file
    keeps that file's name in the line info (nvdisasm writes a `//## File` only where the
    line changes): the loop is the kernel file's that holds a loop statement at line L, so
    that the access table's (file, line) finds it."""
    (tmp_path / "helper.py").write_text("x = 1\n    tl.store(p, v)\n", encoding="utf-8")
    (tmp_path / "phase.py").write_text("y = 2\nwhile listed >= 0:\n", encoding="utf-8")
    text = SASS.replace("line 1\n        /*0040*/", "line 2\n        /*0040*/").format(
        src=tmp_path / "helper.py"
    )
    # the kernel's code is in phase.py too: its first instruction, say
    phase = f'\t//## File "{tmp_path / "phase.py"}", line 1\n'
    named = phase + text.split("\n", 1)[1]
    (loop,) = sass.find_loops(named, num_warps=4, block_size=1024, source_dir=tmp_path)
    assert (loop.file, loop.line, loop.source) == ("phase.py", 2, "while listed >= 0:")
    # a file the kernel's line info never names is no candidate: the recorded one stays
    (loop,) = sass.find_loops(text, num_warps=4, block_size=1024, source_dir=tmp_path)
    assert (loop.file, loop.source) == ("helper.py", "tl.store(p, v)")
    # two candidate files: the recorded one stays
    (tmp_path / "other.py").write_text("z = 3\nfor i in range(4):\n", encoding="utf-8")
    other = f'\t//## File "{tmp_path / "other.py"}", line 1\n        /*0030*/'
    both = named.replace("        /*0030*/", other)
    (loop,) = sass.find_loops(both, num_warps=4, block_size=1024, source_dir=tmp_path)
    assert (loop.file, loop.source) == ("helper.py", "tl.store(p, v)")


BRANCHED = """\
.L_x_0:
\t//## File "{src}", line 1
        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;
\t//## File "{src}", line 2
        /*0010*/              @!P1 BRA `(.L_x_1) ;
\t//## File "{src}", line 3
        /*0020*/                   FMUL R3, R3, R1 ;
        /*0030*/                   FMUL R3, R3, R3 ;
.L_x_1:
\t//## File "{src}", line 1
        /*0040*/              @!P0 BRA `(.L_x_0) ;
        /*0050*/                   EXIT ;
"""


def _recount(
    vocab: int, block: int, temperature: float, k: int, p: float, min_p: float, logprobs_k: int
) -> tuple[float, float, float]:
    """bench_rows' three means, recounted a row and a token at a time from the filters'
    definitions (sorted float64 probabilities, no library code)."""
    raw = llm_like_logits(bench_rows.ROWS, vocab, seed=bench_rows.SEED).double()
    tiles = math.ceil(vocab / block)
    sums = [0.0, 0.0, 0.0]
    for row in raw:
        x = row / temperature
        if min_p:
            x = torch.where(x < x.max() + math.log(min_p), float("-inf"), x)
        order = x.argsort(descending=True)
        n = int(torch.isfinite(x).sum())
        if 0 < k < vocab:
            n = min(n, k)
        probs = torch.softmax(x[order[:n]], 0)
        if p < 1.0:  # the smallest prefix holding p: tokens whose mass before them is < p
            n = int(((probs.cumsum(0) - probs) < p).sum())
        kept = order[:n].tolist()
        probs = torch.softmax(x[order[:n]], 0)
        spans = [slice(t * block, (t + 1) * block) for t in range(tiles)]
        scaled_max = [float((row / temperature)[span].max()) for span in spans]
        raw_max = [float(row[span].max()) for span in spans]
        floor = sorted(scaled_max, reverse=True)[k - 1] if 0 < k <= tiles else float("-inf")
        if min_p:
            floor = max(floor, max(scaled_max) + math.log(min_p))
        kth = sorted(raw_max, reverse=True)[logprobs_k - 1] if logprobs_k else math.inf
        reached = [sum(m >= min(float(row[t]), kth) for m in raw_max) for t in kept]
        sums[0] += n
        sums[1] += sum(m >= floor for m in scaled_max)
        sums[2] += sum(float(q) * r for q, r in zip(probs, reached, strict=True))
    return tuple(total / bench_rows.ROWS for total in sums)  # type: ignore[return-value]


@pytest.mark.parametrize(
    "filters",
    [
        (1.0, 8, 1.0, 0.0, 3),
        (0.8, 12, 0.9, 0.05, 5),
        (1.0, 0, 0.9, 0.0, 2),
        (1.3, 0, 1.0, 0.1, 0),
        (0.5, 40, 1.0, 0.2, 1),  # k past the 33 tiles: min_p's floor alone
    ],
    ids=["top_k", "all", "top_p", "min_p", "k_past_tiles"],
)
def test_bench_row_counts_recount_the_kernels_rules(
    filters: tuple[float, int, float, float, int],
) -> None:
    """The survivors and the tiles stage 1 and logprobs read, on the bench's rows,
    against a recount from the filters' definitions."""
    vocab, block = 4099, 128
    counts = bench_rows.bench_row_counts(vocab, block, *filters)
    survivors, candidate, logprobs = _recount(vocab, block, *filters)
    assert counts.survivors == survivors
    assert counts.candidate_tiles == candidate
    assert counts.logprobs_tiles == pytest.approx(logprobs, rel=1e-6)  # float32 vs float64 logits


def test_bench_row_counts_of_greedy_and_top_k_rows() -> None:
    """A greedy row keeps its argmax, which logprobs finds in the K tiles reaching the K-th
    largest tile max; top-k alone keeps k, and stage 1 reads the k tiles at or above its
    k-th largest tile max (the rows' noise leaves no ties)."""
    vocab, block = 8192, 256
    greedy = bench_rows.bench_row_counts(vocab, block, 0.0, 0, 1.0, 0.0, 4)
    assert (greedy.survivors, greedy.logprobs_tiles) == (1.0, 4.0)
    top_k = bench_rows.bench_row_counts(vocab, block, 1.0, 20, 1.0, 0.0, 0)
    assert (top_k.survivors, top_k.candidate_tiles) == (20.0, 20.0)
    # min_p's floor raises top-k's: fewer tiles
    both = bench_rows.bench_row_counts(vocab, block, 1.0, 20, 1.0, 0.05, 0)
    assert both.candidate_tiles < top_k.candidate_tiles and both.survivors < 20.0


def test_logprobs_reads_the_tiles_counted_on_the_bench_rows() -> None:
    """With the step's filters known, the logprobs access model reads a row's counted tiles
    (and its sampled token); without them, the old uniform-rank share."""
    vocab, block, rows = 32768, 1024, 2
    filters = torch.tensor([[0.8, 50.0, 0.9, 0.05]] * rows, dtype=torch.float64)
    args: dict[str, Any] = {"source_ptr": torch.empty(rows, vocab), "chunk": vocab}
    constexprs = {"K": 5, "HAS_TILES": True, "BLOCK_SIZE": block, "SPLIT": False}
    counted = bench_rows.bench_row_counts(vocab, block, 0.8, 50, 0.9, 0.05, 5)
    work = access.WORK["_logprobs_kernel"]({**args, access.FILTERS: filters}, constexprs)
    expected = counted.logprobs_tiles / (vocab // block) + 1 / vocab
    assert work.reads["source_ptr"].tolist() == pytest.approx([expected] * rows)
    survivors = torch.full((rows,), 50.0, dtype=torch.float64)
    old = access.WORK["_logprobs_kernel"]({**args, access.SURVIVORS: survivors}, constexprs)
    assert old.reads["source_ptr"].tolist() == pytest.approx([25 / 32 + 1 / vocab] * rows)


def test_logprobs_floor_makes_the_first_merge_an_insertion() -> None:
    """With the raw tiles' floor a read tile's values enter the top K only at or above it
    (about the K largest, at random columns): the K selections run on the tiles holding
    two of those; without the floor, on the first merge of each program as well."""
    from graphsafe_sampler.kernels import logprobs as k

    vocab, block, rows = 151936, 1024, 2
    filters = torch.tensor([[0.8, 50.0, 0.9, 0.05]] * rows, dtype=torch.float64)
    args: dict[str, Any] = {"source_ptr": torch.empty(rows, vocab), "chunk": 50 * block}
    general = access.source_line(k._logprobs_kernel, "if (above != 1) | ~(full | (floor > ")
    shares = {}
    for tiles in (True, False):
        constexprs = {"K": 5, "HAS_TILES": tiles, "BLOCK_SIZE": block, "SPLIT": True}
        work = access.WORK["_logprobs_kernel"]({**args, access.FILTERS: filters}, constexprs)
        shares[tiles] = work.taken[general]
    floored = shares[True].tolist()
    assert floored == pytest.approx([0.0164] * rows, abs=1e-3)  # P(n >= 2 | n >= 1), 5 / 149
    # the first merge of the 50 tiles walked, and the many holding two new values
    assert bool((shares[False] > 20 * shares[True]).all())


def test_launches_tell_later_ones_the_temperatures_survivors_and_filters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Processing hands on its rows' temperatures; stage 1 then counts the survivors on the
    bench rows with them and hands on the filters; without them, top-k's k."""
    from types import SimpleNamespace

    def launch(name: str, args: dict[str, Any], constexprs: dict[str, Any]) -> Any:
        return SimpleNamespace(kernel=SimpleNamespace(__name__=name), args=args,
                               constexprs=constexprs)  # fmt: skip

    monkeypatch.setattr(context, "unknown_tiles", lambda a, c: torch.zeros(2))
    vocab, slots = 8192, torch.tensor([1, 0])
    told = context.tells_later(
        launch("_process_logits_kernel",
               {"slots_ptr": slots, "temperature_ptr": torch.tensor([0.8, 1.0])}, {}),
        {}, vocab,
    )  # fmt: skip
    t, p, m = (float(torch.tensor(v)) for v in (0.8, 0.9, 0.05))  # the tables' float32
    assert told[bench_rows.TEMPERATURES].tolist() == [1.0, t]
    stage1 = launch(
        "_candidates_kernel",
        {"slots_ptr": slots, "vocab_size": vocab, "top_k_ptr": torch.tensor([20, 50]),
         "top_p_ptr": torch.tensor([0.9, 1.0]), "min_p_ptr": torch.tensor([0.05, 0.0])},
        {"HAS_MIN_P": True, "BLOCK_SIZE": 256},
    )  # fmt: skip
    later = context.tells_later(stage1, told, vocab)
    assert later[bench_rows.FILTERS].tolist() == [[1.0, 50, 1.0, 0.0], [t, 20, p, m]]
    counted = [
        bench_rows.bench_row_counts(vocab, 256, 1.0, 50, 1.0, 0.0, 0).survivors,
        bench_rows.bench_row_counts(vocab, 256, t, 20, p, m, 0).survivors,
    ]
    assert later[access.SURVIVORS].tolist() == counted and counted[1] < 20
    alone = context.tells_later(stage1, {}, vocab)
    assert alone[access.SURVIVORS].tolist() == [50.0, 20.0] and bench_rows.FILTERS not in alone


def test_stage_one_runs_its_filtered_block_and_its_sort_where_its_rows_do() -> None:
    """Stage 1's access table: a row with no filter on skips the whole filtered block (it
    writes nothing but its filters), and only a top-k row within the buffer takes the tile
    maxima's floor (the model's longest path counted both for every row before); of
    those, the sort for the k-th tile max is taken where k maxima of the bench rows reach
    min_p's floor (top-k 50 and min_p 0.05: none do) or min_p is off, and the rows without
    it reduce their chunk's min in the walk."""
    from graphsafe_sampler.kernels import candidates as k

    vocab, rows = 151_936, 4
    args = {
        "slots_ptr": torch.arange(rows), "vocab_size": vocab, "buffer_size": 128,
        "chunk": 16 * 1024, "top_k_ptr": torch.tensor([-1, 50, -1, 20]),
        "top_p_ptr": torch.tensor([1.0, 0.9, 0.9, 1.0]),
        "min_p_ptr": torch.tensor([0.0, 0.05, 0.0, 0.0]),
        bench_rows.TEMPERATURES: torch.tensor([1.0, 0.8, 1.0, 1.0], dtype=torch.float64),
    }  # fmt: skip
    constexprs = {"HAS_MIN_P": True, "HAS_TILE_MAX": True, "BLOCK_SIZE": 1024, "PARTIAL": 32}
    work = access.WORK["_candidates_kernel"](args, constexprs)
    taken = {line: fraction.tolist() for line, fraction in work.taken.items()}
    assert taken[access.source_line(k._candidates_kernel, "if k_on | p_on |")] == [0, 1, 1, 1]
    assert taken[access.source_line(k._candidates_kernel, "if use_buffer & k_on:")] == [
        0, 1, 0, 1,
    ]  # fmt: skip
    assert taken[access.source_line(k._tile_floor, "if tl.sum(")] == [0, 0, 0, 1]
    assert taken[access.source_line(k._candidates_kernel, "if not bounded:")] == [1, 1, 1, 0]


def test_deferred_rows_are_read_from_the_source_and_divided_where_they_scale() -> None:
    """A reader of deferred rows (DEFER): its logits reads split between the buffer and the
    source by the rows processing deferred, and its divisions
    (`processed_rows.processed`, `processed_tile`) taken by every row
    that scales, deferred or written (the temperature is the readers'), the walk's IEEE
    fallback in one of a chunk's tiles."""
    from graphsafe_sampler.kernels import processed_rows as on_read

    def reader(a: dict[str, Any], c: dict[str, Any]) -> Any:
        return access.Work(reads={"logits_ptr": torch.full((4,), 0.5, dtype=torch.float64)})

    work = access._reading_deferred(reader)
    args = {
        access.DEFERRED: torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64),
        # scaling, at 1, at 0.7 but written, greedy
        bench_rows.TEMPERATURES: torch.tensor([0.7, 1.0, 0.7, 0.0], dtype=torch.float64),
        "chunk": 4096,
    }
    done = work(args, {"DEFER": True, "BLOCK_SIZE": 1024})
    assert done.reads["logits_ptr"].tolist() == [0.0, 0.0, 0.5, 0.0]
    assert done.reads["source_ptr"].tolist() == [0.5, 0.5, 0.0, 0.5]
    for fn in (on_read.processed, on_read.processed_tile):
        assert done.taken[access.source_line(fn, "if (divisor != 0.0)")].tolist() == [1, 0, 1, 0]
    fallback = done.taken[access.source_line(on_read.processed_tile, "if ~fast")]
    assert fallback.tolist() == [0.25, 0, 0.25, 0]
    # without DEFER the buffer holds every row, and nothing divides
    plain = work(args, {"BLOCK_SIZE": 1024})
    assert plain.reads["source_ptr"].tolist() == [0.0] * 4
    assert all(float(f.sum()) == 0.0 for f in plain.taken.values())


def test_processing_reads_the_count_bytes_of_the_words_the_output_words_mark() -> None:
    """With the output words (HAS_OUTPUT_WORDS, a bit a 32-token word), processing's dense
    pass reads a row's count bytes in the words its slot's bits mark only: their share of
    the slot's words, and one row of the output words; without them, every count byte. A
    row without a penalty reads neither."""
    slots, vocab, words = torch.tensor([0, 1, 2]), 4096, 128
    mask = torch.zeros(3, words // 32, dtype=torch.int32)
    mask[0, 0] = -1  # a quarter of slot 0's words hold an output (the first int32's 32)
    mask[1, 3] = -(2**31)  # one word (bit 31 of the last int32) of slot 1's
    args = {
        "slots_ptr": slots, "vocab_size": vocab, "repetition_ptr": torch.tensor([1.2, 1.0, 1.0]),
        "frequency_ptr": torch.tensor([0.0, 0.5, 0.0]), "presence_ptr": torch.zeros(3),
        "temperature_ptr": torch.ones(3), "num_generated_ptr": torch.zeros(3, dtype=torch.int32),
        "min_tokens_ptr": torch.zeros(3, dtype=torch.int32),
        "stop_ids_ptr": torch.zeros(3, 4, dtype=torch.int32),
        "bias_ids_ptr": torch.zeros(3, 8, dtype=torch.int32), "bias_values_ptr": torch.zeros(3, 8),
        "overflow_token_ptr": torch.full((3, 3), -1, dtype=torch.int32), "num_overflow": 2,
        "output_words_ptr": mask,
    }  # fmt: skip
    constexprs = {
        "HAS_GRAMMAR": False, "HAS_DRAFTS": False, "HAS_BAD_WORDS": False, "HAS_TILE_MAX": False,
        "HAS_RAW_TILES": False, "GREEDY_BELOW": 1e-5, "BLOCK_SIZE": 1024, "SPARSE_BLOCK": 128,
        "BAD_BLOCK": 128,
    }  # fmt: skip
    work = access.WORK["_process_logits_kernel"]
    masked = work(args, {**constexprs, "HAS_OUTPUT_WORDS": True})
    assert masked.reads["counts_ptr"].tolist() == [0.25, 1 / words, 0.0]
    assert masked.reads["output_words_ptr"].tolist() == [1.0, 1.0, 0.0]
    plain = work(args, constexprs)
    assert plain.reads["counts_ptr"].tolist() == [1.0, 1.0, 0.0]
    assert plain.reads["output_words_ptr"].tolist() == [0.0, 0.0, 0.0]


def test_a_top_k_past_the_chunks_lists_is_searched() -> None:
    """The merged buffer holds at most the chunks' lists (splits x PARTIAL): a top-k row
    whose k lies past them is searched, not covered, however large the buffer."""
    args = {
        "slots_ptr": torch.tensor([0, 1]), "vocab_size": 151_936, "buffer_size": 128,
        "top_k_ptr": torch.tensor([50, 20]), "top_p_ptr": torch.tensor([0.9, 1.0]),
    }  # fmt: skip
    constexprs = {"HAS_MIN_P": False, "PARTIAL": 16}
    for splits, covered in ((3, [0.0, 1.0]), (4, [1.0, 1.0])):  # 48 < 50 <= 64
        rows = access._top_k_top_p_rows({**args, "splits": splits}, constexprs)
        assert rows["covered"].tolist() == covered, splits
        assert (rows["passes"] > 0).tolist() == [c == 0.0 for c in covered], splits
    # stage 1 knows its chunks by their width: 3 chunks of 51,200 columns
    rows = access._top_k_top_p_rows({**args, "chunk": 50 * 1024}, constexprs)
    assert rows["covered"].tolist() == [0.0, 1.0]


def test_record_tiles_follows_the_record_count_of_a_shuffled_row() -> None:
    """The tiles holding a new one of the k largest so far, in random order, against a
    simulation; the first tile always does."""
    gen = torch.Generator().manual_seed(0)
    tiles, block, k = 75, 64, 5
    merged = multi = 0
    for _ in range(200):
        x = torch.rand(tiles * block, generator=gen).view(tiles, block)
        seen = torch.empty(0)
        for tile in x:
            new = int((tile > seen.topk(k).values[-1]).sum()) if seen.numel() >= k else block
            merged += new >= 1
            multi += new >= 2
            seen = torch.cat([seen, tile])
    simulated = merged / (200 * tiles)
    assert float(access.record_tiles(k, tiles)) == pytest.approx(simulated, rel=0.15)
    assert float(access.multi_record_share(k, tiles)) == pytest.approx(multi / merged, rel=0.15)
    assert float(access.record_tiles(50, 1)) == 1.0


def test_a_weighed_branch_counts_its_block_by_its_fraction(tmp_path: Path) -> None:
    """The `if` on line 2 jumps over 2 of the loop's 5 instructions: run half the time, the
    body costs 4 a iteration; a branch the access table does not name counts as taken."""
    src = tmp_path / "kernel.py"
    src.write_text("for start in range(0, vocab_size, BLOCK_SIZE):\n", encoding="utf-8")
    (loop,) = sass.find_loops(BRANCHED.format(src=src), num_warps=4, block_size=1024)
    assert loop.instructions == 5 and loop.branches == [("kernel.py", 2, 0x20, 0x30)]
    assert loop.instructions_with({("kernel.py", 2): 0.5}) == pytest.approx(4.0)
    assert loop.instructions_with({("kernel.py", 2): 0.0}) == pytest.approx(3.0)
    assert loop.instructions_with({("other.py", 2): 0.0}) == pytest.approx(5.0)


IF_ELSE = """\
.L_x_0:
\t//## File "{src}", line 1
        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;
\t//## File "{src}", line 2
        /*0010*/              @!P1 BRA `(.L_x_1) ;
\t//## File "{src}", line 3
        /*0020*/                   FMUL R3, R3, R1 ;
        /*0030*/                   BRA `(.L_x_2) ;
.L_x_1:
\t//## File "{src}", line 5
        /*0040*/                   FMUL R3, R3, R3 ;
        /*0050*/                   FMUL R3, R3, R3 ;
        /*0060*/                   FMUL R3, R3, R3 ;
.L_x_2:
\t//## File "{src}", line 1
        /*0070*/              @!P0 BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
"""


def test_an_else_block_counts_by_the_rest_of_the_fraction(tmp_path: Path) -> None:
    """An if/else: the then-block (2 instructions, ending with the jump over the else) runs
    in the `if`'s fraction of the iterations, the else-block (3) in the rest."""
    src = tmp_path / "kernel.py"
    src.write_text("for start in range(0, vocab_size, BLOCK_SIZE):\n", encoding="utf-8")
    (loop,) = sass.find_loops(IF_ELSE.format(src=src), num_warps=4, block_size=1024)
    assert loop.instructions == 8
    assert loop.branches == [("kernel.py", 2, 0x20, 0x30)]
    assert loop.else_blocks == [("kernel.py", 2, 0x40, 0x60)]
    assert loop.instructions_with({("kernel.py", 2): 1.0}) == pytest.approx(5.0)
    assert loop.instructions_with({("kernel.py", 2): 0.0}) == pytest.approx(6.0)
    assert loop.instructions_with({("kernel.py", 2): 0.25}) == pytest.approx(3 + 0.5 + 2.25)
    assert loop.instructions_with({}) == pytest.approx(8.0)  # unnamed: both, an upper bound


def test_an_if_else_inlined_from_another_file_keeps_the_loops_file(tmp_path: Path) -> None:
    """The if/else of a helper inlined into the loop (the sampling walk's `noise.race_tile`)
    is named by the helper's file, and the loop still by the kernel's: the loop's file once
    took the else-block's, so the access table's walk of it matched no loop."""
    src, helper = tmp_path / "kernel.py", tmp_path / "helper.py"
    src.write_text("for start in range(0, vocab_size, BLOCK_SIZE):\n", encoding="utf-8")
    helper.write_text("x = 1\nif y:\n", encoding="utf-8")
    lines = IF_ELSE.format(src=src).splitlines(keepends=True)
    # the branch, the then-block and the else-block from the helper's lines 2, 3 and 5
    for i, text in enumerate(lines):
        if any(f"line {n}" in text for n in (2, 3, 5)):
            lines[i] = text.replace(str(src), str(helper))
    (loop,) = sass.find_loops("".join(lines), num_warps=4, block_size=1024)
    assert (loop.file, loop.line, loop.tile_loop) == ("kernel.py", 1, True)
    assert loop.else_blocks == [("helper.py", 2, 0x40, 0x60)]


INVERTED_IF = """\
.L_x_0:
\t//## File "{src}", line 1
        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;
\t//## File "{src}", line {branch}
        /*0010*/               @P1 BRA `(.L_x_1) ;
\t//## File "{src}", line 5
        /*0020*/                   FMUL R3, R3, R3 ;
        /*0030*/                   FMUL R3, R3, R3 ;
        /*0040*/                   FMUL R3, R3, R3 ;
.L_x_1:
\t//## File "{src}", line 3
        /*0050*/                   FMUL R3, R3, R1 ;
\t//## File "{src}", line 1
        /*0060*/              @!P0 BRA `(.L_x_0) ;
        /*0070*/                   EXIT ;
"""


def test_a_branch_over_the_else_block_counts_it_by_the_rest(tmp_path: Path) -> None:
    """The compiler may lay an if/else out with the else-block first, jumped over where the
    `if` holds, and the then-block at the target (a tail another `if` shares): the block
    jumped over then runs in the rest of the iterations, not the `if`'s fraction (the
    sampling walk's screen was counted as its cut tiles' few-survivors path)."""
    src = tmp_path / "kernel.py"
    src.write_text(
        "for start in range(0, vocab_size, BLOCK_SIZE):\n    if few:\n        a = 1\n"
        "    else:\n        b = 2\n",
        encoding="utf-8",
    )
    text = INVERTED_IF.format(src=src, branch=2)
    (loop,) = sass.find_loops(text, num_warps=4, block_size=1024, source_dir=tmp_path)
    assert loop.branches == []
    assert loop.else_blocks == [("kernel.py", 2, 0x20, 0x40)]
    assert loop.instructions_with({("kernel.py", 2): 1.0}) == pytest.approx(4.0)
    assert loop.instructions_with({("kernel.py", 2): 0.0}) == pytest.approx(7.0)


def test_the_then_block_after_an_else_laid_out_first_counts_by_the_fraction(
    tmp_path: Path,
) -> None:
    """An else-block laid out first that ends with a jump over the then-block at its
    target: the then-block (2 instructions) runs in the `if`'s fraction, the else-block (3,
    its jump included) in the rest (logprobs' top-K update was counted the other way)."""
    src = tmp_path / "kernel.py"
    src.write_text(
        "for start in range(0, vocab_size, BLOCK_SIZE):\n    if few:\n        a = 1\n"
        "    else:\n        b = 2\n",
        encoding="utf-8",
    )
    text = (
        INVERTED_IF.format(src=src, branch=2)
        .replace("        /*0040*/                   FMUL R3, R3, R3 ;\n",
                 "        /*0040*/                   BRA `(.L_x_2) ;\n")
        .replace("        /*0050*/                   FMUL R3, R3, R1 ;\n",
                 "        /*0050*/                   FMUL R3, R3, R1 ;\n"
                 "        /*0060*/                   FMUL R3, R3, R1 ;\n.L_x_2:\n")
        .replace("/*0060*/              @!P0", "/*0070*/              @!P0")
        .replace("/*0070*/                   EXIT", "/*0080*/                   EXIT")
    )  # fmt: skip
    (loop,) = sass.find_loops(text, num_warps=4, block_size=1024, source_dir=tmp_path)
    assert loop.else_blocks == [("kernel.py", 2, 0x20, 0x40)]
    assert loop.branches == [("kernel.py", 2, 0x50, 0x60)]
    assert loop.instructions_with({("kernel.py", 2): 1.0}) == pytest.approx(5.0)  # of 8
    assert loop.instructions_with({("kernel.py", 2): 0.0}) == pytest.approx(6.0)


def test_a_branch_on_a_blocks_last_line_is_the_next_ifs(tmp_path: Path) -> None:
    """A conditional branch whose line info is the statement before an `if` (the compiler
    folded that block's end into the `if`'s branch) is that `if`'s, comments skipped."""
    src = tmp_path / "kernel.py"
    src.write_text(
        "for start in range(0, vocab_size, BLOCK_SIZE):\n    x = 1\n    # why\n"
        "    if y:\n        z = 2\n",
        encoding="utf-8",
    )
    text = INVERTED_IF.format(src=src, branch=2).replace("line 3", "line 2")
    (loop,) = sass.find_loops(text, num_warps=4, block_size=1024, source_dir=tmp_path)
    assert loop.branches == [("kernel.py", 4, 0x20, 0x40)]


def _sass(body: str) -> str:
    """A kernel's SASS as nvdisasm prints it, from `offset: instruction` lines (a label
    line as `.L_x_N:`), every instruction on line 1 of `src`."""
    lines = ['\t//## File "{src}", line 1']
    for entry in body.strip().splitlines():
        entry = entry.strip()
        if entry.startswith(".L"):
            lines.append(entry)
        else:
            offset, instruction = entry.split(":", 1)
            lines.append(f"        /*{int(offset, 16):04x}*/   {instruction.strip()} ;")
    return "\n".join(lines) + "\n"


def test_straight_line_counts_the_rounds_a_warp_waits_for(tmp_path: Path) -> None:
    """Loads whose addresses are ready together are one round; a load whose address is a
    loaded value is the next; in-order issue makes a load issued after a use of a loaded
    value wait for it too; 64-bit values are register pairs."""
    src = tmp_path / "kernel.py"
    src.write_text("x = 1\n", encoding="utf-8")

    def rounds(body: str) -> chain.StraightLine:
        text = _sass(body).format(src=src)
        return chain.straight_line(text, sass.find_loops(text, 4, 1024))

    independent = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: LDG.E R4, desc[UR4][R12.64]
        20: FADD R6, R2, R4
        30: STG.E desc[UR4][R10.64], R6
        40: EXIT
    """
    assert rounds(independent) == chain.StraightLine(1, 5)
    chased = """
        00: LDG.E.64 R2, desc[UR4][R10.64]
        10: LDG.E R4, desc[UR4][R2.64]
        20: LEA R6, P0, R4, UR6, 0x2
        30: LEA.HI.X R7, R4, UR7, RZ, 0x2, P0
        40: LDG.E R8, desc[UR4][R6.64]
        50: STG.E desc[UR4][R10.64], R8
        60: EXIT
    """
    assert rounds(chased).load_rounds == 3  # the slot, its table entry, then the logit there
    # a load nothing waits for is no round (the store above is what waits for the third)
    assert rounds(chased.replace("50: STG.E desc[UR4][R10.64], R8", "50: NOP")).load_rounds == 2
    stalled = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: FADD R3, R2, R2
        20: LDG.E R4, desc[UR4][R12.64]
        30: FADD R5, R4, R3
        40: EXIT
    """
    assert rounds(stalled).load_rounds == 2  # the second load issues after the FADD waited
    assert rounds(stalled.replace("10: FADD R3, R2, R2", "10: FADD R3, R9, R9")).load_rounds == 1
    # a compare on a loaded value guards a load: the predicate carries the round
    guarded = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: ISETP.NE.AND P0, PT, R2, RZ, PT
        20: @P0 LDG.E R4, desc[UR4][R12.64]
        30: STG.E desc[UR4][R10.64], R4
        40: EXIT
    """
    assert rounds(guarded).load_rounds == 2


def test_straight_line_takes_the_longest_path_and_leaves_out_what_never_runs(
    tmp_path: Path,
) -> None:
    """Paths meet at a forward branch's target with the later round of each; a tile loop's
    loads add no round (its formula charges them) nor instructions, a tile loop no row
    walks is left out with the `if` around it, and so is the block of an `if` no row takes."""
    src = tmp_path / "kernel.py"
    src.write_text("for start in range(0, vocab_size, BLOCK_SIZE):\nif redo:\n", encoding="utf-8")
    skipped_load = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: @P1 BRA `(.L_x_1)
        20: LDG.E R4, desc[UR4][R2.64]
        30: STG.E desc[UR4][R10.64], R4
        .L_x_1:
        40: EXIT
    """
    text = _sass(skipped_load).format(src=src)
    assert chain.straight_line(text, sass.find_loops(text, 4, 1024)) == chain.StraightLine(2, 5)
    # an `if` the access table takes no row through: its block (0x20-0x30) is left out, and
    # nothing else waits for the first load; an `if` on another line is still taken
    untaken = chain.straight_line(text, [], untaken={("kernel.py", 1)})
    assert untaken == chain.StraightLine(0, 3)
    assert chain.straight_line(text, [], untaken={("kernel.py", 2)}) == chain.StraightLine(2, 5)
    # a branch over an EXIT jumps over no `if` block: kept
    exiting = skipped_load.replace("30: STG.E desc[UR4][R10.64], R4", "30: EXIT")
    text = _sass(exiting).format(src=src)
    assert chain.straight_line(text, [], untaken={("kernel.py", 1)}).load_rounds == 1
    # an untaken `if` that ends the program, compiled as an EXIT guarded by its negation:
    # every program exits there (the rest is left out); at another line the rest is kept
    early_exit = skipped_load.replace("10: @P1 BRA `(.L_x_1)", "10: @P1 EXIT")
    text = _sass(early_exit).format(src=src)
    assert chain.straight_line(text, [], untaken={("kernel.py", 1)}) == chain.StraightLine(0, 2)
    assert chain.straight_line(text, [], untaken={("kernel.py", 2)}) == chain.StraightLine(2, 5)
    tile_loop = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: @P1 BRA `(.L_x_1)
        .L_x_0:
        20: LDG.E R4, desc[UR4][R2.64]
        30: FADD R6, R6, R4
        40: @P2 BRA `(.L_x_0)
        .L_x_1:
        50: STG.E desc[UR4][R10.64], R6
        60: EXIT
    """
    text = _sass(tile_loop).format(src=src)
    (loop,) = sass.find_loops(text, 4, 1024)
    assert loop.tile_loop and (loop.head, loop.end) == (0x20, 0x40)
    # walked: its load adds no round, its 3 instructions are the formula's
    assert chain.straight_line(text, [loop]) == chain.StraightLine(1, 4)
    # walked by no row: the block of the branch at 0x10 (0x20-0x40) is left out, and with
    # it the only wait for the first load
    unwalked = {(loop.file, loop.line)}
    assert chain.straight_line(text, [loop], unwalked) == chain.StraightLine(0, 4)
    redo = tile_loop.replace("00: LDG.E R2, desc[UR4][R10.64]", "00: MOV R2, R3")
    redo = redo.replace(
        "50: STG.E desc[UR4][R10.64], R6",
        "50: LDG.E R8, desc[UR4][R6.64]\n58: STG.E desc[UR4][R10.64], R8",
    )
    text = _sass(redo).format(src=src)
    # R6 comes out of the loop at its inputs' round (0): the load after it is round 1 ...
    assert chain.straight_line(text, [loop]).load_rounds == 1
    # ... and a program that never runs the loop counts none of its instructions
    assert chain.straight_line(text, [loop], unwalked).instructions == 5
    # the only block around an unwalked loop ends the program (an `if` whose else-block
    # lies after it): no `if` guarding the loop, which is left out alone, not the path
    # through the program's end (left out, the else-block's 1 round was the longest)
    ending = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: @P1 BRA `(.L_x_2)
        20: LDG.E R4, desc[UR4][R2.64]
        .L_x_0:
        30: LDG.E R6, desc[UR4][R4.64]
        40: @P3 BRA `(.L_x_0)
        50: STG.E desc[UR4][R10.64], R4
        60: EXIT
        .L_x_2:
        70: FADD R8, R2, R2
        80: EXIT
    """
    text = _sass(ending).format(src=src)
    (loop,) = sass.find_loops(text, 4, 1024)
    assert loop.tile_loop and (loop.head, loop.end) == (0x30, 0x40)
    unwalked = {(loop.file, loop.line)}
    assert chain.straight_line(text, [loop], unwalked) == chain.StraightLine(2, 5)


def test_a_counted_loop_is_left_to_its_iterations(tmp_path: Path) -> None:
    """A loop that is not a tile loop counts once on the straight-line path (its load one
    round, its body's instructions once), unless the access table counts its iterations
    (`work.Work.trips`, sampling's race over the lists): then it is left out as a tile
    loop is, for launch_time to charge it per iteration."""
    src = tmp_path / "kernel.py"
    src.write_text("for start in range(0, buffer_len, RACE_BLOCK):\n", encoding="utf-8")
    race = """
        00: MOV R2, R3
        .L_x_0:
        10: LDG.E R4, desc[UR4][R2.64]
        20: FMNMX R6, R6, R4, !PT
        30: @P2 BRA `(.L_x_0)
        40: STG.E desc[UR4][R10.64], R6
        50: EXIT
    """
    text = _sass(race).format(src=src)
    (loop,) = sass.find_loops(text, 4, 1024)
    assert not loop.tile_loop and (loop.head, loop.end) == (0x10, 0x30)
    assert chain.straight_line(text, [loop]) == chain.StraightLine(1, 6)
    counted = {(loop.file, loop.line)}
    assert chain.straight_line(text, [loop], counted=counted) == chain.StraightLine(0, 3)


def test_an_if_every_program_takes_leaves_its_else_block_out(tmp_path: Path) -> None:
    """An `if` whose block every program runs (`always`: sampling's `if covered:` where
    every row is covered): its else-block, which the then-block's last branch jumps over,
    is left out with its loads, an early exit in it included; a block ending the program
    (an unguarded EXIT) is a cold path, kept."""
    src = tmp_path / "kernel.py"
    src.write_text("if covered:\n", encoding="utf-8")
    if_else = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: @!P1 BRA `(.L_x_1)
        20: FADD R6, R2, R2
        30: BRA `(.L_x_2)
        .L_x_1:
        40: ATOMG.E.ADD.STRONG.GPU PT, R4, desc[UR4][R2.64], R5
        50: @P0 EXIT
        60: LDG.E R6, desc[UR4][R4.64]
        .L_x_2:
        70: STG.E desc[UR4][R10.64], R6
        80: EXIT
    """
    text = _sass(if_else).format(src=src)
    where = {("kernel.py", 1)}
    assert chain.straight_line(text, []).load_rounds == 3  # the arrival, then the merge
    assert chain.straight_line(text, [], always=where) == chain.StraightLine(1, 6)
    cold = if_else.replace("50: @P0 EXIT", "50: NOP").replace(
        "60: LDG.E R6, desc[UR4][R4.64]",
        "60: LDG.E R6, desc[UR4][R4.64]\n64: STG.E desc[UR4][R10.64], R6\n68: EXIT",
    )
    assert chain.straight_line(_sass(cold).format(src=src), [], always=where).load_rounds == 3


def test_straight_line_merges_paths_and_follows_divergence_checks(tmp_path: Path) -> None:
    """At a branch target each register holds its later round of the two paths (the taken
    one's here); BRA.DIV, a divergence check, branches on an operand and falls through;
    only the innermost `if` around an unwalked tile loop is left out, not the block
    holding it."""
    src = tmp_path / "kernel.py"
    src.write_text("for start in range(0, vocab_size, BLOCK_SIZE):\n", encoding="utf-8")

    def rounds(body: str, unwalked: bool = False) -> int:
        text = _sass(body).format(src=src)
        loops = sass.find_loops(text, 4, 1024)
        skip = {(loop.file, loop.line) for loop in loops} if unwalked else set()
        return chain.straight_line(text, loops, skip).load_rounds

    # taken, R2 is the loaded value (round 1); falling through, a constant
    merged = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: @P0 BRA `(.L_x_1)
        20: MOV R2, RZ
        .L_x_1:
        30: LDG.E R4, desc[UR4][R2.64]
        40: STG.E desc[UR4][R10.64], R4
        50: EXIT
    """
    assert rounds(merged) == 2
    # the divergence check's fall-through is the path with the loads
    divergent = """
        00: LDG.E R2, desc[UR4][R10.64]
        10: BRA.DIV UR4, `(.L_x_1)
        20: LDG.E R4, desc[UR4][R2.64]
        30: STG.E desc[UR4][R10.64], R4
        40: EXIT
        .L_x_1:
        50: EXIT
    """
    assert rounds(divergent) == 2
    nested = """
        00: @P0 BRA `(.L_x_9)
        10: LDG.E R2, desc[UR4][R10.64]
        20: @P1 BRA `(.L_x_8)
        .L_x_0:
        30: LDG.E R4, desc[UR4][R12.64]
        40: @P2 BRA `(.L_x_0)
        .L_x_8:
        50: STG.E desc[UR4][R10.64], R2
        .L_x_9:
        60: EXIT
    """
    # the outer `if`'s load and store stay: only the loop's own `if` is left out
    assert rounds(nested, unwalked=True) == 1


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The model at rows {1, 3}, V = 4,099, both cases, from the command line (~15 s)."""
    if not _ptxas():
        pytest.skip("this triton wheel ships no CUDA backend (ptxas)")

    def make(path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        command = [sys.executable, str(PERF / "kernel_model.py"), "--vocab", str(VOCAB),
                   "--json", str(path), "--rows", *map(str, ROWS), "--cases", *CASES]  # fmt: skip
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "estimate" in proc.stdout.lower()

    # once for all of pytest-xdist's workers that run this module's tests
    path = made_once(tmp_path_factory, "kernel_model.json", make)
    result: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return result


def test_model_has_every_case_and_rows(model: dict[str, Any]) -> None:
    assert model["schema"] == 1 and model["estimate"] is True and model["assumptions"]
    for case in CASES:
        assert set(model["cases"][case]) == {str(b) for b in ROWS}
        for data in model["cases"][case].values():
            step = data["step"]
            assert isinstance(step["launches"], int)
            assert 1 < step["logits_passes"] < math.inf
            assert 0 < step["est_us"] < math.inf


def test_step_counts_triton_and_kernel_launching_aten_ops(model: dict[str, Any]) -> None:
    for case in CASES:
        for data in model["cases"][case].values():
            launches, step = data["launches"], data["step"]
            triton = [e["name"] for e in launches if e["kind"] == "triton"]
            aten = [e for e in launches if e["kind"] == "aten"]
            assert step["launches"] == len(triton) + len(aten) == len(launches)
            # the budget, with rows split as on an H200: the split rows are merged by
            # their last programs, so a step is its 4 ops' 5 kernels (top-k/top-p is two)
            assert step["launches"] <= 8, triton
            assert len(triton) == (5 if case == "all" else 4), triton
            assert (step["triton_launches"], step["aten_launches"]) == (len(triton), len(aten))
            assert {
                "_process_logits_kernel", "_candidates_kernel", "_top_k_top_p_kernel",
                "_sample_kernel",
            } <= set(triton)  # fmt: skip
            assert ("_logprobs_kernel" in triton) == (case == "all")
            # no copy of the logits, no glue: the step is its kernels
            assert aten == []
            process = next(e for e in launches if e["name"] == "_process_logits_kernel")
            if case == "all":  # a read and a write, and sparse stores
                assert 2.0 <= process["logits_passes"] < 2.1
            else:  # rows no step changes but a temperature: a read, unwritten (deferred)
                assert 1.0 <= process["logits_passes"] < 1.01
            assert "aten.empty.memory_format" in step["aten_ops_without_kernel"]


def test_step_estimate_grows_with_rows(model: dict[str, Any]) -> None:
    for case in CASES:
        by_rows = model["cases"][case]
        times = [by_rows[str(b)]["step"]["est_us"] for b in ROWS]
        assert times == sorted(times) and times[0] < times[-1]


def test_a_covered_row_races_in_its_parameters_round(model: dict[str, Any]) -> None:
    """Every row of these cases is covered: its racing program loads the lists' first ranks
    with the row's records (kernels/row_params.py: its key, as processing resolved it from
    the slot), so it waits two rounds (the records, the covered flag and the lists; the
    commit's count byte and ring entry), not a third for the slot's parameters nor a fourth
    for the lists after the row's key. Stage 1 and the cut kernel load the rows' filters
    from the records too: one round each, not a second after the slot."""
    for case in CASES:
        for data in model["cases"][case].values():
            launches = {e["name"]: e for e in data["launches"]}
            sample = launches["_sample_kernel"]
            assert sample["constexprs"]["HAS_BUFFER"] and sample["constexprs"]["KEYED"]
            assert sample["load_rounds"] == 2, sample
            assert launches["_candidates_kernel"]["constexprs"]["RESOLVED"]
            assert launches["_candidates_kernel"]["load_rounds"] == 1
            assert launches["_top_k_top_p_kernel"]["load_rounds"] == 1


def test_every_launch_has_its_occupancy_and_hot_loop(model: dict[str, Any]) -> None:
    from graphsafe_sampler.kernels import logits_processing, logprobs, sampling, top_k_top_p

    # the occupancy each split kernel's row_splits fills waves with, at most the compiled one
    occupancy = {
        "_process_logits_kernel": logits_processing.process_splits.ctas_per_sm,
        "_candidates_kernel": top_k_top_p.top_k_top_p_splits.ctas_per_sm,
        "_sample_kernel": sampling.sample_splits.ctas_per_sm,
        "_logprobs_kernel": logprobs.logprobs_splits.ctas_per_sm,
        # one program a row, unsplit, capped for 3 (the floor is 2 on every hot
        # kernel; at 1,024-element tiles and 8 warps it held 1)
        "_top_k_top_p_kernel": top_k_top_p.CUT_CTAS_PER_SM,
    }
    for case in CASES:
        for data in model["cases"][case].values():
            for e in data["launches"]:
                if e["kind"] != "triton":
                    continue
                assert e["registers"] > 0 and e["ctas_per_sm"] >= 1 and e["waves"] >= 1
                assert e["ctas_per_sm"] >= occupancy.get(e["name"], 1), e["name"]
                assert e["programs"] == math.prod(e["grid"]) and e["access_model"] == "table"
                walked = [
                    loop for loop in e["loops"] if loop["tile_loop"] and loop["walks_per_row"] > 0
                ]
                if e["name"] == "_sample_kernel" and e["constexprs"]["HAS_BUFFER"]:
                    # every row of these cases is covered (top-k 50, within the buffer): raced
                    # over stage 1's lists, its logits unread
                    # (in the raw modes, each token's raw value for logprobs: 4 bytes a row)
                    assert e["logits_passes"] < 1e-3 and not walked, e["loops"]
                    # the race: its first block of ranks on the straight-line path; the
                    # later ranks' pipelined loop, where a list can hold more kept logits
                    # than a block has ranks, charged by the share of rows that do
                    later = [loop for loop in e["loops"] if "for first in" in loop["source"]]
                    if e["constexprs"]["ONE_BLOCK"]:  # every rank in the first block
                        assert not any(loop["trips"] for loop in later), later
                    else:
                        (race,) = later
                        assert race["pipelined"] and 0 <= race["trips"] < 1, race
                elif e["name"] in VOCAB_KERNELS:
                    assert walked and all(
                        loop["instructions_per_element"] > 0 for loop in walked
                    ), e["loops"]
                    # the walk is software-pipelined: its loads are copied asynchronously
                    assert all(loop["pipelined"] for loop in walked), e["loops"]
                    assert e["serial_us"] > 0
