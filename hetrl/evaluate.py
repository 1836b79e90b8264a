"""Evaluation: whole episodes with the deterministic policy on fresh envs.

`evaluate` plays `episodes` envs side by side (one batched inference per step), each env
contributing exactly its first episode, so the estimate is unbiased and ~N times cheaper than
playing the episodes one after another. An episode is cut (truncated, its return so far counted)
after `max_steps` steps, or the env's own time limit, or NO_LIMIT_STEPS for an env without one: a
deterministic policy can loop forever where nothing ends the episode (CliffWalking, a stuck game).
"""

from __future__ import annotations

import sys
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
            "eval_returns": [float(r) for r in returns], "eval_episodes_cut": cut}
