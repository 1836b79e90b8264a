"""Evaluation: whole episodes with the deterministic policy on fresh envs.

`evaluate` plays `episodes` envs side by side (one batched inference per step), each env
contributing exactly its first episode, so the estimate is unbiased and ~N times cheaper than
playing the episodes one after another. An episode is cut (truncated, its return so far counted)
after `max_steps` steps, or the env's own time limit, or NO_LIMIT_STEPS for an env without one: a
deterministic policy can loop forever where nothing ends the episode (CliffWalking, a stuck game).
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import gymnasium as gym
import numpy as np

from hetrl.actors.envs import EnvSpec, make_env
from hetrl.config import atari_id

NO_LIMIT_STEPS = 10_000


def step_limit(e: gym.Env, max_steps: int = 0) -> int:
    """The steps after which an evaluation episode of `e` is cut."""
    if max_steps > 0:
        return max_steps
    spec = e.spec
    if spec is not None and spec.max_episode_steps:
        return spec.max_episode_steps
    if spec is not None and atari_id(spec.id):   # ALE truncates its own games (max_num_frames_per_episode)
        return sys.maxsize
    return NO_LIMIT_STEPS


def evaluate(act: Callable[[np.ndarray], np.ndarray], env: EnvSpec, episodes: int, seed: int,
             video_dir: str | None = None, max_steps: int = 0) -> dict:
    """`act` maps a batch of observations (n, *obs_shape) to env actions (n, ...)."""
    if video_dir:
        return _evaluate_recorded(act, env, episodes, seed, video_dir, max_steps)
    venv = gym.vector.SyncVectorEnv([lambda: make_env(env) for _ in range(episodes)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        limit = step_limit(venv.envs[0], max_steps)
        obs, _ = venv.reset(seed=[seed + i for i in range(episodes)])
        returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            obs, r, term, trunc, _ = venv.step(act(np.asarray(obs, dtype=np.float32)))
            returns += np.where(running, r, 0.0)
            lengths += running
            running &= ~(term | trunc) & (lengths < limit)
        cut = int(((lengths >= limit) & ~(term | trunc)).sum())
    finally:
        venv.close()
    return _summary(returns.tolist(), lengths.tolist(), cut)


def _evaluate_recorded(act, env, episodes, seed, video_dir, max_steps=0) -> dict:
    from gymnasium.wrappers import RecordVideo

    e = RecordVideo(make_env(env, render_mode="rgb_array"), video_dir, episode_trigger=lambda i: True,
                    disable_logger=True)
    returns, lengths, cut = [], [], 0
    try:
        limit = step_limit(e, max_steps)
        for i in range(episodes):
            obs, _ = e.reset(seed=seed + i)
            done, ret, n = False, 0.0, 0
            while not done and n < limit:
                obs, r, term, trunc, _ = e.step(act(np.asarray(obs, dtype=np.float32)[None])[0])
                ret, n, done = ret + float(r), n + 1, term or trunc
            returns.append(ret)
            lengths.append(n)
            cut += not done
    finally:
        e.close()
    return _summary(returns, lengths, cut)


def _summary(returns: list[float], lengths: list[int], cut: int = 0) -> dict:
    """cut: episodes stopped at the step limit (not ended by the env)."""
    return {"eval_return_mean": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
            "eval_episodes": len(returns), "eval_length_mean": float(np.mean(lengths)),
            "eval_lengths": [int(n) for n in lengths],
            "eval_returns": [float(r) for r in returns], "eval_episodes_cut": cut}


SELECT_SEED, REPORT_SEED = 10_000, 20_000   # eval env seed offsets: choosing the best policy vs reporting it


class Evaluations:
    """The evaluations a run makes while it trains, and the best policy they found (SB3's EvalCallback).

    Every `interval` env steps (and at the end) the latest policy plays `episodes` episodes on seeds reserved
    for choosing (seed + SELECT_SEED). A policy that scores at least the best's score plays as many again on
    other seeds and competes with the mean of both: one lucky set of episodes cannot displace a policy that
    was confirmed (the winner's curse of picking the max of noisy evaluations). `history` is the learning
    curve, [env_steps, mean return] per evaluation (result.json's `evaluations`)."""

    def __init__(self, episodes: int, interval: int, seed: int, max_steps: int = 0):
        self.episodes, self.interval, self.seed, self.max_steps = episodes, max(1, interval), seed, max_steps
        self.best: dict = {}                       # state (CPU tensors), env_steps, eval_return_mean
        self.history: list[list[float]] = []
        self.seconds = 0.0
        self.next_at = self.interval

    def start(self, env_steps: int) -> None:
        """The next evaluation is at the first multiple of the interval after `env_steps`."""
        self.next_at = (env_steps // self.interval + 1) * self.interval

    def due(self, env_steps: int, done: bool) -> bool:
        return self.episodes > 0 and (env_steps >= self.next_at or done)

    def run(self, policy, env, env_steps: int, policy_state: Callable[[], dict]) -> dict:
        """Evaluate `policy` (act: a batch of observations -> env actions) on `env` at `env_steps`; keep its
        `policy_state()` if it is the best so far. Returns the evaluation."""
        t = time.perf_counter()
        n, seed = self.episodes, self.seed + SELECT_SEED
        ev = evaluate(policy, env, n, seed, max_steps=self.max_steps)
        score = ev["eval_return_mean"]
        self.history.append([int(env_steps), float(score)])
        if not self.best or score >= self.best["eval_return_mean"]:
            again = evaluate(policy, env, n, seed + n, max_steps=self.max_steps)
            score = (score + again["eval_return_mean"]) / 2
        if not self.best or score >= self.best["eval_return_mean"]:
            self.best = {"state": {k: v.detach().to("cpu", copy=True) for k, v in policy_state().items()},
                         "env_steps": int(env_steps), "eval_return_mean": float(score)}
        self.start(env_steps)
        self.seconds += time.perf_counter() - t
        return ev

    def state_dict(self) -> dict:
        return {"best": self.best, "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict) -> None:
        self.best = dict(state.get("best") or {})
        self.history = [list(h) for h in state.get("history", [])]
