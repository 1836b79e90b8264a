"""PPO (Schulman et al. 2017), clipped surrogate objective, as Stable-Baselines3 implements it.

A learner phase takes one rollout of n_steps x num_envs transitions collected by the current policy, with
GAE(gae_lambda) advantages A and TD(lambda) returns R computed once by the learner core
(hetrl/replay/rollout.py), and makes n_epochs passes over it in shuffled minibatches. One gradient step, for a
minibatch (obs, action, old log pi, old V, A, R):

    A          <- (A - mean(A)) / (std(A) + 1e-8)                        (normalize_advantage)
    ratio      = exp(log pi(action | obs) - old log pi)
    pg loss    = -mean(min(ratio A, clip(ratio, 1 - eps, 1 + eps) A))    eps = clip_range (lin_X: x progress left)
    V_pred     = V(obs), or old V + clip(V(obs) - old V, -eps_vf, eps_vf)   (clip_range_vf > 0)
    value loss = mean((R - V_pred)^2)
    entropy    = mean(H[pi(. | obs)]);  loss = pg loss - ent_coef entropy + vf_coef value loss
    one optimizer step on loss (Adam, eps 1e-5), the gradient norm clipped to max_grad_norm
    approx_kl  = mean((ratio - 1) - log ratio)                           (before the step, as SB3's)

target_kl > 0: the epochs stop after the minibatch whose approx_kl passed 1.5 target_kl (the learner core asks
`stop_phase` between `learn` calls, which then take one minibatch each; SB3 stops before that minibatch's step).
The loss scalars of the last minibatch are in `stats` (SB3 logs their means over a phase's minibatches).
Networks, acting, values and normalisation: hetrl/algos/onpolicy.py (SB3's ActorCriticPolicy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hetrl.algos.onpolicy import ActorCritic, ActorCriticConfig
from hetrl.errors import UsageError


@dataclass
class PPOConfig(ActorCriticConfig):
    """PPO's settings beside the on-policy ones (SB3's names and defaults)."""

    clip_range: float = 0.2             # the surrogate's clip epsilon
    clip_range_schedule: str = "constant"   # constant, or linear: clip_range x the run's progress left (lin_X)
    clip_range_vf: float = 0.0          # the value prediction's clip around the old value; 0: none (SB3's None)
    target_kl: float = 0.0              # stop a phase's epochs once approx_kl passes 1.5 target_kl; 0: never

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.clip_range:
            raise UsageError(f"clip_range must be positive, got {self.clip_range}; e.g. --set clip_range=0.2")
        if self.clip_range_schedule not in ("constant", "linear"):
            raise UsageError(f"clip_range_schedule={self.clip_range_schedule!r} is not supported; "
                             "choose one of: constant, linear")
        for key in ("clip_range_vf", "target_kl"):
            if getattr(self, key) < 0:
                raise UsageError(f"{key} must be >= 0 (0: off), got {getattr(self, key)}")
        if self.normalize_advantage and self.batch_size < 2:
            raise UsageError("batch_size must be at least 2 when normalize_advantage=true (an advantage is "
                             "standardised over its minibatch); raise batch_size or n_steps x num_envs")


class PPO(ActorCritic):
    """PPO: the clipped surrogate objective over epochs of minibatches of each rollout, SB3's (Schulman et al. 2017)."""

    Settings = PPOConfig

    def __init__(self, cfg: PPOConfig, obs_space, act_space, device="cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        # the clip ranges of this phase (set_progress moves them in place: a captured `learn` reads them)
        self.clip_range = torch.tensor(cfg.clip_range, device=self.device)
        self.clip_range_vf = torch.tensor(cfg.clip_range_vf, device=self.device)
        self.last_kl = torch.zeros((), device=self.device)

    def set_progress(self, progress_remaining: float) -> None:
        scale = progress_remaining if self.cfg.clip_range_schedule == "linear" else 1.0
        self.clip_range.fill_(self.cfg.clip_range * scale)
        self.clip_range_vf.fill_(self.cfg.clip_range_vf * scale)

    def phase_group(self, minibatches: int) -> int:
        return 1 if self.cfg.target_kl > 0 else minibatches

    def stop_phase(self) -> bool:
        return self.cfg.target_kl > 0 and float(self.last_kl) > 1.5 * self.cfg.target_kl

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """K gradient steps on K minibatches (each field (K, B, ...)); returns |R - V(obs)| (K, B)."""
        cfg, clip, clip_vf = self.cfg, self.clip_range, self.clip_range_vf
        K = weights.shape[0]
        td = torch.empty_like(weights)
        for k in range(K):
            b = {key: v[k] for key, v in batches.items()}
            logp, entropy, value = self.evaluate(b["obs"], b["action"])
            adv = b["advantage"]
            if cfg.normalize_advantage and adv.shape[0] > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            log_ratio = logp - b["log_prob"]
            ratio = log_ratio.exp()
            pg_loss = -torch.min(adv * ratio, adv * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
            if cfg.clip_range_vf > 0:
                value_pred = b["value"] + torch.clamp(value - b["value"], -clip_vf, clip_vf)
            else:
                value_pred = value
            value_loss = F.mse_loss(b["return"], value_pred)
            entropy_loss = -entropy.mean()
            loss = pg_loss + cfg.vf_coef * value_loss
            if cfg.ent_coef:   # (without an entropy bonus its gradient is 0: not computed)
                loss = loss + cfg.ent_coef * entropy_loss
            self.opt.step(loss)
            with torch.no_grad():
                approx_kl = ((ratio - 1) - log_ratio).mean()
                td[k] = (b["return"] - value).abs()
        self.updates += K
        self.last_kl = approx_kl
        with torch.no_grad():   # the last minibatch's (SB3 logs means over a phase's minibatches)
            clip_fraction = ((ratio - 1).abs() > clip).float().mean()
        self.stats = {"policy_gradient_loss": pg_loss.detach(), "value_loss": value_loss.detach(),
                      "entropy_loss": entropy_loss.detach(), "approx_kl": approx_kl, "clip_fraction": clip_fraction,
                      "loss": loss.detach(), "clip_range": clip.clone(), **self._std_stat()}
        return td
