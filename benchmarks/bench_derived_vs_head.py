#!/usr/bin/env python
"""The compiled kernel's two phases for a built-in: its hand-derived loss head against the phase derived from the
algorithm's own learn (hetrl/kernels/compiled/derived.py), time per update at the env's preset shapes, alternating
rounds in one process (hetrl.kernels.select.time_kernels), one thread each; and the derived phase's first compile
(trace, lowering, the VM loaded from numba's cache).

Usage (the GEMM is bound once per process: run once per GEMM):
    HETRL_SGEMM=mkl python benchmarks/bench_derived_vs_head.py [--algos dqn,ddpg,td3,sac,crossq] [--budget 6]
"""
from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import torch

from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels import synthetic_batch
from hetrl.kernels.compiled import CompiledKernel, sgemm
from hetrl.kernels.select import time_kernels

ENVS = {"dqn": "CartPole-v1", "ddpg": "Pendulum-v1", "td3": "Pendulum-v1", "sac": "Pendulum-v1",
        "crossq": "Pendulum-v1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", default="dqn,ddpg,td3,sac,crossq")
    ap.add_argument("--budget", type=float, default=6.0, help="seconds of timed rounds per algorithm")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for name in a.algos.split(","):
        env = gym.make(ENVS[name])
        spaces = (env.observation_space, env.action_space)
        cfg = make_config(name, ENVS[name], {})
        torch.manual_seed(0)
        algos = [make_algorithm(cfg, *spaces) for _ in range(2)]
        K = max(int(algos[0].graph_period()), int(getattr(cfg, "gradient_steps", 1) or 1))
        K = -(-K // algos[0].graph_period()) * algos[0].graph_period()
        b, w = synthetic_batch(type(algos[0]).replay_fields(*spaces), spaces[1], cfg.batch_size, K, "cpu",
                               torch.Generator().manual_seed(0))
        kernels = {"head": CompiledKernel(algos[0], path="head"), "derived": CompiledKernel(algos[1], path="derived")}
        kernels["derived"].learn(b, w)        # the first phase makes the optimizers' state (public learn)
        t0 = time.perf_counter()
        kernels["derived"].learn(b, w)        # traced, lowered, run
        first = time.perf_counter() - t0
        s = time_kernels(kernels, b, w, rounds=9, budget_s=a.budget)
        for k in kernels.values():
            k.close()
        print(json.dumps({"algo": name, "env": ENVS[name], "gemm": sgemm.chosen(), "K": K, "B": cfg.batch_size,
                          "threads": a.threads, "head_ms": round(s["head"] * 1e3, 3),
                          "derived_ms": round(s["derived"] * 1e3, 3), "derived_over_head": round(s["head"] / s["derived"], 3),
                          "first_compile_s": round(first, 1)}), flush=True)


if __name__ == "__main__":
    main()
