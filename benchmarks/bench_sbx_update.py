#!/usr/bin/env python
"""One SAC / TD3 update (the env's preset, batch 256): SBX's jitted `train(gradient_steps=1)`, replay
sampling included, against hetrl's learner (`algo.learn` on one batch, the kernel given, no sampling).

Usage:
    python benchmarks/bench_sbx_update.py [--algo sac] [--env HalfCheetah-v5] [--rounds 3] [--updates 300]
           [--threads 2] [--kernel compiled|public]

Each side runs in its own subprocess (JAX and torch/numba keep their thread pools to themselves), in
alternating order, `--rounds` times; each prints ms per update over `--updates` calls after a warm-up.
hetrl runs its learner on `--threads` threads (the compiled phase: lanes of rows, as the inline plan);
XLA uses the machine's cores as SBX does by default. Needs `pip install sbx-rl stable-baselines3`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
side, algo, env, n, threads, kernel = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
sys.path.insert(0, __BENCH_DIR__)
from hetrl.config import make_config
cfg = make_config(algo, env, {"learning_starts": 1000, "learner_kernel": kernel})
if side == "sbx":
    from sb3_preset import sb3_model
    model = sb3_model(cfg, env, lib="sbx", device="cpu")
    model.learn(2000)                       # fills the replay, compiles the update
    step = lambda: model.train(gradient_steps=1, batch_size=cfg.batch_size)
else:
    import gymnasium as gym
    from hetrl import kernels
    from hetrl.algos import make_algorithm, replay_spec
    e = gym.make(env)
    learner = kernels.build(kernels.Choice(name=kernel), make_algorithm(cfg, e.observation_space, e.action_space, "cpu"))
    learner.use_threads(threads)
    batch, wts = kernels.synthetic_batch(replay_spec(cfg, e.observation_space, e.action_space), e.action_space,
                                         cfg.batch_size, 1, "cpu")
    step = lambda: learner.learn(batch, wts)
for _ in range(30):
    step()
t = time.perf_counter()
for _ in range(n):
    step()
print(json.dumps({"ms_per_update": (time.perf_counter() - t) / n * 1e3}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", default="sac", choices=["sac", "td3"])
    ap.add_argument("--env", default="HalfCheetah-v5")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernel", default="compiled", choices=["compiled", "public"])
    args = ap.parse_args()
    code = CHILD.replace("__BENCH_DIR__", repr(str(HERE)))
    got: dict[str, list[float]] = {"sbx": [], "hetrl": []}
    for r in range(args.rounds):
        for side in (("sbx", "hetrl") if r % 2 == 0 else ("hetrl", "sbx")):
            out = subprocess.run([sys.executable, "-c", code, side, args.algo, args.env, str(args.updates),
                                  str(args.threads), args.kernel], capture_output=True, text=True, check=True)
            ms = json.loads(out.stdout.strip().splitlines()[-1])["ms_per_update"]
            got[side].append(ms)
            print(f"round {r} {side:>5}: {ms:.2f} ms/update", flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"{args.algo} {args.env}: SBX {med['sbx']:.2f} ms (sampling included), hetrl {args.kernel} "
          f"{med['hetrl']:.2f} ms on {args.threads} threads: hetrl / SBX time {med['hetrl'] / med['sbx']:.2f}")


if __name__ == "__main__":
    main()
