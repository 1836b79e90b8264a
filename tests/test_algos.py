"""Learner targets: n-step discount, terminated (no bootstrap) vs truncated (bootstrap)."""

import gymnasium as gym
import numpy as np
import torch

from hetrl.algos import make_algorithm
from hetrl.config import make_config


def _batch(**kw):
    b = {"obs": torch.zeros(3, 4), "action": torch.zeros(3, dtype=torch.int64),
         "reward": torch.tensor([1.0, 1.0, 1.0]), "next_obs": torch.ones(3, 4),
         "terminated": torch.tensor([False, True, False]), "truncated": torch.tensor([False, False, True]),
         "steps": torch.tensor([1, 1, 3], dtype=torch.uint8)}
    b.update(kw)
    return b


def test_dqn_target_bootstraps_on_truncation_not_termination():
    cfg = make_config("dqn", "CartPole-v1", {"gamma": 0.9, "net_arch": [8]})
    algo = make_algorithm(cfg, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    b = _batch()
    v = algo.q_target(b["next_obs"]).max(-1).values
    t = algo._targets(b)
    torch.testing.assert_close(t[0], 1.0 + 0.9 * v[0])          # 1-step, bootstrap
    torch.testing.assert_close(t[1], torch.tensor(1.0))          # terminated: no bootstrap
    torch.testing.assert_close(t[2], 1.0 + 0.9 ** 3 * v[2])     # truncated 3-step: bootstrap gamma^3


def test_double_dqn_uses_online_argmax():
    cfg = make_config("dqn", "CartPole-v1", {"gamma": 0.5, "net_arch": [8], "double": True})
    algo = make_algorithm(cfg, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    torch.nn.init.normal_(algo.q_target.q[-1].weight)  # make online and target disagree
    b = _batch()
    a = algo.q(b["next_obs"]).argmax(-1)
    v = algo.q_target(b["next_obs"]).gather(-1, a[:, None]).squeeze(-1)
    torch.testing.assert_close(algo._targets(b)[0], 1.0 + 0.5 * v[0])


def test_ddpg_learn_reduces_critic_error_and_returns_td():
    torch.manual_seed(0)
    cfg = make_config("ddpg", "Pendulum-v1", {"net_arch": [32, 32]})
    algo = make_algorithm(cfg, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)))
    K, B = 50, 32
    obs = torch.randn(K, B, 3)
    batches = {"obs": obs, "action": torch.rand(K, B, 1) * 2 - 1, "reward": obs[..., 0],
               "next_obs": torch.randn(K, B, 3), "terminated": torch.ones(K, B, dtype=torch.bool),
               "truncated": torch.zeros(K, B, dtype=torch.bool), "steps": torch.ones(K, B, dtype=torch.uint8)}
    td = algo.learn(batches, torch.ones(K, B))
    assert td.shape == (K, B) and (td >= 0).all()
    assert td[-5:].mean() < td[:5].mean()
    assert algo.updates == K


def test_dueling_network_shapes():
    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [16, 16], "dueling": True})
    algo = make_algorithm(cfg, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
    assert algo.q(torch.zeros(5, 4)).shape == (5, 3)
    assert algo.q(torch.zeros(2, 5, 4)).shape == (2, 5, 3)


def test_ddpg_policy_scales_actions_to_bounds():
    cfg = make_config("ddpg", "Pendulum-v1", {"net_arch": [8]})
    algo = make_algorithm(cfg, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(np.array([0.0], np.float32), np.array([4.0], np.float32)))
    pol = algo.make_policy(seed=0)
    env_a, stored = pol.act(np.zeros((6, 3), np.float32), None)
    assert (stored >= -1).all() and (stored <= 1).all()
    np.testing.assert_allclose(env_a, (stored + 1) * 2.0, rtol=1e-6)


def test_dqn_acting_runs_the_network_only_for_the_envs_that_act_greedily():
    """Epsilon-greedy: the coin comes first and the Q-network sees only the greedy envs' observations (none at
    epsilon 1, as SB3 skips its forward); the greedy envs get the argmax, the others uniform actions."""
    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [16]})
    algo = make_algorithm(cfg, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
    policy = algo.make_policy(seed=0)
    seen = []
    policy.net.register_forward_hook(lambda m, inp, out: seen.append(len(inp[0])))
    obs = np.random.default_rng(1).standard_normal((64, 4)).astype(np.float32)
    a, stored = policy.act(obs, 1.0)
    assert seen == [] and a is stored and a.dtype == np.int64 and set(a) == {0, 1, 2}
    greedy = policy.act_deterministic(obs)
    seen.clear()
    state = policy.rng.bit_generator.state
    a, _ = policy.act(obs, 0.5)
    policy.rng.bit_generator.state = state
    rand = policy.rng.random(64) < 0.5
    assert 0 < rand.sum() < 64 and seen == [int((~rand).sum())]
    np.testing.assert_array_equal(a[~rand], greedy[~rand])
    seen.clear()
    np.testing.assert_array_equal(policy.act(obs, 0.0)[0], greedy)
    assert seen == [64]
