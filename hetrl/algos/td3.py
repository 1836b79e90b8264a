"""TD3 (Fujimoto et al. 2018): DDPG with twin critics, target policy smoothing and delayed updates.

The learner's math, for a sampled batch of n-step transitions (actions scaled to [-1, 1]):
    a'          = clip(mu_target(s') + clip(N(0, target_policy_noise), -target_noise_clip, target_noise_clip), -1, 1)
    target      = r + gamma**steps * (1 - terminated) * min(Q1_target(s', a'), Q2_target(s', a'))
    critic loss = mean(w * (Q1(s, a) - target)**2) + mean(w * (Q2(s, a) - target)**2)
    every policy_delay critic updates:
        actor loss = -mean(Q1(s, mu(s)));   targets <- tau * online + (1 - tau) * targets
    new priorities = (|Q1(s, a) - target| + |Q2(s, a) - target|) / 2
Exploration: Gaussian noise (noise_std) on mu(s), clipped to [-1, 1] (the DDPG acting policy).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hetrl.algos.ddpg import Critic, NoisyActing
from hetrl.algos.nets import Checkpointed, FlatAdam, flatten, soft_update
from hetrl.config import Config


class TD3(NoisyActing, Checkpointed):  # acting: DDPG's, mu(s) plus Gaussian noise
    nets, optims = ("actor", "actor_target", "critics", "critics_target"), ("actor_opt", "critic_opt")
    name = "td3"

    def __init__(self, cfg: Config, obs_shape: tuple[int, ...], action_space, device: str | torch.device = "cpu"):
        self.cfg, self.obs_shape, self.device = cfg, obs_shape, torch.device(device)
        self.low, self.high = np.asarray(action_space.low), np.asarray(action_space.high)
        self.act_dim = int(np.prod(action_space.shape))
        obs_dim, ndim = int(np.prod(obs_shape)), len(obs_shape)
        self.actor = self._actor().to(self.device)
        self.critics = nn.ModuleList([Critic(obs_dim, self.act_dim, cfg.net_arch, ndim) for _ in range(2)]).to(self.device)
        self.actor_target = self._actor().to(self.device)
        self.critics_target = nn.ModuleList([Critic(obs_dim, self.act_dim, cfg.net_arch, ndim)
                                             for _ in range(2)]).to(self.device)
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.critics_target.load_state_dict(self.critics.state_dict())
        self.actor_target.requires_grad_(False)
        self.critics_target.requires_grad_(False)
        self.actor_opt = FlatAdam(self.actor, cfg.lr, cfg.max_grad_norm)
        self.critic_opt = FlatAdam(self.critics, cfg.lr, cfg.max_grad_norm)
        self.actor_target_flat, self.critics_target_flat = flatten(self.actor_target), flatten(self.critics_target)
        self.updates = 0          # critic updates; the actor and targets move every policy_delay of them

    # ---- learning side -----------------------------------------------------------------------
    @torch.no_grad()
    def target(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The twin-min target with target policy smoothing (draws the smoothing noise)."""
        cfg = self.cfg
        noise = (torch.randn_like(b["action"]) * cfg.target_policy_noise).clamp(-cfg.target_noise_clip,
                                                                              cfg.target_noise_clip)
        next_a = (self.actor_target(b["next_obs"]) + noise).clamp(-1.0, 1.0)
        t1, t2 = self.critics_target
        next_q = torch.min(t1(b["next_obs"], next_a), t2(b["next_obs"], next_a))
        return b["reward"] + cfg.gamma ** b["steps"].float() * (~b["terminated"]).float() * next_q

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """One gradient step per leading index of `batches` (shape (K, B, ...)); returns |TD| (K, B)."""
        cfg, td_all = self.cfg, torch.empty_like(weights)
        q1, q2 = self.critics
        for k in range(weights.shape[0]):
            b = {key: v[k] for key, v in batches.items()}
            target = self.target(b)
            td1, td2 = q1(b["obs"], b["action"]) - target, q2(b["obs"], b["action"]) - target
            self.critic_opt.step((weights[k] * td1.pow(2)).mean() + (weights[k] * td2.pow(2)).mean())
            self.updates += 1
            if self.updates % cfg.policy_delay == 0:
                self.actor_opt.step(-q1(b["obs"], self.actor(b["obs"])).mean())
                soft_update(self.critics_target_flat, self.critic_opt.flat, cfg.tau)
                soft_update(self.actor_target_flat, self.actor_opt.flat, cfg.tau)
            td_all[k] = (td1.detach().abs() + td2.detach().abs()) / 2
        return td_all

