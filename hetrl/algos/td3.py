"""TD3 (Fujimoto et al. 2018): DDPG with twin critics, target policy smoothing and delayed updates.

The learner's math, for a sampled batch of n-step transitions (actions scaled to [-1, 1]):
    a'          = clip(mu_t(s') + clip(N(0, target_policy_noise**2), -target_noise_clip, target_noise_clip), -1, 1)
    target      = r + gamma**steps * (1 - terminated) * min(Q1_t(s', a'), Q2_t(s', a'))
    critic loss = mean(w * (Q1(s, a) - target)**2) + mean(w * (Q2(s, a) - target)**2)
    every policy_delay-th gradient step (counted over the whole run, `updates` in the checkpoint):
        actor loss = -mean(Q1(s, mu(s)))
        targets   <- tau * online + (1 - tau) * targets          (both critics and the actor)
    new priorities = (|Q1(s, a) - target| + |Q2(s, a) - target|) / 2      (the mean of both critics')
w are the importance weights of prioritised replay (1 under uniform replay); steps is the n-step count.
Exploration: Gaussian noise N(0, noise_std**2) on mu(s), clipped to [-1, 1] (DDPG's acting policy);
uniform random actions before learning_starts. Evaluation uses mu(s).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hetrl.algos import compiled
from hetrl.algos.ddpg import Critic, NoisyActing
from hetrl.algos.nets import Checkpointed, FlatAdam, flatten, soft_update
from hetrl.config import Config


class TD3(NoisyActing, Checkpointed):  # acting: DDPG's, mu(s) plus Gaussian noise
    nets, optims = ("actor", "actor_target", "critics", "critics_target"), ("actor_opt", "critic_opt")
    name = "td3"

    def __init__(self, cfg: Config, obs_shape: tuple[int, ...], action_space, device: str | torch.device = "cpu"):
        self.cfg, self.obs_shape, self.device = cfg, tuple(obs_shape), torch.device(device)
        self.low, self.high = np.asarray(action_space.low), np.asarray(action_space.high)
        self.act_dim = int(np.prod(action_space.shape))
        self.actor, self.actor_target = self._actor().to(self.device), self._actor().to(self.device)
        self.critics = nn.ModuleList([self._critic(), self._critic()]).to(self.device)
        self.critics_target = nn.ModuleList([self._critic(), self._critic()]).to(self.device)
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.critics_target.load_state_dict(self.critics.state_dict())
        self.actor_target.requires_grad_(False)
        self.critics_target.requires_grad_(False)
        self.actor_opt = FlatAdam(self.actor, cfg.lr, cfg.max_grad_norm)      # one flat buffer per network
        self.critic_opt = FlatAdam(self.critics, cfg.lr, cfg.max_grad_norm)   # (both critics: one clip, one step)
        self.actor_target_flat, self.critic_target_flat = flatten(self.actor_target), flatten(self.critics_target)
        compiled.attach(self)      # optional: the whole phase as one native call where it applies (compiled.py)
        self.updates = 0          # gradient (critic) steps; the actor and the targets move every policy_delay-th

    def _critic(self) -> Critic:
        return Critic(int(np.prod(self.obs_shape)), self.act_dim, self.cfg.net_arch, len(self.obs_shape))

    def policy_changes(self) -> int:
        """How many times the actor (the policy actors get) has moved: once every policy_delay-th update (the
        learner core publishes only when this changed)."""
        return self.updates // self.cfg.policy_delay

    # ---- learning side -----------------------------------------------------------------------
    @torch.no_grad()
    def target(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The twin-min target with target policy smoothing (draws the smoothing noise from torch's RNG)."""
        cfg = self.cfg
        noise = (torch.randn_like(b["action"]) * cfg.target_policy_noise).clamp(-cfg.target_noise_clip,
                                                                              cfg.target_noise_clip)
        next_a = (self.actor_target(b["next_obs"]) + noise).clamp(-1.0, 1.0)
        t1, t2 = self.critics_target
        next_q = torch.min(t1(b["next_obs"], next_a), t2(b["next_obs"], next_a))
        return b["reward"] + cfg.gamma ** b["steps"].float() * (~b["terminated"]).float() * next_q

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """K sequential gradient steps, one per leading index of `batches` (shape (K, B, ...)); returns |TD| (K, B)."""
        if self.compiled_phase:  # the same K steps as one native call (compiled.py)
            return compiled.phase(self, batches, weights)
        cfg, td_all = self.cfg, torch.empty_like(weights)
        q1, q2 = self.critics
        for k in range(weights.shape[0]):
            b, w = {key: v[k] for key, v in batches.items()}, weights[k]
            target = self.target(b)
            td1, td2 = q1(b["obs"], b["action"]) - target, q2(b["obs"], b["action"]) - target
            self.critic_opt.step((w * td1.pow(2)).mean() + (w * td2.pow(2)).mean())
            self.updates += 1
            if self.updates % cfg.policy_delay == 0:
                self.actor_opt.step(-q1(b["obs"], self.actor(b["obs"])).mean())
                soft_update(self.critic_target_flat, self.critic_opt.flat, cfg.tau)
                soft_update(self.actor_target_flat, self.actor_opt.flat, cfg.tau)
            td_all[k] = (td1.detach().abs() + td2.detach().abs()) * 0.5
        return td_all
