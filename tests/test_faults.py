"""Faults and bad input: non-finite data, a replay larger than memory, an unwritable --out, ill-typed
or contradicting settings. Through the CLI: exit status and one line, no traceback."""

from __future__ import annotations

import json

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
    run = hetrl.train("dqn", nan_cartpole, steps=600, learning_starts=100, train_freq=50, gradient_steps=5,
                      batch_size=16, net_arch=[16], eval_episodes=0, num_envs=2, check_finite=False, progress=False)
    assert run.result["env_steps"] == 600


def test_a_diverging_learner_stops_without_overwriting_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError, match="TD errors became NaN/inf"):
        hetrl.train("dqn", "CartPole-v1", steps=600, learning_starts=100, train_freq=50, gradient_steps=5, lr=1e37,
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
    run = hetrl.train("dqn", "CartPole-v1", steps=200, learning_starts=100, train_freq=50, gradient_steps=5,
                      batch_size=16, net_arch=[16], eval_episodes=0, num_envs=2, buffer_size=1000, progress=False)
    assert run.result["replay_bytes"] == 1000 * 47   # obs 16 + action 8 + reward 4 + next_obs 16 + 3 flags


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
