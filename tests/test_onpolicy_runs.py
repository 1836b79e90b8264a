"""On-policy runs: whole rollouts under every schedule, reproducibility, target_kl, normalisation statistics in
checkpoints and evaluation, resume, and PPO learning CartPole (median of seeds)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

import hetrl
from hetrl.checkpoint import read_checkpoint

TINY = dict(num_envs=4, n_steps=16, batch_size=32, n_epochs=2, net_arch=[16, 16], eval_episodes=0, threads=1,
            plan="none", progress=False)


def params(run) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in run.algo.opt.params])


@pytest.mark.parametrize("algo,env", [("ppo", "CartPole-v1"), ("ppo", "Pendulum-v1"), ("a2c", "CartPole-v1")])
def test_same_seed_same_run_bit_for_bit(algo, env):
    settings = TINY if algo == "ppo" else {k: v for k, v in TINY.items() if k not in ("n_epochs", "batch_size")}
    a = hetrl.train(algo, env, steps=256, seed=3, **settings)
    b = hetrl.train(algo, env, steps=256, seed=3, **settings)
    c = hetrl.train(algo, env, steps=256, seed=4, **settings)
    assert torch.equal(params(a), params(b)) and not torch.equal(params(a), params(c))
    assert a.result["gradient_steps"] == b.result["gradient_steps"] > 0


def test_a_run_collects_whole_rollouts_as_sb3_learn_does():
    """A rollout is 16 x 4 = 64 env steps, learned in 2 epochs of 2 minibatches: 200 env steps asked for
    are 4 rollouts (the last passes 200, as SB3's learn does), 16 gradient steps, no policy lag."""
    run = hetrl.train("ppo", "CartPole-v1", steps=200, seed=0, **TINY)
    r = run.result
    assert r["env_steps"] == 256 and r["gradient_steps"] == 4 * 2 * 2
    assert r["policy_lag_max"] == 0 and r["params_version"] >= 4
    assert set(run.schedule.core.train_stats()) >= {"policy_gradient_loss", "value_loss", "entropy_loss", "approx_kl",
                                                     "clip_fraction", "loss", "explained_variance"}


def test_target_kl_ends_a_phase_early():
    full = hetrl.train("ppo", "CartPole-v1", steps=256, seed=0, **{**TINY, "n_epochs": 8})
    early = hetrl.train("ppo", "CartPole-v1", steps=256, seed=0, target_kl=1e-6, **{**TINY, "n_epochs": 8})
    assert full.result["gradient_steps"] == 4 * 8 * 2
    assert 4 <= early.result["gradient_steps"] < full.result["gradient_steps"] // 2


def test_a_minibatch_size_that_does_not_divide_the_rollout_gives_a_smaller_last_one():
    run = hetrl.train("ppo", "CartPole-v1", steps=60, seed=0, **{**TINY, "num_envs": 3, "n_steps": 10,
                                                                  "batch_size": 8})
    # 2 rollouts of 30 rows x 2 epochs x (3 minibatches of 8 rows and one of 6)
    assert run.result["env_steps"] == 60 and run.result["gradient_steps"] == 2 * 2 * 4


def test_normalisation_statistics_are_checkpointed_resumed_and_used_at_evaluation(tmp_path):
    out = tmp_path / "run"
    settings = {**TINY, "normalize_obs": True, "normalize_reward": True, "clip_obs": 5.0}
    run = hetrl.train("ppo", "Pendulum-v1", steps=128, seed=0, out=out, **settings)
    norm = run.algo.policy.norm
    assert float(norm.count) == pytest.approx(128 + 1e-4)            # every observation of both rollouts
    ckpt = read_checkpoint(out)
    for k in ("norm.mean", "norm.var", "norm.count"):
        assert f"policy.{k}" in ckpt["algo"]["policy"] or k in ckpt["algo"]["policy"]
    assert ckpt["algo"]["ret_count"] > 1 and ckpt["algo"]["returns"].shape == (4,)
    # the saved policy normalises raw observations with the run's statistics, as the trained one does
    obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32) * 3
    pol = hetrl.load(out)
    np.testing.assert_array_equal(pol.act(obs), run.last_policy.act(obs))
    with torch.no_grad():
        want = run.algo.policy(torch.as_tensor(obs)).clamp(-2, 2).numpy()
        raw = run.algo.policy.action_net(run.algo.policy.body(torch.as_tensor(obs))).clamp(-2, 2).numpy()
    np.testing.assert_allclose(pol.act(obs), want, rtol=1e-6)
    assert not np.allclose(want, raw)
    resumed = hetrl.api.resume(out, steps=256, progress=False, evaluate_episodes=0)
    assert resumed.result["env_steps"] == 256
    assert float(resumed.algo.policy.norm.count) == pytest.approx(256 + 1e-4)
    assert float(resumed.algo.ret_count) > float(ckpt["algo"]["ret_count"])


class Episodes:
    """The episodes of each phase, as (env, return, length): each says its env (actor a's env j: 2a + j)."""

    def __init__(self):
        self.phases = []

    def phase(self, run, eps):
        self.phases.append([(e.env, float(e[0]), e[1]) for e in eps])


@pytest.mark.parametrize("schedule", ["local", "ray"])
def test_local_and_ray_run_ppo_in_lockstep(schedule, tmp_path, request):
    if schedule == "ray":
        request.getfixturevalue("local_ray")   # conftest.py's: one Ray per test process
    seen = Episodes()
    run = hetrl.train("ppo", "CartPole-v1", steps=256, seed=0, schedule=schedule, actors=2, out=tmp_path / "r",
                      callback=seen, **{**TINY, **({"ray_actor_cpus": 0.5} if schedule == "ray" else {})})
    r = run.result
    assert r["schedule"] == schedule and r["actors"] == 2 and r["envs_per_actor"] == 2
    assert r["env_steps"] == 256 and r["gradient_steps"] == 4 * 2 * 2 and r["policy_lag_max"] == 0
    assert r["reproducible"] is True
    assert {e[0] for eps in seen.phases for e in eps} == {0, 1, 2, 3}   # every env stepped and said so
    # every actor collects its share (16 vector steps) of each rollout: no episode of the k-th phase is longer
    for k, eps in enumerate(seen.phases, 1):
        assert all(length <= 16 * k for _, _, length in eps), (k, eps)
    # the same seed, the same run: a local run again (ray: the same rollouts and updates as local's), the same
    # episodes in each phase
    again_seen = Episodes()
    again = hetrl.train("ppo", "CartPole-v1", steps=256, seed=0, schedule="local", actors=2, callback=again_seen,
                        **TINY)
    assert torch.equal(params(run), params(again))
    assert seen.phases == again_seen.phases
    # the checkpoint resumes inline
    resumed = hetrl.api.resume(tmp_path / "r", steps=320, schedule="inline", progress=False, evaluate_episodes=0)
    assert resumed.result["env_steps"] == 320 and resumed.result["gradient_steps"] == 5 * 2 * 2


def test_actors_that_do_not_split_the_envs_are_refused():
    from hetrl.errors import UsageError

    with pytest.raises(UsageError, match="actors x envs_per_actor"):
        hetrl.train("ppo", "CartPole-v1", steps=64, schedule="local", actors=3, **TINY)


def test_ppo_learns_cartpole_median_of_three_seeds():
    """The zoo's preset (8 envs x 32 steps, 20 epochs, batch 256, linear lr and clip) on 10k env steps: random
    play scores about 20, the preset reaches 500 at 100k; the median of the best policies re-evaluated is far
    above random after a tenth of it."""
    got = []
    for seed in range(3):
        run = hetrl.train("ppo", "CartPole-v1", steps=10_000, seed=seed, plan="none", progress=False, threads=1,
                          eval_interval=2560, eval_episodes=5)
        got.append(run.result["eval_return_mean"])
    assert statistics.median(got) >= 120, got


@pytest.mark.parametrize("algo,env", [("ppo", "CartPole-v1"), ("a2c", "Pendulum-v1")])
def test_population_member_i_is_the_run_of_seed_i(algo, env, tmp_path, monkeypatch):
    """Members act in one vector env with their policies stacked and learn their own rollouts: each equals its
    own inline run (a sweep over a learning setting too)."""
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path / "cache"))
    settings = TINY if algo == "ppo" else {**{k: v for k, v in TINY.items() if k not in ("n_epochs", "batch_size")},
                                           "normalize_obs": True, "normalize_reward": True}
    pop = hetrl.train(algo, env, seeds=[0, 5], steps=200, out=tmp_path / "pop", **settings)
    for member, run in zip(pop.members, pop.runs):
        alone = hetrl.train(algo, env, seed=member.seed, steps=200, **settings)
        assert run.result["env_steps"] == alone.result["env_steps"] == 256
        assert run.algo.updates == alone.algo.updates > 0
        torch.testing.assert_close(params(run), params(alone), rtol=1e-5, atol=1e-6)
    sweep = hetrl.train(algo, env, seeds=[0], sweep={"ent_coef": [0.0, 0.01]}, steps=128, out=tmp_path / "sw",
                        **settings)
    assert [r.cfg.ent_coef for r in sweep.runs] == [0.0, 0.01]


def test_the_planner_prices_an_on_policy_phase_and_plans_it(tmp_path, monkeypatch):
    """The model prices a rollout as every other phase (train_freq env steps, gradient_steps of batch_size), with
    the actors waiting for the learner (lockstep) and each actor collecting its share of the rollout."""
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path))
    from hetrl.config import make_config
    from hetrl.planner import plan
    from hetrl.planner.model import Plan, Workload, _chunk, learner_group, predict
    from hetrl.planner.profile import run_profile

    cfg = make_config("ppo", "CartPole-v1", {"net_arch": [16], "threads": 1})
    work = Workload.from_config(cfg, allow_more_envs=True)
    assert work.rollout and not work.overlap and not work.prefetch and work.num_envs == 8   # the rollout's envs kept
    local = Plan(schedule="local", actors=2, envs_per_actor=4, batch_size=cfg.batch_size)
    assert _chunk(local, work) == 128 and learner_group(local, work) == 20   # the phase: 20 epochs of 1
    table = run_profile(cfg, devices=["cpu"], quick=True, measure_power=False, ipc=False)
    # (PPO's learn is compiled too: the profile keeps whichever kernel it measured equal and faster)
    assert table.data["learner_kernel"]["cpu"]["name"] in ("public", "compiled") and not table.data["prefetch"]
    pred = predict(local, table, work)
    assert pred.bound in ("lockstep", "cpu") and pred.env_steps_per_s > 0
    result = plan(cfg, profile=table)
    assert result.plan.num_envs == 8 and result.predicted_env_steps_per_s > 0
    new = result.apply(cfg)
    assert new.train_freq == 256 and new.gradient_steps == cfg.gradient_steps and new.n_steps == cfg.n_steps
