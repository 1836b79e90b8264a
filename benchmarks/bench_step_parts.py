"""Where an inline run's env step goes: timers around each part of the inline schedule's step.

    python benchmarks/bench_step_parts.py td3 Pendulum-v1 [--steps 4000] [--learning-starts 1000] [--set k=v ...]

Trains once under the default plan (inline where the plan says so; the script times the inline schedule's
parts only) and prints, per env step, the seconds spent loading the newest policy, acting and stepping the env
(the policy, the vector env), inserting, learning (the learner kernel, the learner core's bookkeeping after
it, sampling), and the run's loop around the schedule (evaluation due checks, progress, callbacks). The timers
wrap the parts from outside (the kernel and the policy as the run built them); each costs ~1 us a call.
Compare parts within one run: the machine's load moves the totals from run to run.
"""

from __future__ import annotations

import argparse
import collections
import json
import time

P = time.perf_counter
T: dict[str, float] = collections.defaultdict(float)


def timed(obj, name: str, label: str) -> None:
    f = getattr(obj, name)

    def wrapper(*a, **k):
        t = P()
        try:
            return f(*a, **k)
        finally:
            T[label] += P() - t
    setattr(obj, name, wrapper)


class Hook:
    """At training_start: time the parts the run built (its kernel, actor, policy and vector env)."""

    def training_start(self, run) -> None:
        s = run.schedule
        timed(s.core.kernel, "learn", "learn: kernel")
        timed(s.core, "learned", "learn: core bookkeeping (finite check, counters, publish)")
        timed(s.replay, "sample", "learn: sampling")
        timed(s.actor, "load", "load the newest policy")
        timed(s.actor.policy, "act", "collect: policy")
        timed(s.actor.venv, "step", "collect: vector env step")
        timed(s.actor, "collect", "collect (all)")
        timed(s.core, "insert", "insert")
        timed(s, "_learn", "learn (all)")
        timed(s, "phase", "schedule phase (all)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("algo")
    ap.add_argument("env")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--learning-starts", type=int, default=1000)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE (JSON value) added to the preset")
    args = ap.parse_args()
    import hetrl

    extra = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    run = hetrl.train(args.algo, args.env, steps=args.steps, learning_starts=args.learning_starts, progress=False,
                      evaluate_episodes=0, eval_episodes=0, callback=Hook(), **extra)
    r = run.result
    if r.get("schedule") != "inline":
        raise SystemExit(f"the plan chose the {r.get('schedule')} schedule; rerun with --set schedule='\"inline\"'")
    T["run loop outside the schedule"] = r["wall_s"] - T["schedule phase (all)"]
    n, g = r["env_steps"], r["gradient_steps"]
    print(f"{args.algo} {args.env}: {n:,} env steps, {g:,} gradient steps in {r['wall_s']:.1f} s "
          f"({r.get('env_steps_per_s_learning', 0):.1f} env steps/s while learning; kernel {r.get('learner_kernel')})")
    for label, s in T.items():
        print(f"  {label:58s} {s:8.2f} s  {s / n * 1e6:8.1f} us per env step")


if __name__ == "__main__":
    main()
