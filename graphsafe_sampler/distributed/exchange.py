"""`RowExchange`: the row statistics that vocabulary shards trade, and nothing larger.

Every exchange is one all-gather of a small `[num_rows, m]` tensor per rank (m is a few
values, a pass's 15 radix weights, or 128 candidates), through `torch.distributed`'s
functional collectives: traceable ops, so that the step compiles and captures as one graph
(NCCL on a GPU, gloo on a CPU), with no host read. Each rank then reduces the gathered
`[W, num_rows, m]` in the same order, so every rank holds the same bits.

`ShardExchange` gathers over a process group; `LoopbackExchange` stands for a world of
identical ranks in one process, to count what a step sends.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# torch 2.13 renamed it; earlier releases have only the old name
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor


@dataclass
class ExchangeRecord:
    """What one rank sent in the exchanges `RowExchange.record` saw: one entry each, the
    bytes this rank put in (every rank receives world_size times that)."""

    sent: list[int]

    @property
    def collectives(self) -> int:
        return len(self.sent)

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent)


class RowExchange(abc.ABC):
    """All-gathers of `[num_rows, m]` row statistics among `world_size` ranks, with the
    reductions the sampling step needs (an `AcrossShards` for `stages.threshold_search`).
    `record`: None, or an `ExchangeRecord` each gather adds its buffer's bytes to."""

    def __init__(self, world_size: int, rank: int) -> None:
        self.world_size = world_size
        self.rank = rank
        self.record: ExchangeRecord | None = None

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """[num_rows, m] -> [world_size, num_rows, m]: every rank's values, in rank order."""
        values = values.contiguous()
        if self.record is not None:
            self.record.sent.append(values.numel() * values.element_size())
        return self._all_gather(values)

    @abc.abstractmethod
    def _all_gather(self, values: torch.Tensor) -> torch.Tensor:
        """`gather` of a contiguous tensor."""

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """[num_rows, m]: the sum over the ranks' values (in rank order)."""
        return self.gather(values).sum(0)

    def max(self, values: torch.Tensor) -> torch.Tensor:
        """[num_rows, m]: the max over the ranks' values (NaN where any is NaN)."""
        return self.gather(values).amax(0)


def argmax_payload(values: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """[num_rows, 2] float32: each row's best value and its id's int32 bits, for one gather
    (the bits travel as they are: a gather copies, it computes nothing)."""
    bits = token_ids.to(torch.int32).view(torch.float32)
    return torch.stack([values.to(torch.float32), bits], dim=-1)


def argmax_of(gathered: torch.Tensor) -> torch.Tensor:
    """[W, num_rows, 2] gathered `argmax_payload`s -> [num_rows] int64, the winner's id:
    the lowest rank first on ties and NaN first, as `argmax` over the whole row ranks them
    where each rank's value is its own shard's argmax (the lowest index first)."""
    winner = gathered[:, :, 0].argmax(0)  # [num_rows]: the first rank of the max / NaN
    ids = gathered[:, :, 1].contiguous().view(torch.int32)  # [W, num_rows]
    return ids.gather(0, winner[None, :])[0].long()


class ShardExchange(RowExchange):
    """All-gathers over `group` (default: the whole world), which must be initialised."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "vocab-parallel sampling needs torch.distributed initialised "
                "(torch.distributed.init_process_group) before the sampler is built"
            )
        world = dist.group.WORLD
        assert world is not None  # initialised
        self.group: dist.ProcessGroup = group if group is not None else world
        super().__init__(dist.get_world_size(self.group), dist.get_rank(self.group))

    def _all_gather(self, values: torch.Tensor) -> torch.Tensor:
        gathered = _all_gather(values, 0, self.group)  # [W * num_rows, m]
        return funcol.wait_tensor(gathered).view(self.world_size, *values.shape)


class LoopbackExchange(RowExchange):
    """A world of `world_size` ranks in one process, every rank holding this one's values:
    for counting what a step sends (`record`) without processes. Its sums and maxima are
    those of W copies, so the tokens are not a split sampler's."""

    def __init__(self, world_size: int, rank: int = 0) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank = {rank} is outside [0, world_size = {world_size})")
        super().__init__(world_size, rank)

    def _all_gather(self, values: torch.Tensor) -> torch.Tensor:
        return values[None].expand(self.world_size, *values.shape)
