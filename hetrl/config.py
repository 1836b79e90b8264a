"""Run configuration: one typed dataclass per algorithm, presets per (algo, env), `key=value` overrides.

`Config` holds the settings every algorithm and every schedule share (the system's, the replay's and
the common learning ones); an algorithm declares its own in a subclass (its `Settings`, see
hetrl/algorithm.py), so `cfg.double` exists for DQN and `cfg.policy_delay` for TD3. Precedence: the
algorithm's defaults < its presets for the env (registry.presets: "default" < "atari" < the env id)
< --config FILE.yaml < --set key=value. Every key is checked against the algorithm's dataclass; an
unknown or ill-typed key is a UsageError that names the key and the accepted values.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from hetrl.actors.atari import AtariOptions, atari_id  # noqa: F401  (atari_id: its public place was here)
from hetrl.errors import UsageError

MAX_LOCAL_ACTORS = 64    # actor processes on one machine at most (the planner searches no further)
KERNELS = ("auto", "public", "compiled", "cuda_graph")


@dataclass
class SystemSettings:
    """The system's settings: where and how fast the parts run, never what the agent learns. The planner owns
    them (it chooses every one the user leaves unset: hetrl/planner/search.py, PlanResult.system_settings), and
    `hetrl train --resume DIR` may change them (a run started inline can continue on a cluster). A run reads them
    as `cfg.system.<name>`; `--set`, config files and API keywords name them by their own name (threads=2)."""

    schedule: str = "inline"            # inline (one process), local (actor processes), ray (a Ray cluster)
    device: str = "cpu"                 # learner + data storage device: cpu, cuda, cuda:N, auto
    threads: int = 0                    # torch threads in the learner process; 0 = all cores
    env_backend: str = "auto"           # gymnasium, envpool, or auto: EnvPool for Atari games it has, else Gymnasium; the planner measures both
    learner_kernel: str = "auto"        # auto | public | compiled | cuda_graph: what runs the learner's updates (hetrl/kernels/);
                                        # auto: the fastest of those checked equal to public on this machine (cached once per machine)
    publish_interval: int = 1           # learner -> actors: publish params every K training phases
    check_finite: bool = True           # stop at the first NaN/inf in inserted data or in the learner's TD errors
    log_interval: int = 2_000           # env steps between logged scalars
    reproducible: bool = True           # the same seed gives the same run on this machine: local and ray run in
                                        # phases (actors one phase behind, the learner sampling the replay as it
                                        # stood at a phase boundary); false: timing decides (result.json says which)
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
    # --- ray schedule (hetrl/runtime/ray_schedule.py; actors, envs_per_actor, rate_* as local) ---
    ray_address: str = ""               # "" = start a local Ray; auto or HOST:PORT = join that cluster
    ray_actor_cpus: float = 1.0         # Ray CPU resources per actor (fractions pack more actors per core)
    replay_shards: int = 1              # replay-server Ray actors; actor i feeds shard i mod shards

    def validate(self) -> None:
        """The system settings' own checks (UsageError naming the setting)."""
        _check_ranges(self, "", ("schedule", "env_backend", "learner_kernel"),
                      ("publish_interval", "log_interval", "replay_shards"),
                      ("threads", "actors", "envs_per_actor", "insert_chunk", "rate_tolerance", "max_policy_lag"))
        if not (self.device in ("cpu", "cuda", "auto") or self.device.startswith("cuda:")):
            raise UsageError(f"device={self.device!r} is not a device; use cpu, cuda, cuda:N or auto")
        if self.learner_kernel == "cuda_graph" and self.device == "cpu":
            raise UsageError("learner_kernel=cuda_graph replays the learner on a GPU, but device=cpu; "
                             "set --set device=cuda, or another learner_kernel")
        if self.learner_kernel == "compiled" and self.device.startswith("cuda"):
            raise UsageError("learner_kernel=compiled is a CPU kernel, but device is a GPU; "
                             "set --set learner_kernel=cuda_graph (or auto), or --set device=cpu")
        if self.actors > MAX_LOCAL_ACTORS and self.schedule != "ray":
            raise UsageError(f"actors={self.actors} is more actor processes than one machine runs well "
                             f"({MAX_LOCAL_ACTORS}); lower "
                             "--actors, or spread them over a cluster with --schedule ray")
        if self.actors > 4096:
            raise UsageError(f"actors={self.actors} is more than hetrl supports (4096); lower --actors")
        if not self.ray_actor_cpus > 0:
            raise UsageError(f"ray_actor_cpus must be > 0, got {self.ray_actor_cpus}")
        if self.reproducible and not self.rate_limit and self.schedule != "inline":
            raise UsageError("rate_limit=false learns while env steps come in, as fast as timing has it, which no seed "
                             "reproduces; keep rate_limit=true or set reproducible=false")
        if self.actors and self.replay_shards > self.actors:
            raise UsageError(f"replay_shards={self.replay_shards} is more than actors={self.actors}: a shard no "
                             "actor feeds would never be sampled; use at most one shard per actor")


@dataclass
class Config:
    """The learning settings every algorithm shares; an algorithm's Settings subclass it with its own. The
    system's settings are `cfg.system` (SystemSettings) and the Atari preprocessing's `cfg.atari`
    (hetrl/actors/atari.py, AtariOptions). Every setting has one flat key, the name `--set`, config files, zoo
    files, API keywords, result.json and checkpoints use: a field's name, `atari_` + the field's name for the
    Atari options (atari_noop_max)."""

    # what to train
    algo: str = ""                      # the registered algorithm's name (hetrl.registry)
    env: str = "CartPole-v1"
    steps: int = 50_000                 # total env steps
    seed: int = 0
    num_envs: int = 1                   # envs in all: the preset's (rl-zoo's n_envs, 1 where the zoo sets none), never the planner's
    frame_stack: int = 1                # observations stacked (gymnasium FrameStackObservation, zero-padded); 1 = none
    # replay
    buffer_size: int = 100_000
    batch_size: int = 64
    learning_starts: int = 1000
    prioritized: bool = False
    priority_lag: int = 0               # prioritised replay: a batch may be drawn before the priorities of up to this
                                        # many earlier batches are written (PEARL's relaxed dependency); 0 = exact PER,
                                        # the same under every schedule (docs/local.md: Prioritised replay)
    replay_frames: bool = True          # stacked uint8 frames: each frame stored once (hetrl/replay/frames.py)
    per_alpha: float = 0.6
    per_beta: float = 0.4               # annealed linearly to 1.0 over the run
    n_step: int = 1
    # learning
    net_arch: list[int] = field(default_factory=lambda: [256, 256])
    qf_arch: list[int] = field(default_factory=list)   # the critics' hidden layers where they differ ([]: net_arch;
                                                        # SB3's net_arch=dict(pi=..., qf=...))
    activation: str = "relu"            # relu | tanh | elu: the hidden layers' activation (SB3's activation_fn)
    layer_norm: bool = False            # a LayerNorm after each hidden layer's Linear, before its activation
    lr: float = 1e-3
    lr_schedule: str = "constant"       # constant, or linear: lr x the run's progress remaining, down to 0 at its end
                                        # (rl-zoo's lin_X, SB3's linear schedule; set before each learner call)
    gamma: float = 0.99
    train_freq: int = 256               # env steps per training phase
    gradient_steps: int = 128           # gradient steps per phase; -1 = env steps collected
    max_grad_norm: float = 10.0         # 0 disables clipping
    tau: float = 1.0                    # target update: 1.0 hard copy, <1 Polyak
    # evaluation and logging
    eval_episodes: int = 10             # episodes per evaluation (0: no evaluation)
    eval_interval: int = 0              # env steps between evaluations during training; 0 = a tenth of the run
    eval_max_steps: int = 0             # an evaluation episode is cut (truncated) after this many steps; 0 = the
                                        # env's own time limit (Atari: ALE's), or 10,000 for an env without one
    keep_best: bool = True              # the run's policy is the best evaluated one (SB3 EvalCallback style)
    # the system's settings (the planner's: docs/planner.md) and the Atari preprocessing's (ALE ids: docs/atari.md)
    system: SystemSettings = field(default_factory=SystemSettings)
    atari: AtariOptions = field(default_factory=AtariOptions)

    @property
    def replay_ratio(self) -> float:
        """Gradient steps per env step."""
        return 1.0 if self.gradient_steps < 0 else self.gradient_steps / self.train_freq

    def to_dict(self) -> dict[str, Any]:
        """Every setting under its flat key (as --set takes them): what result.json and checkpoints hold."""
        out: dict[str, Any] = {}
        for key, (group, _, name) in keys(type(self)).items():
            v = getattr(getattr(self, group) if group else self, name)
            out[key] = list(v) if isinstance(v, list) else v
        return out

    def get(self, key: str) -> Any:
        """The setting of flat key `key` (`cfg.get("threads")` is `cfg.system.threads`)."""
        group, _, name = _where(type(self), key)
        return getattr(getattr(self, group) if group else self, name)

    def replace(self, **changes: Any) -> "Config":
        """A copy with `changes` (flat keys) applied, as dataclasses.replace (no checks; validate() checks)."""
        mine: dict[str, Any] = {}
        grouped: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            group, _, name = _where(type(self), key)
            if group:
                grouped.setdefault(group, {})[name] = value
            else:
                mine[name] = value
        for group, values in grouped.items():
            mine[group] = dataclasses.replace(getattr(self, group), **values)
        return dataclasses.replace(self, **mine)

    def __getattr__(self, name: str) -> Any:
        # only reached for a missing attribute: name the new place of a setting that moved
        if not name.startswith("_"):
            for group, (cls, prefix) in GROUPS.items():
                if name.startswith(prefix) and name[len(prefix):] in {f.name for f in dataclasses.fields(cls)}:
                    raise AttributeError(f"{type(self).__name__} has no {name!r}: it is cfg.{group}."
                                         f"{name[len(prefix):]} (docs/extending.md: Settings)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def validate(self) -> None:
        """Check the values beyond their types (UsageError naming the setting); an algorithm's Settings
        extend it with their own checks (calling super().validate())."""
        validate(self)

    # settings that change network shapes or the learner's program (the members of a population share
    # them; an algorithm adds its own with `shape_settings`) and when it acts and learns
    SHAPE_SETTINGS: ClassVar[tuple[str, ...]] = ("net_arch", "qf_arch", "activation", "layer_norm", "frame_stack", "n_step",
                                                 "batch_size", "buffer_size", "prioritized", "replay_frames",
                                                 "atari_screen_size")
    SCHEDULE_SETTINGS: ClassVar[tuple[str, ...]] = ("steps", "num_envs", "learning_starts", "train_freq",
                                                    "gradient_steps", "priority_lag", "eval_interval", "eval_episodes")


# the flat keys of the system's settings (SystemSettings): the planner may set them, --resume may change them;
# every other key belongs to the preset (and to the user)
SYSTEM_KEYS = tuple(f.name for f in dataclasses.fields(SystemSettings))
# the settings groups of a Config: its field -> (the group's dataclass, the prefix of the group's flat keys)
GROUPS: dict[str, tuple[type, str]] = {"system": (SystemSettings, ""), "atari": (AtariOptions, "atari_")}

# settings of earlier checkpoints and config files, and what they mean now
RENAMED = {"fastpath": None, "compiled": ("learner_kernel", {True: "compiled"}),
           "cuda_graph": ("learner_kernel", {True: "cuda_graph"})}

_CHOICES = {
    "schedule": ("inline", "local", "ray"),
    "env_backend": ("auto", "gymnasium", "envpool"),
    "activation": ("relu", "tanh", "elu"),
    "lr_schedule": ("constant", "linear"),
    "learner_kernel": KERNELS,
}


def _check_ranges(obj: Any, prefix: str, choices: tuple[str, ...], positive: tuple[str, ...],
                  non_negative: tuple[str, ...]) -> None:
    """Value checks of a settings dataclass's fields (named by their flat keys: prefix + field)."""
    for name in choices:
        if getattr(obj, name) not in _CHOICES[prefix + name]:
            raise UsageError(f"{prefix}{name}={getattr(obj, name)!r} is not supported; choose one of: "
                             f"{', '.join(_CHOICES[prefix + name])}")
    for name in positive:
        if getattr(obj, name) <= 0:
            raise UsageError(f"{prefix}{name} must be positive, got {getattr(obj, name)}; set e.g. "
                             f"--set {prefix}{name}={_example(prefix + name)}")
    for name in non_negative:
        if getattr(obj, name) < 0:
            raise UsageError(f"{prefix}{name} must be >= 0, got {getattr(obj, name)}")


def keys(cls: type[Config] = Config) -> dict[str, tuple[str | None, type, str]]:
    """Every flat key of settings class `cls`: key -> (its group's field in Config or None, the dataclass that
    holds it, the field's name there)."""
    return _keys(cls)


@functools.lru_cache(maxsize=None)
def _keys(cls: type) -> dict[str, tuple[str | None, type, str]]:
    out: dict[str, tuple[str | None, type, str]] = {}
    for f in dataclasses.fields(cls):
        if f.name in GROUPS:
            group_cls, prefix = GROUPS[f.name]
            out.update({prefix + g.name: (f.name, group_cls, g.name) for g in dataclasses.fields(group_cls)})
        else:
            out[f.name] = (None, cls, f.name)
    return out


def defaults(cls: type[Config] = Config) -> dict[str, Any]:
    """Every flat key of settings class `cls` and its default value."""
    out = {}
    for key, (_, owner, name) in _keys(cls).items():
        f = {f.name: f for f in dataclasses.fields(owner)}[name]
        out[key] = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    return out


def _where(cls: type, key: str) -> tuple[str | None, type, str]:
    try:
        return _keys(cls)[key]
    except KeyError:
        raise KeyError(f"{cls.__name__} has no setting {key!r}") from None


def build(cls: type[Config], values: dict[str, Any]) -> Config:
    """A `cls` from flat keys (typed already; no checks): the groups' keys go to their dataclasses."""
    mine: dict[str, Any] = {}
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        group, _, name = _where(cls, key)
        if group:
            grouped.setdefault(group, {})[name] = value
        else:
            mine[name] = value
    for group, group_values in grouped.items():
        mine[group] = GROUPS[group][0](**group_values)
    return cls(**mine)


def preset_for(algo: str, env: str) -> dict[str, Any]:
    """The preset keys for `algo` on `env`: the algorithm's "default" entry, overridden by its "atari" entry
    for Atari ids, overridden by the env's own."""
    from hetrl import registry

    table = registry.presets(algo)
    base_id = env.split(":")[-1]  # 'module:EnvId' form
    family = table.get("atari", {}) if atari_id(env) else {}
    return {**table.get("default", {}), **family, **table.get(base_id, {})}


def settings_class(algo: str) -> type[Config]:
    """The Config subclass of registered algorithm `algo` (its Settings)."""
    from hetrl import registry

    cls = getattr(registry.get(algo), "Settings", Config)
    if not (isinstance(cls, type) and issubclass(cls, Config) and dataclasses.is_dataclass(cls)):
        raise UsageError(f"algorithm {algo!r}'s Settings must be a dataclass subclass of hetrl.Config; fix its class")
    return cls


def _coerce(key: str, value: Any, cls: type[Config] = Config) -> Any:
    """Convert a YAML/CLI value to the type of setting `key` of cls; UsageError when impossible."""
    _, owner, name = _where(cls, key)
    hint = typing.get_type_hints(owner)[name]
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
            if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                        for v in value):
                return list(value)
        raise ValueError
    except (ValueError, yaml.YAMLError):
        want = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                list[int]: "a list of positive integers like [256,256]"}.get(hint, str(hint))
        raise UsageError(f"setting {key}={given!r} is not {want}; fix the value "
                         f"(e.g. --set {key}={_example(key, cls)})") from None


def check_value(key: str, value: Any, cls: type[Config] = Config) -> Any:
    """One setting checked on its own (known key of `cls`, right type): its typed value, or a UsageError."""
    fields = _keys(cls)
    if key not in fields:
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "see `hetrl settings ALGO`"
        owner = f" of {cls.__name__.removesuffix('Config')}" if cls is not Config else ""
        raise UsageError(f"unknown setting {key!r}{owner}; {hint}")
    return _coerce(key, value, cls)


def _example(key: str, cls: type[Config] = Config) -> str:
    _, owner, name = _where(cls, key)
    f = {f.name: f for f in dataclasses.fields(owner)}[name]
    v = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    return str(v).replace(" ", "").lower() if isinstance(v, (bool, list)) else str(v)


def parse_sets(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UsageError(f"--set {pair!r} is not key=value; write e.g. --set lr=0.001")
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    return migrate(out)


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


def migrate(values: dict[str, Any], quiet: bool = False) -> dict[str, Any]:
    """Settings as written by an earlier hetrl or by hand (checkpoints, config files, --set, zoo files) in
    their flat keys: renamed keys take their new form, with one line that says so; a group written as a
    mapping (system: {threads: 2}) or a dotted key (atari.noop_max=0) takes its flat keys."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        head, dot, rest = str(key).partition(".")
        if head in GROUPS and dot:
            out[GROUPS[head][1] + rest] = value
        elif head in GROUPS and isinstance(value, dict):
            out.update({GROUPS[head][1] + k: v for k, v in value.items()})
        else:
            out[key] = value
    said = []
    for old, new in RENAMED.items():
        if old in out:
            v = out.pop(old)
            if isinstance(v, str):   # --set compiled=true
                v = v.strip().lower() in ("1", "true", "yes", "on")
            if new is not None and new[1].get(v) and out.get(new[0], "auto") == "auto":
                out[new[0]] = new[1][v]
                said.append(f"{old}={v} is now {new[0]}={new[1][v]}")
            else:
                said.append(f"{old} is no longer a setting (dropped)")
    if said and not quiet:
        print(f"hetrl: settings of an earlier hetrl migrated: {'; '.join(said)}", file=sys.stderr, flush=True)
    return out


def make_config(algo: str, env: str, overrides: dict[str, Any] | None = None) -> Config:
    """The algorithm's defaults < its presets for `env` < overrides (file, --set, API kwargs), checked."""
    from hetrl import registry

    registry.get(algo)   # a clear error for an unknown name
    algo = algo.lower()
    cls = settings_class(algo)
    merged: dict[str, Any] = dict(migrate(preset_for(algo, env)))
    merged.update(migrate(overrides or {}))
    merged["algo"], merged["env"] = algo, env
    values = {key: check_value(key, value, cls) for key, value in merged.items()}
    cfg = build(cls, values)
    cfg.validate()
    return cfg


def validate(cfg: Config) -> None:
    """Config's own checks, and its groups' (`Config.validate` calls it; the planner checks a plan's settings
    with it)."""
    _check_ranges(cfg, "", ("activation", "lr_schedule"),
                  ("steps", "num_envs", "buffer_size", "batch_size", "train_freq", "n_step", "frame_stack"),
                  ("learning_starts", "max_grad_norm", "eval_episodes", "eval_interval", "eval_max_steps",
                   "priority_lag"))
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
    if cfg.n_step > 255:
        raise UsageError(f"n_step must be <= 255, got {cfg.n_step}")
    cfg.system.validate()
    cfg.atari.validate()


def check_ent_coef(value: str, key: str = "ent_coef") -> None:
    """SB3's conventions for an entropy coefficient (auto, auto_X: learned from X, or a number > 0) and
    for target_entropy (auto or a number); used by the entropy-regularised algorithms' Settings."""
    auto_init = key == "ent_coef" and value.startswith("auto_")
    try:
        number = None if value == "auto" else float(value[5:] if auto_init else value)
    except ValueError:
        forms = "auto, auto_X (learned from X) or a number" if key == "ent_coef" else "auto or a number"
        raise UsageError(f"{key}={value!r} is not {forms}; e.g. --set {key}=auto") from None
    if key == "ent_coef" and number is not None and not (number > 0 and number < float("inf")):
        raise UsageError(f"ent_coef must be auto, auto_X or a number, with X and the number > 0, got {value}")
