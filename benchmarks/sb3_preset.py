"""A Stable-Baselines3 model built from a hetrl preset (hetrl/algos/*.yaml): the same hyperparameters.

    from sb3_preset import sb3_model      # benchmarks/ on sys.path (the benchmarks' child processes)
    model = sb3_model(make_config("dqn", "CartPole-v1"), "CartPole-v1")

Used by bench_sb3.py (also with lib="sbx"), bench_local.py and bench_learning.py. Needs `pip install stable-baselines3`
(the `bench` extra).
"""

from __future__ import annotations


def sb3_model(cfg, env: str, verbose: int = 0, lib: str = "sb3", **sb3_kwargs):
    """The SB3 model of `cfg.algo` (dqn, ddpg, td3, sac, crossq, ppo, a2c) with cfg's hyperparameters on `env`;
    `sb3_kwargs` go to the model's constructor as they are (e.g. device="cpu": SB3's default is "auto").
    lib="sbx": the same model from SBX (`pip install sbx-rl`, SB3 on JAX), whose DQN has no gradient clip."""
    import importlib

    import numpy as np
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    sb3 = importlib.import_module({"sb3": "stable_baselines3", "sbx": "sbx"}[lib])
    if cfg.algo in ("ppo", "a2c"):
        return _on_policy(sb3, cfg, env, verbose, lib, **sb3_kwargs)

    common = dict(learning_rate=cfg.lr, buffer_size=cfg.buffer_size, learning_starts=cfg.learning_starts,
                  batch_size=cfg.batch_size, gamma=cfg.gamma, train_freq=cfg.train_freq,
                  gradient_steps=cfg.gradient_steps, policy_kwargs=dict(net_arch=cfg.net_arch), seed=cfg.seed,
                  verbose=verbose, **sb3_kwargs)
    policy = "MlpPolicy"
    from hetrl.config import atari_id

    if atari_id(env):   # SB3's Atari pipeline: make_atari_env (AtariWrapper) + VecFrameStack, the Nature CNN
        import ale_py
        import gymnasium as gym
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack

        gym.register_envs(ale_py)
        # AtariWrapper skips frames itself: the v5 ids' own frameskip off (as hetrl's atari.base_kwargs)
        env = VecFrameStack(make_atari_env(env, n_envs=cfg.num_envs, seed=cfg.seed, env_kwargs={"frameskip": 1}),
                            n_stack=cfg.frame_stack)
        policy = "CnnPolicy"
    if cfg.algo == "dqn":
        return sb3.DQN(policy, env, target_update_interval=cfg.target_update_interval, tau=cfg.tau,
                       exploration_fraction=cfg.exploration_fraction,
                       exploration_initial_eps=cfg.exploration_initial_eps,
                       exploration_final_eps=cfg.exploration_final_eps,
                       **({} if lib == "sbx" else {"max_grad_norm": cfg.max_grad_norm or 1e9}), **common)
    import gymnasium as gym

    n = gym.make(env).action_space.shape[0]
    if cfg.algo == "crossq":   # SBX's CrossQ (sbx), or SB3-Contrib's for lib="sb3" (`pip install sb3-contrib`)
        if lib == "sb3":
            sb3 = importlib.import_module("sb3_contrib")
        ent = cfg.ent_coef if cfg.ent_coef.startswith("auto") else float(cfg.ent_coef)
        target = cfg.target_entropy if cfg.target_entropy == "auto" else float(cfg.target_entropy)
        kw = dict(net_arch=dict(pi=cfg.net_arch, qf=cfg.qf_arch or cfg.net_arch),
                  batch_norm_momentum=cfg.batch_norm_momentum, renorm_warmup_steps=cfg.renorm_warmup_steps,
                  optimizer_kwargs={"b1": cfg.adam_beta1} if lib == "sbx" else {"betas": (cfg.adam_beta1, 0.999)})
        if lib == "sbx":
            kw.update(batch_norm_actor=cfg.batch_norm_actor, layer_norm=cfg.layer_norm)
        return sb3.CrossQ("MlpPolicy", env, policy_delay=cfg.policy_delay, ent_coef=ent, target_entropy=target,
                          **{**common, "policy_kwargs": kw})
    if cfg.algo == "sac":
        ent = cfg.ent_coef if cfg.ent_coef == "auto" else float(cfg.ent_coef)
        target = cfg.target_entropy if cfg.target_entropy == "auto" else float(cfg.target_entropy)
        return sb3.SAC("MlpPolicy", env, tau=cfg.tau, ent_coef=ent, target_entropy=target, **common)
    noise_cls = OrnsteinUhlenbeckActionNoise if cfg.noise_type == "ou" else NormalActionNoise
    noise = noise_cls(np.zeros(n), cfg.noise_std * np.ones(n))
    if cfg.algo == "td3":
        return sb3.TD3("MlpPolicy", env, tau=cfg.tau, action_noise=noise, policy_delay=cfg.policy_delay,
                       target_policy_noise=cfg.target_policy_noise, target_noise_clip=cfg.target_noise_clip,
                       **common)
    return sb3.DDPG("MlpPolicy", env, tau=cfg.tau, action_noise=noise, **common)


class Linear:
    """rl-zoo's lin_X schedule: X x progress remaining (picklable)."""

    def __init__(self, value: float):
        self.value = float(value)

    def __call__(self, progress_remaining: float) -> float:
        return self.value * progress_remaining


def _on_policy(sb3, cfg, env: str, verbose: int, lib: str, **sb3_kwargs):
    """SB3's (or SBX's) PPO / A2C with the preset's settings: cfg.num_envs envs of SB3's make_vec_env (a
    VecNormalize around them where the preset normalises), the rollout, the schedules and the policy's layers."""
    import torch.nn as nn
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    venv = make_vec_env(env, n_envs=cfg.num_envs, seed=cfg.seed)
    if cfg.normalize_obs or cfg.normalize_reward:
        venv = VecNormalize(venv, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward, gamma=cfg.gamma,
                            clip_obs=cfg.clip_obs, clip_reward=cfg.clip_reward)
    lr = Linear(cfg.lr) if cfg.lr_schedule == "linear" else cfg.lr
    activation = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}[cfg.activation]
    policy_kwargs = dict(net_arch=dict(pi=cfg.net_arch, vf=cfg.vf_arch or cfg.net_arch), activation_fn=activation,
                         ortho_init=cfg.ortho_init, log_std_init=cfg.log_std_init)
    if lib == "sbx":   # SBX's policies are flax modules: the layers, and a jax activation where not its default tanh
        policy_kwargs = dict(net_arch=policy_kwargs["net_arch"])
        if cfg.activation != "tanh":
            import flax.linen as fnn

            policy_kwargs["activation_fn"] = {"relu": fnn.relu, "elu": fnn.elu}[cfg.activation]
    common = dict(learning_rate=lr, n_steps=cfg.n_steps, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                  ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, max_grad_norm=cfg.max_grad_norm,
                  normalize_advantage=cfg.normalize_advantage, policy_kwargs=policy_kwargs, seed=cfg.seed,
                  verbose=verbose, **sb3_kwargs)
    if cfg.algo == "a2c":
        return sb3.A2C("MlpPolicy", venv, use_rms_prop=cfg.use_rms_prop, rms_prop_eps=cfg.rms_prop_eps, **common)
    clip = Linear(cfg.clip_range) if cfg.clip_range_schedule == "linear" else cfg.clip_range
    return sb3.PPO("MlpPolicy", venv, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, clip_range=clip,
                   clip_range_vf=cfg.clip_range_vf or None, target_kl=cfg.target_kl or None, **common)
