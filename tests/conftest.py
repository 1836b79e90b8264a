import os

import pytest
import torch

# one BLAS thread per test process keeps timings and results stable on the 2-core CI machine
torch.set_num_threads(1)
os.environ.setdefault("HETRL_TEST", "1")


@pytest.fixture
def tiny():
    """Settings for a fast DQN run on CartPole (seconds, not minutes)."""
    return dict(steps=600, learning_starts=200, train_freq=100, gradient_steps=10, batch_size=32,
                buffer_size=1000, net_arch=[32, 32], num_envs=4, eval_episodes=0, threads=1)
