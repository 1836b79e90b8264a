"""hetrl against an earlier hetrl (or a setting against another), alternating in one run.

    python benchmarks/bench_versions.py --variant before=/path/to/old/checkout \
        --variant after=.:learner_kernel=compiled --variant public=.:learner_kernel=public [--rounds 2]

Each variant is NAME=CHECKOUT[:key=value,...]: the hetrl source tree to import (PYTHONPATH) and
settings added to the presets. Every round runs each workload under each variant in fresh
subprocesses, the order flipped every other round, so all see the same machine load. Prints
env steps/s per variant and the ratios to the first variant (medians), and writes
benchmarks/results/bench_versions_<workloads>_<date>_<machine>_<commit>.json (or --out). Workloads: DQN
CartPole-v1 (20k steps) and DDPG Pendulum-v1 (4k steps after a 1k warm-up), on one learner thread under the
default plan; or `--cases ALGO:ENV:STEPS[:key=value...],...` (as bench_sb3.py takes them; a list in brackets,
net_arch=[64,64]) with `--threads auto`
to leave the thread count to the plan as well, e.g. the rl-zoo presets before and after a change:

    python benchmarks/bench_versions.py --variant before=/path/to/old --variant after=. --rounds 3 \
        --threads auto --cases dqn:CartPole-v1:50000,td3:Pendulum-v1:20000,sac:Pendulum-v1:20000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = {"dqn-cartpole": ("dqn", "CartPole-v1", {"steps": 20000}),
             "ddpg-pendulum": ("ddpg", "Pendulum-v1", {"steps": 4000, "learning_starts": 1000})}
CHILD = r"""
import json, sys, time
import hetrl
algo, env, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t = time.perf_counter()
run = hetrl.train(algo, env, progress=False, evaluate_episodes=0, eval_episodes=0, **settings)
print(json.dumps({"wall_s": time.perf_counter() - t, "env_steps_per_s": run.result["env_steps_per_s"],
                  "env_steps": run.result["env_steps"], "gradient_steps": run.result["gradient_steps"]}))
"""


def split_list(text: str) -> list[str]:
    """text split at its commas outside brackets: a value may be a JSON list (net_arch=[64,64])."""
    return re.split(r",(?![^\[]*\])", text)


def parse_variant(text: str) -> tuple[str, str, dict]:
    name, _, rest = text.partition("=")
    path, _, sets = rest.partition(":")
    settings = {}
    for pair in filter(None, split_list(sets)):
        k, v = pair.split("=", 1)
        settings[k] = json.loads(v) if v not in ("true", "false") else v == "true"
    return name, str(Path(path).resolve()), settings


def run_one(path: str, algo: str, env: str, settings: dict, name: str = "") -> dict:
    env_vars = {**os.environ, "PYTHONPATH": path}
    if name and "HETRL_CACHE_DIR" in os.environ:   # each version profiles and keeps its choices in its own cache
        env_vars["HETRL_CACHE_DIR"] = os.path.join(os.environ["HETRL_CACHE_DIR"], name)
    p = subprocess.run([sys.executable, "-c", CHILD, algo, env, json.dumps(settings)], capture_output=True,
                       text=True, env=env_vars, cwd=path)
    if p.returncode != 0:
        raise SystemExit(f"{path} {algo} {env} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="NAME=CHECKOUT[:key=value,...]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads")
    ap.add_argument("--cases", default="", help="ALGO:ENV:STEPS[:key=value...],... instead of the workloads")
    ap.add_argument("--threads", default="1", help="the learner's threads, or auto (the plan's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    workloads = dict(WORKLOADS)
    if args.cases:
        workloads = {}
        for case in split_list(args.cases):
            algo, env, steps, *sets = case.split(":")
            extra = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in sets)}
            workloads[f"{algo}-{env}-{steps}"] = (algo, env, {"steps": int(steps), **extra})
        args.only = ",".join(workloads)
    threads = {} if args.threads == "auto" else {"threads": int(args.threads)}
    runs: dict = {w: {v[0]: [] for v in variants} for w in args.only.split(",")}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for w in runs:
            algo, env, base = workloads[w]
            base = {**threads, **base}
            for name, path, settings in order:
                res = run_one(path, algo, env, {**base, **settings}, name)
                runs[w][name].append(res)
                print(f"round {r + 1} {w} {name}: {res['env_steps_per_s']:,.0f} env steps/s", flush=True)
    first = variants[0][0]
    summary = {}
    for w, by in runs.items():
        med = {n: statistics.median(x["env_steps_per_s"] for x in rs) for n, rs in by.items()}
        summary[w] = {"median_env_steps_per_s": med, "ratio_to_" + first: {n: m / med[first] for n, m in med.items()}}
        print(f"{w}: " + ", ".join(f"{n} {m:,.0f} ({m / med[first]:.2f}x)" for n, m in med.items()))
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    out = Path(args.out or result_path("bench_versions", [f"{a}:{e}" for a, e, _ in (workloads[w] for w in runs)]))
    out.write_text(json.dumps({"variants": args.variant, "threads": args.threads, "runs": runs, "summary": summary,
                               "command": "python " + " ".join(sys.argv), "when": time.strftime("%Y-%m-%d %H:%M:%S")},
                              indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
