"""Compile the CPU learner kernel into numba's on-disk cache ahead of the first run (`hetrl warm`).

numba compiles a function the first time a process calls it and caches the machine code on disk (keyed to the
package's sources, cache.py). On a fresh install that first compile is a minute or more per hand-derived head, the
acting forward and the VM that runs every phase derived from an algorithm's `learn`, and a fraction of a second per
fused loop of a layer's passes (fused.py: one per signature, shared by every algorithm and width with that layer);
a run pays it inside its first phases. `make install` runs this once, so that no run (and no test process, local
actor or Ray worker) waits for it. Each group compiles in its own process, side by side; a group whose code is
cached already loads it in seconds.
"""

from __future__ import annotations

import subprocess
import sys
import time

# "derived" is the VM of the derived phase (one per machine, whatever the algorithm) and the fused loops of the
# built-ins without a head; the others are the built-ins' acting pieces and hand-derived heads (HEADS in kernel.py),
# grouped so that the three processes take about the same time
GROUPS = (("ddpg", "td3"), ("dqn", "sac"), ("crossq", "derived"))
DERIVED = ("dqn", "sac", "ppo", "a2c")   # their phases at widths whose passes get fused loops (fused.MIN_ELEMENTS)


def _algorithm(name: str, net_arch: list[int]):
    """`name` built on the first of CartPole-v1 (discrete) and Pendulum-v1 (continuous) whose spaces it takes."""
    import gymnasium as gym

    from hetrl.algos import make_algorithm
    from hetrl.config import make_config
    from hetrl.errors import UsageError

    for env_id in ("CartPole-v1", "Pendulum-v1"):
        env = gym.make(env_id)
        try:
            return make_algorithm(make_config(name, env_id, {"net_arch": net_arch}), env.observation_space,
                                  env.action_space), env
        except UsageError:
            continue
    raise UsageError(f"hetrl warm: {name} takes neither CartPole-v1 nor Pendulum-v1")


def compile_here(name: str) -> None:
    """Compile (or load from the cache) what `name` runs on the compiled kernel, in this process."""
    from hetrl.kernels.compiled import CompiledKernel

    if name == "derived":
        import torch

        from hetrl.algos import learn_spec
        from hetrl.kernels import synthetic_batch

        for algo_name in DERIVED:
            algo, env = _algorithm(algo_name, [64, 64])
            kernel = CompiledKernel(algo, path="derived")
            batch = synthetic_batch(learn_spec(algo.cfg, env.observation_space, env.action_space), env.action_space,
                                    64, 1, "cpu")[0]
            for _ in range(2):   # (the first phase is the public learn: it makes the optimizer's state)
                kernel.learn(batch, torch.ones(1, 64))
            kernel.close()
        return
    algo, env = _algorithm(name, [8, 8])
    kernel = CompiledKernel(algo)
    kernel.wrap_policy(algo.make_policy(seed=0, num_envs=1)).act(env.reset(seed=0)[0][None], False)
    kernel.close()


def warm(groups=GROUPS, timeout: float = 900.0, say=None) -> int:
    """Compile every group in its own process, side by side; the number of groups that failed (each failure shows
    again, with its message, where a run first meets that kernel)."""
    from hetrl.kernels.compiled import available

    why = available()
    if why is not None:
        if say:
            say(f"hetrl warm: nothing to compile ({why})")
        return 0
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "hetrl.kernels.compiled.warm", *names],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for names in groups]
    failed = 0
    for names, p in zip(groups, procs):
        try:
            _, err = p.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            err, p.returncode = b"timed out", 1
        if p.returncode != 0:
            failed += 1
            if say:
                last = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or [f"rc={p.returncode}"]
                say(f"hetrl warm: {', '.join(names)} did not compile: {last[0]}")
    if say:
        say(f"hetrl warm: the compiled CPU kernel is in numba's cache ({time.perf_counter() - t0:.0f} s)")
    return failed


if __name__ == "__main__":
    for _name in sys.argv[1:]:
        compile_here(_name)
