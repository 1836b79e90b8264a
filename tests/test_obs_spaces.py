"""Observations that are not arrays (Discrete, MultiDiscrete, MultiBinary, Tuple, Dict) reach the networks as
one float32 vector, as SB3's policies see them (one-hot for discrete parts), under every schedule; a
trained policy acts on the env's own observations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import hetrl
from hetrl.actors.envs import make_env, raw_observation_space
from hetrl.errors import UsageError


class DictObs(gym.Env):
    """A 3-cell corridor with a Dict observation: position (Discrete 3) and a 2-float Box; reward at cell 2."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Discrete(3),
                                         "vel": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def _obs(self):
        return {"pos": self.pos, "vel": np.array([self.pos / 2, -1.0], np.float32)}

    def step(self, action):
        self.pos = min(2, max(0, self.pos + (1 if action == 1 else -1)))
        self.t += 1
        return self._obs(), float(self.pos == 2), self.pos == 2, self.t >= 10, {}


class GraphObs(DictObs):
    observation_space = gym.spaces.Graph(node_space=gym.spaces.Box(0, 1, (2,)), edge_space=None)


def non_slippery_lake():
    return gym.make("FrozenLake-v1", is_slippery=False)


def test_discrete_tuple_and_dict_observations_become_float_vectors():
    e = make_env("FrozenLake-v1")
    assert e.observation_space == gym.spaces.Box(0, 1, (16,), np.float32)
    obs, _ = e.reset(seed=0)
    assert obs.dtype == np.float32 and obs.sum() == 1 and obs[0] == 1          # state 0, one-hot
    raw = raw_observation_space("Blackjack-v1")
    e = make_env("Blackjack-v1")
    assert e.observation_space.shape == (32 + 11 + 2,)
    obs, _ = e.reset(seed=3)
    raw_obs, _ = make_env("Blackjack-v1", flatten=False).reset(seed=3)
    assert np.array_equal(obs, gym.spaces.flatten(raw, raw_obs).astype(np.float32)) and obs.sum() == 3
    e = make_env(DictObs)
    obs, _ = e.reset(seed=0)
    assert e.observation_space.shape == (5,) and np.array_equal(obs, [1, 0, 0, 0, -1])  # pos one-hot, vel
    assert isinstance(make_env("CartPole-v1").observation_space, gym.spaces.Box)       # arrays untouched


def test_an_observation_space_that_cannot_be_flattened_is_one_line():
    with pytest.raises(UsageError, match="is not a Box and cannot be flattened into one"):
        hetrl.train("dqn", GraphObs, plan="none", steps=10, progress=False)


def test_dqn_learns_a_discrete_observation_env_and_acts_on_its_raw_observations():
    run = hetrl.train("dqn", non_slippery_lake, plan="none", steps=3000, seed=0, learning_starts=500, exploration_fraction=0.5,
                      progress=False, evaluate_episodes=3)
    assert run.result["eval_return_mean"] == 1.0          # the deterministic lake is solved
    p = run.policy
    one_hot = np.eye(16, dtype=np.float32)
    # the env's own (int) observations, one or a batch, act as their one-hot vectors
    assert p.act(0) == p.act(one_hot[0])
    assert np.array_equal(p.act(np.array([0, 4, 14])), p.act(one_hot[[0, 4, 14]]))
    assert p.act(14) == 2                                   # right, into the goal


@pytest.mark.parametrize("schedule", ["inline", "local"])
def test_dict_observations_train_under_each_schedule(schedule):
    run = hetrl.train("dqn", "FrozenLake-v1" if schedule == "local" else DictObs, plan="none", steps=800, seed=0,
                      learning_starts=200, schedule=schedule, progress=False, evaluate_episodes=0)
    assert run.result["env_steps"] == 800 and run.result["gradient_steps"] > 0
    if schedule == "inline":
        p = run.policy
        one = {"pos": 1, "vel": np.array([0.5, -1.0], np.float32)}
        batch = {"pos": np.array([0, 1]), "vel": np.array([[0, -1], [0.5, -1]], np.float32)}   # a vector env's
        assert p.act(one) == p.act(np.array([0, 1, 0, 0.5, -1], np.float32))
        assert np.array_equal(p.act(batch), p.act(np.array([[1, 0, 0, 0, -1], [0, 1, 0, 0.5, -1]], np.float32)))


def test_envpool_is_not_used_for_envs_whose_observations_hetrl_flattens():
    envpool = pytest.importorskip("envpool")
    from hetrl.actors.envs import envpool_supports, make_vector_env

    assert "FrozenLake-v1" in envpool.list_all_envs() and "CartPole-v1" in envpool.list_all_envs()
    assert not envpool_supports("FrozenLake-v1") and envpool_supports("CartPole-v1")
    venv = make_vector_env("FrozenLake-v1", 2, 0, "auto")     # auto: Gymnasium, flattened
    assert venv.observation_space.shape == (2, 16)
    venv.close()
    with pytest.raises(UsageError, match="observations that are not arrays"):
        make_vector_env("FrozenLake-v1", 2, 0, "envpool")
