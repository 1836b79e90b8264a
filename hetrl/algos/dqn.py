"""DQN (Mnih et al. 2015) with the Rainbow switches: double, dueling, n-step, prioritised replay.

The learner's math, for a sampled batch of n-step transitions:
    target = r + gamma**steps * (1 - terminated) * Q_target(s', argmax_a Q_online(s', a))   # double
    target = r + gamma**steps * (1 - terminated) * max_a Q_target(s', a)                     # plain
    loss   = mean(w * huber(Q(s, a) - target));   new priorities = |Q(s, a) - target|
The target network is copied (tau = 1) or Polyak-averaged (tau < 1) every
`target_update_interval` env steps, as in Stable-Baselines3.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetrl.algorithm import Algorithm, MemberPolicies, is_image
from hetrl.algos.nets import FlatAdam, NatureCNN, StackedNets, flatten, live_state, load_weights, mlp, soft_update
from hetrl.config import Config
from hetrl.errors import UsageError


@dataclass
class DQNConfig(Config):
    """DQN's settings beside the common ones (SB3's names and defaults)."""
    tau: float = 1.0                    # target update: 1.0 hard copy, <1 Polyak
    target_update_interval: int = 10    # env steps between target updates
    exploration_fraction: float = 0.1   # of the run over which epsilon goes from initial to final
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.05
    double: bool = False                # double DQN: the online network picks the next action
    dueling: bool = False               # Q = V + A - mean(A) over a shared body

    def validate(self) -> None:
        super().validate()
        if self.target_update_interval <= 0:
            raise UsageError(f"target_update_interval must be positive, got {self.target_update_interval}")
        if not 0.0 <= self.exploration_fraction <= 1.0:
            raise UsageError(f"exploration_fraction must be in [0, 1], got {self.exploration_fraction}")
        for key in ("exploration_initial_eps", "exploration_final_eps"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise UsageError(f"{key} must be in [0, 1], got {getattr(self, key)}")


class QNetwork(nn.Module):
    """An MLP on (flattened) vector observations; with `image` (the shape of pixel observations) the
    Nature CNN's 512 features first, then `net_arch` (SB3's CnnPolicy: none) and the Q head."""

    def __init__(self, obs_dim: int, n_actions: int, net_arch: list[int], dueling: bool = False,
                 obs_ndim: int = 1, image: tuple[int, ...] | None = None, activation: str = "relu",
                 layer_norm: bool = False):
        super().__init__()
        self.dueling, self.obs_ndim = dueling, obs_ndim
        self.features = NatureCNN(image) if image is not None else None
        self.pixels = self.features is not None
        if self.pixels:
            obs_dim = self.features.out_dim
        if dueling:  # Q = V + A - mean(A) over a shared body
            self.body = mlp([obs_dim, *net_arch], activation, layer_norm, last_act=bool(net_arch))
            width = net_arch[-1] if net_arch else obs_dim
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.q = mlp([obs_dim, *net_arch, n_actions], activation, layer_norm)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.pixels:  # uint8 pixels -> 512 features (scaled inside)
            obs = self.features(obs)
        elif self.obs_ndim > 1:  # e.g. (..., H, W) -> (..., H*W)
            obs = obs.flatten(start_dim=-self.obs_ndim)
        if not self.dueling:
            return self.q(obs)
        h = self.body(obs)
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(dim=-1, keepdim=True)


class DQNPolicy:
    """Epsilon-greedy acting on a snapshot of the Q-network (runs in actors)."""

    def __init__(self, net: QNetwork, n_actions: int, seed: int, device: str = "cpu"):
        self.net, self.n_actions, self.device = net.to(device).eval(), n_actions, device
        self.rng = np.random.default_rng(seed)
        self.dtype = None if net.pixels else torch.float32   # pixels stay uint8 up to the network

    @torch.no_grad()
    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions."""
        q = self.net(torch.as_tensor(obs, dtype=self.dtype, device=self.device))
        return q.argmax(-1).cpu().numpy()

    def act(self, obs: np.ndarray, explore: float | None, greedy=None) -> tuple[np.ndarray, np.ndarray]:
        """`greedy(mask)`: the greedy actions of the rows in mask where they are known already (StackedQPolicy)."""
        n = len(obs)
        if explore is None:  # warm-up: uniform random actions
            a = self.rng.integers(0, self.n_actions, n)
            return a, a
        # epsilon-greedy; the network runs only on the envs that act greedily (early in a run, few or none: a CNN
        # forward is ~1 ms a step on a CPU; SB3 skips it too)
        rand = self.rng.random(n) < explore
        k = int(rand.sum())
        if k == 0:    # all greedy (most steps, late in a run): the network's actions as they come
            a = greedy(~rand) if greedy is not None else self.act_deterministic(obs)
            a = np.asarray(a, np.int64)
            return a, a
        a = np.empty(n, np.int64)
        if k < n:
            mask = ~rand
            a[mask] = greedy(mask) if greedy is not None else self.act_deterministic(obs[mask])
        a[rand] = self.rng.integers(0, self.n_actions, k)
        return a, a

    def load(self, state: dict) -> None:
        load_weights(self.net, state)

    def episode_end(self, done: np.ndarray) -> None:
        pass


class StackedQPolicy(MemberPolicies):
    """A population's DQN members side by side: the Q-values of every member's envs in one call over their stacked
    weights (StackedNets), made at the first greedy row of a step; each member's epsilon-greedy draws are its own
    policy's (DQNPolicy.act). Member by member where the networks do not stack (the compiled kernel's acting)."""

    def __init__(self, policies: list[DQNPolicy], envs: int):
        super().__init__(policies, envs)
        self.stacked = StackedNets.of([p.net for p in policies])

    def act(self, obs: np.ndarray, explore: list) -> tuple[np.ndarray, np.ndarray]:
        if self.stacked is None:
            return super().act(obs, explore)
        q: list = []

        def greedy(m: int, rows: slice):
            def of(mask: np.ndarray) -> np.ndarray:
                if not q and self.stacked is not None:
                    x = torch.as_tensor(obs, dtype=self.policies[0].dtype)
                    try:
                        q.append(self.stacked(x.view(len(self.policies), self.n, *x.shape[1:])).argmax(-1).numpy())
                    except Exception:   # the network's forward does not vmap: member by member from here on
                        self.stacked = None
                return q[0][m][mask] if q else self.policies[m].act_deterministic(obs[rows][mask])
            return of

        acts = [p.act(obs[s], explore[m], greedy(m, s)) for m, p, s in self.rows()]
        return np.concatenate([a[0] for a in acts]), np.concatenate([a[1] for a in acts])

    def load_member(self, m: int, state: dict) -> None:
        super().load_member(m, state)
        if self.stacked is not None:
            self.stacked.refresh(m)


class DQN(Algorithm):
    Settings = DQNConfig
    action_spaces = (gym.spaces.Discrete,)
    pixels = True                                       # image observations: the Nature CNN (nets.py)
    nets, optims = ("q", "q_target"), ("opt",)          # what a checkpoint holds
    shape_settings = ("dueling", "double")
    schedule_settings = ("target_update_interval",)

    def __init__(self, cfg: DQNConfig, obs_space: gym.Space, act_space: gym.Space, device: str | torch.device = "cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        self.n_actions = int(act_space.n)
        self.pixels = is_image(obs_space)
        self.q = self._net().to(self.device)
        self.q_target = self._net().to(self.device)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.q_target_flat = flatten(self.q_target)     # laid out as the optimizer's buffer of q: one update
        self.opt = FlatAdam(self.q, cfg.lr, cfg.max_grad_norm)

    def _net(self) -> QNetwork:
        return QNetwork(int(np.prod(self.obs_shape)), self.n_actions, self.cfg.net_arch, self.cfg.dueling,
                        len(self.obs_shape), tuple(self.obs_shape) if self.pixels else None,
                        self.cfg.activation, self.cfg.layer_norm)

    # ---- acting side -------------------------------------------------------------------
    def make_policy(self, seed: int, device: str = "cpu", num_envs: int | None = None) -> DQNPolicy:
        net = self._net()
        net.load_state_dict(self.policy_state())
        return DQNPolicy(net, self.n_actions, seed, device)

    def stacked_policy(self, policies: list, envs: int):
        if all(type(p) is DQNPolicy for p in policies):   # (a subclass's policy may act otherwise)
            return StackedQPolicy(policies, envs)
        return super().stacked_policy(policies, envs)

    def policy_state(self) -> dict:
        return live_state(self.q)

    def exploration(self, env_steps: int) -> float | None:
        """Epsilon, linear from initial to final over exploration_fraction of the run; None
        (uniform random) before learning_starts, as in SB3."""
        c = self.cfg
        if env_steps < c.learning_starts:
            return None
        frac = min(1.0, env_steps / max(1.0, c.exploration_fraction * c.steps))
        return c.exploration_initial_eps + frac * (c.exploration_final_eps - c.exploration_initial_eps)

    def on_env_steps(self, before: int, after: int) -> None:
        """Target update every target_update_interval env steps (the online net is constant
        while acting, so several crossings in one collect equal one update)."""
        k = self.cfg.target_update_interval
        if after // k > before // k:
            soft_update(self.q_target_flat, self.opt.flat, self.cfg.tau)

    # ---- learning side -----------------------------------------------------------------
    @torch.no_grad()
    def _targets(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        next_q = self.q_target(b["next_obs"])
        if self.cfg.double:
            best = self.q(b["next_obs"]).argmax(-1, keepdim=True)
            next_v = next_q.gather(-1, best).squeeze(-1)
        else:
            next_v = next_q.max(-1).values
        discount = self.cfg.gamma ** b["steps"].float() * (~b["terminated"]).float()
        return b["reward"] + discount * next_v

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """One gradient step per leading index of `batches` (shape (K, B, ...)); returns |TD|
        of shape (K, B) for the priorities.  The target net is fixed during the K steps, so
        (plain DQN) all K targets come from one batched forward pass."""
        K = weights.shape[0]
        fixed = not self.cfg.double
        targets = self._targets(batches) if fixed else None
        td_all = torch.empty_like(weights)
        for k in range(K):
            b = {key: v[k] for key, v in batches.items()}
            target = targets[k] if fixed else self._targets(b)
            a = b["action"].long().unsqueeze(-1)
            q = self.q(b["obs"]).gather(-1, a).squeeze(-1)
            td = q - target
            loss = (weights[k] * F.smooth_l1_loss(q, target, reduction="none")).mean()
            self.opt.step(loss)
            td_all[k] = td.detach().abs()
        self.stats = {"loss": loss.detach()}
        self.updates += K
        return td_all

