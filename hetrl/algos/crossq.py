"""CrossQ (Bhatt et al., ICLR 2024): SAC without target networks, batch renormalisation in the networks, and
one joint forward pass of the critics over the current and the next state-action pairs.

SAC's critics need target networks because the next state-action pairs (s', a'), with a' from the policy,
are distributed unlike the replayed (s, a); batch normalisation on (s, a) alone sees (s', a') as out of
distribution. CrossQ passes both through the critics as ONE batch, so the batch statistics are those of the
mixture, and drops the target networks: the bootstrap target comes from the same pass.

Batch renormalisation (Ioffe 2017, as SBX's BatchRenorm) of a layer's input x, per feature, over the rows:
    training:   mu_B, var_B = the batch's mean and (biased) variance,  sigma_B = sqrt(var_B + eps)
                sigma = sqrt(var + eps) of the running mean mu and variance var
                r = clip(sigma_B / sigma, 1/r_max, r_max),  d = clip((mu_B - mu) / sigma, -d_max, d_max)   (constants
                    to the gradient; r = 1, d = 0, plain batch norm, for the layer's first renorm_warmup_steps passes)
                y = gamma * ((x - mu_B) / sigma_B * r + d) + beta
                mu <- m mu + (1 - m) mu_B,  var <- m var + (1 - m) var_B,  steps <- steps + 1   (m: batch_norm_momentum)
    evaluation: y = gamma * (x - mu) / sigma + beta                                    (the running statistics)
with eps = 1e-3, r_max = 3, d_max = 5 (SBX's). After the warm-up SBX normalises with the equivalent
mean mu_B - d sigma_B' / r and variance var_B / r**2 (sigma_B' = sqrt(var_B)); the two agree but for where eps
enters, and the form above has no infinite gradient where a feature is constant over a batch.

The networks (actions scaled to [-1, 1]; BRN: batch renormalisation, act: the activation):
    critic Q_i(s, a) = Linear(BRN(act(Linear(... BRN(act(Linear(BRN([s, a])))) ...))))     (qf_arch hidden layers;
                       with layer_norm a LayerNorm after each hidden Linear, as SBX's use_layer_norm)
    actor pi(.|s):     the same body on s (net_arch; without BRN if not batch_norm_actor), heads mean(s) and
                       log_std(s) clamped to [-20, 2];  u ~ N(mean, std**2), a = tanh(u),
                       log pi(a|s) = sum_i [log N(u_i; mean_i, std_i) - log(1 - tanh(u_i)**2)]
one gradient step (SBX's order):
    a' ~ pi(.|s')                                            actor on its running statistics
    [Q_i(s, a_buf); Q_i(s', a')] = Q_i([s; s'], [a_buf; a'])   each critic in training mode, on the 2B rows at once
    target      = stop_grad(r + gamma**steps * (1 - terminated) * (min(Q_1(s', a'), Q_2(s', a')) - alpha log pi(a'|s')))
    critic loss = 0.5 mean(w * (Q_1(s, a_buf) - target)**2) + 0.5 mean(w * (Q_2(s, a_buf) - target)**2)
    every policy_delay-th gradient step (counted over the run, `updates` in the checkpoint):
        a ~ pi(.|s)                                          actor in training mode
        actor loss = mean(alpha log pi(a|s) - min(Q_1(s, a), Q_2(s, a)))     critics after their step, on their
                                                                            running statistics
        alpha loss = -mean(log_alpha * (log pi(a|s) + target_entropy))       (ent_coef auto; after the actor's step)
    new priorities = (|Q_1(s, a_buf) - target| + |Q_2(s, a_buf) - target|) / 2
alpha = exp(log_alpha) is the value before this step's alpha update. The actor's and critics' Adam has
beta1 = adam_beta1 (0.5, SBX's and the paper's), the alpha's torch's default (0.9). No gradient clip.
w are the importance weights of prioritised replay (1 under uniform replay); steps is the n-step count.
Acting samples from pi on the running statistics (uniform random actions before learning_starts);
evaluation uses tanh(mean(s)). The running statistics and each layer's pass count are buffers of the
modules: checkpoints and the policy sent to actors carry them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetrl.algorithm import Algorithm
from hetrl.algos.nets import FlatAdam, live_state
from hetrl.algos.sac import SACPolicy, parse_coef, squash
from hetrl.config import Config, check_ent_coef
from hetrl.errors import UsageError

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh, "elu": F.elu}


@dataclass
class CrossQConfig(Config):
    """CrossQ's settings beside the common ones: SBX's CrossQ defaults (its names where it has them)."""
    lr: float = 1e-3
    batch_size: int = 256
    buffer_size: int = 1_000_000
    learning_starts: int = 100
    train_freq: int = 1
    gradient_steps: int = 1
    max_grad_norm: float = 0.0              # no gradient clip (SBX has none)
    tau: float = 1.0                        # unused: CrossQ has no target networks
    qf_arch: list[int] = field(default_factory=lambda: [1024, 1024])   # the critics' hidden layers (SBX's;
                                                                       # the paper's are 2048 wide)
    policy_delay: int = 3                   # critic steps per actor (and alpha) step, counted over the run
    ent_coef: str = "auto"                  # alpha: auto (learned from 1.0), auto_X (learned from X), or a number
    target_entropy: str = "auto"            # the entropy alpha is tuned toward: auto = -dim(actions), or a number
    batch_norm_momentum: float = 0.99       # the running statistics' decay: mu <- m mu + (1 - m) mu_B
    renorm_warmup_steps: int = 100_000      # a layer's training passes of plain batch norm before r/d correct it
    batch_norm_actor: bool = True           # batch renormalisation in the actor too (SBX's default)
    adam_beta1: float = 0.5                 # Adam's beta1 for the actor and the critics (SBX's)

    def validate(self) -> None:
        super().validate()
        check_ent_coef(self.ent_coef, "ent_coef")
        check_ent_coef(self.target_entropy, "target_entropy")
        if self.policy_delay <= 0:
            raise UsageError(f"policy_delay must be positive, got {self.policy_delay}")
        if not 0.0 <= self.batch_norm_momentum < 1.0:
            raise UsageError(f"batch_norm_momentum must be in [0, 1), got {self.batch_norm_momentum}; "
                             "e.g. --set batch_norm_momentum=0.99")
        if self.renorm_warmup_steps < 0:
            raise UsageError(f"renorm_warmup_steps must be >= 0, got {self.renorm_warmup_steps}")
        if not 0.0 <= self.adam_beta1 < 1.0:
            raise UsageError(f"adam_beta1 must be in [0, 1), got {self.adam_beta1}")


class BatchRenorm(nn.Module):
    """Batch renormalisation over the rows of a (N, features) input (the module docstring's math); `train`
    chooses the batch statistics (and updates the running ones) or the running statistics."""

    r_max, d_max, eps = 3.0, 5.0, 1e-3

    def __init__(self, features: int, momentum: float = 0.99, warmup_steps: int = 100_000):
        super().__init__()
        self.momentum, self.warmup_steps = momentum, warmup_steps
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))   # training passes so far

    def forward(self, x: torch.Tensor, train: bool = False) -> torch.Tensor:
        if not train:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        with torch.no_grad():
            var, mean = torch.var_mean(x, dim=0, unbiased=False)
            sigma = (self.running_var + self.eps).sqrt()
            warm = self.steps >= self.warmup_steps      # a tensor: no host sync, one program before and after
            r = torch.where(warm, ((var + self.eps).sqrt() / sigma).clamp(1 / self.r_max, self.r_max), 1.0)
            d = torch.where(warm, ((mean - self.running_mean) / sigma).clamp(-self.d_max, self.d_max), 0.0)
            self.running_mean.lerp_(mean, 1.0 - self.momentum)
            self.running_var.lerp_(var, 1.0 - self.momentum)
            self.steps += 1
        # gamma * ((x - mu_B) / sigma_B * r + d) + beta = batch norm with weight gamma * r and bias beta + gamma * d
        # (r, d constants to the gradient): one fused kernel and its backward
        return F.batch_norm(x, None, None, self.weight * r, self.bias + self.weight * d, True, 0.0, self.eps)


class Body(nn.Module):
    """[BRN] -> (Linear -> [LayerNorm] -> act -> [BRN]) per hidden layer: the trunk of the actor and the critics."""

    def __init__(self, in_dim: int, hidden: list[int], activation: str, batch_norm: bool, momentum: float,
                 warmup_steps: int, layer_norm: bool = False):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise UsageError(f"activation={activation!r} is not one of {', '.join(ACTIVATIONS)}; "
                             "e.g. --set activation=relu")
        sizes = [in_dim, *hidden]
        self.act = ACTIVATIONS[activation]
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.layer_norms = nn.ModuleList(nn.LayerNorm(b) for b in hidden) if layer_norm else None
        self.norms = nn.ModuleList(BatchRenorm(n, momentum, warmup_steps) for n in sizes) if batch_norm else None
        self.out_dim = sizes[-1]

    def forward(self, x: torch.Tensor, train: bool = False) -> torch.Tensor:
        if self.norms is not None:
            x = self.norms[0](x, train)
        for i, linear in enumerate(self.linears):
            x = linear(x)
            if self.layer_norms is not None:
                x = self.layer_norms[i](x)
            x = self.act(x)
            if self.norms is not None:
                x = self.norms[i + 1](x, train)
        return x


class Critic(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, cfg: CrossQConfig, obs_ndim: int = 1):
        super().__init__()
        self.obs_ndim = obs_ndim
        self.body = Body(obs_dim + act_dim, cfg.qf_arch or cfg.net_arch, cfg.activation, True,
                         cfg.batch_norm_momentum, cfg.renorm_warmup_steps, cfg.layer_norm)
        self.q = nn.Linear(self.body.out_dim, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor, train: bool = False) -> torch.Tensor:
        obs = obs.flatten(start_dim=-self.obs_ndim) if self.obs_ndim > 1 else obs
        return self.q(self.body(torch.cat([obs, action], dim=-1), train)).squeeze(-1)


class Actor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, cfg: CrossQConfig, obs_ndim: int = 1):
        super().__init__()
        self.obs_ndim = obs_ndim
        self.body = Body(obs_dim, cfg.net_arch, cfg.activation, cfg.batch_norm_actor, cfg.batch_norm_momentum,
                         cfg.renorm_warmup_steps)
        self.mean = nn.Linear(self.body.out_dim, act_dim)
        self.log_std = nn.Linear(self.body.out_dim, act_dim)

    def forward(self, obs: torch.Tensor, train: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean(s), log_std(s)) of the Gaussian before the tanh."""
        h = self.body(obs.flatten(start_dim=-self.obs_ndim) if self.obs_ndim > 1 else obs, train)
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, train: bool = False,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, log pi(a|s)) with eps ~ N(0, 1) drawn from `generator` (the learner's)."""
        mean, log_std = self(obs, train)
        return squash(mean, log_std, torch.randn(mean.shape, generator=generator, device=mean.device,
                                                 dtype=mean.dtype))


class CrossQ(Algorithm):
    """CrossQ: SAC with batch renormalisation, no target networks, one joint critic pass (Bhatt et al. 2024)."""

    Settings = CrossQConfig
    action_spaces = (gym.spaces.Box,)
    nets, optims = ("actor", "critics"), ("actor_opt", "critic_opt")
    shape_settings = ("batch_norm_actor",)
    schedule_settings = ("policy_delay",)

    def __init__(self, cfg: CrossQConfig, obs_space: gym.Space, act_space: gym.Space,
                 device: str | torch.device = "cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        self.low, self.high = np.asarray(act_space.low), np.asarray(act_space.high)
        self.act_dim = int(np.prod(act_space.shape))
        self.actor = self._actor().to(self.device)
        self.critics = nn.ModuleList([self._critic(), self._critic()]).to(self.device)
        betas = (cfg.adam_beta1, 0.999)
        self.actor_opt = FlatAdam(self.actor, cfg.lr, cfg.max_grad_norm, betas=betas)     # one flat buffer per
        self.critic_opt = FlatAdam(self.critics, cfg.lr, cfg.max_grad_norm, betas=betas)  # network (both critics)
        learned, init = parse_coef(cfg.ent_coef)
        self.target_entropy = -float(self.act_dim) if cfg.target_entropy == "auto" else float(cfg.target_entropy)
        self.log_alpha = torch.tensor(math.log(init), device=self.device, requires_grad=learned)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.lr) if learned else None

    def _actor(self) -> Actor:
        return Actor(int(np.prod(self.obs_shape)), self.act_dim, self.cfg, len(self.obs_shape))

    def _critic(self) -> Critic:
        return Critic(int(np.prod(self.obs_shape)), self.act_dim, self.cfg, len(self.obs_shape))

    # ---- acting side -------------------------------------------------------------------------
    def make_policy(self, seed: int, device: str = "cpu", num_envs: int | None = None) -> SACPolicy:
        net = self._actor()
        net.load_state_dict(self.policy_state())
        return SACPolicy(net, self.low, self.high, seed, device)   # SAC's acting, on CrossQ's actor

    def policy_state(self) -> dict:
        """The actor's parameters and its batch-renorm statistics."""
        return live_state(self.actor)

    def policy_changes(self) -> int:
        """The actor (weights and statistics) moves every policy_delay-th update only."""
        return self.updates // self.cfg.policy_delay

    def graph_period(self) -> int:
        """The delayed actor step is decided in Python from `updates`: its pattern repeats every policy_delay."""
        return self.cfg.policy_delay

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    # ---- learning side -----------------------------------------------------------------------
    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """K sequential gradient steps, one per leading index of `batches` (shape (K, B, ...)); returns |TD| (K, B)."""
        cfg, td_all = self.cfg, torch.empty_like(weights)
        q1, q2 = self.critics
        for k in range(weights.shape[0]):
            b, w = {key: v[k] for key, v in batches.items()}, weights[k]
            alpha = self.log_alpha.detach().exp()
            with torch.no_grad():
                next_a, next_logp = self.actor.sample(b["next_obs"], generator=self.rng)
            # one pass of each critic over [(s, a); (s', a')]: the batch statistics of both halves
            obs, act = torch.cat([b["obs"], b["next_obs"]]), torch.cat([b["action"], next_a])
            v1, next_v1 = q1(obs, act, train=True).chunk(2)
            v2, next_v2 = q2(obs, act, train=True).chunk(2)
            with torch.no_grad():
                next_q = torch.min(next_v1, next_v2) - alpha * next_logp
                target = b["reward"] + cfg.gamma ** b["steps"].float() * (~b["terminated"]).float() * next_q
            td1, td2 = v1 - target, v2 - target
            critic_loss = 0.5 * (w * td1.pow(2)).mean() + 0.5 * (w * td2.pow(2)).mean()
            self.critic_opt.step(critic_loss)
            self.stats = {**self.stats, "critic_loss": critic_loss.detach(), "ent_coef": alpha}
            self.updates += 1
            if self.updates % cfg.policy_delay == 0:
                a, logp = self.actor.sample(b["obs"], train=True, generator=self.rng)
                actor_loss = (alpha * logp - torch.min(q1(b["obs"], a), q2(b["obs"], a))).mean()
                self.actor_opt.step(actor_loss)
                self.stats["actor_loss"] = actor_loss.detach()
                if self.alpha_opt is not None:
                    self.alpha_opt.zero_grad()
                    alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
                    alpha_loss.backward()
                    self.alpha_opt.step()
                    self.stats["ent_coef_loss"] = alpha_loss.detach()
            td_all[k] = (td1.detach().abs() + td2.detach().abs()) * 0.5
        return td_all

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The networks with their batch-renorm statistics and pass counts (module buffers), the optimizers,
        alpha and its optimizer, `updates`."""
        return {**super().state_dict(), "log_alpha": self.log_alpha.detach().clone(),
                "alpha_opt": self.alpha_opt.state_dict() if self.alpha_opt is not None else {}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if self.alpha_opt is not None and state["alpha_opt"]:
            self.alpha_opt.load_state_dict(state["alpha_opt"])
