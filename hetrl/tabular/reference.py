"""Plain-Python reference of the update kernels (the specification the tests check against).

Integers are Python ``int`` (unbounded), so the int32 kernels must agree bit for bit; the
float32 reference rounds every operation to float32 with NumPy scalars. Slow (~1 M updates/s):
for tests on small tables only.
"""

from __future__ import annotations

import numpy as np

from hetrl.tabular.fixedpoint import CONST_BITS

_MASK64 = 0xFFFFFFFFFFFFFFFF


class XorShift64Star:
    """The kernels' generator: xorshift64* on a 64-bit state."""

    def __init__(self, state: int):
        self.state = int(state) & _MASK64

    def next(self) -> int:
        x = self.state
        x ^= x >> 12
        x ^= (x << 25) & _MASK64
        x ^= x >> 27
        self.state = x
        return (x * 2685821657736338717) & _MASK64

    def below(self, n: int) -> int:
        return (self.next() >> 33) % n

    def unit(self) -> float:
        return (self.next() >> 11) * 2.0**-53


def _shift_round(x: int) -> int:
    return (x + (1 << (CONST_BITS - 1))) >> CONST_BITS


def _argmax(row) -> int:
    best, bv = 0, row[0]
    for b in range(1, len(row)):
        if row[b] > bv:
            best, bv = b, row[b]
    return best


def _next_value(q, n, algo, a2_data, eps_thr, rng):
    if algo == "qlearning":
        return max(q[n])
    if algo == "sarsa":
        return q[n][a2_data]
    # sarsa, learner's epsilon-greedy a'
    if eps_thr > 0 and (rng.next() >> 11) < eps_thr:
        return q[n][rng.below(len(q[n]))]
    return q[n][_argmax(q[n])]


def update_int(q: list[list[int]], data, algo: str, alpha_fp: int, gamma_fp: int,
               eps_thr: int = 0, rng: XorShift64Star | None = None) -> list[list[int]]:
    """Fixed-point updates over data = iterable of (s, a, r_fp, s2, a2, done); q is mutated.

    algo: "qlearning", "sarsa" (a' from data) or "sarsa_pol" (a' epsilon-greedy from q).
    """
    for s, a, r, s2, a2, done in data:
        target = int(r)
        if not done:
            target += _shift_round(gamma_fp * int(_next_value(q, int(s2), algo, int(a2), eps_thr, rng)))
        old = q[int(s)][int(a)]
        new = old + _shift_round(alpha_fp * (target - old))
        if not -(2**31) <= new < 2**31:
            raise OverflowError(f"fixed-point Q({s},{a}) = {new} left int32")
        q[int(s)][int(a)] = new
    return q


def update_float32(q: np.ndarray, data, algo: str, alpha: float, gamma: float,
                   eps_thr: int = 0, rng: XorShift64Star | None = None) -> np.ndarray:
    """float32 updates, every operation rounded to float32 (q: float32 array, mutated)."""
    f = np.float32
    alpha, gamma = f(alpha), f(gamma)
    rows = [list(map(f, row)) for row in q]
    for s, a, r, s2, a2, done in data:
        target = f(r)
        if not done:
            target = f(target + f(gamma * _next_value(rows, int(s2), algo, int(a2), eps_thr, rng)))
        old = rows[int(s)][int(a)]
        rows[int(s)][int(a)] = f(old + f(alpha * f(target - old)))
    q[...] = np.array(rows, dtype=np.float32)
    return q


def merge_int(q0: list[list[int]], qs: list[list[list[int]]], strategy: str,
              counts: list[list[list[int]]] | None = None) -> list[list[int]]:
    """Plain-int version of :func:`hetrl.tabular.merge.merge` for int32 tables."""
    W = len(qs)
    out = []
    for s in range(len(q0)):
        row = []
        for a in range(len(q0[s])):
            vals = [qs[w][s][a] for w in range(W)]
            if W == 1:
                v = vals[0]
            elif strategy == "mean":
                v = (sum(vals) + W // 2) // W
            elif strategy == "weighted":
                n = sum(counts[w][s][a] for w in range(W))
                v = q0[s][a] if n == 0 else (sum(counts[w][s][a] * vals[w] for w in range(W)) + n // 2) // n
            else:
                v = max(-(2**31), min(2**31 - 1, q0[s][a] + sum(x - q0[s][a] for x in vals)))
            row.append(v)
        out.append(row)
    return out
