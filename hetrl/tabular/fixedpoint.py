"""INT32 fixed-point arithmetic for Q-tables (SwiftRL's trick).

A Q-value ``q`` is stored as the int32 ``round(q * 2**frac_bits)``. The learning-rate and
discount constants are stored with :data:`CONST_BITS` fraction bits. Every product is formed
in int64 (a 32x32->64 multiply) and brought back to the table's scale with a rounding
arithmetic shift ``(x + 2**(b-1)) >> b`` (round half up), so the result is a pure function of
integers: the compiled kernel and a plain-Python ``int`` reference agree bit for bit.

Overflow: with ``0 <= alpha <= 1`` and ``0 <= gamma < 1`` every update is a convex
combination of the old value and the target ``r + gamma * q'``, so starting from 0 all values
stay within ``B = R / (1 - gamma)`` where ``R = max |r|`` (plus a few units of rounding). The
number of fraction bits is chosen as the largest ``F <= 16`` with
``2 * (B + 1) * 2**F < 2**31``, i.e. a safety factor of 2 against int32 wrap-around (B uses
gamma as quantized to CONST_BITS bits: 0.99 -> 64881/65536). Examples (gamma = 0.99): FrozenLake R=1 -> F=16 (|q| <= 6.6e6 units), Taxi R=20 -> F=16
(|q| <= 1.3e8), CliffWalking R=100 -> F=16 (|q| <= 6.6e8 < 2.1e9).
"""

from __future__ import annotations

import math

import numpy as np

from hetrl.errors import UsageError

CONST_BITS = 16  # fraction bits of alpha, gamma
MAX_FRAC_BITS = 16  # default / maximum fraction bits of the Q-table and rewards
MIN_FRAC_BITS = 4
INT32_MAX = 2**31 - 1


def quantized_gamma(gamma: float) -> float:
    """The discount the int32 kernels really use (gamma rounded to CONST_BITS bits)."""
    return const_to_fixed(gamma) / float(1 << CONST_BITS)


def q_bound(reward_abs_max: float, gamma: float) -> float:
    """Largest |Q| reachable from a zero table (in reward units), with the quantized gamma."""
    g = quantized_gamma(gamma)
    return math.inf if g >= 1.0 else float(reward_abs_max) / (1.0 - g)


def choose_frac_bits(reward_abs_max: float, gamma: float, max_bits: int = MAX_FRAC_BITS) -> int:
    """Most fraction bits (<= max_bits) that keep 2 * |Q|max in int32; UsageError if < 4."""
    if not 0.0 <= gamma < 1.0:
        raise UsageError(f"gamma={gamma} is outside [0, 1); pass a discount such as --gamma 0.99")
    bound = q_bound(reward_abs_max, gamma) + 1.0
    if math.isinf(bound):
        raise UsageError(f"gamma={gamma} rounds to 1 in fixed point; use --gamma 0.9999 or less, or --dtype float32")
    bits = int(max_bits)
    while bits >= MIN_FRAC_BITS and 2.0 * bound * 2.0**bits >= INT32_MAX:
        bits -= 1
    if bits < MIN_FRAC_BITS:
        raise UsageError(
            f"int32 Q-table would overflow: |r|max={reward_abs_max:g}, gamma={gamma} bounds |Q| by "
            f"{bound:.3g}; use --dtype float32 or a smaller --gamma"
        )
    return bits


def check_frac_bits(frac_bits: int, reward_abs_max: float, gamma: float) -> None:
    """UsageError when an explicit frac_bits risks int32 overflow."""
    if not MIN_FRAC_BITS <= int(frac_bits) <= 30:
        raise UsageError(f"frac_bits={frac_bits} is outside [{MIN_FRAC_BITS}, 30]; try 16")
    bound = q_bound(reward_abs_max, gamma) + 1.0
    if 2.0 * bound * 2.0**frac_bits >= INT32_MAX:
        safe = choose_frac_bits(reward_abs_max, gamma)
        raise UsageError(
            f"frac_bits={frac_bits} risks int32 overflow (|Q| up to {bound:.3g}); use frac_bits <= {safe}"
        )


def const_to_fixed(x: float) -> int:
    """alpha / gamma -> integer with CONST_BITS fraction bits."""
    return int(round(float(x) * (1 << CONST_BITS)))


def to_fixed(x, frac_bits: int) -> np.ndarray:
    """Float array -> int32 fixed point (round half to even), refusing values that do not fit."""
    y = np.array(x, dtype=np.float64)  # a copy: scaled and rounded in place
    y *= float(1 << frac_bits)
    np.rint(y, out=y)
    if y.size and (y.max() > INT32_MAX or y.min() < -INT32_MAX):
        raise UsageError("value does not fit the int32 fixed-point scale; use --dtype float32")
    return y.astype(np.int32)


def from_fixed(q, frac_bits: int) -> np.ndarray:
    """int32 fixed point -> float32."""
    return (np.asarray(q, dtype=np.float64) / float(1 << frac_bits)).astype(np.float32)


def headroom_bits(q: np.ndarray) -> float:
    """log2(INT32_MAX / max|q|): how many doublings are left before wrap-around (inf if all 0)."""
    m = int(np.abs(q.astype(np.int64)).max()) if q.size else 0
    return math.inf if m == 0 else math.log2(INT32_MAX / m)
