"""Where a run goes: in this process, or as groups in processes of their own or Ray tasks (a population's groups).

`stop_signals()`: Ctrl-C / SIGTERM ask a run to stop at the end of its phase, with a checkpoint.
`run_groups(target, jobs, where)`: `target(*job, stopped=...)` for each job, in a process per job (local) or a Ray
task per job (ray); it returns what each target returned. SIGINT / SIGTERM to this driver asks every group to stop
at the first phase boundary past the furthest one's, so that every member stops at the same env step count.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

from hetrl.errors import HetrlError


class _Stop:
    """Set by the first SIGINT or SIGTERM; `signal` names it."""

    def __init__(self) -> None:
        self.signal: str | None = None

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


class DriverStop:
    """A group process's view of its driver, asked at the start of every phase with its env steps.

    The driver asks the groups to stop by setting `stop_at` to one past the furthest group's count; every group
    then stops at the first phase boundary at or beyond it. The lock makes "record my count, read stop_at" and
    "read every count, set stop_at" happen one at a time. A group whose starting process (the driver, or its fork
    server) has ended stops at once rather than train on alone."""

    def __init__(self, lock, progress, stop_at):
        self.lock, self.progress, self.stop_at, self.parent = lock, progress, stop_at, os.getppid()

    def __call__(self, env_steps: int) -> bool:
        if os.getppid() != self.parent:
            return True
        with self.lock:
            self.progress.value = env_steps
            at = self.stop_at.value
        return 0 <= at <= env_steps


def _group_process(conn, target, lock, progress, stop_at, *job) -> None:
    """A group's process: the terminal's Ctrl-C goes to the driver alone (this process leads its own process
    group); sends back ("ok", what target returned) or ("error", the exception)."""
    os.setpgrp()
    try:
        conn.send(("ok", target(*job, stopped=DriverStop(lock, progress, stop_at))))
    except BaseException as e:  # noqa: BLE001 - sent to the driver, which raises it
        try:
            conn.send(("error", e))
        except Exception:   # an exception that does not pickle: its line
            conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def run_groups(target, jobs: list[tuple], where: str, cfg=None, cpus: int = 1, out: Path | None = None) -> list:
    """`target(*job)` per job, in processes (`where` "local") or Ray tasks ("ray": `cpus` each, on the cluster of
    cfg; the files a task returns under "files" are written into `out`)."""
    if where == "ray":
        return _run_ray(target, jobs, cfg, cpus, out)
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    lock, stop_at = ctx.Lock(), ctx.Value("q", -1, lock=False)
    progress = [ctx.Value("q", 0, lock=False) for _ in jobs]

    def ask_to_stop() -> None:   # every group stops at the first phase boundary past the furthest one
        with lock:
            if stop_at.value < 0:
                stop_at.value = max(v.value for v in progress) + 1

    procs, conns, results = [], [], [None] * len(jobs)
    try:
        with stop_signals() as stop:
            for job, mine in zip(jobs, progress):
                recv, send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_group_process, name="hetrl-group",
                                args=(send, target, lock, mine, stop_at, *job))
                p.start()
                send.close()
                procs.append(p)
                conns.append(recv)
            while any(r is None for r in results):
                if stop:
                    ask_to_stop()
                for c in wait([c for c, r in zip(conns, results) if r is None], timeout=0.5):
                    i = conns.index(c)
                    try:
                        results[i] = c.recv()
                    except EOFError:
                        results[i] = ("error", f"the process of group {i} ended with exit code {procs[i].exitcode}")
    except BaseException:   # a second signal: the groups still get a minute to save
        ask_to_stop()
        for p in procs:
            p.join(60)
        raise
    for p in procs:
        p.join()
    errors = [r[1] for r in results if r[0] != "ok"]
    if errors:   # the groups share their settings: the first one's error is the one to show
        raise errors[0] if isinstance(errors[0], BaseException) else HetrlError(f"a group failed: {errors[0]}")
    out_results = [r[1] for r in results]
    if stop.signal:
        for r in out_results:
            r["interrupted"] = stop.signal
    return out_results


def _run_ray(target, jobs: list[tuple], cfg, cpus: int, out: Path) -> list:
    import ray

    from hetrl.runtime.ray_schedule import connect, disconnect

    connect(cfg)
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
