"""SB3's surface of every built-in algorithm: `model.policy` (a torch module with SB3's parameter names over the
live parameters), get/set_parameters in SB3's layout, Monitor files, the loss scalars in the training log, the
progress bar and the quiet start at verbose <= 1. Checked against SB3 itself where it is installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hetrl
from hetrl.errors import UsageError

sb3 = pytest.importorskip("stable_baselines3")

FAST = dict(seed=0, plan="none", threads=1, device="cpu", learner_kernel="public")
CASES = [("DQN", "CartPole-v1"), ("DDPG", "Pendulum-v1"), ("TD3", "Pendulum-v1"), ("SAC", "Pendulum-v1"),
         ("PPO", "Pendulum-v1"), ("PPO", "CartPole-v1"), ("A2C", "CartPole-v1")]


@pytest.mark.parametrize("name,env", CASES)
def test_policy_and_parameters_have_sb3s_names_and_shapes(name, env):
    ours = getattr(hetrl, name)("MlpPolicy", env, **FAST)
    theirs = getattr(sb3, name)("MlpPolicy", env, seed=0, device="cpu")
    assert isinstance(ours.policy, torch.nn.Module)
    mine = {k: tuple(v.shape) for k, v in ours.policy.state_dict().items()}
    want = {k: tuple(v.shape) for k, v in theirs.policy.state_dict().items()}
    assert mine == want
    p, q = ours.get_parameters(), theirs.get_parameters()
    assert set(p) == set(q)
    assert all(set(p[k]) == {"state", "param_groups"} for k in p if k != "policy")   # torch optimizer states


def test_policy_load_state_dict_writes_the_live_networks():
    m = hetrl.A2C("MlpPolicy", "CartPole-v1", policy_kwargs={"net_arch": [32]}, n_steps=8, **FAST)
    m.learn(64)
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    before = m.predict(obs, deterministic=True)[0]
    sd = {k: v for k, v in m.policy.state_dict().items() if "policy" in k or "action" in k}
    assert sd and all("value" not in k.replace("policy_net", "") for k in sd)
    flipped = {k: -v if k.startswith("action_net") else v for k, v in sd.items()}
    m.policy.load_state_dict(flipped, strict=False)
    assert torch.equal(m._algo().policy.action_net.weight, flipped["action_net.weight"])
    assert not np.array_equal(m.predict(obs, deterministic=True)[0], before)
    m.learn(64, reset_num_timesteps=False)   # the open Run trains on from the written parameters
    assert m.num_timesteps >= 128
    with pytest.raises(RuntimeError, match="Missing"):
        m.policy.load_state_dict(sd, strict=True)


def test_get_set_parameters_in_sb3s_layout():
    a = hetrl.DQN("MlpPolicy", "CartPole-v1", learning_starts=50, train_freq=20, gradient_steps=5, batch_size=16,
                  buffer_size=500, policy_kwargs=dict(net_arch=[16]), **FAST).learn(200)
    b = hetrl.DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[16]), **{**FAST, "seed": 1})
    params = a.get_parameters()
    assert set(params) == {"policy", "policy.optimizer"} and "q_net.q_net.0.weight" in params["policy"]
    b.set_parameters(params)
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    assert np.array_equal(a.predict(obs, deterministic=True)[0], b.predict(obs, deterministic=True)[0])
    assert b._algo().opt.state_dict()["state"].keys() == a._algo().opt.state_dict()["state"].keys()
    with pytest.raises(UsageError, match="exact_match=False"):
        b.set_parameters({"policy": params["policy"]})
    b.set_parameters({"policy": {"q_net.q_net.0.bias": torch.zeros(16)}}, exact_match=False)
    assert torch.equal(b._algo().q.q[0].bias, torch.zeros(16))
    # an SB3 model's policy loads into hetrl's (same names and shapes; the optimizers' layouts differ)
    s = sb3.DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[16]), seed=0, device="cpu")
    with pytest.raises(UsageError, match="exact_match=False"):
        b.set_parameters(s.get_parameters())
    b.set_parameters({"policy": s.get_parameters()["policy"]}, exact_match=False)
    assert torch.equal(b.policy.state_dict()["q_net.q_net.2.weight"], s.policy.state_dict()["q_net.q_net.2.weight"])


def monitor_rows(path) -> list[list[str]]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("#{") and "t_start" in lines[0] and lines[1] == "r,l,t"
    return [line.split(",") for line in lines[2:]]


def test_monitor_files_get_the_training_episodes(tmp_path):
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(gym.make("CartPole-v1"), str(tmp_path / "one"))
    m = hetrl.PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, **FAST).learn(640)
    rows = monitor_rows(tmp_path / "one.monitor.csv")
    assert len(rows) == m._episode_num > 5 and sum(int(r[1]) for r in rows) <= 640
    assert env.get_episode_rewards() == [float(r[0]) for r in rows]
    venv = make_vec_env("CartPole-v1", n_envs=2, monitor_dir=str(tmp_path / "many"), seed=0)
    m = hetrl.DQN("MlpPolicy", venv, learning_starts=100, train_freq=50, batch_size=16, **FAST).learn(600)
    files = sorted((tmp_path / "many").iterdir())
    assert [f.name for f in files] == ["0.monitor.csv", "1.monitor.csv"]   # one per env, as SB3 names them
    counts = [len(monitor_rows(f)) for f in files]
    assert sum(counts) == m._episode_num and min(counts) >= 1
    # each file holds its env's episodes: their lengths add up to at most that env's steps
    assert all(sum(int(r[1]) for r in monitor_rows(f)) <= m.num_timesteps // 2 for f in files)


def test_each_monitor_file_gets_its_envs_episodes(tmp_path):
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    from hetrl.actors import Episode
    from hetrl.sb3.envs import MonitorFiles

    monitors = [Monitor(gym.make("CartPole-v1"), str(tmp_path / f"{i}")) for i in range(3)]
    files = MonitorFiles(monitors)
    files.write([Episode(10.0, 10, env=2), Episode(11.0, 11, env=0), Episode(12.0, 12, env=2)])
    files.write([Episode(13.0, 13, env=1)])
    rows = [[(float(r), int(n)) for r, n, _ in monitor_rows(tmp_path / f"{i}.monitor.csv")] for i in range(3)]
    assert rows == [[(11.0, 11)], [(13.0, 13)], [(10.0, 10), (12.0, 12)]]
    assert monitors[2].get_episode_lengths() == [10, 12]


LOSS_KEYS = {
    "DQN": {"train/loss"}, "DDPG": {"train/actor_loss", "train/critic_loss"},
    "TD3": {"train/actor_loss", "train/critic_loss"},
    "SAC": {"train/actor_loss", "train/critic_loss", "train/ent_coef", "train/ent_coef_loss"},
    "CrossQ": {"train/actor_loss", "train/critic_loss", "train/ent_coef", "train/ent_coef_loss"},
    "PPO": {"train/policy_gradient_loss", "train/value_loss", "train/entropy_loss", "train/approx_kl",
            "train/clip_fraction", "train/explained_variance", "train/loss", "train/clip_range", "train/std"},
    "A2C": {"train/policy_loss", "train/value_loss", "train/entropy_loss", "train/explained_variance"},
}
SHORT = {"DQN": dict(learning_starts=100, train_freq=10, batch_size=16, buffer_size=1000),
         "PPO": dict(n_steps=100, batch_size=50, n_epochs=2), "A2C": dict(n_steps=20)}


@pytest.mark.parametrize("name", list(LOSS_KEYS))
def test_the_loss_scalars_sb3_logs_one_table_per_log_interval(name, tmp_path):
    import csv

    from stable_baselines3.common.logger import configure

    env = "CartPole-v1" if name in ("DQN", "A2C") else "Pendulum-v1"
    kw = SHORT.get(name, dict(learning_starts=100, batch_size=16, buffer_size=1000,
                              policy_kwargs=dict(net_arch=[16, 16])))
    m = getattr(hetrl, name)("MlpPolicy", env, **kw, **FAST)
    m.set_logger(configure(str(tmp_path), ["csv"]))   # SB3's own logger: its CSV has a column per key written
    m.learn(1000 if name != "A2C" else 2000, log_interval=1)
    with open(tmp_path / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and LOSS_KEYS[name] <= set(rows[0])
    last = rows[-1]
    assert all(last[k] not in ("", "nan") for k in LOSS_KEYS[name])
    steps = [int(r["time/total_timesteps"]) for r in rows]
    assert steps == sorted(set(steps))   # one table per timestep: none logged twice


def test_verbose_1_says_the_plan_in_one_line_and_the_bar_is_sb3s(tmp_path, monkeypatch, capfd):
    from synthetic_profiles import synthetic_table

    from hetrl.planner.profile import cache_path, grid_for, machine_info, machine_id, network_key

    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path))
    m = hetrl.DQN("MlpPolicy", "CartPole-v1", verbose=1, learning_starts=100, train_freq=50, batch_size=16,
                  seed=0, threads=1, device="cpu", learner_kernel="public")
    cfg = m._config(600, "none")[0]   # a synthetic profile of this machine where the planner looks (no profiling)
    machine = machine_info()
    t = synthetic_table(algo=cfg.algo, env=cfg.env, env_step_s=3e-3, learn_s={"cpu": 1e-3})
    t.data.update(machine=machine, machine_id=machine_id(machine), grid=grid_for(cfg, False, machine["cores"]))
    t.data["key"]["network"] = network_key(cfg)
    t.save(cache_path(cfg, machine))
    m.learn(600, progress_bar=True)
    out, err = capfd.readouterr()
    hetrl_lines = [line for line in (out + err).splitlines() if line.startswith("hetrl:")]
    assert len(hetrl_lines) == 1 and "planned for" in hetrl_lines[0], hetrl_lines
    assert "env steps/s  " not in out + err          # no text progress lines: the bar (tqdm.rich) instead
    assert "600/600" in out + err and "train/loss" in out


def test_a_vec_env_of_the_wrong_kind_is_one_line():
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class MyWrapper(VecEnvWrapper):
        def reset(self):
            return self.venv.reset()

        def step_wait(self):
            return self.venv.step_wait()

    for env, words in [(MyWrapper(make_vec_env("CartPole-v1", n_envs=2)), "wrapper MyWrapper is not supported"),
                       (42, "env of type int is not supported")]:
        with pytest.raises(UsageError, match=words) as e:
            hetrl.PPO("MlpPolicy", env, **FAST)
        assert "\n" not in str(e.value)
