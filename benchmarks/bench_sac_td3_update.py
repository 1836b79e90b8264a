#!/usr/bin/env python
# Usage: PYTHONPATH=. python benchmarks/bench_sac_td3_update.py [dqn] [ddpg] [td3] [sac] [--threads 1]
#        [--net-arch 400,300] [--activation relu] [--layer-norm] [--kernels public,compiled] [--gemm mkl|openblas]
#        [--rounds 5] [--group K]
"""One update of DQN (CartPole-v1 preset, batch 64) / DDPG / TD3 / SAC (Pendulum-v1 presets, batch 256): ms/update
of each learner kernel, alternating in one process, and the achieved GFLOP/s against this CPU's single-thread
matmul measured in the same run. A call learns K updates at once, K as a run groups them (the preset's gradient
steps per learner call: DQN's 128, one for the others; `--group` sets it); ms/update is a call's time over K.

Kernels: `public` (the algorithm's own learn: autograd + fused Adam), `compiled` (hetrl/kernels/compiled/: the
composed numba kernel). Each runs its own copy of the algorithm from the same initial state, at the learner's
threads as a run sets them (the compiled kernel: lanes, torch on one thread), its products on `--gemm`, else the
one the probe picks (HETRL_SGEMM pins).

The peak: the fastest single-thread product of torch.mm and of the compiled kernel's GEMM (called from numba, as
a lane calls it) over the widest layer's shape and square shapes up to 1024. The FLOPs of an update are the matrix
products the torch profiler counts on the public path (the compiled kernels do the same ones). As in a run:
denormals flushed, a fresh batch per update (a pool of 32, cycled)."""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels.compiled import CompiledKernel, sgemm
from hetrl.runtime.layout import grads_per_phase, group_size

ap = argparse.ArgumentParser()
ap.add_argument("algos", nargs="*", default=["ddpg", "td3", "sac"])
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--calls", type=int, default=40, help="updates per timed round")
ap.add_argument("--net-arch", default="", help="e.g. 400,300 (default: the preset's)")
ap.add_argument("--activation", default="relu")
ap.add_argument("--layer-norm", action="store_true")
ap.add_argument("--kernels", default="public,compiled")
ap.add_argument("--gemm", default=None, choices=["mkl", "openblas"])
ap.add_argument("--group", type=int, default=0, help="updates per learner call (default: as a run groups them)")
ap.add_argument("--out", default=None, help="the JSON file for the figures (default: benchmarks/results/"
                                            "bench_sac_td3_update_<algos>_<date>_<machine>_<commit>.json)")
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.set_flush_denormal(True)
ENVS = {"dqn": ("CartPole-v1", gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2))}
PENDULUM = ("Pendulum-v1", gym.spaces.Box(-8, 8, (3,)), gym.spaces.Box(-2, 2, (1,)))
gemm_name = sgemm.bind(args.gemm)


def batch(K, B, obs_s, act_s):
    d = obs_s.shape[0]
    action = (torch.randint(0, int(act_s.n), (K, B)) if isinstance(act_s, gym.spaces.Discrete)
              else torch.rand(K, B, *act_s.shape) * 2 - 1)
    return {"obs": torch.randn(K, B, d), "action": action, "reward": torch.randn(K, B),
            "next_obs": torch.randn(K, B, d), "terminated": torch.zeros(K, B, dtype=torch.bool),
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
    """GFLOP/s of (m, k) x (k, n) products on one thread: torch.mm, and the compiled kernel's GEMM from numba."""
    import numba
    from threadpoolctl import threadpool_limits

    @numba.njit(nogil=True)
    def dot(a, b, out, reps):
        for _ in range(reps):
            sgemm.dot(a, b, out)

    z = np.zeros((2, 2), np.float32)
    dot(z, z, z.copy(), 1)
    got: dict[str, dict[tuple, float]] = {"torch.mm": {}, gemm_name: {}}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # (torch.mm's own threads; threadpoolctl holds the BLAS libraries it sees)
    with threadpool_limits(1, user_api="blas"):
        for m, k, n in shapes:
            reps = max(2, int(reps_flop // (m * k * n)))
            a, b = torch.randn(m, k), torch.randn(k, n)
            an, bn, out = a.numpy(), b.numpy(), np.empty((m, n), np.float32)
            for name, s in (("torch.mm", _best(lambda: torch.mm(a, b), reps)),
                            (gemm_name, _best(lambda: dot(an, bn, out, reps), 1) / reps)):
                got[name][(m, k, n)] = 2 * m * k * n / s / 1e9
    torch.set_num_threads(threads)
    return got


class Public:
    def __init__(self, algo):
        self.algo = algo

    def use_threads(self, n):
        torch.set_num_threads(n)

    def learn(self, b, w):
        return self.algo.learn(b, w)


def cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")


results = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu(), "threads": args.threads, "gemm": gemm_name,
           "command": "python benchmarks/bench_sac_td3_update.py " + " ".join(sys.argv[1:]), "algos": {}}
for algo_name in args.algos:
    settings = {"threads": args.threads, "activation": args.activation, "layer_norm": args.layer_norm}
    if args.net_arch:
        settings["net_arch"] = [int(x) for x in args.net_arch.split(",")]
    env_id, obs_s, act_s = ENVS.get(algo_name, PENDULUM)
    cfg = make_config(algo_name, env_id, settings)
    h = cfg.net_arch
    shape = (cfg.batch_size, h[0], h[-1])
    peaks = peak([shape, (256, 256, 256), (512, 512, 512), (1024, 1024, 1024)])
    at_shape = {name: g[shape] for name, g in peaks.items()}
    mm_peak = max(max(g.values()) for g in peaks.values())
    best_of = max(((name, s) for name, g in peaks.items() for s in g), key=lambda t: peaks[t[0]][t[1]])
    torch.manual_seed(0)
    first = make_algorithm(cfg, obs_s, act_s)
    kernels = {}
    for name in args.kernels.split(","):
        algo = make_algorithm(cfg, obs_s, act_s)
        algo.load_state_dict(first.state_dict())
        try:
            kernels[name] = {"public": Public, "compiled": CompiledKernel}[name](algo)
        except (ValueError, ImportError) as e:
            print(f"  {name}: skipped ({e})")
    K = args.group or group_size(grads_per_phase(cfg), cfg.prioritized, cfg.priority_lag)
    calls = max(2, -(-args.calls // K))   # learner calls per timed round: at least --calls updates
    pool, w = [batch(1, cfg.batch_size, obs_s, act_s) for _ in range(32)], torch.ones(1, cfg.batch_size)
    pool_k = [batch(K, cfg.batch_size, obs_s, act_s) for _ in range(max(2, 32 // K))]
    w_k = torch.ones(K, cfg.batch_size)
    it = iter(range(1 << 62))

    def nxt():
        return pool[next(it) % len(pool)]

    def nxt_k():
        return pool_k[next(it) % len(pool_k)]

    kernels.get("public", Public(first)).use_threads(args.threads)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(20):
            first.learn(nxt(), w)
    flops = sum(e.flops for e in prof.key_averages()) / 20
    times = {k: [] for k in kernels}
    for name, k in kernels.items():
        k.use_threads(args.threads)   # each sets its own (the compiled ones: lanes, torch on one thread)
        for _ in range(max(2, 20 // K)):
            k.learn(nxt_k(), w_k)
    for r in range(args.rounds):
        for name, k in (kernels.items() if r % 2 == 0 else list(kernels.items())[::-1]):   # alternating
            k.use_threads(args.threads)
            t = time.perf_counter()
            for _ in range(calls):
                k.learn(nxt_k(), w_k)
            times[name].append((time.perf_counter() - t) / (calls * K))
    print(f"{algo_name} net_arch={h} {args.activation}{' layer_norm' if args.layer_norm else ''} batch "
          f"{cfg.batch_size}, {K} update(s) per call, {args.threads} thread(s): {flops / 1e9:.3f} GFLOP/update; "
          f"matmul {shape} "
          + ", ".join(f"{n} {g:.1f}" for n, g in at_shape.items()) + f" GFLOP/s; single-thread peak {mm_peak:.1f} "
          f"({best_of[0]} {best_of[1]}); the compiled kernels' GEMM: {sgemm.report()}")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    rec = {"net_arch": h, "activation": args.activation, "layer_norm": args.layer_norm, "gflop_per_update": flops / 1e9,
           "updates_per_call": K, "peak_gflops": mm_peak, "peak_of": [best_of[0], list(best_of[1])],
           "ms_per_update": {}, "rounds_ms": {}}
    for name, s in med.items():
        g = flops / 1e9 / s
        print(f"  {name:12s} {s * 1e3:6.2f} ms/update (median of {len(times[name])} x {calls * K})  "
              f"{g:5.1f} GFLOP/s = {g / mm_peak * 100:3.0f}% of the peak")
        rec["ms_per_update"][name] = s * 1e3
        rec["rounds_ms"][name] = [t * 1e3 for t in times[name]]
    results["algos"][algo_name] = rec
    for k in kernels.values():
        if hasattr(k, "close"):
            k.close()
if args.out is None:
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    args.out = str(result_path("bench_sac_td3_update", args.algos))
if args.out:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
