"""`model.policy`: the model's policy as SB3's policy objects are used (predict, save, state_dict).

`save(path)` writes Stable-Baselines3's own policy file (SB3's `MlpPolicy.load(path)` / `CnnPolicy.load(path)`
read it: `torch.save({"state_dict", "data"})` of SB3's policy class) for the built-in DQN (MLP or the Nature
CNN, not dueling), DDPG, TD3 and SAC with Box (or image) observations and no layer_norm, where SB3 is installed:
hetrl's networks have SB3's layer layout, so their weights are renamed into an SB3 policy object that loads
them strictly before it saves. Anything else is refused with the reason (the whole model: model.save()).
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import torch

from hetrl.errors import UsageError

# hetrl's module names -> SB3's, per algorithm (regular expressions on the state dict's keys)
RENAMES = {
    "sac": [(r"^actor\.body\.", "actor.latent_pi."), (r"^actor\.mean\.", "actor.mu."),
            (r"^actor\.log_std\.", "actor.log_std."), (r"^critics\.(\d+)\.q\.", r"critic.qf\1."),
            (r"^critics_target\.(\d+)\.q\.", r"critic_target.qf\1.")],
    "td3": [(r"^actor\.mu\.", "actor.mu."), (r"^actor_target\.mu\.", "actor_target.mu."),
            (r"^critics\.(\d+)\.q\.", r"critic.qf\1."), (r"^critics_target\.(\d+)\.q\.", r"critic_target.qf\1.")],
    "ddpg": [(r"^actor\.mu\.", "actor.mu."), (r"^actor_target\.mu\.", "actor_target.mu."),
             (r"^critic\.q\.", "critic.qf0."), (r"^critic_target\.q\.", "critic_target.qf0.")],
    "dqn": [(r"^q\.q\.", "q_net.q_net."), (r"^q\.features\.", "q_net.features_extractor."),
            (r"^q_target\.q\.", "q_net_target.q_net."), (r"^q_target\.features\.", "q_net_target.features_extractor.")],
}
NETS = {"sac": ("actor", "critics", "critics_target"), "td3": ("actor", "actor_target", "critics", "critics_target"),
        "ddpg": ("actor", "actor_target", "critic", "critic_target"), "dqn": ("q", "q_target")}


def sb3_state_dict(algo_name: str, algo) -> dict[str, torch.Tensor]:
    """The algorithm's networks under SB3's policy's names."""
    out = {}
    for net in NETS[algo_name]:
        for k, v in getattr(algo, net).state_dict().items():
            name = f"{net}.{k}"
            for pat, rep in RENAMES[algo_name]:
                if re.match(pat, name):
                    out[re.sub(pat, rep, name)] = v.detach().cpu().clone()
                    break
            else:
                raise UsageError(f"{name} has no counterpart in SB3's policy")
    return out


def _constant(progress_remaining: float) -> float:   # SB3's policies want an lr schedule; unused for acting
    return 0.0


def sb3_policy(model):
    """An SB3 policy object (SB3's class) holding the model's weights."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise UsageError("model.policy.save() writes Stable-Baselines3's policy file and needs SB3 installed "
                         "(pip install stable-baselines3); model.save() saves the whole model without it") from None
    name, s = model.algo, model.hetrl_settings
    if name not in RENAMES:
        raise UsageError(f"model.policy.save(): {name.upper()} has no Stable-Baselines3 policy class; use model.save()")
    if s.get("layer_norm") or s.get("dueling"):
        raise UsageError("model.policy.save(): layer_norm / dueling networks have no SB3 policy layout; use model.save()")
    obs = model.observation_space
    if not isinstance(obs, gym.spaces.Box):
        raise UsageError(f"model.policy.save(): observations {obs} are not a Box; use model.save()")
    act = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "elu": torch.nn.ELU}[s.get("activation", "relu")]
    arch = list(s["net_arch"])
    if s.get("qf_arch"):
        arch = {"pi": arch, "qf": list(s["qf_arch"])}
    kw: dict[str, Any] = dict(observation_space=obs, action_space=model.action_space, lr_schedule=_constant,
                              net_arch=arch, activation_fn=act)
    if name == "dqn":
        from stable_baselines3.dqn.policies import CnnPolicy, MlpPolicy

        cls = CnnPolicy if model.policy_class == "CnnPolicy" else MlpPolicy
    elif name == "sac":
        from stable_baselines3.sac.policies import MlpPolicy as cls
    else:
        from stable_baselines3.td3.policies import MlpPolicy as cls

        kw["n_critics"] = 1 if name == "ddpg" else 2
    policy = cls(**kw)
    policy.load_state_dict(sb3_state_dict(name, model._algo()), strict=True)
    return policy


class ModelPolicy:
    """SB3's `model.policy`, for a hetrl model: predict, save (SB3's policy file), state_dict (SB3's names)."""

    def __init__(self, model):
        self._model = model
        self.observation_space, self.action_space = model.observation_space, model.action_space

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False):
        return self._model.predict(observation, state, episode_start, deterministic)

    def save(self, path: str) -> None:
        """Stable-Baselines3's policy file (its MlpPolicy.load / CnnPolicy.load read it)."""
        sb3_policy(self._model).save(path)

    def state_dict(self) -> dict:
        """The networks under SB3's names where the algorithm has an SB3 policy, else hetrl's."""
        m = self._model
        return sb3_state_dict(m.algo, m._algo()) if m.algo in RENAMES else m.get_parameters()

    def set_training_mode(self, mode: bool) -> None:
        pass

    @property
    def device(self) -> torch.device:
        return self._model.device
