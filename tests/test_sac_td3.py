"""TD3 and SAC: their losses against hand computations, the delayed update, entropy tuning, runs."""

from __future__ import annotations


import gymnasium as gym
import numpy as np
import pytest
import torch

import hetrl
from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.errors import UsageError

SPACES = (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,)))


def batch(K=1, B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(K, B, 3, generator=g), "action": torch.rand(K, B, 2, generator=g) * 2 - 1,
            "reward": torch.randn(K, B, generator=g), "next_obs": torch.randn(K, B, 3, generator=g),
            "terminated": torch.rand(K, B, generator=g) < 0.3, "truncated": torch.zeros(K, B, dtype=torch.bool),
            "steps": torch.ones(K, B, dtype=torch.uint8)}


def params(module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


def test_td3_target_is_the_twin_min_with_clipped_smoothing_noise():
    cfg = make_config("td3", "Pendulum-v1", {"net_arch": [16], "target_policy_noise": 5.0, "target_noise_clip": 0.3})
    algo = make_algorithm(cfg, *SPACES)
    b = {k: v[0] for k, v in batch().items()}
    torch.manual_seed(7)
    got = algo.target(b)
    torch.manual_seed(7)
    noise = (torch.randn(8, 2) * 5.0).clamp(-0.3, 0.3)      # the clip binds: std 5 >> 0.3
    with torch.no_grad():
        a = (algo.actor_target(b["next_obs"]) + noise).clamp(-1, 1)
        q = torch.min(algo.critics_target[0](b["next_obs"], a), algo.critics_target[1](b["next_obs"], a))
    want = b["reward"] + cfg.gamma * (~b["terminated"]).float() * q
    torch.testing.assert_close(got, want)


def test_td3_moves_the_actor_and_targets_every_policy_delay_critic_updates():
    cfg = make_config("td3", "Pendulum-v1", {"net_arch": [16], "policy_delay": 3})
    algo = make_algorithm(cfg, *SPACES)
    actor, target, critic = params(algo.actor), params(algo.critics_target), params(algo.critics)
    algo.learn(batch(K=2), torch.ones(2, 8))
    assert not torch.equal(params(algo.critics), critic)             # critics learn every step
    assert torch.equal(params(algo.actor), actor) and torch.equal(params(algo.critics_target), target)
    algo.learn(batch(K=1, seed=1), torch.ones(1, 8))                  # the 3rd critic update
    assert not torch.equal(params(algo.actor), actor) and not torch.equal(params(algo.critics_target), target)
    assert algo.updates == 3 and algo.state_dict()["updates"] == 3


def test_sac_log_prob_is_the_tanh_squashed_gaussian():
    cfg = make_config("sac", "Pendulum-v1", {"net_arch": [16]})
    algo = make_algorithm(cfg, *SPACES)
    obs, eps = torch.randn(5, 3), torch.randn(5, 2)
    a, logp = algo.actor.sample(obs, eps)
    mean, log_std = algo.actor(obs)
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform(cache_size=1)])
    u = mean + log_std.exp() * eps
    torch.testing.assert_close(a, torch.tanh(u))
    torch.testing.assert_close(logp, dist.log_prob(torch.tanh(u)).sum(-1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target, direction", [(10.0, 1), (-100.0, -1)])
def test_sac_entropy_coefficient_moves_toward_its_target(target, direction):
    cfg = make_config("sac", "Pendulum-v1", {"net_arch": [16], "target_entropy": str(target)})
    algo = make_algorithm(cfg, *SPACES)
    before = algo.alpha
    algo.learn(batch(K=5), torch.ones(5, 8))
    assert (algo.alpha - before) * direction > 0


def test_sac_fixed_entropy_coefficient_stays_and_auto_targets_minus_action_dims():
    algo = make_algorithm(make_config("sac", "Pendulum-v1", {"net_arch": [16], "ent_coef": "0.2"}), *SPACES)
    algo.learn(batch(K=3), torch.ones(3, 8))
    assert algo.alpha == pytest.approx(0.2) and algo.alpha_opt is None
    assert make_algorithm(make_config("sac", "Pendulum-v1", {"net_arch": [16]}), *SPACES).target_entropy == -2.0
    with pytest.raises(UsageError, match="ent_coef"):
        make_config("sac", "Pendulum-v1", {"ent_coef": "lots"})


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_discrete_actions_are_refused_naming_dqn(algo):
    with pytest.raises(UsageError, match="use dqn"):
        hetrl.train(algo, "CartPole-v1", steps=10, progress=False)


SMALL = dict(steps=400, learning_starts=200, net_arch=[16], batch_size=32, eval_episodes=0, threads=1)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_runs_are_deterministic_and_checkpoints_round_trip(algo, tmp_path):
    a = hetrl.train(algo, "Pendulum-v1", progress=False, out=tmp_path / "a", **SMALL)
    b = hetrl.train(algo, "Pendulum-v1", progress=False, **SMALL)
    assert torch.equal(params(a.algo.actor), params(b.algo.actor))
    assert torch.equal(params(a.algo.critics), params(b.algo.critics))
    pol = hetrl.load(tmp_path / "a")
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_array_equal(pol.act(obs), a.policy.act(obs))
    assert pol.act(obs).shape == (4, 1) and np.abs(pol.act(obs)).max() <= 2.0
    run = hetrl.api.resume(tmp_path / "a", steps=600, progress=False, evaluate_episodes=0)
    assert run.result["env_steps"] == 600 and run.algo.updates == run.result["gradient_steps"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_learns_pendulum_on_a_small_budget(algo):
    run = hetrl.train(algo, "Pendulum-v1", steps=5000, learning_starts=1000, net_arch=[64, 64], batch_size=128,
                      eval_episodes=5, threads=1, seed=0, progress=False)
    assert run.result["eval_return_mean"] > -700    # a random policy scores about -1200
