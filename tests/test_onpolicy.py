"""On-policy learning on the one protocol: the rollout storage, GAE against SB3's RolloutBuffer and a hand
computation, the rollout rule, PPO's and A2C's updates against Stable-Baselines3's on the same weights."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.errors import HetrlError, UsageError
from hetrl.replay.rollout import RolloutStorage, explained_variance, gae

SPEC = {"obs": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "next_obs": ((3,), "float32"),
        "terminated": ((), "bool"), "truncated": ((), "bool"), "steps": ((), "uint8")}


def rows(T, m, seed=0, actor_tag=0.0):
    rng = np.random.default_rng(seed)
    n = T * m
    return {"obs": (rng.standard_normal((n, 3)) + actor_tag).astype(np.float32), "action": rng.integers(0, 2, n),
            "reward": rng.standard_normal(n).astype(np.float32), "next_obs": rng.standard_normal((n, 3)).astype(np.float32),
            "terminated": rng.random(n) < 0.1, "truncated": rng.random(n) < 0.05, "steps": np.ones(n, np.uint8)}


# ---- GAE ------------------------------------------------------------------------------------------------
def test_gae_by_hand():
    """One env, three steps: a termination at step 1 cuts the trace; step 2 bootstraps from V(next_obs)."""
    g, lam = 0.9, 0.5
    r = torch.tensor([[1.0], [2.0], [3.0]])
    v = torch.tensor([[0.5], [0.25], [1.0]])
    nv = torch.tensor([[0.25], [7.0], [2.0]])      # V(next_obs); step 1's is the terminal obs's (never used)
    term = torch.tensor([[False], [True], [False]])
    trunc = torch.zeros(3, 1, dtype=torch.bool)
    adv, ret = gae(r, v, nv, term, trunc, g, lam)
    d2 = 3.0 + g * 2.0 - 1.0
    d1 = 2.0 - 0.25                                 # terminated: no bootstrap
    d0 = 1.0 + g * 0.25 - 0.5
    want = torch.tensor([[d0 + g * lam * d1], [d1], [d2]])
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, want + v)


def test_gae_truncation_bootstraps_from_the_final_observation_and_cuts_the_trace():
    g, lam = 0.99, 0.95
    r, v = torch.ones(2, 1), torch.zeros(2, 1)
    nv = torch.tensor([[5.0], [3.0]])
    adv, _ = gae(r, v, nv, torch.zeros(2, 1, dtype=torch.bool), torch.tensor([[True], [False]]), g, lam)
    assert adv[0, 0] == pytest.approx(1 + g * 5.0)                   # no trace from step 1 across the reset
    assert adv[1, 0] == pytest.approx(1 + g * 3.0)


@pytest.mark.parametrize("lam", [0.0, 0.8, 1.0])
def test_gae_matches_sb3_rollout_buffer(lam):
    """SB3's RolloutBuffer on the same rollout: its timeout bootstrap (reward + gamma V(terminal obs)) and its
    episode starts, against hetrl's next_value and flags."""
    from stable_baselines3.common.buffers import RolloutBuffer

    T, N, gamma = 16, 3, 0.97
    rng = np.random.default_rng(1)
    reward = rng.standard_normal((T, N)).astype(np.float32)
    value = rng.standard_normal((T, N)).astype(np.float32)
    final_value = rng.standard_normal((T, N)).astype(np.float32)     # V(final obs) where an episode ended
    term = rng.random((T, N)) < 0.1
    trunc = (rng.random((T, N)) < 0.1) & ~term
    done = term | trunc
    last_value = rng.standard_normal(N).astype(np.float32)           # V(obs after the rollout)
    following = np.concatenate([value[1:], last_value[None]])         # V(obs_{t+1})
    next_value = np.where(done, final_value, following)

    buf = RolloutBuffer(T, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), "cpu", gae_lambda=lam, gamma=gamma,
                        n_envs=N)
    starts = np.zeros(N, np.float32)
    for t in range(T):
        r = reward[t] + np.where(trunc[t], gamma * final_value[t], 0.0)   # SB3's timeout bootstrap
        buf.add(np.zeros((N, 1), np.float32), np.zeros((N, 1)), r.astype(np.float32), starts,
                torch.as_tensor(value[t]), torch.zeros(N))
        starts = done[t].astype(np.float32)
    buf.compute_returns_and_advantage(torch.as_tensor(last_value), done[-1])

    adv, ret = gae(torch.as_tensor(reward), torch.as_tensor(value), torch.as_tensor(next_value),
                   torch.as_tensor(term), torch.as_tensor(trunc), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), buf.advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), buf.returns, rtol=1e-5, atol=1e-5)


def test_explained_variance():
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(t, t) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(4), t) == pytest.approx(0.0)
    assert np.isnan(explained_variance(t, torch.ones(4)))


# ---- the storage ----------------------------------------------------------------------------------------------
def test_rollout_storage_lays_blocks_out_in_actor_order():
    """Two actors of 2 envs, 4 vector steps each, arriving actor 1 first: (T, N) with actor 0's envs first."""
    st = RolloutStorage(16, SPEC, actors=2)
    b0, b1 = rows(4, 2, seed=0, actor_tag=0.0), rows(4, 2, seed=1, actor_tag=100.0)
    st.insert(b1, actor=1, envs=2)
    assert not st.full
    st.insert(b0, actor=0, envs=2)
    assert st.full and len(st) == 16
    t = st.tensors()
    assert t["obs"].shape == (4, 4, 3) and t["reward"].shape == (4, 4)
    np.testing.assert_array_equal(t["obs"][:, :2].numpy(), b0["obs"].reshape(4, 2, 3))
    np.testing.assert_array_equal(t["obs"][:, 2:].numpy(), b1["obs"].reshape(4, 2, 3))
    np.testing.assert_array_equal(t["action"][2, 3].numpy(), b1["action"][2 * 2 + 1])   # step 2, actor 1's env 1
    st.clear()
    assert len(st) == 0 and not st.full


def test_rollout_storage_takes_an_actors_rows_in_pieces_and_refuses_overflow_and_nan():
    st = RolloutStorage(8, SPEC)
    b = rows(4, 2)
    st.insert({k: v[:4] for k, v in b.items()}, actor=0, envs=2)
    st.insert({k: v[4:] for k, v in b.items()}, actor=0, envs=2)
    np.testing.assert_array_equal(st.tensors()["reward"].numpy(), b["reward"].reshape(4, 2))
    with pytest.raises(HetrlError, match="do not fit"):
        st.insert(rows(1, 2), actor=0, envs=2)
    st.clear()
    bad = rows(4, 2)
    bad["reward"][3] = np.nan
    from hetrl.errors import NonFiniteError
    with pytest.raises(NonFiniteError, match="reward"):
        st.insert(bad, actor=0, envs=2)


# ---- PPO and A2C against Stable-Baselines3 ------------------------------------------------------------------
SB3_NAMES = {"policy.body.0": "mlp_extractor.policy_net.0", "policy.body.2": "mlp_extractor.policy_net.2",
             "policy.action_net": "action_net", "value.body.0": "mlp_extractor.value_net.0",
             "value.body.2": "mlp_extractor.value_net.2", "value.value_net": "value_net", "policy.log_std": "log_std"}


def to_sb3(state: dict) -> dict:
    out = {}
    for k, v in state.items():
        for ours, theirs in SB3_NAMES.items():
            if k == ours or k.startswith(ours + "."):
                out[theirs + k[len(ours):]] = v
    return out


def twin_models(name: str, env_id: str, T: int, N: int, **kw):
    """hetrl's algorithm and SB3's model of the same settings, SB3's weights copied into hetrl's."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env

    sb3_cls = {"ppo": sb3.PPO, "a2c": sb3.A2C}[name]
    sb3_kw = dict(n_steps=T, **({"batch_size": T * N, "n_epochs": 1} if name == "ppo" else {}), **kw)
    model = sb3_cls("MlpPolicy", make_vec_env(env_id, n_envs=N, seed=0), seed=0, device="cpu", **sb3_kw)
    ours_kw = {k: v for k, v in kw.items() if k not in ("learning_rate",)}
    if "learning_rate" in kw:
        ours_kw["lr"] = kw["learning_rate"]
    cfg = make_config(name, env_id, {"num_envs": N, "n_steps": T, **({"batch_size": T * N, "n_epochs": 1}
                                                                       if name == "ppo" else {}), **ours_kw})
    e = gym.make(env_id)
    algo = make_algorithm(cfg, e.observation_space, e.action_space)
    sd = model.policy.state_dict()
    with torch.no_grad():
        for k, v in ours_state(algo).items():     # views of the parameters: SB3's weights copied in
            v.copy_(sd[next(iter(to_sb3({k: v})))])
    return model, algo


def ours_state(algo) -> dict:
    return {**{f"policy.{k}": v for k, v in algo.policy.state_dict().items()},
            **{f"value.{k}": v for k, v in algo.value.state_dict().items()}}


def fill_sb3_buffer(model, data: dict) -> None:
    buf = model.rollout_buffer
    T, N = data["obs"].shape[:2]
    buf.reset()
    buf.observations[:] = data["obs"].reshape(T, N, -1).numpy()
    buf.actions[:] = data["action"].reshape(T, N, -1).numpy()
    buf.values[:] = data["value"].numpy()
    buf.log_probs[:] = data["log_prob"].numpy()
    buf.advantages[:] = data["advantage"].numpy()
    buf.returns[:] = data["return"].numpy()
    buf.pos, buf.full = buf.buffer_size, True


def sb3_params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


def rollout_of(algo, T, N, seed=0, continuous=False, act_dim=1):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, N, algo.obs_shape[0], generator=g)
    action = torch.randn(T, N, act_dim, generator=g) if continuous else torch.randint(0, algo.n_out, (T, N), generator=g)
    with torch.no_grad():
        logp, _, value = algo.evaluate(obs, action)
    return {"obs": obs, "action": action, "value": value, "log_prob": logp + 0.05 * torch.randn(T, N, generator=g),
            "advantage": torch.randn(T, N, generator=g), "return": value + torch.randn(T, N, generator=g)}


@pytest.mark.parametrize("env_id,continuous,kw", [
    ("CartPole-v1", False, {"clip_range_vf": 0.1, "ent_coef": 0.01}),
    ("Pendulum-v1", True, {"ent_coef": 0.0}),
])
def test_ppo_update_matches_sb3(env_id, continuous, kw):
    """One PPO step (one minibatch: the whole rollout, one epoch) from the same weights on the same rollout: the
    same parameters after it, and the same loss scalars as SB3 logs."""
    T, N = 8, 4
    model, algo = twin_models("ppo", env_id, T, N, learning_rate=1e-3, clip_range=0.1, **kw)
    data = rollout_of(algo, T, N, continuous=continuous, act_dim=1)
    fill_sb3_buffer(model, data)
    from stable_baselines3.common.logger import configure
    model.set_logger(configure(None, []))
    model.train()
    logged = model.logger.name_to_value
    batches = {k: v.reshape(1, T * N, *v.shape[2:]) for k, v in data.items()}
    algo.set_progress(1.0)
    algo.learn(batches, torch.ones(1, T * N))
    ours = to_sb3(ours_state(algo))
    theirs = sb3_params(model)
    for k, v in ours.items():
        torch.testing.assert_close(v, theirs[k], rtol=1e-4, atol=1e-5, msg=k)
    for name in ("policy_gradient_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction", "loss"):
        assert float(algo.stats[name]) == pytest.approx(logged[f"train/{name}"], rel=1e-4, abs=1e-6), name


def test_a2c_update_matches_sb3_rmsprop():
    T, N = 5, 4
    model, algo = twin_models("a2c", "CartPole-v1", T, N, ent_coef=0.01, normalize_advantage=True)
    data = rollout_of(algo, T, N)
    fill_sb3_buffer(model, data)
    from stable_baselines3.common.logger import configure
    model.set_logger(configure(None, []))
    model.train()
    logged = model.logger.name_to_value
    algo.learn({k: v.reshape(1, T * N, *v.shape[2:]) for k, v in data.items()}, torch.ones(1, T * N))
    ours = to_sb3(ours_state(algo))
    theirs = sb3_params(model)
    assert isinstance(model.policy.optimizer, torch.optim.RMSprop)
    for k, v in ours.items():
        torch.testing.assert_close(v, theirs[k], rtol=1e-4, atol=1e-5, msg=k)
    for name in ("policy_loss", "value_loss", "entropy_loss"):
        assert float(algo.stats[name]) == pytest.approx(logged[f"train/{name}"], rel=1e-4, abs=1e-6), name


def test_ppo_clip_schedule_and_target_kl_stop():
    cfg = make_config("ppo", "CartPole-v1", {"clip_range": 0.3, "clip_range_schedule": "linear", "target_kl": 0.01,
                                             "num_envs": 2, "n_steps": 8, "batch_size": 4})
    e = gym.make("CartPole-v1")
    algo = make_algorithm(cfg, e.observation_space, e.action_space)
    algo.set_progress(0.5)
    assert float(algo.clip_range) == pytest.approx(0.15)
    assert algo.phase_group(4) == 1                        # target_kl: one minibatch a call, decided between calls
    algo.last_kl = torch.tensor(0.016)
    assert algo.stop_phase()
    algo.last_kl = torch.tensor(0.014)
    assert not algo.stop_phase()


@pytest.mark.parametrize("sets,match", [
    ({"clip_range": 0.0}, "clip_range must be positive"),
    ({"n_epochs": 0}, "n_epochs must be positive"),
    ({"gae_lambda": 1.5}, "gae_lambda must be in"),
    ({"use_sde": True}, "gSDE"),
    ({"target_kl": -1}, "target_kl must be >= 0"),
    ({"vf_coef": -0.5}, "vf_coef must be >= 0"),
    ({"clip_range_schedule": "cosine"}, "clip_range_schedule"),
])
def test_ppo_settings_out_of_range_are_one_line(sets, match):
    with pytest.raises(UsageError, match=match) as e:
        make_config("ppo", "CartPole-v1", sets)
    assert "\n" not in str(e.value)


def test_on_policy_settings_follow_from_the_rollout():
    cfg = make_config("ppo", "CartPole-v1")        # the zoo's: 8 envs x 32 steps, batch 256, 20 epochs
    assert (cfg.train_freq, cfg.buffer_size, cfg.gradient_steps, cfg.learning_starts) == (256, 256, 20, 0)
    cfg = make_config("ppo", "CartPole-v1", {"num_envs": 4, "n_steps": 5, "batch_size": 64, "n_epochs": 3})
    assert cfg.batch_size == 20 and cfg.gradient_steps == 3            # a minibatch is at most the rollout
    cfg = make_config("ppo", "CartPole-v1", {"num_envs": 3, "n_steps": 10, "batch_size": 8, "n_epochs": 2})
    assert cfg.gradient_steps == 2 * 4                                   # 30 rows: 3 of 8 and one of 6
    a2c = make_config("a2c", "CartPole-v1")
    assert (a2c.batch_size, a2c.gradient_steps, a2c.n_epochs) == (40, 1, 1)


def test_continuous_acting_stores_the_unclipped_sample_and_evaluates_the_clipped_mean():
    cfg = make_config("ppo", "Pendulum-v1", {"log_std_init": 1.0})
    e = gym.make("Pendulum-v1")
    algo = make_algorithm(cfg, e.observation_space, e.action_space)
    pol = algo.make_policy(seed=0)
    obs = np.zeros((256, 3), np.float32)
    env_a, stored = pol.act(obs, 1.0)
    assert np.abs(env_a).max() <= 2.0 and np.abs(stored).max() > 2.0   # std e: samples beyond the bounds
    np.testing.assert_array_equal(env_a, np.clip(stored, -2, 2))
    assert pol.act_deterministic(obs).shape == (256, 1)


def test_discrete_acting_samples_the_policy_distribution():
    cfg = make_config("ppo", "CartPole-v1")
    e = gym.make("CartPole-v1")
    algo = make_algorithm(cfg, e.observation_space, e.action_space)
    with torch.no_grad():
        algo.policy.action_net.bias.copy_(torch.tensor([0.0, float(np.log(3.0))]))   # p = (1/4, 3/4)
    pol = algo.make_policy(seed=0)
    a, stored = pol.act(np.zeros((4000, 4), np.float32), 1.0)
    assert a.mean() == pytest.approx(0.75, abs=0.03)
    np.testing.assert_array_equal(a, stored)


@pytest.mark.parametrize("env_id,kw,numpy", [("CartPole-v1", {}, True), ("Pendulum-v1", {"normalize_obs": True}, True),
                                              ("CartPole-v1", {"activation": "relu"}, True),
                                              ("CartPole-v1", {"activation": "elu"}, False)])
def test_the_acting_forward_in_numpy_is_the_networks(env_id, kw, numpy):
    """The actors' forward (NumPy on views of the parameters) gives the network's outputs, after loads in place
    and once pickled (an actor process's copy); a layer it does not know keeps torch's forward."""
    import pickle

    from hetrl.algos.onpolicy import NumpyForward

    e = gym.make(env_id)
    algo = make_algorithm(make_config("ppo", env_id, kw), e.observation_space, e.action_space)
    if kw.get("normalize_obs"):
        algo.policy.norm.update(torch.randn(100, 3) * 3 + 1)
    pol = algo.make_policy(seed=0)
    obs = np.random.default_rng(0).standard_normal((16, *e.observation_space.shape)).astype(np.float32) * 3

    def torch_out(p):
        with torch.no_grad():
            return p.net(torch.from_numpy(obs)).numpy()

    np.testing.assert_allclose(pol._out(obs), torch_out(pol), rtol=1e-5, atol=1e-6)
    assert isinstance(pol._np, NumpyForward) is numpy
    pol.load({k: v + 0.1 for k, v in algo.policy_state().items()})   # a new policy, loaded in place
    np.testing.assert_allclose(pol._out(obs), torch_out(pol), rtol=1e-5, atol=1e-5)
    again = pickle.loads(pickle.dumps(pol))
    np.testing.assert_allclose(again._out(obs), torch_out(pol), rtol=1e-5, atol=1e-5)


def test_a_policy_the_compiled_kernel_wrapped_acts_in_numpy():
    """The compiled kernel's acting wraps the body (an nn.Sequential subclass over the same layers): the actors
    still take the NumPy forward, which follows the parameters when the compiled body flattens them."""
    from hetrl.algos.onpolicy import NumpyForward
    from hetrl.kernels.compiled import CompiledKernel

    e = gym.make("CartPole-v1")
    algo = make_algorithm(make_config("ppo", "CartPole-v1", {}), e.observation_space, e.action_space)
    kernel = CompiledKernel(algo)
    pol = kernel.wrap_policy(algo.make_policy(seed=0))
    assert type(pol.net.body) is not torch.nn.Sequential
    obs = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    with torch.no_grad():
        want = pol.net(torch.from_numpy(obs)).numpy()   # the compiled body's forward (it flattens the parameters)
    np.testing.assert_allclose(pol._out(obs), want, rtol=1e-5, atol=1e-6)
    assert isinstance(pol._np, NumpyForward)
    pol.load({k: v + 0.1 for k, v in algo.policy_state().items()})
    with torch.no_grad():
        want = pol.net(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(pol._out(obs), want, rtol=1e-5, atol=1e-5)
    kernel.close()


def test_image_observations_are_refused_in_one_line():
    from hetrl.registry import get
    with pytest.raises(UsageError, match="images") as e:
        get("ppo").check_spaces(gym.spaces.Box(0, 255, (84, 84, 3), np.uint8), gym.spaces.Discrete(4))
    assert "\n" not in str(e.value)


# ---- rl-zoo's files -----------------------------------------------------------------------------------------
ZOO = """
CartPole-v1:
  n_envs: 8
  n_timesteps: !!float 1e5
  policy: 'MlpPolicy'
  n_steps: 32
  batch_size: 256
  gae_lambda: 0.8
  gamma: 0.98
  n_epochs: 20
  ent_coef: 0.0
  learning_rate: lin_0.001
  clip_range: lin_0.2
Pendulum-v1:
  n_envs: 4
  policy: 'MlpPolicy'
  n_steps: 1024
  use_sde: True
  sde_sample_freq: 4
HalfCheetah-v5:
  normalize: true
  n_envs: 1
  policy: 'MlpPolicy'
  n_timesteps: !!float 1e6
  batch_size: 64
  n_steps: 512
  clip_range: 0.1
  policy_kwargs: "dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
                       net_arch=dict(pi=[256, 256], vf=[128, 128]))"
Acrobot-v1:
  normalize: "{'norm_obs': False, 'norm_reward': True, 'clip_reward': 5.0}"
  n_envs: 16
  policy: 'MlpPolicy'
"""


def test_zoo_files_give_ppos_settings(tmp_path):
    from hetrl.sb3 import zoo

    f = tmp_path / "ppo.yml"
    f.write_text(ZOO)
    zoo_cfg = make_config("ppo", "CartPole-v1", zoo.settings(f, "ppo", "CartPole-v1"))
    assert zoo_cfg.to_dict() == make_config("ppo", "CartPole-v1").to_dict()   # hetrl's preset is the zoo's entry
    hc = zoo.settings(f, "ppo", "HalfCheetah-v5")
    assert (hc["normalize_obs"], hc["normalize_reward"], hc["net_arch"], hc["vf_arch"], hc["activation"],
            hc["log_std_init"], hc["ortho_init"], hc["n_steps"]) == (True, True, [256, 256], [128, 128], "relu", -2,
                                                                      False, 512)
    acro = zoo.settings(f, "ppo", "Acrobot-v1")
    assert (acro["normalize_obs"], acro["normalize_reward"], acro["clip_reward"]) == (False, True, 5.0)
    with pytest.raises(UsageError, match="gSDE") as e:
        zoo.settings(f, "ppo", "Pendulum-v1")
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="does not normalise"):
        zoo.settings(f, "dqn", "HalfCheetah-v5")
