"""`hetrl profile` and `hetrl plan` through their argparse registration (tmp cache, tiny grid)."""

import argparse
import json

import pytest

from hetrl.errors import UsageError
from hetrl.planner.cli import register

SETS = ["--set", "net_arch=[32,32]", "--set", "batch_size=32", "--set", "buffer_size=2000",
        "--set", "train_freq=16", "--set", "gradient_steps=8"]


def run(argv):
    parser = argparse.ArgumentParser(prog="hetrl")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_profile_then_plan_json(capsys, cache):
    assert run(["profile", "dqn", "--env", "CartPole-v1", *SETS, "--quick", "--json"]) == 0
    prof = json.loads(capsys.readouterr().out)
    assert prof["format"] == "hetrl-profile/15" and not prof["from_cache"]
    assert run(["plan", "dqn", "--env", "CartPole-v1", *SETS, "--quick", "--json", "--pin", "threads=1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "hetrl-plan/1" and doc["profile"]["from_cache"]
    assert doc["plan"]["threads"] == 1 and doc["pins"] == {"threads": 1}
    assert doc["predicted"]["env_steps_per_s"] > 0 and doc["bottleneck"]
    # the rich table names the plan, the figures, the bottleneck and the estimated power
    assert run(["plan", "dqn", "--env", "CartPole-v1", *SETS, "--quick", "--objective", "efficiency"]) == 0
    out = capsys.readouterr().out
    for words in ("chosen plan", "predicted", "env steps/s", "bottleneck", "next best plans"):
        assert words in out, words
    if doc["predicted"]["power_source"] != "measured":
        assert "estimated" in out
    assert run(["profile", "dqn", "--env", "CartPole-v1", *SETS, "--quick"]) == 0
    assert "learner update" in capsys.readouterr().out


def test_plan_takes_system_settings_as_pins_as_train_does(capsys, cache):
    """`hetrl plan --set schedule=local` shows the plan `hetrl train --set schedule=local` runs."""
    for schedule in ("local", "inline"):
        assert run(["plan", "dqn", "--env", "CartPole-v1", *SETS, "--set", f"schedule={schedule}", "--set",
                    "threads=1", "--quick", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["plan"]["schedule"] == schedule and doc["pins"] == {"schedule": schedule, "threads": 1}
    assert run(["plan", "dqn", "--env", "CartPole-v1", *SETS, "--set", "threads=1", "--pin", "threads=2", "--quick",
                "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pins"]["threads"] == 2   # an explicit --pin wins


@pytest.mark.parametrize("argv, words", [
    (["plan", "dqn"], "needs ALGO and --env"),
    (["plan", "dqn", "--env", "CartPole-v1", "--pin", "actors"], "not key=value"),
    (["plan", "dqn", "--env", "CartPole-v1", "--pin", "learner=cpu"], "unknown pin"),
    (["plan", "dqn", "--env", "CartPole-v1", "--cores", "0"], "--cores"),
    (["plan", "dqn", "--env", "CartPole-v1", "--cores", "lots"], "not a number"),
    (["plan", "dqn", "--env", "Pendulum-v1"], "discrete action space"),
    (["profile", "dqn", "--env", "NoSuchEnv-v0"], "unknown env"),
])
def test_bad_input_is_a_usage_error(argv, words, cache):
    with pytest.raises(UsageError, match=words):
        run(argv + ["--quick"])
