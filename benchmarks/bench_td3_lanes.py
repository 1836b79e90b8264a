#!/usr/bin/env python
"""TD3's compiled kernel on two lanes: a lane per critic (each on the whole batch) against the batch's rows split
over both critics (`CompiledKernel(algo, critic_lanes=False)`), alternating in one process.

Usage:
    python benchmarks/bench_td3_lanes.py [--rounds 5] [--calls 400]

One `learn()` of the Pendulum-v1 preset (batch 256, 400x300) per call, after 20 warm-up calls per round;
prints ms per call of each split per round and the medians (docs/compiled.md, "Threads: lanes")."""
import argparse
import statistics
import time

import gymnasium as gym
import torch

from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels.compiled import CompiledKernel

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--calls", type=int, default=400)
args = ap.parse_args()
torch.manual_seed(0)
algo = make_algorithm(make_config("td3", "Pendulum-v1", {}), gym.spaces.Box(-8, 8, (3,)), gym.spaces.Box(-2, 2, (1,)))
kernels = {split: CompiledKernel(algo, critic_lanes=split == "critics") for split in ("critics", "rows")}
for k in kernels.values():
    k.use_threads(2)
B = algo.cfg.batch_size


def batch():
    return {"obs": torch.randn(1, B, 3), "action": torch.rand(1, B, 1) * 2 - 1, "reward": torch.randn(1, B),
            "next_obs": torch.randn(1, B, 3), "terminated": torch.zeros(1, B, dtype=torch.bool),
            "truncated": torch.zeros(1, B, dtype=torch.bool), "steps": torch.ones(1, B, dtype=torch.uint8)}


batches, w = [batch() for _ in range(8)], torch.ones(1, B)
times = {"critics": [], "rows": []}
for _ in range(args.rounds):
    for split in times:
        k = kernels[split]
        for i in range(20):
            k.learn(batches[i % 8], w)
        t = time.perf_counter()
        for i in range(args.calls):
            k.learn(batches[i % 8], w)
        times[split].append((time.perf_counter() - t) / args.calls * 1e3)
        assert k.figures()["lane_split"] == split
for split, v in times.items():
    print(f"a lane per {'critic' if split == 'critics' else 'row span'}: " + " / ".join(f"{x:.2f}" for x in v)
          + f" ms per update, median {statistics.median(v):.2f}")
