"""hetrl vs Stable-Baselines3 on the same presets, alternating in one run.

    python benchmarks/bench_sb3.py [--rounds 3] [--dqn-steps 20000] [--ddpg-steps 12000]

Both libraries train with the rl-zoo preset (hetrl/presets.yaml); each round runs hetrl then
SB3 (then the order flips) in fresh subprocesses, so both see the same machine load.
Prints env steps/s of each, the ratio (median over rounds), and writes
benchmarks/results/bench_sb3.json. Needs `pip install stable-baselines3` (make bench).
Compare ratios, not absolute figures: the machines here are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
algo, env, steps, lib, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
from hetrl.config import make_config
cfg = make_config(algo, env, {"steps": steps, **extra})
if lib == "hetrl":
    import hetrl
    t = time.perf_counter()
    run = hetrl.train(algo, env, progress=False, evaluate_episodes=0, **{k: v for k, v in cfg.to_dict().items() if k not in ("algo", "env")})
    wall = time.perf_counter() - t
    print(json.dumps({"wall_s": wall, "env_steps": run.result["env_steps"], "gradient_steps": run.result["gradient_steps"],
                      "train_samples_per_s": run.result["train_samples_per_s"]}))
else:
    sys.path.insert(0, __BENCH_DIR__)
    from sb3_preset import sb3_model
    model = sb3_model(cfg, env)
    t = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - t
    print(json.dumps({"wall_s": wall, "env_steps": model.num_timesteps, "gradient_steps": model._n_updates}))
""".replace("__BENCH_DIR__", repr(str(HERE)))


def run_one(algo: str, env: str, steps: int, lib: str, extra: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, algo, env, str(steps), lib, json.dumps(extra)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{lib} {algo} {env} failed:\n{p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["env_steps_per_s"] = r["env_steps"] / r["wall_s"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dqn-steps", type=int, default=20_000)
    ap.add_argument("--ddpg-steps", type=int, default=12_000)
    ap.add_argument("--ddpg-learning-starts", type=int, default=2_000,
                    help="shorter warm-up than the preset's 10k so the timed part is mostly learning")
    ap.add_argument("--only", choices=["dqn", "ddpg"])
    args = ap.parse_args()
    cases = [("dqn", "CartPole-v1", args.dqn_steps, {}),
             ("ddpg", "Pendulum-v1", args.ddpg_steps, {"learning_starts": args.ddpg_learning_starts})]
    report = {"machine": {"python": sys.version.split()[0]}, "cases": []}
    for algo, env, steps, extra in cases:
        if args.only and algo != args.only:
            continue
        rows = {"hetrl": [], "sb3": []}
        for r in range(args.rounds):
            order = ["hetrl", "sb3"] if r % 2 == 0 else ["sb3", "hetrl"]
            for lib in order:
                res = run_one(algo, env, steps, lib, extra)
                rows[lib].append(res)
                print(f"{algo} {env} round {r} {lib:>5}: {res['env_steps_per_s']:8.0f} env steps/s "
                      f"({res['wall_s']:.1f} s)", flush=True)
        med = {lib: statistics.median(x["env_steps_per_s"] for x in rows[lib]) for lib in rows}
        ratio = med["hetrl"] / med["sb3"]
        print(f"==> {algo} {env}: hetrl {med['hetrl']:.0f} vs SB3 {med['sb3']:.0f} env steps/s: {ratio:.2f}x")
        report["cases"].append({"algo": algo, "env": env, "steps": steps, "extra": extra, "runs": rows,
                                "median_env_steps_per_s": med, "ratio": ratio})
    out = HERE / "results" / "bench_sb3.json"
    out.parent.mkdir(exist_ok=True)
    report["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
