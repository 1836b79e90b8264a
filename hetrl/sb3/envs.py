"""The `env` an SB3 user passes, as what hetrl trains on: an env id, or a picklable factory, and a width.

SB3 takes an env id, a `gymnasium.Env`, or a vector env (its own `VecEnv`: DummyVecEnv, SubprocVecEnv and
wrappers). hetrl's actors, evaluations and actor processes each build their own envs, so an instance becomes a
factory of copies (`EnvCopy`: a deep copy each call, picklable when the env is) or, where it cannot be copied, of
new envs from its `spec` (`SpecEnv`); a vector env gives its width (num_envs) and its first env's factory.
SB3's `Monitor` is taken off the copies (hetrl counts the episodes itself) and the user's Monitor files get the
training episodes (`MonitorFiles`), its
`VecFrameStack` becomes frame_stack, its `VecNormalize` the settings of the on-policy algorithms' own
normalisation (normalize_obs, normalize_reward, clip_obs, clip_reward: hetrl/algos/onpolicy.py); the statistics
hetrl learns are written back into the user's VecNormalize (`sync_vec_normalize`), so that its save / load and
its evaluation mode (training=False) work as in SB3.

`VecEnv` here is a small vector env with SB3's API (reset() -> obs; step() -> obs, rewards, dones, infos), what
`model.get_env()` gives where Stable-Baselines3 is not installed (where it is: SB3's own DummyVecEnv).
"""

from __future__ import annotations

import copy
import math
import pickle
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from hetrl.errors import UsageError

_PASS_WRAPPERS = ("VecMonitor", "VecTransposeImage", "VecCheckNan")


class EnvCopy:
    """A zero-argument env factory: a deep copy of `env` per call (picklable where the env is)."""

    def __init__(self, env: gym.Env):
        self.env = env
        self.__name__ = _name(env)

    def __call__(self) -> gym.Env:
        return copy.deepcopy(self.env)


class SpecEnv:
    """A zero-argument env factory: gymnasium.make(spec) (the id, its kwargs and its recorded wrappers)."""

    def __init__(self, spec: gym.envs.registration.EnvSpec):
        self.spec = spec
        self.__name__ = spec.id

    def __call__(self) -> gym.Env:
        return gym.make(self.spec)


def _name(env: gym.Env) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env.unwrapped).__name__


@dataclass
class Converted:
    spec: Any                     # what hetrl trains on: an id or a zero-argument factory (EnvSpec)
    num_envs: int = 1
    frame_stack: int = 1
    user_env: Any = None          # what get_env() gives back: the user's VecEnv, or the env to wrap
    notes: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)   # settings the env implies (a VecNormalize's)
    vec_normalize: Any = None     # the user's VecNormalize, if any
    monitors: list = field(default_factory=list)   # the user's SB3 Monitors that write files (MonitorFiles)


def picklable(spec: Any) -> bool:
    if isinstance(spec, str):
        return True
    try:
        pickle.dumps(spec)
        return True
    except Exception:
        return False


def is_sb3_vec_env(env: Any) -> bool:
    return all(hasattr(env, a) for a in ("num_envs", "step_async", "step_wait", "get_attr", "env_method"))


def _is_monitor(env: Any) -> bool:
    return type(env).__name__ in ("Monitor", "VecMonitor") and type(env).__module__.startswith("stable_baselines3")


def _without_monitor(env: gym.Env) -> gym.Env:
    """The env inside SB3's Monitor wrappers (the outer ones)."""
    while _is_monitor(env):
        env = env.env
    return env


def monitor_of(env: Any) -> Any:
    """The outermost SB3 Monitor among `env`'s outer wrappers that writes a file (None if none)."""
    while isinstance(env, gym.Wrapper):
        if _is_monitor(env) and getattr(env, "results_writer", None) is not None:
            return env
        if not _is_monitor(env):
            return None
        env = env.env
    return None


class MonitorFiles:
    """The Monitor files of the user's env (SB3's `Monitor(env, filename)`, `make_vec_env(monitor_dir=...)`,
    `VecMonitor(venv, filename)`), written with the training episodes as SB3's Monitor writes them: one row
    (r, l, t) per episode through the Monitor's own results writer, t in seconds since the Monitor started.

    hetrl steps copies of the env, not the user's objects; each finished episode says the env it ran in (its
    `env`, hetrl/actors/actor.py), and its row goes to that env's Monitor, as in SB3 (one file per env, each with
    its env's episodes; a single VecMonitor gets them all). An episode that does not say its env (a population's)
    goes to the files in turn."""

    def __init__(self, monitors: list):
        self.per_env = list(monitors)                      # env i's Monitor (None: that env has none)
        self.monitors = [m for m in monitors if m is not None]
        self._next = 0

    def __bool__(self) -> bool:
        return bool(self.monitors)

    def write(self, episodes: list) -> None:
        import time

        for ep in episodes:
            r, n = ep
            env = getattr(ep, "env", None)
            if env is None:
                m = self.monitors[self._next % len(self.monitors)]
                self._next += 1
            else:
                m = self.per_env[env % len(self.per_env)]
                if m is None:
                    continue
            t = time.time() - m.t_start
            m.results_writer.write_row({"r": round(float(r), 6), "l": int(n), "t": round(t, 6)})
            if hasattr(m, "episode_returns"):   # a Monitor's own record (get_episode_rewards(), ...)
                m.episode_returns.append(float(r))
                m.episode_lengths.append(int(n))
                m.episode_times.append(t)
                m.total_steps += int(n)
            else:   # a VecMonitor counts its episodes
                m.episode_count += 1


def _spec_factory(spec, what: str) -> SpecEnv:
    if spec is None:
        raise UsageError(f"{what} cannot be copied and has no gymnasium spec to make it again; pass an env id, or a "
                         "module-level function that makes the env")
    wrappers = tuple(w for w in spec.additional_wrappers if not w.entry_point.startswith("stable_baselines3.common.monitor"))
    odd = [w.name for w in wrappers if w.kwargs is None]
    if odd:
        raise UsageError(f"{what} cannot be copied, and its wrappers {', '.join(odd)} cannot be made again from its "
                         "spec; pass an env id, or a module-level function that makes the env")
    return SpecEnv(copy.copy(spec) if wrappers == spec.additional_wrappers
                   else _replace(spec, additional_wrappers=wrappers))


def _replace(spec, **changes):
    import dataclasses

    return dataclasses.replace(spec, **changes)


def env_factory(env: gym.Env) -> Any:
    """A factory of envs like `env` (a gymnasium.Env instance): copies of it, else new ones from its spec."""
    inner = _without_monitor(env)
    try:
        copy.deepcopy(inner).close()
        return EnvCopy(inner)
    except Exception:
        return _spec_factory(getattr(inner, "spec", None), f"env {_name(inner)}")


def convert(env: Any) -> Converted:
    """The user's env as hetrl's (see the module's doc); one clear UsageError where it cannot be."""
    if env is None:
        raise UsageError("env is None; pass an env id like 'CartPole-v1', a gymnasium.Env, or a vector env")
    if isinstance(env, str):
        return Converted(env, user_env=None)
    if is_sb3_vec_env(env):
        return _convert_vec_env(env)
    if isinstance(env, gym.vector.VectorEnv):
        fns = getattr(env, "env_fns", None)
        spec = fns[0] if fns else _spec_factory(getattr(env, "spec", None), "this vector env")
        return Converted(spec, int(env.num_envs), user_env=None)
    if isinstance(env, gym.Env):
        return Converted(env_factory(env), 1, user_env=env, monitors=[monitor_of(env)])
    if callable(env):
        return Converted(env, 1, user_env=None)
    raise UsageError(f"env of type {type(env).__name__} is not supported; pass an env id, a gymnasium.Env, a "
                     "Gymnasium vector env, an SB3 VecEnv or a zero-argument env factory")


def _vec_normalize_settings(v: Any) -> dict:
    """The settings of SB3's VecNormalize `v` (hetrl's normalisation: the on-policy algorithms' settings)."""
    if not math.isclose(float(getattr(v, "epsilon", 1e-8)), 1e-8):
        raise UsageError(f"VecNormalize(epsilon={v.epsilon}): hetrl's normalisation uses epsilon=1e-8; keep the default")
    if getattr(v, "norm_obs_keys", None):
        raise UsageError("VecNormalize(norm_obs_keys=...) normalises Dict observations, which hetrl flattens; drop it")
    return {"normalize_obs": bool(v.norm_obs), "normalize_reward": bool(v.norm_reward),
            "clip_obs": float(v.clip_obs), "clip_reward": float(v.clip_reward)}


def _convert_vec_env(venv: Any) -> Converted:
    stack, v, settings, vn, monitors = 1, venv, {}, None, []
    while hasattr(v, "venv"):   # SB3's VecEnvWrapper
        kind = type(v).__name__
        if kind == "VecMonitor" and getattr(v, "results_writer", None) is not None:
            monitors = [v]
        if kind == "VecFrameStack":
            stack *= int(v.stacked_obs.n_stack)
        elif kind == "VecNormalize":
            if vn is not None or stack > 1:
                raise UsageError("a VecNormalize above another wrapper (or twice) is not supported; put one "
                                 "VecNormalize around the vector env of single envs")
            settings, vn = _vec_normalize_settings(v), v
        elif kind not in _PASS_WRAPPERS:
            raise UsageError(f"the vector env wrapper {kind} is not supported; wrap the single envs instead (a "
                             "gymnasium wrapper inside the env factory)")
        v = v.venv
    n = int(venv.num_envs)
    envs = getattr(v, "envs", None)
    if envs:   # DummyVecEnv: the env objects are here (their Monitors too)
        monitors = monitors or [monitor_of(e) for e in envs]
        return Converted(env_factory(envs[0]), n, stack, user_env=venv, settings=settings, vec_normalize=vn,
                         monitors=monitors)
    try:
        spec = v.get_attr("spec", [0])[0]
    except Exception:
        spec = None
    if not monitors and _wraps_monitor(v):
        warnings.warn(f"the Monitors inside {type(v).__name__}'s processes get no training episodes (hetrl trains "
                      "on copies of the envs); wrap the vector env in VecMonitor(venv, filename) for a monitor file, "
                      "or use DummyVecEnv", stacklevel=4)
    return Converted(_spec_factory(spec, f"the vector env {type(v).__name__}"), n, stack, user_env=venv,
                     settings=settings, vec_normalize=vn, monitors=monitors)


def _wraps_monitor(venv: Any) -> bool:
    """Whether the envs of SB3's vector env `venv` (in its processes) are in SB3's Monitor."""
    try:
        from stable_baselines3.common.monitor import Monitor

        return any(venv.env_is_wrapped(Monitor))
    except Exception:   # SB3 absent, or a vector env that cannot say
        return False


def sync_vec_normalize(vn: Any, algo: Any) -> None:
    """Write the normalisation statistics hetrl learned (the algorithm's `normalization_state()`) into the user's
    VecNormalize `vn`: what its save(), its evaluation mode and get_vec_normalize_env() then give."""
    state = getattr(algo, "normalization_state", lambda: None)()
    if vn is None or state is None:
        return
    if state.get("obs") is not None and getattr(vn, "obs_rms", None) is not None:
        mean, var, count = state["obs"]
        vn.obs_rms.mean = mean.reshape(vn.obs_rms.mean.shape).astype(vn.obs_rms.mean.dtype)
        vn.obs_rms.var = var.reshape(vn.obs_rms.var.shape).astype(vn.obs_rms.var.dtype)
        vn.obs_rms.count = float(count)
    if state.get("ret") is not None and getattr(vn, "ret_rms", None) is not None:
        mean, var, count = state["ret"]
        vn.ret_rms.mean, vn.ret_rms.var, vn.ret_rms.count = float(mean), float(var), float(count)


# ---- a vector env with SB3's API -------------------------------------------------------------------------------
class VecEnv:
    """Envs stepped in this process with SB3's VecEnv API (autoreset; info["terminal_observation"] and
    info["TimeLimit.truncated"] on the last step of an episode; info["episode"] = {"r", "l"} there)."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]]):
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self.render_mode = getattr(self.envs[0], "render_mode", None)
        self._seeds: list = [None] * self.num_envs
        self._returns = np.zeros(self.num_envs)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._actions = None

    def _stack(self, obs: list):
        if isinstance(obs[0], dict):
            return {k: np.stack([o[k] for o in obs]) for k in obs[0]}
        return np.stack(obs)

    def reset(self):
        obs = []
        for i, e in enumerate(self.envs):
            o, _ = e.reset(seed=self._seeds[i])
            obs.append(o)
        self._seeds = [None] * self.num_envs
        self._returns[:] = 0
        self._lengths[:] = 0
        return self._stack(obs)

    def step_async(self, actions) -> None:
        self._actions = actions

    def step_wait(self):
        return self.step(self._actions)

    def step(self, actions):
        obs, rews, dones, infos = [], np.zeros(self.num_envs, np.float32), np.zeros(self.num_envs, bool), []
        for i, e in enumerate(self.envs):
            o, r, term, trunc, info = e.step(actions[i])
            info = dict(info)
            self._returns[i] += r
            self._lengths[i] += 1
            if term or trunc:
                info["terminal_observation"] = o
                info["TimeLimit.truncated"] = bool(trunc and not term)
                info["episode"] = {"r": float(self._returns[i]), "l": int(self._lengths[i])}
                self._returns[i], self._lengths[i] = 0.0, 0
                o, _ = e.reset()
            obs.append(o)
            rews[i], dones[i] = r, term or trunc
            infos.append(info)
        return self._stack(obs), rews, dones, infos

    def seed(self, seed: int | None = None) -> list:
        self._seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        return self._seeds

    def render(self, mode: str | None = None):
        return self.envs[0].render()

    def close(self) -> None:
        for e in self.envs:
            e.close()

    def get_attr(self, name: str, indices=None) -> list:
        return [getattr(self.envs[i], name) for i in self._indices(indices)]

    def set_attr(self, name: str, value, indices=None) -> None:
        for i in self._indices(indices):
            setattr(self.envs[i], name, value)

    def env_method(self, name: str, *args, indices=None, **kwargs) -> list:
        return [getattr(self.envs[i], name)(*args, **kwargs) for i in self._indices(indices)]

    def env_is_wrapped(self, wrapper_class, indices=None) -> list:
        out = []
        for i in self._indices(indices):
            e, found = self.envs[i], False
            while isinstance(e, gym.Wrapper) and not found:
                found, e = isinstance(e, wrapper_class), e.env
            out.append(found)
        return out

    def _indices(self, indices) -> list:
        if indices is None:
            return list(range(self.num_envs))
        return [indices] if isinstance(indices, int) else list(indices)


def vec_env(fns: list[Callable[[], gym.Env]]):
    """SB3's DummyVecEnv over `fns` (each env in SB3's Monitor) where Stable-Baselines3 is installed, else `VecEnv`."""
    try:
        from stable_baselines3.common.monitor import Monitor
        from stable_baselines3.common.vec_env import DummyVecEnv
    except ImportError:
        return VecEnv(fns)

    def monitored(fn):
        def make():
            e = fn()
            return e if isinstance(e, Monitor) else Monitor(e)
        return make

    return DummyVecEnv([monitored(fn) for fn in fns])
