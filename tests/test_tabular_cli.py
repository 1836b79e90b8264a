"""`hetrl tabular` CLI, result.json, user errors, env id aliases, dataset files."""

import argparse
import json
import os

import numpy as np
import pytest

from hetrl.errors import UsageError
from hetrl.tabular import load_result, train_tabular
from hetrl.tabular.cli import count, main, register
from hetrl.tabular.dataset import generate, load
from hetrl.tabular.envs import env_info, parse_env_kwargs, resolve_env_id

pytestmark = pytest.mark.filterwarnings("ignore")

REQUIRED = ["algo", "env", "workers", "dtype", "transitions", "rounds", "wall_s", "updates_per_s",
            "updates_per_s_per_worker", "eval_return_mean", "success_rate"]
SMALL = ["-n", "100k", "--rounds", "3", "--eval-episodes", "5"]


def test_register_adds_subcommand_with_func():
    parser = argparse.ArgumentParser(prog="hetrl")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["tabular", "sarsa", "--env", "Taxi-v3", "--workers", "2", "--transitions", "1M",
                              "--dtype", "int32", "--out", "x"])
    assert callable(args.func)
    assert (args.algo, args.env, args.workers, args.transitions, args.dtype, args.out) == (
        "sarsa", "Taxi-v3", 2, 1_000_000, "int32", "x")


def test_cli_writes_result_and_q_table(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["qlearning", "--env", "Taxi-v3", "-w", "2", "--dtype", "int32", "--out", str(out), *SMALL]) == 0
    text = capsys.readouterr().out
    assert "qlearning on Taxi-v3" in text and "M/s" in text
    r = json.loads((out / "result.json").read_text())
    for key in REQUIRED:
        assert key in r, key
    assert r["algo"] == "qlearning" and r["workers"] == 2 and r["dtype"] == "int32"
    assert r["transitions"] == 100_000 and r["rounds"] == 3 and r["updates"] == 300_000
    assert r["updates_per_s"] > 0 and r["updates_per_s_per_worker"] == pytest.approx(r["updates_per_s"] / 2)
    assert r["frac_bits"] == 16 and r["q_scale"] == 65536
    q = np.load(out / "q_table.npy")
    assert q.shape == (500, 6) and q.dtype == np.int32
    back = load_result(out)
    assert (back.q_table == q).all() and back.q_float.dtype == np.float32
    assert back.evaluate(3)["episodes"] == 3


def test_cli_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["sarsa", "--env", "FrozenLake-v1", "--out", out, *SMALL]) == 0
    before = os.path.getmtime(os.path.join(out, "result.json"))
    assert main(["sarsa", "--env", "FrozenLake-v1", "--out", out, *SMALL]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--force" in err and "result.json" in err
    assert os.path.getmtime(os.path.join(out, "result.json")) == before
    assert main(["sarsa", "--env", "FrozenLake-v1", "--out", out, "--force", "--json", *SMALL]) == 0
    assert json.loads(capsys.readouterr().out)["algo"] == "sarsa"


@pytest.mark.parametrize("argv,needle", [
    (["qlearning", "--env", "NoSuchEnv-v0"], "unknown env id"),
    (["qlearning", "--env", "CartPole-v1"], "Discrete"),
    (["qlearning", "--env", "Taxi-v3", "--workers", "0"], "workers=0"),
    (["qlearning", "--env", "Taxi-v3", "--workers", "4", "--transitions", "3"], "fewer than workers"),
    (["qlearning", "--env", "Taxi-v3", "--gamma", "1.5"], "gamma"),
    (["qlearning", "--env", "Taxi-v3", "--alpha", "0"], "alpha"),
    (["qlearning", "--env", "Taxi-v3", "--data", "/nonexistent/d.npz"], "does not exist"),
    (["qlearning", "--env", "Taxi-v3", "--dtype", "int32", "--frac-bits", "28"], "overflow"),
    (["sarsa", "--env", "Taxi-v3", "--backend", "prange"], "prange"),
    (["qlearning", "--env", "Taxi-v3", "--behaviour", "epsilon-greedy"], "--behaviour-q"),
    (["qlearning", "--env", "Taxi-v3", "--env-kwarg", "nonsense"], "KEY=VALUE"),
    (["qlearning", "--env", "Taxi-v3", "--workers", "4", "--merge", "sum"], "diverges"),
    (["qlearning", "--env", "Taxi-v3", "--mode", "online", "--data", "x.npz"], "online"),
    (["qlearning", "--env", "Taxi-v3", "--mode", "online", "--merge", "weighted"], "online"),
])
def test_user_errors_exit_2_with_one_line(argv, needle, capsys):
    assert main(["-n", "1000", "--eval-episodes", "0", *argv]) == 2  # argv wins
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err


def test_argparse_rejects_bad_choices():
    with pytest.raises(SystemExit) as exc:
        main(["qlearning", "--env", "Taxi-v3", "--dtype", "float16"])
    assert exc.value.code == 2


def test_env_id_versions_are_mapped():
    import gymnasium as gym

    for asked in ("CliffWalking-v0", "CliffWalking-v1", "Taxi-v3", "FrozenLake-v1"):
        resolved = resolve_env_id(asked)
        assert resolved in gym.registry
        assert resolved.split("-v")[0] == asked.split("-v")[0]
    info = env_info("CliffWalking-v0")
    assert (info.n_states, info.n_actions) == (48, 4) and info.model is not None
    assert resolve_env_id("Taxi") == resolve_env_id("Taxi-v3")  # no version: the newest one
    with pytest.raises(UsageError, match="did you mean"):
        resolve_env_id("Taxee-v3")


def test_env_kwargs_reach_the_env():
    assert parse_env_kwargs(["is_slippery=false", "map_name=8x8"]) == {"is_slippery": False, "map_name": "8x8"}
    r = train_tabular("qlearning", "FrozenLake-v1", env_kwargs={"is_slippery": False}, transitions=100_000,
                      rounds=5, eval_episodes=10, measure_scaling=False).result
    assert r["success_rate"] == 1.0  # deterministic lake: the optimal path always works
    with pytest.raises(UsageError, match="bad env option"):
        env_info("FrozenLake-v1", {"no_such_option": 1})


def test_dataset_file_roundtrip_and_validation(tmp_path):
    info = env_info("Taxi-v3")
    data = generate(info, 5_000, seed=1)
    path = data.save(tmp_path / "d.npz")
    back = load(path, info.n_states, info.n_actions)
    for c in ("s", "a", "r", "s2", "a2", "done"):
        assert (getattr(back, c) == getattr(data, c)).all()
    r = train_tabular("qlearning", "Taxi-v3", data=path, rounds=2, eval_episodes=0, measure_scaling=False).result
    assert r["data_source"] == path and r["transitions"] == 5_000
    with pytest.raises(UsageError, match="500 states"):
        load(path, 16, 4)  # a Taxi dataset for FrozenLake
    np.savez(tmp_path / "bad.npz", s=np.zeros(3, np.int32))
    with pytest.raises(UsageError, match="lacks column"):
        load(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(UsageError, match="cannot read"):
        load(tmp_path / "junk.npz")


def test_cli_save_data_then_train_from_it(tmp_path, capsys):
    path = str(tmp_path / "cliff.npz")
    assert main(["qlearning", "--env", "CliffWalking-v0", "-n", "200k", "--save-data", path,
                 "--eval-episodes", "1"]) == 0
    assert os.path.exists(path)
    capsys.readouterr()
    assert main(["qlearning", "--env", "CliffWalking-v1", "--data", path, "--json", "--eval-episodes", "1"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["data_source"] == path and r["transitions"] == 200_000 and r["env_id"] == r["env"]


def test_epsilon_greedy_behaviour_dataset():
    base = train_tabular("qlearning", "Taxi-v3", transitions=200_000, rounds=5, eval_episodes=0, measure_scaling=False)
    info = env_info("Taxi-v3")
    d = generate(info, 50_000, seed=0, behaviour="epsilon-greedy", behaviour_q=base.q_float, behaviour_epsilon=0.1)
    rnd = generate(info, 50_000, seed=0)
    assert d.episodes > 3 * rnd.episodes  # a good behaviour finishes far more episodes


def test_count_parser():
    assert count("1M") == 1_000_000 and count("1e6") == 1_000_000 and count("250k") == 250_000
    assert count("1_000") == 1000
    with pytest.raises(argparse.ArgumentTypeError):
        count("lots")
