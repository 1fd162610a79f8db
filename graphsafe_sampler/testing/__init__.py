"""Graph-safety checks (docs/design.md §5) that anyone can point at a processor or a sampler.

from graphsafe_sampler.testing import check_graph_safety
report = check_graph_safety(MyProcessor(config, device, False), num_steps=50)

`BatchDriver` (batch_driver.py) is the one host-side model of a persistent batch and its
`BatchUpdate`s: random churn for the tests, the benchmarks' full batch (`refill`), the demo's
serving loop (`no_joins`, `finish=True`) and the GPU check.

`kernel_launches` (launches.py) lists the ops of a traced step that launch a GPU kernel.

`speed_up_interpreter` (interpreter.py) installs four speed-ups of the Triton interpreter
(`TRITON_INTERPRET=1`) that change no value: `share_interpreter_patches` spares it
re-patching its language on every helper call (the CPU runs of the kernels, twice as fast);
`scan_in_log_steps` runs its scans with a kernel's own combine function in log-depth steps
on whole blocks, not one element at a time; `skip_unasserted_overflow_checks` drops the
integer overflow checks its `device_assert` never evaluates; `cache_numpy_dtypes` memoizes
its dtype map.

`StateTensors`, `MakeFxReplayer` and `CudaGraphReplayer` (replay.py) are the one state
snapshot and the replayers of a step captured once; `perf/gpu_check.py` uses them too.
"""

from graphsafe_sampler.testing.batch_driver import (
    BatchDriver,
    DriverRequest,
    Joins,
    no_joins,
    random_joins,
    random_sampling_params,
    refill,
    stop_reason,
)
from graphsafe_sampler.testing.graph_safety import (
    GraphSafetyReport,
    check_graph_safety,
    default_logits,
    state_fingerprint,
)
from graphsafe_sampler.testing.interpreter import (
    cache_numpy_dtypes,
    scan_in_log_steps,
    share_interpreter_patches,
    skip_unasserted_overflow_checks,
    speed_up_interpreter,
)
from graphsafe_sampler.testing.launches import kernel_launches, launches_kernel
from graphsafe_sampler.testing.replay import CudaGraphReplayer, MakeFxReplayer, StateTensors
from graphsafe_sampler.testing.sync_detector import (
    SYNC_OP_PACKETS,
    GraphSafetyError,
    SyncOpDetector,
    assert_no_sync,
)

__all__ = [
    "SYNC_OP_PACKETS",
    "BatchDriver",
    "CudaGraphReplayer",
    "DriverRequest",
    "GraphSafetyError",
    "GraphSafetyReport",
    "Joins",
    "MakeFxReplayer",
    "StateTensors",
    "SyncOpDetector",
    "assert_no_sync",
    "cache_numpy_dtypes",
    "check_graph_safety",
    "default_logits",
    "kernel_launches",
    "launches_kernel",
    "no_joins",
    "random_joins",
    "random_sampling_params",
    "refill",
    "scan_in_log_steps",
    "share_interpreter_patches",
    "skip_unasserted_overflow_checks",
    "speed_up_interpreter",
    "state_fingerprint",
    "stop_reason",
]
