"""The learner's threads follow the machine's load, during the run.

A multi-threaded CPU learner (libgomp's spinning OpenMP threads) is faster on cores of its own (about 1.3x with two
threads), and collapses (an order of magnitude slower) when another CPU-bound process takes one of those cores: its
threads wait at every barrier for a thread the OS descheduled. The planner sees the free cores once, at the start; this
governor keeps looking. Every `interval_s` it reads /proc/stat (the machine's busy time) and this process's own CPU
time: their difference is the cores other processes use. As soon as they use more than `busy` cores, the learner drops
to the cores left (one at least); when they have left for two readings in a row, it returns to the planned count.
Without /proc/stat it does nothing.

It changes the thread count only where the learner's kernel gives the same results on any count (`Kernel.threads_exact`,
hetrl/kernels/kernel.py; `exact` here): elsewhere a count changed mid-run would change what the agent learns, so the
learner keeps the count it started with (chosen before the first update by the plan). The planner's run-time correction
(hetrl/planner/follow.py) moves the planned count itself with `replan`, under the same rule.
"""

from __future__ import annotations

import os
import time

import torch

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot (user, nice, system, irq, softirq, steal), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    v = [int(x) for x in fields]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / _HZ


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class ThreadGovernor:
    def __init__(self, planned: int, interval_s: float = 1.0, busy: float = 0.5, cores: int | None = None,
                 read=None, apply=None, exact: bool = True):
        self.planned, self.interval_s, self.busy = planned, interval_s, busy
        self.exact = exact     # the kernel's results do not depend on the thread count: it may change them
        self.apply = apply or torch.set_num_threads   # how the learner takes a thread count
        self.cores = cores or os.cpu_count() or 1
        self.read = read or (lambda: (time.perf_counter(), machine_busy_s(), own_cpu_s()))
        # the clock alone decides whether to look again: reading and parsing /proc/stat on every learner
        # call would cost a visible share of a small network's update
        self.clock = (lambda: self.read()[0]) if read is not None else time.perf_counter
        self.threads = self.min_threads = planned
        self.changes = self._calm = 0
        self._last = self.read() if planned > 1 else None
        self.spent: dict[int, list] = {}   # threads -> [learner seconds, gradient steps] at that count

    def record(self, seconds: float, steps: int) -> None:
        """A learner call of `steps` gradient steps took `seconds` at the current thread count."""
        acc = self.spent.setdefault(self.threads, [0.0, 0])
        acc[0] += seconds
        acc[1] += steps

    def mostly(self) -> tuple[int, float, int]:
        """(threads, learner seconds, gradient steps) of the thread count the learner spent most time at."""
        if not self.spent:
            return self.planned, 0.0, 0
        n = max(self.spent, key=lambda t: self.spent[t][0])
        return n, self.spent[n][0], self.spent[n][1]

    @property
    def active(self) -> bool:
        return self.exact and self._last is not None and self._last[1] is not None

    def replan(self, n: int) -> None:
        """A new planned thread count (the planner's run-time correction), taken at once; only where `exact`."""
        if not self.exact:
            raise RuntimeError("the learner's kernel gives results that depend on its thread count: its threads "
                               "stay as planned")
        n = max(1, int(n))
        if self._last is None and n > 1:
            self._last = self.read()
        self.planned, self._calm = n, 0
        self._set(n)

    def _set(self, n: int) -> None:
        if n != self.threads:
            self.threads, self.changes = n, self.changes + 1
            self.min_threads = min(self.min_threads, n)
            self.apply(n)

    def others(self, now: tuple) -> float:
        """Cores other processes used since the last reading."""
        (t0, m0, o0), (t1, m1, o1) = self._last, now
        return max(0.0, ((m1 - m0) - (o1 - o0)) / max(t1 - t0, 1e-9))

    def tick(self) -> int:
        """Look again if `interval_s` passed; set and return the thread count."""
        if not self.active or self.clock() - self._last[0] < self.interval_s - 1e-6:
            return self.threads
        now = self.read()
        others = self.others(now)
        self._last = now
        if others > self.busy:
            want, self._calm = max(1, min(self.planned, int(self.cores - others + 0.5))), 0
        else:
            self._calm += 1
            want = self.planned if self._calm >= 2 else self.threads
        self._set(want)
        return self.threads

    def figures(self) -> dict:
        return {"threads": self.planned, "learner_threads_follow_load": self.exact,
                "learner_threads_planned": self.planned, "learner_threads_min": self.min_threads,
                "learner_thread_changes": self.changes, "learner_threads_mostly": self.mostly()[0]}
