"""What an algorithm tells hetrl's Stable-Baselines3-style classes (hetrl/sb3/) about itself: its `sb3`
class attribute, part of the algorithm protocol (hetrl/algorithm.py, docs/extending.md).

    class MyAlgo(hetrl.Algorithm):
        sb3 = SB3Compat(class_name="MyAlgo", net_arch=[256, 256], n_critics=2)

Every registered algorithm gets an SB3-style class (`hetrl.sb3.model_class(name)`); this attribute sets what
SB3 would know of it: the class's name, the constructor's arguments and defaults (SB3's order), the policy's
default layers, which policy_kwargs it takes, what `model.policy.save()` writes (SB3's own policy file) and
what the training log records. An algorithm without one gets :data:`GENERIC`: the arguments every SB3
off-policy algorithm takes, with the defaults of the algorithm's own settings. A subclass inherits its base's
(``sb3 = None`` for the generic one). The built-ins declare theirs in their own files.

Algorithms import this module and the SB3 front end reads it; it imports nothing of hetrl but its errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetrl.errors import UsageError

# SB3's defaults of the arguments its off-policy algorithms share, to compose `defaults` in SB3's order:
# (policy, env, learning_rate, <ACTOR_CRITIC or the algorithm's own>, <its own arguments>, <TAIL>)
REPLAY: dict[str, Any] = {"replay_buffer_class": None, "replay_buffer_kwargs": None,
                          "optimize_memory_usage": False, "n_steps": 1}
ACTOR_CRITIC: dict[str, Any] = {"buffer_size": 1_000_000, "learning_starts": 100, "batch_size": 256, "tau": 0.005,
                                "gamma": 0.99, "train_freq": 1, "gradient_steps": 1, "action_noise": None, **REPLAY}
SDE: dict[str, Any] = {"use_sde": False, "sde_sample_freq": -1, "use_sde_at_warmup": False}
TAIL: dict[str, Any] = {"stats_window_size": 100, "tensorboard_log": None, "policy_kwargs": None, "verbose": 0,
                        "seed": None, "device": "auto"}


@dataclass(frozen=True)
class SB3Compat:
    """An algorithm's Stable-Baselines3 facts (every field optional: the default is the generic behaviour)."""

    # the SB3-style class's name (hetrl.CrossQ): SB3's spelling of the registered name; used only where it spells
    # that name (a subclass registered under another name gets its own name upper-cased, as without one)
    class_name: str | None = None
    # the constructor's arguments after (policy, env) and their defaults, in SB3's order (the signature of the
    # class); None: learning_rate, ACTOR_CRITIC's and TAIL's, with the defaults of the algorithm's settings
    defaults: Mapping[str, Any] | None = None
    # the policy's default hidden layers where policy_kwargs gives no net_arch: MlpPolicy's (a list, or
    # dict(pi=..., qf=...)) and CnnPolicy's where it differs; None: the settings' own net_arch
    net_arch: Any = None
    cnn_net_arch: Any = None
    n_critics: int | None = None                 # its critics: policy_kwargs n_critics must equal it; None: refused
    policy_aliases: tuple[str, ...] = ()         # SB3 policy class names that mean MlpPolicy (e.g. "SACPolicy")
    net_arch_dict: bool = True                   # policy_kwargs net_arch may be dict(pi=..., qf=...)
    sde_kwargs: bool = False                     # gSDE-only policy_kwargs (log_std_init, ...) accepted and ignored
    # policy_kwargs optimizer_kwargs accepted beside Adam's defaults (the algorithm's own optimizer already has them)
    optimizer_kwargs: tuple[Mapping[str, Any], ...] = ()
    # model.policy.save(): SB3's policy class per policy name ("module:Class"; "MlpPolicy" is the fallback), the
    # attributes holding the networks, and the renames of their state-dict keys into SB3's (regex, replacement);
    # no policy classes: refused (model.save() saves the whole model)
    policy_classes: Mapping[str, str] = field(default_factory=dict)
    policy_nets: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    logs_exploration_rate: bool = False          # the training log records rollout/exploration_rate (epsilon)


GENERIC = SB3Compat()


def of(algo_cls: type) -> SB3Compat:
    """The algorithm class's SB3 facts (GENERIC where it declares none)."""
    value = getattr(algo_cls, "sb3", None)
    if value is None:
        return GENERIC
    if not isinstance(value, SB3Compat):
        raise UsageError(f"{getattr(algo_cls, '__name__', algo_cls)}.sb3 is {type(value).__name__}, not an "
                         "hetrl.sb3compat.SB3Compat; set sb3 = SB3Compat(...) or leave it out (docs/extending.md)")
    return value


def class_name(name: str, algo_cls: type) -> str:
    """The SB3-style class name of the algorithm registered as `name`."""
    own = of(algo_cls).class_name
    return own if own and own.lower() == name.lower() else name.upper()
