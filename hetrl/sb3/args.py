"""Stable-Baselines3's constructor arguments as hetrl settings: one mapping, used by the SB3-style classes
(hetrl/sb3/model.py) and by rl-zoo hyperparameter files (hetrl/sb3/zoo.py).

`sb3_defaults(algo)` are SB3's (or SB3-contrib's) constructor defaults, filled in where the user gives no
value: the class API is SB3's contract, not hetrl's presets. What differs between algorithms (defaults, the
policy's layers, policy_kwargs taken) each algorithm declares itself: its `sb3` attribute (hetrl/sb3/compat.py). `to_settings` turns SB3 arguments into hetrl
settings and refuses, with one line naming it, an argument or value hetrl cannot honour.

Units: SB3's train_freq counts calls to the vector env's step() (n_envs transitions each); hetrl's
train_freq counts env steps (transitions), so it is n x n_envs. learning_starts, target_update_interval,
buffer_size and the timesteps are transitions in both.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from hetrl.sb3 import compat as sb3compat
from hetrl.errors import UsageError

# the arguments after every SB3 off-policy algorithm's own (the class keeps them; no hetrl setting)
TAIL = tuple(sb3compat.TAIL)
ACTIVATIONS = {"ReLU": "relu", "Tanh": "tanh", "ELU": "elu"}
POLICIES = ("MlpPolicy", "CnnPolicy", "MultiInputPolicy")
# policy_kwargs of SB3 that only act with gSDE (use_sde=True, refused here): no effect without it, in SB3 too
SDE_ONLY = ("log_std_init", "use_expln", "clip_mean", "full_std")
# the SB3 name of a hetrl setting where they differ
RENAMED = {"learning_rate": "lr", "n_steps": "n_step"}


def compat(algo: str) -> sb3compat.SB3Compat:
    """The SB3 facts the algorithm registered as `algo` declares (its `sb3` attribute; the generic ones if none)."""
    from hetrl import registry

    return sb3compat.of(registry.get(algo))


def sb3_defaults(algo: str) -> dict[str, Any]:
    """SB3's constructor arguments of `algo` and their defaults (the algorithm's `sb3.defaults`; for one that
    declares none: the common ones of an off-policy algorithm, with the defaults of the algorithm's own settings)."""
    own = compat(algo).defaults
    if own is not None:
        return dict(own)
    from hetrl.config import defaults, settings_class

    d = defaults(settings_class(algo))
    out = {"learning_rate": d["lr"], **{k: d[k] for k in ("buffer_size", "learning_starts", "batch_size", "tau",
                                                         "gamma", "train_freq", "gradient_steps")},
           "action_noise": None, "replay_buffer_class": None, "replay_buffer_kwargs": None,
           "optimize_memory_usage": False, "n_steps": d["n_step"]}
    out.update(sb3compat.TAIL)
    return out


def policy_name(policy: Any, algo: str) -> str:
    """'MlpPolicy' / 'CnnPolicy' / 'MultiInputPolicy' from the string or SB3's policy class of that name (or of
    `algo`'s own name for its MlpPolicy, e.g. SACPolicy: its `sb3.policy_aliases`)."""
    name = policy if isinstance(policy, str) else getattr(policy, "__name__", repr(policy))
    if name in compat(algo).policy_aliases:
        name = "MlpPolicy"
    if name not in POLICIES:
        raise UsageError(f"policy={name!r} is not supported; hetrl builds its networks from policy_kwargs: pass "
                         "'MlpPolicy', 'CnnPolicy' (image observations) or 'MultiInputPolicy' (Dict observations)")
    return name


def check_policy(name: str, algo_cls, raw_space, obs_space) -> None:
    from hetrl.algorithm import is_image
    import gymnasium as gym

    image = is_image(obs_space)
    if name == "CnnPolicy" and not image:
        raise UsageError(f"policy='CnnPolicy' needs image observations (a 3-D uint8 Box), this env gives {raw_space}; "
                         "pass 'MlpPolicy'")
    if name == "CnnPolicy" and not getattr(algo_cls, "pixels", False):
        raise UsageError(f"policy='CnnPolicy': {algo_cls.name.upper()} takes vector observations in hetrl; use dqn for "
                         "pixels, or flatten the images with a wrapper")
    if name != "CnnPolicy" and image:
        raise UsageError(f"policy={name!r} on image observations {obs_space.shape}: hetrl runs images through the "
                         "Nature CNN only; pass policy='CnnPolicy'")
    if name == "MultiInputPolicy" and not isinstance(raw_space, gym.spaces.Dict):
        raise UsageError(f"policy='MultiInputPolicy' needs Dict observations, this env gives {raw_space}; "
                         "pass 'MlpPolicy'")
    images = image_entries(raw_space)
    if images:
        raise UsageError(f"policy={name!r}: the observations hold images ({', '.join(images)}), which SB3 runs "
                         "through a CNN; hetrl flattens Dict and Tuple observations into one vector for its MLP, which would "
                         "take raw pixels: leave the image out of the observations (a wrapper), or give images "
                         "alone with policy='CnnPolicy' (DQN)")


def image_entries(space, where: str = "") -> list[str]:
    """The entries of a Dict / Tuple observation space that SB3 takes for images (its is_image_space: a 3-D uint8
    Box of 0..255), which its CombinedExtractor runs through a CNN: ["'img' (1, 64, 64)", ...]."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict):
        items = [(f"{where}[{k!r}]" if where else repr(k), sub) for k, sub in space.spaces.items()]
    elif isinstance(space, gym.spaces.Tuple):
        items = [(f"{where}[{i}]" if where else f"[{i}]", sub) for i, sub in enumerate(space.spaces)]
    else:
        return []
    out = []
    for label, sub in items:
        if isinstance(sub, (gym.spaces.Dict, gym.spaces.Tuple)):
            out += image_entries(sub, label)
        elif (isinstance(sub, gym.spaces.Box) and sub.dtype == np.uint8 and len(sub.shape) == 3
              and np.all(sub.low == 0) and np.all(sub.high == 255)):
            out.append(f"{label} {tuple(sub.shape)}")
    return out


# ---- the values -------------------------------------------------------------------------------------------
def learning_rate(value: Any) -> tuple[float, Callable[[float], float] | None, str]:
    """(lr, the schedule function or None, lr_schedule setting): a number; a callable of the progress remaining
    (SB3's convention, 1 -> 0); rl-zoo's 'lin_X' (linear from X to 0: lr_schedule=linear)."""
    if isinstance(value, str):
        kind, _, number = value.partition("_")
        try:
            lr = float(number)
        except ValueError:
            lr = None
        if kind not in ("lin", "linear") or lr is None:
            raise UsageError(f"learning_rate={value!r} is not a number, a callable or rl-zoo's lin_X; "
                             "e.g. learning_rate='lin_7.3e-4'")
        return lr, None, "linear"
    if callable(value):
        try:
            lr = float(value(1.0))
        except Exception as e:
            raise UsageError(f"learning_rate schedule {value!r} failed at progress_remaining=1.0 ({e}); it must map "
                             "the progress remaining (1 -> 0) to a learning rate") from None
        return lr, value, "constant"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), None, "constant"
    raise UsageError(f"learning_rate={value!r} is not a number or a schedule callable")


def schedule(key: str, value: Any, setting: str) -> dict[str, Any]:
    """A clip range (SB3: a number, or a callable of the progress remaining; rl-zoo: 'lin_X') as `setting` and its
    `<setting>_schedule` (constant or linear); a callable must be one of those two (it is probed)."""
    if isinstance(value, str):
        lr, _, kind = learning_rate(value)
        return {setting: lr, f"{setting}_schedule": kind}
    if callable(value):
        try:
            probe = [float(value(p)) for p in (1.0, 0.5, 0.25, 0.0)]
        except Exception as e:
            raise UsageError(f"{key} schedule {value!r} failed at a progress remaining in [0, 1] ({e})") from None
        v = probe[0]
        if all(math.isclose(x, v, rel_tol=1e-9, abs_tol=1e-12) for x in probe):
            return {setting: v, f"{setting}_schedule": "constant"}
        if all(math.isclose(x, v * p, rel_tol=1e-9, abs_tol=1e-12) for x, p in zip(probe, (1.0, 0.5, 0.25, 0.0))):
            return {setting: v, f"{setting}_schedule": "linear"}
        raise UsageError(f"{key}={value!r}: hetrl takes a clip range that is constant or linear in the progress "
                         f"remaining (rl-zoo's lin_X); this one gives {probe} at 1, 0.5, 0.25, 0")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {setting: float(value)}
    raise UsageError(f"{key}={value!r} is not a number, 'lin_X' or a schedule callable")


def train_freq(value: Any, num_envs: int) -> int:
    """SB3's train_freq (n, or (n, 'step'|'episode')) as hetrl's env steps per training phase."""
    n, unit = value, "step"
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise UsageError(f"train_freq={value!r} is not n or (n, 'step'|'episode')")
        n, unit = value
        unit = getattr(unit, "value", unit)   # SB3's TrainFrequencyUnit
    if unit == "episode":
        raise UsageError(f"train_freq={value!r}: hetrl trains every train_freq env steps, never per episode (its "
                         "actors and learner run apart); pass an int, e.g. train_freq=1 with gradient_steps=-1")
    if unit != "step" or not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n <= 0:
        raise UsageError(f"train_freq={value!r} is not a positive int n or (n, 'step')")
    return int(n) * num_envs


def action_noise(noise: Any, act_dim: int | None) -> dict[str, Any]:
    """SB3's NormalActionNoise / OrnsteinUhlenbeckActionNoise (or hetrl.sb3's of the same names), zero-mean with one
    sigma for every action, as noise_type / noise_std. None: no exploration noise (SB3's default)."""
    if noise is None:
        return {"noise_std": 0.0}
    base = getattr(noise, "base_noise", noise)   # SB3's VectorizedActionNoise
    kind = type(base).__name__
    mu, sigma = getattr(base, "_mu", None), getattr(base, "_sigma", None)
    if kind not in ("NormalActionNoise", "OrnsteinUhlenbeckActionNoise") or sigma is None:
        raise UsageError(f"action_noise={kind} is not supported; pass NormalActionNoise or "
                         "OrnsteinUhlenbeckActionNoise (SB3's, or hetrl.sb3's)")
    sigma, mu = np.asarray(sigma, dtype=np.float64).ravel(), np.asarray(mu if mu is not None else 0.0).ravel()
    if np.any(mu != 0) or not np.all(sigma == sigma[0]) or (act_dim is not None and sigma.size not in (1, act_dim)):
        raise UsageError(f"action_noise {kind}(mean={mu.tolist()}, sigma={sigma.tolist()}): hetrl's noise has mean 0 "
                         "and one sigma for every action dimension; pass mean=np.zeros(n), sigma=s * np.ones(n)")
    if kind == "OrnsteinUhlenbeckActionNoise":
        theta, dt = getattr(base, "_theta", 0.15), getattr(base, "_dt", 1e-2)
        x0 = getattr(base, "initial_noise", None)
        if not (math.isclose(theta, 0.15) and math.isclose(dt, 1e-2)) or (x0 is not None and np.any(np.asarray(x0))):
            raise UsageError(f"OrnsteinUhlenbeckActionNoise(theta={theta}, dt={dt}, initial_noise={x0}): hetrl's OU "
                             "noise has theta=0.15, dt=1e-2 and starts at 0 (SB3's defaults); keep those")
        return {"noise_type": "ou", "noise_std": float(sigma[0])}
    return {"noise_type": "normal", "noise_std": float(sigma[0])}


def policy_kwargs(algo: str, kwargs: dict | None, policy: str, fields: set[str]) -> dict[str, Any]:
    """net_arch (list, or dict(pi=..., qf=...)), activation_fn, n_critics, normalize_images and SB3's defaults of
    the optimizer and feature extractor; a key naming a setting of the algorithm (e.g. layer_norm) passes."""
    sig = compat(algo)
    kw = dict(kwargs or {})
    out: dict[str, Any] = {}
    default_arch, cnn_arch = sig.net_arch, sig.cnn_net_arch
    arch = kw.pop("net_arch", (cnn_arch if policy == "CnnPolicy" and cnn_arch is not None else default_arch))
    pi_key, critic_key = sig.net_arch_keys
    critic = f"{critic_key}_arch"   # qf_arch (off-policy critics), vf_arch (an on-policy value network)
    if isinstance(arch, dict):
        unknown = set(arch) - {pi_key, critic_key}
        if unknown or not sig.net_arch_dict:
            what = f"only {pi_key} and {critic_key}" if sig.net_arch_dict else f"{algo.upper()} takes a list"
            raise UsageError(f"policy_kwargs net_arch={arch!r}: {what}"
                             f"; e.g. net_arch=[256, 256] or dict({pi_key}=[64, 64], {critic_key}=[400, 300])")
        pi, qf = list(arch.get(pi_key, [])), list(arch.get(critic_key, []))
        out["net_arch"], out[critic] = pi, ([] if qf == pi else qf)
    elif arch is not None:
        out["net_arch"], out[critic] = list(arch), []
    act = kw.pop("activation_fn", None)
    if act is not None:
        name = act if isinstance(act, str) else getattr(act, "__name__", repr(act))
        if name.lower() in ACTIVATIONS.values():
            name = {v: k for k, v in ACTIVATIONS.items()}[name.lower()]
        if name not in ACTIVATIONS:
            raise UsageError(f"policy_kwargs activation_fn={name}: hetrl's networks take torch.nn.ReLU, Tanh or ELU "
                             "(the compiled learner implements those)")
        out["activation"] = ACTIVATIONS[name]
    elif "activation" in fields:
        out["activation"] = sig.activation
    if "n_critics" in kw:
        n = kw.pop("n_critics")
        if sig.n_critics is None or n != sig.n_critics:
            have = "its own number of" if sig.n_critics is None else sig.n_critics
            raise UsageError(f"policy_kwargs n_critics={n}: hetrl's {algo.upper()} has {have} critic(s); "
                             "drop n_critics")
    if kw.pop("normalize_images", True) is not True:
        raise UsageError("policy_kwargs normalize_images=False: hetrl's CNN always scales pixels to [0, 1]; drop it")
    opt = kw.pop("optimizer_class", None)
    if opt is not None and getattr(opt, "__name__", opt) != "Adam":
        raise UsageError(f"policy_kwargs optimizer_class={getattr(opt, '__name__', opt)}: hetrl's learners use Adam "
                         "(a flat fused Adam, and the compiled kernel's); drop optimizer_class")
    opt_kw = kw.pop("optimizer_kwargs", None) or {}
    if any(k not in ("eps",) or v != 1e-8 for k, v in opt_kw.items()) and opt_kw not in sig.optimizer_kwargs:
        raise UsageError(f"policy_kwargs optimizer_kwargs={opt_kw}: hetrl's Adam takes its defaults only; drop them")
    fe = kw.pop("features_extractor_class", None)
    want = "NatureCNN" if policy == "CnnPolicy" else ("CombinedExtractor" if policy == "MultiInputPolicy" else "FlattenExtractor")
    if fe is not None and getattr(fe, "__name__", fe) != want:
        raise UsageError(f"policy_kwargs features_extractor_class={getattr(fe, '__name__', fe)}: hetrl's {policy} "
                         f"uses {want} only; drop it")
    fe_kw = kw.pop("features_extractor_kwargs", None) or {}
    if fe_kw and not (policy == "CnnPolicy" and fe_kw == {"features_dim": 512}):
        raise UsageError(f"policy_kwargs features_extractor_kwargs={fe_kw} is not supported; drop it")
    kw.pop("share_features_extractor", None)   # an MLP's flatten extractor has no parameters to share
    if sig.sde_kwargs:
        for k in SDE_ONLY:
            kw.pop(k, None)
    for k in list(kw):
        if k in fields:
            out[k] = kw.pop(k)
    if kw:
        raise UsageError(f"policy_kwargs {', '.join(sorted(kw))} not supported by hetrl; supported: net_arch, "
                         "activation_fn, n_critics, normalize_images and the algorithm's settings (`hetrl settings "
                         f"{algo}`)")
    return out


def to_settings(algo: str, given: dict[str, Any], *, policy: str = "MlpPolicy", num_envs: int = 1,
                act_dim: int | None = None, env: str = "default") -> tuple[dict[str, Any], dict[str, Any]]:
    """(hetrl settings, what the SB3-style class keeps itself) from SB3 arguments `given` (SB3's defaults fill the
    rest). Every key of the algorithm's presets is set, so the presets take no part (SB3's defaults do)."""
    from hetrl.config import defaults, preset_for, settings_class

    fields = defaults(settings_class(algo))   # every flat key -> its default
    args = {**sb3_defaults(algo), **given}
    out: dict[str, Any] = {}
    keep: dict[str, Any] = {}
    for k, v in args.items():
        if k == "learning_rate":
            out["lr"], keep["lr_fn"], out["lr_schedule"] = learning_rate(v)
        elif k == "train_freq":
            out["train_freq"] = train_freq(v, num_envs)
        elif k == "action_noise":
            if "noise_std" in fields:
                out.update(action_noise(v, act_dim))
            elif v is not None:
                raise UsageError(f"action_noise: hetrl's {algo.upper()} explores by its own policy and adds no action "
                                 "noise; drop action_noise")
        elif k == "replay_buffer_class":
            if v is not None and getattr(v, "__name__", v) != "ReplayBuffer":
                raise UsageError(f"replay_buffer_class={getattr(v, '__name__', v)} is not supported (hetrl's replay is "
                                 "its own: uniform, or prioritized=True); drop it")
        elif k == "replay_buffer_kwargs":
            rest = {a: b for a, b in (v or {}).items() if not (a == "handle_timeout_termination" and b)}
            if rest:
                raise UsageError(f"replay_buffer_kwargs={rest} not supported (hetrl's replay always bootstraps "
                                 "truncated episodes, as handle_timeout_termination=True); drop them")
        elif k == "optimize_memory_usage":
            keep[k] = bool(v)   # hetrl's storage keeps each observation once already (frames too)
        elif k in ("use_sde", "use_sde_at_warmup"):
            if v:
                raise UsageError(f"{k}=True: gSDE exploration is not supported by hetrl; drop it")
        elif k == "sde_sample_freq":
            pass   # acts only with gSDE (refused above), in SB3 too
        elif k == "target_update_interval" and "target_update_interval" not in fields:
            if v != 1:
                raise UsageError(f"target_update_interval={v}: hetrl's {algo.upper()} updates its targets after "
                                 "every gradient step (SB3's default 1); drop it")
        elif k in ("ent_coef", "target_entropy") and isinstance(fields.get(k), str):
            out[k] = v if isinstance(v, str) else repr(float(v))
        elif k in ("clip_range", "clip_range_vf") and k in fields:
            if k == "clip_range_vf" and v is None:
                out[k] = 0.0   # SB3's None: no value clipping
            else:
                got = schedule(k, v, k)
                if k == "clip_range_vf":   # hetrl's value clip follows clip_range's schedule
                    got.pop("clip_range_vf_schedule", None)
                out.update(got)
        elif k == "target_kl" and k in fields:
            out[k] = 0.0 if v is None else float(v)
        elif k == "rollout_buffer_class":
            if v is not None and getattr(v, "__name__", v) != "RolloutBuffer":
                raise UsageError(f"rollout_buffer_class={getattr(v, '__name__', v)} is not supported (hetrl's rollout "
                                 "storage is its own); drop it")
        elif k == "rollout_buffer_kwargs":
            if v:
                raise UsageError(f"rollout_buffer_kwargs={v} not supported (hetrl's rollout storage takes none); drop "
                                 "them")
        elif k == "policy_kwargs":
            out.update(policy_kwargs(algo, v, policy, set(fields)))
        elif k in TAIL:
            keep[k] = v
        elif k in fields or RENAMED.get(k, k) in fields:   # an algorithm's own n_steps (PPO's rollout) is its own
            out[k if k in fields else RENAMED[k]] = v
        else:
            raise UsageError(f"{k}: hetrl's {algo.upper()} has no such argument (`hetrl settings {algo}` lists its "
                             "settings)")
    if "policy_kwargs" not in args or args["policy_kwargs"] is None:
        out.update(policy_kwargs(algo, None, policy, set(fields)))
    if policy == "CnnPolicy" and "net_arch" not in out:
        out["net_arch"] = []
    # the presets' keys take the settings' own defaults where SB3 has no argument for them
    for k in preset_for(algo, env):
        if k not in out and k in fields and k not in ("steps", "seed"):
            out[k] = fields[k]
    return out, keep
