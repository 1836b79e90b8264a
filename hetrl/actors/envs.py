"""Building Gymnasium envs from an id (incl. 'module:EnvId') or a factory, with clear errors.

Vector envs use Gymnasium's SAME_STEP autoreset: when an episode ends, `step` returns the
first obs of the next episode and the true last obs in `info["final_obs"]`, so a truncated
transition can bootstrap from its real next state. EnvPool (C++ vector envs, used when it is
installed and knows the id) is adapted to the same semantics by `EnvPoolVector`.

`prepare_env(env, cfg, train)` is the env a run trains (or evaluates) on: the id or factory given,
with the wrappers the run's settings ask for (the Atari preprocessing of ALE ids, hetrl/actors/atari.py;
frame stacking), as a picklable factory that every schedule builds the same way.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Callable, Optional, Union

import gymnasium as gym
import numpy as np

from hetrl.actors.atari import AtariOptions
from hetrl.config import atari_id
from hetrl.errors import UsageError

EnvSpec = Union[str, Callable[[], gym.Env]]
_EXTRAS = {"mujoco": "mujoco", "box2d": "box2d"}   # gymnasium.envs.<family> -> hetrl's extra


def env_name(env: EnvSpec) -> str:
    if isinstance(env, str):
        return env
    if isinstance(env, Prepared):
        return env_name(env.env)
    return getattr(env, "__name__", type(env).__name__)


@dataclass(frozen=True)
class Prepared:
    """An env with the wrappers of a run's settings: a picklable zero-argument factory (an EnvSpec).

    atari: the Atari preprocessing (ALE ids), for training (train=True: episodic life, clipped
    rewards) or evaluation (whole games, the raw score); frame_stack > 1: the last frames stacked
    on a new first axis, zero-padded at an episode's start (as SB3's VecFrameStack)."""

    env: EnvSpec
    atari: Optional[AtariOptions] = None
    frame_stack: int = 1
    train: bool = True

    def __call__(self, render_mode: str | None = None) -> gym.Env:
        from hetrl.actors import atari

        if self.atari is not None:
            e = make_env(self.env, render_mode, **atari.base_kwargs(self.atari))
            e = atari.wrap(e, self.atari, self.train)
        else:
            e = make_env(self.env, render_mode)
        if self.frame_stack > 1:
            e = gym.wrappers.FrameStackObservation(e, self.frame_stack, padding_type="zero")
        return e

    @property
    def reports_games(self) -> bool:
        """Whether its episodes' own statistics (info "episode", the raw score of a whole game) are
        what to log: Atari's training episodes end at a lost life and see clipped rewards."""
        return self.atari is not None


def prepare_env(env: EnvSpec, cfg, train: bool = True) -> EnvSpec:
    """The env of a run with settings `cfg` (training or evaluation): `env` itself when no wrapper
    applies, else a :class:`Prepared` factory."""
    if isinstance(env, Prepared):
        env = env.env
    atari = AtariOptions.from_config(cfg) if isinstance(env, str) and atari_id(env) else None
    if atari is None and cfg.frame_stack <= 1:
        return env
    return Prepared(env, atari, cfg.frame_stack, train)


def _import_module_of(env_id: str) -> None:
    if ":" in env_id:
        module = env_id.split(":", 1)[0]
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UsageError(f"env {env_id!r}: cannot import module {module!r} ({e}); "
                             f"install it or fix the 'module:EnvId' id") from None


def make_env(env: EnvSpec, render_mode: str | None = None, **kwargs) -> gym.Env:
    """One env from an id or a zero-argument factory; UsageError for unknown ids. `kwargs` go to
    gymnasium.make (ids only)."""
    if isinstance(env, Prepared):
        return env(render_mode)
    if callable(env) and not isinstance(env, str):
        made = env()
        if not isinstance(made, gym.Env):
            raise UsageError(f"env factory {env_name(env)} returned {type(made).__name__}, not a gymnasium.Env")
        return made
    if not isinstance(env, str):
        raise UsageError(f"env must be an id like 'CartPole-v1' or a factory, got {type(env).__name__}")
    _import_module_of(env)
    if atari_id(env):
        from hetrl.actors import atari

        atari.register()   # ale-py's ids (a one-line UsageError naming the extra when it is missing)
    if render_mode:
        kwargs["render_mode"] = render_mode
    try:
        return gym.make(env, **kwargs)
    except (gym.error.DependencyNotInstalled, ImportError) as e:  # an extra is missing (mujoco, box2d)
        entry = gym.spec(env.split(":")[-1]).entry_point
        family = entry.split(":")[0].split(".")[2:3] if isinstance(entry, str) else []
        extra = _EXTRAS.get(family[0], "") if family else ""
        if extra:  # one install command: hetrl's extra (not gymnasium's own hint)
            raise UsageError(f"env {env!r} needs {'MuJoCo' if extra == 'mujoco' else 'Box2D'}, which is not "
                             f"installed; pip install 'hetrl[{extra}]'") from None
        raise UsageError(f"env {env!r} needs a package that is not installed ({str(e).splitlines()[0]}); "
                         "install it") from None
    except gym.error.Error as e:
        ids = list(gym.registry.keys())
        close = difflib.get_close_matches(env.split(":")[-1], ids, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "check the id (gymnasium.pprint_registry() lists them)"
        raise UsageError(f"unknown env {env!r} ({str(e).splitlines()[0]}); {hint}") from None


def probe_spaces(env: EnvSpec) -> tuple[gym.Space, gym.Space]:
    e = make_env(env)
    try:
        return e.observation_space, e.action_space
    finally:
        e.close()


class EnvPoolVector:
    """An EnvPool vector env with Gymnasium's SAME_STEP autoreset: finished envs are reset in the
    same call and their last obs is returned in info["final_obs"] (EnvPool itself would reset
    them on the *next* step, ignoring that step's action)."""

    def __init__(self, env_id: str, num_envs: int, seed: int):
        import warnings

        import envpool

        with warnings.catch_warnings():  # EnvPool's spaces have float64 bounds; Gymnasium warns on the cast
            warnings.simplefilter("ignore", UserWarning)
            self.pool = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs,
                                     num_threads=1, seed=seed)
            self.observation_space, self.action_space = self.pool.observation_space, self.pool.action_space
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = self.observation_space, self.action_space
        self.action_space.seed(seed)

    def reset(self, seed=None):
        obs, info = self.pool.reset()
        return obs, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.pool.step(actions)
        done = terminated | truncated
        if done.any():
            ids = np.flatnonzero(done)
            info = dict(info, final_obs=obs.copy())
            obs = obs.copy()
            obs[ids] = self.pool.reset(ids)[0]
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self.pool.close()


def envpool_supports(env: EnvSpec) -> bool:
    if not isinstance(env, str) or ":" in env:
        return False
    try:
        import envpool
    except ImportError:
        return False
    return env in envpool.list_all_envs()


def make_vector_env(env: EnvSpec, num_envs: int, seed: int, backend: str = "gymnasium"):
    """`num_envs` copies stepped in this process with SAME_STEP autoreset, seeded seed, seed+1, ...
    backend: gymnasium (SyncVectorEnv: fastest Python vector here), envpool, or auto (envpool
    when installed and it knows the id)."""
    if backend == "envpool" and isinstance(env, Prepared):
        raise UsageError(f"env_backend=envpool: hetrl's wrappers for {env_name(env)!r} (Atari preprocessing, "
                         "frame_stack) run on Gymnasium envs only; use --set env_backend=gymnasium")
    if backend == "envpool" and not envpool_supports(env):
        raise UsageError(f"env_backend=envpool but EnvPool is not installed or does not know {env_name(env)!r}; "
                         "pip install envpool, or use --set env_backend=gymnasium")
    if backend in ("auto", "envpool") and envpool_supports(env):
        return EnvPoolVector(env, num_envs, seed)
    make_env(env).close()  # surface bad ids as UsageError before building the vector
    venv = gym.vector.SyncVectorEnv([lambda: make_env(env) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    venv.reset(seed=[seed + i for i in range(num_envs)])
    venv.action_space.seed(seed)
    return venv


def flat_obs_dim(space: gym.Space) -> int:
    if not isinstance(space, gym.spaces.Box):
        raise UsageError(f"observation space {space} is not a Box; hetrl's networks take vector (Box) "
                         "observations: wrap the env with gymnasium.wrappers.FlattenObservation")
    return int(np.prod(space.shape))
