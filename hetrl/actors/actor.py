"""The actor: steps a vector of envs with a policy snapshot and emits batches of transitions.

Inference is batched over the envs; n-step transitions are assembled on the actor side
(NStepAdder). `collect` is the one acting loop of every schedule: it returns one batch per call
(batched insert), or writes the transitions straight into a destination the caller gives (the
local schedule's shared-memory staging area), with no list or concatenation in between.
Every schedule builds its actors from an :class:`ActorSpec` (`ActorSpec.build()`), so every
setting an actor needs (env backend, n-step, seeds) reaches it the same way everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

import numpy as np

from hetrl.actors.envs import EnvSpec, make_vector_env
from hetrl.replay import NStepAdder


class ActingPolicy(Protocol):
    """What an algorithm gives its actors (see hetrl/algos/*.py)."""

    def act(self, obs: np.ndarray, explore: Optional[float]) -> tuple[np.ndarray, np.ndarray]:
        """(actions for the env, actions to store); explore=None means uniform random actions."""

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """The policy's deterministic (greedy / mean) env actions, for evaluation."""

    def load(self, state: dict) -> None:
        """Take new parameters from the parameter store."""

    def episode_end(self, done: np.ndarray) -> None:
        """Reset per-env exploration state (e.g. OU noise) where `done`."""


class Episode(tuple):
    """A finished training episode: the pair (return, length), and `env`, the index of the env it ran in among all
    envs of the run (actor a's env j: a x envs_per_actor + j; None where not known). A pair, so that code that
    reads (return, length) reads it as before; picklable (it travels from actor processes and Ray actors)."""

    def __new__(cls, ret: float, length: int, env: int | None = None):
        ep = super().__new__(cls, (ret, length))
        ep.env = env
        return ep

    def __reduce__(self):
        return Episode, (self[0], self[1], self.env)

    def __repr__(self) -> str:
        return f"Episode(return={self[0]}, length={self[1]}, env={self.env})"


@dataclass
class ActorSpec:
    """Everything an actor needs, picklable (sent to actor processes and Ray actors as it is)."""

    env: EnvSpec
    envs: int
    env_seed: int                 # envs get env_seed, env_seed + 1, ...
    policy: Any                   # the learner's algo.make_policy(seed=...), an ActingPolicy
    n_step: int = 1
    gamma: float = 0.99
    backend: str = "gymnasium"
    env_offset: int = 0           # the run-wide index of its first env (its episodes say their env by it)

    def build(self) -> "Actor":
        return Actor(self.env, self.envs, self.env_seed, self.policy, self.n_step, self.gamma, self.backend,
                     env_offset=self.env_offset)

    def start(self, one_thread: bool) -> "Actor":
        """The actor of a process apart from the learner (a local actor process, a Ray actor): torch on one thread
        where asked, denormals flushed (as in the learner), torch seeded, then built."""
        import torch

        if one_thread:
            torch.set_num_threads(1)
        torch.set_flush_denormal(True)
        torch.manual_seed(self.env_seed)
        return self.build()


class ExploreTable:
    """explore(actor env steps) -> the learner's exploration value for that vector step of a chunk
    (the learner's algorithm decides epsilon / the noise; actors need no copy of it)."""

    __slots__ = ("table", "start", "envs")

    def __init__(self, table: list, start: int, envs: int):
        self.table, self.start, self.envs = table, start, envs

    def __call__(self, actor_steps: int):
        return self.table[min((actor_steps - self.start) // self.envs, len(self.table) - 1)]


class Actor:
    """`num_envs` envs stepped as one vector by `policy`. With `groups` > 1 the envs are that many equal groups
    (a population's members, side by side: group g is envs g*n .. g*n+n-1): a run's last, partial vector step
    keeps the same first envs of every group and each batch row says its env (`env`); `seeds` gives every env its
    own reset seed (default seed, seed + 1, ...). Every finished episode is an :class:`Episode` that says its env,
    counted from `env_offset` (the actor's first env in the run)."""

    def __init__(self, env: EnvSpec, num_envs: int, seed: int, policy: ActingPolicy,
                 n_step: int = 1, gamma: float = 0.99, backend: str = "gymnasium", groups: int = 1,
                 seeds: list[int] | None = None, env_offset: int = 0):
        self.venv = make_vector_env(env, num_envs, seed, backend)
        self.num_envs, self.env_offset = num_envs, int(env_offset)
        self.groups, self.group_envs = groups, num_envs // groups
        # episodes to log: the env's own statistics of whole games where it keeps them (Atari trains on
        # lives with clipped rewards), else the returns this actor sums
        self.games = bool(getattr(env, "reports_games", False))
        self.policy = policy
        self.adder = NStepAdder(n_step, gamma, num_envs)
        self.obs, _ = self.venv.reset(seed=list(seeds) if seeds is not None else [seed + i for i in range(num_envs)])
        self.env_steps = 0
        self.params_version = -1
        self._ep_return = np.zeros(num_envs)
        self._ep_len = np.zeros(num_envs, dtype=np.int64)
        self.episodes: list[Episode] = []              # finished (return, length; env), drained by the caller

    def load(self, state: dict, version: int) -> None:
        self.policy.load(state)
        self.params_version = version

    def refresh(self, params) -> None:
        """The newest policy of the parameter store `params` (hetrl/runtime/params.py), where newer than its own."""
        new = params.latest(self.params_version)
        if new is not None:
            self.load(*new)

    def take_grant(self, params, n: int, table: list, out: dict[str, np.ndarray] | None = None) -> tuple:
        """A learner's grant, as an actor apart from the learner takes it (a local actor process, a Ray actor): the
        newest policy of `params`, then exactly n env steps acting with the grant's exploration `table` (one value
        per vector step). Returns (what collect returned, env steps, seconds busy)."""
        t0 = time.perf_counter()
        self.refresh(params)
        start = self.env_steps
        got = self.collect(n, ExploreTable(table, start, self.num_envs), out=out, limit=n)
        return got, self.env_steps - start, time.perf_counter() - t0

    def collect(self, n: int, explore: Callable[[int], Optional[float]],
                out: dict[str, np.ndarray] | None = None, limit: int | None = None) -> dict[str, np.ndarray] | int | None:
        """Step the vector env until at least `n` env steps are done, but never more than `limit`:
        a last vector step that would pass it keeps (and counts) the transitions of its first envs
        only, so a run stops at exactly the env steps asked for.

        explore(env_steps) gives the exploration parameter of the algorithm (epsilon, noise std)
        or None for uniform random actions (the warm-up before learning starts).
        Without `out`: return the transitions as one batch (None if none completed). With `out`
        (preallocated arrays with room for n + n_step x num_envs rows): write them there, return
        the number of rows written.
        """
        parts: list[dict[str, np.ndarray]] = []
        rows = 0
        target = self.env_steps + n
        end = self.env_steps + (limit if limit is not None else n + self.num_envs)
        G, ge = self.groups, self.group_envs
        while self.env_steps < target:
            keep = min(ge, (end - self.env_steps) // G)   # < ge only on a run's last step (then of every group)
            env_action, stored_action = self.policy.act(self.obs, explore(self.env_steps))
            obs, reward, terminated, truncated, info = self.venv.step(env_action)
            done = terminated | truncated
            ended = done.any()
            next_obs = obs
            if ended:
                next_obs = obs.copy()
                for i in np.flatnonzero(done):
                    next_obs[i] = info["final_obs"][i]
            batch = self.adder.add(self.obs, stored_action, reward, next_obs, terminated, truncated)
            if batch is not None and G > 1:
                batch["env"] = self.adder.last_envs
            if batch is not None and keep < ge:
                mask = self.adder.last_envs % ge < keep
                batch = {k: v[mask] for k, v in batch.items()} if mask.any() else None
            if batch is not None:
                k = len(batch["obs"])
                if out is None:
                    parts.append(batch)
                else:
                    for name, arr in out.items():
                        arr[rows:rows + k] = batch[name]
                rows += k
            self._ep_return += reward
            self._ep_len += 1
            if ended:
                if self.games:
                    self._log_games(info)
                for i in np.flatnonzero(done):
                    if not self.games:
                        self.episodes.append(Episode(float(self._ep_return[i]), int(self._ep_len[i]),
                                                     self.env_offset + int(i)))
                self._ep_return[done] = 0.0
                self._ep_len[done] = 0
                self.policy.episode_end(done)
            self.obs = obs
            self.env_steps += keep * G
        if out is not None:
            return rows
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([b[k] for b in parts]) for k in parts[0]}

    def _log_games(self, info: dict) -> None:
        """Whole games that ended in this step, from the env's RecordEpisodeStatistics (raw score)."""
        final = info.get("final_info") or {}
        if "episode" not in final:
            return
        for i in np.flatnonzero(final["_episode"]):
            self.episodes.append(Episode(float(final["episode"]["r"][i]), int(final["episode"]["l"][i]),
                                         self.env_offset + int(i)))

    # ---- state (exact resume) -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything that makes this actor's next steps what they would be had the run never stopped: the vector
        env (each env's state and its np_random), the observations in hand, the episodes' running returns, the
        n-step writer's pending transitions and the acting policy (its RNG, its noise state), as one cloudpickle
        (gymnasium's own dependency; it pickles the vector env's env factories). {"unsaved": why} where the vector
        env cannot be pickled (an EnvPool vector, an env holding a handle to a simulator process)."""
        import cloudpickle

        try:
            blob = cloudpickle.dumps((self.venv, self.obs, self.env_steps, self._ep_return, self._ep_len, self.adder,
                                      self.policy, self.params_version))
        except Exception as e:   # any failure of the env's own pickling: the resumed run restarts its episodes
            return {"unsaved": f"{type(self.venv).__name__} of {self.num_envs} envs cannot be pickled "
                               f"({type(e).__name__}: {str(e)[:120]})"}
        return {"pickle": blob}

    def load_state_dict(self, state: dict) -> None:
        """A state_dict() of an actor of the same env and env count."""
        import pickle

        venv, obs, steps, ep_return, ep_len, adder, policy, _ = pickle.loads(state["pickle"])
        if getattr(venv, "num_envs", self.num_envs) != self.num_envs:
            raise ValueError(f"the saved actor stepped {venv.num_envs} envs, this one {self.num_envs}")
        self.venv.close()
        self.venv, self.obs, self.env_steps, self._ep_return, self._ep_len = venv, obs, steps, ep_return, ep_len
        # the parameter store it reads now is a new one (its versions count again): the latest policy is loaded
        # before the next step, as the saved run's actor would have loaded the policy published at the boundary
        self.adder, self.policy, self.params_version = adder, policy, -1

    def drain_episodes(self) -> list[Episode]:
        eps, self.episodes = self.episodes, []
        return eps

    def close(self) -> None:
        self.venv.close()
