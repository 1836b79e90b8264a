"""`model.policy`: the model's policy as SB3's policy objects are used (predict, save, state_dict).

`save(path)` writes Stable-Baselines3's own policy file (SB3's `MlpPolicy.load(path)` / `CnnPolicy.load(path)`
read it: `torch.save({"state_dict", "data"})` of SB3's policy class) for the built-in DQN (MLP or the Nature
CNN, not dueling), DDPG, TD3 and SAC with Box (or image) observations and no layer_norm, where SB3 is installed:
hetrl's networks have SB3's layer layout, so their weights are renamed into an SB3 policy object that loads
them strictly before it saves. Which SB3 policy class, which networks and their renames: the algorithm's `sb3`
attribute (hetrl/sb3/compat.py). Anything else is refused with the reason (the whole model: model.save()).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import gymnasium as gym
import torch

from hetrl.errors import UsageError
from hetrl.sb3.args import compat


def sb3_state_dict(algo_name: str, algo) -> dict[str, torch.Tensor]:
    """The algorithm's networks under SB3's policy's names (its `sb3.policy_nets` and `sb3.renames`)."""
    sig = compat(algo_name)
    out = {}
    for net in sig.policy_nets:
        for k, v in getattr(algo, net).state_dict().items():
            name = f"{net}.{k}"
            for pat, rep in sig.renames:
                if re.match(pat, name):
                    out[re.sub(pat, rep, name)] = v.detach().cpu().clone()
                    break
            else:
                raise UsageError(f"{name} has no counterpart in SB3's policy")
    return out


def _import(target: str):
    """SB3's policy class from "module:Class"."""
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"model.policy.save(): SB3's policy class {target!r} cannot be imported ({e}); fix the "
                         "algorithm's sb3.policy_classes, or use model.save()") from None


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
    sig = compat(name)
    if not sig.policy_classes:
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
    if s.get("vf_arch"):   # an on-policy value network's own layers
        arch = {"pi": arch, "vf": list(s["vf_arch"])}
    if s.get("normalize_obs"):
        raise UsageError("model.policy.save(): the observation normalisation is part of hetrl's policy, SB3 keeps it "
                         "in VecNormalize; use model.save() (and the VecNormalize's save)")
    kw: dict[str, Any] = dict(observation_space=obs, action_space=model.action_space, lr_schedule=_constant,
                              net_arch=arch, activation_fn=act)
    target = sig.policy_classes.get(model.policy_class) or sig.policy_classes.get("MlpPolicy")
    if target is None:
        raise UsageError(f"model.policy.save(): {name.upper()} has no Stable-Baselines3 {model.policy_class}; "
                         "use model.save()")
    cls = _import(target)
    if sig.n_critics is not None:
        kw["n_critics"] = sig.n_critics
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
        return sb3_state_dict(m.algo, m._algo()) if compat(m.algo).policy_classes else m.get_parameters()

    def set_training_mode(self, mode: bool) -> None:
        pass

    @property
    def device(self) -> torch.device:
        return self._model.device
