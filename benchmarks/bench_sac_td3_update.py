#!/usr/bin/env python
# Usage: PYTHONPATH=. python benchmarks/bench_sac_td3_update.py [ddpg] [td3] [sac] [--threads 1]
"""One update of DDPG / TD3 / SAC (Pendulum presets, batch 256): ms/update of the public (autograd) path
and the compiled phase (hetrl/algos/compiled.py), alternating, and the achieved GFLOP/s of each against
this CPU's single-thread matmul, measured in the same run: torch.mm and the compiled phase's own BLAS (scipy's
OpenBLAS through numba's np.dot), on the widest layer's shape and on square products up to 1024 (the peak: the
fastest of them all). The FLOPs of an update are the matrix products the torch profiler counts on the public path
(the compiled phase does the same ones). As in a run: denormals flushed (hetrl/runtime/core.py), a fresh batch
per update (a pool of 32, cycled).

peak() loads OpenBLAS before limiting it and checks the thread count: numba loads scipy's OpenBLAS on the first
call of a function using np.dot, and `threadpool_limits(1)` limits only the libraries already loaded, so a first
call inside it would run the "single-thread" product on every core (docs/results.md, "The single-thread peak")."""
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
torch.set_flush_denormal(True)
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


def peak(shapes, reps_flop=3e8) -> dict[str, dict[tuple, float]]:
    """GFLOP/s of (m, k) x (k, n) products on one thread: torch.mm, and np.dot in numba on the compiled phase's
    BLAS (as a lane runs it)."""
    import numba
    import numpy as np
    from threadpoolctl import threadpool_info, threadpool_limits

    @numba.njit(nogil=True)
    def dot(a, b, out, reps):
        for _ in range(reps):
            np.dot(a, b, out)

    z = np.zeros((2, 2), np.float32)
    dot(z, z, z.copy(), 1)   # loads scipy's OpenBLAS: threadpool_limits only limits libraries already loaded
    got: dict[str, dict[tuple, float]] = {"torch.mm": {}, "openblas": {}}
    with threadpool_limits(1, user_api="blas"):
        assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas"), threadpool_info()
        for m, k, n in shapes:
            reps = max(2, int(reps_flop // (m * k * n)))
            a, b = torch.randn(m, k), torch.randn(k, n)
            an, bn, out = a.numpy(), b.numpy(), np.empty((m, n), np.float32)
            for name, s in (("torch.mm", _best(lambda: torch.mm(a, b), reps)),
                            ("openblas", _best(lambda: dot(an, bn, out, reps), 1) / reps)):
                got[name][(m, k, n)] = 2 * m * k * n / s / 1e9
    return got


for algo in args.algos:
    cfg = make_config(algo, "Pendulum-v1", {"threads": args.threads})
    h = cfg.net_arch
    shape = (cfg.batch_size, h[0], h[-1])
    peaks = peak([shape, (256, 256, 256), (512, 512, 512), (1024, 1024, 1024)])
    at_shape = {name: g[shape] for name, g in peaks.items()}
    mm_peak = max(max(g.values()) for g in peaks.values())
    best_of = max(((name, s) for name, g in peaks.items() for s in g), key=lambda t: peaks[t[0]][t[1]])
    kernels = {"public": make_algorithm(cfg, obs_s, act_s),
               "compiled": make_algorithm(make_config(algo, "Pendulum-v1", {"threads": args.threads, "compiled": True}),
                                          obs_s, act_s)}
    pool, w = [batch(1, cfg.batch_size) for _ in range(32)], torch.ones(1, cfg.batch_size)
    it = iter(range(1 << 62))

    def nxt():
        return pool[next(it) % len(pool)]

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
            kernels["public"].learn(nxt(), w)
    flops = sum(e.flops for e in prof.key_averages()) / 20
    times = {k: [] for k in kernels}
    for name, a in kernels.items():
        threads(name)
        for _ in range(20):
            a.learn(nxt(), w)
    for _ in range(args.rounds):
        for name, a in kernels.items():   # alternating
            threads(name)
            n = 40
            t = time.perf_counter()
            for _ in range(n):
                a.learn(nxt(), w)
            times[name].append((time.perf_counter() - t) / n)
    print(f"{algo} net_arch={h} batch {cfg.batch_size}, {args.threads} thread(s): {flops / 1e9:.3f} GFLOP/update; "
          f"matmul {shape} " + ", ".join(f"{n} {g:.1f}" for n, g in at_shape.items()) + " GFLOP/s; single-thread peak "
          f"{mm_peak:.1f} ({best_of[0]} {best_of[1]}); all: {peaks}")
    from hetrl.algos import sgemm

    print(f"  the compiled phase's GEMM: {sgemm.report()} (algos/sgemm.py: timed, or HETRL_SGEMM)")
    for name, ts in times.items():
        ms = sorted(ts)[len(ts) // 2] * 1e3
        g = flops / 1e9 / (ms / 1e3)
        print(f"  {name:9s} {ms:6.2f} ms/update (median of {len(ts)} x 40)  {g:5.1f} GFLOP/s = {g / mm_peak * 100:3.0f}% of the peak, "
              f"{g / max(at_shape.values()) * 100:3.0f}% of the faster matmul at {shape}")
