"""How busy this machine is, and with whose work: for profiles that stay true on a shared machine.

Two readings:

* **Foreign load** (passive; :class:`Watch`, :func:`current_load`): over an interval, the cores that
  *other* processes kept busy = the machine's busy time (/proc/stat: user, nice, system, irq, softirq and
  steal, summed over its cores) minus this process tree's own CPU time (/proc/PID/stat of this process
  and of every live descendant, plus what its reaped children used), over the interval's wall time;
  with each core's busy fraction and the 1-minute load average for the explanation. The profiler takes
  one around every entry it measures: an entry measured while other processes kept more than
  ``FOREIGN_BUSY`` cores busy is *provisional* (hetrl/planner/profile/__init__.py), never the
  machine's truth. /proc/stat counts in ticks (1/100 s per core), so a short interval has a coarser
  reading: the threshold grows by two ticks per core over the interval. Without /proc (not Linux) there
  is no reading, and nothing is marked. Whether the machine is quiet enough to measure on *now*
  (:func:`quiet_check`) takes a few such readings and calls it busy only where each says so; whether
  another program holds a core of its own (``Load.heavy``, FOREIGN_HEAVY) decides how a plan made now
  prices the entries measured under load (hetrl/planner/__init__.py).
* **Cores ours** (active; :func:`available_cores`): one spinning process per core for a moment.

The profile holds what each primitive costs on a core of its own, and the model shares the
machine's cores among hetrl's own processes. On a machine that other programs also use, fewer
cores are ours. `available_cores` measures it: it runs one spinning process per core for a
moment (0.1 s to settle, then 0.3 s measured) and adds up the CPU time they got over the wall
time. That counts whatever the kernel
does (per-thread fair share, or per-session autogroups where a session's share does not grow
with its thread count) and is what `plan(cores="auto")` / `hetrl plan --cores auto` plans for.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass

FOREIGN_BUSY = 0.3          # cores other processes may keep busy while an entry is measured (background noise)
FOREIGN_HEAVY = 0.7         # cores other processes keep busy when one of them holds a core (a second run, a hog)
QUIET_READINGS = 3          # readings a quiet check takes at most before it calls the machine busy
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# --- foreign load (passive) ---------------------------------------------------------------------------------
@dataclass
class Sample:
    """One reading: the wall clock, each core's busy and idle seconds since boot, this process tree's CPU
    seconds, and the 1-minute load average."""

    t: float
    busy: list[float]
    idle: list[float]
    own: float
    loadavg: float | None


def _cores_stat() -> tuple[list[float], list[float]] | None:
    """Per core (cpu0, cpu1, ...): (busy seconds, idle seconds) since boot; None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            lines = [ln.split() for ln in f if ln.startswith("cpu") and ln[3:4].isdigit()]
    except OSError:
        return None
    busy, idle = [], []
    for fields in lines:
        v = [int(x) for x in fields[1:]] + [0] * 8
        busy.append((v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / _HZ)   # user nice system irq softirq steal
        idle.append((v[3] + v[4]) / _HZ)                                 # idle iowait
    return busy, idle


def _proc_times(pid: int) -> float:
    """CPU seconds of process `pid` and of the children it has reaped (utime, stime, cutime, cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _HZ


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def tree_cpu_s(pid: int | None = None) -> float:
    """CPU seconds of process `pid` (default: this one), its live descendants and the children they reaped."""
    total, stack, seen = 0.0, [pid or os.getpid()], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _proc_times(p)
        stack.extend(_children(p))
    return total


def _loadavg() -> float | None:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def sample() -> Sample | None:
    """A reading now, or None where /proc/stat cannot be read."""
    stat = _cores_stat()
    if stat is None:
        return None
    return Sample(time.perf_counter(), stat[0], stat[1], tree_cpu_s(), _loadavg())


@dataclass
class Load:
    """What other processes did to this machine over an interval."""

    foreign: float              # cores other processes kept busy, on average
    seconds: float              # the interval
    core_busy: list[float]      # each core's busy fraction (every process's work, ours included)
    loadavg: float | None       # the 1-minute load average at its end (runnable threads, ours included)
    cores: int

    @property
    def threshold(self) -> float:
        """Foreign cores above which the interval counts as loaded: FOREIGN_BUSY, plus two ticks per core
        over the interval (the reading's resolution)."""
        return FOREIGN_BUSY + 2 * self.cores / _HZ / max(self.seconds, 1e-3)

    @property
    def busy(self) -> bool:
        return self.foreign > self.threshold

    @property
    def heavy(self) -> bool:
        """Another program holds about a core of its own (not just the background of a shared machine)."""
        return self.foreign >= FOREIGN_HEAVY

    @property
    def idle_cores(self) -> float:
        """The cores left idle over the interval (each core's idle fraction, summed)."""
        return sum(1.0 - b for b in self.core_busy)

    def why(self) -> str:
        cores = ", ".join(f"{100 * b:.0f}%" for b in self.core_busy)
        avg = f"; load average {self.loadavg:.2f}" if self.loadavg is not None else ""
        return (f"other processes kept {self.foreign:.2f} of {self.cores} cores busy over {self.seconds:.2f} s "
                f"(cores busy {cores}; {self.idle_cores:.2f} idle{avg})")

    def short(self) -> str:
        avg = f", load average {self.loadavg:.2f}" if self.loadavg is not None else ""
        return f"other processes kept {self.foreign:.2f} of {self.cores} cores busy{avg}"

    def to_json(self) -> dict:
        return {"foreign": round(self.foreign, 3), "seconds": round(self.seconds, 3),
                "core_busy": [round(b, 3) for b in self.core_busy], "loadavg": self.loadavg, "cores": self.cores}

    @classmethod
    def between(cls, a: Sample, b: Sample) -> "Load":
        dt = max(b.t - a.t, 1e-9)
        machine = sum(b.busy) - sum(a.busy)
        core_busy = []
        for b0, b1, i0, i1 in zip(a.busy, b.busy, a.idle, b.idle):
            total = (b1 - b0) + (i1 - i0)
            core_busy.append(min(1.0, max(0.0, (b1 - b0) / total)) if total > 0 else 0.0)
        return cls(max(0.0, (machine - (b.own - a.own)) / dt), dt, core_busy, b.loadavg, len(b.busy))


class Watch:
    """The foreign load over a stretch of work: ``w = Watch().start(); ...; load = w.stop()`` (None where the
    machine gives no reading). ``reader``: what takes a :class:`Sample` (default: :func:`sample`)."""

    def __init__(self, reader=None):
        self.reader = reader or sample
        self._first: Sample | None = None

    def start(self) -> "Watch":
        self._first = self.reader()
        return self

    def stop(self) -> Load | None:
        last = self.reader()
        if self._first is None or last is None:
            return None
        return Load.between(self._first, last)


class LoadLog:
    """The foreign load over each of a sequence of back-to-back stretches of work (a profile's entries):
    ``log.start(); ...; load = log.stop()``. A stretch shorter than `min_s` is judged over the last `min_s`
    (from the readings of the stretches before it): /proc/stat's ticks make a reading of a few tens of
    milliseconds meaningless, and the load that matters (another program's run) lasts seconds."""

    def __init__(self, reader=None, min_s: float = 0.5):
        self.reader, self.min_s = reader or sample, min_s
        self.samples: list[Sample] = []
        self._first: Sample | None = None

    def _take(self) -> Sample | None:
        got = self.reader()
        if got is not None:
            self.samples.append(got)
            del self.samples[:-64]
        return got

    def start(self) -> "LoadLog":
        self._first = self._take()
        return self

    def stop(self) -> Load | None:
        last = self._take()
        if self._first is None or last is None:
            return None
        first = self._first
        if last.t - first.t < self.min_s:
            earlier = [s for s in self.samples if s.t <= last.t - self.min_s]
            first = earlier[-1] if earlier else self.samples[0]
        return Load.between(first, last)


def current_load(seconds: float = 0.5, reader=None) -> Load | None:
    """The foreign load over the next `seconds` (this process sleeps meanwhile): is the machine quiet now?"""
    w = Watch(reader).start()
    time.sleep(seconds)
    return w.stop()


def quiet_check(seconds: float = 0.5, reader=None, readings: int | None = None) -> Load | None:
    """Is the machine quiet enough to measure on now? Up to `readings` (QUIET_READINGS) back-to-back readings of
    `seconds` each, per core from /proc/stat, stopping at the first quiet one; returns that one, else the least
    loaded. A neighbour's burst, or the tail of a program that just ended, makes one reading busy, not all of
    them: the machine is called busy only where every reading says so."""
    best = None
    for _ in range(max(1, QUIET_READINGS if readings is None else readings)):
        load = current_load(seconds, reader)
        if load is None or not load.busy:
            return load
        if best is None or load.foreign < best.foreign:
            best = load
    return best


# --- cores ours (active) ------------------------------------------------------------------------------------


def _spin(seconds: float, warm: float, conn) -> None:
    end = time.perf_counter() + warm   # a new process starts behind in the scheduler's accounting
    while time.perf_counter() < end:
        pass
    c0, end = time.process_time(), time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    conn.send(time.process_time() - c0)
    conn.close()


def available_cores(seconds: float = 0.3, n: int | None = None, warm: float = 0.1) -> float:
    """Cores that n (default: all) busy processes of ours get right now, in (0, n]: their CPU
    time over ``seconds`` of wall time, after ``warm`` seconds of spinning."""
    n = n or os.cpu_count() or 1
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    pipes, procs = [], []
    try:
        for _ in range(n):
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_spin, args=(seconds, warm, w), daemon=True)
            p.start()
            w.close()
            pipes.append(r)
            procs.append(p)
        cpu = sum(r.recv() for r in pipes)
    except (OSError, EOFError):
        return float(n)
    finally:
        for p in procs:
            p.join(timeout=5)
    return max(0.05, min(float(n), cpu / seconds))
