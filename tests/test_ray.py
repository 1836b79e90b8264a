"""The ray schedule and the replay server, on a real Ray instance started on loopback."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hetrl.replay.server import ReplayServer

ray = pytest.importorskip("ray")

SPEC = {"obs": ((2,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "next_obs": ((2,), "float32"),
        "terminated": ((), "bool"), "truncated": ((), "bool"), "steps": ((), "uint8")}


def batch(n: int, start: int = 0) -> dict:
    i = np.arange(start, start + n)
    return {"obs": np.stack([i, i], 1).astype(np.float32), "action": i % 2, "reward": i.astype(np.float32),
            "next_obs": np.stack([i + 1, i + 1], 1).astype(np.float32), "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool), "steps": np.ones(n, np.uint8)}


# ---- the server in one process ------------------------------------------------------------------------
def test_server_rate_limiter_holds_both_sides():
    s = ReplayServer(1000, SPEC, samples_per_insert=2.0, min_size=10, error_buffer=20.0)
    assert s.sample(1, 4, timeout=0.01) is None          # nothing before min_size
    assert s.insert(batch(10))["inserts"] == 10
    # Reverb's rule: the first min_size inserts only fill (offset 2 x 10 = 20), then each insert
    # allows 2 samples; the sampler may lead by the buffer, 20: 20 samples now, 2 batches of 8
    got = [s.sample(1, 8, timeout=0.01) for _ in range(4)]
    assert sum(g is not None for g in got) == 2 and s.samples == 16
    # inserts may run ahead while inserts x 2 - samples <= offset + buffer = 40
    assert s.insert(batch(10, 10), timeout=0.01) is not None   # 40 - 16 = 24
    assert s.insert(batch(8, 20), timeout=0.01) is not None    # 56 - 16 = 40
    assert s.insert(batch(1, 28), timeout=0.01) is None        # 58 - 16 = 42 > 40: held
    # a waiting insert goes through as soon as the learner samples
    t = threading.Thread(target=lambda: s.sample(1, 8, timeout=1.0))
    t.start()
    assert s.insert(batch(1, 28), timeout=2.0) is not None
    t.join()
    s.close()
    assert s.insert(batch(1), timeout=0.01) is None and s.sample(1, 1, timeout=0.01) is None


def test_server_sample_shapes_and_state_round_trip():
    s = ReplayServer(100, SPEC, prioritized=True, samples_per_insert=1.0, min_size=1, error_buffer=64.0, seed=3)
    s.insert(batch(50))
    stack, keys, weights, counters = s.sample(3, 4)
    assert stack["obs"].shape == (3, 4, 2) and stack["action"].shape == (3, 4)
    assert keys.shape == (12,) and weights.shape == (3, 4) and weights.dtype == np.float32
    assert counters == {"inserts": 50, "samples": 12, "size": 50, "rows": 50}
    t = ReplayServer(100, SPEC, prioritized=True, samples_per_insert=1.0, min_size=1, error_buffer=64.0, seed=9)
    t.load_state_dict(s.state_dict())
    a, b = s.sample(1, 16), t.sample(1, 16)
    np.testing.assert_array_equal(a[1], b[1])              # same tree, same RNG state: same draw


def test_a_sample_waits_for_the_priorities_sent_before_it():
    """Calls to a threaded Ray actor may run in any order: a sample that names the priority updates its
    caller sent before it waits until they are written (the learner core's priority lag holds there too)."""
    s = ReplayServer(100, SPEC, prioritized=True, alpha=1.0, samples_per_insert=100.0, min_size=1, error_buffer=1e6,
                     seed=0)
    s.insert(batch(50))
    _, keys, _, _ = s.sample(1, 8)
    assert s.sample(1, 8, timeout=0.01, after=1) is None          # that update is not in yet
    t = threading.Timer(0.05, s.update_priorities, (keys, np.where(keys == keys[0], 1e6, 0.0)))
    t.start()
    got = s.sample(1, 64, timeout=5.0, after=1)
    t.join()
    assert got is not None and s.stats()["priority_updates"] == 1
    assert (got[1] == keys[0]).mean() > 0.9                        # drawn from the tree that holds the update


@pytest.mark.parametrize("group", [1, 2])
def test_prioritised_replay_gives_the_same_batches_and_priorities_from_the_server(group):
    """The same data, seed and order of draws and priority updates (the order the learner core's priority lag
    imposes under every schedule) give the same keys, weights and priorities from the ray schedule's replay
    server as from the replay buffer of the inline and local schedules: prioritised learning does not depend
    on the schedule."""
    from hetrl.replay import ReplayBuffer

    rb = ReplayBuffer(200, SPEC, prioritized=True, seed=5)
    server = ReplayServer(200, SPEC, prioritized=True, seed=5, samples_per_insert=1e3, min_size=1, error_buffer=1e9)
    for part in (batch(120), batch(80, 120)):
        rb.insert(part)
        server.insert(part)
    B = 16
    for step in range(12):
        beta = 0.4 + 0.05 * step
        _, keys, weights = rb.sample(group * B, beta=beta)
        _, keys_s, weights_s, _ = server.sample(group, B, beta, timeout=1.0, after=step)
        np.testing.assert_array_equal(keys, keys_s)
        np.testing.assert_array_equal(weights.numpy().reshape(group, B), weights_s)
        td = np.abs(np.sin(0.37 * keys + step)) * 10          # the learner's |TD|, the same under both
        rb.update_priorities(keys, td)
        server.update_priorities(keys_s, td)
    np.testing.assert_array_equal(rb.tree.get(np.arange(200)), server.replay.tree.get(np.arange(200)))


# ---- on a real Ray instance ---------------------------------------------------------------------------------
# local_ray: conftest.py's (one Ray per test process, 2 CPUs)
@pytest.mark.ray
def test_learner_priorities_reach_the_servers_sampler(local_ray):
    server = ray.remote(max_concurrency=4)(ReplayServer).remote(
        1000, SPEC, prioritized=True, alpha=1.0, samples_per_insert=100.0, min_size=1, error_buffer=1e6, seed=0)
    ray.get(server.insert.remote(batch(100)))
    stack, keys, weights, _ = ray.get(server.sample.remote(1, 64))
    assert len(set(keys.tolist())) > 20                      # new items: all at max priority
    td = np.where(keys == keys[0], 1e6, 0.0)                 # the learner finds one transition surprising
    ray.get(server.update_priorities.remote(keys, td))
    _, keys2, _, _ = ray.get(server.sample.remote(1, 64))
    assert (keys2 == keys[0]).mean() > 0.9                   # the server's own tree saw it
    ray.kill(server)


@pytest.mark.ray
@pytest.mark.parametrize("schedule", ["inline", "local", "ray"])
def test_the_priority_lag_applies_the_same_under_every_schedule(local_ray, schedule):
    """Prioritised replay is exact under every schedule by default (each batch drawn from a tree that holds
    every earlier batch's priorities: no prefetch under ray or local), and priority_lag relaxes all of them
    alike; the replay ratio is the core's too, the same gradient steps whatever the schedule."""
    import hetrl

    settings = dict(steps=800, learning_starts=200, train_freq=100, gradient_steps=10, batch_size=32, buffer_size=2000,
                    net_arch=[32, 32], num_envs=4, eval_episodes=0, threads=1, prioritized=True)
    if schedule != "inline":
        settings.update(actors=1, envs_per_actor=4, ray_actor_cpus=0.5)
    # (ray's lag 0, the default, is checked on the exact-resume test's run below: one Ray run fewer)
    for lag in (0, 3) if schedule != "ray" else (3,):
        r = hetrl.train("dqn", "CartPole-v1", plan="none", seed=0, schedule=schedule, priority_lag=lag, progress=False,
                        evaluate_episodes=0, **settings).result
        assert r["priority_lag"] == lag and 0 <= r["priority_lag_max"] <= lag, r
        assert r["gradient_steps"] == (r["env_steps"] - 200) // 10
        if lag:   # batches drawn two at a time ((lag + 1) // 2), under every schedule
            assert r["priority_lag_max"] >= 1


@pytest.mark.ray
def test_killed_actor_is_replaced_and_the_run_finishes(local_ray):
    from hetrl.api import Run
    from hetrl.config import make_config

    cfg = make_config("dqn", "CartPole-v1", {"steps": 2000, "schedule": "ray", "actors": 2, "ray_actor_cpus": 0.5,
                                              "learning_starts": 500, "eval_episodes": 0})
    run = Run(cfg, "CartPole-v1")
    s = run.schedule
    while s.c.env_steps < 1000:
        s.phase()
    victim = s.slots[0].handle
    pid = s.slots[0].where["pid"]  # (asking it now would queue behind its collect calls)
    ray.kill(victim)                                      # as if its node were lost
    run.learn(progress=False)
    f = s.figures()
    assert f["env_steps"] >= 2000 and f["actor_restarts"] >= 1
    assert not _alive(pid)                                # the victim is gone, a new actor did its work
    run.schedule.close()


@pytest.mark.ray
def test_sigterm_stops_a_ray_run_with_a_checkpoint(local_ray, tmp_path):
    import os
    import signal

    from hetrl.api import Run
    from hetrl.config import make_config

    cfg = make_config("dqn", "CartPole-v1", {"steps": 10**6, "schedule": "ray", "actors": 1, "learning_starts": 500,
                                              "eval_episodes": 0})
    out = tmp_path / "run"
    out.mkdir()
    run = Run(cfg, "CartPole-v1", out)
    pids = [s.where["pid"] for s in run.schedule.slots]
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        run.learn(progress=False)
    finally:
        timer.cancel()
        run.schedule.close()
    assert run.interrupted == "SIGTERM" and (out / "checkpoint.pt").is_file()
    assert 0 < run.result["env_steps"] < 10**6
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "actor processes left behind"


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.ray
def test_a_checkpoint_of_another_schedule_resumes_on_ray_and_an_error_closes_the_run(local_ray, tmp_path):
    """An inline checkpoint (replay included) continues on Ray; a run that fails leaves no Ray actor."""
    import torch

    import hetrl
    from hetrl.errors import UsageError

    out = tmp_path / "r"
    hetrl.train("dqn", "CartPole-v1", plan="none", steps=600, seed=1, out=out, learning_starts=200, num_envs=4, net_arch=[32],
                save_replay=True, progress=False, evaluate_episodes=0, eval_episodes=0)
    run = hetrl.resume(out, steps=1200, progress=False, evaluate_episodes=0, schedule="ray", actors=1)
    assert run.result["schedule"] == "ray" and run.result["env_steps"] >= 1200
    assert int(torch.load(out / "replay.pt", weights_only=True)["storage"]["size"]) >= 1200
    from hetrl.api import Run
    from hetrl.config import make_config

    cfg = make_config("dqn", "gymnasium:CartPole-v1", {"schedule": "ray", "actors": 1, "env_backend": "envpool",
                                                       "steps": 1000, "eval_episodes": 0})
    with pytest.raises(UsageError, match="env_backend=envpool"):  # the setting reached the Ray actor
        Run(cfg, "gymnasium:CartPole-v1")   # ('module:EnvId': Gymnasium's, never EnvPool's)
    import time

    deadline = time.monotonic() + 20  # every actor it started was stopped: all CPUs free again
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]


@pytest.mark.ray
def test_ray_usage_errors(local_ray):
    from hetrl.config import make_config
    from hetrl.errors import UsageError
    from hetrl.runtime.ray_schedule import RaySchedule

    with pytest.raises(UsageError, match="ray_actor_cpus"):
        RaySchedule(make_config("dqn", "CartPole-v1", {"schedule": "ray", "actors": 3}), "CartPole-v1")
    with pytest.raises(UsageError, match="replay_shards"):
        make_config("dqn", "CartPole-v1", {"schedule": "ray", "actors": 1, "replay_shards": 2})


@pytest.mark.ray
def test_the_ray_schedule_runs_the_local_schedules_run(local_ray):
    """The ray schedule learns what the local schedule learns, not one trajectory that happens to score: with the
    same actors, one replay shard and the same seed, both run the same phases (chunks inserted in actor order at a
    boundary, the learner drawing from the replay as it stood there, the shard's sampler seeded as the local
    replay's), so their parameters and evaluations are equal. How well that learns is judged over seeds elsewhere
    (tests/test_learning.py). The ray run reports as every run does, and leaves the caller's Ray running."""
    import torch

    import hetrl

    kw = dict(steps=2500, learning_starts=500, net_arch=[32, 32], threads=1, learner_kernel="public", actors=2,
              envs_per_actor=2, eval_episodes=2, eval_interval=1000, seed=2, plan="none", progress=False)
    local = hetrl.train("dqn", "CartPole-v1", schedule="local", **kw)
    on_ray = hetrl.train("dqn", "CartPole-v1", schedule="ray", ray_actor_cpus=0.5, **kw)
    assert on_ray.result["gradient_steps"] == local.result["gradient_steps"] > 0
    for p, q in zip(local.algo.q.parameters(), on_ray.algo.q.parameters()):
        assert torch.equal(p, q)
    assert on_ray.result["evaluations"] == local.result["evaluations"] and len(local.result["evaluations"]) == 3
    r = on_ray.result
    assert r["schedule"] == "ray" and r["actors"] == 2 and r["env_steps"] >= 2500
    # the preset's replay ratio (128 per 256 env steps) after learning_starts, within one group
    assert abs(r["gradient_steps"] - (r["env_steps"] - 500) * 0.5) <= 32
    assert r["actor_restarts"] == 0 and r["ray_nodes"] == 1
    # reproducible (the default): phases, the actors acting with the policy of the boundary before (no bound to set)
    assert r["reproducible"] is True and r["policy_lag_bound"] is None and 0 <= r["policy_lag_max"] <= 2 * 128, r
    assert ray.is_initialized()


@pytest.mark.ray
def test_the_same_seed_gives_the_same_run_and_a_resume_is_exact(local_ray, tmp_path, stop_at, capfd):
    """Reproducible (the default) under Ray too: phases, each actor's chunk staged at its server and inserted in actor
    order at the boundary, the learner sampling the replay as it stood there; so a run stopped at a boundary and
    resumed with its replay and its actors' state (two shards, n-step, prioritised) is the run that never stopped."""
    import torch

    import hetrl

    kw = dict(steps=1000, learning_starts=200, train_freq=100, gradient_steps=10, batch_size=32, buffer_size=2000,
              net_arch=[32], threads=1, schedule="ray", actors=2, envs_per_actor=2, ray_actor_cpus=0.5,
              replay_shards=2, n_step=3, prioritized=True, eval_episodes=2, eval_interval=300, seed=3, plan="none",
              progress=False)
    straight = hetrl.train("dqn", "CartPole-v1", out=tmp_path / "straight", **kw)
    stopped = hetrl.train("dqn", "CartPole-v1", out=tmp_path / "stopped", save_replay=True, callback=stop_at(500), **kw)
    assert straight.result["reproducible"] is True and stopped.interrupted == "callback"
    r = straight.result   # prioritised replay exact by default, the replay ratio the core's (as under every schedule)
    assert r["priority_lag"] == r["priority_lag_max"] == 0 and r["gradient_steps"] == (r["env_steps"] - 200) // 10, r
    assert stopped.result["evaluations"] == straight.result["evaluations"][:len(stopped.result["evaluations"])]
    def saved_rows():   # the replay.pt the run saved: each shard's rows, from its server
        shards = torch.load(tmp_path / "stopped" / "replay.pt", weights_only=True)["shards"]
        return sum(int(s["replay"]["storage"]["size"]) for s in shards)

    assert len(torch.load(tmp_path / "stopped" / "replay.pt", weights_only=True)["shards"]) == 2
    assert saved_rows() >= 500 - 2 * 4   # (n-step: each env's last two steps wait for their returns)
    resumed = hetrl.resume(tmp_path / "stopped", progress=False)
    assert "without the actors' state" not in capfd.readouterr().err
    assert resumed.env_steps == straight.env_steps == 1000
    for p, q in zip(straight.algo.q.parameters(), resumed.algo.q.parameters()):
        assert torch.equal(p, q)
    assert resumed.result["evaluations"] == straight.result["evaluations"] and len(straight.result["evaluations"]) == 4
    # the resumed run closed its schedule (and the replay servers) when it ended; what it saved holds the whole replay
    assert saved_rows() >= 1000 - 2 * 4
