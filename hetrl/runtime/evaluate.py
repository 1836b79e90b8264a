"""Evaluation: run whole episodes with the deterministic policy on a fresh env."""

from __future__ import annotations

from typing import Callable

import numpy as np

from hetrl.actors.envs import EnvSpec, make_env


def evaluate(act: Callable[[np.ndarray], np.ndarray], env: EnvSpec, episodes: int, seed: int,
             render_mode: str | None = None, video_dir: str | None = None) -> dict:
    """`act` maps a batch of observations (1, *obs_shape) to env actions (1, ...)."""
    e = make_env(env, render_mode="rgb_array" if video_dir else render_mode)
    if video_dir:
        from gymnasium.wrappers import RecordVideo

        e = RecordVideo(e, video_dir, episode_trigger=lambda i: True, disable_logger=True)
    returns, lengths = [], []
    try:
        for i in range(episodes):
            obs, _ = e.reset(seed=seed + i)
            done, ret, n = False, 0.0, 0
            while not done:
                a = act(np.asarray(obs, dtype=np.float32)[None])[0]
                obs, r, term, trunc, _ = e.step(a)
                ret += float(r)
                n += 1
                done = term or trunc
            returns.append(ret)
            lengths.append(n)
    finally:
        e.close()
    return {"eval_return_mean": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
            "eval_episodes": episodes, "eval_length_mean": float(np.mean(lengths)), "eval_returns": returns}
