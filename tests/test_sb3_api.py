"""The SB3-style classes (hetrl/sb3/): SB3's constructor and defaults, each argument's mapping or its one-line
refusal, learn / predict / save / load / envs / parameters / replay, and the same learner as hetrl.train."""

from __future__ import annotations

import inspect
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch

import hetrl
from hetrl import DDPG, DQN, SAC, TD3
from hetrl.errors import UsageError
from hetrl.sb3 import NormalActionNoise, OrnsteinUhlenbeckActionNoise

try:
    import stable_baselines3 as sb3
except ImportError:   # SB3's own objects are checked where it is installed (the test extra has it)
    sb3 = None
needs_sb3 = pytest.mark.skipif(sb3 is None, reason="stable-baselines3 not installed")

# fast settings, SB3's names: a short DQN on CartPole, a short SAC on Pendulum
FAST_DQN = dict(learning_starts=100, train_freq=50, gradient_steps=10, batch_size=32, buffer_size=2000,
                policy_kwargs=dict(net_arch=[32, 32]), seed=0, plan="none", threads=1, device="cpu",
                learner_kernel="public")
FAST_SAC = dict(learning_starts=100, train_freq=50, gradient_steps=5, batch_size=32, buffer_size=2000,
                policy_kwargs=dict(net_arch=[32, 32]), seed=0, plan="none", threads=1, device="cpu",
                learner_kernel="public")   # the compiled kernel is tested in test_compiled.py (it compiles for minutes)


def params_equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


# ---- construction: SB3's contract --------------------------------------------------------------------------
@pytest.mark.parametrize("cls,want", [
    (DQN, dict(lr=1e-4, buffer_size=1_000_000, learning_starts=100, batch_size=32, tau=1.0, train_freq=4,
               gradient_steps=1, target_update_interval=10_000, exploration_fraction=0.1, exploration_final_eps=0.05,
               max_grad_norm=10.0, net_arch=[64, 64])),
    (SAC, dict(lr=3e-4, batch_size=256, tau=0.005, train_freq=1, gradient_steps=1, ent_coef="auto",
               target_entropy="auto", net_arch=[256, 256], qf_arch=[])),
    (TD3, dict(lr=1e-3, batch_size=256, policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5,
               net_arch=[400, 300], noise_std=0.0)),
    (DDPG, dict(lr=1e-3, batch_size=256, tau=0.005, net_arch=[400, 300], noise_std=0.0)),
])
def test_defaults_are_sb3s_not_hetrls_presets(cls, want):
    env = "CartPole-v1" if cls is DQN else "Pendulum-v1"
    s = cls("MlpPolicy", env, seed=0).hetrl_settings
    assert {k: s[k] for k in want} == want
    assert s["eval_episodes"] == 0 and s["keep_best"] is False   # SB3 evaluates only in a callback


@needs_sb3
@pytest.mark.parametrize("name", ["DQN", "SAC", "TD3", "DDPG"])
def test_signature_is_sb3s(name):
    ours = inspect.signature(getattr(hetrl, name)).parameters
    theirs = {k: p for k, p in inspect.signature(getattr(sb3, name)).parameters.items() if k != "_init_setup_model"}
    assert list(ours)[:-1] == list(theirs)
    for k, p in theirs.items():
        if p.default is not inspect.Parameter.empty:
            assert ours[k].default == p.default, k


def test_every_registered_algorithm_gets_a_class():
    from hetrl import registry
    from hetrl.algos.dqn import DQN as DQNAlgo
    from hetrl.sb3 import model_class

    class MyDQN(DQNAlgo):
        """A user's algorithm."""

    hetrl.register_algorithm("mydqn", MyDQN, replace=True)
    try:
        cls = model_class("mydqn")
        assert cls is hetrl.MYDQN and "mydqn" in registry.names()
        m = cls("MlpPolicy", "CartPole-v1", **FAST_DQN).learn(300)
        assert m.num_timesteps == 300 and type(m._algo()) is MyDQN
    finally:
        registry._REGISTRY.pop("mydqn", None)


def test_a_users_algorithm_gets_the_generic_class_or_the_one_its_sb3_attribute_declares(tmp_path):
    """docs/extending.md's TwinQ declares no `sb3`: its class takes SB3's common off-policy arguments with the
    defaults of its own settings; a subclass declaring an SB3Compat gets its class name, layers and critics."""
    import extending_example

    from hetrl import registry
    from hetrl.sb3 import model_class
    from hetrl.sb3 import SB3Compat

    cls = hetrl.TWINQ
    assert cls is model_class("twinq") and cls.__name__ == "TWINQ"
    params = inspect.signature(cls).parameters
    own = extending_example.TwinQSettings()
    assert list(params)[:3] == ["policy", "env", "learning_rate"] and "n_steps" in params and "device" in params
    assert (params["learning_rate"].default, params["tau"].default, params["batch_size"].default) == \
        (own.lr, own.tau, own.batch_size)
    m = cls("MlpPolicy", "CartPole-v1", **FAST_DQN)
    assert (m.hetrl_settings["tau"], m.hetrl_settings["net_arch"]) == (own.tau, [32, 32])
    m.learn(300)
    assert m.num_timesteps == 300 and type(m._algo()) is extending_example.TwinQ
    assert m.predict(np.zeros(4, np.float32), deterministic=True)[0] in (0, 1)
    with pytest.raises(UsageError, match="n_critics=2"):
        cls("MlpPolicy", "CartPole-v1", policy_kwargs={"n_critics": 2})
    if sb3 is not None:
        with pytest.raises(UsageError, match="no Stable-Baselines3 policy class"):
            m.policy.save(tmp_path / "policy")

    class MyTwinQ(extending_example.TwinQ):
        sb3 = SB3Compat(class_name="MyTwinQ", net_arch=[24], n_critics=2, policy_aliases=("TwinQPolicy",))

    hetrl.register_algorithm("mytwinq", MyTwinQ, replace=True)
    try:
        m = hetrl.MyTwinQ("TwinQPolicy", "CartPole-v1", policy_kwargs={"n_critics": 2}, seed=0, plan="none")
        assert type(m).__name__ == "MyTwinQ" and m.policy_class == "MlpPolicy"
        assert m.get_parameters()["q"]["0.0.weight"].shape == (24, 4)
    finally:
        registry._REGISTRY.pop("mytwinq", None)


def test_hetrl_keywords_pass_through():
    m = DQN("MlpPolicy", "CartPole-v1", schedule="local", actors=2, learner_kernel="public", double=True, seed=0)
    s = m.hetrl_settings
    assert (s["schedule"], s["actors"], s["learner_kernel"], s["double"]) == ("local", 2, "public", True)


@pytest.mark.parametrize("cls,env,kwargs,words", [
    (SAC, "Pendulum-v1", dict(use_sde=True), "use_sde=True"),
    (SAC, "Pendulum-v1", dict(train_freq=(1, "episode")), "never per episode"),
    (SAC, "Pendulum-v1", dict(policy_kwargs=dict(n_critics=3)), "n_critics=3"),
    (SAC, "Pendulum-v1", dict(policy_kwargs=dict(activation_fn=torch.nn.SiLU)), "activation_fn=SiLU"),
    (SAC, "Pendulum-v1", dict(policy_kwargs=dict(normalize_images=False)), "normalize_images=False"),
    (SAC, "Pendulum-v1", dict(policy_kwargs=dict(squash_output=True)), "squash_output"),
    (SAC, "Pendulum-v1", dict(target_update_interval=2), "target_update_interval=2"),
    (SAC, "Pendulum-v1", dict(action_noise=NormalActionNoise(np.zeros(1), 0.1 * np.ones(1))), "adds no action noise"),
    (TD3, "Pendulum-v1", dict(action_noise=NormalActionNoise(np.ones(1), 0.1 * np.ones(1))), "mean 0"),
    (TD3, "Pendulum-v1", dict(action_noise=OrnsteinUhlenbeckActionNoise(np.zeros(1), np.ones(1), theta=0.3)),
     "theta=0.15"),
    (DQN, "CartPole-v1", dict(replay_buffer_class=type("HerReplayBuffer", (), {})), "HerReplayBuffer"),
    (DQN, "CartPole-v1", dict(replay_buffer_kwargs=dict(n_sampled_goal=4)), "n_sampled_goal"),
    (DQN, "CartPole-v1", dict(bogus=1), "unknown argument 'bogus'"),
    (DQN, "CartPole-v1", dict(learning_rate=1e-3, lr=1e-3), "both learning_rate= and lr="),
    (DQN, "CartPole-v1", dict(policy_kwargs=dict(net_arch=dict(pi=[8], qf=[8]))), "DQN takes a list"),
    (DQN, "Pendulum-v1", {}, "DQN needs a discrete action space"),
])
def test_unsupported_arguments_are_one_clear_error(cls, env, kwargs, words):
    with pytest.raises(UsageError, match=None) as e:
        cls("MlpPolicy", env, seed=0, **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_policies():
    with pytest.raises(UsageError, match="CnnPolicy' needs image observations"):
        DQN("CnnPolicy", "CartPole-v1")
    with pytest.raises(UsageError, match="MultiInputPolicy' needs Dict observations"):
        DQN("MultiInputPolicy", "CartPole-v1")
    with pytest.raises(UsageError, match="policy='LnMlpPolicy' is not supported"):
        DQN("LnMlpPolicy", "CartPole-v1")


class _ImageAndVector(gym.Env):
    """SB3's SimpleMultiObsEnv's kind of observation: a vector and an image in a Dict."""
    observation_space = gym.spaces.Dict({"vec": gym.spaces.Box(0, 1, (5,)),
                                         "img": gym.spaces.Box(0, 255, (1, 16, 16), np.uint8)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_a_dict_observation_with_an_image_is_one_line():
    """SB3 runs a Dict's image through a CNN; hetrl would flatten raw pixels into its MLP: refused."""
    with pytest.raises(UsageError, match=r"hold images \('img' \(1, 16, 16\)\)") as e:
        DQN("MultiInputPolicy", _ImageAndVector(), plan="none")
    assert "\n" not in str(e.value)


def test_policy_kwargs_map_to_settings():
    m = SAC("MlpPolicy", "Pendulum-v1", seed=0, policy_kwargs=dict(net_arch=dict(pi=[64, 64], qf=[400, 300]),
                                                                   activation_fn=torch.nn.Tanh, n_critics=2))
    s = m.hetrl_settings
    assert (s["net_arch"], s["qf_arch"], s["activation"]) == ([64, 64], [400, 300], "tanh")
    p = m.get_parameters()
    assert p["policy"]["actor.latent_pi.0.weight"].shape == (64, 3) and p["policy"]["critic.qf0.0.weight"].shape == (400, 4)
    p = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[8])).get_parameters()
    assert p["policy"]["q_net.q_net.0.weight"].shape == (8, 4)


def test_action_noise_and_train_freq():
    m = TD3("MlpPolicy", "Pendulum-v1", action_noise=NormalActionNoise(np.zeros(1), 0.3 * np.ones(1)), seed=0)
    assert (m.hetrl_settings["noise_type"], m.hetrl_settings["noise_std"]) == ("normal", 0.3)
    m = DDPG("MlpPolicy", "Pendulum-v1", action_noise=OrnsteinUhlenbeckActionNoise(np.zeros(1), 0.5 * np.ones(1)))
    assert (m.hetrl_settings["noise_type"], m.hetrl_settings["noise_std"]) == ("ou", 0.5)
    venv = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
    m = SAC("MlpPolicy", venv, train_freq=(3, "step"), seed=0)
    assert (m.n_envs, m.hetrl_settings["num_envs"], m.hetrl_settings["train_freq"]) == (2, 2, 6)  # SB3: vector steps


@needs_sb3
def test_sb3_noise_objects():
    from stable_baselines3.common.noise import NormalActionNoise as SB3Normal

    m = TD3("MlpPolicy", "Pendulum-v1", action_noise=SB3Normal(np.zeros(1), 0.2 * np.ones(1)))
    assert m.hetrl_settings["noise_std"] == 0.2


# ---- learning ------------------------------------------------------------------------------------------------
def test_learn_twice_continues_the_same_run_and_reset_keeps_the_replay():
    m = DQN("MlpPolicy", "CartPole-v1", **FAST_DQN)
    assert m.learn(400) is m and m.num_timesteps == 400
    run, updates = m.run, m._algo().updates
    m.learn(300, reset_num_timesteps=False)
    assert m.run is run and m.num_timesteps == 700 and run.cfg.steps == 700 and m._algo().updates > updates
    m.learn(200)   # SB3's default: the count starts again, networks and replay are kept
    assert m.num_timesteps == 200 and m.run is not run and m.replay_buffer.size() == 900


def test_learn_twice_under_local():
    m = DQN("MlpPolicy", "CartPole-v1", **{**FAST_DQN, "threads": 0}, schedule="local", actors=1)
    m.learn(300)
    m.learn(300, reset_num_timesteps=False)
    assert m.num_timesteps == 600 and m.run.schedule.name == "local"
    m.run.close()


def test_learning_rate_schedule_sets_the_optimizers():
    sched = lambda progress_remaining: 1e-3 * (0.5 + 0.5 * progress_remaining)  # noqa: E731
    m = SAC("MlpPolicy", "Pendulum-v1", learning_rate=sched, **FAST_SAC).learn(400)
    algo = m._algo()
    lrs = {g["lr"] for o in (algo.actor_opt.opt, algo.critic_opt.opt, algo.alpha_opt) for g in o.param_groups}
    assert lrs == {sched(0.0)}   # set before each learner call, at its progress (the last: after all 400 steps)
    m.learn(400, reset_num_timesteps=False)   # 800 in all: the schedule over the new total
    assert {g["lr"] for g in algo.actor_opt.opt.param_groups} == {sched(0.0)}
    lin = SAC("MlpPolicy", "Pendulum-v1", learning_rate="lin_1e-3", **FAST_SAC)
    assert (lin.hetrl_settings["lr"], lin.hetrl_settings["lr_schedule"]) == (1e-3, "linear")
    lin.learn(200)
    assert {g["lr"] for g in lin._algo().critic_opt.opt.param_groups} == {0.0}


def test_class_api_learns_what_hetrl_train_learns():
    """The same learner underneath: the class's settings through hetrl.train give the same parameters."""
    m = DQN("MlpPolicy", "CartPole-v1", **FAST_DQN).learn(600)
    s = dict(m.hetrl_settings)
    run = hetrl.train("dqn", env="CartPole-v1", steps=600, seed=0, plan="none", progress=False, **s)
    assert params_equal(m._algo().state_dict()["q"], run.algo.state_dict()["q"])
    m = SAC("MlpPolicy", "Pendulum-v1", **FAST_SAC).learn(400)
    run = hetrl.train("sac", env="Pendulum-v1", steps=400, seed=0, plan="none", progress=False, **m.hetrl_settings)
    assert params_equal(m._algo().state_dict()["actor"], run.algo.state_dict()["actor"])


# ---- acting ------------------------------------------------------------------------------------------------------
def test_predict_one_observation_and_a_batch():
    m = DQN("MlpPolicy", "CartPole-v1", **FAST_DQN).learn(200)
    obs = np.zeros(4, np.float32)
    a, state = m.predict(obs, deterministic=True)
    assert a.shape == () and state is None and a == m.predict(obs, deterministic=True)[0]
    batch = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    assert m.predict(batch, deterministic=True)[0].shape == (5,)
    assert m.predict(batch)[0].shape == (5,)   # epsilon-greedy at the model's step count
    s = SAC("MlpPolicy", "Pendulum-v1", **FAST_SAC)
    one, _ = s.predict([1.0, 0.0, 0.0])
    many, _ = s.predict(np.zeros((3, 3)), deterministic=True)
    assert one.shape == (1,) and many.shape == (3, 1) and np.all(np.abs(many) <= 2.0)


def test_predict_on_get_env():
    m = DQN("MlpPolicy", "CartPole-v1", **FAST_DQN)
    venv = m.get_env()
    obs = venv.reset()
    action, _ = m.predict(obs, deterministic=True)
    obs, rewards, dones, infos = venv.step(action)
    assert obs.shape == (1, 4) and rewards.shape == (1,) and len(infos) == 1


# ---- envs --------------------------------------------------------------------------------------------------------
def test_env_instance_is_trained_on_copies_and_given_back():
    env = gym.make("Pendulum-v1")
    m = SAC("MlpPolicy", env, **FAST_SAC).learn(200)
    assert m.num_timesteps == 200
    venv = m.get_env()
    inner = venv.envs[0]
    while inner is not env and hasattr(inner, "env"):
        inner = inner.env
    assert inner is env


def test_gymnasium_vector_env():
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    m = DQN("MlpPolicy", venv, **FAST_DQN)
    assert m.n_envs == 2 and m.hetrl_settings["num_envs"] == 2
    m.learn(200)   # a lambda factory cannot go to actor processes: planned runs keep to inline
    assert m.num_timesteps == 200


@needs_sb3
def test_sb3_vec_env():
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

    venv = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    m = DQN("MlpPolicy", venv, **FAST_DQN).learn(200)
    assert m.get_env() is venv and m.n_envs == 2 and m.num_timesteps == 200
    assert DQN("MlpPolicy", VecFrameStack(venv, 3)).hetrl_settings["frame_stack"] == 3
    with pytest.raises(UsageError, match="VecNormalize env, but hetrl.s DQN does not normalise"):
        DQN("MlpPolicy", VecNormalize(venv))


def test_set_env_checks_and_keeps_training():
    m = DQN("MlpPolicy", "CartPole-v1", **FAST_DQN).learn(200)
    m.set_env(gym.make("CartPole-v1"))
    m.learn(200, reset_num_timesteps=False)
    assert m.num_timesteps == 400
    with pytest.raises(UsageError, match="differ"):
        m.set_env("Acrobot-v1")


# ---- saving, parameters, replay -------------------------------------------------------------------------------------
def test_save_load_round_trip_continues_training(tmp_path):
    m = SAC("MlpPolicy", "Pendulum-v1", **FAST_SAC).learn(300)
    m.save(tmp_path / "sac_pendulum")
    assert zipfile.is_zipfile(tmp_path / "sac_pendulum.zip")
    obs = np.array([0.3, 0.1, -0.2], np.float32)
    loaded = SAC.load(tmp_path / "sac_pendulum")
    assert loaded.num_timesteps == 300 and loaded.hetrl_settings == m.hetrl_settings
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], m.predict(obs, deterministic=True)[0])
    assert params_equal(loaded.get_parameters()["policy"], m.get_parameters()["policy"])
    loaded.learn(200, reset_num_timesteps=False)
    assert loaded.num_timesteps == 500 and loaded._algo().updates > m._algo().updates
    with pytest.raises(UsageError, match="holds a SAC model"):
        TD3.load(tmp_path / "sac_pendulum")


def test_a_model_of_an_env_instance_loads_without_env(tmp_path):
    SAC("MlpPolicy", gym.make("Pendulum-v1"), **FAST_SAC).learn(150).save(tmp_path / "m")
    m = SAC.load(tmp_path / "m")   # SB3: a model without env predicts, and learns once given one
    assert m.get_env() is None and m.predict(np.zeros(3, np.float32))[0].shape == (1,)
    with pytest.raises(UsageError, match="has no env"):
        m.learn(10)
    m = SAC.load(tmp_path / "m", env=gym.make("Pendulum-v1"))
    assert m.learn(100, reset_num_timesteps=False).num_timesteps == 250


def test_save_to_a_directory_is_a_run_directory(tmp_path):
    m = DQN("MlpPolicy", "CartPole-v1", **FAST_DQN).learn(200)
    m.save(str(tmp_path / "run") + "/")
    assert (tmp_path / "run" / "checkpoint.pt").is_file()
    policy = hetrl.load(tmp_path / "run")
    obs = np.zeros(4, np.float32)
    assert policy.act(obs) == m.predict(obs, deterministic=True)[0]
    assert DQN.load(tmp_path / "run").num_timesteps == 200


def test_load_with_changes_and_a_new_env(tmp_path):
    DQN("MlpPolicy", "CartPole-v1", **FAST_DQN).learn(200).save(tmp_path / "m")
    m = DQN.load(tmp_path / "m", env=gym.make("CartPole-v1"), learning_rate=5e-4, schedule="inline")
    assert m.hetrl_settings["lr"] == 5e-4
    m.learn(100)
    assert m.num_timesteps == 100
    with pytest.raises(UsageError, match="cannot change on load"):
        DQN.load(tmp_path / "m", bogus=1)


def test_get_set_parameters():
    a = DQN("MlpPolicy", "CartPole-v1", **FAST_DQN).learn(300)
    b = DQN("MlpPolicy", "CartPole-v1", **{**FAST_DQN, "seed": 1})
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    b.set_parameters(a.get_parameters())
    assert np.array_equal(a.predict(obs, deterministic=True)[0], b.predict(obs, deterministic=True)[0])
    with pytest.raises(UsageError, match="exact_match=False"):
        b.set_parameters({"policy": a.get_parameters()["policy"]})
    b.set_parameters({"policy": b.get_parameters()["policy"]}, exact_match=False)
    b.learn(200)   # parameters set before the first learn() are the Run's
    a.set_parameters(b.get_parameters())   # ... and set into an open Run
    assert np.array_equal(a.predict(obs, deterministic=True)[0], b.predict(obs, deterministic=True)[0])
    a.learn(100, reset_num_timesteps=False)


def test_replay_buffer_save_and_load(tmp_path):
    m = SAC("MlpPolicy", "Pendulum-v1", **FAST_SAC).learn(300)
    m.save(tmp_path / "sac")
    loaded = SAC.load(tmp_path / "sac")
    assert loaded.replay_buffer.size() == 0   # model.save() holds no replay, as SB3's
    m.save_replay_buffer(tmp_path / "replay")
    assert (tmp_path / "replay.pkl").is_file()
    loaded.load_replay_buffer(tmp_path / "replay")
    assert loaded.replay_buffer.size() == 300
    loaded.learn(100, reset_num_timesteps=False)
    assert loaded.replay_buffer.size() == 400
    small = SAC("MlpPolicy", "Pendulum-v1", **{**FAST_SAC, "buffer_size": 100})
    with pytest.raises(UsageError, match="does not fit"):
        small.learn(1)
        small.load_replay_buffer(tmp_path / "replay")


@needs_sb3
def test_policy_save_is_sb3s_policy_file(tmp_path):
    from stable_baselines3.sac.policies import MlpPolicy

    m = SAC("MlpPolicy", "Pendulum-v1", **FAST_SAC).learn(200)
    m.policy.save(tmp_path / "policy")
    sb3_policy = MlpPolicy.load(tmp_path / "policy")
    obs = np.random.default_rng(2).normal(size=(4, 3)).astype(np.float32)
    assert np.allclose(sb3_policy.predict(obs, deterministic=True)[0], m.predict(obs, deterministic=True)[0], atol=1e-6)


def test_logging(tmp_path, capsys):
    m = DQN("MlpPolicy", "CartPole-v1", **FAST_DQN, verbose=1, tensorboard_log=str(tmp_path / "tb"))
    m.learn(300, log_interval=2)
    out = capsys.readouterr().out
    assert "rollout/ep_rew_mean" in out and "time/total_timesteps" in out
    assert any((tmp_path / "tb" / "DQN_1").iterdir())
    assert len(m.ep_info_buffer) > 0 and m.logger.get_dir().endswith("DQN_1")
