"""The compiled phases (hetrl/algos/compiled.py) equal the public path (autograd + fused Adam): DQN, DDPG, TD3, SAC."""

import dataclasses
import math

import gymnasium as gym
import pytest
import torch

from hetrl.algos import compiled, make_algorithm
from hetrl.config import make_config

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba/scipy not installed")

SPACES = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))


def _pair(threads=1, **overrides):
    torch.manual_seed(0)
    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [32, 16], "max_grad_norm": 0.5, **overrides})
    fast = make_algorithm(dataclasses.replace(cfg, compiled=True), *SPACES)
    compiled.use_threads(fast, threads)   # the batch's rows split over this many parallel lanes
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


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("double", [False, True])
def test_compiled_phase_equals_public_path(double, threads):
    """Three phases of 20 updates (importance weights, an active gradient clip, a target update
    between phases): the same TD errors, parameters and Adam state within float tolerance, on one
    learner thread and on two parallel lanes."""
    fast, ref = _pair(threads, double=double)
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


def test_compiled_applies_to_plain_mlps_on_cpu():
    cfg = dataclasses.replace(make_config("dqn", "CartPole-v1", {"net_arch": [8]}), compiled=True)
    assert make_algorithm(cfg, *SPACES).compiled_phase
    assert not make_algorithm(dataclasses.replace(cfg, dueling=True), *SPACES).compiled_phase
    assert not make_algorithm(dataclasses.replace(cfg, compiled=False), *SPACES).compiled_phase
    for name in ("ddpg", "td3", "sac"):
        c = dataclasses.replace(make_config(name, "Pendulum-v1", {"net_arch": [8]}), compiled=True)
        assert make_algorithm(c, *AC_SPACES).compiled_phase
        assert not make_algorithm(c, gym.spaces.Box(-1, 1, (2, 3)), AC_SPACES[1]).compiled_phase  # 2-D obs


# ---- actor-critic phases ---------------------------------------------------------------------------
AC_SPACES = (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,)))


def _ac_batches(K, B, seed):
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(K, B, 3, generator=g), "action": torch.rand(K, B, 2, generator=g) * 2 - 1,
            "reward": torch.randn(K, B, generator=g) * 3, "next_obs": torch.randn(K, B, 3, generator=g),
            "terminated": torch.rand(K, B, generator=g) < 0.3, "truncated": torch.zeros(K, B, dtype=torch.bool),
            "steps": torch.randint(1, 3, (K, B), generator=g).to(torch.uint8)}


def _ac_pair(name, threads=1, **overrides):
    cfg = make_config(name, "Pendulum-v1", {"net_arch": [24, 16], "max_grad_norm": 0.5, **overrides})
    torch.manual_seed(0)
    fast = make_algorithm(dataclasses.replace(cfg, compiled=True), *AC_SPACES)
    compiled.use_threads(fast, threads)   # SAC: the batch's rows split over this many parallel lanes
    ref = make_algorithm(cfg, *AC_SPACES)
    assert fast.compiled_phase and not ref.compiled_phase
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["updates"] == sb["updates"]
    for name in a.nets:
        for k in sa[name]:
            torch.testing.assert_close(sa[name][k], sb[name][k], rtol=1e-5, atol=1e-6)
    for name in a.optims:
        (oa,), (ob,) = sa[name]["state"].values(), sb[name]["state"].values()
        assert float(oa["step"]) == float(ob["step"])
        torch.testing.assert_close(oa["exp_avg"], ob["exp_avg"], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(oa["exp_avg_sq"], ob["exp_avg_sq"], rtol=1e-4, atol=1e-9)


def _learn_both(fast, ref, K, seed):
    """One phase on each, with the same torch RNG state (TD3's smoothing noise, SAC's Gaussian noise)."""
    b, w = _ac_batches(K, 16, seed), torch.rand(K, 16, generator=torch.Generator().manual_seed(50 + seed))
    torch.manual_seed(100 + seed)
    got = fast.learn(b, w)
    torch.manual_seed(100 + seed)
    want = ref.learn(b, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, "2 row lanes"])
@pytest.mark.parametrize("name,overrides", [("ddpg", {}), ("td3", {"policy_delay": 3}), ("sac", {}),
                                            ("sac", {"ent_coef": "0.1"}), ("td3", {"max_grad_norm": 0.0})])
def test_actor_critic_phase_equals_public_path(name, overrides, threads):
    """Phases of 7, 1 and 5 steps (a policy delay that spans phases, importance weights, an active gradient
    clip, terminations, n-step discounts): the same priorities, parameters, targets, Adam states, step count
    (and SAC's entropy coefficient) as the autograd path, on one learner thread and on two (the batch's rows
    split over two parallel lanes whose gradients are summed; TD3's critic step: a lane per critic, unless
    `critic_lanes` is off)."""
    fast, ref = _ac_pair(name, 2 if threads == "2 row lanes" else threads, **overrides)
    fast.critic_lanes = threads != "2 row lanes"
    for seed, K in enumerate((7, 1, 5)):
        _learn_both(fast, ref, K, seed)
    _same_state(fast, ref)
    assert fast.updates == 13
    if name == "td3":
        assert fast.lane_split == ("critics" if threads == 2 else "rows")
    if name == "sac":
        got, want = float(fast.log_alpha.detach()), float(ref.log_alpha.detach())
        assert got == pytest.approx(want, abs=1e-6)
        if "ent_coef" in overrides:
            assert got == pytest.approx(math.log(float(overrides["ent_coef"])))  # fixed: never moves
        else:
            assert abs(got) > 1e-4  # learned from alpha = 1


@pytest.mark.parametrize("name", ["td3", "sac"])
def test_actor_critic_checkpoint_switches_between_paths(name):
    """compiled -> public -> compiled through checkpoints equals a run that stayed on the public path."""
    fast, ref = _ac_pair(name)
    _learn_both(fast, ref, 4, 0)
    cfg = dataclasses.replace(ref.cfg, compiled=False)
    public = make_algorithm(cfg, *AC_SPACES)
    public.load_state_dict(fast.state_dict())
    _learn_both(public, ref, 3, 1)
    back = make_algorithm(dataclasses.replace(cfg, compiled=True), *AC_SPACES)
    back.load_state_dict(public.state_dict())
    _learn_both(back, ref, 3, 2)
    _same_state(back, ref)


def test_a_per_parameter_adam_checkpoint_loads_into_the_flat_optimizer():
    """TD3/SAC checkpoints written before their flat buffers (torch.optim.Adam over each parameter) resume with
    the same moments: the flat optimizer's state is their concatenation."""
    fast, ref = _ac_pair("td3", policy_delay=1)
    _learn_both(fast, ref, 3, 0)
    per = torch.optim.Adam(ref.critics.parameters(), lr=ref.cfg.lr)
    flat_state = ref.critic_opt.state_dict()["state"][0]
    sizes = [p.numel() for p in ref.critics.parameters()]
    for p, m, v in zip(ref.critics.parameters(), flat_state["exp_avg"].split(sizes), flat_state["exp_avg_sq"].split(sizes)):
        per.state[p] = {"step": flat_state["step"].clone(), "exp_avg": m.view_as(p).clone(),
                        "exp_avg_sq": v.view_as(p).clone()}
    state = ref.state_dict()
    state["critic_opt"] = per.state_dict()
    old = make_algorithm(ref.cfg, *AC_SPACES)
    old.load_state_dict(state)
    _same_state(old, ref)


def test_training_with_the_compiled_phase(tmp_path):
    """A short inline run on the compiled phase trains (every gradient step taken) and saves."""
    import hetrl

    run = hetrl.train("dqn", "CartPole-v1", plan="none", steps=3000, seed=0, out=tmp_path, progress=False, compiled=True,
                      learning_starts=1000, eval_episodes=2, threads=1)
    assert run.cfg.compiled and run.result["gradient_steps"] >= 1000 and (tmp_path / "checkpoint.pt").exists()
    assert run.result["learner_kernel"] == "compiled"
    assert run.result["sgemm"] in ("openblas", "mkl")   # the GEMM its products ran on (algos/sgemm.py)


@pytest.mark.parametrize("name", ["dqn", "ddpg", "td3", "sac"])
def test_compiled_acting_equals_the_torch_forward(name):
    """A policy's compiled forward (compiled.Acting) gives the torch forward's actions, greedy/mean and
    exploring (same noise), after weights are loaded, and after the policy is pickled to another process."""
    import pickle

    import numpy as np

    spaces = SPACES if name == "dqn" else AC_SPACES
    env = "CartPole-v1" if name == "dqn" else "Pendulum-v1"
    cfg = make_config(name, env, {"net_arch": [24, 16], "compiled": True})
    torch.manual_seed(0)
    algo = make_algorithm(cfg, *spaces)
    fast, ref = algo.make_policy(seed=3, num_envs=5), algo.make_policy(seed=3, num_envs=5)
    ref.fast = None
    assert isinstance(fast.fast, compiled.Acting)
    obs = np.random.default_rng(0).standard_normal((5, spaces[0].shape[0])).astype(np.float32)

    def same(p, q):
        np.testing.assert_allclose(p.act_deterministic(obs), q.act_deterministic(obs), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(p.act(obs, 0.3)[1], q.act(obs, 0.3)[1], rtol=1e-5, atol=1e-6)

    same(fast, ref)
    with torch.no_grad():   # new weights, as the learner publishes them
        for p in (algo.q if name == "dqn" else algo.actor).parameters():
            p.add_(torch.randn_like(p) * 0.3)
    state = {k: v.clone() for k, v in algo.policy_state().items()}
    moved = pickle.loads(pickle.dumps(fast))
    for p in (fast, ref, moved):
        p.load(state)
    same(fast, ref)
    moved.rng, ref.rng = np.random.default_rng(9), np.random.default_rng(9)
    same(moved, ref)


def test_compiled_acting_applies_to_plain_mlps_only():
    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [8], "compiled": True, "dueling": True})
    assert make_algorithm(cfg, *SPACES).make_policy(seed=0).fast is None
    plain = make_algorithm(dataclasses.replace(cfg, dueling=False), *SPACES)
    assert plain.make_policy(seed=0).fast is not None
    assert make_algorithm(dataclasses.replace(cfg, dueling=False, compiled=False), *SPACES).make_policy(seed=0).fast is None


def test_load_weights_copies_a_twin_state_and_refuses_another():
    from hetrl.algos.nets import load_weights, mlp

    a, b = mlp([3, 4, 2]), mlp([3, 4, 2])
    load_weights(b, a.state_dict())
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y) and x.data_ptr() != y.data_ptr()
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_weights(b, mlp([3, 5, 2]).state_dict())


def test_the_warm_up_keeps_torchs_thread_count():
    """numba's parallel regions share torch's OpenMP runtime: their first launch in a process (the warm-up's) set
    the count torch reads to numba's, so a caller that had set torch to one thread (a benchmark, a user's script)
    ran torch's ops on every core."""
    import os
    import subprocess
    import sys

    code = ("import torch; torch.set_num_threads(1); from hetrl.algos import compiled; before = torch.get_num_threads(); "
            "compiled.warm_up('td3'); compiled.warm_up('sac'); compiled.warm_up('dqn'); print(before, torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "NUMBA_NUM_THREADS": "2"})
    assert out.stdout.split() == ["1", "1"]
