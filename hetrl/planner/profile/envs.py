"""Profile section: the acting side. One step of a vector of W envs per width (and per backend where
``env_backend=auto`` may take EnvPool), one actor vector step (envs + inference + n-step adder, as
Actor.collect runs it), and policy inference for W observations per device."""

from __future__ import annotations

from typing import Callable

from hetrl.planner.measure import Timing, measure
from hetrl.planner.profile.context import Context, sync_of


def measure_envs(ctx: Context, policy: Callable) -> dict:
    """Sections ``env`` and ``act`` per width, and ``env_backend`` (the backend chosen, per width where both
    were timed). `policy(**kw)`: the acting policy the run's actors will have (through its kernel)."""
    import hetrl.actors
    from hetrl.actors.envs import envpool_supports, make_vector_env

    cfg, env = ctx.cfg, ctx.env
    out: dict = {"env": {}, "act": {}}

    def env_step(name: str, w: int) -> Timing:
        venv = make_vector_env(env, w, 0, name)
        acts = [venv.action_space.sample() for _ in range(64)]
        it = iter(range(1 << 62))
        try:
            return measure(lambda: venv.step(acts[next(it) % 64]), cap_s=ctx.cap(), **ctx.cpu)
        finally:
            venv.close()

    # env_backend=auto: both backends timed at each width; the faster one there is the one the actors of that
    # width are measured with and a plan with that many envs per actor runs (EnvPool where it has the env,
    # Gymnasium otherwise). Per width: EnvPool's C++ vector hands each step to its worker threads, which at one
    # or two cheap envs costs more than Gymnasium's step in Python and less from a few envs on
    backend = "gymnasium" if cfg.system.env_backend == "auto" else cfg.system.env_backend
    out["env_backend"] = {"chosen": backend}
    both = cfg.system.env_backend == "auto" and envpool_supports(env)
    at: dict[str, str] = {}
    for w in ctx.grid["widths"]:
        if not (ctx.wants("env", w) or ctx.wants("act", w)):   # a re-measurement of other entries: kept
            for sec in ("env", "act"):
                if ctx.previous(sec, w) is not None:
                    out[sec][str(w)] = ctx.previous(sec, w)
            prev_at = ctx.previous("env_backend", "widths", w)
            if prev_at is not None:
                out["env_backend"].setdefault("widths", {})[str(w)] = prev_at
            at[str(w)] = (prev_at or {}).get("chosen", backend)
            continue
        timed, entries = {}, {}
        for name in (("gymnasium", "envpool") if both else (backend,)):
            ctx.say(f"env step{f' ({name})' if both else ''}, {w} env(s)")
            entries[name] = ctx.entry(lambda name=name: env_step(name, w))
            timed[name] = Timing.from_json(entries[name])
        at[str(w)] = min(timed, key=lambda n: timed[n].s)
        out["env"][str(w)] = entries[at[str(w)]]
        if both:
            out["env_backend"].setdefault("widths", {})[str(w)] = {
                "chosen": at[str(w)], **{f"{n}_s": t.s / w for n, t in timed.items()}}
        ctx.say(f"actor step (env + inference + n-step), {w} env(s)")
        actor = hetrl.actors.ActorSpec(env, w, 0, policy(seed=1, num_envs=w), cfg.n_step, cfg.gamma,
                                       at[str(w)]).build()

        def step_actor(actor=actor, w=w):
            actor.collect(w, lambda steps: 0.1)
            actor.episodes.clear()
        out["act"][str(w)] = ctx.entry(lambda: measure(step_actor, cap_s=ctx.cap(), **ctx.cpu))
        actor.close()
    if both and out["env_backend"].get("widths"):   # the preset's width (the widest without one): its backend
        widths = out["env_backend"]["widths"]
        top = widths.get(str(cfg.num_envs if str(cfg.num_envs) in at else max(ctx.grid["widths"])))
        out["env_backend"].update(top or {})
    return out


def measure_inference(ctx: Context, policy: Callable) -> dict:
    """Section ``infer``: ``policy.act`` on W observations, per device and width."""
    import numpy as np

    out: dict = {}
    for dev in ctx.devices:
        out[dev] = {}
        pol = policy(seed=1, device=dev)
        for w in ctx.grid["widths"]:
            if not ctx.wants("infer", dev, w):
                if ctx.previous("infer", dev, w) is not None:
                    out[dev][str(w)] = ctx.previous("infer", dev, w)
                continue
            ctx.say(f"inference on {dev}, batch {w}")
            obs = ctx.rng.standard_normal((w, *ctx.obs_space.shape)).astype(np.float32)
            out[dev][str(w)] = ctx.entry(lambda: measure(lambda: pol.act(obs, 0.1), cap_s=ctx.cap(),
                                                         sync=sync_of(dev), **ctx.kw_of(dev)))
    return {"infer": out}
