"""The Triton kernels as `torch.library` custom ops, so `torch.compile(fullgraph=True)` and
CUDA graphs see one opaque, in-place op per kernel on any device.

`custom_op` (not `triton_op`) is the registration that also works on CPU tensors under
`TRITON_INTERPRET=1` when compiled (inductor would otherwise trace into the kernel). Each
op's fake implementation allocates nothing: the kernels work in place. Kernels are imported
inside the ops, so importing this module does not import Triton.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("graphsafe_sampler::apply_min_p", mutates_args=("logits",))
def apply_min_p(logits: torch.Tensor, slots: torch.Tensor, min_p: torch.Tensor) -> None:
    """logits [num_rows, V] float32 (in place); slots [num_rows] int64; min_p [num_slots]
    float32. Tokens below max_logit + ln(min_p) become -inf."""
    from graphsafe_sampler.kernels.min_p import apply_min_p as launch

    if logits.dtype != torch.float32:
        raise TypeError(f"logits must be float32, got {logits.dtype}")
    if logits.stride(-1) != 1:
        raise ValueError("logits rows must be contiguous (stride 1 along the vocabulary)")
    launch(logits, slots, min_p)


@apply_min_p.register_fake
def _(logits: torch.Tensor, slots: torch.Tensor, min_p: torch.Tensor) -> None:
    return None


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dtype != torch.float32:
        raise TypeError(f"logits must be float32, got {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [num_rows, vocab_size], got {logits.dim()}-D")
    if logits.stride(-1) != 1:
        raise ValueError("logits rows must be contiguous (stride 1 along the vocabulary)")


def _check_rows(name: str, t: torch.Tensor, dtype: torch.dtype, num_rows: int) -> None:
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.shape != (num_rows,):
        raise ValueError(f"{name} must have shape ({num_rows},), got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


@torch.library.custom_op("graphsafe_sampler::sample_tokens", mutates_args=("tokens",))
def sample_tokens(
    logits: torch.Tensor,
    slots: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    threshold: torch.Tensor | None,
    tokens: torch.Tensor,
    salt: int = 0,
) -> None:
    """Greedy argmax or the counter-based Gumbel-max race, merged per row into `tokens`.

    logits [num_rows, V] float32 (read only); slots, positions [num_rows] int64; temperature
    [num_slots] float32 (below 1e-5 is greedy); seeds [num_slots] int64; threshold
    [num_rows] float32 or None (tokens below it count as -inf); tokens [num_rows] int64
    (written); salt: the random stream (ops/rng.py's SALT_*).
    """
    from graphsafe_sampler.kernels.sampling import sample_tokens as launch

    _check_logits(logits)
    num_rows = logits.shape[0]
    _check_rows("slots", slots, torch.int64, num_rows)
    _check_rows("positions", positions, torch.int64, num_rows)
    _check_rows("tokens", tokens, torch.int64, num_rows)
    if threshold is not None:
        _check_rows("threshold", threshold, torch.float32, num_rows)
    if temperature.dtype != torch.float32:
        raise TypeError(f"temperature must be float32, got {temperature.dtype}")
    if seeds.dtype != torch.int64:
        raise TypeError(f"seeds must be int64, got {seeds.dtype}")
    launch(logits, slots, temperature, seeds, positions, tokens, threshold, salt)


@sample_tokens.register_fake
def _(
    logits: torch.Tensor,
    slots: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    threshold: torch.Tensor | None,
    tokens: torch.Tensor,
    salt: int = 0,
) -> None:
    return None


@torch.library.custom_op(
    "graphsafe_sampler::rng_noise", mutates_args=("hashes", "uniforms", "gumbels")
)
def rng_noise(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    hashes: torch.Tensor,
    uniforms: torch.Tensor,
    gumbels: torch.Tensor,
    salt: int = 0,
) -> None:
    """The sampling kernel's draws for token ids 0..V-1 (tests and debugging).

    seeds, positions [num_rows] int64; hashes [num_rows, V] int64, uniforms and gumbels
    [num_rows, V] float32, all contiguous and written.
    """
    from graphsafe_sampler.kernels.sampling import write_rng_noise as launch

    num_rows = seeds.shape[0]
    _check_rows("seeds", seeds, torch.int64, num_rows)
    _check_rows("positions", positions, torch.int64, num_rows)
    for name, t, dtype in (
        ("hashes", hashes, torch.int64),
        ("uniforms", uniforms, torch.float32),
        ("gumbels", gumbels, torch.float32),
    ):
        if t.dtype != dtype or t.dim() != 2 or t.shape != hashes.shape:
            raise ValueError(f"{name} must be {dtype} of shape {tuple(hashes.shape)}")
        if not t.is_contiguous() or t.shape[0] != num_rows:
            raise ValueError(f"{name} must be contiguous with {num_rows} rows")
    launch(seeds, positions, hashes, uniforms, gumbels, salt)


@rng_noise.register_fake
def _(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    hashes: torch.Tensor,
    uniforms: torch.Tensor,
    gumbels: torch.Tensor,
    salt: int = 0,
) -> None:
    return None


def _check_top_k_top_p(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None,
) -> None:
    _check_logits(logits)
    num_rows = logits.shape[0]
    _check_rows("slots", slots, torch.int64, num_rows)
    _check_rows("threshold", threshold, torch.float32, num_rows)
    if top_k.dtype != torch.int32:
        raise TypeError(f"top_k must be torch.int32, got {top_k.dtype}")
    if top_p.dtype != torch.float32:
        raise TypeError(f"top_p must be torch.float32, got {top_p.dtype}")
    for name, table in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        if table is not None and not table.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if min_p is not None:
        if min_p.dtype != torch.float32:
            raise TypeError(f"min_p must be torch.float32, got {min_p.dtype}")
        if min_p.shape != top_p.shape:
            raise ValueError(
                f"min_p must have the shape of top_p {tuple(top_p.shape)}, got {tuple(min_p.shape)}"
            )


@torch.library.custom_op("graphsafe_sampler::top_k_top_p_threshold", mutates_args=("threshold",))
def top_k_top_p_threshold(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> None:
    """Each row's top-k-then-top-p cut into `threshold` (keep logits >= it; -inf when off),
    without writing the logits. logits [num_rows, V] float32; slots [num_rows] int64; top_k
    [num_slots] int32 (<= 0 or >= V off); top_p [num_slots] float32 (>= 1 off); threshold
    [num_rows] float32. min_p [num_slots] float32 (0 off), when given: min_p's cut first,
    folded into the threshold (kernels/top_k_top_p.py)."""
    from graphsafe_sampler.kernels.top_k_top_p import top_k_top_p_threshold as launch

    _check_top_k_top_p(logits, slots, top_k, top_p, threshold, min_p)
    launch(logits, slots, top_k, top_p, threshold, apply=False, min_p=min_p)


@top_k_top_p_threshold.register_fake
def _(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> None:
    return None


@torch.library.custom_op(
    "graphsafe_sampler::apply_top_k_top_p", mutates_args=("logits", "threshold")
)
def apply_top_k_top_p(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> None:
    """`top_k_top_p_threshold`, then the logits below each row's cut become -inf in place
    (ops/top_k_top_p.py's apply_top_k_top_p, after min_p's mask when `min_p` is given)."""
    from graphsafe_sampler.kernels.top_k_top_p import top_k_top_p_threshold as launch

    _check_top_k_top_p(logits, slots, top_k, top_p, threshold, min_p)
    launch(logits, slots, top_k, top_p, threshold, apply=True, min_p=min_p)


@apply_top_k_top_p.register_fake
def _(
    logits: torch.Tensor,
    slots: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    threshold: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> None:
    return None


def _check_table(
    name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int | None, ...]
) -> None:
    """dtype, contiguity and shape (None = any size along that dimension)."""
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(
        n is not None and n != m for n, m in zip(shape, t.shape, strict=True)
    ):
        want = ", ".join("*" if n is None else str(n) for n in shape)
        raise ValueError(f"{name} must have shape [{want}], got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


@torch.library.custom_op("graphsafe_sampler::process_logits", mutates_args=("logits",))
def process_logits(
    logits: torch.Tensor,
    slots: torch.Tensor,
    bias_ids: torch.Tensor,
    bias_values: torch.Tensor,
    min_tokens: torch.Tensor,
    num_generated: torch.Tensor,
    stop_ids: torch.Tensor,
    allowed: torch.Tensor,
    grammar: torch.Tensor | None,
    counts: torch.Tensor,
    overflow_token: torch.Tensor,
    overflow_excess: torch.Tensor,
    prompt_mask: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    temperature: torch.Tensor,
    drafts: torch.Tensor | None = None,
    num_preceding: torch.Tensor | None = None,
) -> None:
    """Logit bias, min_tokens, allowed and grammar bitmasks, penalties and temperature on
    logits [num_rows, V] float32, in place, in one pass (kernels/logits_processing.py).

    Per slot ([num_slots, ...]): bias_ids int32 / bias_values float32 [C]; min_tokens,
    num_generated int32; stop_ids int32 [S]; allowed, prompt_mask int32 [ceil(V/32)];
    counts uint8 [V] (the output count, 255 = saturated); overflow_token (-1 unused, used
    entries first) / overflow_excess int32 [E + 1] (a saturated token's count - 255; column
    E is the commit's spare, never read): penalties.py's PenaltyState layout; repetition,
    frequency, presence, temperature float32. grammar: int32 [num_rows, ceil(V/32)] by
    row, or None. drafts int64 [num_rows, D] with num_preceding int64 [num_rows] (both or
    neither): a speculative step's drafted ids, of which the first num_preceding[r] precede
    row r's position and count as output tokens for the penalties and min_tokens.
    """
    from graphsafe_sampler.kernels.logits_processing import process_logits as launch

    _check_logits(logits)
    num_rows, vocab_size = logits.shape
    _check_rows("slots", slots, torch.int64, num_rows)
    num_slots, words = allowed.shape[0], (vocab_size + 31) // 32
    for name, t, dtype, shape in (
        ("bias_ids", bias_ids, torch.int32, (num_slots, None)),
        ("bias_values", bias_values, torch.float32, (num_slots, bias_ids.shape[-1])),
        ("min_tokens", min_tokens, torch.int32, (num_slots,)),
        ("num_generated", num_generated, torch.int32, (num_slots,)),
        ("stop_ids", stop_ids, torch.int32, (num_slots, None)),
        ("allowed", allowed, torch.int32, (num_slots, words)),
        ("counts", counts, torch.uint8, (num_slots, vocab_size)),
        ("overflow_token", overflow_token, torch.int32, (num_slots, None)),
        ("overflow_excess", overflow_excess, torch.int32, (num_slots, overflow_token.shape[-1])),
        ("prompt_mask", prompt_mask, torch.int32, (num_slots, words)),
        ("repetition", repetition, torch.float32, (num_slots,)),
        ("frequency", frequency, torch.float32, (num_slots,)),
        ("presence", presence, torch.float32, (num_slots,)),
        ("temperature", temperature, torch.float32, (num_slots,)),
    ):
        _check_table(name, t, dtype, shape)
    if grammar is not None:
        _check_table("grammar", grammar, torch.int32, (num_rows, words))
    if overflow_token.shape[1] < 2:
        raise ValueError(
            f"overflow_token must have E + 1 >= 2 columns, got {overflow_token.shape[1]}"
        )
    if (drafts is None) != (num_preceding is None):
        raise ValueError("drafts and num_preceding come together")
    if drafts is not None and num_preceding is not None:
        if drafts.dtype != torch.int64:
            raise TypeError(f"drafts must be torch.int64, got {drafts.dtype}")
        if drafts.dim() != 2 or drafts.shape[0] != num_rows or not drafts.is_contiguous():
            raise ValueError(
                f"drafts must be a contiguous [{num_rows}, D] tensor, got shape "
                f"{tuple(drafts.shape)}"
            )
        _check_rows("num_preceding", num_preceding, torch.int64, num_rows)
        if drafts.shape[1] == 0:
            raise ValueError("drafts must have at least one column (D >= 1)")
    launch(
        logits, slots, bias_ids, bias_values, min_tokens, num_generated, stop_ids, allowed,
        grammar, counts, overflow_token, overflow_excess, prompt_mask, repetition, frequency,
        presence, temperature, drafts, num_preceding,
    )  # fmt: skip


@process_logits.register_fake
def _(
    logits: torch.Tensor,
    slots: torch.Tensor,
    bias_ids: torch.Tensor,
    bias_values: torch.Tensor,
    min_tokens: torch.Tensor,
    num_generated: torch.Tensor,
    stop_ids: torch.Tensor,
    allowed: torch.Tensor,
    grammar: torch.Tensor | None,
    counts: torch.Tensor,
    overflow_token: torch.Tensor,
    overflow_excess: torch.Tensor,
    prompt_mask: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    temperature: torch.Tensor,
    drafts: torch.Tensor | None = None,
    num_preceding: torch.Tensor | None = None,
) -> None:
    return None


@torch.library.custom_op(
    "graphsafe_sampler::commit_history",
    mutates_args=("num_generated", "counts", "overflow_token", "overflow_excess", "window"),
)
def commit_history(
    slots: torch.Tensor,
    token_ids: torch.Tensor,
    keep: torch.Tensor,
    num_generated: torch.Tensor,
    counts: torch.Tensor,
    overflow_token: torch.Tensor,
    overflow_excess: torch.Tensor,
    window: torch.Tensor,
    padding_slot: int,
) -> None:
    """`BatchState.commit` with the penalty and bad-words states, as one kernel
    (kernels/history.py): rows with keep whose slot is not `padding_slot` append their token.

    slots, token_ids [num_rows] int64; keep [num_rows] bool. Per slot, all written:
    num_generated int32; counts uint8 [V]; overflow_token / overflow_excess int32 [E + 1]
    (penalties.py's layout); window int32 [L] (bad_words.py's ring of recent outputs).
    """
    from graphsafe_sampler.kernels.history import commit_history as launch

    num_rows = slots.shape[0]
    _check_rows("slots", slots, torch.int64, num_rows)
    _check_rows("token_ids", token_ids, torch.int64, num_rows)
    _check_rows("keep", keep, torch.bool, num_rows)
    num_slots = num_generated.shape[0]
    for name, t, dtype, shape in (
        ("num_generated", num_generated, torch.int32, (num_slots,)),
        ("counts", counts, torch.uint8, (num_slots, None)),
        ("overflow_token", overflow_token, torch.int32, (num_slots, None)),
        ("overflow_excess", overflow_excess, torch.int32, (num_slots, overflow_token.shape[-1])),
        ("window", window, torch.int32, (num_slots, None)),
    ):
        _check_table(name, t, dtype, shape)
    if overflow_token.shape[1] < 2:
        raise ValueError(
            f"overflow_token must have E + 1 >= 2 columns, got {overflow_token.shape[1]}"
        )
    if not 0 <= padding_slot < num_slots:
        raise ValueError(f"padding_slot = {padding_slot} is outside the slots [0, {num_slots})")
    launch(
        slots, token_ids, keep, num_generated, counts, overflow_token, overflow_excess, window,
        padding_slot,
    )  # fmt: skip


@commit_history.register_fake
def _(
    slots: torch.Tensor,
    token_ids: torch.Tensor,
    keep: torch.Tensor,
    num_generated: torch.Tensor,
    counts: torch.Tensor,
    overflow_token: torch.Tensor,
    overflow_excess: torch.Tensor,
    window: torch.Tensor,
    padding_slot: int,
) -> None:
    return None


@torch.library.custom_op(
    "graphsafe_sampler::compute_logprobs",
    mutates_args=("token_ids", "logprobs", "ranks", "lse"),
)
def compute_logprobs(
    source: torch.Tensor,
    tokens: torch.Tensor,
    token_ids: torch.Tensor,
    logprobs: torch.Tensor,
    ranks: torch.Tensor,
    lse: torch.Tensor,
    subtract_lse: bool,
) -> None:
    """`Sampler._logprobs` in one pass per row (kernels/logprobs.py): column 0 the sampled
    token, columns 1..K the top K in descending order, minus the row's logsumexp when
    `subtract_lse` (the *_logprobs modes), and the sampled token's rank.

    source [num_rows, V] float32/float16/bfloat16 (raw or processed logits, read only);
    tokens [num_rows] int64 in [0, V). Written: token_ids [num_rows, K + 1] int32, logprobs
    [num_rows, K + 1] float32, ranks [num_rows] int32, lse [num_rows] float32 (the row's
    logsumexp, 0 where not finite).
    """
    from graphsafe_sampler.kernels.logprobs import compute_logprobs as launch

    if source.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"source must be float32, float16 or bfloat16, got {source.dtype}")
    if source.dim() != 2:
        raise ValueError(f"source must be 2-D [num_rows, vocab_size], got {source.dim()}-D")
    if source.stride(-1) != 1:
        raise ValueError("source rows must be contiguous (stride 1 along the vocabulary)")
    num_rows, vocab_size = source.shape
    _check_rows("tokens", tokens, torch.int64, num_rows)
    _check_rows("ranks", ranks, torch.int32, num_rows)
    _check_rows("lse", lse, torch.float32, num_rows)
    _check_table("token_ids", token_ids, torch.int32, (num_rows, None))
    _check_table("logprobs", logprobs, torch.float32, (num_rows, token_ids.shape[-1]))
    k = token_ids.shape[1] - 1
    if not 0 <= k <= vocab_size:
        raise ValueError(f"token_ids must have K + 1 columns with 0 <= K <= {vocab_size}")
    launch(source, tokens, token_ids, logprobs, ranks, lse, subtract_lse)


@compute_logprobs.register_fake
def _(
    source: torch.Tensor,
    tokens: torch.Tensor,
    token_ids: torch.Tensor,
    logprobs: torch.Tensor,
    ranks: torch.Tensor,
    lse: torch.Tensor,
    subtract_lse: bool,
) -> None:
    return None
