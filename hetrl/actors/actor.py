"""The actor: steps a vector of envs with a policy snapshot and emits batches of transitions.

Inference is batched over the envs; n-step transitions are assembled on the actor side
(NStepAdder) and handed out as one batch per `collect` call (batched insert).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import numpy as np

from hetrl.actors.envs import EnvSpec, make_vector_env
from hetrl.replay import NStepAdder


class ActingPolicy(Protocol):
    """What an algorithm gives its actors (see hetrl/algos/*.py)."""

    def act(self, obs: np.ndarray, explore: Optional[float]) -> tuple[np.ndarray, np.ndarray]:
        """(actions for the env, actions to store); explore=None means uniform random actions."""

    def load(self, state: dict) -> None:
        """Take new parameters from the parameter store."""

    def episode_end(self, done: np.ndarray) -> None:
        """Reset per-env exploration state (e.g. OU noise) where `done`."""


class Actor:
    def __init__(self, env: EnvSpec, num_envs: int, seed: int, policy: ActingPolicy,
                 n_step: int = 1, gamma: float = 0.99, backend: str = "gymnasium"):
        self.venv = make_vector_env(env, num_envs, seed, backend)
        self.num_envs = num_envs
        self.policy = policy
        self.adder = NStepAdder(n_step, gamma, num_envs)
        self.obs, _ = self.venv.reset(seed=[seed + i for i in range(num_envs)])
        self.env_steps = 0
        self.params_version = -1
        self._ep_return = np.zeros(num_envs)
        self._ep_len = np.zeros(num_envs, dtype=np.int64)
        self.episodes: list[tuple[float, int]] = []   # finished (return, length), drained by the caller

    def load(self, state: dict, version: int) -> None:
        self.policy.load(state)
        self.params_version = version

    def collect(self, n: int, explore: Callable[[int], Optional[float]]) -> Optional[dict[str, np.ndarray]]:
        """Step the vector env until at least `n` env steps are done; return their transitions.

        explore(env_steps) gives the exploration parameter of the algorithm (epsilon, noise std)
        or None for uniform random actions (the warm-up before learning starts).
        """
        out = []
        target = self.env_steps + n
        while self.env_steps < target:
            env_action, stored_action = self.policy.act(self.obs, explore(self.env_steps))
            obs, reward, terminated, truncated, info = self.venv.step(env_action)
            done = terminated | truncated
            next_obs = obs
            if done.any():
                next_obs = obs.copy()
                for i in np.flatnonzero(done):
                    next_obs[i] = info["final_obs"][i]
            batch = self.adder.add(self.obs, stored_action, reward, next_obs, terminated, truncated)
            if batch is not None:
                out.append(batch)
            self._ep_return += reward
            self._ep_len += 1
            if done.any():
                for i in np.flatnonzero(done):
                    self.episodes.append((float(self._ep_return[i]), int(self._ep_len[i])))
                self._ep_return[done] = 0.0
                self._ep_len[done] = 0
                self.policy.episode_end(done)
            self.obs = obs
            self.env_steps += self.num_envs
        if not out:
            return None
        if len(out) == 1:
            return out[0]
        return {k: np.concatenate([b[k] for b in out]) for k in out[0]}

    def drain_episodes(self) -> list[tuple[float, int]]:
        eps, self.episodes = self.episodes, []
        return eps

    def close(self) -> None:
        self.venv.close()
