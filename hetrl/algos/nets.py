"""Network building blocks shared by the algorithms.

`FlatAdam` keeps all parameters (and their gradients) of a module in one contiguous buffer,
so the fused Adam step and the gradient-norm clip are one kernel each instead of one per
tensor: on a 2x256 MLP this is ~20% of a CPU update (measured, see README).
"""

from __future__ import annotations

import torch
from torch import nn


def mlp(sizes: list[int], out_act: type[nn.Module] | None = None) -> nn.Sequential:
    """Linear-ReLU stack over `sizes` = [in, hidden..., out]; no activation after the last layer
    unless `out_act` is given."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    if out_act is not None:
        layers.append(out_act())
    return nn.Sequential(*layers)


class FlatAdam:
    """Adam over every parameter of `module`, stored in one flat buffer (create it after the
    module is on its device; the module's parameters become views of the buffer)."""

    def __init__(self, module: nn.Module, lr: float, max_grad_norm: float = 0.0, eps: float = 1e-8):
        params = self.params = list(module.parameters())
        numel = sum(p.numel() for p in params)
        ref = params[0]
        self.flat = torch.zeros(numel, dtype=ref.dtype, device=ref.device)
        self.grad = torch.zeros_like(self.flat)
        offset = 0
        for p in params:
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self.flat[offset:offset + n].view_as(p)
            p.grad = self.grad[offset:offset + n].view_as(p)   # backward accumulates in place
            offset += n
        self.param = nn.Parameter(self.flat)
        self.param.grad = self.grad
        self.max_grad_norm = max_grad_norm
        self.fused = ref.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
        self.opt = torch.optim.Adam([self.param], lr=lr, eps=eps, fused=self.fused)

    def step(self, loss: torch.Tensor | None = None) -> None:
        """Backpropagate `loss` into this module's gradients and take an Adam step; with no loss,
        step on gradients already written into the buffer (see MLPGrad)."""
        if loss is not None:
            self.grad.zero_()
            loss.backward(inputs=self.params)  # only this module's grads (not the critic's in an actor loss)
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([self.param], self.max_grad_norm)
        if not self.fused:
            self.opt.step()
            return
        # torch.optim.Adam(fused=True).step() without its Python bookkeeping (~0.2 ms of a 1.5 ms
        # DQN update on a CPU): the same kernel on the same state tensors, so results and
        # checkpoints (self.opt.state_dict()) are those of torch.optim.Adam
        g, st = self.opt.param_groups[0], self.opt.state[self.param]
        if not st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=self.flat.device)
            st["exp_avg"] = torch.zeros_like(self.flat)
            st["exp_avg_sq"] = torch.zeros_like(self.flat)
        st["step"].add_(1)
        beta1, beta2 = g["betas"]
        torch._fused_adam_([self.param], [self.grad], [st["exp_avg"]], [st["exp_avg_sq"]], [], [st["step"]],
                           lr=g["lr"], beta1=beta1, beta2=beta2, weight_decay=g["weight_decay"], eps=g["eps"],
                           amsgrad=False, maximize=False, grad_scale=None, found_inf=None)

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state)


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- tau * source + (1 - tau) * target  (tau = 1: hard copy)."""
    t = [p for p in target.parameters()]
    s = [p for p in source.parameters()]
    if tau >= 1.0:
        torch._foreach_copy_(t, s)
    else:
        torch._foreach_lerp_(t, s, tau)


class MLPGrad:
    """Explicit forward/backward of a Linear-ReLU `mlp` (optionally ending in Tanh) for a loss
    given by its gradient w.r.t. the output, writing parameter gradients straight into their
    (FlatAdam) buffers. It computes what autograd computes (tests compare them) without building
    a graph: on a small network most of autograd's time is per-op bookkeeping, not arithmetic."""

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
