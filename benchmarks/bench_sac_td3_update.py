#!/usr/bin/env python
# Usage: PYTHONPATH=. python benchmarks/bench_sac_td3_update.py [ddpg] [td3] [sac] [--threads 1]
"""One update of DDPG / TD3 / SAC (Pendulum presets, batch 256): ms/update of the public (autograd) path
and the compiled phase (hetrl/algos/compiled.py), alternating, and the achieved GFLOP/s of each against
this CPU's fastest single-call matmul on the widest layer's shape, measured in the same run: torch.mm (MKL) and
the compiled phase's own BLAS (scipy's OpenBLAS through numba's np.dot), whichever is faster here (on one Intel
Xeon MKL led, on another OpenBLAS's AVX-512 kernels ran 1.4x MKL's speed). The FLOPs of an update are the
matrix products the torch profiler counts on the public path (the compiled phase does the same ones)."""
import argparse
import time

import gymnasium as gym
import torch
from torch.profiler import ProfilerActivity, profile

from hetrl.algos import compiled, make_algorithm
from hetrl.config import make_config

ap = argparse.ArgumentParser()
ap.add_argument("algos", nargs="*", default=["ddpg", "td3", "sac"])
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--rounds", type=int, default=5)
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
obs_s, act_s = gym.spaces.Box(-8, 8, (3,)), gym.spaces.Box(-2, 2, (1,))


def batch(K, B=256):
    return {"obs": torch.randn(K, B, 3), "action": torch.rand(K, B, 1) * 2 - 1, "reward": torch.randn(K, B),
            "next_obs": torch.randn(K, B, 3), "terminated": torch.zeros(K, B, dtype=torch.bool),
            "truncated": torch.zeros(K, B, dtype=torch.bool), "steps": torch.ones(K, B, dtype=torch.uint8)}


def _best(call, reps):
    for _ in range(20):
        call()
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            call()
        best.append((time.perf_counter() - t) / reps)
    return min(best)


def peak(m, k, n, reps=300) -> dict[str, float]:
    """GFLOP/s of one (m, k) x (k, n) product: torch.mm, and np.dot in numba on the compiled phase's BLAS (one
    thread each, as the lanes run it)."""
    import numba
    import numpy as np

    from threadpoolctl import threadpool_limits

    @numba.njit(nogil=True)
    def dot(a, b, out, reps):
        for _ in range(reps):
            np.dot(a, b, out)

    a, b = torch.randn(m, k), torch.randn(k, n)
    an, bn, out = a.numpy(), b.numpy(), np.empty((m, n), np.float32)
    with threadpool_limits(1, user_api="blas"):
        got = {"torch.mm": _best(lambda: torch.mm(a, b), reps), "openblas": _best(lambda: dot(an, bn, out, reps), 1) / reps}
    return {name: 2 * m * k * n / s / 1e9 for name, s in got.items()}


for algo in args.algos:
    cfg = make_config(algo, "Pendulum-v1", {"threads": args.threads})
    h = cfg.net_arch
    peaks = peak(cfg.batch_size, h[0], h[-1])
    mm_peak = max(peaks.values())
    kernels = {"public": make_algorithm(cfg, obs_s, act_s),
               "compiled": make_algorithm(make_config(algo, "Pendulum-v1", {"threads": args.threads, "compiled": True}),
                                          obs_s, act_s)}
    b, w = batch(1, cfg.batch_size), torch.ones(1, cfg.batch_size)

    def threads(name):
        # as a run sets them: the compiled phase on `threads` lanes with torch on one thread (use_threads), the
        # public path on torch's threads; set before every timing, since each kernel leaves its own
        if name == "compiled":
            compiled.use_threads(kernels[name], args.threads)
        else:
            torch.set_num_threads(args.threads)

    threads("public")
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(20):
            kernels["public"].learn(b, w)
    flops = sum(e.flops for e in prof.key_averages()) / 20
    times = {k: [] for k in kernels}
    for name, a in kernels.items():
        threads(name)
        for _ in range(20):
            a.learn(b, w)
    for _ in range(args.rounds):
        for name, a in kernels.items():   # alternating
            threads(name)
            n = 40
            t = time.perf_counter()
            for _ in range(n):
                a.learn(b, w)
            times[name].append((time.perf_counter() - t) / n)
    print(f"{algo} net_arch={h} batch {cfg.batch_size}, {args.threads} thread(s): {flops / 1e9:.3f} GFLOP/update; "
          f"matmul ({cfg.batch_size},{h[0]},{h[-1]}) " + ", ".join(f"{n} {g:.1f}" for n, g in peaks.items()) + " GFLOP/s")
    for name, ts in times.items():
        ms = sorted(ts)[len(ts) // 2] * 1e3
        g = flops / 1e9 / (ms / 1e3)
        print(f"  {name:9s} {ms:6.2f} ms/update (median of {len(ts)} x 40)  {g:5.1f} GFLOP/s = {g / mm_peak * 100:3.0f}% of the faster matmul")
