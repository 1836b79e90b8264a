"""The compiled DQN phase (hetrl/algos/compiled.py) equals the public path (autograd + fused Adam)."""

import dataclasses

import gymnasium as gym
import pytest
import torch

from hetrl.algos import compiled, make_algorithm
from hetrl.config import make_config

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba/scipy not installed")

SPACES = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))


def _pair(**overrides):
    torch.manual_seed(0)
    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [32, 16], "max_grad_norm": 0.5, **overrides})
    fast = make_algorithm(dataclasses.replace(cfg, compiled=True), *SPACES)
    ref = make_algorithm(cfg, *SPACES)
    assert fast.compiled_phase and not ref.compiled_phase
    for name in ("q", "q_target"):
        getattr(ref, name).load_state_dict(getattr(fast, name).state_dict())
    return fast, ref


def _batches(K, B, seed):
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(K, B, 4, generator=g), "action": torch.randint(0, 3, (K, B), generator=g),
            "reward": torch.randn(K, B, generator=g) * 3, "next_obs": torch.randn(K, B, 4, generator=g),
            "terminated": torch.rand(K, B, generator=g) < 0.2, "truncated": torch.zeros(K, B, dtype=torch.bool),
            "steps": torch.randint(1, 4, (K, B), generator=g).to(torch.uint8)}


@pytest.mark.parametrize("double", [False, True])
def test_compiled_phase_equals_public_path(double):
    """Three phases of 20 updates (importance weights, an active gradient clip, a target update
    between phases): the same TD errors, parameters and Adam state within float tolerance."""
    fast, ref = _pair(double=double)
    for phase in range(3):
        b, w = _batches(20, 16, phase), torch.rand(20, 16, generator=torch.Generator().manual_seed(9 + phase))
        torch.testing.assert_close(fast.learn(b, w), ref.learn(b, w), rtol=1e-5, atol=1e-5)
        fast.on_env_steps(0, 10_000)
        ref.on_env_steps(0, 10_000)
    for p, q in zip(fast.q.parameters(), ref.q.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    sf, sr = fast.opt.opt.state[fast.opt.param], ref.opt.opt.state[ref.opt.param]
    assert float(sf["step"]) == float(sr["step"]) == 60 and fast.updates == ref.updates == 60
    torch.testing.assert_close(sf["exp_avg"], sr["exp_avg"], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(sf["exp_avg_sq"], sr["exp_avg_sq"], rtol=1e-4, atol=1e-9)


def test_compiled_state_is_torch_adams_state():
    """A checkpoint written after compiled phases resumes on the public path (and back) with the same
    parameters as a run that never switched: one optimizer state, torch.optim.Adam's."""
    fast, ref = _pair()
    b, w = _batches(10, 16, 0), torch.ones(10, 16)
    fast.learn(b, w)
    ref.learn(b, w)
    cfg = dataclasses.replace(ref.cfg, compiled=False)
    resumed = make_algorithm(cfg, *SPACES)
    resumed.load_state_dict(fast.state_dict())
    b2 = _batches(10, 16, 1)
    torch.testing.assert_close(resumed.learn(b2, w), ref.learn(b2, w), rtol=1e-5, atol=1e-5)
    back = make_algorithm(dataclasses.replace(cfg, compiled=True), *SPACES)
    back.load_state_dict(resumed.state_dict())
    b3 = _batches(10, 16, 2)
    torch.testing.assert_close(back.learn(b3, w), ref.learn(b3, w), rtol=1e-5, atol=1e-5)
    for p, q in zip(back.q.parameters(), ref.q.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_compiled_applies_only_to_plain_mlp_dqn_on_cpu():
    cfg = dataclasses.replace(make_config("dqn", "CartPole-v1", {"net_arch": [8]}), compiled=True)
    assert make_algorithm(cfg, *SPACES).compiled_phase
    assert not make_algorithm(dataclasses.replace(cfg, dueling=True), *SPACES).compiled_phase
    ddpg = make_algorithm(dataclasses.replace(make_config("ddpg", "Pendulum-v1", {"net_arch": [8]}), compiled=True),
                          gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)))
    assert not compiled.applies(ddpg)


def test_training_with_the_compiled_phase(tmp_path):
    """A short inline run on the compiled phase trains (every gradient step taken) and saves."""
    import hetrl

    run = hetrl.train("dqn", "CartPole-v1", steps=3000, seed=0, out=tmp_path, progress=False, compiled=True,
                      learning_starts=1000, eval_episodes=2, threads=1)
    assert run.cfg.compiled and run.result["gradient_steps"] >= 1000 and (tmp_path / "checkpoint.pt").exists()
