"""Where a run goes: in this process (stop_signals), or as groups in processes of their own or Ray tasks (a
population's groups: run_groups)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from hetrl.errors import HetrlError
from hetrl.runtime.local import _context


class _Stop:
    """Set by the first SIGINT or SIGTERM; `signal` names it."""

    signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None


@contextlib.contextmanager
def stop_signals():
    """Ctrl-C (SIGINT) and SIGTERM (`timeout`, a cluster scheduler) ask the run to stop at the end of
    the current phase, with a checkpoint; a second one stops at once (KeyboardInterrupt). Under every
    schedule: actors ignore both and leave the stop to the learner. Off the main thread, no handler."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop.signal = signal.Signals(signum).name

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


_driver: tuple | None = None   # in a group's process: (lock, progress of each group, stop_at) of its driver


def _driven(lock, progress, stop_at) -> None:
    """A group process's start: it leads its own process group (the terminal's Ctrl-C goes to the driver alone)
    and keeps what its driver shares with it."""
    global _driver
    os.setpgrp()
    _driver = (lock, progress, stop_at)


def _group(target, index: int, job: tuple):
    """Group `index`'s target, asked at the start of every phase with its env steps whether to stop.

    SIGINT / SIGTERM to the driver sets `stop_at` to one past the furthest group's count; every group then stops at
    the first phase boundary at or beyond it, so that every member stops at the same env step count. The lock
    makes "record my count, read stop_at" and "read every count, set stop_at" happen one at a time. A group whose
    starting process (the driver, or its fork server) has ended stops at once rather than train on alone."""
    lock, progress, stop_at = _driver
    parent = os.getppid()

    def stopped(env_steps: int) -> bool:
        if os.getppid() != parent:
            return True
        with lock:
            progress[index].value = env_steps
            at = stop_at.value
        return 0 <= at <= env_steps

    return target(*job, stopped=stopped)


def run_groups(target, jobs: list[tuple], where: str, cfg=None, cpus: int = 1, out: Path | None = None) -> list:
    """What `target(*job)` returned, per job, run in processes (`where` "local": the local schedule's process
    context) or Ray tasks ("ray": `cpus` each, on the cluster of cfg; the files a task returns under "files" are
    written into `out`). The first group's error is raised here (the groups share their settings)."""
    if where == "ray":
        return _run_ray(target, jobs, cfg, cpus, out)
    ctx = _context()
    lock, stop_at = ctx.Lock(), ctx.Value("q", -1, lock=False)
    progress = [ctx.Value("q", 0, lock=False) for _ in jobs]

    def ask_to_stop() -> None:
        with lock:
            if stop_at.value < 0:
                stop_at.value = max(v.value for v in progress) + 1

    pool = ProcessPoolExecutor(len(jobs), mp_context=ctx, initializer=_driven, initargs=(lock, progress, stop_at))
    futures = []
    try:
        with stop_signals() as stop:
            futures = [pool.submit(_group, target, i, job) for i, job in enumerate(jobs)]
            while wait(futures, timeout=0.5).not_done:
                if stop:
                    ask_to_stop()
        results = [f.result() for f in futures]
    except BrokenProcessPool:
        raise HetrlError("a group failed: its process ended abruptly (killed, or out of memory)") from None
    except KeyboardInterrupt:   # a second signal: the groups still get a minute to save
        ask_to_stop()
        wait(futures, timeout=60)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if stop.signal:
        for r in results:
            r["interrupted"] = stop.signal
    return results


def _run_ray(target, jobs: list[tuple], cfg, cpus: int, out: Path) -> list:
    from hetrl.runtime.ray_schedule import connect, disconnect

    ray = connect(cfg)
    try:
        task = ray.remote(num_cpus=max(1, cpus))(target)
        results = ray.get([task.remote(*job) for job in jobs])
    finally:
        disconnect()   # a Ray this run started (a cluster or the caller's Ray is left running)
    for r in results:   # every member's files, wherever its task ran
        for rel, data in r.pop("files", {}).items():
            p = out / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    return results
