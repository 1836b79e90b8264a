"""DQN (Mnih et al. 2015) with the Rainbow switches: double, dueling, n-step, prioritised replay.

The learner's math, for a sampled batch of n-step transitions:
    target = r + gamma**steps * (1 - terminated) * Q_target(s', argmax_a Q_online(s', a))   # double
    target = r + gamma**steps * (1 - terminated) * max_a Q_target(s', a)                     # plain
    loss   = mean(w * huber(Q(s, a) - target));   new priorities = |Q(s, a) - target|
The target network is copied (tau = 1) or Polyak-averaged (tau < 1) every
`target_update_interval` env steps, as in Stable-Baselines3.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetrl.algos import compiled, fastpath
from hetrl.algos.nets import Checkpointed, FlatAdam, NatureCNN, load_weights, mlp, soft_update
from hetrl.config import Config


class QNetwork(nn.Module):
    """An MLP on (flattened) vector observations; with `image` (the shape of pixel observations) the
    Nature CNN's 512 features first, then `net_arch` (SB3's CnnPolicy: none) and the Q head."""

    def __init__(self, obs_dim: int, n_actions: int, net_arch: list[int], dueling: bool = False,
                 obs_ndim: int = 1, image: tuple[int, ...] | None = None):
        super().__init__()
        self.dueling, self.obs_ndim = dueling, obs_ndim
        self.features = NatureCNN(image) if image is not None else None
        self.pixels = self.features is not None
        if self.pixels:
            obs_dim = self.features.out_dim
        if dueling:  # Q = V + A - mean(A) over a shared body
            self.body = mlp([obs_dim, *net_arch])
            if net_arch:
                self.body.append(nn.ReLU())
            width = net_arch[-1] if net_arch else obs_dim
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.q = mlp([obs_dim, *net_arch, n_actions])

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

    def __init__(self, net: QNetwork, n_actions: int, seed: int, device: str = "cpu", compiled_act: bool = False):
        self.net, self.n_actions, self.device = net.to(device).eval(), n_actions, device
        self.rng = np.random.default_rng(seed)
        self.dtype = None if net.pixels else torch.float32   # pixels stay uint8 up to the network
        # optional: the same forward as one compiled call (compiled.Acting), with the run's compiled kernels
        self.fast = compiled.Acting.of(self.net, "q") if compiled_act else None

    @torch.no_grad()
    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions."""
        if self.fast is not None:
            return self.fast(obs).argmax(-1)
        q = self.net(torch.as_tensor(obs, dtype=self.dtype, device=self.device))
        return q.argmax(-1).cpu().numpy()

    def act(self, obs: np.ndarray, explore: float | None) -> tuple[np.ndarray, np.ndarray]:
        n = len(obs)
        if explore is None:  # warm-up: uniform random actions
            a = self.rng.integers(0, self.n_actions, n)
        else:  # epsilon-greedy; the network runs only on the envs that act greedily (early in a run, few or
            rand = self.rng.random(n) < explore   # none: a CNN forward is ~1 ms a step on a CPU; SB3 skips it too)
            a = np.empty(n, np.int64)
            if not rand.all():
                greedy = ~rand
                a[greedy] = self.act_deterministic(obs if greedy.all() else obs[greedy])
            if rand.any():
                a[rand] = self.rng.integers(0, self.n_actions, int(rand.sum()))
        return a, a

    def load(self, state: dict) -> None:
        load_weights(self.net, state)

    def episode_end(self, done: np.ndarray) -> None:
        pass


class DQN(Checkpointed):
    nets, optims = ("q", "q_target"), ("opt",)          # what a checkpoint holds
    name = "dqn"

    def __init__(self, cfg: Config, obs_shape: tuple[int, ...], n_actions: int, device: str | torch.device = "cpu",
                 pixels: bool = False):
        self.cfg, self.obs_shape, self.n_actions, self.device = cfg, obs_shape, n_actions, torch.device(device)
        self.pixels = pixels   # image observations: the Nature CNN (nets.py), never the fast path
        self.q = self._net().to(self.device)
        self.q_target = self._net().to(self.device)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.opt = FlatAdam(self.q, cfg.lr, cfg.max_grad_norm)
        self.fast = fastpath.for_algorithm(self) if cfg.fastpath else None  # optional, see fastpath.py
        compiled.attach(self)      # optional: the whole phase as one native call where it applies (compiled.py)
        self.updates = 0

    def _net(self) -> QNetwork:
        return QNetwork(int(np.prod(self.obs_shape)), self.n_actions, self.cfg.net_arch, self.cfg.dueling,
                        len(self.obs_shape), tuple(self.obs_shape) if self.pixels else None)

    # ---- acting side -------------------------------------------------------------------
    def make_policy(self, seed: int, device: str = "cpu", num_envs: int | None = None) -> DQNPolicy:
        net = self._net()
        net.load_state_dict(self.policy_state())
        return DQNPolicy(net, self.n_actions, seed, device, compiled_act=bool(self.cfg.compiled))

    def policy_state(self) -> dict:
        return self.q.state_dict()

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
            soft_update(self.q_target, self.q, self.cfg.tau)

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
        if self.compiled_phase:  # the same K updates, targets included, as one native call (compiled.py)
            return compiled.phase(self, batches, weights)
        fixed = not self.cfg.double
        targets = self._targets(batches) if fixed else None
        td_all = torch.empty_like(weights)
        for k in range(K):
            b = {key: v[k] for key, v in batches.items()}
            target = targets[k] if fixed else self._targets(b)
            a = b["action"].long().unsqueeze(-1)
            if self.fast is None:
                q = self.q(b["obs"]).gather(-1, a).squeeze(-1)
                td = q - target
                loss = (weights[k] * F.smooth_l1_loss(q, target, reduction="none")).mean()
                self.opt.step(loss)
            else:  # the same loss through its hand-derived gradient
                td = fastpath.dqn_step(self, b["obs"], a, target, weights[k])
            td_all[k] = td.detach().abs()
        self.updates += K
        return td_all

