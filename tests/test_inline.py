"""The inline schedule: determinism, result.json, checkpoint round trip and resume."""

import json

import numpy as np
import pytest
import torch

import hetrl
from hetrl.checkpoint import read_checkpoint


def params(run):
    return torch.cat([p.detach().flatten() for p in run.algo.q.parameters()])


def test_same_seed_same_result_bit_for_bit(tiny):
    a = hetrl.train("dqn", "CartPole-v1", plan="none", seed=3, progress=False, **tiny)
    b = hetrl.train("dqn", "CartPole-v1", plan="none", seed=3, progress=False, **tiny)
    c = hetrl.train("dqn", "CartPole-v1", plan="none", seed=4, progress=False, **tiny)
    assert torch.equal(params(a), params(b))
    assert not torch.equal(params(a), params(c))
    assert a.result["gradient_steps"] == b.result["gradient_steps"] > 0


@pytest.mark.parametrize("extra", [{"prioritized": True}, {"n_step": 3, "double": True, "dueling": True}])
def test_rainbow_switches_run_deterministically(tiny, extra):
    a = hetrl.train("dqn", "CartPole-v1", plan="none", seed=1, progress=False, **tiny, **extra)
    b = hetrl.train("dqn", "CartPole-v1", plan="none", seed=1, progress=False, **tiny, **extra)
    assert torch.equal(params(a), params(b))


def test_result_json_and_checkpoint(tiny, tmp_path):
    out = tmp_path / "run"
    run = hetrl.train("dqn", "CartPole-v1", plan="none", out=out, progress=False, **{**tiny, "eval_episodes": 2})
    res = json.loads((out / "result.json").read_text())
    for key in ("algo", "env", "seed", "schedule", "env_steps", "gradient_steps", "wall_s", "env_steps_per_s",
                "train_samples_per_s", "eval_return_mean", "eval_return_std", "eval_episodes",
                "hetrl_version", "torch_version"):
        assert key in res, key
    assert res["env_steps"] == 600 and res["eval_episodes"] == 2 and res["schedule"] == "inline"
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["counters"]["env_steps"] == 600 and "opt" in ckpt["algo"]
    assert (out / "progress.csv").exists() and any((out / "tb").iterdir())
    # the saved policy acts like the trained one
    pol = hetrl.load(out)
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_array_equal(pol.act(obs), run.policy.act(obs))
    assert pol.act(obs[0]).shape == ()


def test_progress_rows_and_figures_only_when_a_row_is_due(tiny, tmp_path, monkeypatch):
    """A phase of one env step (train_freq 1) gathers the run's figures only where the logger writes a row (every
    log_interval env steps and at the end), not after every phase."""
    from hetrl.runtime.core import Schedule

    calls = []
    figures = Schedule.figures
    monkeypatch.setattr(Schedule, "figures", lambda self: calls.append(self.c.env_steps) or figures(self))
    out = tmp_path / "run"
    hetrl.train("dqn", "CartPole-v1", plan="none", out=out, progress=False,
                **{**tiny, "num_envs": 1, "train_freq": 1, "gradient_steps": 1, "log_interval": 100})
    rows = (out / "progress.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == [100, 200, 300, 400, 500, 600]
    assert calls[:6] == [100, 200, 300, 400, 500, 600]   # (then result.json's)


def test_resume_continues_counters_optimizer_and_replay(tiny, tmp_path):
    out = tmp_path / "run"
    hetrl.train("dqn", "CartPole-v1", plan="none", out=out, progress=False, save_replay=True, **tiny)
    first = read_checkpoint(out)
    replay = torch.load(out / "replay.pt", weights_only=True)
    run = hetrl.api.resume(out, steps=1000, progress=False, evaluate_episodes=0)
    assert run.result["env_steps"] == 1000
    # the restored replay held the first 600 transitions before the new ones
    assert len(run.schedule.replay) == 1000 and replay is not None
    second = read_checkpoint(out)
    assert second["counters"]["gradient_steps"] > first["counters"]["gradient_steps"]
    step_a = first["algo"]["opt"]["state"][0]["step"]
    step_b = second["algo"]["opt"]["state"][0]["step"]
    assert float(step_b) == float(step_a) + (second["counters"]["gradient_steps"] - first["counters"]["gradient_steps"])


def test_resume_from_checkpoint_equals_uninterrupted_learner_state(tiny, tmp_path):
    """Loading a checkpoint restores the exact learner state (nets, target, optimizer)."""
    out = tmp_path / "run"
    run = hetrl.train("dqn", "CartPole-v1", plan="none", out=out, progress=False, save_replay=True, **tiny)
    again = hetrl.api.Run(run.cfg, "CartPole-v1")
    state = read_checkpoint(out)
    state["replay"] = torch.load(out / "replay.pt", weights_only=True)
    again.schedule.load_state_dict(state)
    assert torch.equal(params(again), params(run))
    assert again.schedule.c.env_steps == 600
    b1, _, _ = run.schedule.replay.sample(8)
    assert len(again.schedule.replay) == len(run.schedule.replay)


def test_env_factory_and_module_id(tiny):
    import gymnasium as gym

    run = hetrl.train("dqn", lambda: gym.make("CartPole-v1"), plan="none", progress=False, **tiny)
    assert run.result["env_steps"] == 600
    run = hetrl.train("dqn", "gymnasium.envs.classic_control.cartpole:CartPole-v1", plan="none", progress=False, **tiny)
    assert run.result["env_steps"] == 600


@pytest.mark.parametrize("algo,env,extra", [("dqn", "CartPole-v1", {"n_step": 3, "prioritized": True}),
                                            ("td3", "Pendulum-v1", {"noise_type": "ou"})],
                         ids=["dqn-nstep-per", "td3-ou-noise"])
def test_stopped_and_resumed_with_its_replay_is_the_run_that_never_stopped(algo, env, extra, tmp_path, stop_at):
    """--save-replay + --resume is exact: the actors' envs and RNGs, the acting policy's noise, the n-step writer's
    pending transitions and the replay's sampler come back as they were, so the resumed run's parameters and
    evaluations are those of a run that never stopped."""
    run = dict(steps=1600, seed=2, plan="none", progress=False, net_arch=[32], batch_size=32, buffer_size=4000,
               learning_starts=300, train_freq=100, gradient_steps=20, threads=1, learner_kernel="public",
               eval_episodes=2, eval_interval=400, num_envs=2, **extra)
    straight = hetrl.train(algo, env, out=tmp_path / "straight", **run)
    stopped = hetrl.train(algo, env, out=tmp_path / "stopped", save_replay=True, callback=stop_at(700), **run)
    assert stopped.interrupted == "callback" and 700 <= stopped.env_steps < 1600
    resumed = hetrl.resume(tmp_path / "stopped", progress=False)
    assert resumed.env_steps == straight.env_steps == 1600
    for a, b in zip(straight.algo.nets, resumed.algo.nets):
        for p, q in zip(getattr(straight.algo, a).parameters(), getattr(resumed.algo, b).parameters()):
            assert torch.equal(p, q), a
    assert resumed.result["evaluations"] == straight.result["evaluations"] and len(straight.result["evaluations"]) == 4
