"""`model.policy`: the model's policy as SB3's policy objects are used: a torch module with SB3's parameter names
over the algorithm's live parameters (state_dict, load_state_dict), predict, save.

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
import numpy as np
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


def sb3_name(algo_name: str, name: str) -> str | None:
    """SB3's policy's name of the algorithm's state-dict entry `name` ("<net>.<key>"); None where SB3 has none."""
    for pat, rep in compat(algo_name).renames:
        if re.match(pat, name):
            return re.sub(pat, rep, name)
    return None


def _attach(root: torch.nn.Module, path: str, tensor: torch.Tensor, is_param: bool) -> None:
    """Register the live `tensor` at the dotted `path` under `root` (containers made on the way)."""
    *parts, leaf = path.split(".")
    mod = root
    for part in parts:
        child = mod._modules.get(part)
        if child is None:
            child = torch.nn.Module()
            mod.add_module(part, child)
        mod = child
    if is_param:
        mod.register_parameter(leaf, tensor)
    else:
        mod.register_buffer(leaf, tensor)


class ModelPolicy(torch.nn.Module):
    """SB3's `model.policy`, for a hetrl model: a torch module whose parameters are the algorithm's live ones under
    SB3's names (DQN: q_net.q_net.0.weight, q_net_target...; SAC: actor.latent_pi..., critic.qf0...; PPO:
    mlp_extractor.policy_net..., action_net, value_net, log_std), so that state_dict() reads and load_state_dict()
    writes the networks hetrl trains and acts with; predict, save (SB3's policy file), parameters_to_vector /
    load_from_vector. An algorithm without SB3's names (no `sb3.renames`) has its own networks' names
    ("<net>.<key>"). Entries SB3's policy has no counterpart for (an observation normaliser) stay out."""

    def __init__(self, model):
        super().__init__()
        object.__setattr__(self, "_model", model)   # not a submodule: the model is no torch module
        self.observation_space, self.action_space = model.observation_space, model.action_space
        algo, name = model._algo(), model.algo
        sig = compat(name)
        nets = sig.policy_nets if sig.renames else tuple(k for k, v in vars(algo).items()
                                                          if isinstance(v, torch.nn.Module))
        for net in nets:
            module = getattr(algo, net)
            params = dict(module.named_parameters())
            for k, t in [*params.items(), *module.named_buffers()]:
                full = f"{net}.{k}"
                target = sb3_name(name, full) if sig.renames else full
                if target is not None:
                    _attach(self, target, t, k in params)

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False):
        return self._model.predict(observation, state, episode_start, deterministic)

    def forward(self, obs: Any, deterministic: bool = False):
        """Actions for a batch of observations (the model's predict)."""
        return torch.as_tensor(self._model.predict(np.asarray(obs), deterministic=deterministic)[0])

    def save(self, path: str) -> None:
        """Stable-Baselines3's policy file (its MlpPolicy.load / CnnPolicy.load read it)."""
        sb3_policy(self._model).save(path)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Write `state_dict` (SB3's names; strict=False: the entries given) into the model's live networks: acting
        uses them at once, training from the next learn() on."""
        if assign:
            raise UsageError("model.policy.load_state_dict(assign=True) would replace the networks hetrl trains; "
                             "leave assign=False (the values are copied in)")
        out = super().load_state_dict(state_dict, strict=strict)
        self._model._parameters_changed()
        return out

    def parameters_to_vector(self) -> np.ndarray:
        """The parameters as one flat numpy vector (SB3's BasePolicy.parameters_to_vector)."""
        return torch.nn.utils.parameters_to_vector(self.parameters()).detach().cpu().numpy()

    def load_from_vector(self, vector: np.ndarray) -> None:
        """Set the parameters from a flat vector of parameters_to_vector()'s layout."""
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.as_tensor(vector, dtype=torch.float32, device=self.device),
                                                self.parameters())
        self._model._parameters_changed()

    def set_training_mode(self, mode: bool) -> None:
        pass

    @property
    def device(self) -> torch.device:
        return self._model.device
