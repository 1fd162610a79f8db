"""vLLM V1's built-in logits processors as it writes them: per-request state in dicts keyed
by batch row (`apply_dict_updates`, vLLM's `process_dict_updates`), index lists rebuilt by
Python loops on every change, and the bad-words loop over requests and words."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from graphsafe_sampler.batch_update import BatchUpdate, MoveDirectionality
from graphsafe_sampler.params import SamplingParams

T = TypeVar("T")


def apply_dict_updates(
    entries: dict[int, T],
    batch_update: BatchUpdate | None,
    new_entry: Callable[[SamplingParams, Sequence[int], Sequence[int]], T | None],
) -> bool:
    """vLLM's `process_dict_updates`, in the order of docs/design.md §3 (removed, added,
    moved); returns whether anything changed."""
    if batch_update is None:
        return False
    changed = False
    for row in batch_update.removed:
        changed |= entries.pop(row, None) is not None
    for row, params, prompt, output in batch_update.added:
        entry = new_entry(params, prompt or (), output)
        if entry is not None:
            entries[row] = entry
            changed = True
        else:
            changed |= entries.pop(row, None) is not None
    for a, b, direction in batch_update.moved:
        a_entry, b_entry = entries.pop(a, None), entries.pop(b, None)
        if a_entry is not None:
            entries[b] = a_entry
            changed = True
        if b_entry is not None:
            changed = True
            if direction is MoveDirectionality.SWAP:
                entries[a] = b_entry
    return changed


def device_tensor(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype, device="cpu").to(device, non_blocking=True)


class LogitBias:
    """vLLM's `LogitBiasLogitsProcessor`: index lists rebuilt from a dict on every change."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.biases: dict[int, dict[int, float]] = {}
        self.rows = self.cols = device_tensor([], torch.int64, device)
        self.values = device_tensor([], torch.float32, device)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if not apply_dict_updates(self.biases, batch_update, lambda p, _, __: p.logit_bias or None):
            return
        rows: list[int] = []
        cols: list[int] = []
        values: list[float] = []
        for row, bias in self.biases.items():
            rows.extend([row] * len(bias))
            cols.extend(bias.keys())
            values.extend(bias.values())
        self.rows = device_tensor(rows, torch.int64, self.device)
        self.cols = device_tensor(cols, torch.int64, self.device)
        self.values = device_tensor(values, torch.float32, self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.biases:
            logits[self.rows, self.cols] += self.values
        return logits


class MinTokens:
    """vLLM's `MinTokensLogitsProcessor`: stop ids (and EOS) are -inf while a request has
    fewer than min_tokens outputs; the host checks every request's length every step."""

    def __init__(self, eos_token_id: int | None, device: torch.device) -> None:
        self.eos_token_id = eos_token_id
        self.device = device
        # row -> (min_tokens, live output list, stop ids)
        self.min_toks: dict[int, tuple[int, Sequence[int], list[int]]] = {}
        self.rows = self.cols = device_tensor([], torch.int64, device)

    def _new_entry(
        self, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]
    ) -> tuple[int, Sequence[int], list[int]] | None:
        stop_ids = set(params.stop_token_ids or ())
        if self.eos_token_id is not None:
            stop_ids.add(self.eos_token_id)
        if not params.min_tokens or len(output) >= params.min_tokens or not stop_ids:
            return None
        return params.min_tokens, output, sorted(stop_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        changed = apply_dict_updates(self.min_toks, batch_update, self._new_entry)
        done = [row for row, (n, out, _) in self.min_toks.items() if len(out) >= n]
        for row in done:
            del self.min_toks[row]
        if not (changed or done):
            return
        rows: list[int] = []
        cols: list[int] = []
        for row, (_, _, stop_ids) in self.min_toks.items():
            rows.extend([row] * len(stop_ids))
            cols.extend(stop_ids)
        self.rows = device_tensor(rows, torch.int64, self.device)
        self.cols = device_tensor(cols, torch.int64, self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.min_toks:
            logits[self.rows, self.cols] = float("-inf")
        return logits


def apply_bad_words(
    logits: torch.Tensor,  # [rows, V] float32, updated in place
    bad_words: dict[int, list[list[int]]],
    output_tok_ids: list[Sequence[int]],
) -> None:
    """vLLM's `apply_bad_words`: a Python loop over requests and their words."""
    for row, words in bad_words.items():
        past = output_tok_ids[row]
        for word in words:
            prefix_len = len(word) - 1
            if prefix_len > len(past):
                continue
            if prefix_len == 0 or list(past[-prefix_len:]) == word[:-1]:
                logits[row, word[-1]] = float("-inf")
