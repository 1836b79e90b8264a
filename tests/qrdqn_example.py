"""QR-DQN (Dabney et al. 2017) written as a user would write it outside hetrl: plain torch (torch.optim.Adam,
clip_grad_norm_), registered with `hetrl.register_algorithm`. The compiled kernel's tests use it as an algorithm
that hetrl has never seen (no line of the kernel names it).

    Z(s, a)   = N quantiles per action;  a* = argmax_a mean_j Z_target(s', a)_j
    target_j  = r + gamma**steps * (1 - terminated) * Z_target(s', a*)_j
    u_ij      = target_j - Z(s, a)_i
    loss      = mean_b w_b * sum_i mean_j |tau_i - 1{u_ij < 0}| * huber_kappa(u_ij) / kappa
The target network is copied every target_update_interval env steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import hetrl
from hetrl.algos.nets import load_weights, mlp


@dataclass
class QRDQNSettings(hetrl.Config):
    n_quantiles: int = 25
    kappa: float = 1.0
    target_update_interval: int = 500
    epsilon: float = 0.05
    max_grad_norm: float = 10.0


class QuantileNet(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, cfg: QRDQNSettings):
        super().__init__()
        self.n_actions, self.n_quantiles = n_actions, cfg.n_quantiles
        self.body = mlp([obs_dim, *cfg.net_arch, n_actions * cfg.n_quantiles], cfg.activation, cfg.layer_norm)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:      # (B, actions, quantiles)
        return self.body(obs).view(*obs.shape[:-1], self.n_actions, self.n_quantiles)


class Greedy:
    def __init__(self, net: QuantileNet, n_actions: int, seed: int):
        self.net, self.n = net, n_actions
        self.rng = np.random.default_rng(seed)

    @torch.no_grad()
    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.as_tensor(obs, dtype=torch.float32)).mean(-1).argmax(-1).numpy()

    def act(self, obs: np.ndarray, explore):
        random = self.rng.integers(0, self.n, len(obs))
        if explore is None:
            return random, random
        a = np.where(self.rng.random(len(obs)) < explore, random, self.act_deterministic(obs))
        return a, a

    def load(self, state: dict) -> None:
        load_weights(self.net, state)

    def episode_end(self, done: np.ndarray) -> None:
        pass


class QRDQN(hetrl.Algorithm):
    Settings = QRDQNSettings
    action_spaces = (gym.spaces.Discrete,)
    nets, optims = ("q", "q_target"), ("opt",)

    def __init__(self, cfg: QRDQNSettings, obs_space, act_space, device="cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        self.obs_dim, self.n = int(np.prod(self.obs_shape)), int(act_space.n)
        self.q = QuantileNet(self.obs_dim, self.n, cfg)
        self.q_target = QuantileNet(self.obs_dim, self.n, cfg)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.opt = torch.optim.Adam(self.q.parameters(), lr=cfg.lr)
        self.tau = (torch.arange(cfg.n_quantiles, dtype=torch.float32) + 0.5) / cfg.n_quantiles

    def make_policy(self, seed, device="cpu", num_envs=None) -> Greedy:
        net = QuantileNet(self.obs_dim, self.n, self.cfg)
        net.load_state_dict(self.policy_state())
        return Greedy(net, self.n, seed)

    def policy_state(self) -> dict:
        return self.q.state_dict()

    def exploration(self, env_steps: int):
        return None if env_steps < self.cfg.learning_starts else self.cfg.epsilon

    def on_env_steps(self, before: int, after: int) -> None:
        k = self.cfg.target_update_interval
        if after // k > before // k:
            self.q_target.load_state_dict(self.q.state_dict())

    def learn(self, batches: dict, weights: torch.Tensor) -> torch.Tensor:
        cfg, td_all = self.cfg, torch.empty_like(weights)
        N, kappa = cfg.n_quantiles, cfg.kappa
        for k in range(weights.shape[0]):
            b, w = {key: v[k] for key, v in batches.items()}, weights[k]
            B = w.shape[0]
            with torch.no_grad():
                next_z = self.q_target(b["next_obs"])                              # (B, A, N)
                best = next_z.mean(-1).argmax(-1)
                next_z = next_z.gather(1, best.view(B, 1, 1).expand(B, 1, N)).squeeze(1)
                discount = cfg.gamma ** b["steps"].float() * (~b["terminated"]).float()
                target = b["reward"].unsqueeze(-1) + discount.unsqueeze(-1) * next_z   # (B, N)
            a = b["action"].long().view(B, 1, 1).expand(B, 1, N)
            z = self.q(b["obs"]).gather(1, a).squeeze(1)                            # (B, N)
            u = target.unsqueeze(1) - z.unsqueeze(2)                               # (B, N_i, N_j)
            huber = torch.where(u.abs() <= kappa, 0.5 * u.pow(2), kappa * (u.abs() - 0.5 * kappa))
            rho = (self.tau.view(1, N, 1) - (u.detach() < 0).float()).abs() * huber / kappa
            loss = (w * rho.mean(2).sum(1)).mean()
            self.opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
            self.opt.step()
            td_all[k] = (target.mean(-1) - z.detach().mean(-1)).abs()
        self.updates += weights.shape[0]
        return td_all


PRESETS = {   # (tests/c51_example.py trains with the same)
    "default": {"net_arch": [64, 64], "lr": 1e-3, "batch_size": 64, "buffer_size": 50_000,
                "learning_starts": 1000, "train_freq": 4, "gradient_steps": 1},
    "CartPole-v1": {"steps": 50_000, "lr": 2.3e-3, "batch_size": 64, "train_freq": 256, "gradient_steps": 128,
                    "target_update_interval": 1000, "learning_starts": 1000},
}
hetrl.register_algorithm("qrdqn", QRDQN, replace=True, presets=PRESETS)
