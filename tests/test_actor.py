"""The actor hands out the true final observation on truncation (SAME_STEP autoreset)."""

import gymnasium as gym
import numpy as np
import pytest

from hetrl.actors import Actor


class ConstPolicy:
    rng = np.random.default_rng(0)

    def act(self, obs, explore):
        a = np.zeros(len(obs), dtype=np.int64)
        return a, a

    def load(self, state):
        pass

    def episode_end(self, done):
        pass


def short_cartpole():
    return gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=5)


def test_truncated_transition_carries_final_obs():
    actor = Actor(short_cartpole, num_envs=2, seed=0, policy=ConstPolicy())
    b = actor.collect(20, lambda s: 0.0)
    assert len(b["obs"]) == 20
    trunc = np.flatnonzero(b["truncated"])
    assert len(trunc) > 0
    for i in trunc:
        assert not b["terminated"][i]
        # the final obs is the successor of obs, not the reset obs of the next episode
        assert np.abs(b["next_obs"][i] - b["obs"][i]).max() < 0.5
    assert actor.env_steps == 20
    eps = actor.drain_episodes()
    assert all(length <= 5 for _, length in eps)


def test_envpool_backend_same_step_semantics():
    import pytest

    pytest.importorskip("envpool")
    from hetrl.actors.envs import make_vector_env

    venv = make_vector_env("CartPole-v1", 3, seed=0, backend="envpool")
    obs, _ = venv.reset()
    ends = 0
    for _ in range(60):
        prev = obs
        obs, r, term, trunc, info = venv.step(np.zeros(3, dtype=np.int64))
        for i in np.flatnonzero(term | trunc):
            ends += 1
            # final obs continues the episode; the returned obs starts a new one
            assert np.abs(info["final_obs"][i] - prev[i]).max() < 0.5
            assert np.abs(obs[i]).max() < 0.06
    assert ends > 0
    venv.close()


def test_unknown_envpool_id_is_a_usage_error():
    import pytest

    from hetrl.actors.envs import make_vector_env
    from hetrl.errors import UsageError

    with pytest.raises(UsageError, match="env_backend"):
        make_vector_env(short_cartpole, 2, seed=0, backend="envpool")


@pytest.mark.parametrize("n_step", [1, 3])
def test_collect_into_a_destination_writes_what_collect_returns(n_step):
    """The local schedule's staging area is a destination of the one Actor.collect, not a second loop."""
    from hetrl.algos import make_algorithm, replay_spec
    from hetrl.config import make_config

    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [16], "n_step": n_step})
    env = gym.make("CartPole-v1")
    algo = make_algorithm(cfg, env.observation_space, env.action_space)
    spec = replay_spec(cfg, env.observation_space, env.action_space)
    ref = Actor("CartPole-v1", 4, 7, algo.make_policy(seed=8), n_step, cfg.gamma)
    act = Actor("CartPole-v1", 4, 7, algo.make_policy(seed=8), n_step, cfg.gamma)
    out = {k: np.zeros((200 + 4 * n_step, *s), d) for k, (s, d) in spec.items()}
    for _ in range(3):
        want = ref.collect(200, lambda s: 0.3)
        rows = act.collect(200, lambda s: 0.3, out=out)
        assert rows == len(want["obs"])
        for k in spec:
            np.testing.assert_array_equal(out[k][:rows], want[k], err_msg=k)
    assert act.drain_episodes() == ref.drain_episodes()


class SeededLength(gym.Env):
    """Episodes of 2 + (its first reset seed mod 3) steps: each env of a vector has its own length."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    length = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.length is None and seed is not None:
            self.length = 2 + seed % 3
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t >= self.length, False, {}


def test_each_finished_episode_says_its_env_in_the_run():
    from hetrl.actors import Episode

    actor = Actor(SeededLength, num_envs=3, seed=0, policy=ConstPolicy(), env_offset=6)
    actor.collect(60, lambda s: 0.0)
    eps = actor.drain_episodes()
    assert {e.env for e in eps} == {6, 7, 8}
    # env 6 + j runs episodes of 2 + j steps: every episode is given to the env it ran in
    assert all(isinstance(e, Episode) and e == (float(2 + e.env - 6), 2 + e.env - 6) for e in eps)
    r, length = eps[0]   # still a (return, length) pair, and it pickles with its env (actor processes send it)
    import pickle

    back = pickle.loads(pickle.dumps(eps[0]))
    assert back == eps[0] and back.env == eps[0].env
