import os
import subprocess
import sys

import pytest
import torch

# one BLAS thread per test process keeps timings and results stable on the 2-core CI machine
torch.set_num_threads(1)
os.environ.setdefault("HETRL_TEST", "1")

# The compiled learner kernel's VM (which runs the phases derived from an algorithm's learn), heads and acting,
# compiled into numba's on-disk cache before any test runs (a minute or more per head on a cold cache, e.g. a fresh
# clone), in three processes side by side: otherwise every test process that meets one first (test workers, local
# actors, Ray workers) compiles it at the same time.
WARM = """
import sys
import gymnasium as gym
from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels.compiled import CompiledKernel, available
if available() is None:
    for name in sys.argv[1:]:
        if name == "derived":   # the VM that runs every phase derived from an algorithm's learn (one per machine)
            import torch
            from hetrl.kernels import synthetic_batch
            e = gym.make("CartPole-v1")
            algo = make_algorithm(make_config("dqn", "CartPole-v1", {"net_arch": [8]}), e.observation_space,
                                  e.action_space)
            kernel = CompiledKernel(algo, path="derived")
            b = synthetic_batch(type(algo).replay_fields(e.observation_space, e.action_space), e.action_space, 8,
                                1, "cpu")[0]
            for _ in range(2):   # (the first phase is the public learn: it makes the optimizer's state)
                kernel.learn(b, torch.ones(1, 8))
            kernel.close()
            continue
        env = "CartPole-v1" if name == "dqn" else "Pendulum-v1"
        e = gym.make(env)
        algo = make_algorithm(make_config(name, env, {"net_arch": [8, 8]}), e.observation_space, e.action_space)
        kernel = CompiledKernel(algo)
        kernel.wrap_policy(algo.make_policy(seed=0, num_envs=1)).act(e.reset(seed=0)[0][None], False)
        kernel.close()
"""


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get("HETRL_TEST_NO_WARM"):   # the controlling process only
        return
    procs = [subprocess.Popen([sys.executable, "-c", WARM, *names], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
             for names in (("ddpg", "td3"), ("dqn", "sac"), ("crossq", "derived"))]
    for p in procs:   # a failure here shows again, with its message, in the tests of the kernel
        try:
            p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()


# The longest files first: pytest-xdist hands whole files to its workers in collection order, so a long file
# collected last would run alone at the end while the other worker idles
LONGEST_FIRST = ("test_ray.py", "test_algorithm_contract.py", "test_local_lifecycle.py", "test_atari.py",
                 "test_population.py", "test_ray_cluster.py", "test_crossq.py", "test_ray_start.py", "test_local.py",
                 "test_sac_td3.py", "test_onpolicy_runs.py", "test_onpolicy_sb3.py", "test_kernel_compiled.py",
                 "test_compiler.py", "test_planner_busy.py", "test_sb3_surface.py", "test_learning.py", "test_callbacks.py",
                 "test_cli.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a file's tests keep their order


@pytest.fixture
def tiny():
    """Settings for a fast DQN run on CartPole (seconds, not minutes)."""
    return dict(steps=600, learning_starts=200, train_freq=100, gradient_steps=10, batch_size=32,
                buffer_size=1000, net_arch=[32, 32], num_envs=4, eval_episodes=0, threads=1)


class _StopAt:
    """A callback that stops a run at the first phase boundary at or past `steps` env steps (as Ctrl-C would)."""

    def __init__(self, steps: int):
        self.steps = steps

    def phase(self, run, episodes):
        return run.env_steps < self.steps


@pytest.fixture
def stop_at():
    """stop_at(steps): a callback that stops a run at the first phase boundary at or past `steps` env steps."""
    return _StopAt
