"""Structured output with the real xgrammar, end to end (examples/structured_output.py).

A JSON schema compiled by xgrammar for a tokenizer built here, the tiny random-weight
decoder, and a churning batch of greedy and random rows: every request must end on EOS
within its token budget with a document that parses and matches the schema. The model's
vocabulary is padded past the tokenizer's, and the padding ids are given logits far above
every other: the grammar's mask must keep them out.

xgrammar is an optional extra (`pip install graphsafe-sampler[xgrammar]`); without it these
tests skip, but the one checking the example's message about it.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.examples import structured_output as so
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.testing.batch_driver import BatchDriver, DriverRequest, no_joins

WORDS = math.ceil(so.MODEL_VOCAB / 32)  # 12: the sampler's and xgrammar's bitmask width


@pytest.fixture
def xgr() -> Any:
    return pytest.importorskip("xgrammar")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # The tensors are tiny: a second torch thread only waits for the other core (under
    # xdist conftest already sets one thread a worker).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def allowed_ids(words: torch.Tensor | np.ndarray) -> np.ndarray:
    """[rows, W] int32 bitmask -> [rows, 32 W] bool, token t at column t."""
    array = np.ascontiguousarray(np.asarray(words), dtype=np.int32)
    bits = np.unpackbits(array.view(np.uint8), axis=-1, bitorder="little")
    return bits.astype(bool)


def test_the_padding_ids_are_masked_and_the_mask_is_the_samplers_width(xgr: Any) -> None:
    vocab = so.build_vocabulary()
    assert len(vocab) == so.TOKENIZER_SIZE and all(vocab)  # no empty token (see TOKEN_BUDGET)
    info = so.tokenizer_info(vocab)
    assert info.vocab_size == so.MODEL_VOCAB
    # xgrammar counts every id past the vocabulary list as a special token: never allowed
    assert set(range(so.TOKENIZER_SIZE, so.MODEL_VOCAB)) <= set(info.special_token_ids)
    matcher = xgr.GrammarMatcher(so.compile_schema(info))
    bitmask = xgr.allocate_token_bitmask(2, so.MODEL_VOCAB)
    assert tuple(bitmask.shape) == (2, WORDS) and bitmask.dtype == torch.int32
    for prefix in ("", '{"name": "a'):  # a document's start, then inside a string
        if prefix:
            assert matcher.accept_string(prefix)
        matcher.fill_next_token_bitmask(bitmask, 1)
        allowed = allowed_ids(bitmask)[1]
        assert allowed[: so.TOKENIZER_SIZE].any()
        assert not allowed[so.TOKENIZER_SIZE :].any(), "a padding id is allowed"

    # Told only the tokenizer's size, xgrammar's mask is 10 words: the sampler refuses it
    # rather than leave ids 320..383 unmasked, and the matcher refuses a 12-word buffer.
    short = xgr.TokenizerInfo(vocab, stop_token_ids=[so.EOS])
    narrow = xgr.allocate_token_bitmask(1, short.vocab_size)
    assert narrow.shape[1] == math.ceil(so.TOKENIZER_SIZE / 32) < WORDS
    sampler = Sampler(SamplerConfig(max_num_reqs=2, vocab_size=so.MODEL_VOCAB), "cpu")
    with pytest.raises(ValueError, match="shape"):
        sampler.stage_grammar_bitmask(narrow, [0])
    with pytest.raises(RuntimeError, match="shape"):
        xgr.GrammarMatcher(so.compile_schema(short)).fill_next_token_bitmask(bitmask, 0)


def test_padding_ids_with_huge_logits_are_sampled_only_without_the_grammar(xgr: Any) -> None:
    """The control for the end-to-end test: its boosted padding ids would win every row if
    the staged mask did not reach the sampler's logits."""
    rows = 4
    config = SamplerConfig(max_num_reqs=rows, vocab_size=so.MODEL_VOCAB, eos_token_id=so.EOS)
    sampler = Sampler(config, "cpu")
    driver = BatchDriver(config, churn=0.0, joins=no_joins, max_swaps=0, condense=0.0)
    for params in (SamplingParams(temperature=0.0), SamplingParams(top_k=20, top_p=0.9)) * 2:
        driver.add(DriverRequest(params, [1, 2]))
    sampler.update_state(driver.next_update())
    logits = torch.randn(rows, so.MODEL_VOCAB, generator=torch.Generator().manual_seed(0))
    logits[:, so.TOKENIZER_SIZE :] += 1e4
    unconstrained = sampler(logits, commit=False).sampled_token_ids[:, 0]
    assert (unconstrained >= so.TOKENIZER_SIZE).all()
    matcher = xgr.GrammarMatcher(so.compile_schema(so.tokenizer_info(so.build_vocabulary())))
    bitmask = xgr.allocate_token_bitmask(rows, so.MODEL_VOCAB)
    for row in range(rows):
        matcher.fill_next_token_bitmask(bitmask, row)
    sampler.stage_grammar_bitmask(bitmask, list(range(rows)))
    assert tuple(sampler.stages.grammar.bitmask.device.shape) == (rows, WORDS)
    constrained = sampler(logits, commit=False).sampled_token_ids[:, 0].tolist()
    allowed = allowed_ids(bitmask)
    assert all(allowed[row, t] for row, t in enumerate(constrained)), constrained


def test_the_budget_is_the_longest_document_the_grammar_accepts(xgr: Any) -> None:
    """TOKEN_BUDGET rests on MAX_DOCUMENT_CHARS: the grammar accepts that longest
    document, character for character, and nothing longer in any of its fields."""
    grammar = so.compile_schema(so.tokenizer_info(so.build_vocabulary()))
    longest = json.dumps(so._LONGEST, separators=(", ", ": "))
    assert len(longest) == so.MAX_DOCUMENT_CHARS
    matcher = xgr.GrammarMatcher(grammar)
    assert matcher.accept_string(longest) and matcher.accept_token(so.EOS)
    assert matcher.is_terminated()
    so.check_document(longest)
    for field, longer in (
        ("name", "x" * (so.NAME_MAX + 1)),
        ("age", so.AGE_MAX + 1),
        ("score", so.SCORE_MIN - 1),
        ("tags", ["x" * so.TAG_MAX] * (so.MAX_TAGS + 1)),
    ):
        doc = json.dumps({**so._LONGEST, field: longer}, separators=(", ", ": "))
        assert not xgr.GrammarMatcher(grammar).accept_string(doc), field
        with pytest.raises(ValueError, match=field):
            so.check_document(doc)
    # and the compact separators are the only ones: no whitespace to wander in
    assert not xgr.GrammarMatcher(grammar).accept_string('{ "name"')


@pytest.mark.parametrize(
    "doc",
    [
        "[]",
        '{"name": "a", "age": 1, "role": "admin", "active": true}',  # tags missing
        '{"name": "", "age": 1, "role": "admin", "active": true, "tags": []}',
        '{"name": "a", "age": true, "role": "admin", "active": true, "tags": []}',
        '{"name": "a", "age": 1, "role": "root", "active": true, "tags": []}',
        '{"name": "a", "age": 1, "role": "user", "active": 1, "tags": []}',
        '{"name": "a", "age": 1, "role": "user", "active": true, "tags": [1]}',
        '{"name": "a", "age": 1, "role": "user", "active": true, "tags": [], "x": 1}',
    ],
)
def test_the_hand_written_check_refuses_what_breaks_the_schema(doc: str) -> None:
    with pytest.raises(ValueError):
        so.check_document(doc)


@pytest.mark.parametrize("which", ["seed-0", "fresh-seed"])
def test_every_request_ends_in_json_matching_the_schema(xgr: Any, which: str) -> None:
    """16 requests over 6 rows (so 10 join at rows freed by finished ones; rows are also
    swapped and condensed), greedy and random rows, padding ids boosted by 1e4."""
    if which == "seed-0":
        seed = 0
    else:  # fresh model weights every run; GS_STRUCTURED_OUTPUT_SEED replays one
        seed = int(os.environ.get("GS_STRUCTURED_OUTPUT_SEED", random.randrange(2**31)))
    print(f"seed {seed} (GS_STRUCTURED_OUTPUT_SEED={seed} replays it)")
    staged: list[int] = []

    def check_mask(bitmask: torch.Tensor, rows: list[int]) -> None:
        assert bitmask.dtype == torch.int32 and tuple(bitmask.shape) == (len(rows), WORDS)
        assert not allowed_ids(bitmask)[:, so.TOKENIZER_SIZE :].any(), f"seed {seed}"
        staged.append(len(rows))

    options = so.Options(requests=16, rows=6, seed=seed, padding_logit=1e4)
    done = so.generate(options, log=None, on_stage=check_mask)
    assert sorted(c.request_id for c in done) == list(range(16))
    assert max(staged) == 6 and len(staged) > 0
    kinds = {c.params.temperature == 0.0 for c in done}
    assert kinds == {True, False}, f"seed {seed}: greedy and random rows should mix"
    for c in done:
        where = f"seed {seed}, request {c.request_id}: {c.text!r}"
        assert c.finish_reason == "eos", where
        assert c.token_ids[-1] == so.EOS and so.EOS not in c.token_ids[:-1], where
        assert len(c.token_ids) <= so.TOKEN_BUDGET, where
        assert max(c.token_ids) < so.TOKENIZER_SIZE, where
        assert len(c.text) <= so.MAX_DOCUMENT_CHARS, where
        so.check_document(c.text)


def test_the_example_says_how_to_install_xgrammar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` raises ImportError
    with pytest.raises(SystemExit, match=r"pip install graphsafe-sampler\[xgrammar\]"):
        so.main(["--requests", "1"])
