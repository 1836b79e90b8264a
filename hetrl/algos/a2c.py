"""A2C (Mnih et al. 2016, synchronous), as Stable-Baselines3 implements it.

A learner phase takes one rollout of n_steps x num_envs transitions (SB3's default 5 x n_envs) collected by
the current policy, with GAE(gae_lambda) advantages A (gae_lambda 1: n-step returns bootstrapped at the
rollout's end) and returns R computed once by the learner core, and takes one gradient step on all of it:

    A          <- (A - mean(A)) / (std(A) + 1e-8)                        (normalize_advantage; SB3's default: off)
    pg loss    = -mean(A log pi(action | obs))
    value loss = mean((R - V(obs))^2)
    entropy    = mean(H[pi(. | obs)]);  loss = pg loss - ent_coef entropy + vf_coef value loss
    one optimizer step: RMSprop (alpha 0.99, eps rms_prop_eps; SB3's default) or Adam (use_rms_prop=false),
    the gradient norm clipped to max_grad_norm

The loss scalars of the last step are in `stats`. Networks, acting, values and normalisation:
hetrl/algos/onpolicy.py (SB3's ActorCriticPolicy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hetrl.algos.nets import FlatAdam
from hetrl.algos.onpolicy import ActorCritic, ActorCriticConfig, FlatRMSprop
from hetrl.errors import UsageError


@dataclass
class A2CConfig(ActorCriticConfig):
    """A2C's settings (SB3's names and defaults): one minibatch of the whole rollout, one epoch."""

    n_steps: int = 5
    n_epochs: int = 1
    lr: float = 7e-4
    gae_lambda: float = 1.0
    normalize_advantage: bool = False
    use_rms_prop: bool = True           # RMSprop (SB3's default), else Adam
    rms_prop_eps: float = 1e-5

    def __post_init__(self) -> None:
        self.batch_size = self.n_steps * self.num_envs   # every step learns the whole rollout
        super().__post_init__()

    def validate(self) -> None:
        super().validate()
        if self.n_epochs != 1:
            raise UsageError(f"A2C takes one gradient step per rollout: n_epochs must be 1, got {self.n_epochs}")
        if not self.rms_prop_eps > 0:
            raise UsageError(f"rms_prop_eps must be positive, got {self.rms_prop_eps}")


class A2C(ActorCritic):
    """A2C: synchronous advantage actor-critic, one gradient step per rollout, SB3's (Mnih et al. 2016)."""

    Settings = A2CConfig

    def _optimizer(self, module):
        cfg = self.cfg
        if cfg.use_rms_prop:
            return FlatRMSprop(module, cfg.lr, cfg.max_grad_norm, alpha=0.99, eps=cfg.rms_prop_eps)
        return FlatAdam(module, cfg.lr, cfg.max_grad_norm, eps=1e-5)

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """K gradient steps (one per rollout: K = 1) on K batches (each field (K, B, ...)); returns |R - V(obs)|."""
        cfg = self.cfg
        K = weights.shape[0]
        td = torch.empty_like(weights)
        for k in range(K):
            b = {key: v[k] for key, v in batches.items()}
            logp, entropy, value = self.evaluate(b["obs"], b["action"])
            adv = b["advantage"]
            if cfg.normalize_advantage:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = -(adv * logp).mean()
            value_loss = F.mse_loss(b["return"], value)
            entropy_loss = -entropy.mean()
            loss = policy_loss + cfg.vf_coef * value_loss
            if cfg.ent_coef:   # (without an entropy bonus its gradient is 0: not computed)
                loss = loss + cfg.ent_coef * entropy_loss
            self.opt.step(loss)
            td[k] = (b["return"] - value).detach().abs()
        self.updates += K
        self.stats = {"policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
                      "entropy_loss": entropy_loss.detach(), **self._std_stat()}
        return td
