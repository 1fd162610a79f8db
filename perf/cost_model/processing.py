"""The access table's model of `process_logits` (access.py's module docstring): the sparse
phases' tokens, the tiles they mark unknown and the rows the launch leaves unwritten, which
perf/kernel_model.py hands the later launches of a step."""

from __future__ import annotations

import math
from typing import Any

import torch

from .work import Work, fraction, source_line, tile_loop, walks_past_first

_f = fraction


def _sparse_tokens(a: dict[str, Any], c: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Per row of a process_logits launch: the tokens its phases after the dense pass
    store (biased, stop ids, banned, saturated), the rows with a full overflow table, whose
    step 7 rewrites the whole row, and those whose stop ids are banned, that scale or that
    have a penalty on."""
    slots = a["slots_ptr"]
    zeros = torch.zeros(slots.shape[0], dtype=torch.float64)
    rep, freq = a["repetition_ptr"][slots], a["frequency_ptr"][slots]
    fix_excess = freq != 0.0
    temperature = a["temperature_ptr"][slots]
    # with DEFER the temperature is the readers' (never processing's)
    scale_on = (temperature >= c["GREEDY_BELOW"]) & (temperature != 1.0) & (not c.get("DEFER"))
    preceding = a["num_preceding_ptr"] if c["HAS_DRAFTS"] else 0
    stopping = _f(a["num_generated_ptr"][slots] + preceding < a["min_tokens_ptr"][slots])
    table = a["overflow_token_ptr"][slots, : a["num_overflow"]] >= 0
    used = table.sum(1) * fix_excess
    bias = (a["bias_values_ptr"][slots] != 0.0).sum(1)
    banned = a["bad_back_ptr"][slots].eq(0).sum(1) if c["HAS_BAD_WORDS"] else zeros
    # the distinct stop ids (unused entries repeat the first)
    ordered = a["stop_ids_ptr"][slots].sort(dim=1).values
    stops = 1 + (ordered[:, 1:] != ordered[:, :-1]).sum(1)
    return {
        "tokens": bias + stopping * stops + banned + used,
        "excess": used.to(torch.float64),
        "full": _f(fix_excess & scale_on & table[:, -1]),
        "stopping": stopping,
        "scale_on": _f(scale_on),
        "penalties": _f((rep != 1.0) | (freq != 0.0) | (a["presence_ptr"][slots] != 0.0)),
    }


def unknown_tiles(a: dict[str, Any], c: dict[str, Any]) -> torch.Tensor:
    """[rows] float64 from a process_logits launch: the fraction of each row's tiles its
    sparse phases mark unknown in the tile-max table (with HAS_TILE_MAX): step 7 marks its
    saturated tokens' tiles (all of them at a full overflow table); the bias, stop ids and
    bad words keep an entry exact unless their token held its tile's max and fell
    (`library.update_tiles`), taken as a random token's chance, 1 / BLOCK_SIZE; a row it
    leaves unread (`unread_rows`) has every tile marked. n marking
    tokens at random columns fall in about 1 - (1 - 1/tiles)**n of the tiles."""
    sparse = _sparse_tokens(a, c)
    tiles = math.ceil(a["vocab_size"] / c["BLOCK_SIZE"])
    others = sparse["tokens"].to(torch.float64) - sparse["excess"]
    marking = sparse["excess"] + others / c["BLOCK_SIZE"]
    marked = 1.0 - (1.0 - 1.0 / tiles) ** marking
    marked = torch.maximum(marked, unread_rows(a, c))  # every tile of a row left unread
    return torch.maximum(marked, sparse["full"]) * float(c["HAS_TILE_MAX"])


def _masks_on(a: dict[str, Any]) -> torch.Tensor:
    """[rows] bool from a process_logits launch with the row flags (DEFER): the kernel's
    `masks_on`, an allowed list or a grammar."""
    return (a["restricted_ptr"][a["slots_ptr"]] != 0) | a["grammar_on_ptr"].bool()


def deferred_rows(a: dict[str, Any], c: dict[str, Any]) -> torch.Tensor:
    """[rows] float64 from a process_logits launch: 1 where it leaves the row unwritten
    (DEFER: no penalty, allowed list, grammar, bias, stop ids in force nor bad words; a
    temperature the readers apply), else 0."""
    slots = a["slots_ptr"]
    if not c.get("DEFER"):
        return torch.zeros(slots.shape[0], dtype=torch.float64)
    sparse = _sparse_tokens(a, c)
    plain = (sparse["penalties"] + sparse["stopping"]) == 0
    plain &= ~_masks_on(a) & (a["biased_ptr"][slots] == 0)
    if c["HAS_BAD_WORDS"]:
        plain &= a["bad_back_ptr"][slots, 0] < 0
    return _f(plain)


def unread_rows(a: dict[str, Any], c: dict[str, Any]) -> torch.Tensor:
    """[rows] float64 from a process_logits launch: 1 where it reads nothing of the row and
    marks its tiles unknown (RESOLVE, DEFER and the tile maxima, without the raw tiles: a
    deferred random row that top-k, top-p and min_p leave uncut), else 0."""
    slots = a["slots_ptr"]
    if not (c.get("RESOLVE") and c.get("DEFER") and c["HAS_TILE_MAX"]) or c["HAS_RAW_TILES"]:
        return torch.zeros(slots.shape[0], dtype=torch.float64)
    top_k = a["top_k_ptr"][slots]
    uncut = ((top_k <= 0) | (top_k >= a["vocab_size"])) & (a["top_p_ptr"][slots] >= 1.0)
    uncut &= a["min_p_ptr"][slots] == 0.0
    random = a["temperature_ptr"][slots] >= c["GREEDY_BELOW"]
    return deferred_rows(a, c) * _f(uncut & random)


def _counted_words(a: dict[str, Any], c: dict[str, Any]) -> torch.Tensor:
    """[rows] float64: the share of a row's count bytes the dense pass reads, those of the
    32-token words its slot's output words mark (HAS_OUTPUT_WORDS: a bit a word, 32 an
    int32), else all."""
    slots = a["slots_ptr"]
    if not c.get("HAS_OUTPUT_WORDS"):
        return torch.ones(slots.shape[0], dtype=torch.float64)
    held = a["output_words_ptr"][slots].to(torch.int64) & 0xFFFFFFFF  # [rows, ceil(W / 32)]
    bits = (held[..., None] >> torch.arange(32)) & 1
    words = math.ceil(int(a["vocab_size"]) / 32)
    return bits.flatten(1)[:, :words].to(torch.float64).mean(-1)


def process_logits_work(a: dict[str, Any], c: dict[str, Any]) -> Work:
    from graphsafe_sampler.kernels import bad_words, sparse_phases, token_steps
    from graphsafe_sampler.kernels import logits_processing as k

    slots, vocab = a["slots_ptr"], a["vocab_size"]
    n = slots.shape[0]
    ones, zeros = torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    freq = a["frequency_ptr"][slots]
    fix_excess = freq != 0.0
    entries = a["num_overflow"]
    used = (a["overflow_token_ptr"][slots, :entries] >= 0).sum(1) * fix_excess
    # single tokens (biased, stop ids, banned, saturated); rows a full overflow table passes
    sparse_tokens = _sparse_tokens(a, c)
    sparse, full = sparse_tokens["tokens"] / vocab, sparse_tokens["full"]
    stopping, penalties = sparse_tokens["stopping"], sparse_tokens["penalties"]
    kept = 1 - deferred_rows(a, c)  # the rows it writes, and whose later phases run
    passed = 1 - unread_rows(a, c)  # the rows its dense pass reads
    # with the raw tiles, a deferred row's pass is token_steps.raw_pass, not the dense loop
    raw_pass = passed * (1 - kept) if c.get("DEFER") and c["HAS_RAW_TILES"] else zeros
    # bad words: a block read where its first entry is used, else that one; the ring gathered
    bad_rows, ring = zeros, zeros
    if c["HAS_BAD_WORDS"]:
        back, block = a["bad_back_ptr"][slots], c["BAD_BLOCK"]
        blocks, entries_used = math.ceil(back.shape[1] / block), (back[:, ::block] >= 0).sum(1)
        bad_rows = (entries_used * block + blocks - entries_used) / back.shape[1]
        ring = _f(entries_used > 0)
    bias = (a["bias_values_ptr"][slots] != 0.0).sum(1)
    # the sparse tables' blocks past their first, walked where used entries fill the first
    block, bad_block = c["SPARSE_BLOCK"], c["BAD_BLOCK"]
    bias_more = walks_past_first(a["bias_ids_ptr"][slots], block)
    stop_more = walks_past_first(a["stop_ids_ptr"][slots], block)
    bad_more = zeros
    if c["HAS_BAD_WORDS"] and a["num_bad"] > bad_block:
        bad_more = _f(a["bad_back_ptr"][slots][:, bad_block - 1] >= 0)
    drafts = ones if c["HAS_DRAFTS"] else zeros
    # the bitmasks: with the row flags (DEFER), read and tested only where a row has an
    # allowed list or a grammar (`token_steps.penalise_and_scale`)
    masks = _f(_masks_on(a)) if c.get("DEFER") else ones
    # ROW_SPARSE: a split row's phases after the dense pass, by its last program to arrive
    merging = {}
    if c.get("ROW_SPARSE"):
        last = kept / math.ceil(vocab / a["chunk"])
        merging = {source_line(k._process_logits_kernel, "if row_sparse:"): last}
    return Work(
        reads={
            # the dense pass, and the biased tokens again from their source value
            "source_ptr": passed + bias / vocab,
            # step 7 reads back the saturated tokens (and, at a full table, the whole row)
            "logits_ptr": used / vocab + full,
            "bad_tokens_ptr": bad_rows,
            "bad_back_ptr": bad_rows,
            "bad_word_ptr": bad_rows,
            "window_ptr": ring,
            "counts_ptr": torch.maximum(penalties * _counted_words(a, c), full),
            # the output words' row, read where the count bytes are (HAS_OUTPUT_WORDS)
            "output_words_ptr": penalties * float(c.get("HAS_OUTPUT_WORDS", False)),
            "prompt_mask_ptr": penalties,
            "allowed_ptr": masks,
            "grammar_ptr": masks if c["HAS_GRAMMAR"] else zeros,
            "stop_ids_ptr": stopping,
            "overflow_token_ptr": _f(fix_excess) * (used + 2) / (entries + 1),
            "overflow_excess_ptr": used / (entries + 1),
            "drafts_ptr": drafts,
            "num_preceding_ptr": drafts,
            "raw_tiles_ptr": zeros,
        },
        writes={
            "logits_ptr": (1 + sparse + full) * kept,
            "tile_max_ptr": ones * float(c["HAS_TILE_MAX"]),
            "raw_tiles_ptr": ones * float(c["HAS_RAW_TILES"]),
        },
        walks={
            # the row's partial last tile, alone: in a row's last program, whose main loop
            # walks a tile fewer (split_chunks), so no program is slower than a whole chunk
            tile_loop(k._process_logits_kernel, 0): 0 * ones,
            tile_loop(k._process_logits_kernel, 1): passed - raw_pass,
            tile_loop(token_steps.raw_pass, 0): 0 * ones,  # its partial tile, as above
            tile_loop(token_steps.raw_pass, 1): raw_pass,
            # the pass again with IEEE division (a quotient outside the fast range): never
            tile_loop(k._process_logits_kernel, 2): 0 * ones,
            tile_loop(sparse_phases.apply_excess, 0): full,
            # (above); the overflow table's walk over its used entries
            source_line(sparse_phases.apply_bias, "while more:"): bias_more,
            source_line(sparse_phases.ban_stop_ids, "while more:"): stopping * stop_more,
            source_line(bad_words.ban_bad_words, "while more:"): bad_more,
            source_line(sparse_phases.apply_excess, "while listed >= 0:"): _f(used > 0),
        },
        # steps 5 and 6 (token_steps), a branch on the row's parameters in each tile
        taken={
            # the phases after the dense pass, which a deferred row skips
            source_line(k._process_logits_kernel, "if store:"): kept,
            # the unread rows' tiles marked unknown
            source_line(k._process_logits_kernel, "if unread:"): 1 - passed,
            source_line(token_steps.penalise_and_scale, "if penalties_on:"): penalties,
            source_line(token_steps.penalise_and_scale, "if scale_on:"): sparse_tokens["scale_on"],
            source_line(token_steps.penalise_and_scale, "if masks_on:"): masks,
        },
        merging=merging,
    )
