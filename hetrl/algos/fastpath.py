"""The learner's optional fast path on CPU: hand-derived gradients and a direct fused Adam call.

The algorithms' losses are written once, in hetrl/algos/dqn.py and ddpg.py, with autograd and
`torch.optim.Adam(fused=True)`: that is the reference. On a small network most of a CPU update is
per-op bookkeeping, not arithmetic (autograd builds a graph; `Adam.step()` spends ~0.1-0.2 ms in
Python around one fused kernel). This module computes the same update without them:

* :class:`MLPGrad`: the explicit forward/backward of a Linear-ReLU `mlp` (optionally ending in
  Tanh), writing parameter gradients straight into their (FlatAdam) buffers; ReLU's backward is
  autograd's own kernel (`aten.threshold_backward`);
* :func:`adam_step`: the kernel `torch.optim.Adam(fused=True).step()` runs (`torch._fused_adam_`), on
  the same optimizer state, so checkpoints are those of torch.optim.Adam;
* :func:`dqn_step` / :func:`ddpg_step`: each algorithm's loss through its gradient (d/dq of the
  loss written in the algorithm's file).

It is chosen by one switch, `Config.fastpath`, which the planner's profile turns on where it
measures faster; where the private calls are missing (another torch) it falls back to the public
path. tests/test_fastpath.py checks that both paths give the same parameters.
"""

from __future__ import annotations

import torch
from torch import nn


def available() -> bool:
    """Whether this torch has the private kernels the fast path calls."""
    return hasattr(torch, "_fused_adam_") and hasattr(torch.ops.aten, "threshold_backward")


def adam_step(opt) -> None:
    """One step of a FlatAdam (hetrl/algos/nets.py) on gradients already in its buffer: the kernel
    of torch.optim.Adam(fused=True) on torch.optim.Adam's own state, without its Python bookkeeping."""
    if opt.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_([opt.param], opt.max_grad_norm)
    if not (opt.fused and available()):
        opt.opt.step()
        return
    g, st = opt.opt.param_groups[0], opt.opt.state[opt.param]
    if not st:
        st["step"] = torch.zeros((), dtype=torch.float32, device=opt.flat.device)
        st["exp_avg"] = torch.zeros_like(opt.flat)
        st["exp_avg_sq"] = torch.zeros_like(opt.flat)
    st["step"].add_(1)
    beta1, beta2 = g["betas"]
    torch._fused_adam_([opt.param], [opt.grad], [st["exp_avg"]], [st["exp_avg_sq"]], [], [st["step"]],
                       lr=g["lr"], beta1=beta1, beta2=beta2, weight_decay=g["weight_decay"], eps=g["eps"],
                       amsgrad=False, maximize=False, grad_scale=None, found_inf=None)


class MLPGrad:
    """Explicit forward/backward of a Linear-ReLU `mlp` (optionally ending in Tanh) for a loss given
    by its gradient w.r.t. the output. It computes what autograd computes without building a graph."""

    def __init__(self, net: nn.Sequential):
        layers = list(net)
        self.tanh = isinstance(layers[-1], nn.Tanh)
        if self.tanh:
            layers = layers[:-1]
        self.linears = [m for m in layers if isinstance(m, nn.Linear)]
        if not all(isinstance(m, (nn.Linear, nn.ReLU)) for m in layers) or len(layers) != 2 * len(self.linears) - 1:
            raise ValueError("MLPGrad needs a plain Linear-ReLU-...-Linear(-Tanh) stack")

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Output and what backward needs (the input of every layer, then the output)."""
        acts = [x]
        for i, lin in enumerate(self.linears):
            x = torch.addmm(lin.bias, x, lin.weight.t())
            if i < len(self.linears) - 1:
                x = x.relu_()
                acts.append(x)
        if self.tanh:
            x = x.tanh_()
        acts.append(x)
        return x, acts

    @torch.no_grad()
    def backward(self, acts: list[torch.Tensor], grad_out: torch.Tensor, params: bool = True,
                 input_grad: bool = False) -> torch.Tensor | None:
        """Write the parameter gradients (if `params`) of a loss whose gradient w.r.t. the output
        is `grad_out`; return its gradient w.r.t. the input if `input_grad`."""
        g = grad_out * (1.0 - acts[-1] * acts[-1]) if self.tanh else grad_out
        for i in range(len(self.linears) - 1, -1, -1):
            lin = self.linears[i]
            if params:
                torch.mm(g.t(), acts[i], out=lin.weight.grad)
                torch.sum(g, 0, out=lin.bias.grad)
            if i or input_grad:
                g = torch.mm(g, lin.weight)
                if i:  # ReLU's backward: autograd's own kernel (one pass, no boolean mask)
                    g = torch.ops.aten.threshold_backward(g, acts[i], 0)
        return g if input_grad else None


def for_algorithm(algo) -> dict | None:
    """The fast path's pieces for `algo` where it applies (plain MLPs on vector observations), else None:
    a CNN (pixel observations) always takes the public torch path."""
    if not available() or getattr(algo, "pixels", False):
        return None
    if algo.name == "dqn" and not algo.cfg.dueling and len(algo.obs_shape) == 1:
        return {"q": MLPGrad(algo.q.q)}
    if algo.name == "ddpg" and len(algo.obs_shape) == 1:
        return {"actor": MLPGrad(algo.actor.mu), "critic": MLPGrad(algo.critic.q)}
    return None


def dqn_step(algo, obs: torch.Tensor, action: torch.Tensor, target: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """DQN's loss mean(w * huber(Q(s, a) - target)) through its gradient: w * clip(td, -1, 1) / B."""
    net = algo.fast["q"]
    q_all, acts = net.forward(obs)  # (B, n_actions)
    td = q_all.gather(-1, action).squeeze(-1) - target
    grad_q = torch.zeros_like(q_all).scatter_(-1, action, (w * td.clamp(-1.0, 1.0) / obs.shape[0]).unsqueeze(-1))
    net.backward(acts, grad_q)
    adam_step(algo.opt)
    return td


def ddpg_step(algo, obs: torch.Tensor, action: torch.Tensor, target: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """DDPG's two losses through their gradients: d/dq mean(w * td^2) = 2 w td / B for the critic,
    and d/dmu of -mean(Q(s, mu(s))) through the critic's input gradient for the actor."""
    actor, critic = algo.fast["actor"], algo.fast["critic"]
    B = obs.shape[0]
    q, acts = critic.forward(torch.cat([obs, action], -1))
    td = q.squeeze(-1) - target
    critic.backward(acts, (2.0 / B * w * td).unsqueeze(-1))
    adam_step(algo.critic_opt)
    mu, actor_acts = actor.forward(obs)
    _, acts = critic.forward(torch.cat([obs, mu], -1))
    g = critic.backward(acts, torch.full((B, 1), -1.0 / B, device=obs.device), params=False, input_grad=True)
    actor.backward(actor_acts, g[:, obs.shape[1]:])
    adam_step(algo.actor_opt)
    return td
