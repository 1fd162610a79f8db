"""What a step's launches tell the later ones: the access table's pseudo-arguments
(access.py, bench_rows.py), which perf/kernel_model.py hands each launch with its own."""

from __future__ import annotations

from typing import Any

import torch

from .access import (
    COVERED,
    DEFERRED,
    STAGE_ONE,
    SURVIVORS,
    UNKNOWN_TILES,
    covered_rows,
    kept_by_top_k,
)
from .bench_rows import FILTERS, TEMPERATURES, row_counts, row_filters
from .processing import deferred_rows, unknown_tiles


def tells_later(launch: Any, context: dict[str, Any], vocab: int) -> dict[str, Any]:
    """What a recorded launch tells the step's later ones (the access table's pseudo-
    arguments): processing its unknown tiles, deferred rows and temperatures, stage 1 the survivors
    (counted on the bench rows with the temperatures), filters and its own arguments (the cut's
    filters), the cut the covered rows."""
    name, args, constexprs = launch.kernel.__name__, launch.args, launch.constexprs
    told: dict[str, Any] = {}
    if name == "_process_logits_kernel":
        told[UNKNOWN_TILES] = unknown_tiles(args, constexprs)
        told[DEFERRED] = deferred_rows(args, constexprs)
        told[TEMPERATURES] = args["temperature_ptr"][args["slots_ptr"]].to(torch.float64)
    if name == "_candidates_kernel":
        told[STAGE_ONE] = args
        told[SURVIVORS] = kept_by_top_k(args)
        filters = row_filters({**args, **context}, constexprs)
        if filters is not None:
            block = constexprs["BLOCK_SIZE"]
            told.update(
                {SURVIVORS: row_counts(filters, vocab, block, "survivors"), FILTERS: filters}
            )
    if name == "_top_k_top_p_kernel":
        told[COVERED] = covered_rows({**args, **context}, constexprs)
    return told
