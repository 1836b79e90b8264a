"""The SB3-style classes: what the class API costs, and an SB3 script against itself with only its import changed.

    python benchmarks/bench_sb3_api.py [--rounds 1] [--cases dqn:CartPole-v1:50000,sac:Pendulum-v1:20000]
    python benchmarks/bench_sb3_api.py --script [--rounds 1] [--steps 100000]

Cases (the default): each case runs the rl-zoo entry's arguments (the zoo's values, SB3's defaults for the rest)
through the class (`SAC("MlpPolicy", env, **args).learn(steps)`) and the same settings through `hetrl.train` (the
class's `model.hetrl_settings`), both with plan="none" and the same seed, in fresh subprocesses, alternating which
goes first from round to round. Prints the env steps/s of each (over learn() / train(), the Run built inside
included) and their ratio; writes benchmarks/results/bench_sb3_api_<cases>_<date>_<machine>_<commit>.json.
The class API should add no measurable cost (its hook only counts the phases when no callback is given).

--script: SCRIPT below, a user's SB3 script (PPO on CartPole-v1 with rl-zoo's preset: 8 envs of SB3's own
`make_vec_env`, n_steps 32, batch 256, 20 epochs, gae 0.8, gamma 0.98, linear lr 1e-3 and clip 0.2, as SB3's
docs write a linear schedule), run as it is with `from stable_baselines3 import PPO` and with `from hetrl import
PPO` (the only difference), in fresh subprocesses, alternating which goes first from round to round (round r uses
seed r on both), after one short untimed hetrl run (hetrl profiles a machine for a workload once and caches it;
--no-warmup leaves it out). Each prints the wall time of its constructor + learn() (hetrl's planning included), the
env steps/s over it, and its evaluation at the end (SB3's evaluate_policy, 20 deterministic episodes on a new env);
the hetrl side also what it ran on (learner kernel, schedule, envs). Writes
benchmarks/results/bench_sb3_api_sb3-script+ppo-cartpole_<date>_<machine>_<commit>.json.

The machines here are shared: compare the ratios, and rerun on a quiet machine.
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


# A user's SB3 script: rl-zoo's PPO CartPole-v1 preset (hyperparams/ppo.yml) as SB3's docs write it. The bench
# runs it with IMPORT replaced by either library's line, the only difference; SEED and STEPS are filled in.
SCRIPT = r"""
import time
from typing import Callable

IMPORT
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy


def linear_schedule(initial_value: float) -> Callable[[float], float]:
    def func(progress_remaining: float) -> float:
        return progress_remaining * initial_value

    return func


start = time.perf_counter()
vec_env = make_vec_env("CartPole-v1", n_envs=8, seed=SEED)
model = PPO("MlpPolicy", vec_env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
            ent_coef=0.0, learning_rate=linear_schedule(1e-3), clip_range=linear_schedule(0.2), seed=SEED)
model.learn(total_timesteps=STEPS)
train_seconds = time.perf_counter() - start

eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=SEED + 1000)
mean_reward, std_reward = evaluate_policy(model, eval_env, n_eval_episodes=20, deterministic=True)
print(f"mean_reward={mean_reward:.2f} +/- {std_reward:.2f}")
"""
IMPORTS = {"sb3": "from stable_baselines3 import PPO", "hetrl": "from hetrl import PPO"}
# after the script, in the same process: its figures, and what hetrl ran it on
REPORT = r"""
import json as _json
_run = getattr(model, "run", None)
_res = _run.result if _run is not None else {}
_cfg = _res.get("config", {})
print(_json.dumps({"seconds": train_seconds, "env_steps": int(model.num_timesteps),
                   "env_steps_per_s": model.num_timesteps / train_seconds, "eval_mean": float(mean_reward),
                   "eval_std": float(std_reward),
                   "hetrl": None if _run is None else {
                       **{k: _res.get(k) for k in ("learner_kernel", "schedule", "num_envs", "wall_s", "acting_s",
                                                   "learner_busy_s")},
                       **{k: _cfg.get(k) for k in ("actors", "envs_per_actor", "env_backend", "threads")}}}))
"""


def script_text(lib: str, seed: int, steps: int) -> str:
    """SCRIPT with `lib`'s import line, the seed and the budget."""
    return SCRIPT.replace("IMPORT", IMPORTS[lib]).replace("SEED", str(seed)).replace("STEPS", f"{steps:_}")


def run_script(a, out: dict) -> None:
    case, runs = f"ppo:CartPole-v1:{a.steps}", []
    if not a.no_warmup:   # hetrl profiles the machine for a new workload once (cached): not in the timed runs
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", script_text("hetrl", 0, 2048) + REPORT], capture_output=True, check=True)
        out["warmup_seconds"] = time.perf_counter() - t
        print(f"hetrl warm-up (the machine's profile for this workload, cached): {out['warmup_seconds']:.1f} s",
              flush=True)
    for r in range(a.rounds):
        for lib in (["hetrl", "sb3"] if r % 2 == 0 else ["sb3", "hetrl"]):
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", script_text(lib, r, a.steps) + REPORT], capture_output=True,
                               text=True)
            wall = time.perf_counter() - t
            if p.returncode != 0:
                sys.exit(f"{lib} round {r} failed:\n{p.stderr[-3000:]}")
            res = {"lib": lib, "round": r, "seed": r, **json.loads(p.stdout.strip().splitlines()[-1]),
                   "process_seconds": wall}
            runs.append(res)
            print(f"{lib:>5} round {r}: {res['env_steps_per_s']:8.1f} env steps/s ({res['seconds']:.1f} s constructor + "
                  f"learn, {wall:.1f} s in all), eval {res['eval_mean']:.1f} +/- {res['eval_std']:.1f}"
                  + (f"; {res['hetrl']}" if res.get("hetrl") else ""), flush=True)
    sec = {lib: sum(x["seconds"] for x in runs if x["lib"] == lib) for lib in IMPORTS}
    ratio = sec["sb3"] / sec["hetrl"]
    print(f"PPO CartPole-v1 {a.steps} steps, the same script: hetrl / SB3 speed (constructor + learn) = {ratio:.2f}x")
    out["cases"].append({"case": case, "script": SCRIPT, "imports": IMPORTS, "runs": runs,
                         "hetrl_over_sb3_speed": ratio})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cases", default="dqn:CartPole-v1:50000,sac:Pendulum-v1:20000")
    ap.add_argument("--script", action="store_true", help="SB3's PPO script with either import, against each other")
    ap.add_argument("--steps", type=int, default=100_000, help="--script: total_timesteps")
    ap.add_argument("--no-warmup", action="store_true", help="--script: no untimed hetrl run first (the first "
                    "run of a workload on a machine profiles it, once)")
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    out = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu(), "commit": commit, "cases": [],
           "command": "python " + " ".join(sys.argv), "load_before": _load()}
    if a.script:
        run_script(a, out)
        _write(out, ["sb3-script", f"ppo:CartPole-v1:{a.steps}"])
        return
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
    _write(out, a.cases)


def _write(out: dict, cases) -> None:
    out["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out["load_after"] = _load()
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    path = result_path("bench_sb3_api", cases)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


def _load() -> list[float]:
    """The load averages (1, 5, 15 min): how busy the shared machine was."""
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


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
