"""Structured output with xgrammar: JSON that matches a schema, from a random-weight model.

    python -m graphsafe_sampler.examples.structured_output [--requests 16] [--rows 6] [--seed N]

The tiny random-weight decoder (`tiny_decoder.py`) serves a stream of requests over a
persistent batch: requests finish (their matcher accepted EOS), and new ones take the freed
rows between steps. Each step the engine asks every request's `xgrammar.GrammarMatcher` for
its next-token bitmask, stages those rows with `Sampler.stage_grammar_bitmask`, runs the
model and the sampler, and hands each sampled token back to its matcher. The model knows
nothing of JSON; the mask alone makes every completion a document that matches `SCHEMA`.

The tokenizer is built here, from a vocabulary list (printable ASCII characters and some
multi-character JSON pieces), so nothing is downloaded. The model's vocabulary is padded past
the tokenizer's, as real LM heads are (ids TOKENIZER_SIZE.. are no token): xgrammar is told
the model's size, masks those ids as special tokens, and its bitmask is ceil(V/32) words
wide, the width the sampler stages.

xgrammar is an optional extra: `pip install graphsafe-sampler[xgrammar]`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from graphsafe_sampler.config import SamplerConfig
from graphsafe_sampler.examples.tiny_decoder import TinyDecoder, TinyDecoderConfig
from graphsafe_sampler.params import SamplingParams
from graphsafe_sampler.sampler import Sampler
from graphsafe_sampler.testing.batch_driver import BatchDriver, DriverRequest, no_joins

if TYPE_CHECKING:
    import xgrammar

INSTALL_HINT = "pip install graphsafe-sampler[xgrammar]"

EOS = 0  # the tokenizer's stop token: the only token a finished document allows
TOKENIZER_SIZE = 300  # tokens the tokenizer has
MODEL_VOCAB = 384  # the LM head's width (padded to a multiple of 128): 84 ids no token has
MAX_PROMPT = 6

NAME_MAX, TAG_MAX, MAX_TAGS = 8, 5, 3
AGE_MAX, SCORE_MIN, SCORE_MAX = 120, -50, 50
ROLES = ("admin", "user", "guest")

# Every value is bounded, so every document is: strings by maxLength, integers by their
# range, arrays by maxItems; strict mode forbids other keys and any_whitespace=False fixes
# the separators (", " and ": "). "score" is optional.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": NAME_MAX},
        "age": {"type": "integer", "minimum": 0, "maximum": AGE_MAX},
        "role": {"enum": list(ROLES)},
        "active": {"type": "boolean"},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": TAG_MAX},
            "maxItems": MAX_TAGS,
        },
        "score": {"type": ["integer", "null"], "minimum": SCORE_MIN, "maximum": SCORE_MAX},
    },
    "required": ["name", "age", "role", "active", "tags"],
    "additionalProperties": False,
}

# The longest document the schema allows, written as the grammar writes it (xgrammar's
# strings exclude escapes, and the vocabulary is ASCII, so a character is a character).
_LONGEST = {
    "name": "x" * NAME_MAX,
    "age": AGE_MAX,
    "role": max(ROLES, key=len),
    "active": False,
    "tags": ["x" * TAG_MAX] * MAX_TAGS,
    "score": SCORE_MIN,
}
MAX_DOCUMENT_CHARS = len(json.dumps(_LONGEST, separators=(", ", ": ")))
# Why no request can run out of tokens: every token the matcher accepts, but EOS, is at
# least one character of the document (the empty string is a special token, which xgrammar
# never allows, and so are the padding ids), so a document takes at most
# MAX_DOCUMENT_CHARS tokens, and then EOS is the only token its mask allows.
TOKEN_BUDGET = MAX_DOCUMENT_CHARS + 1


def build_vocabulary() -> list[str]:
    """TOKENIZER_SIZE distinct tokens: EOS, every printable ASCII character (so any
    document can be spelt), then multi-character pieces a JSON tokenizer would learn."""
    pieces = ["</s>", *(chr(c) for c in range(32, 127))]
    pieces += ['{"', '": ', '", "', '", ', ', "', '"}', '"]', '["', '"]}', "[]", "}"]
    pieces += ["true", "false", "null", "name", "age", "role", "active", "tags", "score"]
    pieces += ['{"name": "', '", "age": ', ', "role": "', ', "tags": [', ', "score": ']
    pieces += [*ROLES, *(str(n) for n in range(10, 100))]
    letters = "etaoinshrdlucm"
    pieces += [a + b for a in letters for b in letters]
    vocab = list(dict.fromkeys(pieces))[:TOKENIZER_SIZE]
    if len(vocab) != TOKENIZER_SIZE:
        raise AssertionError(f"the vocabulary has {len(vocab)} tokens, not {TOKENIZER_SIZE}")
    return vocab


def tokenizer_info(vocab: Sequence[str]) -> xgrammar.TokenizerInfo:
    """xgrammar's view of `vocab`, the model's vocabulary being MODEL_VOCAB ids wide."""
    import xgrammar as xgr

    # vocab_size: ids past the list are special tokens, masked in every bitmask, and the
    # bitmask is ceil(MODEL_VOCAB / 32) words (without it, ceil(len(vocab) / 32), which the
    # sampler refuses: it stages exactly ceil(V / 32)).
    return xgr.TokenizerInfo(
        list(vocab), xgr.VocabType.RAW, vocab_size=MODEL_VOCAB, stop_token_ids=[EOS]
    )


def compile_schema(info: xgrammar.TokenizerInfo) -> xgrammar.CompiledGrammar:
    """SCHEMA compiled for `info`'s tokens: compact separators, no other keys."""
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(info, max_threads=1)
    return compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, strict_mode=True)


def check_document(text: str) -> dict[str, Any]:
    """The document `text` parsed, or ValueError naming what breaks SCHEMA (checked by
    hand: jsonschema is not a dependency)."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError(f"not an object: {text!r}")
    keys, required = set(doc), set(SCHEMA["required"])
    if not required <= keys <= set(SCHEMA["properties"]):
        raise ValueError(f"keys {sorted(keys)}: {sorted(required)} are required, no others")

    def is_int(value: object, low: int, high: int) -> bool:
        return type(value) is int and low <= value <= high

    def is_str(value: object, low: int, high: int) -> bool:
        return isinstance(value, str) and low <= len(value) <= high

    tags = doc["tags"]
    checks = {
        "name": is_str(doc["name"], 1, NAME_MAX),
        "age": is_int(doc["age"], 0, AGE_MAX),
        "role": doc["role"] in ROLES,
        "active": isinstance(doc["active"], bool),
        "tags": isinstance(tags, list)
        and len(tags) <= MAX_TAGS
        and all(is_str(t, 0, TAG_MAX) for t in tags),
        "score": doc.get("score") is None or is_int(doc["score"], SCORE_MIN, SCORE_MAX),
    }
    bad = [key for key, ok in checks.items() if not ok]
    if bad:
        raise ValueError(f"{', '.join(bad)} break the schema: {text!r}")
    return doc


def random_params(rng: random.Random) -> SamplingParams:
    """A third greedy; the rest temperature 1, some with top-k and top-p."""
    if rng.random() < 1 / 3:
        return SamplingParams(temperature=0.0)
    return SamplingParams(
        temperature=1.0,
        top_k=rng.choice([0, 0, 5, 20]),
        top_p=rng.choice([1.0, 1.0, 0.9, 0.7]),
        seed=rng.randrange(2**31) if rng.random() < 0.5 else None,
    )


@dataclass(frozen=True)
class Options:
    """requests: the stream's length; rows: the batch (max_num_reqs); seed: the model's
    weights, prompts, parameters; padding_logit: added to the logits of the padding ids
    (TOKENIZER_SIZE..) every step, to show the grammar keeps them out whatever they score."""

    requests: int = 16
    rows: int = 6
    seed: int = 0
    padding_logit: float = 0.0


@dataclass
class Completion:
    """One finished request: its tokens (EOS last), their text and why it finished."""

    request_id: int
    params: SamplingParams
    token_ids: list[int]
    text: str
    finish_reason: str
    step: int


# (bitmask as staged, its batch rows): a hook the tests use to look at each step's mask.
StageHook = Callable[[torch.Tensor, list[int]], None]


def _next_input(req: DriverRequest) -> tuple[int, int]:
    """(token, position) the decode step feeds: the newest token of the sequence."""
    sequence = [*(req.prompt_tok_ids or ()), *req.output_tok_ids]
    return sequence[-1], len(sequence) - 1


def generate(
    options: Options,
    *,
    log: Callable[[str], None] | None = print,
    on_stage: StageHook | None = None,
) -> list[Completion]:
    """Serve `options.requests` requests, each constrained by SCHEMA; returns them in the
    order they finished. Raises RuntimeError if a matcher refuses a sampled token."""
    import xgrammar as xgr

    say = log or (lambda _: None)
    vocab = build_vocabulary()
    grammar = compile_schema(tokenizer_info(vocab))
    rows = options.rows
    config = SamplerConfig(
        max_num_reqs=rows, vocab_size=MODEL_VOCAB, eos_token_id=EOS, seed=options.seed
    )
    sampler = Sampler(config, device="cpu")
    model = TinyDecoder(
        TinyDecoderConfig(
            vocab_size=MODEL_VOCAB,
            num_kv_slots=rows,
            max_seq_len=MAX_PROMPT + TOKEN_BUDGET,
            seed=options.seed,
        )
    )
    # The serving loop's batch: only our requests join, a request leaves when it samples
    # EOS (or, never, at TOKEN_BUDGET tokens), a random swap a step moves requests between
    # rows (their masks are restaged by row), and holes are condensed as vLLM does.
    driver = BatchDriver(
        config,
        seed=options.seed,
        churn=0.0,
        joins=no_joins,
        finish=True,
        max_swaps=1,
        condense=1.0,
    )
    rng = random.Random(options.seed)
    pending = deque(range(options.requests))
    matchers: dict[int, xgrammar.GrammarMatcher] = {}
    free_kv_slots = list(range(rows))
    kv_slots: dict[int, int] = {}  # request_id -> KV slot, for the request's life
    # One host buffer for the whole batch, as an engine keeps; rows [0, batch) are filled.
    bitmask = xgr.allocate_token_bitmask(rows, MODEL_VOCAB)
    say(
        f"tokenizer: {TOKENIZER_SIZE} tokens; model vocabulary {MODEL_VOCAB} (ids "
        f"{TOKENIZER_SIZE}..{MODEL_VOCAB - 1} are padding); bitmask {list(bitmask.shape)} "
        f"int32 (ceil({MODEL_VOCAB}/32) = {math.ceil(MODEL_VOCAB / 32)} words a row)\n"
        f"schema: {json.dumps(SCHEMA)}\n"
        f"longest document {MAX_DOCUMENT_CHARS} characters, so at most {TOKEN_BUDGET} tokens "
        f"with EOS; {options.requests} requests over {rows} rows, seed {options.seed}"
    )
    done: list[Completion] = []
    step = 0
    start = time.perf_counter()
    while pending or matchers:  # matchers: the requests still running
        while pending and driver.free_rows():
            rid = pending.popleft()
            prompt = [rng.randrange(1, TOKENIZER_SIZE) for _ in range(rng.randint(1, MAX_PROMPT))]
            kv_slots[rid] = heapq.heappop(free_kv_slots)
            model.prefill(kv_slots[rid], prompt[:-1])  # the decode step feeds the last one
            matchers[rid] = xgr.GrammarMatcher(grammar)
            params = random_params(rng)
            driver.add(DriverRequest(params, prompt, max_tokens=TOKEN_BUDGET, request_id=rid))
        update = driver.next_update()
        sampler.update_state(update if update.removed or update.added or update.moved else None)
        # Condensed: rows [0, batch_size) all hold requests, and row i is logits row i.
        batch = [req for req in driver.rows[: update.batch_size] if req is not None]
        if len(batch) != update.batch_size:
            raise AssertionError(f"the batch has holes: {driver.rows}")
        for row, req in enumerate(batch):
            matchers[req.request_id].fill_next_token_bitmask(bitmask, row)
        batch_rows = list(range(len(batch)))
        sampler.stage_grammar_bitmask(bitmask[: len(batch)], batch_rows)
        if on_stage is not None:
            on_stage(bitmask[: len(batch)], batch_rows)
        inputs = [_next_input(req) for req in batch]
        with torch.no_grad():
            logits = model(
                torch.tensor([t for t, _ in inputs]),
                torch.tensor([kv_slots[req.request_id] for req in batch]),
                torch.tensor([p for _, p in inputs]),
            )
            logits[:, TOKENIZER_SIZE:] += options.padding_logit
            tokens = sampler(logits).sampled_token_ids[:, 0].tolist()
        for req, token in zip(batch, tokens, strict=True):
            if not matchers[req.request_id].accept_token(token):
                raise RuntimeError(
                    f"request {req.request_id}: the grammar refused token {token} after "
                    f"{req.output_tok_ids}: the sampler did not apply the mask"
                )
        driver.record_tokens(tokens)  # appends; a request that sampled EOS leaves its row
        step += 1
        for row, req in enumerate(batch):
            if req.finish_reason is None:
                continue
            rid = req.request_id
            terminated = matchers.pop(rid).is_terminated()
            if terminated != (req.finish_reason == "eos"):
                raise RuntimeError(
                    f"request {rid}: finished ({req.finish_reason}) but the "
                    f"matcher is{'' if terminated else ' not'} terminated"
                )
            heapq.heappush(free_kv_slots, kv_slots.pop(rid))
            text = "".join(vocab[t] for t in req.output_tok_ids if t != EOS)
            done.append(
                Completion(rid, req.params, list(req.output_tok_ids), text, req.finish_reason, step)
            )
            kind = "greedy" if req.params.temperature == 0 else "random"
            say(
                f"step {step:4d} row {row} request {rid:3d} {kind:6s} "
                f"{len(req.output_tok_ids):3d} tokens {req.finish_reason}: {text}"
            )
    seconds = time.perf_counter() - start
    num_tokens = sum(len(c.token_ids) for c in done)
    say(f"{len(done)} requests, {num_tokens} tokens in {step} steps, {seconds:.2f} s")
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=Options.requests)
    parser.add_argument("--rows", type=int, default=Options.rows)
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed")
    args = parser.parse_args(argv)
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        raise SystemExit(f"this example needs xgrammar: {INSTALL_HINT}") from None
    # One thread: these tensors are tiny, and a second thread on a busy 2-core machine makes
    # each op wait for it (16 ms an einsum instead of 0.1 ms, measured).
    torch.set_num_threads(1)
    seed = random.randrange(2**31) if args.seed is None else args.seed
    done = generate(Options(requests=args.requests, rows=args.rows, seed=seed))
    bad = []
    for c in done:
        try:
            if c.finish_reason != "eos":
                raise ValueError(f"finished by {c.finish_reason}, not EOS")
            check_document(c.text)
        except ValueError as exc:
            bad.append(f"request {c.request_id}: {exc}")
    if bad:
        sys.exit("\n".join([f"invalid documents (seed {seed}):", *bad]))
    print(f"all {len(done)} documents are valid JSON matching the schema (seed {seed})")


if __name__ == "__main__":
    main()
