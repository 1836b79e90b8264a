"""Profile section: the learner. Its kernel on each device (chosen by hetrl.kernels, as a run
chooses it), one gradient step per device, thread count and batch size, grouped gradient steps,
and publishing its parameters to an actor."""

from __future__ import annotations

import time
from typing import Any

from hetrl.planner.measure import Timing, measure, measure_threads
from hetrl.planner.profile.context import Context, sync_of


def synthetic_batch(spec: dict, act_space, B: int, K: int, dev: str) -> tuple[dict, Any]:
    """K stacked batches of B synthetic transitions of the replay spec ``spec`` on ``dev``, and
    their importance weights (ones): what the profile times the learner on (hetrl/kernels/select.py's)."""
    from hetrl.kernels import synthetic_batch as synth

    return synth(spec, act_space, B, K, dev)


def learn_timing(algo, batch: dict, wts, dev: str, steps: int = 1, *, cap_s: float, tol: float = 0.05,
                 threads: int = 1, one: dict | None = None, **measure_kw) -> Timing:
    """Seconds per gradient step of ``algo.learn(batch, wts)`` (``steps`` per call) on ``dev``: on
    the CPU in CPU time of the process, on a GPU in wall time with a synchronize per round; with
    ``threads`` > 1 CPU threads: the 1-thread figure ``one`` x the t / 1-thread wall-time ratio."""
    if one is None:
        kw = {"tol": tol, **measure_kw}
        if dev == "cpu":
            kw["clock"] = time.process_time
        t = measure(lambda: algo.learn(batch, wts), cap_s=cap_s, sync=sync_of(dev), **kw)
        t.s /= steps
        return t
    r = measure_threads(lambda: algo.learn(batch, wts), threads, tol=tol, cap_s=cap_s)
    return Timing(one["s"] * r.s, r.spread, r.rounds, r.calls, r.stable)


class Learners:
    """The learner's kernel on each device: the fastest of those checked equal to the public one on
    this machine (hetrl/kernels/select.py: the choice a run makes, cached per machine). Every learner
    figure of the profile is of the chosen kernel, and the actors act through it as the run's will."""

    def __init__(self, ctx: Context, refresh: bool = False):
        from hetrl import kernels
        from hetrl.algos import make_algorithm

        self.ctx = ctx
        cfg, obs, act = ctx.cfg, ctx.obs_space, ctx.act_space
        K = max(ctx.grid["k_groups"] or [1])
        self.choices = {}
        for dev in ctx.devices:
            ctx.say(f"learner kernel on {dev}: the candidates checked against the public one and timed, {K} steps")
            self.choices[dev] = kernels.choose(cfg, lambda dev=dev: make_algorithm(cfg, obs, act, dev), obs, act,
                                               ctx.learn_fields, dev, K, refresh=refresh).to_json()
        self.cpu_kernel = self.on(cfg, "cpu") if "cpu" in ctx.devices else None
        self.cpu_algo = self.cpu_kernel.algo if self.cpu_kernel is not None else make_algorithm(cfg, obs, act, "cpu")

    def on(self, cfg, dev: str):
        """A new algorithm of settings `cfg` on `dev`, run by the kernel chosen there."""
        from hetrl import kernels
        from hetrl.algos import make_algorithm

        choice = kernels.Choice.from_json(self.choices[dev])
        return kernels.build(choice, make_algorithm(cfg, self.ctx.obs_space, self.ctx.act_space, dev))

    def policy(self, **kw):
        """The CPU algorithm's acting policy, through the chosen kernel's acting."""
        policy = self.cpu_algo.make_policy(**kw)
        return self.cpu_kernel.wrap_policy(policy) if self.cpu_kernel is not None else policy

    @property
    def cpu(self):
        """What learns on the CPU (the chosen kernel, else the algorithm itself)."""
        return self.cpu_kernel or self.cpu_algo


def measure_learner(ctx: Context, learners: Learners) -> dict:
    """Sections ``learn`` (per device, thread count, batch size), ``learn_grouped`` (K steps per call at
    the run's batch size) and ``param_sync`` (publish + load into an actor's policy), per device."""
    import torch

    from hetrl.algos import make_algorithm
    from hetrl.runtime.params import InProcessParameterStore

    cfg, grid = ctx.cfg, ctx.grid
    out: dict = {"learn": {}, "learn_grouped": {}, "param_sync": {}}
    learn, grouped = out["learn"], out["learn_grouped"]

    def timed(dev, th, algo, batch, wts, steps: int, one: dict | None) -> dict:
        return ctx.entry(lambda: learn_timing(algo, batch, wts, dev, steps, cap_s=ctx.cap(), threads=th, one=one,
                                              **ctx.mkw))

    def kept(section: str, *path) -> bool:
        """An entry this pass does not measure: the table's, where it has one."""
        if ctx.wants(section, *path):
            return False
        node = out[section]
        for p in path[:-1]:
            node = node.setdefault(str(p), {})
        if ctx.previous(section, *path) is not None:
            node[str(path[-1])] = ctx.previous(section, *path)
        return True

    for dev in ctx.devices:
        learn[dev] = {}
        for th in (grid["threads"] if dev == "cpu" else [1]):
            torch.set_num_threads(th)
            learn[dev][str(th)] = {}
            for B in grid["batches"]:
                if kept("learn", dev, th, B):
                    continue
                ctx.say(f"learner update on {dev}, batch {B}, {th} thread(s)")
                algo = learners.on(cfg.replace(batch_size=B), dev)
                batch, wts = synthetic_batch(ctx.learn_fields, ctx.act_space, B, 1, dev)
                learn[dev][str(th)][str(B)] = timed(dev, th, algo, batch, wts, 1,
                                                    learn[dev]["1"][str(B)] if th > 1 else None)
            if grid["k_groups"]:
                grouped.setdefault(dev, {})[str(th)] = {}
            B = cfg.batch_size
            for K in grid["k_groups"]:
                if kept("learn_grouped", dev, th, K):
                    continue
                ctx.say(f"learner update on {dev}, batch {B}, {K} grouped steps, {th} thread(s)")
                algo = learners.on(cfg, dev)
                batch, wts = synthetic_batch(ctx.learn_fields, ctx.act_space, B, K, dev)
                one = grouped[dev]["1"][str(K)] if th > 1 else None
                grouped[dev][str(th)][str(K)] = timed(dev, th, algo, batch, wts, K, one)
        torch.set_num_threads(1)
        if kept("param_sync", dev):
            continue
        algo = make_algorithm(cfg, ctx.obs_space, ctx.act_space, dev)
        ctx.say(f"parameter publish + load from {dev}")
        store, pol = InProcessParameterStore(), algo.make_policy(seed=1)

        def sync_params(store=store, pol=pol, algo=algo):
            store.publish(algo.policy_state())
            pol.load(store.latest(-1)[0])
        out["param_sync"][dev] = ctx.entry(lambda: measure(sync_params, cap_s=ctx.cap(), sync=sync_of(dev),
                                                           **ctx.kw_of(dev)))
    return out
