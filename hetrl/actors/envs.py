"""Building Gymnasium envs from an id (incl. 'module:EnvId') or a factory, with clear errors.

Vector envs use Gymnasium's SAME_STEP autoreset: when an episode ends, `step` returns the
first obs of the next episode and the true last obs in `info["final_obs"]`, so a truncated
transition can bootstrap from its real next state. EnvPool (C++ vector envs, `env_backend`) is
adapted to the same semantics: plain ids by `EnvPoolVector`, Atari games under hetrl's preprocessing
by `EnvPoolAtari`.

`prepare_env(env, cfg, train)` is the env a run trains (or evaluates) on: the id or factory given,
with the wrappers the run's settings ask for (the Atari preprocessing of ALE ids, hetrl/actors/atari.py;
frame stacking), as a picklable factory that every schedule builds the same way.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import dataclass
from typing import Callable, Optional, Union

import gymnasium as gym
import numpy as np

from hetrl.actors.atari import AtariOptions, atari_id
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
    atari = cfg.atari if isinstance(env, str) and atari_id(env) else None
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


def make_env(env: EnvSpec, render_mode: str | None = None, flatten: bool = True, **kwargs) -> gym.Env:
    """One env from an id or a zero-argument factory; UsageError for unknown ids. `kwargs` go to
    gymnasium.make (ids only). flatten: observations that are not arrays (Discrete, MultiDiscrete,
    MultiBinary, Tuple, Dict) become one float32 vector (`flatten_observations`)."""
    if isinstance(env, Prepared):
        return env(render_mode)
    if callable(env) and not isinstance(env, str):
        made = env()
        if not isinstance(made, gym.Env):
            raise UsageError(f"env factory {env_name(env)} returned {type(made).__name__}, not a gymnasium.Env")
        return flatten_observations(made) if flatten else made
    made = _make_id(env, render_mode, **kwargs)
    return flatten_observations(made) if flatten else made


FLATTENED = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Tuple, gym.spaces.Dict)


def flatten_observations(e: gym.Env) -> gym.Env:
    """An env whose observations are not an array gets them as one float32 vector, as SB3's policies
    see them: a Discrete one one-hot, MultiDiscrete concatenated one-hots, MultiBinary as 0/1, Tuple
    and Dict their parts' flattenings concatenated (gymnasium.spaces.flatten; Dict in key order)."""
    space = e.observation_space
    if not isinstance(space, FLATTENED):
        return e
    try:
        e = gym.wrappers.FlattenObservation(e)
    except (NotImplementedError, TypeError, ValueError) as err:
        raise UsageError(f"observation space {space} cannot be flattened into a vector ({err}); "
                         "wrap the env so that its observations are a Box") from None
    flat = e.observation_space
    return gym.wrappers.TransformObservation(e, _as_float32, gym.spaces.Box(
        flat.low.astype(np.float32), flat.high.astype(np.float32), flat.shape, np.float32))


def _as_float32(obs: np.ndarray) -> np.ndarray:
    return obs.astype(np.float32)


def raw_observation_space(env: EnvSpec) -> gym.Space:
    """The env's own observation space, before `flatten_observations`."""
    e = make_env(env, flatten=False)
    try:
        return e.observation_space
    finally:
        e.close()


def _make_id(env: str, render_mode: str | None = None, **kwargs) -> gym.Env:
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
            self.single_observation_space = self.pool.observation_space
            self.single_action_space = self.pool.action_space
        # the batched spaces, as a Gymnasium VectorEnv's (EnvPool's own are one env's)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.num_envs = num_envs
        self.action_space.seed(seed)
        self.action_dtype = self.pool.spec.action_array_spec["action"].dtype   # EnvPool refuses another

    def reset(self, seed=None):
        obs, info = self.pool.reset()
        return obs, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.pool.step(np.asarray(actions, self.action_dtype))
        done = terminated | truncated
        if done.any():
            ids = np.flatnonzero(done).astype(np.int32)   # EnvPool's env ids are int32 (int64 crashes it)
            info = dict(info, final_obs=obs.copy())
            obs = obs.copy()
            obs[ids] = self.pool.reset(ids)[0]
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self.pool.close()


def envpool_supports(env: EnvSpec) -> bool:
    """Whether EnvPool is installed and has `env` as it is: a plain id (no wrappers), or an Atari game
    under hetrl's preprocessing (EnvPool's C++ Atari does the same preprocessing: `EnvPoolAtari`)."""
    if isinstance(env, Prepared):
        return envpool_atari_task(env) is not None
    if not isinstance(env, str) or ":" in env:
        return False
    try:
        import envpool
    except ImportError:
        return False
    # EnvPool gives its envs' own observations: only array ones (hetrl flattens the others, on Gymnasium)
    return env in envpool.list_all_envs() and _box_observations(env)


@functools.lru_cache(maxsize=None)
def _box_observations(env_id: str) -> bool:
    return isinstance(raw_observation_space(env_id), gym.spaces.Box)


def envpool_atari_task(env: EnvSpec) -> str | None:
    """EnvPool's id of the Atari game of a prepared ALE env (ALE/Breakout-v5, BreakoutNoFrameskip-v4 ->
    Breakout-v5), or None: not an Atari env, EnvPool not installed, or a game EnvPool lacks."""
    if not (isinstance(env, Prepared) and env.atari is not None and isinstance(env.env, str)):
        return None
    try:
        import envpool
    except ImportError:
        return None
    if env.atari.noop_max < 1:   # EnvPool's noop reset draws from 1..noop_max (0 aborts the process)
        return None
    base = env.env.split(":")[-1]
    game = base[4:].rsplit("-v", 1)[0] if base.startswith("ALE/") else base.removesuffix("NoFrameskip-v4")
    task = f"{game}-v5"
    return task if task in envpool.list_all_envs() else None


class EnvPoolAtari:
    """EnvPool's C++ Atari under hetrl's Atari switches (the fast path for Atari actors), with the
    semantics of the Gymnasium path (`atari.wrap` + frame stacking in a SAME_STEP SyncVectorEnv):

    - EnvPool does the noop reset, the frame skip with the max over the last 2 frames, the 84x84
      grayscale (INTER_AREA, as OpenCV in AtariPreprocessing), FIRE on reset and the frame stack; sticky
      actions as the id's default (0.25 for ALE/*-v5, 0 for *NoFrameskip-v4) or the setting;
      episodes end at 108,000 frames as Gymnasium's.
    - Episodic life (training): a lost life ends the episode (terminated) and the same game goes on,
      as SB3's EpisodicLifeEnv. It is done here from EnvPool's `lives`: EnvPool's own episodic_life
      restarts the whole game when the env is reset in the same step (SAME_STEP autoreset).
    - Rewards are clipped to their sign here (training) so the raw score is known: every whole game
      is reported in `info["final_info"]["episode"]` (raw score, agent steps) as RecordEpisodeStatistics.
    - Differences from the Gymnasium path: a new game's stack repeats its first frame (Gymnasium's and
      SB3's pad with zeros); after a lost life the stack goes on and no no-op/FIRE steps are inserted
      (the agent presses FIRE itself)."""

    def __init__(self, env: Prepared, num_envs: int, seed: int):
        import warnings

        import envpool

        opts, task = env.atari, envpool_atari_task(env)
        if task is None:
            raise UsageError(f"env_backend=envpool: EnvPool is not installed or has no {env_name(env)!r} "
                             "(atari_noop_max >= 1); pip install 'hetrl[envpool]', or use --set env_backend=gymnasium")
        v4 = env.env.split(":")[-1].endswith("NoFrameskip-v4")
        sticky = opts.repeat_action_probability
        if sticky is None:
            sticky = 0.0 if v4 else 0.25
        self.stack = max(1, env.frame_stack)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.pool = envpool.make(
                task, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, num_threads=1, seed=seed,
                stack_num=self.stack, frame_skip=opts.frame_skip, noop_max=opts.noop_max,
                img_height=opts.screen_size, img_width=opts.screen_size, gray_scale=True,
                episodic_life=False, reward_clip=False, use_fire_reset=opts.fire_reset,
                repeat_action_probability=float(sticky), full_action_space=False,
                max_episode_steps=(400_000 if v4 else 108_000) // opts.frame_skip)
        shape = (self.stack, opts.screen_size, opts.screen_size) if self.stack > 1 else (opts.screen_size,) * 2
        self.single_observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.single_action_space = gym.spaces.Discrete(int(self.pool.action_space.n))
        self.observation_space = gym.spaces.Box(0, 255, (num_envs, *shape), np.uint8)
        self.action_space = gym.spaces.MultiDiscrete(np.full(num_envs, self.single_action_space.n))
        self.action_space.seed(seed)
        self.action_dtype = self.pool.spec.action_array_spec["action"].dtype   # int32; EnvPool refuses another
        self.num_envs = num_envs
        self.episodic = opts.episodic_life and env.train
        self.clip = opts.clip_reward and env.train
        self.lives = np.zeros(num_envs, np.int32)
        self.score = np.zeros(num_envs)
        self.length = np.zeros(num_envs, np.int64)

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        return obs if self.stack > 1 else obs[:, 0]

    def reset(self, seed=None):
        obs, info = self.pool.reset()
        self.lives[:] = info["lives"]
        self.score[:] = 0
        self.length[:] = 0
        return self._obs(obs), {}

    def step(self, actions):
        obs, raw, terminated, truncated, info = self.pool.step(np.asarray(actions, self.action_dtype))
        over = terminated | truncated   # the game is over
        self.score += raw
        self.length += 1
        reward = np.sign(raw) if self.clip else raw
        lives = info["lives"]
        if self.episodic:
            terminated = terminated | ((lives < self.lives) & (lives > 0) & ~over)
        self.lives[:] = lives
        out: dict = {}
        obs = self._obs(obs)
        if (terminated | truncated).any():
            out["final_obs"] = obs.copy()
        if over.any():
            ids = np.flatnonzero(over)
            out["final_info"] = {"episode": {"r": self.score.copy(), "l": self.length.copy()}, "_episode": over}
            new, new_info = self.pool.reset(ids.astype(np.int32))
            obs = obs.copy()
            obs[ids] = self._obs(new)
            self.lives[ids] = new_info["lives"]
            self.score[ids] = 0
            self.length[ids] = 0
        return obs, reward, terminated, truncated, out

    def close(self) -> None:
        self.pool.close()


class SyncVector(gym.vector.SyncVectorEnv):
    """Gymnasium's SyncVectorEnv, whose step takes a shorter way for array observations and actions (a Box
    observation space; Discrete, Box or MultiDiscrete actions) under SAME_STEP autoreset: each env's action is
    the action array's row and its observation is written into the batch's row, where the parent's step goes
    through the spaces' generic iterate/concatenate and deep-copies the batch. Same results (the observations,
    rewards, flags and infos of the parent's step, the observations a copy the next step does not change); any
    other spaces or autoreset mode take the parent's step. At one CartPole env the step is most of an actor's
    time apart from its policy, and the generic path was two thirds of it."""

    def __init__(self, env_fns, **kwargs):
        super().__init__(env_fns, **kwargs)
        self._rows = (isinstance(self.single_observation_space, gym.spaces.Box)
                      and isinstance(self.single_action_space, (gym.spaces.Discrete, gym.spaces.Box,
                                                                gym.spaces.MultiDiscrete))
                      and self.autoreset_mode == gym.vector.AutoresetMode.SAME_STEP
                      and isinstance(getattr(self, "_observations", None), np.ndarray)
                      and all(hasattr(self, a) for a in ("_env_obs", "_rewards", "_terminations", "_truncations",
                                                         "_autoreset_envs")))

    def step(self, actions):
        if not self._rows or not isinstance(actions, np.ndarray) or len(actions) != self.num_envs:
            return super().step(actions)
        infos: dict = {}
        obs, rewards, terms, truncs = self._observations, self._rewards, self._terminations, self._truncations
        shape = self.single_observation_space.shape
        for i, env in enumerate(self.envs):
            o, rewards[i], terms[i], truncs[i], env_info = env.step(actions[i])
            if terms[i] or truncs[i]:
                infos = self._add_info(infos, {"final_obs": o, "final_info": env_info}, i)
                o, env_info = env.reset()
            if np.shape(o) != shape:   # (a row assignment would broadcast it)
                raise ValueError(f"env {i} returned an observation of shape {np.shape(o)}; its observation space "
                                 f"{self.single_observation_space} says {shape}")
            self._env_obs[i] = o
            obs[i] = o
            if env_info:
                infos = self._add_info(infos, env_info, i)
        self._autoreset_envs = terms | truncs
        return obs.copy(), rewards.copy(), terms.copy(), truncs.copy(), infos


def make_vector_env(env: EnvSpec, num_envs: int, seed: int, backend: str = "gymnasium"):
    """`num_envs` copies stepped in this process with SAME_STEP autoreset, seeded seed, seed+1, ...
    backend: gymnasium (SyncVectorEnv: fastest Python vector here), envpool (EnvPool's C++ vector
    env: plain ids it knows, and Atari games under hetrl's preprocessing), or auto: EnvPool for an
    Atari game it has (its C++ preprocessing is the fast path), else Gymnasium (under `--plan auto` the
    planner measures both backends and sets the faster one)."""
    if backend == "envpool" and not envpool_supports(env):
        if isinstance(env, Prepared) and env.atari is None:
            raise UsageError(f"env_backend=envpool: hetrl's wrappers for {env_name(env)!r} (frame_stack) run "
                             "on Gymnasium envs only; use --set env_backend=gymnasium")
        if isinstance(env, Prepared) and env.atari.noop_max < 1:
            raise UsageError("env_backend=envpool: EnvPool's Atari takes atari_noop_max >= 1; "
                             "use --set env_backend=gymnasium for atari_noop_max=0")
        raise UsageError(f"env_backend=envpool but EnvPool is not installed or does not know {env_name(env)!r} (or gives "
                         "observations that are not arrays, which hetrl flattens on Gymnasium envs only); "
                         "pip install 'hetrl[envpool]', or use --set env_backend=gymnasium")
    if isinstance(env, Prepared) and backend in ("auto", "envpool") and envpool_supports(env):
        return EnvPoolAtari(env, num_envs, seed)
    if backend == "envpool":
        return EnvPoolVector(env, num_envs, seed)
    make_env(env).close()  # surface bad ids as UsageError before building the vector
    venv = SyncVector([lambda: make_env(env) for _ in range(num_envs)],
                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    venv.reset(seed=[seed + i for i in range(num_envs)])
    venv.action_space.seed(seed)
    return venv


def flat_obs_dim(space: gym.Space) -> int:
    if not isinstance(space, gym.spaces.Box):
        raise UsageError(f"observation space {space} is not a Box; hetrl's networks take vector (Box) "
                         "observations: wrap the env with gymnasium.wrappers.FlattenObservation")
    return int(np.prod(space.shape))
