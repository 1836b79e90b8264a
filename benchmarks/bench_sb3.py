"""hetrl vs Stable-Baselines3 (and SBX, SB3 on JAX) on the same presets, alternating in one run.

    python benchmarks/bench_sb3.py [--rounds 3] [--first-round 0] [--libs hetrl,sb3,sbx] [--plan auto|none]
        [--cases dqn:CartPole-v1:50000,ddpg:Pendulum-v1:12000:learning_starts=2000]
    python benchmarks/bench_sb3.py --libs hetrl,sbx --rounds 3 --cases crossq:Pendulum-v1:20000
    python benchmarks/bench_sb3.py --libs hetrl,sb3,sbx --cases ppo:CartPole-v1:100000,ppo:Pendulum-v1:100000
    python benchmarks/bench_sb3.py --libs hetrl,sb3 --cases a2c:CartPole-v1:100000      (SBX has no A2C)

Every library trains with the rl-zoo preset (hetrl/presets.yaml; benchmarks/sb3_preset.py builds the
SB3/SBX model from it); each round runs the libraries in fresh subprocesses, in an order that
rotates from round to round, so all see the same machine load. hetrl runs under the default plan
(`--plan auto`, the planner's profile is made once before the rounds and then cached; its time is
not counted) or `--plan none` (inline, the preset as is). A case is ALGO:ENV:STEPS[:key=value...]
(settings for every library, e.g. a shorter learning_starts). Prints env steps/s of each over the
training (SB3/SBX: `model.learn`; hetrl: result.json's wall_s), the ratios (medians over rounds),
and writes benchmarks/results/bench_sb3.json, with the BLAS kernels each run used (OpenBLAS chooses
them for the CPU when it loads unless OPENBLAS_CORETYPE says otherwise: some machines set it to
Haswell, which leaves hetrl's compiled learner on AVX2 kernels while SBX's XLA and torch's MKL choose
for themselves; run `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_sb3.py ...`
to measure what a machine without that setting runs). Needs `pip install stable-baselines3` (make bench),
`sbx-rl` for SBX (CrossQ: SBX's; as lib sb3, SB3-Contrib's). Compare ratios, not absolute figures: the
machines here are shared and noisy.
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

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
algo, env, steps, lib, extra, plan = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5]), sys.argv[6]
from hetrl.config import make_config
cfg = make_config(algo, env, {"steps": steps, **extra})
if lib == "hetrl":
    import hetrl
    run = hetrl.train(algo, env, steps=steps, plan=plan, progress=False, evaluate_episodes=0, **extra)
    r = run.result
    out = {"wall_s": r["wall_s"], "env_steps": r["env_steps"], "gradient_steps": r["gradient_steps"],
           "schedule": run.cfg.system.schedule, "threads": run.cfg.system.threads, "learner_kernel": r.get("learner_kernel"),
           "gemm": r.get("gemm"), "predicted_env_steps_per_s": r.get("predicted_env_steps_per_s"),
           "env_steps_per_s_learning": r.get("env_steps_per_s_learning")}
else:
    sys.path.insert(0, __BENCH_DIR__)
    from sb3_preset import sb3_model
    from stable_baselines3.common.callbacks import BaseCallback

    class Mark(BaseCallback):  # when learning starts: the learning phase's rate, as hetrl's result.json has it
        t = None

        def _on_step(self):
            if self.t is None and self.num_timesteps >= getattr(cfg, "learning_starts", 0):
                self.t = (time.perf_counter(), self.num_timesteps)
            return True

    model = sb3_model(cfg, env, lib=lib, device="cpu")
    mark = Mark()
    t = time.perf_counter()
    model.learn(total_timesteps=steps, callback=mark)
    end = time.perf_counter()
    wall = end - t
    learning = (model.num_timesteps - mark.t[1]) / (end - mark.t[0]) if mark.t and end > mark.t[0] else None
    out = {"wall_s": wall, "env_steps": model.num_timesteps, "gradient_steps": model._n_updates,
           "env_steps_per_s_learning": learning}
# the BLAS kernels this process ran (OpenBLAS picks them when it loads; OPENBLAS_CORETYPE overrides)
from threadpoolctl import threadpool_info
out["blas"] = sorted({f"{i['internal_api']} {i.get('version')} {i.get('architecture')}" for i in threadpool_info()
                      if i["user_api"] == "blas"})
print(json.dumps(out))
""".replace("__BENCH_DIR__", repr(str(HERE)))


def run_one(algo: str, env: str, steps: int, lib: str, extra: dict, plan: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, algo, env, str(steps), lib, json.dumps(extra), plan],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{lib} {algo} {env} failed:\n{p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["env_steps_per_s"] = r["env_steps"] / r["wall_s"]
    return r


def parse_case(text: str) -> tuple[str, str, int, dict]:
    import yaml

    algo, env, steps, *kv = text.split(":")
    return algo, env, int(steps), {k: yaml.safe_load(v) for k, v in (x.split("=", 1) for x in kv)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--libs", default="hetrl,sb3")
    ap.add_argument("--plan", default="auto", choices=["auto", "none"])
    ap.add_argument("--cases", default="dqn:CartPole-v1:50000,ddpg:Pendulum-v1:12000:learning_starts=2000")
    ap.add_argument("--first-round", type=int, default=0,
                    help="number of the first round (its library order): continue an earlier run's rotation")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/ under the naming scheme")
    args = ap.parse_args()
    libs = args.libs.split(",")
    blas_env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    report = {"machine": {"python": sys.version.split()[0], "blas_env": blas_env}, "plan": args.plan, "libs": libs,
              "cases": [],
              "command": "python " + " ".join(sys.argv)}
    for algo, env, steps, extra in map(parse_case, args.cases.split(",")):
        if "hetrl" in libs and args.plan == "auto":  # the profile once, cached for every round
            subprocess.run([sys.executable, "-m", "hetrl.cli", "plan", algo, "--env", env,
                            *[a for k, v in extra.items() for a in ("--set", f"{k}={v}")]],
                           capture_output=True, text=True)
        rows: dict[str, list] = {lib: [] for lib in libs}
        for r in range(args.first_round, args.first_round + args.rounds):
            order = libs[r % len(libs):] + libs[:r % len(libs)]
            for lib in order:
                res = run_one(algo, env, steps, lib, extra, args.plan)
                rows[lib].append(res)
                learning = res.get("env_steps_per_s_learning")
                print(f"{algo} {env} round {r} {lib:>5}: {res['env_steps_per_s']:8.0f} env steps/s "
                      f"({res['wall_s']:.1f} s)" + (f"; {learning:.0f} while learning" if learning else ""), flush=True)
        med = {lib: statistics.median(x["env_steps_per_s"] for x in rows[lib]) for lib in rows}
        ratios = {f"hetrl/{lib}": med["hetrl"] / med[lib] for lib in libs if lib != "hetrl" and "hetrl" in med}
        print(f"==> {algo} {env}: " + ", ".join(f"{lib} {v:.0f}" for lib, v in med.items()) + " env steps/s"
              + "".join(f"; {k} {v:.2f}x" for k, v in ratios.items()))
        report["cases"].append({"algo": algo, "env": env, "steps": steps, "extra": extra, "runs": rows,
                                "median_env_steps_per_s": med, "ratios": ratios})
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    out = Path(args.out or result_path("bench_sb3", args.cases))
    out.parent.mkdir(exist_ok=True)
    report["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
