"""Timing one primitive until its figure is stable, and reporting the spread.

A *round* times ``n`` back-to-back calls (``n`` calibrated so that a round lasts at least
``min_round_s``, which hides the timer's resolution) and yields one value, seconds per call.
Rounds repeat until the running median of the rounds has settled: the last ``window``
running medians lie within ``tol`` (relative) of each other, after at least ``min_rounds``
rounds; or until ``cap_s`` seconds have been spent (then ``stable`` is False).

CPU primitives are timed in CPU time of the process, so that a figure is what the primitive
costs, not how long it waited for a core on a shared machine (the model adds the
contention: between hetrl's own processes, and with other programs as fewer cores, see load.py).

The figure kept is the median of all rounds; ``spread`` is their interquartile range over
that median (0.05 = the middle half of the rounds lies within 5 %), which is the noise the
figure carries on a shared machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable


@dataclass
class Timing:
    s: float            # median seconds per call
    spread: float       # interquartile range of the rounds / median
    rounds: int
    calls: int          # calls per round
    stable: bool        # the running median settled before the time cap

    def to_json(self) -> dict:
        return {k: (round(v, 12) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict | float) -> "Timing":
        if isinstance(d, (int, float)):  # synthetic tables may give bare seconds
            return cls(float(d), 0.0, 1, 1, True)
        return cls(float(d["s"]), float(d.get("spread", 0.0)), int(d.get("rounds", 1)),
                   int(d.get("calls", 1)), bool(d.get("stable", True)))


def _iqr_rel(values: list[float]) -> float:
    if len(values) < 4:
        return (max(values) - min(values)) / statistics.median(values) if values else 0.0
    q = statistics.quantiles(values, n=4)
    med = statistics.median(values)
    return (q[2] - q[0]) / med if med > 0 else 0.0


def _settled(medians: list[float], min_rounds: int, window: int, tol: float) -> bool:
    """The last ``window`` running medians agree within ``tol`` (after ``min_rounds`` rounds)."""
    last = medians[-window:]
    return len(medians) >= min_rounds and len(last) == window and (max(last) - min(last)) <= tol * medians[-1]


def measure(fn: Callable[[], object], *, sync: Callable[[], object] | None = None, tol: float = 0.05,
            window: int = 4, min_rounds: int = 8, min_round_s: float = 0.01, cap_s: float = 1.0,
            max_calls: int = 1 << 16, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Seconds per call of ``fn`` (see the module docstring); ``sync`` (e.g.
    ``torch.cuda.synchronize``) is called at the end of each round so that asynchronous
    device work is counted. ``clock``: ``time.perf_counter`` (wall) or ``time.process_time``
    (CPU time of this process: leaves out the time spent waiting for a core that other
    programs hold; right for single-threaded CPU work). The time cap is always wall time."""
    start = time.perf_counter()
    fn()  # warm-up (allocations, JIT, caches)
    if sync:
        sync()
    n = 1
    while True:  # calibrate calls per round
        t0 = clock()
        for _ in range(n):
            fn()
        if sync:
            sync()
        dt = clock() - t0
        if dt >= min_round_s or n >= max_calls or time.perf_counter() - start > cap_s / 4:
            break
        n = min(max_calls, n * 2 if dt <= 0 else max(n * 2, int(n * min_round_s / dt * 1.2) + 1))
    values = [dt / n]
    medians = [values[0]]
    stable = False
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        if sync:
            sync()
        values.append((clock() - t0) / n)
        medians.append(statistics.median(values))
        if _settled(medians, min_rounds, window, tol):
            stable = True
            break
        if time.perf_counter() - start > cap_s:
            break
    return Timing(statistics.median(values), _iqr_rel(values), len(values), n, stable)


def measure_threads(fn: Callable[[], object], threads: int, *, tol: float = 0.05, window: int = 4,
                    min_pairs: int = 6, min_round_s: float = 0.02, cap_s: float = 1.0) -> Timing:
    """Wall time of ``fn`` with ``threads`` torch threads over its wall time with one thread,
    from pairs of back-to-back rounds (one of each, the order flipping every pair), so that both
    sides of a pair see the same machine; the median of the pairs' ratios, settled as in
    :func:`measure`. A ratio measured in one go stays right while the machine's speed drifts."""
    import torch

    start, old = time.perf_counter(), torch.get_num_threads()

    def round_s(t: int, n: int) -> float:
        torch.set_num_threads(t)
        fn()  # the first call after a switch wakes or creates the threads
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    try:
        n = 1
        while (dt := round_s(1, n) * n) < min_round_s and time.perf_counter() - start < cap_s / 4:
            n = max(n * 2, int(n * min_round_s / max(dt, 1e-9) * 1.2) + 1)
        ratios, medians, stable = [], [], False
        while True:
            order = (1, threads) if len(ratios) % 2 == 0 else (threads, 1)
            got = {t: round_s(t, n) for t in order}
            ratios.append(got[threads] / got[1])
            medians.append(statistics.median(ratios))
            if _settled(medians, min_pairs, window, tol):
                stable = True
                break
            if time.perf_counter() - start > cap_s:
                break
    finally:
        torch.set_num_threads(old)
    return Timing(statistics.median(ratios), _iqr_rel(ratios), len(ratios), n, stable)
