"""Profile section: the replay. Data storage insert and gather per device (on the storage the run
uses: frames stored once where they apply), the replay manager's sum tree (insert, prioritized and
uniform sample, priority update; CPU), and the local schedule's learner loop with the next group
drawn by a prefetch thread against drawing it in line."""

from __future__ import annotations

import time

from hetrl.planner.measure import measure
from hetrl.planner.profile.context import Context, sync_of

PREFETCH_MARGIN = 0.02   # the prefetch thread is chosen where its learner loop measured >= 2% faster


class _Data:
    """Random transitions of the run's replay spec, and the ring size the storage figures are taken on
    (large transitions, pixels: a ring of ~256 MB measures the same memory-bound copies)."""

    def __init__(self, ctx: Context):
        from hetrl.replay.frames import frames_apply

        self.ctx = ctx
        self.capacity = int(min(ctx.cfg.buffer_size, 1_000_000, max(4096, 2**28 // ctx.bytes_per_transition)))
        self.frames = ctx.cfg.replay_frames and frames_apply(ctx.spec, ctx.cfg.frame_stack)   # the run's storage

    def batch(self, n: int) -> dict:
        import numpy as np

        rng, spec, out = self.ctx.rng, self.ctx.spec, {}
        for name, (shape, dt) in spec.items():
            if np.dtype(dt) == np.bool_:
                out[name] = rng.random((n, *shape)) < 0.02
            else:
                out[name] = rng.standard_normal((n, *shape)).astype(dt) if np.dtype(dt).kind == "f" \
                    else rng.integers(0, 2, (n, *shape)).astype(dt)
        if self.frames:  # one env's consecutive stacks, as the frame storage sees them
            K, seq = spec["obs"][0][0], rng.integers(0, 256, (n + spec["obs"][0][0], *spec["obs"][0][1:]), np.uint8)
            win = np.lib.stride_tricks.sliding_window_view(seq, K, axis=0).transpose(0, 3, 1, 2)
            out["obs"], out["next_obs"] = win[:n].copy(), win[1:n + 1].copy()
        return out

    def replay(self, dev: str, prioritized: bool):
        """A full replay of the run's storage on `dev`."""
        from hetrl.replay import ReplayBuffer

        rb = ReplayBuffer(self.capacity, self.ctx.spec, dev, prioritized=prioritized, seed=0, frames=self.frames)
        for s in range(0, self.capacity, 65536):
            rb.insert(self.batch(min(65536, self.capacity - s)))
        return rb


def measure_storage(ctx: Context) -> dict:
    """Sections ``ds_insert`` (n transitions already on the device) and ``ds_gather`` (n slots), per device."""
    import numpy as np
    import torch

    data, out = _Data(ctx), {"ds_insert": {}, "ds_gather": {}}
    for dev in ctx.devices:
        out["ds_insert"][dev], out["ds_gather"][dev] = {}, {}
        todo = [(sec, n) for sec, sizes in (("ds_insert", ctx.grid["inserts"]), ("ds_gather", ctx.grid["samples"]))
                for n in sizes]
        for sec, n in todo:
            if not ctx.wants(sec, dev, n) and ctx.previous(sec, dev, n) is not None:
                out[sec][dev][str(n)] = ctx.previous(sec, dev, n)
        if not any(ctx.wants(sec, dev, n) for sec, n in todo):
            continue
        rb = data.replay(dev, prioritized=False)
        for n in ctx.grid["inserts"]:
            if not ctx.wants("ds_insert", dev, n):
                continue
            ctx.say(f"data storage insert on {dev}, {n} transitions")
            b = data.batch(n)
            if dev != "cpu":
                b = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in b.items()}
            out["ds_insert"][dev][str(n)] = ctx.entry(lambda: measure(lambda: rb.storage.insert(b), cap_s=ctx.cap(),
                                                                      sync=sync_of(dev), **ctx.kw_of(dev)))
        for n in ctx.grid["samples"]:
            if not ctx.wants("ds_gather", dev, n):
                continue
            ctx.say(f"data storage gather on {dev}, {n} transitions")
            keys = ctx.rng.integers(0, data.capacity, n)
            if dev != "cpu":
                keys = torch.from_numpy(keys).to(dev)
            out["ds_gather"][dev][str(n)] = ctx.entry(lambda: measure(lambda: rb.storage.get(keys), cap_s=ctx.cap(),
                                                                      sync=sync_of(dev), **ctx.kw_of(dev)))
        rb = None   # freed before the next device's replay is filled
    return out


def measure_prefetch(ctx: Context, learner) -> dict:
    """Section ``prefetch``: the local schedule's learner loop (CPU learner `learner`, one thread) for each
    loop of the grid ('uniform:32', 'prioritized:1', ...): the next group drawn by a prefetch thread during
    the update, against drawing it in line. The thread pays only where the draw outlasts its handoff."""
    from hetrl.replay import BatchGroups

    out: dict = {}
    if "cpu" not in ctx.devices:
        return {"prefetch": out}
    data = _Data(ctx)
    for name in ctx.grid.get("prefetch", []):
        if not ctx.wants("prefetch", name):
            if ctx.previous("prefetch", name) is not None:
                out[name] = ctx.previous("prefetch", name)
            continue
        ctx.say(f"prefetch thread vs the draw in line, {name} batches per learner call")
        kind, K = name.split(":")
        rb = data.replay("cpu", prioritized=kind == "prioritized")
        groups = BatchGroups(rb, ctx.spec, ctx.cfg.batch_size, int(K), preallocate=True)
        out[name] = ctx.entry(lambda: prefetch_timing(learner, rb, groups, int(K), cap_s=ctx.cap() + ctx.cap()))
        rb = groups = None
    return {"prefetch": out}


def measure_replay_manager(ctx: Context) -> dict:
    """Sections ``rm_insert``, ``rm_sample`` (prioritized), ``rm_uniform`` and ``rm_update``: the sum tree's
    operations on a full tree of the storage figures' capacity (CPU)."""
    import numpy as np
    import torch

    from hetrl.replay import ReplayBuffer
    from hetrl.replay.sampler import UniformSampler

    capacity, rng, cpu = _Data(ctx).capacity, ctx.rng, ctx.cpu
    sections = ("rm_insert", "rm_sample", "rm_uniform", "rm_update")
    out: dict = {sec: {"cpu": {}} for sec in sections}
    for sec in sections:
        for n, prev in ((ctx.previous(sec, "cpu") or {}).items() if ctx.only is not None else ()):
            if not ctx.wants(sec, "cpu", n):
                out[sec]["cpu"][n] = prev
    if not any(ctx.wants_any(sec) for sec in sections):
        return out
    rbp = ReplayBuffer(capacity, {"reward": ((), "float32")}, "cpu", prioritized=True, seed=0)
    rbp.storage.size = capacity
    rbp.tree.update(np.arange(capacity), rng.random(capacity) + 0.01)

    def timed(sec: str, n: int, fn) -> None:
        if ctx.wants(sec, "cpu", n):
            out[sec]["cpu"][str(n)] = ctx.entry(lambda: measure(fn, cap_s=ctx.cap(), **cpu))

    for n in ctx.grid["inserts"]:
        ctx.say(f"replay manager insert (sum tree), {n} transitions")
        keys = rng.integers(0, capacity, n)
        timed("rm_insert", n, lambda: rbp.sampler.on_insert(keys))
    uniform = UniformSampler(rbp.rng)
    for n in ctx.grid["samples"]:
        ctx.say(f"replay manager sample / update, {n} keys")
        timed("rm_sample", n, lambda: rbp.sampler.sample(n, capacity))
        timed("rm_uniform", n, lambda: (uniform.sample(n, capacity), torch.ones(n)))
        keys = rng.integers(0, capacity, n)
        td = torch.rand(n)
        timed("rm_update", n, lambda: rbp.update_priorities(keys, td))
    return out


def prefetch_timing(algo, replay, groups, group: int, *, cap_s: float, rounds: int = 6) -> dict:
    """Wall seconds per group of gradient steps of the local schedule's learner loop (runtime/local.py):
    draw the group, learn on it, write its priorities (prioritized replay) -- with the draw in line, and
    with a prefetch thread drawing the next group while the learner learns this one (the priorities are
    written once the prefetch is done with the replay, as the schedule does). The two loops alternate
    `rounds` times on one thread of torch; the figures are the medians. Chosen: the thread where it
    measured faster by more than PREFETCH_MARGIN (a thread that gains nothing measurable stays off: in the
    run it shares the cores with the actors, which the isolated timing does not see)."""
    import statistics
    from concurrent.futures import ThreadPoolExecutor

    def learn(item) -> None:
        batch, keys, weights = item
        td = algo.learn(batch, weights)
        if replay.prioritized:
            replay.update_priorities(keys, td.reshape(-1))

    def in_line(n: int) -> None:
        for _ in range(n):
            learn(groups.draw(group))

    def prefetched(n: int) -> None:
        ready = groups.draw(group)
        for _ in range(n):
            pending = pool.submit(groups.draw, group)
            batch, keys, weights = ready
            td = algo.learn(batch, weights)
            ready = pending.result()
            if replay.prioritized:
                replay.update_priorities(keys, td.reshape(-1))

    with ThreadPoolExecutor(1, thread_name_prefix="hetrl-prefetch") as pool:
        in_line(2)
        prefetched(2)
        t = time.perf_counter()
        in_line(1)
        n = max(3, int(cap_s / (2 * rounds) / max(time.perf_counter() - t, 1e-6)))
        got: dict[str, list[float]] = {"serial_s": [], "prefetch_s": []}
        for r in range(rounds):
            for name, loop in (("serial_s", in_line), ("prefetch_s", prefetched))[:: 1 if r % 2 == 0 else -1]:
                t = time.perf_counter()
                loop(n)
                got[name].append((time.perf_counter() - t) / n)
    out = {name: statistics.median(v) for name, v in got.items()}
    return {"group": group, **out, "chosen": out["prefetch_s"] < (1 - PREFETCH_MARGIN) * out["serial_s"],
            "groups_per_round": n, "rounds": rounds}
