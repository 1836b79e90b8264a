"""Every algorithm actually learns, on small budgets with fixed seeds (~20-30 s each).

Full-budget figures (CartPole-v1 >= 475 in 50k steps, Pendulum-v1 >= -200 in 20k steps, seeds
0-2) are in README.md with the commands that produce them.
"""

import pytest

import hetrl


@pytest.mark.slow
def test_dqn_learns_cartpole():
    run = hetrl.train("dqn", "CartPole-v1", plan="none", steps=20_000, seed=1, progress=False, net_arch=[64, 64], threads=1,
                      exploration_fraction=0.2, train_freq=128, gradient_steps=64, eval_episodes=10)
    assert run.result["eval_return_mean"] >= 195  # a random policy scores ~22


@pytest.mark.slow
def test_ddpg_learns_pendulum():
    run = hetrl.train("ddpg", "Pendulum-v1", plan="none", steps=5_000, seed=0, progress=False, net_arch=[64, 64], threads=1,
                      learning_starts=1000, batch_size=128, eval_episodes=10)
    assert run.result["eval_return_mean"] >= -400  # a random policy scores ~-1200
