"""CrossQ: batch renormalisation against its formulas, the joint critic pass, no target networks, the delayed
actor, SBX's Adam, the state round trip with the running statistics, acting on them, and a run that learns."""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hetrl
from hetrl.algos import make_algorithm
from hetrl.algos.crossq import BatchRenorm
from hetrl.config import make_config
from hetrl.errors import UsageError

SPACES = (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,)))
TINY = {"net_arch": [16], "qf_arch": [24], "batch_size": 8}


def batch(K=1, B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(K, B, 3, generator=g), "action": torch.rand(K, B, 2, generator=g) * 2 - 1,
            "reward": torch.randn(K, B, generator=g), "next_obs": torch.randn(K, B, 3, generator=g) + 1.0,
            "terminated": torch.rand(K, B, generator=g) < 0.3, "truncated": torch.zeros(K, B, dtype=torch.bool),
            "steps": torch.randint(1, 3, (K, B), generator=g).to(torch.uint8)}


def algo(**over):
    return make_algorithm(make_config("crossq", "Pendulum-v1", {**TINY, **over}), *SPACES)


def params(module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


# ---- batch renormalisation -------------------------------------------------------------------------------
def test_batch_renorm_warm_up_is_batch_norm_and_moves_the_running_statistics():
    torch.manual_seed(0)
    brn = BatchRenorm(4, momentum=0.9, warmup_steps=10)
    with torch.no_grad():
        brn.weight.uniform_(0.5, 2.0)
        brn.bias.uniform_(-1.0, 1.0)
    x = torch.randn(32, 4) * 3 + 2
    y = brn(x, train=True)
    mean, var = x.mean(0), x.var(0, unbiased=False)            # the biased variance, as SBX's
    torch.testing.assert_close(y, (x - mean) / (var + 1e-3).sqrt() * brn.weight + brn.bias)
    torch.testing.assert_close(brn.running_mean, 0.1 * mean)
    torch.testing.assert_close(brn.running_var, 0.9 + 0.1 * var)
    assert int(brn.steps) == 1
    before = (brn.running_mean.clone(), brn.running_var.clone())
    z = brn(x)                                                   # evaluation: the running statistics, untouched
    torch.testing.assert_close(z, (x - before[0]) / (before[1] + 1e-3).sqrt() * brn.weight + brn.bias)
    assert torch.equal(brn.running_mean, before[0]) and int(brn.steps) == 1


def test_batch_renorm_after_warm_up_corrects_with_clipped_r_and_d():
    torch.manual_seed(1)
    brn = BatchRenorm(3, momentum=0.99, warmup_steps=2)
    with torch.no_grad():
        brn.steps.fill_(2)
        brn.running_mean.copy_(torch.tensor([0.0, 10.0, 0.5]))     # d clips at -5 in feature 1
        brn.running_var.copy_(torch.tensor([1.0, 1.0, 100.0]))     # r clips at 1/3 in feature 2
        brn.weight.copy_(torch.tensor([1.5, 0.5, 2.0]))
    x = (torch.randn(64, 3) * torch.tensor([2.0, 1.0, 1.0])).requires_grad_()
    y = brn(x, train=True)
    mean, var = x.mean(0), x.var(0, unbiased=False)
    sigma = (torch.tensor([1.0, 1.0, 100.0]) + 1e-3).sqrt()
    sigma_b = (var + 1e-3).sqrt()
    r = (sigma_b / sigma).clamp(1 / 3, 3).detach()
    d = ((mean - torch.tensor([0.0, 10.0, 0.5])) / sigma).clamp(-5, 5).detach()
    assert d[1] == -5 and r[2] == pytest.approx(1 / 3)          # both clips bind
    want = ((x - mean) / sigma_b * r + d) * brn.weight + brn.bias
    torch.testing.assert_close(y, want)
    g = torch.randn(64, 3)
    got_grads = torch.autograd.grad((y * g).sum(), [x, brn.weight, brn.bias])
    want_grads = torch.autograd.grad((want * g).sum(), [x, brn.weight, brn.bias])
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)


def test_a_constant_feature_gives_finite_gradients():
    brn = BatchRenorm(2, warmup_steps=0)
    x = torch.stack([torch.randn(16), torch.zeros(16)], 1).requires_grad_()   # a dead ReLU unit: variance 0
    brn(x, train=True).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(brn.weight.grad).all()


# ---- the update -----------------------------------------------------------------------------------------
def test_no_target_networks_and_sbx_adam():
    a = algo()
    assert a.nets == ("actor", "critics") and not any("target" in k for k in a.state_dict())
    assert a.critic_opt.opt.param_groups[0]["betas"] == (0.5, 0.999)
    assert a.actor_opt.opt.param_groups[0]["betas"] == (0.5, 0.999)
    assert a.alpha_opt.param_groups[0]["betas"] == (0.9, 0.999)


def test_critic_step_is_one_joint_pass_over_current_and_next_pairs():
    """The TD errors come from a target bootstrapped on the critics' own training-mode pass over
    [(s, a); (s', a')] (no target network), and each critic's first layer's running statistics are those of
    the 2B rows: the batch statistics cover both halves."""
    a = algo(policy_delay=100, batch_norm_momentum=0.5)
    ref = copy.deepcopy(a)
    bb = batch()
    b = {k: v[0] for k, v in bb.items()}
    w = torch.rand(1, 8, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().set_state(a.rng.get_state())          # the learner's draws
    td = a.learn(bb, w)
    with torch.no_grad():
        next_a, next_logp = ref.actor.sample(b["next_obs"], generator=g)
        obs, act = torch.cat([b["obs"], b["next_obs"]]), torch.cat([b["action"], next_a])
        q = [c(obs, act, train=True) for c in ref.critics]
    alpha = 1.0                                                   # ent_coef auto: from 1
    y = b["reward"] + 0.99 ** b["steps"].float() * (~b["terminated"]).float() * \
        (torch.min(q[0][8:], q[1][8:]) - alpha * next_logp)
    want = ((q[0][:8] - y).abs() + (q[1][:8] - y).abs()) / 2
    torch.testing.assert_close(td[0], want)
    for c in a.critics:
        first = c.body.norms[0]
        torch.testing.assert_close(first.running_mean, 0.5 * torch.cat([obs, act], 1).mean(0))
        assert int(first.steps) == 1
    assert not torch.equal(params(a.critics), params(ref.critics))


def test_critic_gradient_is_the_weighted_twin_squared_error_through_the_joint_statistics():
    a = algo(policy_delay=100, lr=1e-3)
    ref = copy.deepcopy(a)
    bb = batch()
    b = {k: v[0] for k, v in bb.items()}
    w = torch.rand(1, 8, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().set_state(a.rng.get_state())
    a.learn(bb, w)
    with torch.no_grad():
        next_a, next_logp = ref.actor.sample(b["next_obs"], generator=g)
    obs, act = torch.cat([b["obs"], b["next_obs"]]), torch.cat([b["action"], next_a])
    q = [c(obs, act, train=True) for c in ref.critics]
    y = (b["reward"] + 0.99 ** b["steps"].float() * (~b["terminated"]).float()
         * (torch.min(q[0][8:], q[1][8:]) - next_logp)).detach()
    loss = sum(0.5 * (w[0] * (qi[:8] - y) ** 2).mean() for qi in q)
    grads = torch.autograd.grad(loss, list(ref.critics.parameters()))
    # Adam's first step, bias-corrected: m_hat = g, v_hat = g**2, whatever the betas
    moved = params(a.critics) - params(ref.critics)
    g = torch.cat([x.flatten() for x in grads])
    torch.testing.assert_close(moved, -1e-3 * g / (g.abs() + 1e-8), rtol=1e-3, atol=1e-7)


def test_actor_and_alpha_move_every_policy_delay_updates_with_the_actor_statistics():
    a = algo(policy_delay=3)
    actor0, alpha0 = params(a.actor), a.alpha
    a.learn(batch(K=2), torch.ones(2, 8))
    assert torch.equal(params(a.actor), actor0) and a.alpha == alpha0 and a.policy_changes() == 0
    assert int(a.actor.body.norms[0].steps) == 0                  # acting passes leave the statistics
    a.learn(batch(K=1, seed=1), torch.ones(1, 8))                # the third update
    assert not torch.equal(params(a.actor), actor0) and a.alpha < alpha0 and a.policy_changes() == 1
    assert int(a.actor.body.norms[0].steps) == 1 and int(a.critics[0].body.norms[0].steps) == 3
    assert a.graph_period() == 3


def test_without_actor_batch_norm_and_with_layer_norm_in_the_critics():
    a = algo(batch_norm_actor=False, layer_norm=True)
    assert a.actor.body.norms is None and a.critics[0].body.layer_norms is not None
    td = a.learn(batch(K=3), torch.ones(3, 8))
    assert td.shape == (3, 8) and torch.isfinite(td).all()


def test_state_round_trip_carries_the_running_statistics_and_counters():
    a = algo(policy_delay=2)
    a.learn(batch(K=5), torch.ones(5, 8))
    state = a.state_dict()
    assert int(state["critics"]["0.body.norms.0.steps"]) == 5 and int(state["actor"]["body.norms.1.steps"]) == 2
    b = algo(policy_delay=2, seed=9)                             # another generator and other weights
    b.load_state_dict(pickle.loads(pickle.dumps(state)))
    for k, v in a.critics.state_dict().items():
        assert torch.equal(v, b.critics.state_dict()[k]), k
    for k, v in a.actor.state_dict().items():
        assert torch.equal(v, b.actor.state_dict()[k]), k
    nb = batch(K=3, seed=4)
    ta = a.learn(nb, torch.ones(3, 8))
    tb = b.learn(nb, torch.ones(3, 8))                           # the learner's generator is in the state too
    assert torch.equal(ta, tb) and a.updates == b.updates == 8
    assert torch.equal(params(a.actor), params(b.actor)) and a.alpha == b.alpha


def test_acting_uses_the_running_statistics_and_pickles():
    a = algo(learning_starts=0)
    a.learn(batch(K=4), torch.ones(4, 8))
    pol = pickle.loads(pickle.dumps(a.make_policy(seed=3)))
    obs = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    with torch.no_grad():
        mean, _ = a.actor(torch.from_numpy(obs))                # train=False: the running statistics
    np.testing.assert_allclose(pol.act_deterministic(obs), np.tanh(mean.numpy()) * 2.0, rtol=1e-5, atol=1e-6)
    before = {k: v.clone() for k, v in pol.net.state_dict().items()}
    env_a, stored = pol.act(obs, a.exploration(10))
    assert np.abs(stored).max() <= 1.0 and np.abs(env_a).max() <= 2.0
    np.testing.assert_allclose(env_a, stored * 2.0, rtol=1e-6, atol=1e-6)
    for k, v in pol.net.state_dict().items():
        assert torch.equal(v, before[k]), k                     # acting never moves them
    fresh = algo().make_policy(seed=0)
    fresh.load(a.policy_state())
    np.testing.assert_array_equal(fresh.act_deterministic(obs), pol.act_deterministic(obs))


@pytest.mark.parametrize("over, words", [({"policy_delay": 0}, "policy_delay"),
                                         ({"batch_norm_momentum": 1.0}, "batch_norm_momentum"),
                                         ({"renorm_warmup_steps": -1}, "renorm_warmup_steps"),
                                         ({"adam_beta1": 1.0}, "adam_beta1"), ({"ent_coef": "x"}, "ent_coef")])
def test_bad_settings_are_one_line(over, words):
    with pytest.raises(UsageError, match=words):
        make_config("crossq", "Pendulum-v1", over)


def test_presets_are_sbx_and_zoo():
    d = make_config("crossq", "Walker2d-v5")
    assert (d.net_arch, d.qf_arch, d.policy_delay, d.learning_starts, d.lr) == ([256, 256], [2048, 2048], 3, 5000, 1e-3)
    p = make_config("crossq", "Pendulum-v1")
    assert (p.steps, p.policy_delay, p.qf_arch, p.learning_starts, p.batch_size) == (20_000, 2, [256, 256], 100, 256)
    o = make_config("crossq", "MountainCarContinuous-v0")        # the default entry: SBX's defaults
    assert (o.qf_arch, o.policy_delay, o.batch_norm_momentum, o.renorm_warmup_steps, o.adam_beta1) == \
        ([1024, 1024], 3, 0.99, 100_000, 0.5)


def test_discrete_actions_are_refused():
    with pytest.raises(UsageError, match="use (.*, )?dqn"):
        hetrl.train("crossq", "CartPole-v1", plan="none", steps=10, progress=False)


@pytest.mark.slow
@pytest.mark.timeout(900)   # three members: about a minute of CPU, several on a machine other jobs load
def test_learns_pendulum_on_a_small_budget(tmp_path):
    """Small networks and batches, a high learning rate, 3k env steps, three seeds trained as one population and
    judged by their median: one seed's trajectory changes with the CPU's GEMM rounding (seed 0 scores -591 on one
    AMD EPYC where seeds 1-3 score -150, -122 and -123), the median of three does not hang on one of them. The
    preset's 20k on seeds 0-2 is in docs/extending.md. A random policy scores about -1200."""
    pop = hetrl.train("crossq", "Pendulum-v1", seeds=3, out=tmp_path / "pop", steps=3000, learning_starts=500,
                      net_arch=[64, 64], qf_arch=[64, 64], batch_size=64, lr=3e-3, eval_episodes=5, threads=1,
                      plan="none", progress=False)
    returns = sorted(r.result["eval_return_mean"] for r in pop.runs)
    assert len(returns) == 3 and returns[1] > -400, returns
