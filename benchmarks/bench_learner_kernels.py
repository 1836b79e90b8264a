#!/usr/bin/env python
"""The DQN learner's time per update on one CPU thread: hetrl's public path (autograd + fused Adam),
its hand-derived fast path, its compiled phase (numba), and a JAX reference of the same phase
(`jax.lax.scan` over the K updates, optax Adam + global-norm clip, XLA on one thread).

Usage:
    python benchmarks/bench_learner_kernels.py [--env CartPole-v1] [--rounds 3] [--phases 8]
           [--kernels public,fast,compiled,jax] [--out benchmarks/results/learner_kernels.json]

Every kernel runs the same workload: the env's DQN preset (CartPole-v1: batch 64, 256x256, 128
gradient steps per phase, Huber loss, max_grad_norm 10, Adam), phases of K updates on synthetic
batches, the phase's targets from one batched forward of the fixed target network (as hetrl does;
the JAX phase computes them inside the compiled program). Each kernel runs in its own subprocess,
in alternating order, `--rounds` times; the figure is the median of the rounds' best phase. JAX is
optional (`pip install jax optax` only for this benchmark): without it that row is skipped.
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

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
              "NPROC": "1"}


def shapes(env: str):
    import gymnasium as gym

    from hetrl.actors import probe_spaces
    from hetrl.config import make_config
    from hetrl.runtime.layout import grads_per_phase

    cfg = make_config("dqn", env, {})
    obs_space, act_space = probe_spaces(env)
    K = max(1, int(grads_per_phase(cfg)))
    assert isinstance(act_space, gym.spaces.Discrete)
    return cfg, int(obs_space.shape[0]), int(act_space.n), K


def run_torch(kernel: str, env: str, phases: int) -> list[float]:
    import dataclasses

    import gymnasium as gym
    import torch

    from hetrl.algos import compiled, make_algorithm

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cfg, D, A, K = shapes(env)
    cfg = dataclasses.replace(cfg, fastpath=kernel == "fast", compiled=kernel == "compiled")
    algo = make_algorithm(cfg, gym.spaces.Box(-5, 5, (D,)), gym.spaces.Discrete(A))
    if kernel == "compiled":
        compiled.warm_up()
        assert algo.compiled_phase
    B = cfg.batch_size
    g = torch.Generator().manual_seed(0)
    batch = {"obs": torch.randn(K, B, D, generator=g), "action": torch.randint(0, A, (K, B), generator=g),
             "reward": torch.randn(K, B, generator=g), "next_obs": torch.randn(K, B, D, generator=g),
             "terminated": torch.rand(K, B, generator=g) < 0.05, "truncated": torch.zeros(K, B, dtype=torch.bool),
             "steps": torch.ones(K, B, dtype=torch.uint8)}
    w = torch.ones(K, B)
    algo.learn(batch, w)
    out = []
    for _ in range(phases):
        t = time.perf_counter()
        algo.learn(batch, w)
        out.append((time.perf_counter() - t) / K)
    return out


def run_jax(env: str, phases: int) -> list[float]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    cfg, D, A, K = shapes(env)
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


def child(kernel: str, env: str, phases: int) -> None:
    times = run_jax(env, phases) if kernel == "jax" else run_torch(kernel, env, phases)
    print(json.dumps({"kernel": kernel, "s_per_update": times}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phases", type=int, default=8)
    ap.add_argument("--kernels", default="public,fast,compiled,jax")
    ap.add_argument("--out", default="benchmarks/results/learner_kernels.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.env, a.phases)
        return
    kernels = a.kernels.split(",")
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    best: dict[str, list[float]] = {k: [] for k in kernels}
    skipped = {}
    for r in range(a.rounds):
        order = kernels if r % 2 == 0 else kernels[::-1]
        for k in order:
            if k in skipped:
                continue
            p = subprocess.run([sys.executable, __file__, "--child", k, "--env", a.env, "--phases", str(a.phases)],
                               env=env, capture_output=True, text=True)
            if p.returncode:
                skipped[k] = (p.stderr.strip().splitlines() or ["failed"])[-1]
                print(f"{k}: skipped ({skipped[k]})")
                continue
            t = min(json.loads(p.stdout.strip().splitlines()[-1])["s_per_update"])
            best[k].append(t)
            print(f"round {r}: {k:9s} {t * 1e3:.3f} ms/update", flush=True)
    med = {k: statistics.median(v) for k, v in best.items() if v}
    cfg, D, A, K = shapes(a.env)
    print(f"\nDQN {a.env} (batch {cfg.batch_size}, net {cfg.net_arch}, {K} updates per phase), one thread, "
          f"median of {a.rounds} rounds:")
    for k, s in med.items():
        rel = "".join(f", {med[o] / s:.2f}x {o}" for o in med if o != k and o in ("public", "jax"))
        print(f"  {k:9s} {s * 1e3:.3f} ms/update{rel}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"env": a.env, "batch_size": cfg.batch_size, "net_arch": cfg.net_arch,
                                       "updates_per_phase": K, "rounds": a.rounds, "s_per_update_rounds": best,
                                       "median_s_per_update": med, "skipped": skipped,
                                       "date": time.strftime("%Y-%m-%d"),
                                       "command": "python " + " ".join(sys.argv)}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
