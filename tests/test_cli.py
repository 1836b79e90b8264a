"""Bad input: one clear line naming the problem and the fix, exit status 2, no traceback,
nothing written over an existing run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,words", [
    (["train", "dqn", "--env", "CartPol-v1"], "unknown env 'CartPol-v1'"),
    (["train", "dqn", "--env", "Pendulum-v1"], "DQN needs a discrete action space"),
    (["train", "ddpg", "--env", "CartPole-v1"], "DDPG needs a continuous"),
    (["train", "trpo", "--env", "CartPole-v1"], "unknown algorithm 'trpo'"),
    (["train", "dqn", "--env", "CartPole-v1", "--set", "lr=abc"], "lr='abc' is not a number"),
    (["train", "dqn", "--env", "CartPole-v1", "--set", "bogus=1"], "unknown setting 'bogus'"),
    (["train", "dqn", "--env", "CartPole-v1", "--set", "batch_size=200000"], "larger than buffer_size"),
    (["train", "dqn", "--env", "CartPole-v1", "--steps", "0"], "steps must be positive"),
    (["train", "dqn", "--env", "CartPole-v1", "--set", "num_envs=0"], "num_envs must be positive"),
    (["train", "dqn", "--env", "nosuchmodule:Foo-v0"], "cannot import module 'nosuchmodule'"),
    (["train", "dqn", "--env", "CartPole-v1", "--config", "/nonexistent.yaml"], "does not exist"),
    (["eval", "/nonexistent/run"], "does not exist"),
    (["train", "dqn"], "needs ALGO and --env"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, words):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], err
    assert "Traceback" not in err


def test_corrupt_checkpoint(capsys, tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    code, _, err = run_cli(capsys, "eval", str(tmp_path))
    assert code == 2 and "corrupt" in err and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(capsys, "eval", str(empty))
    assert code == 2 and "no checkpoint.pt" in err


def test_existing_run_is_not_overwritten_without_force(capsys, tmp_path):
    (tmp_path / "result.json").write_text('{"keep": 1}')
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--out", str(tmp_path))
    assert code == 2 and "--force" in err
    assert json.loads((tmp_path / "result.json").read_text()) == {"keep": 1}


def test_console_script_exit_status(tmp_path):
    exe = Path(sys.executable).with_name("hetrl")
    p = subprocess.run([str(exe), "train", "dqn", "--env", "Nope-v9"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: unknown env") and "Traceback" not in p.stderr


def test_settings_command(capsys):
    code, out, _ = run_cli(capsys, "settings", "dqn", "--env", "CartPole-v1", "--set", "lr=0.5")
    assert code == 0 and "lr" in out and "0.5" in out


def test_warm_compiles_the_cpu_kernel_into_the_cache(capsys):
    """`hetrl warm` (make install runs it, for every part; conftest too): one part named here, cached already, so it
    loads; a part that does not exist is one line."""
    from hetrl.kernels.compiled import available

    assert main(["warm", "dqn"]) == 0
    err = capsys.readouterr().err
    assert ("in numba's cache" if available() is None else "nothing to compile") in err
    code, _, err = run_cli(capsys, "warm", "ppo")
    assert code == 2 and "no compiled part named ppo" in err and err.count("\n") == 1


def test_train_eval_resume_happy_path(capsys, tmp_path):
    out = tmp_path / "run"
    tiny = ["--set", "learning_starts=200", "--set", "train_freq=100", "--set", "gradient_steps=10",
            "--set", "batch_size=32", "--set", "net_arch=[16]", "--set", "threads=1", "--set", "eval_episodes=2"]
    code, stdout, _ = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--steps", "400", "--out", str(out),
                              "--no-progress", "--save-replay", "--plan", "none", *tiny)
    assert code == 0 and json.loads(stdout)["env_steps"] == 400
    assert (out / "replay.pt").exists()
    code, stdout, _ = run_cli(capsys, "eval", str(out), "--episodes", "3", "--render", "rgb_array")
    res = json.loads(stdout)
    assert code == 0 and res["eval_episodes"] == 3 and (out / "frames.npz").exists()
    code, stdout, err = run_cli(capsys, "train", "--resume", str(out), "--steps", "600", "--no-progress")
    assert code == 0 and json.loads(stdout)["env_steps"] == 600, err
    code, _, err = run_cli(capsys, "train", "--resume", str(out), "--steps", "500")
    assert code == 2 and "not beyond" in err


def test_train_with_auto_plan_records_prediction(capsys, tmp_path, monkeypatch):
    """`hetrl train --plan auto` plans around pinned settings and writes plan + prediction."""
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path / "cache"))
    small = ["--set", "learning_starts=200", "--set", "train_freq=100", "--set", "gradient_steps=10",
             "--set", "batch_size=32", "--set", "net_arch=[16]", "--set", "eval_episodes=0"]
    code, _, err = run_cli(capsys, "profile", "dqn", "--env", "CartPole-v1", "--quick", *small)
    assert code == 0, err
    out = tmp_path / "run"
    code, stdout, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--steps", "400", "--out", str(out),
                                "--no-progress", "--schedule", "inline", "--set", "threads=1", *small)
    assert code == 0, err
    res = json.loads((out / "result.json").read_text())
    assert res["plan"]["plan"]["schedule"] == "inline" and res["predicted_env_steps_per_s"] > 0
    # what the planner set, and the preset's (and --set) learning settings it kept
    assert res["plan"]["owned_by_preset"]["batch_size"] == 32 and res["plan"]["owned_by_preset"]["num_envs"] == 1
    assert "schedule" not in res["plan"]["chosen"] and "threads" not in res["plan"]["chosen"]   # set by hand
    assert res["plan"]["changed_learning_settings"] == {} and "every learning setting is the preset's" in err
    # the prediction is compared with the steady state: env steps/s from the first gradient step on
    assert res["env_steps_per_s_learning"] > 0 and "while learning vs predicted" in err
