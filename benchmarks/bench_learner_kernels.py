#!/usr/bin/env python
"""The DQN learner's time per update on the CPU: hetrl's public kernel (the algorithm's learn: autograd + fused
Adam), its compiled kernel (hetrl/kernels/compiled/, numba), and a JAX reference of the same phase
(`jax.lax.scan` over the K updates, optax Adam + global-norm clip, XLA on one thread).

Usage:
    python benchmarks/bench_learner_kernels.py [--env CartPole-v1] [--rounds 3] [--phases 8] [--threads 1]
           [--net-arch 256,256] [--activation relu] [--layer-norm] [--gemm mkl|openblas]
           [--kernels public,compiled,jax] [--out benchmarks/results/learner_kernels.json]

Every kernel runs the same workload: the env's DQN preset (CartPole-v1: batch 64, 256x256, 128
gradient steps per phase, Huber loss, max_grad_norm 10, Adam), phases of K updates on synthetic
batches, the phase's targets from one batched forward of the fixed target network (as hetrl does;
the JAX phase computes them inside the compiled program). Each kernel runs in its own subprocess,
in alternating order, `--rounds` times; the figure is the median of the rounds' best phase. With `--threads n`
the compiled kernels split each step's rows over n lanes (torch on one thread, as a run sets them) and the
public kernel runs torch on n threads; JAX stays on one. Both compiled kernels multiply on the same GEMM
(`--gemm`, else the one the probe picks in the parent process). JAX is optional (`pip install jax optax` only
for this benchmark): without it that row is skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def threads_env(n: int) -> dict:
    return {"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n), "OPENBLAS_NUM_THREADS": str(n),
            "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", "NPROC": str(n)}


def settings(a) -> dict:
    out = {"activation": a.activation, "layer_norm": a.layer_norm}
    if a.net_arch:
        out["net_arch"] = [int(x) for x in a.net_arch.split(",")]
    return out


def shapes(env: str, over: dict | None = None):
    import gymnasium as gym

    from hetrl.actors import probe_spaces
    from hetrl.config import make_config
    from hetrl.runtime.layout import grads_per_phase

    cfg = make_config("dqn", env, over or {})
    obs_space, act_space = probe_spaces(env)
    K = max(1, int(grads_per_phase(cfg)))
    assert isinstance(act_space, gym.spaces.Discrete)
    return cfg, int(obs_space.shape[0]), int(act_space.n), K


def run_torch(kernel: str, env: str, phases: int, over: dict, threads: int, gemm: str) -> list[float]:
    import gymnasium as gym
    import torch

    from hetrl.algos import make_algorithm

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    cfg, D, A, K = shapes(env, over)
    torch.manual_seed(0)
    algo = make_algorithm(cfg, gym.spaces.Box(-5, 5, (D,)), gym.spaces.Discrete(A))
    learn = algo.learn
    if kernel == "compiled":
        from hetrl.kernels.compiled import CompiledKernel

        k = CompiledKernel(algo, gemm=gemm)
        k.use_threads(threads)
        learn = k.learn
    B = cfg.batch_size
    g = torch.Generator().manual_seed(0)
    batch = {"obs": torch.randn(K, B, D, generator=g), "action": torch.randint(0, A, (K, B), generator=g),
             "reward": torch.randn(K, B, generator=g), "next_obs": torch.randn(K, B, D, generator=g),
             "terminated": torch.rand(K, B, generator=g) < 0.05, "truncated": torch.zeros(K, B, dtype=torch.bool),
             "steps": torch.ones(K, B, dtype=torch.uint8)}
    w = torch.ones(K, B)
    learn(batch, w)
    out = []
    for _ in range(phases):
        t = time.perf_counter()
        learn(batch, w)
        out.append((time.perf_counter() - t) / K)
    return out


def run_jax(env: str, phases: int, over: dict) -> list[float]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    cfg, D, A, K = shapes(env, over)
    if cfg.activation != "relu" or cfg.layer_norm:
        raise SystemExit("the JAX reference is written for ReLU networks without LayerNorm")
    B, sizes = cfg.batch_size, [D, *cfg.net_arch, A]

    def init(key):
        params = []
        for i, o in zip(sizes[:-1], sizes[1:]):
            key, k1, k2 = jax.random.split(key, 3)
            bound = 1 / np.sqrt(i)
            params.append((jax.random.uniform(k1, (i, o), minval=-bound, maxval=bound),
                           jax.random.uniform(k2, (o,), minval=-bound, maxval=bound)))
        return params

    def q(params, x):
        for W, b in params[:-1]:
            x = jax.nn.relu(x @ W + b)
        W, b = params[-1]
        return x @ W + b

    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr))

    def loss(params, obs, action, target, w):
        qa = jnp.take_along_axis(q(params, obs), action[:, None], axis=1)[:, 0]
        return jnp.mean(w * optax.huber_loss(qa, target, delta=1.0)), qa - target

    @jax.jit
    def phase(params, opt_state, target_params, obs, action, reward, next_obs, terminated, w):
        next_v = q(target_params, next_obs).max(-1)            # (K, B): the fixed target net, one pass
        targets = reward + cfg.gamma * (1.0 - terminated) * next_v

        def step(carry, xs):
            p, s = carry
            o, a, t, wk = xs
            (_, td), grads = jax.value_and_grad(loss, has_aux=True)(p, o, a, t, wk)
            updates, s = tx.update(grads, s, p)
            return (optax.apply_updates(p, updates), s), jnp.abs(td)

        (params, opt_state), td = jax.lax.scan(step, (params, opt_state), (obs, action, targets, w))
        return params, opt_state, td

    key = jax.random.PRNGKey(0)
    params = init(key)
    target = init(key)
    opt_state = tx.init(params)
    rng = np.random.default_rng(0)
    args = (jnp.asarray(rng.standard_normal((K, B, D)), jnp.float32), jnp.asarray(rng.integers(0, A, (K, B))),
            jnp.asarray(rng.standard_normal((K, B)), jnp.float32),
            jnp.asarray(rng.standard_normal((K, B, D)), jnp.float32),
            jnp.asarray(rng.random((K, B)) < 0.05, jnp.float32), jnp.ones((K, B), jnp.float32))
    params, opt_state, td = phase(params, opt_state, target, *args)
    td.block_until_ready()
    out = []
    for _ in range(phases):
        t = time.perf_counter()
        params, opt_state, td = phase(params, opt_state, target, *args)
        td.block_until_ready()
        out.append((time.perf_counter() - t) / K)
    return out


def child(kernel: str, a) -> None:
    over = settings(a)
    times = (run_jax(a.env, a.phases, over) if kernel == "jax"
             else run_torch(kernel, a.env, a.phases, over, a.threads, a.gemm))
    print(json.dumps({"kernel": kernel, "s_per_update": times}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phases", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--net-arch", default="", help="e.g. 256,256,256 (default: the preset's)")
    ap.add_argument("--activation", default="relu")
    ap.add_argument("--layer-norm", action="store_true")
    ap.add_argument("--gemm", default=None, choices=["mkl", "openblas"])
    ap.add_argument("--kernels", default="public,compiled,jax")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/ under the naming scheme")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a)
        return
    kernels = a.kernels.split(",")
    if a.gemm is None:   # one GEMM for every child: the probe's pick, here
        from hetrl.kernels.compiled import sgemm

        a.gemm = sgemm.bind()
    env = {**os.environ, **threads_env(a.threads), "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "HETRL_SGEMM": a.gemm}
    flags = ["--env", a.env, "--phases", str(a.phases), "--threads", str(a.threads), "--activation", a.activation,
             "--gemm", a.gemm] + (["--net-arch", a.net_arch] if a.net_arch else []) + (["--layer-norm"] if a.layer_norm else [])
    best: dict[str, list[float]] = {k: [] for k in kernels}
    skipped = {}
    for r in range(a.rounds):
        order = kernels if r % 2 == 0 else kernels[::-1]
        for k in order:
            if k in skipped:
                continue
            p = subprocess.run([sys.executable, __file__, "--child", k, *flags], env=env, capture_output=True, text=True)
            if p.returncode:
                skipped[k] = (p.stderr.strip().splitlines() or ["failed"])[-1]
                print(f"{k}: skipped ({skipped[k]})")
                continue
            t = min(json.loads(p.stdout.strip().splitlines()[-1])["s_per_update"])
            best[k].append(t)
            print(f"round {r}: {k:12s} {t * 1e3:.3f} ms/update", flush=True)
    med = {k: statistics.median(v) for k, v in best.items() if v}
    cfg, D, A, K = shapes(a.env, settings(a))
    print(f"\nDQN {a.env} (batch {cfg.batch_size}, net {cfg.net_arch} {cfg.activation}"
          f"{' layer_norm' if cfg.layer_norm else ''}, {K} updates per phase), {a.threads} thread(s), GEMM {a.gemm}, "
          f"median of {a.rounds} rounds:")
    for k, s in med.items():
        rel = "".join(f", {med[o] / s:.2f}x {o}" for o in med if o != k and o in ("public", "jax"))
        print(f"  {k:12s} {s * 1e3:.3f} ms/update{rel}")
    if a.out is None:
        from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
        a.out = str(result_path("bench_learner_kernels", f"dqn:{a.env}"))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"env": a.env, "batch_size": cfg.batch_size, "net_arch": cfg.net_arch,
                                       "activation": cfg.activation, "layer_norm": cfg.layer_norm,
                                       "threads": a.threads, "gemm": a.gemm,
                                       "updates_per_phase": K, "rounds": a.rounds, "s_per_update_rounds": best,
                                       "median_s_per_update": med, "skipped": skipped,
                                       "date": time.strftime("%Y-%m-%d"),
                                       "command": "python " + " ".join(sys.argv)}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
