"""Populations (hetrl/runtime/population.py, driven by api.Run): member i is the run of seed i, a population
of one is a plain run, every member is a complete run, the population reports its statistics, bad input is one
line."""

from __future__ import annotations

import json
import os

import pytest
import torch

import hetrl
from hetrl.cli import main
from hetrl.errors import UsageError

# 1,200 env steps, learning from 200 in phases of 100 env steps x 20 gradient steps: over 200 updates
TINY = dict(steps=1200, learning_starts=200, train_freq=100, gradient_steps=20, batch_size=32, buffer_size=2000,
            net_arch=[32, 32], num_envs=2, eval_episodes=2, eval_interval=600, threads=1, plan="none",
            progress=False)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path / "cache"))


def params(algo) -> list[torch.Tensor]:
    return [p.detach() for name in algo.nets for p in getattr(algo, name).parameters()]


@pytest.mark.parametrize("kernel", ["public", "compiled"])
def test_member_i_is_the_run_of_seed_i(tmp_path, kernel):
    """Members step in one vector env and learn side by side (compiled: in parallel lanes), yet each member's
    parameters after its 200 updates, its evaluations and its TD errors' effects are those of its own run."""
    pop = hetrl.train("dqn", "CartPole-v1", seeds=[0, 5], out=tmp_path / "pop", learner_kernel=kernel, **TINY)
    assert pop.schedule.parallel == (kernel == "compiled")
    for member, run in zip(pop.members, pop.runs):
        alone = hetrl.train("dqn", "CartPole-v1", seed=member.seed, learner_kernel=kernel, **TINY)
        assert run.algo.updates == alone.algo.updates >= 200
        for p, q in zip(params(run.algo), params(alone.algo)):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert run.result["evaluations"] == alone.result["evaluations"]


def test_a_sac_member_draws_its_own_random_numbers(tmp_path):
    """SAC's learner draws noise every update: from the member's own generator, as in its own run."""
    small = dict(TINY, steps=500, learning_starts=300, train_freq=1, gradient_steps=1, net_arch=[16], num_envs=1,
                 eval_episodes=0, learner_kernel="public")
    pop = hetrl.train("sac", "Pendulum-v1", seeds=[1, 2], out=tmp_path / "pop", **small)
    alone = hetrl.train("sac", "Pendulum-v1", seed=2, **small)
    for p, q in zip(params(pop.runs[1].algo), params(alone.algo)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_every_member_is_a_complete_run_and_the_population_reports(tmp_path):
    out = tmp_path / "pop"
    pop = hetrl.train("dqn", "CartPole-v1", seeds=2, sweep={"lr": [1e-3, 3e-3]}, out=out,
                      **dict(TINY, steps=800, learning_starts=200, eval_interval=400))
    names = sorted(m.name for m in pop.members)
    assert names == ["seed0-lr0.001", "seed0-lr0.003", "seed1-lr0.001", "seed1-lr0.003"]
    for name in names:
        d = out / "members" / name
        res = json.loads((d / "result.json").read_text())
        assert (d / "checkpoint.pt").is_file() and res["env_steps"] == 800 and len(res["evaluations"]) == 2
        policy = hetrl.load(d)
        assert policy.act(torch.zeros(4).numpy()) in (0, 1)
    result = json.loads((out / "result.json").read_text())
    rows = result["aggregate"]["rows"]
    assert {r["setting"] for r in rows} == {"lr=0.001", "lr=0.003"} and all(r["runs"] == 2 for r in rows)
    assert set(rows[0]["best"]) == {"iqm", "mean", "median", "optimality_gap"} and (out / "curves.png").is_file()
    assert set(hetrl.load(out)) == set(names)
    resumed = hetrl.resume(out, steps=1000, progress=False, evaluate_episodes=0)
    assert all(r.env_steps == 1000 for r in resumed.runs)


def test_a_population_of_one_is_a_plain_run(tmp_path):
    one = hetrl.train("dqn", "CartPole-v1", seeds=[3], out=tmp_path / "pop", learner_kernel="public", **TINY)
    alone = hetrl.train("dqn", "CartPole-v1", seed=3, learner_kernel="public", **TINY)
    for p, q in zip(params(one.runs[0].algo), params(alone.algo)):
        assert torch.equal(p, q)


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "at least one member"),
    (["--seeds", "-1"], "at least one member"),
    (["--seeds", "0,-2"], "seeds are >= 0"),
    (["--seeds", "1,1"], "lists seed 1 twice"),
    (["--seeds", "2", "--sweep", "net_arch=[16],[32]"], "--sweep net_arch: members cannot differ in net_arch"),
    (["--seeds", "2", "--sweep", "train_freq=4,8"], "--sweep train_freq: members cannot differ"),
    (["--seeds", "2", "--sweep", "lr"], "is not KEY=V1,V2"),
    (["--seeds", "2", "--sweep", "lr=abc"], "lr='abc' is not a number"),
    (["--seeds", "2", "--seed", "3"], "takes its seeds from --seeds"),
])
def test_bad_population_input_is_one_line(capsys, tmp_path, argv, message):
    code = main(["train", "dqn", "--env", "CartPole-v1", "--plan", "none", "--out", str(tmp_path / "p"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_members_differ_only_in_what_a_sweep_may_change():
    from hetrl.runtime.population import fixed_settings

    fixed = fixed_settings("td3")
    assert {"net_arch", "policy_delay", "train_freq", "schedule", "seed"} <= fixed and "lr" not in fixed
    with pytest.raises(UsageError, match="policy_delay"):
        hetrl.train("td3", "Pendulum-v1", seeds=2, sweep={"policy_delay": [1, 2]}, **{**TINY, "net_arch": [8]})


def test_the_plan_puts_a_group_per_core_and_lanes_only_on_a_threadsafe_numba_layer():
    """On several cores the members are split into a process per core (acting holds a core per process); one
    process (--schedule inline) learns its members' phases as lanes. numba's workqueue layer aborts the process
    when two threads launch parallel regions at once: there the members of one process learn one after another."""
    import subprocess
    import sys

    from hetrl.kernels.compiled.kernel import CompiledKernel, threadsafe_layer
    from hetrl.planner.population import plan_population

    assert threadsafe_layer() is None and CompiledKernel.side_by_side()   # OpenMP (torch's) or TBB here
    p = plan_population(8, 2, "compiled", True)
    assert (p.schedule, p.groups, p.lanes) == ("local", [[0, 1, 2, 3], [4, 5, 6, 7]], 1)
    assert plan_population(8, 1, "compiled", True).schedule == "inline"
    p = plan_population(8, 2, "compiled", True, schedule="inline")
    assert (p.schedule, len(p.groups), p.lanes) == ("inline", 1, 2)
    code = ("from hetrl.kernels.compiled.kernel import CompiledKernel, threadsafe_layer\n"
            "from hetrl.planner.population import plan_population\n"
            "p = plan_population(4, 2, 'compiled', CompiledKernel.side_by_side(), schedule='inline')\n"
            "print(threadsafe_layer()); print(p.schedule, p.lanes)")
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    why, plan = out.strip().splitlines()
    assert "workqueue" in why and plan == "inline 1"


@pytest.mark.parametrize("schedule", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_member_groups_train_as_processes_or_ray_tasks(tmp_path, schedule):
    """--schedule local / ray: one group per core, each a process (a Ray task), a member never split; every
    member's run directory reaches OUT and the population's report is written as for one process."""
    if schedule == "ray":
        pytest.importorskip("ray")
    out = tmp_path / "pop"
    run = hetrl.train("dqn", "CartPole-v1", seeds=2, out=out, schedule=schedule, learner_kernel="public",
                      **dict(TINY, steps=400, learning_starts=200, eval_interval=200))
    assert sorted(sum(run.result["population"]["groups"], [])) == ["seed0", "seed1"]
    assert len(run.result["population"]["groups"]) == 2
    for name in ("seed0", "seed1"):
        res = json.loads((out / "members" / name / "result.json").read_text())
        assert res["env_steps"] == 400 and (out / "members" / name / "checkpoint.pt").is_file()
    assert run.result["aggregate"]["rows"][0]["runs"] == 2
    # each group's progress in its own directory; the population's files are the driver's alone
    assert all((out / "groups" / g / "progress.csv").is_file() for g in ("0", "1"))
    assert not (out / "progress.csv").exists()


def test_a_signal_to_the_driver_of_process_groups_saves_every_member(tmp_path):
    """--schedule local: SIGTERM (or the terminal's Ctrl-C, which reaches the driver alone: each group leads its
    own process group) asks every group to stop at the end of a phase; every member is saved, the population's
    result says so, and it resumes."""
    import os
    import signal
    import threading
    import time

    out = tmp_path / "pop"
    listed = []

    def signal_once_training():
        deadline = time.monotonic() + 120
        while not (out / "groups" / "0" / "progress.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(4.0)   # both groups past their first phases
        # what --resume needs is written before the groups train (a driver killed now leaves it)
        listed.extend(m["name"] for m in json.loads((out / "population.json").read_text())["population"]["members"])
        os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=signal_once_training, daemon=True)
    watcher.start()
    run = hetrl.train("dqn", "CartPole-v1", seeds=2, out=out, schedule="local", learner_kernel="public",
                      **dict(TINY, steps=10**6, eval_interval=10**6))
    watcher.join()
    assert run.result["interrupted"] == "SIGTERM" and listed == ["seed0", "seed1"]
    done = []
    for name in ("seed0", "seed1"):
        ckpt = torch.load(out / "members" / name / "checkpoint.pt", weights_only=True)
        done.append(ckpt["counters"]["env_steps"])
    assert all(0 < d < 10**6 for d in done)
    again = hetrl.resume(out, steps=max(done) + 200, progress=False, evaluate_episodes=0)
    assert [r.env_steps for r in again.runs] == [max(done) + 200] * 2


def test_a_signal_saves_every_member_and_each_resumes(tmp_path):
    """SIGTERM (or Ctrl-C) stops a population at the end of a phase with every member saved; the population
    resumes as a whole, and a member's directory resumes as a run of its own."""
    import os
    import signal
    import threading

    from hetrl.api import Run
    from hetrl.runtime.population import PopulationSchedule, make_members

    settings = {k: v for k, v in TINY.items() if k not in ("plan", "progress")}
    members = make_members("dqn", "CartPole-v1", {**settings, "steps": 10**6, "learner_kernel": "public"}, [0, 1], {})
    out = tmp_path / "pop"
    run = Run(members[0].cfg, "CartPole-v1", out, schedule=PopulationSchedule(members, "CartPole-v1"))
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        run.learn(progress=False)
    finally:
        timer.cancel()
    assert run.interrupted == "SIGTERM"
    done = run.runs[0].env_steps
    assert 0 < done < 10**6 and all(r.env_steps == done for r in run.runs)
    for m in members:
        ckpt = torch.load(out / "members" / m.name / "checkpoint.pt", weights_only=True)
        assert ckpt["counters"]["env_steps"] == done
    both = hetrl.resume(out, steps=done + 200, progress=False, evaluate_episodes=0)
    assert [r.env_steps for r in both.runs] == [done + 200] * 2
    alone = hetrl.resume(out / "members" / "seed1", steps=done + 400, progress=False, evaluate_episodes=0)
    assert alone.result["env_steps"] == done + 400 and alone.result["seed"] == 1


def test_freed_heap_memory_is_given_back_to_the_system():
    """give_back_freed_memory (run when a population lets its replays go, before the report): free memory the C
    allocator holds inside its heap (holes between live blocks, which it never returns by itself) leaves the
    process's RSS."""
    from hetrl.machine import give_back_freed_memory

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1024

    if not give_back_freed_memory():
        pytest.skip("no glibc malloc_trim here")
    blocks = [bytearray(16384) for _ in range(4000)]   # 64 MB of heap blocks, written
    del blocks[::2]                                     # 32 MB of holes between the blocks left
    held = rss_mb()
    give_back_freed_memory()
    assert held - rss_mb() > 16, "the holes' pages stayed in the process"


@pytest.mark.parametrize("algo, env", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_members_act_through_the_algorithms_stacked_policy(algo, env):
    """Acting for M members goes through Algorithm.stacked_policy: each member's rows get the actions its own
    policy gives them (DQN's answer: one Q call over the stacked weights; SAC's: the default, member by member)."""
    import gymnasium as gym
    import numpy as np

    from hetrl.algorithm import MemberPolicies
    from hetrl.algos import make_algorithm
    from hetrl.config import make_config

    e = gym.make(env)
    algos = [make_algorithm(make_config(algo, env, {"seed": s, "net_arch": [16]}), e.observation_space,
                            e.action_space) for s in (0, 1, 2)]
    obs = np.random.default_rng(0).standard_normal((6, *e.observation_space.shape)).astype(np.float32)
    explore = [0.3, 0.0, None] if algo == "dqn" else [1.0, 1.0, None]
    alone = [a.make_policy(seed=10 + m, num_envs=2) for m, a in enumerate(algos)]
    stacked = algos[0].stacked_policy([a.make_policy(seed=10 + m, num_envs=2) for m, a in enumerate(algos)], 2)
    assert isinstance(stacked, MemberPolicies) and (type(stacked) is not MemberPolicies) == (algo == "dqn")
    for _ in range(3):
        want = [p.act(obs[2 * m:2 * m + 2], explore[m]) for m, p in enumerate(alone)]
        got = stacked.act(obs, explore)
        np.testing.assert_allclose(got[0], np.concatenate([w[0] for w in want]), rtol=1e-6)
    np.testing.assert_allclose(stacked.act_deterministic(obs),
                               np.concatenate([p.act_deterministic(obs[2 * m:2 * m + 2]) for m, p in enumerate(alone)]),
                               rtol=1e-6)
