"""An actor's time per env step (`Actor.collect`: the policy, the vector env, the n-step writer, the loop), for
hetrl against an earlier hetrl or one acting part against another, alternating in one run.

    python benchmarks/bench_acting.py --variant before=/path/to/old/checkout --variant after=. \
        [--variant gym-vector=.:vector=gymnasium] [--variant torch-policy=.:policy=torch] [--rounds 5]

Each variant is NAME=CHECKOUT[:vector=gymnasium][:policy=torch]: the hetrl source tree to import (PYTHONPATH);
`vector=gymnasium` steps Gymnasium's SyncVectorEnv in place of the actor's own; `policy=torch` acts through the
policy's torch forward, without the compiled pieces the learner kernel gives actors. Cases are ALGO:ENV:ENVS
(default: dqn:CartPole-v1:1, td3:Pendulum-v1:1, sac:Pendulum-v1:1, ppo:CartPole-v1:8): the preset's networks,
exploring as in a run (epsilon / noise 0.1), one torch thread. Every round runs each variant in a fresh
subprocess, the order flipped every other round; a child takes the best of 3 collects of --steps env steps.
Prints microseconds per env step (medians over rounds) and the ratios to the first variant; writes
benchmarks/results/bench_acting_<cases>_<date>_<machine>_<commit>.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = "dqn:CartPole-v1:1,td3:Pendulum-v1:1,sac:Pendulum-v1:1,ppo:CartPole-v1:8"
CHILD = r"""
import json, sys, time
import gymnasium as gym, torch
torch.set_num_threads(1)
from hetrl.actors.actor import ActorSpec
from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels.compiled.acting import wrap
cases, vector, policy, steps = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
out = {}
for case in cases:
    name, env_id, envs = case.split(":")
    envs = int(envs)
    e = gym.make(env_id)
    algo = make_algorithm(make_config(name, env_id, {}), e.observation_space, e.action_space)
    pol = algo.make_policy(seed=1, num_envs=envs)
    if policy == "compiled" and isinstance(getattr(pol, "net", None), torch.nn.Module):
        wrap(pol.net, None)
    actor = ActorSpec(env_id, envs, 0, pol).start(True)
    if vector == "gymnasium":
        from hetrl.actors.envs import make_env
        actor.venv = gym.vector.SyncVectorEnv([lambda: make_env(env_id) for _ in range(envs)],
                                              autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        actor.obs, _ = actor.venv.reset(seed=list(range(envs)))
    actor.collect(steps // 4, lambda s: 0.1)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        actor.collect(steps, lambda s: 0.1)
        best = min(best, time.perf_counter() - t)
    out[case] = best / steps
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="NAME=CHECKOUT[:vector=gymnasium][:policy=torch]")
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cases = a.cases.split(",")
    variants = {}
    for v in a.variant:
        name, _, rest = v.partition("=")
        tree, *opts = rest.split(":")
        opt = dict(o.split("=", 1) for o in opts)
        variants[name] = (tree, opt.get("vector", "hetrl"), opt.get("policy", "compiled"))
    times: dict[str, dict[str, list[float]]] = {n: {c: [] for c in cases} for n in variants}
    names = list(variants)
    for r in range(a.rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            tree, vector, policy = variants[n]
            tree = str(Path(tree).resolve())
            env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                   "MKL_NUM_THREADS": "1"}
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases), vector, policy, str(a.steps)],
                               env=env, capture_output=True, text=True, cwd=tree)
            if p.returncode:
                sys.exit(f"bench_acting: variant {n} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            for c, s in json.loads(p.stdout.strip().splitlines()[-1]).items():
                times[n][c].append(s)
            print(f"round {r}: {n:14s} " + "  ".join(f"{c} {times[n][c][-1] * 1e6:.1f}" for c in cases), flush=True)
    med = {n: {c: statistics.median(v) for c, v in t.items()} for n, t in times.items()}
    first = names[0]
    print(f"\nus per env step, median of {a.rounds} rounds (ratio: {first} / variant):")
    for c in cases:
        print(f"  {c:24s} " + "  ".join(f"{n} {med[n][c] * 1e6:.1f} ({med[first][c] / med[n][c]:.2f}x)" for n in names))
    if a.out is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from result_files import result_path
        a.out = str(result_path("bench_acting", [c.rsplit(":", 1)[0] for c in cases]))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"cases": cases, "variants": {n: list(v) for n, v in variants.items()},
                                       "rounds": a.rounds, "steps": a.steps, "s_per_env_step_rounds": times,
                                       "median_s_per_env_step": med, "date": time.strftime("%Y-%m-%d"),
                                       "command": "python " + " ".join(sys.argv)}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
