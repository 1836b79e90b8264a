"""Faults and bad input: non-finite data, a replay larger than memory, an unwritable --out, ill-typed
or contradicting settings. Through the CLI: exit status and one line, no traceback."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import numpy as np
import pytest

import hetrl
from hetrl.cli import main
from hetrl.errors import NonFiniteError, UsageError

TINY = ["--plan", "none", "--no-progress", "--set", "learning_starts=100", "--set", "train_freq=50",
        "--set", "gradient_steps=5", "--set", "batch_size=16", "--set", "net_arch=[16]", "--set", "eval_episodes=0",
        "--set", "buffer_size=2000", "--set", "num_envs=2", "--set", "threads=1"]


class _NaNAfter(gym.Wrapper):
    def __init__(self, env, after):
        super().__init__(env)
        self.n, self.after = 0, after

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self.n += 1
        if self.n > self.after:
            obs = np.full_like(obs, np.nan)
        return obs, r, term, trunc, info


def nan_cartpole():  # module level: actor processes import it
    return _NaNAfter(gym.make("CartPole-v1"), after=300)


gym.register("NaNCartPole-v0", entry_point=nan_cartpole)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("schedule", ["inline", "local"])
def test_non_finite_observations_stop_the_run_with_one_line_and_a_checkpoint(capsys, tmp_path, schedule):
    out = tmp_path / "run"
    sched = ["--schedule", "local", "--actors", "1", "--envs-per-actor", "2"] if schedule == "local" else []
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "test_faults:NaNCartPole-v0", "--steps", "3000", *TINY,
                           *sched, "--out", str(out))
    assert code == 1 and "Traceback" not in err, err
    line = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "obs has NaN" in line[0] and "from actor 0" in line[0] and "check_finite" in line[0]
    res = json.loads((out / "result.json").read_text())
    assert res["interrupted"].startswith("error: NonFiniteError") and 0 < res["env_steps"] < 3000
    assert (out / "checkpoint.pt").is_file()  # the learner never saw the bad data: its state is kept


def test_check_finite_false_lets_the_user_through(tmp_path):
    run = hetrl.train("dqn", nan_cartpole, plan="none", steps=600, learning_starts=100, train_freq=50, gradient_steps=5,
                      batch_size=16, net_arch=[16], eval_episodes=0, num_envs=2, check_finite=False, progress=False)
    assert run.result["env_steps"] == 600


def test_a_diverging_learner_stops_without_overwriting_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError, match="TD errors became NaN/inf"):
        hetrl.train("dqn", "CartPole-v1", plan="none", steps=600, learning_starts=100, train_freq=50, gradient_steps=5, lr=1e37,
                    batch_size=16, net_arch=[16], eval_episodes=0, num_envs=2, out=out, progress=False)
    assert json.loads((out / "result.json").read_text())["interrupted"].startswith("error: NonFiniteError")
    assert not (out / "checkpoint.pt").exists()


def test_a_replay_larger_than_memory_is_refused_before_allocating(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--plan", "none",
                           "--set", "buffer_size=3000000000", "--out", str(tmp_path / "r"))
    assert code == 2 and "Traceback" not in err
    assert "error: the replay would need 141.0 GB" in err and "lower buffer_size (at most" in err


def test_the_memory_check_warns_near_the_limit_and_reports_replay_bytes(capsys):
    from hetrl.replay.memory import available_bytes, check_replay_memory, storage_bytes

    spec = {"obs": ((4,), "float32"), "action": ((), "int64")}
    per_item = storage_bytes(spec, 1)
    assert per_item == 24
    have = available_bytes("cpu")
    assert check_replay_memory(spec, 1000, "cpu") == 24_000 and capsys.readouterr().err == ""
    check_replay_memory(spec, int(0.9 * have / per_item), "cpu")   # nothing is allocated
    assert "warning: the replay will take" in capsys.readouterr().err
    with pytest.raises(UsageError, match="lower buffer_size"):
        check_replay_memory(spec, int(1.5 * have / per_item), "cpu")
    run = hetrl.train("dqn", "CartPole-v1", plan="none", steps=200, learning_starts=100, train_freq=50, gradient_steps=5,
                      batch_size=16, net_arch=[16], eval_episodes=0, num_envs=2, buffer_size=1000, progress=False)
    assert run.result["replay_bytes"] == 1000 * 47   # obs 16 + action 8 + reward 4 + next_obs 16 + 3 flags
    assert run.result["peak_rss_mb"] > 50 and "gpu_max_memory_allocated_mb" not in run.result   # torch alone


def test_an_unwritable_out_is_refused_before_any_profiling(capsys):
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--out", "/proc/hetrl-cannot/run")
    assert code == 2 and "Traceback" not in err and "hetrl profile" not in err
    assert err.strip().splitlines()[-1].startswith("error: cannot write the run directory /proc/hetrl-cannot/run")


def test_every_set_value_is_checked_and_contradicting_flags_are_named(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--set", "steps=abc", "--steps", "500",
                           "--plan", "none", "--out", str(tmp_path / "a"))
    assert code == 2 and "steps='abc' is not an integer" in err
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--set", "steps=400", "--steps", "500",
                           "--plan", "none", "--out", str(tmp_path / "b"))
    assert code == 2 and "--steps 500 and --set steps=400 disagree" in err


# ---- the non-finite guard at ReplayBuffer.insert (every schedule inserts through it) ----------------------------
SPEC = {"obs": ((3,), "float32"), "action": ((2,), "float32"), "reward": ((), "float32"),
        "next_obs": ((3,), "float32"), "terminated": ((), "bool")}


def _batch(n=5):
    return {"obs": np.zeros((n, 3), np.float32), "action": np.zeros((n, 2), np.float32),
            "reward": np.ones(n, np.float32), "next_obs": np.ones((n, 3), np.float32), "terminated": np.zeros(n, bool)}


@pytest.mark.parametrize("field,row,value,kind", [("obs", 3, np.nan, "NaN"), ("next_obs", 0, np.inf, "inf"),
                                                  ("reward", 4, -np.inf, "inf"), ("action", 2, np.nan, "NaN")])
def test_replay_insert_refuses_non_finite_data_naming_field_row_and_kind(field, row, value, kind):
    from hetrl.replay import ReplayBuffer

    rb = ReplayBuffer(100, SPEC, seed=0)          # on by default
    rb.insert(_batch())
    b = _batch()
    b[field][row] = value
    with pytest.raises(NonFiniteError, match=f"{field} has {kind} at row {row}$"):
        rb.insert(b)
    assert len(rb) == 5                            # nothing of the bad batch was stored
    b = {k: __import__("torch").from_numpy(v) for k, v in b.items()}   # tensors are checked too
    with pytest.raises(NonFiniteError, match=f"{field} has {kind} at row {row}$"):
        rb.insert(b)
    off = ReplayBuffer(100, SPEC, seed=0, check_finite=False)
    off.insert(b)
    assert len(off) == 5


def test_integer_actions_and_flags_are_not_checked():
    from hetrl.replay import ReplayBuffer

    spec = {**SPEC, "action": ((), "int64")}
    rb = ReplayBuffer(10, spec)
    rb.insert({**_batch(), "action": np.full(5, -1, np.int64)})
    assert len(rb) == 5


# ---- memory ---------------------------------------------------------------------------------------------------------
def test_storage_checks_memory_before_allocating(monkeypatch):
    import torch

    from hetrl.replay import Storage

    def boom(*a, **k):
        raise AssertionError("allocated before the memory check")

    monkeypatch.setattr(np, "zeros", boom)
    monkeypatch.setattr(torch, "zeros", boom)
    spec = {"obs": ((4,), "float32"), "action": ((), "int64")}
    with pytest.raises(UsageError, match=r"^the replay would need .* lower buffer_size \(at most ~[\d,]+ fits\)$"):
        Storage(10**13, spec)
    monkeypatch.undo()
    s = Storage(1000, spec)
    assert s.nbytes == 24_000
    shared = {"obs": np.zeros((1000, 4), np.float32)}   # preallocated fields (the local ring) count, unchecked
    assert Storage(1000, spec, buffers=shared).nbytes == 24_000


def test_a_replay_near_the_limit_warns_once_with_one_line(monkeypatch, capsys):
    from hetrl.replay import memory

    monkeypatch.setattr(memory, "_warned", set())
    monkeypatch.setattr(memory, "available_bytes", lambda device: int(1000 * 47 / 0.9))  # the replay takes 90%
    run = hetrl.train("dqn", "CartPole-v1", plan="none", steps=200, learning_starts=100, train_freq=50, gradient_steps=5,
                      batch_size=16, net_arch=[16], eval_episodes=0, num_envs=2, buffer_size=1000, progress=False)
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln and "replay" in ln]
    assert len(warned) == 1   # the learner core and the storage check the same replay: one warning
    assert warned[0].startswith("hetrl: warning: the replay will take 47 KB of the 52 KB available on this machine")
    assert "buffer_size=888 would leave room" in warned[0]   # 80% of the available memory
    assert run.result["replay_bytes"] == 47_000


def test_the_local_ring_is_refused_before_it_is_created(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--plan", "none", "--schedule", "local",
                           "--actors", "1", "--set", "buffer_size=3000000000", "--out", str(tmp_path / "r"))
    assert code == 2 and "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("error:")][0].startswith("error: the replay would need")


# ---- --out -----------------------------------------------------------------------------------------------------------
def test_an_out_under_a_file_is_refused_in_one_line(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--out", str(tmp_path / "f" / "run"))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: cannot write the run directory {tmp_path / 'f' / 'run'}")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only dirs")
def test_a_read_only_out_is_refused_in_one_line(capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--out", str(ro))
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"error: cannot write the run directory {ro}")


# ---- --set ----------------------------------------------------------------------------------------------------------
def test_set_values_are_checked_on_resume_too(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "--resume", str(tmp_path / "none"), "--steps", "900", "--set", "steps=abc")
    assert code == 2 and "steps='abc' is not an integer" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "train", "--resume", str(tmp_path / "none"), "--steps", "900", "--set", "steps=800")
    assert code == 2 and "--steps 900 and --set steps=800 disagree" in err
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--seed", "1", "--set", "seed=2",
                           "--out", str(tmp_path / "c"))
    assert code == 2 and "--seed 1 and --set seed=2 disagree" in err
    out = tmp_path / "r"
    assert run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--steps", "300", *TINY, "--out", str(out))[0] == 0
    code, _, err = run_cli(capsys, "train", "--resume", str(out), "--set", "steps=500", "--no-progress")
    assert code == 0, err
    assert json.loads((out / "result.json").read_text())["env_steps"] == 500
