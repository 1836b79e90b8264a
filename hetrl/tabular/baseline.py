"""Single-thread NumPy baselines for the benchmark (not used for training).

- :func:`qlearning_numpy_loop`: the same sequential Q-learning as the compiled kernel, one
  transition at a time in a Python loop over NumPy arrays: what a plain NumPy
  implementation of SwiftRL's CPU version does. Results match the float32 kernel up to
  float rounding (it computes in float64).
- :func:`qlearning_numpy_batched`: the fastest NumPy formulation we know: vectorised over
  chunks of B transitions, each chunk applies the *mean* TD error per (s, a) computed from
  the table at the start of the chunk (a synchronous batch update). This is not the same
  algorithm (updates inside a chunk do not see each other), so it is reported as a speed
  reference only.
"""

from __future__ import annotations

import numpy as np


def qlearning_numpy_loop(q: np.ndarray, s, a, r, s2, done, alpha: float, gamma: float) -> int:
    """Sequential Q-learning, one Python iteration per transition (q updated in place)."""
    alpha, gamma = float(alpha), float(gamma)
    s_l, a_l, r_l, s2_l, d_l = s.tolist(), a.tolist(), r.tolist(), s2.tolist(), done.tolist()
    for i in range(len(s_l)):
        si, ai = s_l[i], a_l[i]
        target = r_l[i] if d_l[i] else r_l[i] + gamma * q[s2_l[i]].max()
        q[si, ai] += alpha * (target - q[si, ai])
    return len(s_l)


def qlearning_numpy_batched(q: np.ndarray, s, a, r, s2, done, alpha: float, gamma: float,
                            batch: int = 65536) -> int:
    """Vectorised synchronous Q-learning over chunks of `batch` transitions (in place)."""
    nS, nA = q.shape
    flat_q = q.reshape(-1)
    n = len(s)
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        idx = s[lo:hi].astype(np.int64) * nA + a[lo:hi]
        target = r[lo:hi] + gamma * (1 - done[lo:hi]) * q[s2[lo:hi]].max(axis=1)
        td = target - flat_q[idx]
        cnt = np.bincount(idx, minlength=nS * nA)
        tot = np.bincount(idx, weights=td, minlength=nS * nA)
        seen = cnt > 0
        flat_q[seen] += (alpha * tot[seen] / cnt[seen]).astype(q.dtype)
    return n
