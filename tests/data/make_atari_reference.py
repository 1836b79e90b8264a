"""Writes atari_sb3_reference.npz: what Stable-Baselines3's AtariWrapper returns on fixed seeds and
actions, for tests/test_atari.py (which compares hetrl's preprocessing with it, without needing SB3).

    pip install stable-baselines3 'hetrl[atari]'; python tests/data/make_atari_reference.py

SB3's wrapper: NoopReset(30) -> MaxAndSkip(4) -> EpisodicLife -> FireReset (where the game has FIRE)
-> WarpFrame(84) -> ClipReward, on gymnasium.make(id, frameskip=1, repeat_action_probability=0).
Each game: the frame after reset(seed=SEED), then per step the frame, clipped reward, terminated
and truncated for actions drawn from numpy's default_rng(0); after an end, reset() (no seed).
"""

from pathlib import Path

import ale_py
import gymnasium as gym
import numpy as np
from stable_baselines3.common.atari_wrappers import AtariWrapper

GAMES = {"ALE/Breakout-v5": 300, "ALE/Pong-v5": 120}
SEED = 3


def record(game: str, steps: int) -> dict:
    env = AtariWrapper(gym.make(game, frameskip=1, repeat_action_probability=0.0))
    obs, _ = env.reset(seed=SEED)
    rng = np.random.default_rng(0)
    frames, rewards, terms, truncs, actions, resets = [obs[..., 0]], [], [], [], [], []
    for _ in range(steps):
        a = int(rng.integers(0, env.action_space.n))
        obs, r, term, trunc, _ = env.step(a)
        actions.append(a)
        frames.append(obs[..., 0])
        rewards.append(r)
        terms.append(term)
        truncs.append(trunc)
        if term or trunc:
            obs, _ = env.reset()
            resets.append(obs[..., 0])
    env.close()
    return {"frames": np.stack(frames), "rewards": np.array(rewards, np.float32), "terminated": np.array(terms),
            "truncated": np.array(truncs), "actions": np.array(actions), "resets": np.stack(resets) if resets else
            np.zeros((0, 84, 84), np.uint8)}


if __name__ == "__main__":
    gym.register_envs(ale_py)
    out = {}
    for game, steps in GAMES.items():
        for k, v in record(game, steps).items():
            out[f"{game.split('/')[1]}:{k}"] = v
    path = Path(__file__).with_name("atari_sb3_reference.npz")
    np.savez_compressed(path, seed=SEED, **out)
    print(path, path.stat().st_size, "bytes")
