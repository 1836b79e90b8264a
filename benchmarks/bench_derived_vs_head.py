#!/usr/bin/env python
"""The compiled kernel's two phases for a built-in: its hand-derived loss head against the phase derived from the
algorithm's own learn (hetrl/kernels/compiled/derived.py), time per update at the env's preset shapes, alternating
rounds in one process (hetrl.kernels.select.time_kernels), one thread each; and the derived phase's first compile
(trace, lowering, the VM loaded from numba's cache). An algorithm without a head (PPO, A2C) is timed against its
public kernel instead (its own learn in torch), at the phase the learner core gives it (a rollout's minibatches).

Usage (the GEMM is bound once per process: run once per GEMM):
    HETRL_SGEMM=mkl python benchmarks/bench_derived_vs_head.py [--algos dqn,ddpg,td3,sac,crossq,ppo,a2c] [--budget 6]
        [--threads 1] [--cold MB]

--cold MB writes MB megabytes from the calling thread before each phase and times the phases alone: in a run the
learner samples, publishes and acts between phases, so a phase starts on caches other work has filled, where its own
Python bookkeeping and its first reads cost more than back to back.

--runs N [--steps S] times whole runs instead, where users meet the kernels: `hetrl.train(algo, env, steps=S,
seed=0)` under the default plan, one fresh process per run, N pairs alternating the head and the derived phase (the
algorithm's HEADS entry taken out in the derived side's process); each run's learning env steps/s and its median
phase, then the medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import torch

from hetrl.algos import learn_spec, make_algorithm
from hetrl.config import make_config
from hetrl.kernels import synthetic_batch
from hetrl.kernels.compiled import CompiledKernel, sgemm
from hetrl.kernels.compiled.kernel import head_class
from hetrl.kernels.public import PublicKernel
from hetrl.runtime.layout import GROUP_MAX
from hetrl.kernels.select import time_kernels

ENVS = {"dqn": "CartPole-v1", "ddpg": "Pendulum-v1", "td3": "Pendulum-v1", "sac": "Pendulum-v1",
        "crossq": "Pendulum-v1", "ppo": "CartPole-v1", "a2c": "CartPole-v1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", default="dqn,ddpg,td3,sac,crossq,ppo,a2c")
    ap.add_argument("--budget", type=float, default=6.0, help="seconds of timed rounds per algorithm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cold", type=float, default=0.0, help="MB written before each phase (0: back to back)")
    ap.add_argument("--runs", type=int, default=0, help="pairs of whole runs, head and derived (0: phases alone)")
    ap.add_argument("--steps", type=int, default=0, help="env steps per whole run (0: the preset's)")
    ap.add_argument("--run-one", nargs=2, metavar=("ALGO", "PATH"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run_one:
        return run_one(*a.run_one, a.steps)
    if a.runs:
        return whole_runs(a.algos.split(","), a.runs, a.steps)
    for name in a.algos.split(","):
        # each algorithm at the asked threads (time_kernels reads them from torch, which its kernels hold to one)
        torch.set_num_threads(a.threads)
        env = gym.make(ENVS[name])
        spaces = (env.observation_space, env.action_space)
        cfg = make_config(name, ENVS[name], {})
        torch.manual_seed(0)
        algos = [make_algorithm(cfg, *spaces) for _ in range(2)]
        if getattr(type(algos[0]), "storage", "replay") == "rollout":   # a rollout's minibatches per learn call
            mbs = max(1, min(cfg.n_epochs * (cfg.train_freq // cfg.batch_size), GROUP_MAX))
            K = max(1, min(algos[0].phase_group(mbs), mbs))
        else:
            K = max(int(algos[0].graph_period()), int(getattr(cfg, "gradient_steps", 1) or 1))
            K = -(-K // algos[0].graph_period()) * algos[0].graph_period()
        b, w = synthetic_batch(learn_spec(cfg, *spaces), spaces[1], cfg.batch_size, K, "cpu",
                               torch.Generator().manual_seed(0))
        base = "head" if head_class(algos[0]) is not None else "public"
        kernels = {base: CompiledKernel(algos[0], path="head") if base == "head" else PublicKernel(algos[0]),
                   "derived": CompiledKernel(algos[1], path="derived")}
        kernels["derived"].learn(b, w)        # the first phase makes the optimizers' state (public learn)
        t0 = time.perf_counter()
        kernels["derived"].learn(b, w)        # traced, lowered, run
        first = time.perf_counter() - t0
        junk = np.zeros(int(a.cold * (1 << 20)) // 8)

        def evict() -> None:   # (--cold: other work between phases, as in a run)
            np.add(junk, 1.0, out=junk)

        s = time_kernels(kernels, b, w, rounds=9, budget_s=a.budget, before=evict if a.cold > 0 else None)
        for k in kernels.values():
            k.close()
        print(json.dumps({"algo": name, "env": ENVS[name], "gemm": sgemm.chosen(), "K": K, "B": cfg.batch_size,
                          "threads": a.threads, "cold_mb": a.cold, f"{base}_ms": round(s[base] * 1e3, 3),
                          "derived_ms": round(s["derived"] * 1e3, 3),
                          f"derived_over_{base}": round(s[base] / s["derived"], 3),
                          "first_compile_s": round(first, 1)}), flush=True)


def run_one(name: str, path: str, steps: int) -> None:
    """One whole run in this process on the given path of the compiled kernel; one JSON line."""
    import hetrl
    from hetrl.kernels.compiled import kernel

    if path == "derived":
        kernel.HEADS.pop(type(_algo(name)).__name__)
    phases = []
    learn = kernel.CompiledKernel.learn

    def timed(self, b, w):
        t0 = time.perf_counter()
        out = learn(self, b, w)
        phases.append(time.perf_counter() - t0)
        return out
    kernel.CompiledKernel.learn = timed
    with tempfile.TemporaryDirectory() as out:
        r = hetrl.train(name, ENVS[name], steps=steps or None, seed=0, out=out, progress=False).result
    print(json.dumps({"algo": name, "path": r.get("path"), "env_steps_per_s_learning": r["env_steps_per_s_learning"],
                      "phase_median_ms": round(1e3 * statistics.median(phases[10:] or [0.0]), 3),
                      "threads": r.get("threads"), "gemm": r.get("gemm")}), flush=True)


def _algo(name: str):
    env = gym.make(ENVS[name])
    return make_algorithm(make_config(name, ENVS[name], {}), env.observation_space, env.action_space)


def whole_runs(names: list, pairs: int, steps: int) -> None:
    for name in names:
        if head_class(_algo(name)) is None:
            print(f"{name} has no head: --runs compares a built-in's head with its derived phase "
                  f"(those with one: {', '.join(n for n in ENVS if head_class(_algo(n)) is not None)})",
                  file=sys.stderr)
            raise SystemExit(2)
        got: dict[str, list] = {"head": [], "derived": []}
        for r in range(pairs):
            for path in ("head", "derived") if r % 2 == 0 else ("derived", "head"):
                load = open("/proc/loadavg").read().split()[0]
                p = subprocess.run([sys.executable, __file__, "--run-one", name, path, "--steps", str(steps)],
                                   capture_output=True, text=True)
                line = [x for x in p.stdout.splitlines() if x.startswith("{")]
                if not line:
                    raise SystemExit(f"{name} {path} run failed:\n{p.stderr[-2000:]}")
                d = json.loads(line[-1])
                got[path].append(d)
                print(json.dumps({**d, "asked": path, "load": float(load)}), flush=True)
        med = {k: statistics.median(x["env_steps_per_s_learning"] for x in v) for k, v in got.items()}
        print(json.dumps({"algo": name, "pairs": pairs, "steps": steps or "preset",
                          "head_env_steps_per_s": [round(x["env_steps_per_s_learning"], 1) for x in got["head"]],
                          "derived_env_steps_per_s": [round(x["env_steps_per_s_learning"], 1) for x in got["derived"]],
                          "median_head": round(med["head"], 1), "median_derived": round(med["derived"], 1),
                          "derived_over_head": round(med["derived"] / med["head"], 3)}), flush=True)


if __name__ == "__main__":
    main()
