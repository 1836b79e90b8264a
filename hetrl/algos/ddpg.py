"""DDPG (Lillicrap et al. 2016): deterministic actor, Q critic, Polyak-averaged targets.

The learner's math, for a sampled batch of n-step transitions (actions scaled to [-1, 1]):
    target      = r + gamma**steps * (1 - terminated) * Q_target(s', mu_target(s'))
    critic loss = mean(w * (Q(s, a) - target)**2);   new priorities = |Q(s, a) - target|
    actor loss  = -mean(Q(s, mu(s)))
    targets    <- tau * online + (1 - tau) * targets        after every gradient step
Exploration: Gaussian (or Ornstein-Uhlenbeck) noise on mu(s), clipped to [-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from hetrl.algorithm import Algorithm
from hetrl.algos.nets import FlatAdam, flatten, live_state, load_weights, mlp, soft_update
from hetrl.config import Config
from hetrl.errors import UsageError


@dataclass
class DDPGConfig(Config):
    """DDPG's settings beside the common ones (SB3's defaults)."""
    tau: float = 0.005                  # Polyak coefficient of the target networks
    max_grad_norm: float = 0.0          # no gradient clip (SB3's DDPG/TD3/SAC have none)
    noise_type: str = "normal"          # exploration noise on mu(s): normal | ou (Ornstein-Uhlenbeck)
    noise_std: float = 0.1              # its std, in actions scaled to [-1, 1]

    def validate(self) -> None:
        super().validate()
        if self.noise_type not in ("normal", "ou"):
            raise UsageError(f"noise_type={self.noise_type!r} is not supported; choose one of: normal, ou")
        if self.noise_std < 0:
            raise UsageError(f"noise_std must be >= 0, got {self.noise_std}")


class Actor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, net_arch: list[int], obs_ndim: int = 1,
                 activation: str = "relu", layer_norm: bool = False):
        super().__init__()
        self.obs_ndim = obs_ndim
        self.mu = mlp([obs_dim, *net_arch, act_dim], activation, layer_norm, out_act=nn.Tanh)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mu(obs.flatten(start_dim=-self.obs_ndim) if self.obs_ndim > 1 else obs)


class Critic(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, net_arch: list[int], obs_ndim: int = 1,
                 activation: str = "relu", layer_norm: bool = False):
        super().__init__()
        self.obs_ndim = obs_ndim
        self.q = mlp([obs_dim + act_dim, *net_arch, 1], activation, layer_norm)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        obs = obs.flatten(start_dim=-self.obs_ndim) if self.obs_ndim > 1 else obs
        return self.q(torch.cat([obs, action], dim=-1)).squeeze(-1)


class DDPGPolicy:
    """mu(s) plus exploration noise, on a snapshot of the actor network (runs in actors).
    Stores actions in [-1, 1]; the env gets them rescaled to its Box bounds."""

    def __init__(self, net: Actor, low: np.ndarray, high: np.ndarray, noise_type: str, seed: int,
                 num_envs: int | None = None, device: str = "cpu", ou_theta: float = 0.15, ou_dt: float = 1e-2):
        self.net, self.device = net.to(device).eval(), device
        self.low, self.high = low.astype(np.float32), high.astype(np.float32)
        self.noise_type, self.rng = noise_type, np.random.default_rng(seed)
        self.ou_theta, self.ou_dt = ou_theta, ou_dt
        self.ou_state = None if num_envs is None else np.zeros((num_envs, len(low)), np.float32)

    def scale(self, a: np.ndarray) -> np.ndarray:
        return self.low + (a + 1.0) * 0.5 * (self.high - self.low)

    @torch.no_grad()
    def deterministic(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.as_tensor(obs, dtype=torch.float32, device=self.device)).cpu().numpy()

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """mu(s), rescaled to the env's action bounds."""
        return self.scale(self.deterministic(obs))

    def _noise(self, n: int, std: float) -> np.ndarray:
        eps = self.rng.standard_normal((n, len(self.low))).astype(np.float32)
        if self.noise_type == "normal":
            return std * eps
        if self.ou_state is None or len(self.ou_state) != n:
            self.ou_state = np.zeros((n, len(self.low)), np.float32)
        self.ou_state += -self.ou_theta * self.ou_state * self.ou_dt + std * np.sqrt(self.ou_dt) * eps
        return self.ou_state.copy()

    def act(self, obs: np.ndarray, explore: float | None) -> tuple[np.ndarray, np.ndarray]:
        n = len(obs)
        if explore is None:  # warm-up: uniform random actions
            a = self.rng.uniform(-1.0, 1.0, (n, len(self.low))).astype(np.float32)
        else:
            a = np.clip(self.deterministic(obs) + self._noise(n, explore), -1.0, 1.0)
        return self.scale(a), a

    def load(self, state: dict) -> None:
        load_weights(self.net, state)

    def episode_end(self, done: np.ndarray) -> None:
        if self.ou_state is not None:
            self.ou_state[done] = 0.0


class NoisyActing(Algorithm):
    """The base of DDPG and TD3: continuous actions; acting is mu(s) plus exploration noise, on a snapshot of the
    actor; the networks from the config (Actor, Critic)."""

    action_spaces = (gym.spaces.Box,)

    def __init__(self, cfg: Config, obs_space: gym.Space, act_space: gym.Space, device: str | torch.device = "cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        self.low, self.high = np.asarray(act_space.low), np.asarray(act_space.high)
        self.act_dim = int(np.prod(act_space.shape))

    def _actor(self) -> Actor:
        return Actor(int(np.prod(self.obs_shape)), self.act_dim, self.cfg.net_arch, len(self.obs_shape),
                     self.cfg.activation, self.cfg.layer_norm)

    def _critic(self) -> Critic:
        return Critic(int(np.prod(self.obs_shape)), self.act_dim, self.cfg.qf_arch or self.cfg.net_arch,
                      len(self.obs_shape),
                      self.cfg.activation, self.cfg.layer_norm)

    def make_policy(self, seed: int, device: str = "cpu", num_envs: int | None = None) -> DDPGPolicy:
        net = self._actor()
        net.load_state_dict(self.policy_state())
        return DDPGPolicy(net, self.low, self.high, self.cfg.noise_type, seed, num_envs, device)

    def policy_state(self) -> dict:
        return live_state(self.actor)

    def exploration(self, env_steps: int) -> float | None:
        return None if env_steps < self.cfg.learning_starts else self.cfg.noise_std

    def on_env_steps(self, before: int, after: int) -> None:
        pass  # targets move with the gradient steps


class DDPG(NoisyActing):
    Settings = DDPGConfig
    nets, optims = ("actor", "actor_target", "critic", "critic_target"), ("actor_opt", "critic_opt")

    def __init__(self, cfg: DDPGConfig, obs_space: gym.Space, act_space: gym.Space, device: str | torch.device = "cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        self.actor, self.actor_target = self._actor().to(self.device), self._actor().to(self.device)
        self.critic, self.critic_target = self._critic().to(self.device), self._critic().to(self.device)
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.actor_target.requires_grad_(False)
        self.critic_target.requires_grad_(False)
        self.actor_opt = FlatAdam(self.actor, cfg.lr, cfg.max_grad_norm)
        self.critic_opt = FlatAdam(self.critic, cfg.lr, cfg.max_grad_norm)
        self.actor_target_flat, self.critic_target_flat = flatten(self.actor_target), flatten(self.critic_target)

    # ---- learning side -----------------------------------------------------------------
    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """One gradient step per leading index of `batches` (shape (K, B, ...)); returns |TD| (K, B)."""
        td_all = torch.empty_like(weights)
        g = self.cfg.gamma
        for k in range(weights.shape[0]):
            b = {key: v[k] for key, v in batches.items()}
            with torch.no_grad():
                next_q = self.critic_target(b["next_obs"], self.actor_target(b["next_obs"]))
                target = b["reward"] + g ** b["steps"].float() * (~b["terminated"]).float() * next_q
            q = self.critic(b["obs"], b["action"])
            td = q - target
            critic_loss = (weights[k] * td.pow(2)).mean()
            self.critic_opt.step(critic_loss)
            actor_loss = -self.critic(b["obs"], self.actor(b["obs"])).mean()
            self.actor_opt.step(actor_loss)
            soft_update(self.critic_target_flat, self.critic_opt.flat, self.cfg.tau)
            soft_update(self.actor_target_flat, self.actor_opt.flat, self.cfg.tau)
            td_all[k] = td.detach().abs()
            self.stats = {"actor_loss": actor_loss.detach(), "critic_loss": critic_loss.detach()}
        self.updates += weights.shape[0]
        return td_all

