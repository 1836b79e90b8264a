"""Aggregate statistics over runs, with the definitions of Agarwal et al. (2021).

"Deep Reinforcement Learning at the Edge of the Statistical Precipice" (NeurIPS 2021;
arXiv 2108.13264), whose reference implementation is the `rliable` library:

- mean, median, and the interquartile mean (IQM): the mean of the middle 50% of the scores,
  ``scipy.stats.trim_mean(x, 0.25)`` (a quarter cut from each end);
- optimality gap: the mean of ``max(target - score, 0)``, how far the runs fall short of the
  target (lower is better; scores above the target count as 0);
- each with a 95% percentile-bootstrap confidence interval over runs (``scipy.stats.bootstrap``,
  a fixed seed so a report is the same every time). When several tasks are aggregated the
  bootstrap is stratified: each task's runs are resampled among themselves, so every resample
  keeps each task's number of runs (rliable's StratifiedBootstrap).

A task is a list of runs' scores: an array of shape (runs,), or (runs, k) for k statistics
computed at once (a learning curve at k env steps). A task with one run is held fixed in every
resample (there is nothing to resample it from); when no task has two runs, there is no
interval: its bounds are NaN.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0
STATISTICS = ("iqm", "mean", "median", "optimality_gap")

# scipy >= 1.15 names the generator `rng`; older releases `random_state` (both take a Generator)
_RNG_ARG = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def iqm(x, axis: int = -1):
    """Interquartile mean: the mean after cutting 25% of the scores from each end."""
    return stats.trim_mean(x, 0.25, axis=axis)


def optimality_gap(x, target: float, axis: int = -1):
    """Mean shortfall below `target`: mean of max(target - x, 0)."""
    return np.mean(np.maximum(target - np.asarray(x, dtype=float), 0.0), axis=axis)


def statistic(name: str, targets: Sequence[float] | None = None):
    """The aggregate `name` over a list of tasks, each an array with runs on its last axis.
    optimality_gap needs one target per task."""
    if name not in STATISTICS:
        raise ValueError(f"unknown statistic {name!r}; one of {', '.join(STATISTICS)}")
    if name == "optimality_gap" and targets is None:
        raise ValueError("optimality_gap needs a target per task")

    def aggregate(tasks: Sequence[np.ndarray]):
        if name == "optimality_gap":
            tasks = [np.maximum(t - x, 0.0) for t, x in zip(targets, tasks)]
        x = np.concatenate(tasks, axis=-1)
        if name == "iqm":
            return iqm(x, axis=-1)
        return np.median(x, axis=-1) if name == "median" else np.mean(x, axis=-1)
    return aggregate


def interval(tasks: Sequence, aggregate, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
             seed: int = SEED):
    """(estimate, low, high) of `aggregate` (see `statistic`) over `tasks`, each of shape (runs, ...):
    the percentile bootstrap, stratified by task. Floats, or arrays of the trailing shape."""
    runs_last = [np.moveaxis(np.asarray(t, dtype=float), 0, -1) for t in tasks]
    value = np.asarray(aggregate(runs_last), dtype=float)
    free = [i for i, t in enumerate(runs_last) if t.shape[-1] >= 2]
    if not free:
        nan = np.full_like(value, np.nan)
        return _out(value), _out(nan), _out(nan)

    def resampled(*samples, axis=-1):
        # scipy resamples only the tasks with >= 2 runs; the others take part unchanged
        shape = samples[0].shape[:-1]
        full, it = [], iter(samples)
        for i, t in enumerate(runs_last):
            if i in free:
                full.append(next(it))
            else:
                ones = (1,) * (len(shape) - (t.ndim - 1))
                full.append(np.broadcast_to(t.reshape(t.shape[:-1] + ones + (1,)), shape + (1,)))
        return aggregate(full)

    res = stats.bootstrap(tuple(runs_last[i] for i in free), resampled, n_resamples=n_resamples,
                          confidence_level=confidence, method="percentile", vectorized=True, axis=-1,
                          **{_RNG_ARG: np.random.default_rng(seed)})
    ci = res.confidence_interval
    return _out(value), _out(np.asarray(ci.low, dtype=float)), _out(np.asarray(ci.high, dtype=float))


def _out(a: np.ndarray):
    return float(a) if a.ndim == 0 else a


def aggregate(tasks: Sequence, targets: Sequence[float] | None = None, confidence: float = CONFIDENCE,
              n_resamples: int = N_RESAMPLES, seed: int = SEED) -> dict:
    """{statistic: {"value", "low", "high"}} for IQM, mean, median and, when every task has a
    target, the optimality gap. Bounds of NaN (no interval) are None, so the dict is valid JSON."""
    tasks = [np.asarray(t, dtype=float) for t in tasks if len(t)]
    if not tasks:
        return {}
    names = [n for n in STATISTICS if n != "optimality_gap" or targets is not None]
    out = {}
    for name in names:
        v, lo, hi = interval(tasks, statistic(name, targets), confidence, n_resamples, seed)
        out[name] = {"value": _num(v), "low": _num(lo), "high": _num(hi)}
    return out


def _num(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None
