"""The local schedule (hetrl/runtime/local.py): shared memory, parameter store, actor staging,
rate limiter, priorities, actor death and errors.  Tiny nets and budgets; no timing asserts.
Life-cycle tests with real signals are in test_local_lifecycle.py."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

import hetrl
from hetrl.api import Run
from hetrl.config import make_config
from hetrl.errors import HetrlError, UsageError
from hetrl.replay import BatchGroups, ReplayBuffer
from hetrl.runtime.layout import layout
from hetrl.runtime.shm import SharedArrays


# ---- env factories the actor processes import from this module ----------------------------------
class _Slow(gym.Wrapper):
    def __init__(self, env, dt):
        super().__init__(env)
        self.dt = dt

    def step(self, action):
        time.sleep(self.dt)
        return self.env.step(action)


class _Fails(gym.Wrapper):
    def __init__(self, env, after):
        super().__init__(env)
        self.n, self.after = 0, after

    def step(self, action):
        self.n += 1
        if self.n > self.after:
            raise RuntimeError(f"boom: the env broke at step {self.n}")
        return self.env.step(action)


def slow_cartpole():
    return _Slow(gym.make("CartPole-v1"), 0.002)


def failing_cartpole():
    return _Fails(gym.make("CartPole-v1"), after=40)


@pytest.fixture
def local(tiny):
    return {**tiny, "schedule": "local", "actors": 1, "envs_per_actor": 4}


def cfg_of(settings, env="CartPole-v1", algo="dqn"):
    return make_config(algo, env, settings)


def run_phases(s, until=None):
    while not s.done():
        s.phase()
        if until is not None and until(s):
            return


# ---- shared memory and the parameter store ------------------------------------------------------
def test_shared_arrays_have_no_name():
    block = SharedArrays({"a": ((3, 4), "float32"), "b": ((5,), "int64")})
    block["a"][:] = 1.5
    assert block["a"].sum() == 18 and block["b"].dtype == np.int64
    assert block["b"].ctypes.data % 64 == 0
    target = os.readlink(f"/proc/self/fd/{block._fd}")
    assert target.startswith("/memfd:") or "(deleted)" in target  # nothing named in /dev/shm
    block.close()


@pytest.mark.parametrize("prioritized", [False, True])
def test_batch_source_draws_what_replay_sample_draws(prioritized):
    spec = {"obs": ((3,), "float32"), "action": ((), "int64")}
    a = ReplayBuffer(100, spec, prioritized=prioritized, seed=5)
    b = ReplayBuffer(100, spec, prioritized=prioritized, seed=5)
    data = {"obs": np.arange(240, dtype=np.float32).reshape(80, 3), "action": np.arange(80)}
    for r in (a, b):
        r.insert(data)
        if prioritized:
            r.update_priorities(np.arange(80), np.linspace(0.1, 5, 80))
    src = BatchGroups(b, spec, 8, 4, preallocate=True)
    for g in (4, 2, 4):
        batch, keys, w = a.sample(g * 8)
        stack, keys2, w2 = src.draw(g)
        np.testing.assert_array_equal(keys, keys2)
        torch.testing.assert_close(w.view(g, 8), w2)
        for k in spec:
            assert torch.equal(batch[k].view(g, 8, *batch[k].shape[1:]), stack[k])


# ---- whole runs ---------------------------------------------------------------------------------
def test_local_run_result_checkpoint_and_resume(local, tmp_path):
    out = tmp_path / "run"
    run = hetrl.train("dqn", "CartPole-v1", plan="none", out=out, progress=False, save_replay=True, **local)
    res = run.result
    for key in ("schedule", "actors", "envs_per_actor", "actor_busy_fraction", "learner_busy_fraction",
                "policy_staleness_mean", "replay_ratio_achieved", "env_steps_per_s", "train_samples_per_s"):
        assert key in res, key
    assert res["schedule"] == "local" and res["actors"] == 1 and res["envs_per_actor"] == 4
    assert res["env_steps"] == 600
    # the rate limiter gives exactly the preset's replay ratio: (600 - learning_starts) x 10/100 steps
    assert res["gradient_steps"] == 40
    assert 0 < res["learner_busy_fraction"] <= 1 and 0 < res["actor_busy_fraction"] <= 1
    assert res["policy_staleness_mean"] >= 0 and res["actor_restarts"] == 0
    assert run.schedule.actor_pids() == []  # actors stopped when the run finished
    # resume: counters, optimizer and replay continue; actors restart with new seeds
    again = hetrl.api.resume(out, steps=1000, progress=False, evaluate_episodes=0)
    assert again.result["env_steps"] == 1000 and again.result["gradient_steps"] == 80
    assert len(again.schedule.replay) == 1000


def test_two_actors_and_cli_flags(tmp_path, capsys):
    from hetrl.cli import main

    out = tmp_path / "cli"
    code = main(["train", "dqn", "--env", "CartPole-v1", "--plan", "none", "--schedule", "local", "--actors", "2",
                 "--envs-per-actor", "2", "--steps", "800", "--out", str(out), "--no-progress",
                 "--set", "learning_starts=200", "--set", "train_freq=100", "--set", "gradient_steps=10",
                 "--set", "batch_size=32", "--set", "buffer_size=1000", "--set", "net_arch=[32,32]",
                 "--set", "eval_episodes=0", "--set", "threads=1"])
    assert code == 0
    import json

    res = json.loads((out / "result.json").read_text())
    assert (res["schedule"], res["actors"], res["envs_per_actor"], res["env_steps"]) == ("local", 2, 2, 800)
    assert res["gradient_steps"] == 60


@pytest.mark.parametrize("switch", ["overlap", "batched_insert", "prefetch", "actor_one_thread", "preallocate"])
def test_each_optimisation_can_be_switched_off(local, switch):
    run = hetrl.train("dqn", "CartPole-v1", plan="none", progress=False, **{**local, switch: False})
    assert run.result["optimisations"][switch] is False
    assert run.result["env_steps"] == 600 and run.result["gradient_steps"] == 40


def test_without_rate_limit_the_run_ends_with_the_data(local):
    run = hetrl.train("dqn", "CartPole-v1", plan="none", progress=False, **{**local, "rate_limit": False, "reproducible": False})
    assert run.result["env_steps"] == 600 and run.result["gradient_steps"] > 0


def test_lambda_env_is_a_usage_error(local):
    with pytest.raises(UsageError, match="module-level function"):
        hetrl.train("dqn", lambda: gym.make("CartPole-v1"), plan="none", progress=False, **local)


def test_actor_error_surfaces_in_parent(local):
    with pytest.raises(HetrlError, match="boom: the env broke") as info:
        hetrl.train("dqn", failing_cartpole, plan="none", progress=False, **local)
    assert "actor 0 failed: RuntimeError" in str(info.value) and "Traceback" in str(info.value)


def late_failing_cartpole():
    return _Fails(gym.make("CartPole-v1"), after=150)


def test_run_closes_its_schedule_and_keeps_its_work_on_an_error(local, tmp_path):
    """An env error mid-run: the error is raised with the env's traceback, the checkpoint of what was
    learned and result.json are written first, and no actor process is left."""
    import json

    out = tmp_path / "run"
    run = Run(cfg_of({**local, "steps": 2000, "insert_chunk": 100}), late_failing_cartpole, out)
    pids = run.schedule.actor_pids()
    with pytest.raises(HetrlError, match="boom"):
        run.learn(progress=False)
    res = json.loads((out / "result.json").read_text())
    assert res["interrupted"].startswith("error: HetrlError") and res["env_steps"] > 0
    assert (out / "checkpoint.pt").is_file() and run.schedule.actor_pids() == []
    for pid in pids:
        with pytest.raises(OSError):
            os.kill(pid, 0)


@pytest.mark.parametrize("schedule", ["inline", "local"])
def test_every_actor_setting_reaches_the_actors(tiny, schedule):
    """env_backend (and n-step, seeds, the policy) travel in one ActorSpec under every schedule:
    asking EnvPool for an env it cannot make ('module:EnvId' ids are Gymnasium's) fails in the actor,
    under local too."""
    settings = {**tiny, "schedule": schedule, "env_backend": "envpool"}
    if schedule == "local":
        settings.update(actors=1, envs_per_actor=4)
    with pytest.raises(UsageError, match="env_backend=envpool"):
        hetrl.train("dqn", "gymnasium:CartPole-v1", plan="none", progress=False, **settings)


def test_a_checkpoint_resumes_under_another_schedule(tiny, tmp_path):
    """One checkpoint format: a run saved inline continues under local (and back), replay included."""
    out = tmp_path / "run"
    hetrl.train("dqn", "CartPole-v1", plan="none", out=out, progress=False, save_replay=True, **tiny)
    first = torch.load(out / "checkpoint.pt", weights_only=True)
    run = hetrl.api.resume(out, steps=1000, progress=False, evaluate_episodes=0, schedule="local", actors=1,
                           envs_per_actor=4)
    assert run.result["schedule"] == "local" and run.result["env_steps"] == 1000
    assert run.result["gradient_steps"] == (1000 - 200) // 10  # the preset's ratio over the whole run
    second = torch.load(out / "checkpoint.pt", weights_only=True)
    assert second["config"]["schedule"] == "local" and second["config"]["lr"] == first["config"]["lr"]
    assert float(second["algo"]["opt"]["state"][0]["step"]) == second["counters"]["gradient_steps"]
    run = hetrl.api.resume(out, steps=1400, progress=False, evaluate_episodes=0, schedule="inline")
    assert run.result["schedule"] == "inline" and run.result["env_steps"] == 1400
    with pytest.raises(UsageError, match="lr cannot change"):
        hetrl.api.resume(out, steps=2000, progress=False, lr=0.5)


def test_killed_actor_is_replaced_and_the_run_finishes(local, capfd):
    cfg = cfg_of({**local, "steps": 2400, "actors": 2, "envs_per_actor": 2})
    run = Run(cfg, slow_cartpole)   # 2 ms an env step: the actors cannot collect the whole run before the kill
    s = run.schedule
    victim = None
    try:
        while not s.done():
            s.phase()
            if victim is None and s.c.env_steps >= 600:
                victim = s.actor_pids()[0]
                os.kill(victim, signal.SIGKILL)
                deadline = time.monotonic() + 10  # dead before the next phase, so the run cannot end first
                while victim in s.actor_pids() and time.monotonic() < deadline:
                    time.sleep(0.01)
        assert s.c.restarts == 1 and s.figures()["actor_restarts"] == 1
        assert s.c.env_steps == 2400
        assert s.c.gradient_steps == (2400 - 200) // 10
        _, err = capfd.readouterr()
        assert f"(pid {victim}) was killed by signal 9; starting a new one" in err
    finally:
        s.close()
    with pytest.raises(OSError):
        os.kill(victim, 0)


# ---- rate limiter ---------------------------------------------------------------------------------
def check_trace(s):
    rule = s.core.ratio.rule
    assert s.trace, "no trace"
    for inserts, samples in s.trace:
        diff = inserts * rule.samples_per_insert - samples
        assert diff <= rule.max_diff + 1e-9, (inserts, samples)
        if samples:
            assert diff >= rule.min_diff - 1e-9, (inserts, samples)
    # at the end the learner owes less than one batch: the preset's ratio
    inserts, samples = s.trace[-1]
    owed = inserts * rule.samples_per_insert - samples - rule.samples_per_insert * rule.min_size_to_sample
    assert 0 <= owed < s.cfg.batch_size


def test_rate_limiter_holds_the_ratio_under_a_slow_learner(local):
    cfg = cfg_of({**local, "steps": 1600, "rate_tolerance": 100, "reproducible": False})   # the timed mode's limiter
    run = Run(cfg, "CartPole-v1")
    s = run.schedule
    s.trace = []
    learn = s.core.kernel.learn

    def slow_learn(stack, weights):
        time.sleep(0.003 * weights.shape[0])
        return learn(stack, weights)

    s.core.kernel.learn = slow_learn
    try:
        run_phases(s)
        check_trace(s)
        # the actor was held back: it never got more than the window ahead of the learner (check_trace; a
        # comparison of wait and learn seconds here depended on the machine's load)
        assert s.c.gradient_steps == (1600 - 200) // 10
    finally:
        s.close()


def test_rate_limiter_holds_the_ratio_under_a_slow_actor(local):
    cfg = cfg_of({**local, "steps": 1000, "rate_tolerance": 100, "reproducible": False})
    run = Run(cfg, slow_cartpole)
    s = run.schedule
    s.trace = []
    try:
        run_phases(s)
        check_trace(s)
        assert s.c.gradient_steps == (1000 - 200) // 10
        assert s.c.learner_wait_s > 0   # the learner waited for the slow actor's data
    finally:
        s.close()


def test_rate_tolerance_too_small_is_a_usage_error(local):
    with pytest.raises(UsageError, match="rate_tolerance"):
        layout(cfg_of({**local, "rate_tolerance": 1}))


def test_policy_lag_stays_within_its_bound(local):
    """Two actors, the tightest bound allowed: no chunk arrives with parameters older than the bound,
    and the run still finishes with the preset's replay ratio."""
    two = {**local, "actors": 2, "envs_per_actor": 2, "steps": 1600, "reproducible": False}   # the timed mode's bound
    lay = layout(cfg_of(two))
    least = lay.publish_every + lay.group
    assert lay.max_lag > least   # auto leaves room for one actor's double buffer
    run = Run(cfg_of({**two, "max_policy_lag": least}), "CartPole-v1")
    s = run.schedule
    try:
        run_phases(s)
        f = s.figures()
        assert f["policy_lag_bound"] == least
        assert 0 <= f["policy_lag_mean"] <= f["policy_lag_max"] <= least
        assert s.c.gradient_steps == (1600 - 200) // 10
    finally:
        s.close()


def test_policy_lag_below_one_publication_is_a_usage_error(local):
    with pytest.raises(UsageError, match="max_policy_lag=1 .* use at least"):
        layout(cfg_of({**local, "max_policy_lag": 1}))


# ---- priorities -----------------------------------------------------------------------------------
def test_learner_priorities_reach_the_tree_and_steer_the_next_samples(local):
    cfg = cfg_of({**local, "steps": 1500, "prioritized": True, "per_alpha": 1.0})
    run = Run(cfg, "CartPole-v1")
    s = run.schedule
    drawn, hot = [], set()
    draw, learn = s._batches.draw, s.core.kernel.learn

    def record_draw(g):
        item = draw(g)
        drawn.append(item[1].copy())
        return item

    calls = {"n": 0}

    def learn_with_hot_keys(stack, weights):
        learn(stack, weights)
        keys = drawn[calls["n"]]  # draws and learns happen in the same order
        if calls["n"] == 0:
            hot.update(int(k) for k in keys)
        calls["n"] += 1
        td = torch.tensor([1000.0 if int(k) in hot else 0.0 for k in keys]).view(weights.shape)
        return td

    s._batches.draw, s.core.kernel.learn = record_draw, learn_with_hot_keys
    try:
        s.phase()
        while calls["n"] == 0:
            s.phase()
        # the learner's |TD| is in the tree the sampler reads
        leaves = s.replay.tree.get(np.array(sorted(hot)))
        np.testing.assert_allclose(leaves, 1000.0 + s.replay.eps)
        run_phases(s)
        later = np.concatenate(drawn[2:])  # draw 1 was prefetched before the update
        frac = np.isin(later, list(hot)).mean()
        share = len(hot) / len(s.replay)
        assert frac > 5 * share, (frac, share)
    finally:
        s.close()


@pytest.mark.parametrize("schedule", ["inline", "local"])
@pytest.mark.parametrize("n_step", [1, 3])
def test_a_run_stops_at_exactly_the_env_steps_asked_for(tiny, schedule, n_step):
    """590 env steps on 4 envs: the last vector step keeps the transitions of its first 2 envs only."""
    settings = {**tiny, "steps": 590, "schedule": schedule, "n_step": n_step}
    if schedule == "local":
        settings.update(actors=2, envs_per_actor=2, insert_chunk=96)
    run = hetrl.train("dqn", "CartPole-v1", plan="none", progress=False, save_replay=False, **settings)
    assert run.result["env_steps"] == 590
    if n_step == 1:  # one transition per env step
        assert len(run.schedule.replay) == 590


def test_the_same_seed_gives_the_same_run_whatever_the_timing(local):
    """Reproducible (the default): the local schedule runs in phases, the actors one phase behind the learner and
    the learner sampling the replay as it stood at a phase boundary, so two runs of one seed give the same
    parameters and evaluations, however the processes were scheduled; a slowed learner changes nothing."""
    def params(run):
        return torch.cat([p.detach().flatten() for p in run.algo.q.parameters()])

    kw = dict(local, steps=1600, actors=2, envs_per_actor=2, eval_episodes=2, eval_interval=400, seed=5)
    a = hetrl.train("dqn", "CartPole-v1", plan="none", progress=False, **kw)
    cfg = cfg_of(kw)
    b = Run(cfg, "CartPole-v1")
    learn = b.schedule.core.kernel.learn

    def slow(stack, weights):   # another timing: the learner takes longer than the actors
        time.sleep(0.01)
        return learn(stack, weights)

    b.schedule.core.kernel.learn = slow
    b.learn(progress=False)
    assert a.result["reproducible"] is True and b.result["reproducible"] is True
    assert torch.equal(params(a), params(b)) and a.result["gradient_steps"] == b.result["gradient_steps"]
    assert a.result["evaluations"] == b.evaluations.history and len(b.evaluations.history) >= 4
    timed = hetrl.train("dqn", "CartPole-v1", plan="none", progress=False, **{**kw, "reproducible": False})
    assert timed.result["reproducible"] is False


def test_stopped_and_resumed_with_its_replay_is_the_run_that_never_stopped(local, tmp_path, stop_at, capfd):
    """--save-replay + --resume is exact under the local schedule: at a phase boundary the actors are idle and send
    their state (envs, RNGs, pending n-step transitions, acting policy), which the resumed run's actors take up."""
    kw = dict(local, steps=1600, actors=2, envs_per_actor=2, eval_episodes=2, eval_interval=400, seed=4, n_step=3,
              prioritized=True)
    straight = hetrl.train("dqn", "CartPole-v1", plan="none", progress=False, out=tmp_path / "straight", **kw)
    stopped = hetrl.train("dqn", "CartPole-v1", plan="none", progress=False, out=tmp_path / "stopped", save_replay=True,
                          callback=stop_at(700), **kw)
    assert stopped.interrupted == "callback" and 700 <= stopped.env_steps < 1600
    resumed = hetrl.resume(tmp_path / "stopped", progress=False)
    assert "without the actors' state" not in capfd.readouterr().err
    assert resumed.env_steps == straight.env_steps == 1600
    assert torch.equal(params(straight), params(resumed))
    assert resumed.result["evaluations"] == straight.result["evaluations"] and len(straight.result["evaluations"]) == 4


def params(run):
    return torch.cat([p.detach().flatten() for p in run.algo.q.parameters()])
