"""Profile section: the training loop around the learner. A short real inline run of the workload, per CPU thread
count, timed phase by phase: what one env step costs beyond the learner's updates (acting, inserting, drawing the
batches, counting, publishing, refreshing the actor's policy) and what of it is acting.

Why measure it whole: the other sections time each part alone, hot in the caches, and the parts' sum misses what a
real loop adds. A policy that acts between two large updates finds its weights evicted, the replay's draw builds a
dict of tensors, and the learner core counts, checks and publishes after every call. Where a phase is one env step
and one update, that is a good share of the phase, which a model of the parts alone over-predicts by as much
(docs/planner.md, "The loop, timed whole", gives a measured case).
"""

from __future__ import annotations

import time

from hetrl.planner.measure import measure
from hetrl.planner.profile.context import Context

WARM_PHASES = 8          # learner phases run before timing (the kernel's lanes and buffers are made in the first)
LOOP_BUFFER = 50_000     # the loop's replay holds at most this many transitions (the run's may be larger)


def loop_config(cfg, threads: int):
    """The run's settings for a loop of the inline schedule with a CPU learner of `threads` threads that learns
    after one batch and never ends by itself (no evaluation, a replay of at most LOOP_BUFFER)."""
    buffer = max(min(cfg.buffer_size, LOOP_BUFFER), 4 * cfg.batch_size)
    kernel = cfg.system.learner_kernel if cfg.system.learner_kernel != "cuda_graph" else "auto"
    return cfg.replace(schedule="inline", device="cpu", learner_kernel=kernel, threads=threads, steps=1 << 40,
                       learning_starts=cfg.batch_size, buffer_size=buffer, eval_episodes=0)


def measure_loop(ctx: Context, env) -> dict:
    """Section ``loop``: per thread count t of the grid, the inline loop's wall time per env step beyond its learner
    calls (``s``), and of it the actor's collect (``act_s``); its learner calls' time per gradient step (``learn_s``,
    the updates as an inline run makes them: after a stretch of one-thread work, not back to back) and steps per
    call (``group``); the gradient steps per env step and the envs and steps per phase it ran at. An off-policy CPU
    learner only (an on-policy phase is a rollout, priced by its own sections). `env`: the run's env, as given."""
    from hetrl.runtime.inline import InlineSchedule

    out: dict = {}
    for t in ctx.grid.get("loop", []):
        if not ctx.wants("loop", "cpu", t):
            if ctx.previous("loop", "cpu", t) is not None:
                out[str(t)] = ctx.previous("loop", "cpu", t)
            continue
        ctx.say(f"training loop (inline), {t} thread(s)")
        sched = InlineSchedule(loop_config(ctx.cfg, t), env)
        try:
            out[str(t)] = ctx.entry(lambda: _time_loop(sched, t, ctx.cap(), ctx.mkw))
        finally:
            sched.close()
    return {"loop": {"cpu": out}} if out else {}


def _time_loop(sched, threads: int, cap_s: float, mkw: dict) -> dict:
    """One entry: measure()'s figure of one phase (InlineSchedule._step) in wall time less the learner's updates,
    per env step."""
    import torch

    c, calls = sched.c, [0]

    def phase() -> None:
        calls[0] += 1
        sched._step()

    def clock() -> float:   # wall time less the learner's updates (the core's own count of them)
        return time.perf_counter() - c.learner_s

    torch.set_num_threads(threads)
    try:
        while c.phases < WARM_PHASES:
            sched._step()
        e0, g0, a0, l0, n0 = c.env_steps, c.gradient_steps, c.acting_s, c.learner_s, c.phases
        t = measure(phase, cap_s=cap_s, clock=clock, **mkw)
    finally:
        torch.set_num_threads(1)
    steps, grads = max(1, c.env_steps - e0), max(1, c.gradient_steps - g0)
    per_phase = steps / max(1, calls[0])
    return {**t.to_json(), "s": t.s / per_phase, "act_s": (c.acting_s - a0) / steps,
            "learn_s": (c.learner_s - l0) / grads, "group": grads / max(1, c.phases - n0),
            "grads_per_step": grads / steps, "steps_per_phase": per_phase, "envs": sched.actor.num_envs,
            "threads": threads}
