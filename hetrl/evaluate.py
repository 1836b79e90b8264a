"""Evaluation: whole episodes with the deterministic policy on fresh envs.

`evaluate` plays `episodes` envs side by side (one batched inference per step), each env
contributing exactly its first episode, so the estimate is unbiased and ~N times cheaper than
playing the episodes one after another.
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np

from hetrl.actors.envs import EnvSpec, make_env


def evaluate(act: Callable[[np.ndarray], np.ndarray], env: EnvSpec, episodes: int, seed: int,
             video_dir: str | None = None) -> dict:
    """`act` maps a batch of observations (n, *obs_shape) to env actions (n, ...)."""
    if video_dir:
        return _evaluate_recorded(act, env, episodes, seed, video_dir)
    venv = gym.vector.SyncVectorEnv([lambda: make_env(env) for _ in range(episodes)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        obs, _ = venv.reset(seed=[seed + i for i in range(episodes)])
        returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            obs, r, term, trunc, _ = venv.step(act(np.asarray(obs, dtype=np.float32)))
            returns += np.where(running, r, 0.0)
            lengths += running
            running &= ~(term | trunc)
    finally:
        venv.close()
    return _summary(returns.tolist(), lengths.tolist())


def _evaluate_recorded(act, env, episodes, seed, video_dir) -> dict:
    from gymnasium.wrappers import RecordVideo

    e = RecordVideo(make_env(env, render_mode="rgb_array"), video_dir, episode_trigger=lambda i: True,
                    disable_logger=True)
    returns, lengths = [], []
    try:
        for i in range(episodes):
            obs, _ = e.reset(seed=seed + i)
            done, ret, n = False, 0.0, 0
            while not done:
                obs, r, term, trunc, _ = e.step(act(np.asarray(obs, dtype=np.float32)[None])[0])
                ret, n, done = ret + float(r), n + 1, term or trunc
            returns.append(ret)
            lengths.append(n)
    finally:
        e.close()
    return _summary(returns, lengths)


def _summary(returns: list[float], lengths: list[int]) -> dict:
    return {"eval_return_mean": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
            "eval_episodes": len(returns), "eval_length_mean": float(np.mean(lengths)),
            "eval_returns": [float(r) for r in returns]}
