"""The SB3-style classes against hetrl.train with the same settings: the class API should add no measurable
cost (its hook only counts the phases when no callback is given).

    python benchmarks/bench_sb3_api.py [--rounds 1] [--cases dqn:CartPole-v1:50000,sac:Pendulum-v1:20000]

Each case runs the rl-zoo entry's arguments (the zoo's values, SB3's defaults for the rest) through the class
(`SAC("MlpPolicy", env, **args).learn(steps)`) and the same settings through `hetrl.train` (the class's
`model.hetrl_settings`), both with plan="none" and the same seed, in fresh subprocesses, alternating which
goes first from round to round. Prints the env steps/s of each (over learn() / train(), the Run built
inside included) and their ratio; writes
benchmarks/results/bench_sb3_api_<cases>_<date>_<machine>_<commit>.json. The machines here are shared: compare
the ratio, and rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# the zoo's entries (hyperparams/dqn.yml CartPole-v1, hyperparams/sac.yml Pendulum-v1) as SB3 arguments
ARGS = {
    ("dqn", "CartPole-v1"): dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                                 gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                                 exploration_fraction=0.16, exploration_final_eps=0.04,
                                 policy_kwargs=dict(net_arch=[256, 256])),
    ("sac", "Pendulum-v1"): dict(learning_rate=1e-3),
}

CHILD = r"""
import json, sys, time
algo, env, steps, how, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
import hetrl
from hetrl.sb3 import model_class
cls = model_class(algo)
model = cls("MlpPolicy", env, seed=0, plan="none", device="cpu", **args)
if how == "class":
    t = time.perf_counter(); model.learn(steps); dt = time.perf_counter() - t
    kernel = model.run.result.get("learner_kernel")
else:
    settings = dict(model.hetrl_settings)
    t = time.perf_counter()
    run = hetrl.train(algo, env=env, steps=steps, seed=0, plan="none", progress=False, **settings)
    dt = time.perf_counter() - t
    kernel = run.result.get("learner_kernel")
print(json.dumps({"how": how, "seconds": dt, "env_steps_per_s": steps / dt, "learner_kernel": kernel}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cases", default="dqn:CartPole-v1:50000,sac:Pendulum-v1:20000")
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    out = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu(), "commit": commit, "cases": [],
           "command": "python " + " ".join(sys.argv)}
    for case in a.cases.split(","):
        algo, env, steps = case.split(":")
        args = ARGS.get((algo, env), {})
        runs = []
        for r in range(a.rounds):
            order = ["class", "train"] if r % 2 == 0 else ["train", "class"]
            for how in order:
                p = subprocess.run([sys.executable, "-c", CHILD, algo, env, steps, how, json.dumps(args)],
                                   capture_output=True, text=True, check=True)
                res = json.loads(p.stdout.strip().splitlines()[-1])
                res["round"] = r
                runs.append(res)
                print(f"{algo} {env} {steps} round {r} {how:>5}: {res['env_steps_per_s']:8.1f} env steps/s "
                      f"({res['seconds']:.1f} s, kernel {res['learner_kernel']})", flush=True)
        cls = sum(x["seconds"] for x in runs if x["how"] == "class")
        trn = sum(x["seconds"] for x in runs if x["how"] == "train")
        print(f"{algo} {env}: class / train time = {cls / trn:.3f}")
        out["cases"].append({"case": case, "runs": runs, "class_over_train_time": cls / trn})
    out["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    path = result_path("bench_sb3_api", a.cases)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
