"""Counter-based random numbers: every draw is a pure function of (seed, position, token id, salt).

No `torch.Generator`, no global state, no host reads: a row's numbers depend only on its
request's seed and token position, never on its batch row, its neighbours or the batch size,
and replaying a captured graph draws fresh numbers because the positions advance on the device.
The streams (salts) keep the consumers of one (seed, position) independent of one another.
The key idea: a 63-bit row key, mixed once per row from the seed, position and salt words,
then a multiply, an add and MurmurHash3's finaliser per token, on uint32 words (emulated here
in int64). The sampling kernel re-implements it with `tl.uint32` and must match the hashes
and uniforms bit for bit (`tests/test_rng.py` holds known-answer vectors). The specification
and the reasons for each choice: docs/kernels.md, the RNG.
"""

from __future__ import annotations

import torch

# the stream salts, defined beside the kernels that draw the same numbers
from graphsafe_sampler.kernels.constants import SALT_ACCEPT as SALT_ACCEPT
from graphsafe_sampler.kernels.constants import SALT_BONUS as SALT_BONUS
from graphsafe_sampler.kernels.constants import SALT_RECOVER as SALT_RECOVER
from graphsafe_sampler.kernels.constants import SALT_SAMPLE as SALT_SAMPLE

ROW_TOKEN_ID = 0xFFFFFFFF
"""Token id column of the per-row draws (`row_uniforms`): never a vocabulary id."""

MAX_SALT = 2**32 - 1
MAX_VOCAB_SIZE = 2**31 - 1

_MASK32 = 0xFFFFFFFF
_OFFSET_IV = 0x243F6A88
_MULT_IV = 0x85A308D3
_XXH32_PRIMES = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1)
# Weights of [seed_lo, seed_hi, pos_lo, pos_hi, salt] in the offset and mult lanes.
_LANE_WEIGHTS = (_XXH32_PRIMES, _XXH32_PRIMES[1:] + _XXH32_PRIMES[:1])
_FMIX_C1 = 0x85EBCA6B
_FMIX_C2 = 0xC2B2AE35


def _as_int64_multiplier(c: int) -> int:
    # why: x * (c - 2**32) for x in [0, 2**32) stays inside int64 and has the same low 32 bits
    # (signed overflow is undefined behaviour in the C++ that eager and inductor run)
    return c - 2**32 if c >= 2**31 else c


_FMIX_C1_I64 = _as_int64_multiplier(_FMIX_C1)
_FMIX_C2_I64 = _as_int64_multiplier(_FMIX_C2)


def _fmix32_(x: torch.Tensor) -> torch.Tensor:
    """x: int64 words in [0, 2**32), mixed in place (MurmurHash3 fmix32); returns x.

    uint32 emulated in int64: every value is kept in [0, 2**32) (masked), so the arithmetic
    right shift of int64 equals the logical one.
    """
    x.bitwise_xor_(x >> 16)
    x.mul_(_FMIX_C1_I64).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 13)
    x.mul_(_FMIX_C2_I64).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 16)
    return x


def _fmix32_int(x: int) -> int:
    """fmix32 of a Python int in [0, 2**32): the salt's word, folded at trace time."""
    x ^= x >> 16
    x = (x * _FMIX_C1) & _MASK32
    x ^= x >> 13
    x = (x * _FMIX_C2) & _MASK32
    return x ^ (x >> 16)


def _check_rows(seeds: torch.Tensor, positions: torch.Tensor) -> None:
    # Metadata only (dtype, shape, device): no host read of tensor values.
    for name, t in (("seeds", seeds), ("positions", positions)):
        if t.dtype != torch.int64:
            raise ValueError(f"{name} must be int64, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D [rows], got shape {tuple(t.shape)}")
    if positions.shape != seeds.shape:
        raise ValueError(
            f"positions must have the shape of seeds {tuple(seeds.shape)}, "
            f"got {tuple(positions.shape)}"
        )
    if positions.device != seeds.device:
        raise ValueError(
            f"positions must be on the device of seeds ({seeds.device}), got {positions.device}"
        )


def _check_int(name: str, value: int, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


def _lane(
    mixed: list[torch.Tensor], weights: tuple[int, ...], iv: int, salt_mixed: int
) -> torch.Tensor:
    """fmix32(iv + sum(weights[i] * mixed[i]) + weights[4] * salt_mixed), all mod 2**32.

    mixed: 4 x [rows] int64 words in [0, 2**32) -> [rows] int64 in [0, 2**32)
    """
    # each term is masked below 2**32, so the sum of five stays far below 2**63
    acc = mixed[0] * _as_int64_multiplier(weights[0]) & _MASK32
    for t, w in zip(mixed[1:], weights[1:4], strict=True):
        acc += t * _as_int64_multiplier(w) & _MASK32
    acc += (iv + weights[4] * salt_mixed) & _MASK32
    return _fmix32_(acc.bitwise_and_(_MASK32))


def row_keys(seeds: torch.Tensor, positions: torch.Tensor, salt: int) -> torch.Tensor:
    """The 63-bit key of each row's random stream.

    seeds: [rows] int64, any 64-bit pattern (a uint64 seed is passed as its int64 bits)
    positions: [rows] int64 token positions
    salt: stream id in [0, 2**32), e.g. `SALT_SAMPLE`
    returns: [rows] int64, the bits of (mult << 32) | offset; mult (high word) is odd.
    """
    _check_rows(seeds, positions)
    _check_int("salt", salt, 0, MAX_SALT)
    words = (
        seeds & _MASK32,
        (seeds >> 32) & _MASK32,  # why the mask: >> copies the sign bit of negative seeds
        positions & _MASK32,
        (positions >> 32) & _MASK32,
    )
    # each word mixed on its own, side by side: a chain of five fmix32 compiles ~20 s slower
    mixed = [_fmix32_(w) for w in words]
    salt_mixed = _fmix32_int(salt)  # one constant for every row: folded on the host
    offset = _lane(mixed, _LANE_WEIGHTS[0], _OFFSET_IV, salt_mixed)
    mult = _lane(mixed, _LANE_WEIGHTS[1], _MULT_IV, salt_mixed).bitwise_or_(1)
    # why not mult << 32: shifting into the sign bit overflows; mult - 2**32 times 2**32 cannot
    mult_i64 = mult - (mult >> 31) * 2**32  # [-2**31, 2**31), same low 32 bits
    return mult_i64.mul_(2**32).add_(offset)


_CONTEXT_IVS = (0x3C6EF372, 0xA54FF53A)
_CONTEXT_MULTS = (0x9E3779B1, 0x27D4EB2F)


def context_positions(tokens: torch.Tensor) -> torch.Tensor:
    """tokens: [rows, n] int64 ids (oldest first; -1 where the history is shorter) ->
    [rows] int64 in [0, 2**63): a hash of each row's n tokens, used in place of a token
    position by the watermark (`stages/watermark.py`), so that the stream follows the text,
    not the step. Two 32-bit lanes, each token folded in by a multiply, an add and fmix32."""
    lanes = []
    for iv, mult in zip(_CONTEXT_IVS, _CONTEXT_MULTS, strict=True):
        h = torch.full(tokens.shape[:1], iv, dtype=torch.int64, device=tokens.device)
        for j in range(tokens.shape[1]):
            # h < 2**32 and |mult - 2**32| < 2**31: the product stays inside int64
            h = h * _as_int64_multiplier(mult) + (tokens[:, j] & _MASK32)
            h = _fmix32_(h.bitwise_and_(_MASK32))
        lanes.append(h)
    return (lanes[1] & 0x7FFFFFFF) * 2**32 + lanes[0]


def hash_tokens(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """keys: [rows] int64 from `row_keys`; token_ids: [n] (every row's) or [rows, n] (each
    row's own) int64 in [0, 2**32) -> [rows, n] int64 hashes in [0, 2**32)."""
    # why the fold: t * mult < 2**63 needs t < 2**31; 0xFFFFFFFF is -1 mod 2**32
    return _hash_folded(keys, token_ids - (token_ids >> 31) * 2**32)


def _hash_folded(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """`hash_tokens` of ids already in [-2**31, 2**31) (as mod 2**32): `token_hashes`'
    arange needs no fold, three ops over every token saved eagerly."""
    offset = (keys & _MASK32)[:, None]
    mult = ((keys >> 32) & _MASK32)[:, None]
    x = (token_ids if token_ids.dim() == 2 else token_ids[None, :]) * mult  # |x| < 2**63
    return _fmix32_(x.add_(offset).bitwise_and_(_MASK32))


def token_hashes(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, salt: int
) -> torch.Tensor:
    """seeds, positions: [rows] int64 -> [rows, vocab_size] int64 hashes in [0, 2**32)."""
    _check_int("vocab_size", vocab_size, 1, MAX_VOCAB_SIZE)
    keys = row_keys(seeds, positions, salt)
    # vocab_size <= MAX_VOCAB_SIZE: every id is below 2**31
    return _hash_folded(keys, torch.arange(vocab_size, device=seeds.device))


def uniforms_from_hashes(h: torch.Tensor) -> torch.Tensor:
    """h: int64 hashes in [0, 2**32) -> float32 in [2**-24, 1 - 2**-24], same shape.

    u = (h >> 9) * 2**-23 + 2**-24: every step is exact, so any backend gets the same bits.
    """
    return (h >> 9).to(torch.float32).mul_(2**-23).add_(2**-24)


def exponentials_from_hashes(h: torch.Tensor) -> torch.Tensor:
    """h: int64 hashes in [0, 2**32) -> float32 Exp(1) draws in [2**-33, 16.64], same shape."""
    # why all 32 bits: the race is won by the smallest draw, e ~ h * 2**-32 near h = 0, where
    # fp32 resolves h exactly (2**-32 steps), so tokens far below 2**-24 probability still
    # get their share; a 24-bit uniform would floor every draw at 2**-25.
    # why the clamp: h = 0 would give e = 0 (p / e = nan for p = 0); rounding h >= 2**32 - 128
    # up to 2**32 would give e = inf (p / e = 0 for every token of a one-token row).
    v = h.to(torch.float32).clamp_(0.5, 2.0**32 - 256.0).mul_(-(2.0**-32))
    # log1p keeps the winning tail at v -> 0, where fp32 resolves it
    return v.log1p_().neg_()


def gumbels_from_hashes(h: torch.Tensor) -> torch.Tensor:
    """h: int64 hashes in [0, 2**32) -> float32 standard Gumbel draws, `-log(e)` of
    `exponentials_from_hashes(h)`, in [-2.82, 22.88], same shape."""
    return exponentials_from_hashes(h).log_().neg_()


def token_uniforms(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, salt: int
) -> torch.Tensor:
    """seeds, positions: [rows] int64 -> [rows, vocab_size] float32 in (0, 1), one
    independent uniform per (row, token id)."""
    return uniforms_from_hashes(token_hashes(seeds, positions, vocab_size, salt))


def row_uniforms(seeds: torch.Tensor, positions: torch.Tensor, salt: int) -> torch.Tensor:
    """seeds, positions: [rows] int64 -> [rows] float32 in (0, 1), one draw per row.

    The draw is the token hash at token id `ROW_TOKEN_ID`, so it is independent of every
    `token_uniforms` column of the same salt.
    """
    keys = row_keys(seeds, positions, salt)
    # why new_full, not torch.tensor([...]): a fill kernel, no host-to-device copy in a graph
    row_token = keys.new_full((1,), ROW_TOKEN_ID)
    return uniforms_from_hashes(hash_tokens(keys, row_token))[:, 0]


def exponential(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, salt: int
) -> torch.Tensor:
    """seeds, positions: [rows] int64 -> [rows, vocab_size] float32 Exp(1) noise.

    The exponential race: `argmax(probs / e)` draws token i with probability probs[i]
    (equivalently Gumbel-max, `argmax(logits - log(e))`, see `gumbel_noise`). Values lie in
    [2**-33, 16.64]: positive and finite, so `probs / e` is finite and 0 for masked tokens.
    The integer hash matches a Triton kernel bit for bit; `log1p` is libm's, so e may differ
    from another backend's in the last bit.
    """
    return exponentials_from_hashes(token_hashes(seeds, positions, vocab_size, salt))


def gumbel_noise(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, salt: int
) -> torch.Tensor:
    """seeds, positions: [rows] int64 -> [rows, vocab_size] float32 standard Gumbel noise,
    `-log(exponential(...))`, in [-2.82, 22.88]: `argmax(logits + g)` samples softmax(logits)."""
    return gumbels_from_hashes(token_hashes(seeds, positions, vocab_size, salt))


def gumbel_noise_at(
    seeds: torch.Tensor, positions: torch.Tensor, token_ids: torch.Tensor, salt: int
) -> torch.Tensor:
    """seeds, positions: [rows] int64; token_ids: [rows, n] int64 ids in [0, 2**31) ->
    [rows, n] float32: the `gumbel_noise` of those tokens alone (the same function of the id,
    so a race over a row's candidates sees the numbers a race over the row would)."""
    keys = row_keys(seeds, positions, salt)
    return gumbels_from_hashes(hash_tokens(keys, token_ids))
