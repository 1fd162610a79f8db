"""What each program of a launch reads, writes and walks: perf/kernel_model.py's access table,
kernel by kernel, evaluated on the recorded launch's own arguments (the batch's parameters).
The kernels are imported inside the functions, after tests/cuda_compile.py (see sass.py).
Processing's model is processing.py's; the record of a launch and its lookups, work.py's."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from .bench_rows import FILTERS, TEMPERATURES, row_counts, row_filters
from .processing import process_logits_work
from .sass import Variant
from .shares import (
    crowded_list_share,
    few_share,
    multi_record_share,
    record_tiles,
    shared_tile_share,
    visited_share,
)
from .work import Work, source_line, tile_loop
from .work import fraction as _f

SURVIVORS = "model:survivors"
"""A pseudo-argument perf/kernel_model.py hands the sampling kernel's access model: per row,
the tokens the filters keep (`bench_rows`; without the temperatures, top-k's k, or V)."""

COVERED = "model:covered"
"""A pseudo-argument perf/kernel_model.py hands the sampling kernel's access model: per row,
1 where the cut kernel marks it covered (its kept tokens all in stage 1's lists, raced over
them unread), taken as the rows the buffer settles (`covered_rows`)."""

UNKNOWN_TILES = "model:unknown_tiles"
"""A pseudo-argument perf/kernel_model.py hands the launches after processing: per row, the
fraction of its tiles marked unknown in the tile-max table (`unknown_tiles`), all read."""

DEFERRED = "model:deferred"
"""A pseudo-argument perf/kernel_model.py hands the launches after processing: per row, 1
where processing left the row unwritten (`processing.deferred_rows`), which stage 1, the
cut and sampling then read from the source (`_reading_deferred`)."""

STAGE_ONE = "model:stage_one"
"""A pseudo-argument perf/kernel_model.py hands the cut kernel: the step's stage-1 launch
arguments, whose slots and filter tables give the rows' filters the cut reads from stage 1
(`filters_ptr`)."""

SEARCH_PASSES = 8
"""Passes of the top-k/top-p radix search over a row the buffer does not settle: its maximum
(4 bits of the 32-bit key a pass; docs/kernels.md, the kernel's passes and their cost)."""


def _top_k_top_p_rows(a: dict[str, Any], c: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Per row: filtered (any of min_p, top-k, top-p on), buffered (stage 1 keeps lists) and
    the search's passes, under the module docstring's settled rows. The cut kernel's filters
    are stage 1's (`STAGE_ONE`)."""
    vocab, buffer = a["vocab_size"], a["buffer_size"]
    tables = a.get(STAGE_ONE, a)
    slots = tables["slots_ptr"]
    top_k, top_p = tables["top_k_ptr"][slots], tables["top_p_ptr"][slots]
    min_p = tables["min_p_ptr"][slots] if c["HAS_MIN_P"] else torch.zeros_like(top_p)
    k_on, p_on = (top_k > 0) & (top_k < vocab), top_p < 1.0
    filtered = k_on | p_on | (min_p != 0.0)
    buffered = filtered & (buffer > 0) & ((k_on & (top_k <= buffer)) | (~k_on & p_on))
    # the merged buffer holds at most the chunks' lists: a k past them is searched (stage 1
    # knows its chunks by their width, the cut by their count)
    splits = a["splits"] if "splits" in a else math.ceil(vocab / a.get("chunk", vocab))
    merged = min(int(buffer), int(splits) * int(c.get("PARTIAL", buffer)))
    settled_k = k_on & (buffer > 0) & (top_k <= merged)
    # top-p is settled only after a buffered top-k
    searches = _f(k_on & ~settled_k) + _f(p_on & ~settled_k)
    return {
        "filtered": _f(filtered),
        "buffered": _f(buffered),
        "passes": _f(filtered) * searches * SEARCH_PASSES,
        # a searched row may gather into its scratch (written once, then searched):
        # counted once each way, its row passes left at the search's bound above
        "gathered": _f(searches > 0) * float(c.get("GATHER", 0) > 0),
        "covered": _f(filtered & settled_k),
    }


def covered_rows(a: dict[str, Any], c: dict[str, Any]) -> torch.Tensor:
    """[rows] float64 from a top-k/top-p launch: the rows its cut kernel marks covered, taken
    as those the buffer settles (top-k within it: the cut, above `complete`, for LLM-like
    rows); a top-p-alone row is searched in the model, so not covered."""
    return _top_k_top_p_rows(a, c)["covered"]


def kept_by_top_k(a: dict[str, Any]) -> torch.Tensor:
    """[rows] float64 from a top-k/top-p launch's arguments: the tokens top-k keeps, k where
    it is on, else V (ties at the k-th left out)."""
    slots, vocab = a["slots_ptr"], a["vocab_size"]
    top_k = a["top_k_ptr"][slots].to(torch.float64)
    return torch.where((top_k > 0) & (top_k < vocab), top_k, float(vocab))


def _unknown_share(a: dict[str, Any], visited: torch.Tensor) -> torch.Tensor:
    """Of the tiles a consumer of the tile maxima reads (a share `visited` of its row's),
    the unknown ones (+inf), which still take their reductions: all, without the model's
    unknown fraction."""
    unknown = a.get(UNKNOWN_TILES)
    return torch.ones_like(visited) if unknown is None else torch.clamp(unknown / visited, max=1.0)


def _candidates_work(a: dict[str, Any], c: dict[str, Any]) -> Work:
    from graphsafe_sampler.kernels import candidates as k

    rows = _top_k_top_p_rows(a, c)
    ones = torch.ones_like(rows["filtered"])
    slots, vocab, partial = a["slots_ptr"], a["vocab_size"], c["PARTIAL"]
    top_k = a["top_k_ptr"][slots].to(torch.float64)
    k_on = (top_k > 0) & (top_k < vocab)
    tiles = math.ceil(vocab / c["BLOCK_SIZE"])
    chunk_tiles = math.ceil(a["chunk"] / c["BLOCK_SIZE"])
    # with the tile maxima a buffered top-k row reads only the tiles at or above the k-th
    # largest tile max and the unknown ones; every other row reads its whole row
    visited = ones
    skipping = torch.zeros_like(k_on)
    sorting = ones  # the rows whose floor takes the k-th tile max (`_tile_floor`'s sort)
    if c["HAS_TILE_MAX"]:
        skipping = (rows["buffered"] > 0) & k_on
        # the tiles at or above the floor, counted on the benchmark's rows; or top-k's k
        filters = row_filters(a, c)
        block = c["BLOCK_SIZE"]
        above = top_k if filters is None else row_counts(filters, vocab, block, "candidate_tiles")
        visited = torch.where(skipping, visited_share(above, tiles, a.get(UNKNOWN_TILES)), 1.0)
        if filters is not None:
            sorting = row_counts(filters, vocab, block, "kth_sorted")
    # the mass is weighed by top-p rows that read every tile
    weigh = _f((a["top_p_ptr"][slots] < 1.0) & ~skipping)
    # a read tile merges when it holds a new one of the list's floor-rank largest (k, or the
    # list's length): records of a shuffled row among the tiles read (`record_tiles`);
    # min_p's floor only lowers it
    floor_rank = torch.where(k_on, top_k.clamp(max=partial), float(partial))
    read_tiles = max(1, round(chunk_tiles * float(visited.max())))
    multi = multi_record_share(floor_rank, read_tiles)
    if c["HAS_TILE_MAX"]:
        # a skipping row merges only its logits at or above the tiles' floor, about its k
        # largest: a read tile holds two or more of them as k spread over the row's tiles
        # (its insertion loop's further rounds counted once: two, the usual such tile)
        multi = torch.where(skipping, shared_tile_share(top_k, tiles), multi)
    unknown_read = _unknown_share(a, visited) if c["HAS_TILE_MAX"] else ones
    return Work(
        reads={
            "logits_ptr": rows["filtered"] * visited,
            "min_p_ptr": ones * float(c["HAS_MIN_P"]),
            # the whole row's maxima per program, then its chunk's, one by one
            "tile_max_ptr": rows["filtered"] * math.ceil(vocab / a["chunk"]),
        },
        writes={
            "stats_ptr": rows["filtered"],
            "filters_ptr": ones,  # by the row's first program
            "lists_ptr": rows["buffered"],
            "ids_ptr": rows["buffered"],
        },
        # with the maxima the walk's iterations are the listed tiles only, a share `visited`
        # of the chunk's: the branch fractions below are of those
        walks={tile_loop(k._candidates_kernel, 0): rows["filtered"] * visited},
        taken={
            # the rows with a filter on, and of those the top-k rows the maxima bound
            source_line(k._candidates_kernel, "if k_on | p_on | (min_p != 0.0):"): rows["filtered"],
            source_line(k._candidates_kernel, "if use_buffer & k_on:"): _f(skipping),
            source_line(
                k._candidates_kernel, "if (tile_max > floor) & (tile_max >= skip_below):"
            ): rows["buffered"] * record_tiles(floor_rank, read_tiles),
            source_line(k._candidates_kernel, "if hits > 1:"): multi,
            source_line(k._candidates_kernel, "if weigh:"): weigh,
            # the k-th tile max sorted for, where it can raise the floor above min_p's
            source_line(k._tile_floor, "if tl.sum((known >= floor)"): _f(skipping) * sorting,
            # the chunk's min (an unknown tile's, a known one's), reduced by the rows the
            # k-th tile max bounds not (every skipping row that sorts has its k known tiles
            # in the model)
            source_line(k._candidates_kernel, "if not bounded:"): 1 - _f(skipping) * sorting,
            source_line(k._candidates_kernel, "elif not bounded:"): 1 - _f(skipping) * sorting,
            # the reductions of a tile the table does not know (+inf), among those read
            source_line(k._candidates_kernel, 'if tile_max == float("inf"):'): unknown_read,
        },
    )


def _top_k_top_p_work(a: dict[str, Any], c: dict[str, Any]) -> Work:
    from graphsafe_sampler.kernels import radix_select
    from graphsafe_sampler.kernels import top_k_top_p as k

    rows = _top_k_top_p_rows(a, c)
    apply = rows["filtered"] * float(c["APPLY"])
    ones = torch.ones_like(apply)
    return Work(
        reads={
            "logits_ptr": rows["passes"] + apply,
            "stats_ptr": rows["filtered"],
            "filters_ptr": ones,
            "lists_ptr": rows["buffered"],
            "threshold_ptr": 0 * ones,
            "covered_ptr": 0 * ones,
            "reads_ptr": 0 * ones,
            "scratch_ptr": rows["gathered"],
        },
        writes={
            "logits_ptr": apply,
            "threshold_ptr": ones,
            "covered_ptr": ones,
            "reads_ptr": ones * float(c["COUNT_READS"]),
            "scratch_ptr": rows["gathered"],
        },
        walks={
            tile_loop(radix_select._largest_key_reaching, 0): rows["passes"],
            tile_loop(k._top_k_top_p_kernel, 0): apply,
        },
    )


def _sample_work(a: dict[str, Any], c: dict[str, Any]) -> Work:
    from graphsafe_sampler.kernels import list_race, noise
    from graphsafe_sampler.kernels import sampling as k

    slots = a["slots_ptr"]
    ones = torch.ones(slots.shape[0], dtype=torch.float64)
    random = _f(a["temperature_ptr"][slots] >= c["GREEDY_BELOW"])
    by_slot = float(c["BY_SLOT"])  # the position from the slot's tables, not per row
    split = float(c["SPLIT"])
    # the tiles a random row hashes (kernels/sampling.py): with a cut, those holding one of
    # the survivors, taken as top-k's k spread over the row's tiles (at least one tile of a
    # program's chunk); without one, or with top-p/min_p alone, every tile (an upper bound)
    tiles = math.ceil(a["vocab_size"] / c["BLOCK_SIZE"])
    chunk_tiles = math.ceil(a["chunk"] / c["BLOCK_SIZE"])
    hashed = ones.clone()
    survivors = a.get(SURVIVORS)  # per row, from the step's top-k/top-p launch
    if c["HAS_THRESHOLD"] and survivors is not None:
        hashed = torch.clamp(survivors / tiles, min=1 / chunk_tiles, max=1.0)
    # with the tile maxima, the tiles below the cut are not read either: only those hashed
    # and the unknown ones (the hash's fraction is then of the tiles read)
    visited = read = ones
    if c["HAS_TILE_MAX"] and survivors is not None:
        read = visited_share(survivors, tiles, a.get(UNKNOWN_TILES))  # of the row
        visited = torch.maximum(read, hashed)  # of the slowest program's chunk
    partials = ("partial_best_ptr", "partial_index_ptr", "partial_nan_ptr")
    hash_line = source_line(noise.race_tile, "if top + GUMBEL_MAX > best:")
    taken = {hash_line: hashed}
    if c["HAS_TILE_MAX"]:
        # the walk's iterations are the listed tiles, a share `visited` of the chunk's; of
        # those, the unknown ones (+inf) look for NaN and take their max
        taken = {
            hash_line: torch.clamp(hashed / visited, max=1.0),
            source_line(k._sample_kernel, 'if top == float("inf"):'): _unknown_share(a, visited),
            # a known entry's bound over the divisor (the temperature on read): the rest
            source_line(k._sample_kernel, 'if top != float("inf"):'): 1
            - _unknown_share(a, visited),
        }
    # a hashed tile of a top-k row holds a few of its k survivors (k spread over the row's
    # tiles): at most FEW_SURVIVORS of them (its lowest and highest) hash alone; other rows
    # hash whole tiles
    few = torch.zeros_like(ones)
    if c["HAS_THRESHOLD"] and survivors is not None:
        few = torch.where(
            survivors < tiles, few_share(survivors, tiles, noise.FEW_SURVIVORS.value), 0.0
        )
    # the others are screened (approximate noise, `noise.gumbel_screen`); a screened tile
    # goes on only where it can beat the walk's best so far: a tile holding a new largest
    # perturbed logit among the program's hashed tiles, in random order (`record_tiles`,
    # k = 1: about (1 + ln n) / n of n), and leaves one or two tokens to take
    # the exact noise alone (more than two only where three lie within the screen's error
    # of the tile's best: taken as never)
    records = record_tiles(1.0, max(1, round(float(hashed.min()) * chunk_tiles)))
    few_line = "if count <= FEW_SURVIVORS:"
    taken[source_line(noise.race_tile, few_line, "# the screen")] = few
    taken[source_line(noise.race_tile, "if screen_max + 2.0 * error > best:")] = records
    taken[source_line(noise.race_tile, few_line, "tile_max, tile_index = _race_few(")] = (
        torch.ones_like(few)
    )
    # the tokens raced alone: a cut's (of a tile it leaves any) and a screen's that can win
    taken[source_line(noise._race_few, "if count > 0:")] = few + (1.0 - few) * records
    # a covered row (HAS_BUFFER) reads none of its row: its first program races over the
    # lists, its others stop at once (the kernel's `return`, named here so that a kernel
    # without it fails this table); every program reads its flag
    covered = torch.zeros_like(ones)
    idle = None
    if c["HAS_BUFFER"]:
        source_line(k._sample_kernel, "if covered & (split != 0):")
        if a.get(COVERED) is not None:
            covered = a[COVERED]
            splits = math.ceil(a["vocab_size"] / a["chunk"])
            idle = covered * (1.0 - 1.0 / splits)
    walked = 1.0 - covered
    read, visited = read * walked, visited * walked
    split = split * walked
    # a covered row races; the uncovered rows' arrival and merge is this `if`'s else-block,
    # which the chain leaves out where every row is covered
    taken[source_line(k._sample_kernel, "if covered:", before="finish = split == 0")] = covered
    crowded, later = ones, 0.0
    if c["HAS_BUFFER"]:
        list_len, ranks = int(a["list_len"]), int(c["RANK_BLOCK"])
        chunks = int(a["num_lists"])
        later = float(math.ceil(list_len / ranks) - 1)  # the ranks after the first block
        if survivors is not None:
            crowded = crowded_list_share(survivors, chunks, ranks)
        taken[source_line(list_race.race_lists, "if more:")] = covered * crowded * float(later > 0)
    # every row's first program loads the first block of ranks, a covered row's the rest
    # as its race needs them (an upper bound: all of them)
    first_block = 0.0
    if c["HAS_BUFFER"]:
        first_block = min(1.0, int(c["RANK_BLOCK"]) / int(a["list_len"]))
    keyed, hand = float(c.get("KEYED", False)), float(c.get("HAND_VALUE", False))
    work = Work(
        reads={
            "logits_ptr": read,
            "covered_ptr": ones * float(c["HAS_BUFFER"]),
            "buffer_values_ptr": covered + (1 - covered) * first_block,
            "buffer_ids_ptr": covered + (1 - covered) * first_block,
            "tile_max_ptr": walked * float(c["HAS_TILE_MAX"]) / chunk_tiles,
            "threshold_ptr": ones * float(c["HAS_THRESHOLD"]),
            # the rows' records processing resolved (KEYED), else the slots' tables
            "filters_ptr": ones * keyed,
            "keys_ptr": random * keyed,
            "temperature_ptr": ones * (1 - keyed),
            "seeds_ptr": random * (1 - keyed),
            "positions_ptr": random * (1 - by_slot),
            "prompt_len_ptr": random * by_slot * (1 - keyed),
            "num_generated_ptr": random * by_slot * (1 - keyed),
            # the token's value in the logits logprobs reads (HAND_VALUE): one of the row's
            "values_from_ptr": ones * hand / a["vocab_size"],
            "values_ptr": 0 * ones,
            "tokens_ptr": 0 * ones,
            # split rows: the last program reads the row's partials, after each program's
            # atomic add on the row's counter
            **dict.fromkeys(partials, ones * split),
            "arrivals_ptr": ones * split,
        },
        # split rows: each program writes its chunk's answer, one row of partials a row,
        # and the last one resets the counter
        writes={
            "tokens_ptr": ones,
            "values_ptr": ones * hand,
            **dict.fromkeys(partials, ones * split),
            "arrivals_ptr": ones * split,
        },
        walks={tile_loop(k._sample_kernel, 0): visited},
        taken=taken,
        merging=_sample_merging(a, c, covered),
        # a covered row's first program races RANK_BLOCK ranks of every chunk's list, and
        # the rest of the ranks only where some list keeps that many (`crowded_list_share`
        # of the row's survivors; without them, every row)
        trips={source_line(list_race.race_lists, "for first in"): covered * crowded * later},
        idle=idle,
    )
    return _with_commit(work, a, c)


def _logprobs_work(a: dict[str, Any], c: dict[str, Any]) -> Work:
    from graphsafe_sampler.kernels import logprobs as k

    rows, vocab = a["source_ptr"].shape
    ones = torch.ones(rows, dtype=torch.float64)
    written = ("token_ids_ptr", "logprobs_ptr", "ranks_ptr", "lse_ptr")
    partials = ("stats_ptr", "part_v_ptr", "part_i_ptr")
    split = float(c["SPLIT"])  # each program writes its chunk's partials, not the outputs
    tiles = math.ceil(vocab / c["BLOCK_SIZE"])
    chunk_tiles = math.ceil(a["chunk"] / c["BLOCK_SIZE"])
    # with the raw tiles, the tiles holding one of the K largest or a token at or above the
    # sampled one: counted on the benchmark's rows, else max(K, survivors / 2) of them (the
    # sampled token a survivor of uniform rank); without a cut, every tile
    visited, reached = ones, a.get(SURVIVORS)
    if reached is not None:
        reached = reached.clamp(min=2 * c["K"]) / 2
    if c["HAS_TILES"] and a.get(FILTERS) is not None:
        reached = row_counts(a[FILTERS], vocab, c["BLOCK_SIZE"], "logprobs_tiles", c["K"])
    if c["HAS_TILES"] and reached is not None:
        visited = visited_share(reached, tiles, None)
    merge = source_line(k._logprobs_kernel, "if ((tile_max > kth_v) |")
    # the running top K is merged with a tile holding a new one of the K largest, among the
    # tiles the program reads
    read_tiles = torch.clamp(visited * chunk_tiles, min=1.0)
    walked = [math.ceil(float(t)) for t in read_tiles]
    records = torch.stack([record_tiles(c["K"], t) for t in walked])
    # of those merges, the K selections run on the first (it fills the top K) and on those
    # holding two or more new ones; the rest insert their one value. With the raw tiles'
    # floor, a value enters only at or above it, and those are about the K largest, at
    # random columns: the first merge inserts too, and the selections run on a tile
    # holding two of them
    general = source_line(k._logprobs_kernel, "if (above != 1) | ~(full | (floor > ")
    if c["HAS_TILES"]:
        selections = shared_tile_share(torch.full_like(ones, float(c["K"])), tiles)
    else:
        multi = torch.stack([multi_record_share(c["K"], t) for t in walked])
        first = 1.0 / torch.clamp(records * torch.tensor(walked, dtype=torch.float64), min=1.0)
        selections = multi + (1.0 - multi) * first
    taken = {merge: records, general: selections}
    last = ones * split / math.ceil(tiles / chunk_tiles)  # a split row's last program
    return Work(
        reads={
            "source_ptr": visited + 1 / vocab,
            # each program reads the row's table: its floor comes from every tile
            "tiles_ptr": ones * float(c["HAS_TILES"]) * math.ceil(tiles / chunk_tiles),
            **dict.fromkeys(written, 0 * ones),
            # split rows: the last program to arrive reads the row's partials
            **dict.fromkeys(partials, ones * split),
            "arrivals_ptr": ones * split,
        },
        writes={
            **dict.fromkeys(written, ones),
            **dict.fromkeys(partials, ones * split),
            "arrivals_ptr": ones * split,
        },
        # the walk's iterations are the listed tiles, a share `visited` of the chunk's
        walks={tile_loop(k._logprobs_kernel, 0): visited, tile_loop(k._finish_row, 0): 0 * ones},
        taken=taken,
        # a split row's merge and outputs, by its last program to arrive
        merging={source_line(k._logprobs_kernel, "if last_to_arrive("): last},
    )


def _sample_merging(
    a: dict[str, Any], c: dict[str, Any], covered: torch.Tensor
) -> dict[tuple[str, int], torch.Tensor]:
    """`Work.merging` of a sampling launch: a split row's merge of its programs' answers and
    the token's store and commit, by the row's last program to arrive (one of `splits`); a
    covered row's one issuing program stores and commits (all of its issuing programs)."""
    from graphsafe_sampler.kernels import sampling as k

    if not c["SPLIT"]:
        return {}
    last = (1.0 - covered) / math.ceil(a["vocab_size"] / a["chunk"])
    return {
        source_line(k._sample_kernel, "if finish:", before="token = merge_argmax("): last,
        source_line(k._sample_kernel, "if finish:", before="tl.store(tokens_ptr"): covered + last,
    }


def _commit_access(a: dict[str, Any], c: dict[str, Any], vocab_size: int) -> Work:
    """`history.commit_row` on each row: a byte of the counts row, a word of the output
    bitmask and an overflow entry read and written, the window entry and num_generated
    written (rows that commit)."""
    slots = a["slots_ptr"]
    keep = a["keep_ptr"] != 0 if c["HAS_KEEP"] else True
    commit = _f(keep & (slots != a["padding_slot"]))
    from graphsafe_sampler.kernels import history

    count = commit / vocab_size  # one byte of the counts row
    word = torch.ones_like(commit) / a["num_words"]  # one int32 of the output words
    spare = torch.ones_like(commit) / (a["num_overflow"] + 1)  # one overflow entry
    return Work(
        reads={
            "keep_ptr": torch.ones_like(commit) * float(c["HAS_KEEP"]),
            "counts_ptr": count,
            "output_words_ptr": word,
            "overflow_token_ptr": 0 * spare,
            "overflow_excess_ptr": 0 * spare,
            "window_ptr": 0 * spare,
        },
        writes={
            "counts_ptr": count,
            "output_words_ptr": commit * word,
            "overflow_token_ptr": spare,
            "num_generated_ptr": commit,
            "window_ptr": commit / a["window_len"],
        },
        # the overflow table's scan and its entry's excess, for a token whose byte is 254
        # or 255 (its 255th output of a request, and later ones): taken as none
        walks={source_line(history.commit_row, "for start in range(0, num_overflow,"): 0 * commit},
        taken={source_line(history.commit_row, "if saturates | grows:"): 0 * commit},
    )


def _commit_work(a: dict[str, Any], c: dict[str, Any]) -> Work:
    return _commit_access(a, c, a["vocab_size"])


def _with_commit(work: Work, a: dict[str, Any], c: dict[str, Any]) -> Work:
    """A sampling kernel's work plus the commit it makes (COMMIT; else its tables unread)."""
    commit = _commit_access(a, c, a["counts_stride"])
    if not c.get("COMMIT"):
        unread = dict.fromkeys([*commit.reads, *commit.writes], 0 * commit.writes["counts_ptr"])
        return replace(work, reads={**unread, **work.reads})
    return replace(
        work,
        reads={**work.reads, **commit.reads},
        writes={**work.writes, **commit.writes},
        walks={**work.walks, **commit.walks},
        taken={**work.taken, **commit.taken},
    )


def _min_p_work(a: dict[str, Any], c: dict[str, Any]) -> Work:
    from graphsafe_sampler.kernels import min_p as k

    on = _f(a["min_p_ptr"][a["slots_ptr"]] != 0.0)
    return Work(
        reads={"logits_ptr": 2 * on},
        writes={"logits_ptr": on},
        walks={tile_loop(k._min_p_kernel, 0): on, tile_loop(k._min_p_kernel, 1): on},
    )


Model = Callable[[dict[str, Any], dict[str, Any]], Work]


def _reading_deferred(model: Model) -> Model:
    """A reader of the processed logits whose deferred rows (DEFER) it reads from the source
    instead: its reads of `logits_ptr` split by the rows' `DEFERRED` share, and the
    division of what it reads and of its walk's tile maxima (`processed_rows.processed`,
    `processed_tile`) taken where a row scales: with DEFER every row's temperature is the
    reader's, written or not."""

    def work(a: dict[str, Any], c: dict[str, Any]) -> Work:
        from graphsafe_sampler.kernels import processed_rows as on_read
        from graphsafe_sampler.kernels.constants import GREEDY_TEMPERATURE

        done = model(a, c)
        logits = done.reads["logits_ptr"]
        deferred = a.get(DEFERRED, 0 * logits) if c.get("DEFER") else 0 * logits
        split = {"logits_ptr": logits * (1 - deferred), "source_ptr": logits * deferred}
        temperature = a.get(TEMPERATURES, torch.ones_like(logits))
        scales = ((temperature >= GREEDY_TEMPERATURE) & (temperature != 1.0)).to(torch.float64)
        dividing = scales * float(bool(c.get("DEFER")))
        divides = {
            source_line(fn, "if (divisor != 0.0)"): dividing
            for fn in (on_read.processed, on_read.processed_tile)
        }
        # a walk's IEEE division again: in a chunk's partial last tile (its masked columns
        # read -inf), one of the chunk's tiles; never for a logit of an LLM's row
        tiles = math.ceil(int(a.get("chunk", a.get("vocab_size", 1))) / c.get("BLOCK_SIZE", 1))
        fallback = source_line(on_read.processed_tile, "if ~fast")
        divides[fallback] = dividing / max(1, tiles)
        return replace(done, reads={**done.reads, **split}, taken={**done.taken, **divides})

    return work


WORK: dict[str, Model] = {
    "_process_logits_kernel": process_logits_work,
    "_candidates_kernel": _reading_deferred(_candidates_work),
    "_top_k_top_p_kernel": _reading_deferred(_top_k_top_p_work),
    "_sample_kernel": _reading_deferred(_sample_work),
    "_logprobs_kernel": _logprobs_work,
    "_commit_history_kernel": _commit_work,
    "_min_p_kernel": _min_p_work,
}
"""The module docstring's table, kernel by kernel; any other kernel gets `generic_work`."""


def generic_work(variant: Variant, programs: int) -> Work:
    """A kernel the table does not know: each of its tile loops walked once per program (and,
    by default, one row of each tensor argument read)."""
    ones = torch.ones(programs, dtype=torch.float64)
    return Work(walks={(loop.file, loop.line): ones for loop in variant.loops if loop.tile_loop})


def row_bytes(t: torch.Tensor) -> int:
    """Bytes of one row of a table (one element of a vector)."""
    elements = t.numel() // t.shape[0] if t.dim() >= 2 else 1
    return elements * t.element_size()
