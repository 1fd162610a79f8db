"""The machine of the estimate (an H200 by default; the H100s for a GPU check run on one) and
the formulas of perf/kernel_model.py's docstring: CTAs per SM from a variant's registers,
warps and shared memory, and the time of a launch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Gpu:
    """The machine the estimate is for, each figure with its source (perf/README.md)."""

    name: str = "NVIDIA H200 SXM (sm_90)"
    hbm_peak_tbps: float = 4.8  # NVIDIA's H200 datasheet: HBM3e, 4.8 TB/s
    hbm_fraction: float = 0.8  # what streaming kernels reach of peak: copies reach 80-90 %
    sms: int = 132  # H200 SXM (GH100 with 132 SMs enabled)
    clock_ghz: float = 1.98  # GH100's maximum boost clock (sustained clocks can be lower)
    issue_per_clock: int = 4  # 4 sub-partitions an SM, each issuing 1 warp-instruction a clock
    memory_latency_ns: float = 800.0  # one unpipelined global load, HBM, under load
    launch_overhead_us: float = 2.0  # one kernel node replayed in a CUDA graph
    registers_per_sm: int = 65_536
    register_granule: int = 256  # registers are allocated per warp in units of 256
    shared_per_sm: int = 228 * 1024
    shared_reserved_per_cta: int = 1024  # the driver reserves 1 KB of shared memory per CTA
    max_ctas_per_sm: int = 32
    max_warps_per_sm: int = 64

    @property
    def bytes_per_us(self) -> float:
        return self.hbm_peak_tbps * self.hbm_fraction * 1e6


H200 = Gpu()
# NVIDIA's H100 datasheet: the SXM5 part has the H200's SMs and clock with HBM3 at 3.35 TB/s;
# the PCIe part 114 SMs, 1.755 GHz at most and HBM2e at 2.0 TB/s. Both are compute
# capability 9.0: the occupancy limits are the H200's.
H100_SXM = Gpu(name="NVIDIA H100 SXM (sm_90)", hbm_peak_tbps=3.35)
H100_PCIE = Gpu(name="NVIDIA H100 PCIe (sm_90)", hbm_peak_tbps=2.0, sms=114, clock_ghz=1.755)
GPUS = {"h200": H200, "h100-sxm": H100_SXM, "h100-pcie": H100_PCIE}
"""The machines `perf/kernel_model.py --gpu` names."""


def gpu_for_device(name: str, sms: int) -> Gpu:
    """The figures for a CUDA device, by its name (`torch.cuda.get_device_name`: "NVIDIA H100
    80GB HBM3" is the SXM part) and its SM count (`multi_processor_count`), which replaces
    the preset's where they differ (a MIG slice, another bin of the die). A device none of
    the presets names takes the H200's figures, and its name says so."""
    lower = name.lower()
    if "h200" in lower:
        gpu = H200
    elif "h100" in lower and "pcie" in lower:
        gpu = H100_PCIE
    elif "h100" in lower:
        gpu = H100_SXM
    else:
        gpu = replace(H200, name=f"{name} (with the H200's figures)")
    if sms != gpu.sms:
        gpu = replace(gpu, name=f"{gpu.name}, {sms} SMs", sms=sms)
    return gpu


def ctas_per_sm(num_warps: int, registers: int, shared_bytes: int, gpu: Gpu = H200) -> int:
    """CTAs of one kernel resident on an SM at once: the tightest of the CTA, warp, register
    and shared-memory limits (registers allocated per warp, rounded up to the granule)."""
    per_warp = math.ceil(registers * 32 / gpu.register_granule) * gpu.register_granule
    return min(
        gpu.max_ctas_per_sm,
        gpu.max_warps_per_sm // num_warps,
        gpu.registers_per_sm // (per_warp * num_warps),
        gpu.shared_per_sm // (shared_bytes + gpu.shared_reserved_per_cta),
    )


@dataclass
class Timing:
    memory_us: float  # bytes / bandwidth
    waves: int
    serial_us: float  # one program: its straight-line path, then its tile loops
    est_us: float


def launch_time(
    bytes_moved: float,
    programs: int,
    ctas: int,
    num_warps: int,
    # (tiles walked by a program, loop instructions, pipeline stages: 1 = unpipelined)
    tile_loops: Sequence[tuple[float, float, int]],
    gpu: Gpu = H200,
    load_rounds: int = 0,  # outside the tile loops (cost_model.chain): a latency each
    instructions: int = 0,  # issued outside the tile loops, by each warp
    # (expected iterations, loop instructions, stages) of loops counted by their trips
    # (work.Work.trips), which some programs may not enter at all
    counted_loops: Sequence[tuple[float, float, int]] = (),
    issuing: float | None = None,  # programs that issue the path (None: all of them)
    # (instructions on the path of a program that skips the merge, the share of the
    # issuing programs that merge: `work.Work.merging`), or None: every program merges
    merging: tuple[int, float] | None = None,
) -> Timing:
    """The module docstring's formula for one Triton launch. A counted loop is charged as a
    tile loop of `trips` tiles, except that one of fewer expected trips than one (entered by
    that share of the programs, for one trip) pays that share of its first wait. The SM's
    issue is shared among the programs resident on it that issue: `issuing` leaves out those
    that stop once their first loads are in (`work.Work.idle`), which still take their
    place in the waves. With `merging`, the instructions past the other programs' path
    (a split row's merge by its last program to arrive) are issued once those programs
    are done: shared only among the merging programs resident on an SM, not charged to
    every program (every program still waits the longest path's rounds)."""
    waves = math.ceil(programs / (gpu.sms * ctas))
    active = programs if issuing is None else max(1.0, issuing)
    resident = min(ctas, math.ceil(active / gpu.sms))
    share = min(num_warps, gpu.issue_per_clock / resident)  # warp-instructions a clock
    common, alone = instructions, 0.0
    if merging is not None:
        common, mergers = min(merging[0], instructions), merging[1]
        merge_share = min(num_warps, gpu.issue_per_clock / max(1.0, resident * mergers))
        alone = (instructions - common) * num_warps / merge_share
    serial_ns = (
        load_rounds * gpu.memory_latency_ns + (common * num_warps / share + alone) / gpu.clock_ghz
    )
    loops = [(tiles, i, s, 1.0) for tiles, i, s in tile_loops]
    loops += [(trips, i, s, min(trips, 1.0)) for trips, i, s in counted_loops]
    for tiles, instructions, stages, first_wait in loops:
        compute = instructions * num_warps / share / gpu.clock_ghz
        if stages > 1 and tiles:  # the first tile waits; then S - 1 tiles are in flight
            serial_ns += gpu.memory_latency_ns * first_wait + tiles * max(
                compute, gpu.memory_latency_ns / (stages - 1)
            )
        else:
            serial_ns += tiles * (gpu.memory_latency_ns + compute)
    memory_us = bytes_moved / gpu.bytes_per_us
    serial_us = serial_ns / 1e3
    est = max(memory_us, waves * serial_us) + gpu.launch_overhead_us
    return Timing(memory_us, waves, serial_us, est)


def aten_time(bytes_moved: float, gpu: Gpu = H200) -> Timing:
    """A kernel-launching aten op: elementwise or indexing, spread over the whole GPU, so
    its bytes and its launch are all that count."""
    memory_us = bytes_moved / gpu.bytes_per_us
    return Timing(memory_us, 1, 0.0, memory_us + gpu.launch_overhead_us)
