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

from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from hetrl.algos.ddpg import DDPGConfig, NoisyActing
from hetrl.algos.nets import FlatAdam, flatten, soft_update
from hetrl.errors import UsageError


@dataclass
class TD3Config(DDPGConfig):
    """TD3's settings beside DDPG's (SB3's defaults)."""
    policy_delay: int = 2               # gradient (critic) steps per actor and target update, counted over the run
    target_policy_noise: float = 0.2    # std of the smoothing noise on the target action (actions in [-1, 1])
    target_noise_clip: float = 0.5      # the smoothing noise is clipped to +-this

    def validate(self) -> None:
        super().validate()
        if self.policy_delay <= 0:
            raise UsageError(f"policy_delay must be positive, got {self.policy_delay}")
        for key in ("target_policy_noise", "target_noise_clip"):
            if getattr(self, key) < 0:
                raise UsageError(f"{key} must be >= 0, got {getattr(self, key)}")


class TD3(NoisyActing):  # acting: DDPG's, mu(s) plus Gaussian noise
    Settings = TD3Config
    nets, optims = ("actor", "actor_target", "critics", "critics_target"), ("actor_opt", "critic_opt")
    schedule_settings = ("policy_delay",)

    def __init__(self, cfg: TD3Config, obs_space: gym.Space, act_space: gym.Space, device: str | torch.device = "cpu"):
        super().__init__(cfg, obs_space, act_space, device)
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
        # updates: gradient (critic) steps; the actor and the targets move every policy_delay-th

    def policy_changes(self) -> int:
        """How many times the actor (the policy actors get) has moved: once every policy_delay-th update (the
        learner core publishes only when this changed)."""
        return self.updates // self.cfg.policy_delay

    def graph_period(self) -> int:
        """The delayed actor step is decided in Python from `updates`: its pattern repeats every policy_delay."""
        return self.cfg.policy_delay

    # ---- learning side -----------------------------------------------------------------------
    @torch.no_grad()
    def target(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The twin-min target with target policy smoothing (the smoothing noise from the learner's generator)."""
        cfg = self.cfg
        a = b["action"]
        eps = torch.randn(a.shape, generator=self.rng, device=a.device, dtype=a.dtype)
        noise = (eps * cfg.target_policy_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
        next_a = (self.actor_target(b["next_obs"]) + noise).clamp(-1.0, 1.0)
        t1, t2 = self.critics_target
        next_q = torch.min(t1(b["next_obs"], next_a), t2(b["next_obs"], next_a))
        return b["reward"] + cfg.gamma ** b["steps"].float() * (~b["terminated"]).float() * next_q

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """K sequential gradient steps, one per leading index of `batches` (shape (K, B, ...)); returns |TD| (K, B)."""
        cfg, td_all = self.cfg, torch.empty_like(weights)
        q1, q2 = self.critics
        for k in range(weights.shape[0]):
            b, w = {key: v[k] for key, v in batches.items()}, weights[k]
            target = self.target(b)
            td1, td2 = q1(b["obs"], b["action"]) - target, q2(b["obs"], b["action"]) - target
            critic_loss = (w * td1.pow(2)).mean() + (w * td2.pow(2)).mean()
            self.critic_opt.step(critic_loss)
            self.stats = {**self.stats, "critic_loss": critic_loss.detach()}
            self.updates += 1
            if self.updates % cfg.policy_delay == 0:
                actor_loss = -q1(b["obs"], self.actor(b["obs"])).mean()
                self.actor_opt.step(actor_loss)
                self.stats["actor_loss"] = actor_loss.detach()
                soft_update(self.critic_target_flat, self.critic_opt.flat, cfg.tau)
                soft_update(self.actor_target_flat, self.actor_opt.flat, cfg.tau)
            td_all[k] = (td1.detach().abs() + td2.detach().abs()) * 0.5
        return td_all
