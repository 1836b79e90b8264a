"""Run configuration: one typed dataclass, presets per (algo, env), `key=value` overrides.

Precedence: built-in defaults < preset for the env (hetrl/presets.yaml) < --config FILE.yaml
< --set key=value.  Every key is checked against the dataclass; an unknown or ill-typed key
is a UsageError that names the key and the accepted values.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hetrl.errors import UsageError

ALGOS = ("dqn", "ddpg", "td3", "sac")


@dataclass
class Config:
    # what to train
    algo: str = "dqn"
    env: str = "CartPole-v1"
    steps: int = 50_000                 # total env steps
    seed: int = 0
    # system
    schedule: str = "inline"            # inline (one process), local (actor processes), ray (a Ray cluster)
    device: str = "cpu"                 # learner + data storage device: cpu, cuda, cuda:N, auto
    num_envs: int = 1                   # envs in all: the preset's (rl-zoo's n_envs, 1 where the zoo sets none), never the planner's
    env_backend: str = "auto"           # gymnasium, envpool, or auto: EnvPool for Atari games it has, else Gymnasium; the planner measures both
    frame_stack: int = 1                # observations stacked (gymnasium FrameStackObservation, zero-padded); 1 = none
    # --- Atari (ALE ids; hetrl/actors/atari.py, docs/atari.md): SB3's AtariWrapper, each part a switch ---
    atari_noop_max: int = 30            # up to this many no-op steps at reset (0: none)
    atari_frame_skip: int = 4           # agent steps every K frames, max-pooling the last 2 (1: no skip)
    atari_screen_size: int = 84         # frames resized to NxN grayscale
    atari_episodic_life: bool = True    # training: a lost life ends the episode (the game goes on)
    atari_fire_reset: bool = True       # press FIRE after a reset, in games that wait for it
    atari_clip_reward: bool = True      # training: rewards clipped to their sign (evaluation: the raw score)
    atari_sticky_actions: str = "auto"  # repeat_action_probability: auto = the id's default (0.25 for v5), or a number
    threads: int = 0                    # torch threads in the learner process; 0 = all cores
    publish_interval: int = 1           # learner -> actors: publish params every K training phases
    check_finite: bool = True          # stop at the first NaN/inf in inserted data or in the learner's TD errors
    fastpath: bool = False              # CPU learner: hand-derived gradients (algos/fastpath.py); the planner turns it on where faster
    compiled: bool = False              # CPU learner: each phase as one numba call (algos/compiled.py; DQN/DDPG/TD3/SAC MLPs); the planner turns it on where faster
    cuda_graph: bool = False            # CUDA learner: each phase replayed as one CUDA graph (algos/graphed.py); the planner turns it on where faster
    # --- local schedule (hetrl/runtime/local.py, docs/local.md) -----------------------------
    actors: int = 0                     # actor processes; 0 = auto: cores - 1, at least 1, at most 4
    envs_per_actor: int = 0             # envs per actor process; 0 = num_envs / actors (same total)
    insert_chunk: int = 0               # env steps per actor insert message; 0 = auto (see docs/local.md)
    rate_limit: bool = True             # Reverb-style samples-per-insert limiter holds the replay ratio
    rate_tolerance: int = 0             # env steps either side may run ahead of the ratio; 0 = auto
    max_policy_lag: int = 0             # gradient steps the learner may run ahead of the oldest policy still acting; 0 = auto
    overlap: bool = True                # actors act while the learner learns (False: lockstep)
    batched_insert: bool = True         # one insert message per chunk (False: one per vector step)
    prefetch: bool = True               # a learner thread samples the next batch during the update
    actor_one_thread: bool = True       # torch.set_num_threads(1) in every actor process
    preallocate: bool = True            # no per-step allocation: staging written in place, fixed batch buffers
    # --- end local schedule -------------------------------------------------------------------
    # --- ray schedule (hetrl/runtime/ray_schedule.py; actors, envs_per_actor, rate_* as local) ---
    ray_address: str = ""               # "" = start a local Ray; auto or HOST:PORT = join that cluster
    ray_actor_cpus: float = 1.0         # Ray CPU resources per actor (fractions pack more actors per core)
    replay_shards: int = 1              # replay-server Ray actors; actor i feeds shard i mod shards
    # replay
    buffer_size: int = 100_000
    batch_size: int = 64
    learning_starts: int = 1000
    prioritized: bool = False
    replay_frames: bool = True          # stacked uint8 frames: each frame stored once (hetrl/replay/frames.py)
    per_alpha: float = 0.6
    per_beta: float = 0.4               # annealed linearly to 1.0 over the run
    n_step: int = 1
    # learning
    net_arch: list[int] = field(default_factory=lambda: [256, 256])
    lr: float = 1e-3
    gamma: float = 0.99
    train_freq: int = 256               # env steps per training phase
    gradient_steps: int = 128           # gradient steps per phase; -1 = env steps collected
    max_grad_norm: float = 10.0         # 0 disables clipping
    tau: float = 1.0                    # target update: 1.0 hard copy, <1 Polyak
    # DQN
    target_update_interval: int = 10    # env steps between hard target copies (tau = 1)
    exploration_fraction: float = 0.1
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.05
    double: bool = False
    dueling: bool = False
    # DDPG, TD3 (exploration noise on mu(s))
    noise_type: str = "normal"          # normal | ou
    noise_std: float = 0.1              # std of the exploration noise, in actions scaled to [-1, 1]
    # TD3 (SB3's defaults)
    policy_delay: int = 2               # gradient (critic) steps per actor and target update, counted over the run
    target_policy_noise: float = 0.2    # std of the smoothing noise on the target action (actions in [-1, 1])
    target_noise_clip: float = 0.5      # the smoothing noise is clipped to +-this
    # SAC
    ent_coef: str = "auto"              # entropy coefficient alpha: auto (learned toward target_entropy, from 1.0),
                                        # auto_X (learned, from X), or a number (fixed); SB3's convention
    target_entropy: str = "auto"        # the entropy alpha is tuned toward: auto = -dim(actions), or a number
    # evaluation and logging
    eval_episodes: int = 10             # episodes per evaluation (0: no evaluation)
    eval_interval: int = 0              # env steps between evaluations during training; 0 = a tenth of the run
    eval_max_steps: int = 0             # an evaluation episode is cut (truncated) after this many steps; 0 = the
                                        # env's own time limit (Atari: ALE's), or 10,000 for an env without one
    keep_best: bool = True              # the run's policy is the best evaluated one (SB3 EvalCallback style)
    log_interval: int = 2_000           # env steps between logged scalars

    @property
    def replay_ratio(self) -> float:
        """Gradient steps per env step."""
        return 1.0 if self.gradient_steps < 0 else self.gradient_steps / self.train_freq

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The system's settings: where and how fast the parts run, never what the agent learns. The
# planner may choose them, and `hetrl train --resume DIR` may change them (a run started inline
# can continue on a cluster). Every other key belongs to the preset (and to the user).
SYSTEM_KEYS = ("schedule", "device", "threads", "actors", "envs_per_actor", "insert_chunk", "rate_limit",
               "rate_tolerance", "overlap", "batched_insert", "prefetch", "actor_one_thread", "preallocate",
               "env_backend", "ray_address", "ray_actor_cpus", "replay_shards", "publish_interval",
               "log_interval", "fastpath", "compiled", "cuda_graph", "check_finite", "max_policy_lag")


MAX_LOCAL_ACTORS = 64    # actor processes on one machine at most (the planner searches no further)

ALGO_DEFAULTS: dict[str, dict[str, Any]] = {
    "dqn": {"tau": 1.0},
    "ddpg": {"tau": 0.005, "max_grad_norm": 0.0},
    "td3": {"tau": 0.005, "max_grad_norm": 0.0},
    "sac": {"tau": 0.005, "max_grad_norm": 0.0},
}
_CHOICES = {
    "algo": ALGOS,
    "schedule": ("inline", "local", "ray"),
    "noise_type": ("normal", "ou"),
    "env_backend": ("auto", "gymnasium", "envpool"),
}
_POSITIVE = ("steps", "num_envs", "buffer_size", "batch_size", "train_freq", "n_step", "policy_delay",
             "target_update_interval", "publish_interval", "log_interval", "replay_shards",
             "frame_stack", "atari_frame_skip", "atari_screen_size")
_NON_NEGATIVE = ("learning_starts", "threads", "max_grad_norm", "noise_std", "eval_episodes", "eval_interval", "eval_max_steps",
                 "target_policy_noise", "target_noise_clip", "atari_noop_max",
                 "actors", "envs_per_actor", "insert_chunk", "rate_tolerance", "max_policy_lag")
_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def load_presets() -> dict[str, dict[str, dict[str, Any]]]:
    text = resources.files("hetrl").joinpath("presets.yaml").read_text()
    return yaml.safe_load(text)


def atari_id(env: str) -> bool:
    """Whether `env` names an Atari game of the ALE with screen observations (ALE/Pong-v5,
    PongNoFrameskip-v4; not the -ram ids): hetrl preprocesses them (hetrl/actors/atari.py) and
    gives them the `atari` preset."""
    base_id = env.split(":")[-1]
    return (base_id.startswith("ALE/") or base_id.endswith("NoFrameskip-v4")) and "-ram" not in base_id


def preset_for(algo: str, env: str) -> dict[str, Any]:
    """The preset keys for `algo` on `env`: the algo's default entry, overridden by its `atari` entry
    for Atari ids, overridden by the env's own."""
    table = load_presets().get(algo, {})
    base_id = env.split(":")[-1]  # 'module:EnvId' form
    family = table.get("atari", {}) if atari_id(env) else {}
    return {**table.get("default", {}), **family, **table.get(base_id, {})}


def _coerce(key: str, value: Any) -> Any:
    """Convert a YAML/CLI value to the type of Config.<key>; UsageError when impossible."""
    hint = typing.get_type_hints(Config)[key]
    given = value
    try:
        if isinstance(value, str):
            if hint is bool:
                low = value.strip().lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if hint in (int, float):
                value = float(value) if any(c in value.lower() for c in ".en") else int(value.replace("_", ""))
            elif hint == list[int]:  # [256,256], or 256,256 as SB3 users write net_arch
                text = value.strip()
                value = yaml.safe_load(f"[{text}]" if "," in text and not text.startswith("[") else text)
        if hint is bool and isinstance(value, bool):
            return value
        if hint is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if hint is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if hint is str and isinstance(value, str):
            return value
        if hint is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. ent_coef: 0.1 in a YAML file
        if hint == list[int]:
            if isinstance(value, int) and not isinstance(value, bool):
                value = [value]
            if isinstance(value, (list, tuple)) and all(isinstance(v, int) and v > 0 for v in value):
                return list(value)
        raise ValueError
    except (ValueError, yaml.YAMLError):
        want = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                list[int]: "a list of positive integers like [256,256]"}[hint]
        raise UsageError(f"setting {key}={given!r} is not {want}; fix the value "
                         f"(e.g. --set {key}={_example(key)})") from None


def check_value(key: str, value: Any) -> Any:
    """One setting checked on its own (known key, right type): its typed value, or a UsageError."""
    if key not in _FIELDS:
        close = difflib.get_close_matches(key, _FIELDS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "see `hetrl settings`"
        raise UsageError(f"unknown setting {key!r}; {hint}")
    return _coerce(key, value)


def _example(key: str) -> str:
    v = getattr(Config(), key)
    return str(v).replace(" ", "").lower() if isinstance(v, (bool, list)) else str(v)


def parse_sets(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UsageError(f"--set {pair!r} is not key=value; write e.g. --set lr=0.001")
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"config file {p} does not exist; pass a YAML file of key: value lines")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"config file {p} is not valid YAML ({str(e).splitlines()[0]}); fix its syntax") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {p} must be a mapping of key: value lines")
    return data


def make_config(algo: str, env: str, overrides: dict[str, Any] | None = None) -> Config:
    """Defaults < algo defaults < env preset < overrides (file, --set, API kwargs), checked."""
    algo = algo.lower()
    if algo not in ALGOS:
        close = difflib.get_close_matches(algo, ALGOS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"unknown algorithm {algo!r}; {hint}choose one of: {', '.join(ALGOS)}")
    merged: dict[str, Any] = {**ALGO_DEFAULTS[algo], **preset_for(algo, env)}
    merged.update(overrides or {})
    merged["algo"], merged["env"] = algo, env
    values = {key: check_value(key, value) for key, value in merged.items()}
    cfg = Config(**values)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    for key, choices in _CHOICES.items():
        if getattr(cfg, key) not in choices:
            raise UsageError(f"{key}={getattr(cfg, key)!r} is not supported; choose one of: {', '.join(choices)}")
    for key in _POSITIVE:
        if getattr(cfg, key) <= 0:
            raise UsageError(f"{key} must be positive, got {getattr(cfg, key)}; set e.g. --set {key}={_example(key)}")
    for key in _NON_NEGATIVE:
        if getattr(cfg, key) < 0:
            raise UsageError(f"{key} must be >= 0, got {getattr(cfg, key)}")
    if cfg.gradient_steps == 0 or cfg.gradient_steps < -1:
        raise UsageError(f"gradient_steps must be positive or -1 (as many as env steps), got {cfg.gradient_steps}")
    if cfg.batch_size > cfg.buffer_size:
        raise UsageError(f"batch_size {cfg.batch_size} is larger than buffer_size {cfg.buffer_size}; "
                         "lower batch_size or raise buffer_size")
    if not 0.0 < cfg.gamma <= 1.0:
        raise UsageError(f"gamma must be in (0, 1], got {cfg.gamma}")
    if not 0.0 < cfg.tau <= 1.0:
        raise UsageError(f"tau must be in (0, 1], got {cfg.tau}")
    if not cfg.lr > 0:
        raise UsageError(f"lr must be positive, got {cfg.lr}")
    if not 0.0 <= cfg.exploration_fraction <= 1.0:
        raise UsageError(f"exploration_fraction must be in [0, 1], got {cfg.exploration_fraction}")
    for key in ("ent_coef", "target_entropy"):  # SAC; SB3's conventions
        value = getattr(cfg, key)
        auto_init = key == "ent_coef" and value.startswith("auto_")   # ent_coef=auto_0.1: learned, from 0.1
        try:
            number = None if value == "auto" else float(value[5:] if auto_init else value)
        except ValueError:
            forms = "auto, auto_X (learned from X) or a number" if key == "ent_coef" else "auto or a number"
            raise UsageError(f"{key}={value!r} is not {forms}; e.g. --set {key}=auto") from None
        if key == "ent_coef" and number is not None and not (number > 0 and number < float("inf")):
            raise UsageError(f"ent_coef must be auto, auto_X or a number, with X and the number > 0, got {value}")
    p = cfg.atari_sticky_actions
    try:
        ok = p == "auto" or 0.0 <= float(p) <= 1.0
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(f"atari_sticky_actions={p!r} is not auto or a number in [0, 1]; "
                         "e.g. --set atari_sticky_actions=0.25")
    if cfg.n_step > 255:
        raise UsageError(f"n_step must be <= 255, got {cfg.n_step}")
    if not (cfg.device in ("cpu", "cuda", "auto") or cfg.device.startswith("cuda:")):
        raise UsageError(f"device={cfg.device!r} is not a device; use cpu, cuda, cuda:N or auto")
    if cfg.cuda_graph and cfg.device == "cpu":
        raise UsageError("cuda_graph=true replays the learner on a GPU, but device=cpu; "
                         "set --set device=cuda, or drop cuda_graph")
    if cfg.actors > MAX_LOCAL_ACTORS and cfg.schedule != "ray":
        raise UsageError(f"actors={cfg.actors} is more actor processes than one machine runs well "
                         f"({MAX_LOCAL_ACTORS}); lower "
                         "--actors, or spread them over a cluster with --schedule ray")
    if cfg.actors > 4096:
        raise UsageError(f"actors={cfg.actors} is more than hetrl supports (4096); lower --actors")
    if not cfg.ray_actor_cpus > 0:
        raise UsageError(f"ray_actor_cpus must be > 0, got {cfg.ray_actor_cpus}")
    if cfg.actors and cfg.replay_shards > cfg.actors:
        raise UsageError(f"replay_shards={cfg.replay_shards} is more than actors={cfg.actors}: a shard no actor "
                         "feeds would never be sampled; use at most one shard per actor")


def settings_help() -> str:
    lines = []
    for f in dataclasses.fields(Config):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        lines.append(f"  {f.name:<26} {typing.get_type_hints(Config)[f.name].__name__ if hasattr(typing.get_type_hints(Config)[f.name], '__name__') else 'list[int]':<10} default {default}")
    return "\n".join(lines)
