"""Evaluation episodes end: an env where nothing ends the episode is cut at a step limit and says so."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import hetrl
from hetrl.actors.envs import make_env
from hetrl.evaluate import NO_LIMIT_STEPS, evaluate


class Endless(gym.Env):
    """Reward 1 per step, never terminates, no TimeLimit (as CliffWalking under a policy that walks into a wall)."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


def stay(obs):
    return np.zeros(len(obs), np.int64)


def test_an_endless_episode_is_cut_at_the_limit_and_counted():
    r = evaluate(stay, Endless, episodes=3, seed=0, max_steps=50)
    assert r["eval_returns"] == [50.0] * 3 and r["eval_episodes_cut"] == 3
    r = evaluate(stay, Endless, episodes=2, seed=0)     # no limit of its own: NO_LIMIT_STEPS
    assert r["eval_length_mean"] == NO_LIMIT_STEPS and r["eval_episodes_cut"] == 2


def test_the_envs_own_time_limit_is_kept_and_episodes_that_end_are_not_cut():
    r = evaluate(stay, lambda: gym.wrappers.TimeLimit(Endless(), 30), episodes=2, seed=0)
    assert r["eval_length_mean"] == 30 and r["eval_episodes_cut"] == 0    # truncated by the env: not cut
    r = evaluate(lambda o: np.zeros(len(o), np.int64), "CartPole-v1", episodes=2, seed=0, max_steps=1000)
    assert r["eval_episodes_cut"] == 0 and r["eval_length_mean"] < 100    # pushing left falls over


def test_a_run_on_an_endless_env_finishes_and_reports_the_cut_episodes():
    run = hetrl.train("dqn", Endless, plan="none", steps=400, learning_starts=100, eval_max_steps=200, evaluate_episodes=2,
                      progress=False)
    assert run.result["eval_episodes_cut"] == 2 and run.result["eval_return_mean"] == 200.0


def test_atari_games_keep_ales_own_truncation():
    pytest.importorskip("ale_py")
    from hetrl.actors.envs import prepare_env
    from hetrl.config import make_config
    from hetrl.evaluate import step_limit

    cfg = make_config("dqn", "ALE/Breakout-v5", {})
    e = make_env(prepare_env("ALE/Breakout-v5", cfg, train=False))
    assert step_limit(e) > 27_000          # the 108k-frame game limit applies, not NO_LIMIT_STEPS
    assert step_limit(e, max_steps=500) == 500
    e.close()
