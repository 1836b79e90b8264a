"""hetrl.PPO and hetrl.A2C with Stable-Baselines3's interface: SB3's own scripts with only the import changed
(the quickstart, multiprocessing with SubprocVecEnv, VecNormalize), signatures and defaults, rollout callbacks,
the loss scalars, save / load, SB3's policy file, and bad input in one line."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import hetrl
from hetrl.errors import UsageError

sb3 = pytest.importorskip("stable_baselines3")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh machine profile cache: the quickstart plans as a user's first run does, profiling for real."""
    return tmp_path_factory.mktemp("cache")


def run_script(tmp_path, cache, source: str, timeout: int = 240) -> str:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "HETRL_CACHE_DIR": str(cache)})
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


@pytest.mark.parametrize("name", ["PPO", "A2C"])
def test_signature_and_defaults_are_sb3s(name):
    ours = inspect.signature(getattr(hetrl, name)).parameters
    theirs = {k: v for k, v in inspect.signature(getattr(sb3, name)).parameters.items() if k != "_init_setup_model"}
    assert list(theirs) == [k for k in ours if k != "hetrl_kwargs"]
    for k, p in theirs.items():
        assert ours[k].default == p.default, k


def test_sb3_quickstart_a2c_cartpole(tmp_path, cache):
    """SB3's README / quickstart, only the import changed (render_mode kept; no window is shown) and its 10,000 steps
    made 2,000 to keep the suite short (benchmarks/sb3_examples/ runs it as written)."""
    out = run_script(tmp_path, cache, '''
        import gymnasium as gym

        from hetrl import A2C

        env = gym.make("CartPole-v1", render_mode="rgb_array")

        model = A2C("MlpPolicy", env, verbose=1)
        model.learn(total_timesteps=2_000)

        vec_env = model.get_env()
        obs = vec_env.reset()
        for i in range(1000):
            action, _state = model.predict(obs, deterministic=True)
            obs, reward, done, info = vec_env.step(action)
            vec_env.render("rgb_array")
        print("steps", model.num_timesteps)
    ''')
    assert "steps 2000" in out and "train/value_loss" in out and "train/policy_loss" in out


def test_sb3_multiprocessing_ppo_with_subproc_vec_env_save_and_load(tmp_path, monkeypatch):
    """SB3's multiprocessing example (make_vec_env with SubprocVecEnv), only the import changed. It plans from a
    profile already cached, as a user's second run does (the quickstart above makes its first profile for real)."""
    from stable_baselines3.common.env_util import make_vec_env
    from synthetic_profiles import save_for_this_machine

    cache = tmp_path / "cache"
    monkeypatch.setenv("HETRL_CACHE_DIR", str(cache))
    model = hetrl.PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4), n_steps=32, batch_size=64)
    profile = save_for_this_machine(model._config(1000, "none")[0], env_step_s=3e-5, learn_s={"cpu": 1e-3})
    out = run_script(tmp_path, cache, '''
        from stable_baselines3.common.env_util import make_vec_env
        from stable_baselines3.common.vec_env import SubprocVecEnv

        from hetrl import PPO

        if __name__ == "__main__":
            vec_env = make_vec_env("CartPole-v1", n_envs=4, vec_env_cls=SubprocVecEnv)
            model = PPO("MlpPolicy", vec_env, n_steps=32, batch_size=64, verbose=1)
            model.learn(total_timesteps=1000)
            model.save("ppo_cartpole")
            del model
            model = PPO.load("ppo_cartpole")
            obs = vec_env.reset()
            for _ in range(50):
                action, _states = model.predict(obs)
                obs, rewards, dones, info = vec_env.step(action)
            print("done", model.num_timesteps, model.n_envs, model.n_steps)
    ''')
    assert "done 1024 4 32" in out and "planned for" in out
    assert json.loads(profile.read_text())["created"] == "synthetic"   # planned from it: not profiled again
    for key in ("train/policy_gradient_loss", "train/value_loss", "train/entropy_loss", "train/approx_kl",
                "train/clip_fraction", "train/loss", "train/explained_variance", "train/clip_range", "time/iterations"):
        assert key in out, key


def test_vec_normalize_trains_saves_and_evaluates_as_sb3s(tmp_path):
    """SB3's VecNormalize example (Pendulum in place of a PyBullet env): the statistics hetrl learned are the
    user's VecNormalize's after learn(), saved and loaded by SB3, and predict takes its normalised observations."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    vec_env = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    vec_env = VecNormalize(vec_env, norm_obs=True, norm_reward=True, clip_obs=10.0)
    model = hetrl.PPO("MlpPolicy", vec_env, n_steps=128, batch_size=64, n_epochs=2, seed=0, plan="none")
    assert model.hetrl_settings["normalize_obs"] and model.hetrl_settings["normalize_reward"]
    model.learn(total_timesteps=512)
    norm = model.policy  # noqa: F841  (SB3's attribute exists)
    stats = model._algo().normalization_state()
    np.testing.assert_allclose(vec_env.obs_rms.mean, stats["obs"][0])
    assert vec_env.obs_rms.count == pytest.approx(512 + 1e-4) and vec_env.ret_rms.count > 1
    assert model.get_vec_normalize_env() is vec_env
    model.save(tmp_path / "ppo_pendulum")
    vec_env.save(str(tmp_path / "vec_normalize.pkl"))
    del model, vec_env

    vec_env = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    vec_env = VecNormalize.load(str(tmp_path / "vec_normalize.pkl"), vec_env)
    vec_env.training = False
    vec_env.norm_reward = False
    model = hetrl.PPO.load(tmp_path / "ppo_pendulum", env=vec_env)
    obs = vec_env.reset()
    action, _ = model.predict(obs, deterministic=True)
    # the same action as hetrl's own policy on the raw observation (it normalises itself)
    raw = vec_env.get_original_obs()
    alone = hetrl.PPO.load(tmp_path / "ppo_pendulum")
    np.testing.assert_allclose(action, alone.predict(raw, deterministic=True)[0], rtol=1e-4, atol=1e-5)


def test_rollout_callbacks_once_per_rollout_and_on_step_per_vector_step():
    from stable_baselines3.common.callbacks import BaseCallback

    class Count(BaseCallback):
        def __init__(self):
            super().__init__()
            self.starts = self.ends = self.steps = 0

        def _on_rollout_start(self) -> None:
            self.starts += 1

        def _on_rollout_end(self) -> None:
            self.ends += 1

        def _on_step(self) -> bool:
            self.steps += 1
            return True

    cb = Count()
    model = hetrl.PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, seed=0, plan="none")
    model.learn(total_timesteps=64, callback=cb)
    assert (cb.starts, cb.ends, cb.steps) == (4, 4, 64)


def test_policy_kwargs_and_sb3s_policy_file():
    from stable_baselines3.common.policies import ActorCriticPolicy

    model = hetrl.PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0, plan="none",
                      policy_kwargs=dict(net_arch=dict(pi=[32], vf=[16, 16]), activation_fn=torch.nn.ReLU,
                                         ortho_init=False, log_std_init=-1.0))
    s = model.hetrl_settings
    assert (s["net_arch"], s["vf_arch"], s["activation"], s["ortho_init"], s["log_std_init"]) == \
        ([32], [16, 16], "relu", False, -1.0)
    assert float(model._algo().policy.log_std.detach().mean()) == pytest.approx(-1.0)
    model.learn(total_timesteps=128)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"hetrl-ppo-policy-{os.getpid()}.pt")
    model.policy.save(path)
    policy = ActorCriticPolicy.load(path)
    obs = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    np.testing.assert_allclose(policy.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0],
                               rtol=1e-5, atol=1e-6)
    os.remove(path)


def test_a_linear_clip_schedule_callable_and_the_zoo_form():
    model = hetrl.PPO("MlpPolicy", "CartPole-v1", clip_range=lambda p: 0.3 * p, learning_rate="lin_1e-3")
    s = model.hetrl_settings
    assert (s["clip_range"], s["clip_range_schedule"], s["lr"], s["lr_schedule"]) == (0.3, "linear", 1e-3, "linear")


@pytest.mark.parametrize("make,match", [
    (lambda: hetrl.PPO("MlpPolicy", "CartPole-v1", clip_range=-0.1), "clip_range must be positive"),
    (lambda: hetrl.PPO("MlpPolicy", "CartPole-v1", clip_range=lambda p: 0.2 * p * p), "constant or linear"),
    (lambda: hetrl.PPO("MlpPolicy", "CartPole-v1", use_sde=True), "gSDE"),
    (lambda: hetrl.PPO("MlpPolicy", "CartPole-v1", n_epochs=0), "n_epochs must be positive"),
    (lambda: hetrl.A2C("MlpPolicy", "CartPole-v1", gae_lambda=2.0), "gae_lambda must be in"),
    (lambda: hetrl.PPO("MlpPolicy", "CartPole-v1", rollout_buffer_kwargs={"x": 1}), "rollout_buffer_kwargs"),
    (lambda: hetrl.PPO("CnnPolicy", "CartPole-v1"), "CnnPolicy"),
])
def test_bad_input_is_one_line(make, match):
    with pytest.raises(UsageError, match=match) as e:
        make()
    assert "\n" not in str(e.value)


def test_a_vec_env_of_the_wrong_kind_is_one_line():
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize, VecVideoRecorder

    venv = VecNormalize(make_vec_env("CartPole-v1", n_envs=2))
    with pytest.raises(UsageError, match="does not normalise") as e:
        hetrl.DQN("MlpPolicy", venv)                          # an off-policy algorithm: no normalisation
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="gamma") as e:
        hetrl.PPO("MlpPolicy", VecNormalize(make_vec_env("CartPole-v1", n_envs=2), gamma=0.9))
    assert "\n" not in str(e.value)
    rec = VecVideoRecorder(make_vec_env("CartPole-v1", n_envs=2, env_kwargs={"render_mode": "rgb_array"}),
                           "/tmp/hetrl-no-video", record_video_trigger=lambda step: False)
    with pytest.raises(UsageError, match="VecVideoRecorder is not supported") as e:
        hetrl.PPO("MlpPolicy", rec)
    assert "\n" not in str(e.value)


def test_cli_bad_ppo_setting_exits_2_with_one_line(capsys):
    from hetrl.cli import main

    assert main(["train", "ppo", "--env", "CartPole-v1", "--set", "clip_range=0", "--plan", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "clip_range" in err
