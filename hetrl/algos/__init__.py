"""The built-in algorithms (one short file each: settings, networks, acting policy, learner update),
registered through the same public door as a user's (hetrl/registry.py, hetrl/algorithm.py)."""

from __future__ import annotations

import gymnasium as gym

from hetrl.registry import register_algorithm

# "module:Class" targets: a class is imported (with torch) only when a run asks for it
for _name, _cls in (("dqn", "DQN"), ("ddpg", "DDPG"), ("td3", "TD3"), ("sac", "SAC"), ("crossq", "CrossQ"),
                   ("ppo", "PPO"), ("a2c", "A2C")):
    register_algorithm(_name, f"hetrl.algos.{_name}:{_cls}", presets=("hetrl.algos", f"{_name}.yaml"))


def make_algorithm(cfg, obs_space: gym.Space, act_space: gym.Space, device="cpu"):
    """The algorithm registered as cfg.algo, built for these spaces (checked first: one clear line)."""
    from hetrl import registry

    cls = registry.get(cfg.algo)
    cls.check_spaces(obs_space, act_space)
    return cls(cfg, obs_space, act_space, device)


def replay_spec(cfg, obs_space: gym.Space, act_space: gym.Space) -> dict:
    """The data-storage fields of one transition of cfg.algo (its `replay_fields`)."""
    from hetrl import registry

    return registry.get(cfg.algo).replay_fields(obs_space, act_space)


def learn_spec(cfg, obs_space: gym.Space, act_space: gym.Space) -> dict:
    """The fields of one row of cfg.algo's `learn` batches: its stored transitions (off-policy), or its
    `learn_fields` (on-policy: obs, action, value, log_prob, advantage, return). Kernels are checked and the
    planner's profile times `learn` on synthetic batches of these."""
    from hetrl import registry

    cls = registry.get(cfg.algo)
    if getattr(cls, "storage", "replay") == "rollout":
        return cls.learn_fields(obs_space, act_space)
    return cls.replay_fields(obs_space, act_space)
