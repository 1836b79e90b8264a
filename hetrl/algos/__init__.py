"""Algorithms: one short file each (networks, acting policy, learner update)."""

from __future__ import annotations

import gymnasium as gym

from hetrl.algos.nets import is_image
from hetrl.config import Config
from hetrl.errors import UsageError


def check_spaces(algo: str, obs_space: gym.Space, act_space: gym.Space) -> None:
    if not isinstance(obs_space, gym.spaces.Box):
        raise UsageError(f"observation space {obs_space} is not a Box and cannot be flattened into one (hetrl "
                         "flattens Discrete, MultiDiscrete, MultiBinary, Tuple and Dict); wrap the env so that its "
                         "observations are an array")
    if algo == "dqn" and not isinstance(act_space, gym.spaces.Discrete):
        raise UsageError(f"DQN needs a discrete action space, this env has {act_space}; "
                         "use sac, td3 or ddpg for continuous actions")
    if algo in CONTINUOUS:
        name = algo.upper()
        if not isinstance(act_space, gym.spaces.Box):
            raise UsageError(f"{name} needs a continuous (Box) action space, this env has {act_space}; "
                             "use dqn for discrete actions")
        if is_image(obs_space):
            raise UsageError(f"{name} takes vector observations; this env's are images {obs_space.shape} (the "
                             "Nature CNN is dqn's): use dqn, or flatten them with a wrapper")
        if not (act_space.is_bounded("both")):
            raise UsageError(f"{name} needs bounded actions, this env has {act_space}; "
                             "wrap it with gymnasium.wrappers.ClipAction/RescaleAction")


CONTINUOUS = ("ddpg", "td3", "sac")


def make_algorithm(cfg: Config, obs_space: gym.Space, act_space: gym.Space, device="cpu"):
    check_spaces(cfg.algo, obs_space, act_space)
    if cfg.algo == "dqn":
        from hetrl.algos.dqn import DQN

        if isinstance(act_space, gym.spaces.Discrete) and act_space.start != 0:
            raise UsageError(f"action space {act_space} does not start at 0; wrap the env to shift actions")
        return DQN(cfg, obs_space.shape, int(act_space.n), device, pixels=is_image(obs_space))
    if cfg.algo == "td3":
        from hetrl.algos.td3 import TD3

        return TD3(cfg, obs_space.shape, act_space, device)
    if cfg.algo == "sac":
        from hetrl.algos.sac import SAC

        return SAC(cfg, obs_space.shape, act_space, device)
    from hetrl.algos.ddpg import DDPG

    return DDPG(cfg, obs_space.shape, act_space, device)


def replay_spec(obs_space: gym.Space, act_space: gym.Space) -> dict:
    """The data-storage fields of one (n-step) transition; pixel observations stay uint8 (the
    network scales them)."""
    obs = (tuple(obs_space.shape), "uint8" if is_image(obs_space) else "float32")
    if isinstance(act_space, gym.spaces.Discrete):
        action = ((), "int64")
    else:
        action = (tuple(act_space.shape), "float32")
    return {"obs": obs, "action": action, "reward": ((), "float32"), "next_obs": obs,
            "terminated": ((), "bool"), "truncated": ((), "bool"), "steps": ((), "uint8")}
