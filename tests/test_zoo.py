"""rl-baselines3-zoo hyperparameter files (hetrl/sb3/zoo.py) on entries of the zoo's own dqn/sac/td3.yml
(tests/data/zoo/, their source noted there): mapped as SB3 reads them, or refused with the entry named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hetrl
from hetrl.sb3 import zoo
from hetrl.cli import main
from hetrl.errors import UsageError

DATA = Path(__file__).parent / "data" / "zoo"


def test_dqn_cartpole_entry_is_the_zoos_with_sb3_defaults():
    s = zoo.settings(DATA / "dqn.yml", "dqn", "CartPole-v1")
    assert {k: s[k] for k in ("steps", "lr", "batch_size", "buffer_size", "learning_starts", "gamma",
                              "target_update_interval", "train_freq", "gradient_steps", "exploration_fraction",
                              "exploration_final_eps", "net_arch")} == dict(
        steps=50_000, lr=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
        target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, net_arch=[256, 256])
    assert s["exploration_initial_eps"] == 1.0 and s["max_grad_norm"] == 10.0   # SB3's defaults, not in the entry


def test_entries_are_picked_as_the_zoo_picks_them():
    assert zoo.entry(DATA / "dqn.yml", "ALE/Pong-v5")[0] == "atari"
    assert zoo.entry(DATA / "dqn.yml", "Acrobot-v1")[0] == "default"
    atari = zoo.settings(DATA / "dqn.yml", "dqn", "ALE/Pong-v5")
    assert (atari["frame_stack"], atari["net_arch"], atari["learning_starts"]) == (4, [], 100_000)


def test_noise_schedules_and_policy_kwargs():
    td3 = zoo.settings(DATA / "td3.yml", "td3", "MountainCarContinuous-v0")
    assert (td3["noise_type"], td3["noise_std"], td3["net_arch"]) == ("ou", 0.5, [400, 300])
    lin = zoo.settings(DATA / "td3.yml", "td3", "BipedalWalkerHardcore-v3")
    assert (lin["lr"], lin["lr_schedule"]) == (7e-4, "linear")
    sac = zoo.settings(DATA / "sac.yml", "sac", "LunarLanderContinuous-v3")
    assert (sac["lr"], sac["lr_schedule"], sac["tau"], sac["learning_starts"]) == (7.3e-4, "linear", 0.01, 10_000)


@pytest.mark.parametrize("algo,env,words", [
    ("sac", "MountainCarContinuous-v0", "[MountainCarContinuous-v0]: use_sde=True"),
    ("sac", "HumanoidBulletEnv-v0", "[HumanoidBulletEnv-v0]: normalize="),
    ("sac", "FetchReach-v1", "[FetchReach-v1]: normalize=True"),
    ("sac", "donkey-generated-track-v0", "env_wrapper gymnasium.wrappers.time_limit.TimeLimit is not supported"),
])
def test_what_hetrl_cannot_honour_is_named_in_one_line(algo, env, words):
    with pytest.raises(UsageError) as e:
        zoo.settings(DATA / f"{algo}.yml", algo, env)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_policy_kwargs_are_parsed_not_run():
    assert zoo.parse("dict(net_arch=[64, 64], activation_fn=nn.Tanh, log_std_init=-3)", "policy_kwargs") == \
        {"net_arch": [64, 64], "activation_fn": "Tanh", "log_std_init": -3}
    assert zoo.parse("dict(net_arch=dict(pi=[64], qf=[400, 300]), optimizer_class=th.optim.Adam)", "k") == \
        {"net_arch": {"pi": [64], "qf": [400, 300]}, "optimizer_class": "Adam"}
    for bad in ("__import__('os').system('echo hi')", "dict(a=open('x'))", "[x for x in ()]"):
        with pytest.raises(UsageError, match="not supported in a hyperparameter string"):
            zoo.parse(bad, "policy_kwargs")


def test_not_a_zoo_file(tmp_path):
    (tmp_path / "flat.yml").write_text("lr: 0.001\n")
    with pytest.raises(UsageError, match="not an rl-zoo hyperparameter file"):
        zoo.settings(tmp_path / "flat.yml", "dqn", "CartPole-v1")
    (tmp_path / "some.yml").write_text("Pendulum-v1: {n_timesteps: 10}\n")
    with pytest.raises(UsageError, match="has no entry for MountainCarContinuous-v0"):
        zoo.settings(tmp_path / "some.yml", "td3", "MountainCarContinuous-v0")


def test_train_with_hyperparams_keywords_win():
    run = hetrl.train("dqn", env="CartPole-v1", hyperparams=DATA / "dqn.yml", steps=600, learning_starts=100,
                      gradient_steps=8, plan="none", progress=False, evaluate_episodes=0, learner_kernel="public",
                      threads=1)
    c = run.cfg
    assert (c.steps, c.learning_starts, c.gradient_steps, c.lr, c.batch_size, c.target_update_interval) == \
        (600, 100, 8, 2.3e-3, 64, 10)


def test_cli_hyperparams(tmp_path, capsys):
    code = main(["train", "--env", "Pendulum-v1", "--hyperparams", str(DATA / "td3.yml"), "--steps", "200",
                 "--set", "learning_starts=150", "--set", "batch_size=32", "--set", "eval_episodes=1", "--set", "learner_kernel=public",
                 "--plan", "none", "--no-progress", "--out", str(tmp_path / "run")])
    assert code == 0
    cfg = json.loads((tmp_path / "run" / "result.json").read_text())["config"]
    assert (cfg["algo"], cfg["gamma"], cfg["buffer_size"], cfg["net_arch"], cfg["noise_std"]) == \
        ("td3", 0.98, 200_000, [400, 300], 0.1)
    model = hetrl.TD3.load(tmp_path / "run")   # a run directory of `hetrl train` loads into the SB3-style class
    assert model.num_timesteps == 200 and model.predict([1.0, 0.0, 0.0], deterministic=True)[0].shape == (1,)
    capsys.readouterr()
    code = main(["train", "--env", "MountainCarContinuous-v0", "--hyperparams", str(DATA / "sac.yml"),
                 "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "use_sde=True" in err[0] and not (tmp_path / "x").exists()
