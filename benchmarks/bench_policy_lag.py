"""The effect of policy lag on learning (issue 12): DQN CartPole-v1 under `--schedule local` with the
default bound (auto) and with parameters published 4x and 16x less often (the bound raised so that
it does not bind), 3 seeds each.

    python benchmarks/bench_policy_lag.py [--seeds 0,1,2] [--steps 50000] [--algo dqn --env CartPole-v1]

Reports per variant: best and final evaluation returns, policy_lag_mean / policy_lag_max (gradient
steps, from result.json) and env steps/s. Runs one after the other in fresh processes; writes
benchmarks/results/bench_policy_lag_<case>_<date>_<machine>_<commit>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = {"auto": [], "publish x4": ["publish_interval=4", "max_policy_lag=100000000"],
            "publish x16": ["publish_interval=16", "max_policy_lag=100000000"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=50000)
    ap.add_argument("--algo", default="dqn")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    args.out = args.out or str(result_path("bench_policy_lag", f"{args.algo}:{args.env}"))
    rows, work = [], Path(tempfile.mkdtemp(prefix="hetrl-lag-"))
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name, sets in VARIANTS.items():
            out = work / f"{name.replace(' ', '')}-s{seed}"
            cmd = [sys.executable, "-m", "hetrl.cli", "train", args.algo, "--env", args.env, "--steps", str(args.steps),
                   "--seed", str(seed), "--schedule", "local", "--plan", "none", "--out", str(out), "--force",
                   "--no-progress"] + [a for s in sets for a in ("--set", s)]
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
            if p.returncode:
                rows.append({"variant": name, "seed": seed, "error": p.stderr.strip().splitlines()[-1]})
            else:
                r = json.loads((out / "result.json").read_text())
                rows.append({"variant": name, "seed": seed, "best": r["eval_return_mean"],
                             "final": r.get("final_eval_return_mean"), "lag_mean": r["policy_lag_mean"],
                             "lag_max": r["policy_lag_max"], "lag_bound": r["policy_lag_bound"],
                             "env_steps_per_s": r["env_steps_per_s"], "command": "hetrl " + " ".join(cmd[3:])})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            Path(args.out).write_text(json.dumps({"argv": sys.argv[1:], "command": "python " + " ".join(sys.argv),
                                                  "runs": rows}, indent=1))
    print(f"{'variant':<12} {'best (mean)':>11} {'final (mean)':>12} {'lag mean':>9} {'lag max':>8} {'steps/s':>8}")
    for name in VARIANTS:
        ok = [r for r in rows if r["variant"] == name and "error" not in r]
        if ok:
            m = lambda k: statistics.mean(r[k] for r in ok)  # noqa: E731
            print(f"{name:<12} {m('best'):>11.1f} {m('final'):>12.1f} {m('lag_mean'):>9.0f} "
                  f"{max(r['lag_max'] for r in ok):>8} {m('env_steps_per_s'):>8.0f}")


if __name__ == "__main__":
    main()
