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


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_sync_vector_steps_as_gymnasium_does(env_id):
    """The actors' vector env (SyncVector: a shorter step for array observations and actions) gives what
    Gymnasium's SyncVectorEnv gives, episode ends (final_obs, masks) included, and observations that a later step
    does not change."""
    from hetrl.actors.envs import SyncVector, make_env

    mode = gym.vector.AutoresetMode.SAME_STEP
    ref = gym.vector.SyncVectorEnv([lambda: make_env(env_id) for _ in range(2)], autoreset_mode=mode)
    ours = SyncVector([lambda: make_env(env_id) for _ in range(2)], autoreset_mode=mode)
    assert ours._rows
    np.testing.assert_array_equal(ours.reset(seed=[5, 6])[0], ref.reset(seed=[5, 6])[0])
    ref.action_space.seed(0)
    ends, kept = 0, []
    for _ in range(250):
        a = ref.action_space.sample()
        got, want = ours.step(a), ref.step(a)
        kept.append((got[0], want[0].copy()))
        for x, y in zip(got[:4], want[:4]):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
        assert got[4].keys() == want[4].keys()
        if "final_obs" in want[4]:
            ends += 1
            np.testing.assert_array_equal(got[4]["_final_obs"], want[4]["_final_obs"])
            for i in np.flatnonzero(want[4]["_final_obs"]):
                np.testing.assert_array_equal(got[4]["final_obs"][i], want[4]["final_obs"][i])
    assert ends > 0 or env_id == "Pendulum-v1"
    for x, y in kept:
        np.testing.assert_array_equal(x, y)


def test_epsilon_greedy_draws():
    """DQN's acting draws one uniform per env, then uniform actions for the envs that explore; the others act
    greedily (the network runs on those rows only)."""
    from hetrl.algos import make_algorithm
    from hetrl.config import make_config

    env = gym.make("CartPole-v1")
    algo = make_algorithm(make_config("dqn", "CartPole-v1", {"net_arch": [16]}), env.observation_space,
                          env.action_space)
    policy = algo.make_policy(seed=4, num_envs=6)
    obs = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    greedy = policy.act_deterministic(obs)
    twin = np.random.default_rng(4)
    for eps in (0.0, 0.5, 1.0, 0.5):
        a, stored = policy.act(obs, eps)
        rand = twin.random(6) < eps
        want = greedy.copy()
        want[rand] = twin.integers(0, 2, int(rand.sum()))
        np.testing.assert_array_equal(a, want)
        assert a.dtype == np.int64 and stored is a
    a, _ = policy.act(obs[:1], 0.0)
    assert a.shape == (1,) and a[0] == greedy[0]


def test_sync_vector_names_an_observation_of_the_wrong_shape():
    from hetrl.actors.envs import SyncVector

    class Scalar(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            return np.zeros(4, np.float32), {}

        def step(self, action):
            return np.float32(0.0), 0.0, False, False, {}

    venv = SyncVector([Scalar], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    venv.reset()
    with pytest.raises(ValueError, match=r"env 0 returned an observation of shape \(\).*says \(4,\)"):
        venv.step(np.zeros(1, np.int64))
