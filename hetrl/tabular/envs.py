"""Gymnasium environments for tabular learning: id resolution, space checks, compiled model.

- :func:`resolve_env_id` accepts an id whose version this Gymnasium lacks and maps it to the
  registered version of the same name (``CliffWalking-v0`` -> ``CliffWalking-v1``,
  ``Taxi-v3`` -> ``Taxi-v4`` on Gymnasium 1.4; the other way round on older releases).
- :func:`env_info` checks that both spaces are ``Discrete`` and gathers what learning needs.
- :func:`tabular_model` turns a toy-text env's transition table ``P[s][a] = [(p, s', r,
  terminated), ...]`` and ``initial_state_distrib`` into dense arrays that the compiled data
  generator and online kernels sample from; that is exactly what the env's own ``step`` does
  (a categorical draw from ``P[s][a]``), minus the Python overhead. Envs without such a table
  (or Taxi with ``fickle_passenger``, whose step has extra logic) fall back to stepping the
  real env.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetrl.errors import UsageError

# success of one greedy episode, by env name (without version)
#   "positive": terminated with a positive last reward (FrozenLake reaches the goal; holes give 0)
#   "terminated": terminated at all (Taxi: only a correct drop-off; CliffWalking: the goal)
_SUCCESS_RULES = {"FrozenLake": "positive", "FrozenLake8x8": "positive", "Taxi": "terminated",
                  "CliffWalking": "terminated", "CliffWalkingSlippery": "terminated"}


def _gym():
    import gymnasium as gym

    return gym


def resolve_env_id(env_id: str) -> str:
    """Registered id for env_id; another version of the same name if this one is missing."""
    gym = _gym()
    if not isinstance(env_id, str) or not env_id:
        raise UsageError("--env needs a Gymnasium id such as FrozenLake-v1, Taxi-v3, CliffWalking-v0")
    if env_id in gym.registry:
        return env_id
    from gymnasium.envs.registration import parse_env_id

    try:
        ns, name, _version = parse_env_id(env_id)
    except Exception:  # malformed id
        ns, name = None, env_id
    same = []
    for key, spec in gym.registry.items():
        if spec.namespace == ns and spec.name == name:
            same.append((spec.version if spec.version is not None else -1, key))
    if same:
        return max(same)[1]
    close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise UsageError(f"unknown env id {env_id!r}{hint}; pass a registered Gymnasium id such as FrozenLake-v1")


def make_env(env_id: str, env_kwargs: dict | None = None, **extra):
    """gym.make on the resolved id; UsageError for bad kwargs."""
    gym = _gym()
    resolved = resolve_env_id(env_id)
    kwargs = dict(env_kwargs or {})
    kwargs.update(extra)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return gym.make(resolved, **kwargs)
    except TypeError as exc:
        raise UsageError(f"bad env option for {resolved}: {exc}; check --env-kwarg KEY=VALUE") from exc
    except gym.error.Error as exc:
        raise UsageError(f"cannot make {resolved}: {exc}") from exc


@dataclass
class TabularModel:
    """Dense transition table of a toy-text env (K = most outcomes of any (s, a))."""

    cum_p: np.ndarray  # float64 (S, A, K) cumulative outcome probabilities
    n_out: np.ndarray  # int32 (S, A) number of outcomes
    next_s: np.ndarray  # int32 (S, A, K)
    reward: np.ndarray  # float32 (S, A, K)
    term: np.ndarray  # uint8 (S, A, K)
    isd_cum: np.ndarray  # float64 (S,) cumulative initial-state distribution

    @property
    def reward_abs_max(self) -> float:
        return float(np.abs(self.reward).max()) if self.reward.size else 0.0


@dataclass
class EnvInfo:
    requested_id: str
    env_id: str  # resolved
    n_states: int
    n_actions: int
    max_steps: int  # time limit of the registered spec, 0 = none
    success_rule: str
    env_kwargs: dict = field(default_factory=dict)
    model: TabularModel | None = None

    @property
    def name(self) -> str:
        return self.env_id.split("/")[-1].split("-v")[0]


def tabular_model(env) -> TabularModel | None:
    """Arrays of env.unwrapped.P, or None when the env has no (faithful) transition table."""
    u = env.unwrapped
    P = getattr(u, "P", None)
    isd = getattr(u, "initial_state_distrib", None)
    if not isinstance(P, dict) or isd is None or getattr(u, "fickle_passenger", False):
        return None
    nS, nA = int(env.observation_space.n), int(env.action_space.n)
    try:
        K = max(len(P[s][a]) for s in range(nS) for a in range(nA))
        cum_p = np.ones((nS, nA, K), np.float64)
        n_out = np.zeros((nS, nA), np.int32)
        next_s = np.zeros((nS, nA, K), np.int32)
        reward = np.zeros((nS, nA, K), np.float32)
        term = np.zeros((nS, nA, K), np.uint8)
        for s in range(nS):
            for a in range(nA):
                outs = P[s][a]
                n_out[s, a] = len(outs)
                c = 0.0
                for k, (p, s2, r, t) in enumerate(outs):
                    c += float(p)
                    cum_p[s, a, k] = c
                    next_s[s, a, k] = int(s2)
                    reward[s, a, k] = float(r)
                    term[s, a, k] = bool(t)
                if not outs or abs(c - 1.0) > 1e-6:
                    return None
                cum_p[s, a, len(outs) - 1 :] = 1.0  # guard against rounding below 1
        isd = np.asarray(isd, np.float64).ravel()
        if isd.shape != (nS,) or abs(isd.sum() - 1.0) > 1e-6:
            return None
        isd_cum = np.cumsum(isd)
        isd_cum[-1] = 1.0
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return TabularModel(cum_p, n_out, next_s, reward, term, isd_cum)


def env_info(env_id: str, env_kwargs: dict | None = None, with_model: bool = True) -> EnvInfo:
    """Resolve, make and check an env; UsageError unless both spaces are Discrete."""
    from gymnasium.spaces import Discrete

    env = make_env(env_id, env_kwargs)
    try:
        obs, act = env.observation_space, env.action_space
        if not isinstance(obs, Discrete) or not isinstance(act, Discrete):
            raise UsageError(
                f"{env.spec.id} has observation space {_short(obs)} and action space {_short(act)}; tabular "
                "learning needs Discrete spaces for both (e.g. FrozenLake-v1, Taxi-v3, CliffWalking-v0)"
            )
        if int(obs.start) != 0 or int(act.start) != 0:
            raise UsageError(f"{env.spec.id} has Discrete spaces not starting at 0; tabular needs start=0")
        spec = env.spec
        max_steps = int(spec.max_episode_steps or 0) if spec is not None else 0
        rule = _SUCCESS_RULES.get(spec.name if spec is not None else "", "positive")
        model = tabular_model(env) if with_model else None
        return EnvInfo(env_id, spec.id, int(obs.n), int(act.n), max_steps, rule,
                       dict(env_kwargs or {}), model)
    finally:
        env.close()


def _short(space) -> str:
    from gymnasium.spaces import Discrete

    if isinstance(space, Discrete):
        return f"Discrete({int(space.n)})"
    shape = getattr(space, "shape", None)
    return f"{type(space).__name__}{tuple(shape) if shape is not None else ''}"


def parse_env_kwargs(items: list[str] | None) -> dict[str, Any]:
    """['is_slippery=false', 'map_name="8x8"'] -> {'is_slippery': False, 'map_name': '8x8'}."""
    import json

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env-kwarg {item!r} is not KEY=VALUE; e.g. --env-kwarg is_slippery=false")
        low = raw.strip()
        if low.lower() in ("true", "false"):
            out[key] = low.lower() == "true"
            continue
        try:
            out[key] = json.loads(low)
        except ValueError:
            out[key] = raw
    return out
