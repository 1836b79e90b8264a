"""Merging the workers' Q-tables after a round.

Every worker starts a round from the same table ``q0`` and returns ``q_w``. Strategies:

- ``mean`` (SwiftRL): ``q = (1/W) sum_w q_w``. Simple and variance-reducing, but a pair
  (s, a) that only one worker saw moves by 1/W of that worker's change, so rare pairs learn
  W times slower as W grows.
- ``weighted``: visit-count weighted mean, ``q = sum_w n_w q_w / sum_w n_w`` where n_w(s, a)
  counts the pair's updates in worker w's shard (``q0`` where nobody saw it). A worker that
  never touched (s, a) has no information about it and gets no vote, so the merge does not
  dilute rare pairs; for pairs every worker saw equally often it equals ``mean``. The
  counts depend only on the data, so they are computed once, not in the kernel.
- ``sum``: ``q = q0 + sum_w (q_w - q0)`` (all changes applied, as if the workers had shared
  one table without conflicts). No dilution, but a pair seen by every worker moves W times
  as far, so it needs ``alpha * W <= 1`` to stay stable; kept for comparison.

int32 tables merge exactly in int64 with round-half-up division (``(x + d//2) // d``), so
the merge is deterministic and reproducible in plain Python; ``sum`` saturates at the
int32 range.
"""

from __future__ import annotations

import numpy as np

from hetrl.errors import UsageError

from hetrl.tabular.options import MERGES as STRATEGIES
_I32 = np.iinfo(np.int32)


def _round_div(num: np.ndarray, den) -> np.ndarray:
    """Integer division rounding half up (floor((num + den/2) / den)), like Python's //."""
    return np.floor_divide(num + np.floor_divide(den, 2), den)


def merge(q0: np.ndarray, qs: np.ndarray, strategy: str = "mean", counts: np.ndarray | None = None,
          out: np.ndarray | None = None) -> np.ndarray:
    """Merge worker tables qs (W, S, A) that all started from q0 (S, A); returns q0's dtype."""
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown merge strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    qs = np.asarray(qs)
    W = qs.shape[0]
    integer = np.issubdtype(q0.dtype, np.integer)
    if out is None:
        out = np.empty_like(q0)
    if W == 1:
        out[...] = qs[0]
        return out
    if strategy == "mean":
        if integer:
            out[...] = _round_div(qs.sum(axis=0, dtype=np.int64), W)
        else:
            out[...] = qs.sum(axis=0, dtype=np.float64) / W
    elif strategy == "weighted":
        if counts is None:
            raise UsageError("the weighted merge needs visit counts; pass counts=shard_counts(...)")
        n = counts.sum(axis=0)
        seen = n > 0
        if integer:
            num = (counts * qs.astype(np.int64)).sum(axis=0)
            merged = _round_div(num, np.where(seen, n, 1))
        else:
            num = (counts * qs.astype(np.float64)).sum(axis=0)
            merged = num / np.where(seen, n, 1)
        out[...] = np.where(seen, merged, q0)
    else:  # sum
        if integer:
            tot = q0.astype(np.int64) + (qs.astype(np.int64) - q0.astype(np.int64)).sum(axis=0)
            out[...] = np.clip(tot, _I32.min, _I32.max)
        else:
            out[...] = q0.astype(np.float64) + (qs.astype(np.float64) - q0).sum(axis=0)
    return out
