"""graphsafe_sampler: an LLM sampler that lives inside a compiled model runner and a CUDA graph.

See docs/design.md for the design and the contract. The public names:
"""

from graphsafe_sampler.batch_state import BatchState
from graphsafe_sampler.batch_update import BatchUpdate, BatchUpdateBuilder, MoveDirectionality
from graphsafe_sampler.compile_options import compile_options
from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.output import LogprobsTensors, RejectionSamplerOutput, SamplerOutput
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.processors import (
    AdapterLogitsProcessor,
    LogitsProcessor,
    SlotLogitsProcessor,
    load_logits_processors,
)
from graphsafe_sampler.rejection_sampler import RejectionSampler
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.stages import (
    AllowedTokenIdsLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
)
from graphsafe_sampler.stages.watermark import WatermarkDetection, detect_watermark
from graphsafe_sampler.staging import StagedTensor

__version__ = "0.1.0"

__all__ = [
    "AdapterLogitsProcessor",
    "AllowedTokenIdsLogitsProcessor",
    "BatchState",
    "BatchUpdate",
    "BatchUpdateBuilder",
    "LogitBiasLogitsProcessor",
    "LogitsProcessor",
    "LogprobsTensors",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "MoveDirectionality",
    "RejectionSampler",
    "RejectionSamplerOutput",
    "Sampler",
    "SamplerConfig",
    "SamplerOutput",
    "SamplingParams",
    "SlotLogitsProcessor",
    "StagedTensor",
    "WatermarkDetection",
    "compile_options",
    "detect_watermark",
    "load_logits_processors",
]
