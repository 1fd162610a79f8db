"""Graph-safety checks (DESIGN §5) that anyone can point at a processor or a sampler.

from graphsafe_sampler.testing import check_graph_safety
report = check_graph_safety(MyProcessor(config, device, False), num_steps=50)
"""

from graphsafe_sampler.testing.batch_driver import (
    BatchDriver,
    DriverRequest,
    random_sampling_params,
)
from graphsafe_sampler.testing.graph_safety import (
    GraphSafetyReport,
    check_graph_safety,
    default_logits,
    state_fingerprint,
)
from graphsafe_sampler.testing.sync_detector import (
    SYNC_OP_PACKETS,
    GraphSafetyError,
    SyncOpDetector,
    assert_no_sync,
)

__all__ = [
    "SYNC_OP_PACKETS",
    "BatchDriver",
    "DriverRequest",
    "GraphSafetyError",
    "GraphSafetyReport",
    "SyncOpDetector",
    "assert_no_sync",
    "check_graph_safety",
    "default_logits",
    "random_sampling_params",
    "state_fingerprint",
]
