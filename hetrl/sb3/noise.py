"""Action noise objects with SB3's names and constructors, for scripts without Stable-Baselines3 installed:
the SB3-style DDPG / TD3 take them (or SB3's own) as `action_noise` and explore with hetrl's noise of that kind
(zero mean, one sigma for every action dimension: noise_type / noise_std)."""

from __future__ import annotations

import numpy as np


class NormalActionNoise:
    def __init__(self, mean: np.ndarray, sigma: np.ndarray, dtype=np.float32):
        self._mu, self._sigma, self._dtype = np.asarray(mean), np.asarray(sigma), dtype

    def __call__(self) -> np.ndarray:
        return np.random.normal(self._mu, self._sigma).astype(self._dtype)

    def reset(self) -> None:
        pass


class OrnsteinUhlenbeckActionNoise:
    def __init__(self, mean: np.ndarray, sigma: np.ndarray, theta: float = 0.15, dt: float = 1e-2,
                 initial_noise: np.ndarray | None = None, dtype=np.float32):
        self._mu, self._sigma, self._theta, self._dt = np.asarray(mean), np.asarray(sigma), theta, dt
        self.initial_noise, self._dtype = initial_noise, dtype
        self.reset()

    def __call__(self) -> np.ndarray:
        x = self.noise_prev + self._theta * (self._mu - self.noise_prev) * self._dt + \
            self._sigma * np.sqrt(self._dt) * np.random.normal(size=self._mu.shape)
        self.noise_prev = x
        return x.astype(self._dtype)

    def reset(self) -> None:
        self.noise_prev = self.initial_noise if self.initial_noise is not None else np.zeros_like(self._mu)
