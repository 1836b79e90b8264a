"""SAC (Haarnoja et al. 2018): a squashed-Gaussian actor, twin soft Q critics, automatic entropy tuning.

The learner's math, for a sampled batch of n-step transitions (actions scaled to [-1, 1]):
    pi(.|s):  u ~ N(mean(s), std(s)**2),  a = tanh(u),  log_std clamped to [-20, 2] (as SB3)
              log pi(a|s) = sum_i [log N(u_i; mean_i, std_i) - log(1 - tanh(u_i)**2)]
    one gradient step (in Stable-Baselines3's order):
    a ~ pi(.|s)                                      (one sample: the alpha loss and the actor loss)
    alpha loss  = -mean(log_alpha * (log pi(a|s) + target_entropy))      (ent_coef auto; target -|A|)
    a' ~ pi(.|s'):
    target      = r + gamma**steps * (1 - terminated) * (min(Q1_t(s', a'), Q2_t(s', a')) - alpha log pi(a'|s'))
    critic loss = 0.5 mean(w * (Q1(s, a_buf) - target)**2) + 0.5 mean(w * (Q2(s, a_buf) - target)**2)
    actor loss  = mean(alpha log pi(a|s) - min(Q1(s, a), Q2(s, a)))        (critics after their step)
    targets    <- tau * online + (1 - tau) * targets                        (critics only; no actor target)
    new priorities = (|Q1(s, a_buf) - target| + |Q2(s, a_buf) - target|) / 2   (the mean of both critics')
alpha = exp(log_alpha) is the value before this step's alpha update (as SB3). w are the importance
weights of prioritised replay (1 under uniform replay); steps is the n-step count.
ent_coef: "auto" (log_alpha learned from alpha = 1, SB3's default), "auto_X" (learned from alpha = X),
or a number (alpha fixed). target_entropy: "auto" (= -dim(actions)) or a number.
Acting samples from pi (uniform random actions before learning_starts); evaluation uses tanh(mean(s)).
log(1 - tanh(u)**2) is computed with the stable identity 2 (log 2 - u - softplus(-2u)) (no epsilon).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetrl.algorithm import Algorithm
from hetrl.algos.ddpg import Critic
from hetrl.algos.nets import LOG_STD_MAX, LOG_STD_MIN, FlatAdam, flatten, live_state, load_weights, mlp, soft_update
from hetrl.config import Config, check_ent_coef


@dataclass
class SACConfig(Config):
    """SAC's settings beside the common ones (SB3's names and defaults)."""
    tau: float = 0.005
    max_grad_norm: float = 0.0
    ent_coef: str = "auto"              # entropy coefficient alpha: auto (learned toward target_entropy, from 1.0),
                                        # auto_X (learned, from X), or a number (fixed); SB3's convention
    target_entropy: str = "auto"        # the entropy alpha is tuned toward: auto = -dim(actions), or a number

    def validate(self) -> None:
        super().validate()
        check_ent_coef(self.ent_coef, "ent_coef")
        check_ent_coef(self.target_entropy, "target_entropy")


class GaussianActor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, net_arch: list[int], obs_ndim: int = 1,
                 activation: str = "relu", layer_norm: bool = False):
        super().__init__()
        self.obs_ndim = obs_ndim
        self.body = mlp([obs_dim, *net_arch], activation, layer_norm, last_act=True)
        self.mean = nn.Linear(net_arch[-1], act_dim)
        self.log_std = nn.Linear(net_arch[-1], act_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean(s), log_std(s)) of the Gaussian before the tanh."""
        h = self.body(obs.flatten(start_dim=-self.obs_ndim) if self.obs_ndim > 1 else obs)
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, eps: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(a = tanh(u), log pi(a|s)) for u = mean + std * eps, eps ~ N(0, 1) (from `generator`) unless given."""
        mean, log_std = self(obs)
        if eps is None:
            eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return squash(mean, log_std, eps)


def squashed_sample(mean: torch.Tensor, log_std: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, a = tanh(u)) for u = mean + std * eps: a draw of the squashed Gaussian (acting needs no log pi)."""
    u = mean + log_std.exp() * eps
    return u, torch.tanh(u)


def squash(mean: torch.Tensor, log_std: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a = tanh(u), log pi(a|s)) for u = mean + std * eps (the squashed Gaussian; CrossQ's too)."""
    u, a = squashed_sample(mean, log_std, eps)
    log_prob = (-0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_prob = log_prob - (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
    return a, log_prob


class SACPolicy:
    """Samples from the squashed Gaussian on a snapshot of the actor (runs in actors; noise from its own
    numpy RNG); stores actions in [-1, 1], gives the env actions rescaled to its Box bounds. Its network is any
    module whose forward gives (mean, log_std) of the Gaussian before the tanh (SAC's, CrossQ's)."""

    def __init__(self, net: GaussianActor, low: np.ndarray, high: np.ndarray, seed: int, device: str = "cpu"):
        self.net, self.device = net.to(device).eval(), device
        self.low, self.high = low.astype(np.float32), high.astype(np.float32)
        self.rng = np.random.default_rng(seed)

    def scale(self, a: np.ndarray) -> np.ndarray:
        return self.low + (a + 1.0) * 0.5 * (self.high - self.low)

    @torch.no_grad()
    def deterministic(self, obs: np.ndarray) -> np.ndarray:
        """tanh(mean(s)), in [-1, 1]."""
        mean, _ = self.net(torch.as_tensor(obs, dtype=torch.float32, device=self.device))
        return torch.tanh(mean).cpu().numpy()

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """tanh(mean(s)), rescaled to the env's action bounds."""
        return self.scale(self.deterministic(obs))

    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: float | None) -> tuple[np.ndarray, np.ndarray]:
        n = len(obs)
        if explore is None:  # warm-up: uniform random actions
            a = self.rng.uniform(-1.0, 1.0, (n, len(self.low))).astype(np.float32)
        else:
            eps = self.rng.standard_normal((n, len(self.low)), dtype=np.float32)
            mean, log_std = self.net(torch.as_tensor(obs, dtype=torch.float32, device=self.device))
            _, a = squashed_sample(mean, log_std, torch.from_numpy(eps).to(self.device))
            a = a.cpu().numpy()
        return self.scale(a), a

    def load(self, state: dict) -> None:
        load_weights(self.net, state)

    def episode_end(self, done: np.ndarray) -> None:
        pass


def parse_coef(value: str) -> tuple[bool, float]:
    """ent_coef -> (learned?, initial alpha): 'auto' -> (True, 1.0), 'auto_0.1' -> (True, 0.1), '0.2' -> (False, 0.2)."""
    if value == "auto":
        return True, 1.0
    if value.startswith("auto_"):
        return True, float(value[5:])
    return False, float(value)


class SAC(Algorithm):
    Settings = SACConfig
    action_spaces = (gym.spaces.Box,)
    nets, optims = ("actor", "critics", "critics_target"), ("actor_opt", "critic_opt")

    def __init__(self, cfg: SACConfig, obs_space: gym.Space, act_space: gym.Space, device: str | torch.device = "cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        self.low, self.high = np.asarray(act_space.low), np.asarray(act_space.high)
        self.act_dim = int(np.prod(act_space.shape))
        self.actor = self._actor().to(self.device)
        self.critics = nn.ModuleList([self._critic(), self._critic()]).to(self.device)
        self.critics_target = nn.ModuleList([self._critic(), self._critic()]).to(self.device)
        self.critics_target.load_state_dict(self.critics.state_dict())
        self.critics_target.requires_grad_(False)
        self.actor_opt = FlatAdam(self.actor, cfg.lr, cfg.max_grad_norm)      # one flat buffer per network
        self.critic_opt = FlatAdam(self.critics, cfg.lr, cfg.max_grad_norm)   # (both critics: one clip, one step)
        self.critic_target_flat = flatten(self.critics_target)
        learned, init = parse_coef(cfg.ent_coef)
        self.target_entropy = -float(self.act_dim) if cfg.target_entropy == "auto" else float(cfg.target_entropy)
        self.log_alpha = torch.tensor(math.log(init), device=self.device, requires_grad=learned)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.lr) if learned else None

    def _actor(self) -> GaussianActor:
        return GaussianActor(int(np.prod(self.obs_shape)), self.act_dim, self.cfg.net_arch, len(self.obs_shape),
                             self.cfg.activation, self.cfg.layer_norm)

    def _critic(self) -> Critic:
        return Critic(int(np.prod(self.obs_shape)), self.act_dim, self.cfg.qf_arch or self.cfg.net_arch,
                      len(self.obs_shape),
                      self.cfg.activation, self.cfg.layer_norm)

    # ---- acting side -------------------------------------------------------------------------
    def make_policy(self, seed: int, device: str = "cpu", num_envs: int | None = None) -> SACPolicy:
        net = self._actor()
        net.load_state_dict(self.policy_state())
        return SACPolicy(net, self.low, self.high, seed, device)

    def policy_state(self) -> dict:
        return live_state(self.actor)

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    # ---- learning side -----------------------------------------------------------------------
    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """K sequential gradient steps, one per leading index of `batches` (shape (K, B, ...)); returns |TD| (K, B)."""
        cfg, td_all = self.cfg, torch.empty_like(weights)
        q1, q2 = self.critics
        t1, t2 = self.critics_target
        for k in range(weights.shape[0]):
            b, w = {key: v[k] for key, v in batches.items()}, weights[k]
            a, logp = self.actor.sample(b["obs"], generator=self.rng)
            alpha = self.log_alpha.detach().exp()
            stats = {"ent_coef": alpha}
            if self.alpha_opt is not None:
                self.alpha_opt.zero_grad()
                alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
                alpha_loss.backward()
                self.alpha_opt.step()
                stats["ent_coef_loss"] = alpha_loss.detach()
            with torch.no_grad():
                next_a, next_logp = self.actor.sample(b["next_obs"], generator=self.rng)
                next_q = torch.min(t1(b["next_obs"], next_a), t2(b["next_obs"], next_a)) - alpha * next_logp
                target = b["reward"] + cfg.gamma ** b["steps"].float() * (~b["terminated"]).float() * next_q
            td1, td2 = q1(b["obs"], b["action"]) - target, q2(b["obs"], b["action"]) - target
            critic_loss = 0.5 * (w * td1.pow(2)).mean() + 0.5 * (w * td2.pow(2)).mean()
            self.critic_opt.step(critic_loss)
            actor_loss = (alpha * logp - torch.min(q1(b["obs"], a), q2(b["obs"], a))).mean()
            self.actor_opt.step(actor_loss)
            soft_update(self.critic_target_flat, self.critic_opt.flat, cfg.tau)
            td_all[k] = (td1.detach().abs() + td2.detach().abs()) * 0.5
            self.stats = {**stats, "actor_loss": actor_loss.detach(), "critic_loss": critic_loss.detach()}
        self.updates += weights.shape[0]
        return td_all

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "log_alpha": self.log_alpha.detach().clone(),
                "alpha_opt": self.alpha_opt.state_dict() if self.alpha_opt is not None else {}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if self.alpha_opt is not None and state["alpha_opt"]:
            self.alpha_opt.load_state_dict(state["alpha_opt"])
