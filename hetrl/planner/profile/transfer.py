"""Profile section: moving data. Latency and bandwidth per ordered device pair ("cpu->cpu": an
in-memory copy; "cpu->cuda:0" pageable and pinned, "cuda:0->cpu", between GPUs), and "ipc": a pipe
between two processes (the local schedule's messages)."""

from __future__ import annotations

import time
from typing import Callable

from hetrl.planner.measure import measure
from hetrl.planner.profile.context import Context


def measure_transfers(ctx: Context, ipc: bool = True) -> dict:
    """Section ``transfer``: {pair: {latency_s, bandwidth_Bps, spread}} (a GPU link also "pinned")."""
    import numpy as np
    import torch

    tol, out = ctx.mkw["tol"], {}
    big = 8 << 20

    def link(pair: str, fn: Callable[[], dict | None]) -> None:
        """The link `pair`, measured with the foreign load watched (or the table's, where this pass keeps it)."""
        if not ctx.wants("transfer", pair):
            if ctx.previous("transfer", pair) is not None:
                out[pair] = ctx.previous("transfer", pair)
            return
        got = ctx.entry(lambda: fn() or {})
        if "latency_s" in got:
            out[pair] = got

    ctx.say("transfer cpu->cpu (in-memory copy)")
    src_s, dst_s = np.ones(64, np.uint8), np.empty(64, np.uint8)
    src_b, dst_b = np.ones(big, np.uint8), np.empty(big, np.uint8)
    link("cpu->cpu", lambda: _link(lambda: np.copyto(dst_s, src_s), lambda: np.copyto(dst_b, src_b),
                                   big, ctx.cap() + ctx.cap(), tol, clock=time.process_time))
    if ipc:
        ctx.say("transfer between processes (pipe)")
        link("ipc", lambda: _measure_ipc(ctx.cap() + ctx.cap(), tol))
    gpus = [d for d in ctx.devices if d != "cpu"]
    for g in gpus:
        def sync():
            for d in gpus:
                torch.cuda.synchronize(d)
        hs, hb = torch.ones(16, dtype=torch.float32), torch.ones(big // 4, dtype=torch.float32)
        ps, pb = hs.pin_memory(), hb.pin_memory()
        ctx.say(f"transfer cpu<->{g}")

        def to_gpu(g=g, hs=hs, hb=hb, ps=ps, pb=pb, sync=sync):
            got = _link(lambda: hs.to(g), lambda: hb.to(g), big, ctx.cap() + ctx.cap(), tol, sync)
            got["pinned"] = _link(lambda: ps.to(g, non_blocking=True), lambda: pb.to(g, non_blocking=True), big,
                                  ctx.cap() + ctx.cap(), tol, sync)
            return got
        link(f"cpu->{g}", to_gpu)
        ds, db = hs.to(g), hb.to(g)
        link(f"{g}->cpu", lambda ds=ds, db=db, sync=sync: _link(lambda: ds.cpu(), lambda: db.cpu(), big,
                                                                  ctx.cap() + ctx.cap(), tol, sync))
        for h in gpus:
            if h != g:
                link(f"{g}->{h}", lambda ds=ds, db=db, h=h, sync=sync: _link(lambda: ds.to(h), lambda: db.to(h), big,
                                                                               ctx.cap() + ctx.cap(), tol, sync))
    return {"transfer": out}


def _echo(conn) -> None:  # child side of the ipc measurement
    try:
        while True:
            msg = conn.recv_bytes()
            if not msg:
                break
            conn.send_bytes(b"k")
    except (EOFError, OSError):
        pass


def _measure_ipc(cap: float, tol: float) -> dict | None:
    import multiprocessing as mp

    try:
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        a, b = ctx.Pipe()
        proc = ctx.Process(target=_echo, args=(b,), daemon=True)
        proc.start()
    except (OSError, ValueError):
        return None
    try:
        small, big = b"x" * 64, b"x" * (1 << 20)

        def rtt(msg):
            def f():
                a.send_bytes(msg)
                a.recv_bytes()
            return f

        t_small = measure(rtt(small), cap_s=cap / 2, tol=tol)
        t_big = measure(rtt(big), cap_s=cap / 2, tol=tol)
        lat = t_small.s / 2
        bw = len(big) / max(1e-9, t_big.s - t_small.s)
        return {"latency_s": lat, "bandwidth_Bps": bw, "spread": max(t_small.spread, t_big.spread)}
    finally:
        try:
            a.send_bytes(b"")
        except OSError:
            pass
        proc.join(timeout=2)
        if proc.is_alive():
            proc.terminate()


def _link(copy_small: Callable, copy_big: Callable, big_bytes: int, cap: float, tol: float, sync=None,
          clock: Callable[[], float] = time.perf_counter) -> dict:
    t_small = measure(copy_small, cap_s=cap / 2, tol=tol, sync=sync, clock=clock)
    t_big = measure(copy_big, cap_s=cap / 2, tol=tol, sync=sync, clock=clock)
    return {"latency_s": t_small.s, "bandwidth_Bps": big_bytes / max(1e-9, t_big.s - t_small.s),
            "spread": max(t_small.spread, t_big.spread)}
