"""rl-baselines3-zoo's hyperparameter files, read as they are:

    hetrl train sac --env Pendulum-v1 --hyperparams hyperparams/sac.yml      # ALGO may be left out: the file's name
    hetrl.train("sac", env="Pendulum-v1", hyperparams="hyperparams/sac.yml")

The entry is the env id's, else `atari` for an Atari id, else `default` (as the zoo picks it). Its keys are the
zoo's: `n_timesteps` (the run's steps), `policy`, `n_envs`, `frame_stack`, `normalize` (the on-policy algorithms'
normalisation: VecNormalize's semantics, hetrl/algos/onpolicy.py), `env_wrapper`,
`noise_type`/`noise_std`, and the algorithm's SB3 arguments (`learning_rate` incl. the zoo's `lin_X` schedules,
`policy_kwargs` as the zoo's Python-like string, parsed safely: literals, dict(...), and names such as nn.ReLU,
never evaluated). They go through the same mapping as the SB3-style classes (hetrl/sb3/args.py), with SB3's
defaults for every argument the entry leaves out, so hetrl's own presets take no part. An entry hetrl cannot
honour (gSDE, an env wrapper other than SB3's AtariWrapper, HER, normalisation for an off-policy algorithm, ...) is a
UsageError naming it.
Settings given beside the file (--config, --set, keywords) win over it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import yaml

from hetrl.errors import UsageError

ATARI_WRAPPER = "stable_baselines3.common.atari_wrappers.AtariWrapper"
# SB3's AtariWrapper arguments -> hetrl's Atari settings (hetrl/actors/atari.py is the same preprocessing)
ATARI_ARGS = {"noop_max": "atari_noop_max", "frame_skip": "atari_frame_skip", "screen_size": "atari_screen_size",
              "terminal_on_life_loss": "atari_episodic_life", "clip_reward": "atari_clip_reward"}
# names the zoo writes in its Python-like strings, by their last part
KNOWN_NAMES = {"ReLU", "Tanh", "ELU", "Adam", "FlattenExtractor", "NatureCNN", "CombinedExtractor", "ReplayBuffer",
               "HerReplayBuffer"}


def parse(text: str, what: str) -> Any:
    """A zoo string such as "dict(net_arch=[256, 256], activation_fn=nn.ReLU)" as Python values: literals,
    dict(...) with keywords, and known names (nn.ReLU -> "ReLU"); anything else is refused, nothing is run."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise UsageError(f"{what}={text!r} is not a Python expression ({e.msg})") from None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [value(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Dict):
            return {value(k): value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
            return {k.arg: value(k.value) for k in node.keywords}
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = ast.unparse(node).rsplit(".", 1)[-1]
            if name in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[name]
            if name in KNOWN_NAMES:
                return name
        raise UsageError(f"{what}: {ast.unparse(node)!r} is not supported in a hyperparameter string (literals, "
                         "dict(...) and torch's ReLU/Tanh/ELU, Adam are)")

    return value(tree.body)


def entry(path: str | Path, env: str) -> tuple[str, dict]:
    """(the entry's name, its mapping) for `env` in the zoo file `path`."""
    from hetrl.config import atari_id

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"hyperparameter file {p} does not exist; pass one of rl-baselines3-zoo's hyperparams/*.yml")
    try:
        table = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"{p} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise UsageError(f"{p} is not an rl-zoo hyperparameter file (env id: {{key: value}} entries); a file of "
                         "hetrl settings is --config")
    base = env.split(":")[-1]
    for name in (base, "atari" if atari_id(env) else None, "default"):
        if name is not None and name in table:
            return name, dict(table[name])
    raise UsageError(f"{p} has no entry for {base} (nor `default`); its entries: {', '.join(list(table)[:12])}")


def algo_of(path: str | Path) -> str:
    """The algorithm a zoo file is for: its name (hyperparams/sac.yml -> sac)."""
    return Path(path).stem.lower()


def settings(path: str | Path, algo: str, env: str) -> dict[str, Any]:
    """hetrl settings (steps and num_envs included) from the zoo entry for `env` (see the module's doc)."""
    from hetrl.sb3 import args as sb3args
    from hetrl.sb3.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    name, e = entry(path, env)
    where = f"{Path(path).name} [{name}]"
    try:
        out: dict[str, Any] = {}
        if "n_timesteps" in e:
            out["steps"] = int(float(e.pop("n_timesteps")))
        policy = sb3args.policy_name(e.pop("policy", "MlpPolicy"), algo)
        num_envs = int(e.pop("n_envs", 1))
        out["num_envs"] = num_envs
        out["frame_stack"] = int(e.pop("frame_stack", 1) or 1)
        out.update(_normalize(e.pop("normalize", False), algo, e.get("gamma")))
        out.update(_wrappers(e.pop("env_wrapper", None), env))
        for key in ("vec_env_wrapper", "callback", "env_kwargs", "monitor_kwargs", "eval_env_kwargs"):
            if e.get(key):
                raise UsageError(f"{key}={e[key]!r} is not supported by hetrl")
            e.pop(key, None)
        if e.get("noise_type") is not None:
            kind, std = str(e.pop("noise_type")).strip(), float(e.pop("noise_std"))
            cls = OrnsteinUhlenbeckActionNoise if "ornstein-uhlenbeck" in kind else NormalActionNoise
            if "normal" not in kind and "ornstein-uhlenbeck" not in kind:
                raise UsageError(f"noise_type={kind!r} is not normal or ornstein-uhlenbeck")
            e["action_noise"] = cls(mean=[0.0], sigma=[std])
        e.pop("noise_std", None)
        e.pop("noise_type", None)
        for key in ("policy_kwargs", "replay_buffer_kwargs", "replay_buffer_class"):
            if isinstance(e.get(key), str):
                e[key] = parse(e[key], key)
        if isinstance(e.get("train_freq"), list):
            e["train_freq"] = tuple(e["train_freq"])
        mapped, keep = sb3args.to_settings(algo, e, policy=policy, num_envs=num_envs, env=env)
        if keep.get("lr_fn") is not None:
            raise UsageError("learning_rate as a callable cannot come from a file")
        for k in ("tensorboard_log", "verbose", "seed", "device", "stats_window_size"):
            keep.pop(k, None)
        out = {**mapped, **out}
    except UsageError as err:
        raise UsageError(f"{where}: {err}") from None
    return out


NORMALIZE_ARGS = {"norm_obs": "normalize_obs", "norm_reward": "normalize_reward", "clip_obs": "clip_obs",
                  "clip_reward": "clip_reward"}


def _normalize(value: Any, algo: str, gamma: Any) -> dict[str, Any]:
    """The zoo's `normalize` (true, or a string of VecNormalize's keyword arguments) as the settings of an algorithm
    that normalises (the on-policy ones: normalize_obs, normalize_reward, clip_obs, clip_reward; the returns are
    discounted by the run's gamma, as the zoo gives VecNormalize the entry's gamma)."""
    if value in (False, None, "False", "false"):
        return {}
    from hetrl.config import keys, settings_class

    if "normalize_obs" not in keys(settings_class(algo)):
        raise UsageError(f"normalize={value!r}: hetrl's {algo.upper()} does not normalise observations or rewards "
                         "(its on-policy algorithms do: PPO, A2C)")
    kw = {"norm_obs": True, "norm_reward": True}
    if isinstance(value, str) and value.strip() not in ("True", "true"):
        got = parse(value, "normalize")
        if not isinstance(got, dict):
            raise UsageError(f"normalize={value!r} is not true or a dict of VecNormalize's arguments")
        kw.update(got)
    if kw.get("gamma") is not None and gamma is not None and float(kw.pop("gamma")) != float(gamma):
        raise UsageError("normalize: VecNormalize's gamma differs from the entry's gamma; hetrl discounts the returns "
                         "it scales rewards by with the run's gamma")
    kw.pop("gamma", None)
    unknown = set(kw) - set(NORMALIZE_ARGS)
    if unknown:
        raise UsageError(f"normalize: VecNormalize's {', '.join(sorted(unknown))} not supported (norm_obs, "
                         "norm_reward, clip_obs, clip_reward are)")
    return {NORMALIZE_ARGS[k]: v for k, v in kw.items()}


def _wrappers(spec: Any, env: str) -> dict[str, Any]:
    """The zoo's env_wrapper: SB3's AtariWrapper (hetrl's own Atari preprocessing, for Atari ids) maps to the
    atari_* settings; other wrappers are refused."""
    from hetrl.config import atari_id

    if not spec:
        return {}
    out: dict[str, Any] = {}
    for item in spec if isinstance(spec, list) else [spec]:
        cls, kw = (next(iter(item.items())) if isinstance(item, dict) else (item, {}))
        kw = kw or {}
        if cls != ATARI_WRAPPER or not atari_id(env):
            raise UsageError(f"env_wrapper {cls} is not supported (hetrl applies SB3's AtariWrapper preprocessing to "
                             "Atari ids itself, and no other wrapper from a file)")
        for k, v in kw.items():
            if k == "action_repeat_probability" and not v:
                continue
            if k not in ATARI_ARGS:
                raise UsageError(f"AtariWrapper({k}={v!r}) is not supported")
            out[ATARI_ARGS[k]] = v
    return out
