"""What hetrl's Stable-Baselines3-style classes (hetrl/sb3/) know of each algorithm: its SB3 facts.

Every registered algorithm gets an SB3-style class (`hetrl.sb3.model_class(name)`); an :class:`SB3Compat` sets
what SB3 would know of it: the class's name, the constructor's arguments and defaults (SB3's order), the policy's
default layers, which policy_kwargs it takes, what `model.policy.save()` writes (SB3's own policy file) and
what the training log records. The built-in algorithms' are :data:`BUILTIN`, keyed by their registered names
(this is the SB3 front end: it names the algorithms SB3 ships; the algorithms know nothing of SB3). An algorithm
of a user's declares its own as the optional `sb3` class attribute (docs/extending.md):

    class MyAlgo(hetrl.Algorithm):
        sb3 = hetrl.sb3.SB3Compat(class_name="MyAlgo", net_arch=[256, 256], n_critics=2)

An algorithm with neither gets :data:`GENERIC`: the arguments every SB3 off-policy algorithm takes, with the
defaults of the algorithm's own settings. A subclass inherits its base's (``sb3 = None`` for the generic one).
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
# SB3's on-policy algorithms: the arguments after their own, in SB3's order
ON_POLICY_TAIL: dict[str, Any] = {"use_sde": False, "sde_sample_freq": -1, "rollout_buffer_class": None,
                                  "rollout_buffer_kwargs": None}
TAIL: dict[str, Any] = {"stats_window_size": 100, "tensorboard_log": None, "policy_kwargs": None, "verbose": 0,
                        "seed": None, "device": "auto"}
# PPO's and A2C's policy: SB3's ActorCriticPolicy (separate pi / vf MLPs), its parameter names and optimizer
ACTOR_CRITIC_POLICY: dict[str, Any] = dict(
    net_arch={"pi": [64, 64], "vf": [64, 64]}, activation="tanh", net_arch_keys=("pi", "vf"),
    policy_aliases=("ActorCriticPolicy",), optimizer_kwargs=({"eps": 1e-5},),
    policy_classes={"MlpPolicy": "stable_baselines3.common.policies:ActorCriticPolicy"},
    policy_nets=("policy", "value"),
    renames=((r"^policy\.body\.", "mlp_extractor.policy_net."), (r"^policy\.action_net\.", "action_net."),
             (r"^policy\.log_std$", "log_std"), (r"^value\.body\.", "mlp_extractor.value_net."),
             (r"^value\.value_net\.", "value_net.")),
    optimizers=(("policy.optimizer", "opt"),))


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
    # get_parameters(): SB3's names of the optimizers beside "policy" and the algorithm's state-dict keys of them
    # (SB3's `_get_torch_save_params`); none: get_parameters() gives the algorithm's own state dict
    optimizers: tuple[tuple[str, str], ...] = ()
    logs_exploration_rate: bool = False          # the training log records rollout/exploration_rate (epsilon)
    activation: str = "relu"                     # the policy's activation where policy_kwargs names none (SB3's)
    # the keys a dict net_arch takes: the policy's, then the critic's (its setting: "<key>_arch": qf_arch, vf_arch)
    net_arch_keys: tuple[str, str] = ("pi", "qf")
    log_interval: int = 4                        # learn()'s default log_interval (on-policy: in rollouts)


GENERIC = SB3Compat()

# the built-in algorithms' SB3 facts, by registered name (a built-in is the class of hetrl/algos/NAME.py)
BUILTIN: dict[str, SB3Compat] = {
    # SB3's DQN: its constructor, policies and policy file
    "dqn": SB3Compat(
        class_name="DQN",
        defaults=dict(learning_rate=1e-4, buffer_size=1_000_000, learning_starts=100, batch_size=32, tau=1.0,
                      gamma=0.99, train_freq=4, gradient_steps=1, **REPLAY, target_update_interval=10_000,
                      exploration_fraction=0.1, exploration_initial_eps=1.0, exploration_final_eps=0.05,
                      max_grad_norm=10.0, **TAIL),
        net_arch=[64, 64], cnn_net_arch=[], policy_aliases=("DQNPolicy",), net_arch_dict=False,
        policy_classes={"MlpPolicy": "stable_baselines3.dqn.policies:MlpPolicy",
                        "CnnPolicy": "stable_baselines3.dqn.policies:CnnPolicy"},
        policy_nets=("q", "q_target"),
        renames=((r"^q\.q\.", "q_net.q_net."), (r"^q\.features\.", "q_net.features_extractor."),
                 (r"^q_target\.q\.", "q_net_target.q_net."),
                 (r"^q_target\.features\.", "q_net_target.features_extractor.")),
        optimizers=(("policy.optimizer", "opt"),),
        logs_exploration_rate=True),

    # SB3's DDPG (TD3's policy with one critic)
    "ddpg": SB3Compat(
        class_name="DDPG",
        defaults=dict(learning_rate=1e-3, **ACTOR_CRITIC, **{k: v for k, v in TAIL.items() if k != "stats_window_size"}),
        net_arch=[400, 300], cnn_net_arch=[256, 256], n_critics=1, policy_aliases=("TD3Policy",),
        policy_classes={"MlpPolicy": "stable_baselines3.td3.policies:MlpPolicy"},
        policy_nets=("actor", "actor_target", "critic", "critic_target"),
        renames=((r"^actor\.mu\.", "actor.mu."), (r"^actor_target\.mu\.", "actor_target.mu."),
                 (r"^critic\.q\.", "critic.qf0."), (r"^critic_target\.q\.", "critic_target.qf0.")),
        optimizers=(("actor.optimizer", "actor_opt"), ("critic.optimizer", "critic_opt"))),

    # SB3's TD3
    "td3": SB3Compat(
        class_name="TD3",
        defaults=dict(learning_rate=1e-3, **ACTOR_CRITIC, policy_delay=2, target_policy_noise=0.2,
                      target_noise_clip=0.5, **TAIL),
        net_arch=[400, 300], cnn_net_arch=[256, 256], n_critics=2, policy_aliases=("TD3Policy",),
        policy_classes={"MlpPolicy": "stable_baselines3.td3.policies:MlpPolicy"},
        policy_nets=("actor", "actor_target", "critics", "critics_target"),
        renames=((r"^actor\.mu\.", "actor.mu."), (r"^actor_target\.mu\.", "actor_target.mu."),
                 (r"^critics\.(\d+)\.q\.", r"critic.qf\1."), (r"^critics_target\.(\d+)\.q\.", r"critic_target.qf\1.")),
        optimizers=(("actor.optimizer", "actor_opt"), ("critic.optimizer", "critic_opt"))),

    # SB3's SAC
    "sac": SB3Compat(
        class_name="SAC",
        defaults=dict(learning_rate=3e-4, **ACTOR_CRITIC, ent_coef="auto", target_update_interval=1,
                      target_entropy="auto", **SDE, **TAIL),
        net_arch=[256, 256], n_critics=2, policy_aliases=("SACPolicy",), sde_kwargs=True,
        policy_classes={"MlpPolicy": "stable_baselines3.sac.policies:MlpPolicy"},
        policy_nets=("actor", "critics", "critics_target"),
        renames=((r"^actor\.body\.", "actor.latent_pi."), (r"^actor\.mean\.", "actor.mu."),
                 (r"^actor\.log_std\.", "actor.log_std."), (r"^critics\.(\d+)\.q\.", r"critic.qf\1."),
                 (r"^critics_target\.(\d+)\.q\.", r"critic_target.qf\1.")),
        optimizers=(("actor.optimizer", "actor_opt"), ("critic.optimizer", "critic_opt"),
                    ("ent_coef_optimizer", "alpha_opt"))),

    # SB3's PPO and A2C (on-policy): ActorCriticPolicy, separate pi and vf networks of tanh layers
    "ppo": SB3Compat(
        class_name="PPO",
        defaults=dict(learning_rate=3e-4, n_steps=2048, batch_size=64, n_epochs=10, gamma=0.99, gae_lambda=0.95,
                      clip_range=0.2, clip_range_vf=None, normalize_advantage=True, ent_coef=0.0, vf_coef=0.5,
                      max_grad_norm=0.5, **ON_POLICY_TAIL, target_kl=None, **TAIL),
        log_interval=1, **ACTOR_CRITIC_POLICY),
    "a2c": SB3Compat(
        class_name="A2C",
        defaults=dict(learning_rate=7e-4, n_steps=5, gamma=0.99, gae_lambda=1.0, ent_coef=0.0, vf_coef=0.5,
                      max_grad_norm=0.5, rms_prop_eps=1e-5, use_rms_prop=True, **ON_POLICY_TAIL,
                      normalize_advantage=False, **TAIL),
        log_interval=100, **ACTOR_CRITIC_POLICY),

    # SB3-contrib's CrossQ: its constructor (no tau: no target networks) and policy defaults; SB3 has no policy
    # file layout for batch renormalisation, so model.policy.save() is refused
    "crossq": SB3Compat(
        class_name="CrossQ",
        defaults=dict(learning_rate=1e-3, **{k: v for k, v in ACTOR_CRITIC.items() if k != "tau"}, ent_coef="auto",
                      target_entropy="auto", policy_delay=3, **SDE, **TAIL),
        net_arch={"pi": [256, 256], "qf": [1024, 1024]}, n_critics=2, policy_aliases=("CrossQPolicy",),
        sde_kwargs=True, optimizer_kwargs=({"betas": (0.5, 0.999)},)),
}


def of(algo_cls: type) -> SB3Compat:
    """The algorithm class's SB3 facts: the nearest in its class hierarchy of an `sb3` attribute a class declares
    itself (None: the generic one) and a built-in's entry of BUILTIN; GENERIC where there is none."""
    for klass in getattr(algo_cls, "__mro__", ()):
        if "sb3" in vars(klass) and klass.__module__ != "hetrl.algorithm":
            value = vars(klass)["sb3"]
            if value is None:
                return GENERIC
            if not isinstance(value, SB3Compat):
                raise UsageError(f"{klass.__name__}.sb3 is {type(value).__name__}, not an hetrl.sb3.SB3Compat; "
                                 "set sb3 = SB3Compat(...) or leave it out (docs/extending.md)")
            return value
        module, _, name = klass.__module__.rpartition(".")
        if module == "hetrl.algos" and name in BUILTIN:
            return BUILTIN[name]
    return GENERIC


def class_name(name: str, algo_cls: type) -> str:
    """The SB3-style class name of the algorithm registered as `name`."""
    own = of(algo_cls).class_name
    return own if own and own.lower() == name.lower() else name.upper()
