"""C51 (Bellemare et al. 2017, categorical DQN) written as a user would write it outside hetrl, in CleanRL's form:
a distribution over `n_quantiles` fixed returns (atoms) per action, and a target distribution built by projecting
r + gamma * z onto the atoms with `scatter_add_` into `torch.zeros_like` (or, in the other common form,
`index_add_` into a flat view of it). The compiled kernel's tests use it as an algorithm hetrl has never seen
whose learn writes in place into a tensor it made. It builds on tests/qrdqn_example.py's QR-DQN (its network of
n_quantiles outputs per action, here the atoms' logits; its exploration and target copies).

    p(s, a)   = softmax over the atoms;   a* = argmax_a sum_j z_j p_target(s', a)_j
    Tz_j      = clamp(r + gamma**steps * (1 - terminated) * z_j, v_min, v_max), projected onto the atoms
    loss      = mean_b w_b * -sum_j m_j log p(s, a)_j
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

import hetrl
import qrdqn_example


@dataclass
class C51Settings(qrdqn_example.QRDQNSettings):
    n_quantiles: int = 51                  # the atoms
    v_min: float = -100.0
    v_max: float = 100.0
    projection: str = "scatter_add_"       # or "index_add_": the two ways CleanRL-style code writes it


class Greedy(qrdqn_example.Greedy):
    def __init__(self, net, atoms: torch.Tensor, n_actions: int, seed: int):
        super().__init__(net, n_actions, seed)
        self.atoms = atoms

    @torch.no_grad()
    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        p = torch.softmax(self.net(torch.as_tensor(obs, dtype=torch.float32)), -1)
        return (p * self.atoms).sum(-1).argmax(-1).numpy()


class C51(qrdqn_example.QRDQN):
    Settings = C51Settings

    def __init__(self, cfg: C51Settings, obs_space, act_space, device="cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        self.atoms = torch.linspace(cfg.v_min, cfg.v_max, cfg.n_quantiles)

    def make_policy(self, seed, device="cpu", num_envs=None) -> Greedy:
        return Greedy(super().make_policy(seed).net, self.atoms, self.n, seed)

    def project(self, next_p: torch.Tensor, tz: torch.Tensor) -> torch.Tensor:
        """The target distribution: each Tz_j's mass split between its two nearest atoms."""
        cfg, B, N = self.cfg, next_p.shape[0], next_p.shape[1]
        b = (tz - cfg.v_min) / ((cfg.v_max - cfg.v_min) / (N - 1))
        lo, up = b.floor().clamp(0, N - 1), b.ceil().clamp(0, N - 1)
        d_lo = (up + (lo == up).float() - b) * next_p
        d_up = (b - lo) * next_p
        m = torch.zeros_like(next_p)
        if cfg.projection == "index_add_":
            offset = (torch.arange(B) * N).unsqueeze(1)
            m.view(-1).index_add_(0, (lo.long() + offset).view(-1), d_lo.view(-1))
            m.view(-1).index_add_(0, (up.long() + offset).view(-1), d_up.view(-1))
        else:
            m.scatter_add_(1, lo.long(), d_lo)
            m.scatter_add_(1, up.long(), d_up)
        return m

    def learn(self, batches: dict, weights: torch.Tensor) -> torch.Tensor:
        cfg, td_all = self.cfg, torch.empty_like(weights)
        for k in range(weights.shape[0]):
            b, w = {key: v[k] for key, v in batches.items()}, weights[k]
            B, rows = w.shape[0], torch.arange(w.shape[0])
            with torch.no_grad():
                next_p = torch.softmax(self.q_target(b["next_obs"]), -1)          # (B, A, atoms)
                next_p = next_p[rows, (next_p * self.atoms).sum(-1).argmax(-1)]    # (B, atoms)
                discount = cfg.gamma ** b["steps"].float() * (~b["terminated"]).float()
                tz = (b["reward"].unsqueeze(-1) + discount.unsqueeze(-1) * self.atoms).clamp(cfg.v_min, cfg.v_max)
                m = self.project(next_p, tz)
            log_p = torch.log_softmax(self.q(b["obs"]), -1)[rows, b["action"].long().view(B)]
            cross_entropy = -(m * log_p).sum(-1)
            loss = (w * cross_entropy).mean()
            self.opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
            self.opt.step()
            td_all[k] = cross_entropy.detach()
        self.updates += weights.shape[0]
        return td_all


hetrl.register_algorithm("c51", C51, replace=True, presets=qrdqn_example.PRESETS)
