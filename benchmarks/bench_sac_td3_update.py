#!/usr/bin/env python
# Usage: PYTHONPATH=. python benchmarks/bench_sac_td3_update.py [td3] [sac]
"""One update of TD3 / SAC (Pendulum presets, batch 256) on one thread: ms/update, profiler breakdown,
achieved GFLOP/s against a single-thread torch.mm peak."""
import sys, time
import gymnasium as gym
import torch
from torch.profiler import profile, ProfilerActivity
from hetrl.algos import make_algorithm
from hetrl.config import make_config

torch.set_num_threads(1)
torch.manual_seed(0)
obs_s, act_s = gym.spaces.Box(-8, 8, (3,)), gym.spaces.Box(-2, 2, (1,))

def batch(K, B=256):
    return {"obs": torch.randn(K, B, 3), "action": torch.rand(K, B, 1) * 2 - 1, "reward": torch.randn(K, B),
            "next_obs": torch.randn(K, B, 3), "terminated": torch.zeros(K, B, dtype=torch.bool),
            "truncated": torch.zeros(K, B, dtype=torch.bool), "steps": torch.ones(K, B, dtype=torch.uint8)}

def peak(m, k, n, reps=300):
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(20): torch.mm(a, b)
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps): torch.mm(a, b)
        best.append((time.perf_counter() - t) / reps)
    s = min(best)
    return 2 * m * k * n / s / 1e9, s

print("single-thread torch.mm peak (GFLOP/s, best of 5):")
for shape in [(256, 256, 256), (256, 400, 300), (256, 300, 400), (512, 512, 512)]:
    g, s = peak(*shape)
    print(f"  {shape}: {g:.1f} GFLOP/s ({s*1e6:.0f} us)")

for algo in sys.argv[1:] or ["td3", "sac"]:
    cfg = make_config(algo, "Pendulum-v1", {"threads": 1})
    a = make_algorithm(cfg, obs_s, act_s)
    b, w = batch(1), torch.ones(1, 256)
    for _ in range(30): a.learn(b, w)
    times = []
    for _ in range(5):
        n = 60
        t = time.perf_counter()
        for _ in range(n): a.learn(b, w)
        times.append((time.perf_counter() - t) / n)
    ms = min(times) * 1e3
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(20): a.learn(b, w)
    ev = prof.key_averages()
    flops = sum(e.flops for e in ev) / 20
    tot = sum(e.self_cpu_time_total for e in ev)
    mm = sum(e.self_cpu_time_total for e in ev if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul"))
    print(f"\n{algo} net_arch={cfg.net_arch} batch 256: {ms:.2f} ms/update (best of 5 x 60, median {sorted(times)[2]*1e3:.2f}); "
          f"matmul FLOPs/update {flops/1e9:.3f} GFLOP (profiler) -> {flops/1e9/(ms/1e3):.1f} GFLOP/s achieved")
    print(f"  profiler self CPU: matmul (mm/addmm) {mm/tot*100:.0f}% of {tot/20/1e3:.2f} ms/update (profiled, with overhead)")
    print(ev.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=38))
