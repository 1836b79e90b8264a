"""How many cores this machine gives us now: a probe for shared machines.

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
