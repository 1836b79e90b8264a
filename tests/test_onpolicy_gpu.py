"""PPO and A2C on a GPU: phases replayed from a CUDA graph equal the eager `learn` (the check kernels.select runs
before it chooses that kernel), and a short run with the learner on cuda. Marked gpu: skipped without CUDA
(benchmarks/gpu_check.py runs `pytest -m gpu` on a GPU machine)."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import hetrl
from hetrl.algos import learn_spec, make_algorithm
from hetrl.config import make_config
from hetrl.kernels import check_equal, cuda_graph as graphed, synthetic_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CASES = [("ppo", "CartPole-v1"), ("ppo", "Pendulum-v1"), ("a2c", "CartPole-v1")]


@pytest.mark.parametrize("name,env_id", CASES)
def test_replayed_rollout_phases_equal_eager_on_the_gpu(name, env_id):
    env = gym.make(env_id)
    cfg = make_config(name, env_id, {"net_arch": [32, 32], "batch_size": 16, "lr_schedule": "constant"})
    spec = learn_spec(cfg, env.observation_space, env.action_space)
    g = torch.Generator().manual_seed(0)
    phases = [synthetic_batch(spec, env.action_space, 16, 4, "cuda", g)[0] for _ in range(3)]
    ok, detail = check_equal(lambda: make_algorithm(cfg, env.observation_space, env.action_space, "cuda"),
                             graphed.CudaGraphKernel, phases, torch.ones(4, 16, device="cuda"))
    assert ok, detail


@pytest.mark.parametrize("name,env_id", CASES)
def test_a_short_run_with_the_learner_on_cuda(name, env_id):
    run = hetrl.train(name, env_id, plan="none", steps=2048, seed=0, device="cuda", eval_episodes=1, progress=False)
    assert run.result["env_steps"] >= 2048
    assert run.result["device"] == "cuda" and run.result["eval_return_mean"] == run.result["eval_return_mean"]   # finite, not NaN
