"""Network building blocks shared by the algorithms (public torch APIs only).

Vector observations go through an MLP; images (a 3-D uint8 Box: stacked grayscale frames, or one
RGB frame channels-last) through the Nature CNN, which takes the uint8 pixels and scales them to
[0, 1] itself, so replay and transport keep one byte per pixel.

`FlatAdam` keeps all parameters (and their gradients) of a module in one contiguous buffer,
so the fused Adam step and the gradient-norm clip are one kernel each instead of one per
tensor (a fifth of a small MLP's CPU update). These are the pieces a user's algorithm is
written with too (docs/extending.md).
"""

from __future__ import annotations

import weakref

import numpy as np
import torch
from torch import nn

from hetrl.algorithm import is_image  # noqa: F401  (re-exported: where the networks are built)
from hetrl.errors import UsageError


class NatureCNN(nn.Module):
    """The DQN network's convolutions (Mnih et al. 2015; SB3's NatureCNN): 32 8x8 stride 4, 64 4x4
    stride 2, 64 3x3 stride 1, then Linear -> `features` (ReLU after each). Takes images of `shape`
    (channels first, or channels last when the last axis is the smallest) with any leading axes, as
    uint8 (or float) pixels in [0, 255], scaled to [0, 1] here."""

    def __init__(self, shape: tuple[int, ...], features: int = 512):
        super().__init__()
        shape = tuple(int(d) for d in shape)
        self.channels_last = int(np.argmin(shape)) == 2
        c, h, w = (shape[2], shape[0], shape[1]) if self.channels_last else shape
        self.cnn = nn.Sequential(nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                                 nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        if min(h, w) < 36:  # (((n - 8) // 4 + 1 - 4) // 2 + 1 - 3) + 1 >= 1
            raise UsageError(f"image observations of shape {shape} are too small for the Nature CNN (at least "
                             "36x36 pixels); raise atari_screen_size, or flatten them for an MLP")
        with torch.no_grad():
            n = self.cnn(torch.zeros(1, c, h, w)).shape[1]
        self.linear = nn.Sequential(nn.Linear(n, features), nn.ReLU())
        self.out_dim = features

    # On a CPU the convolutions (oneDNN) run on channels-last (NHWC) activations: a DQN update of the Nature
    # CNN at batch 32 is 1.17-1.23x faster than on NCHW (the first layer's forward + backward 2.6x) on this
    # project's 2-core x86 CPU (benchmarks/bench_cnn_layout.py, docs/atari.md). The math and the weights are the same:
    # only the memory layout of the input differs (tests/test_atari.py). GPUs keep torch's default.
    cpu_layout = torch.channels_last

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.movedim(-1, -3) if self.channels_last else obs
        lead = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:])
        if x.device.type == "cpu":  # the layout change on the uint8 pixels, before they become floats
            x = x.contiguous(memory_format=self.cpu_layout)
        x = self.cnn(x.float() / 255.0)   # float only inside the network
        return self.linear(x).reshape(*lead, self.out_dim)


LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0   # SAC's log_std clamp (as SB3)


ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


def mlp(sizes: list[int], activation: str = "relu", layer_norm: bool = False,
        out_act: type[nn.Module] | None = None, last_act: bool = False) -> nn.Sequential:
    """A stack of Linear layers over `sizes` = [in, hidden..., out]: after each but the last, a LayerNorm
    (`layer_norm`) and the `activation` (relu, tanh or elu; the config's settings of those names); the last
    Linear gets them too with `last_act` (a body that heads follow), then `out_act` if given (e.g. nn.Tanh)."""
    if activation not in ACTIVATIONS:
        raise UsageError(f"activation={activation!r} is not one of {', '.join(ACTIVATIONS)}; "
                         "e.g. --set activation=relu")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_act:
            if layer_norm:
                layers.append(nn.LayerNorm(b))
            layers.append(ACTIVATIONS[activation]())
    if out_act is not None:
        layers.append(out_act())
    return nn.Sequential(*layers)


def body(cfg, sizes: list[int], **kw) -> nn.Sequential:
    """mlp(sizes) with the config's activation and layer_norm."""
    return mlp(sizes, activation=cfg.activation, layer_norm=cfg.layer_norm, **kw)


class FlatState(dict):
    """A state dict whose tensors lie back to back, in its order, in one buffer: `flat` is that span (a 1-D view)
    and `sig` the names, shapes and dtypes, so that a copy between two of the same `sig` is one copy of `flat`
    (publishing a policy, loading it into an actor) instead of one per tensor."""

    flat: torch.Tensor | None = None
    sig: tuple = ()

    @staticmethod
    def signature(state: dict[str, torch.Tensor]) -> tuple:
        """The names, shapes and dtypes of `state` (a FlatState's own `sig`, kept)."""
        return getattr(state, "sig", None) or tuple((k, tuple(v.shape), v.dtype) for k, v in state.items())

    @classmethod
    def of(cls, state: dict[str, torch.Tensor]) -> FlatState:
        out = cls(state)
        out.sig = FlatState.signature(state)
        out.flat = _span(list(state.values()))
        return out

    def same(self) -> FlatState:
        """A new dict of the same tensors, span and sig."""
        out = FlatState(self)
        out.flat, out.sig = self.flat, self.sig
        return out

    def copy_from(self, state: dict[str, torch.Tensor]) -> None:
        """Copy `state` (the same names and shapes, in order) into these tensors: one copy where both are spans of
        the same layout."""
        src = getattr(state, "flat", None)
        if src is not None and self.flat is not None and FlatState.signature(state) == self.sig:
            self.flat.copy_(src)
            return
        for t, v in zip(self.values(), state.values()):
            t.copy_(v)


def _span(ts: list[torch.Tensor]) -> torch.Tensor | None:
    """The 1-D view of the one buffer that the tensors `ts` fill back to back in order, or None."""
    if not ts:
        return None
    t0 = ts[0]
    ptr, n = t0.data_ptr(), 0
    for t in ts:
        if (t.dtype != t0.dtype or t.device != t0.device or not t.is_contiguous()
                or t.data_ptr() != ptr + n * t.element_size()
                or t.untyped_storage().data_ptr() != t0.untyped_storage().data_ptr()):
            return None
        n += t.numel()
    return t0.detach().as_strided((n,), (1,), t0.storage_offset())


_LIVE: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, FlatState]]" = weakref.WeakKeyDictionary()


def live_state(module: nn.Module) -> FlatState:
    """module.state_dict() (the same names and detached views of its parameters and buffers, which follow the
    module as it learns), walked once per module and again only when one of its tensors was replaced or moved:
    a learner publishes its policy after every update, and state_dict()'s walk over the submodules cost more
    than the copy of a small policy's weights. A new dict each call (the caller may change it); a FlatState,
    whose `flat` spans the tensors where they lie back to back in one buffer (a FlatAdam's module)."""
    got = _LIVE.get(module)
    if got is not None and all(d.get(n) is t and (t is None or t.data_ptr() == ptr) for d, n, t, ptr in got[0]):
        return got[1].same()
    slots = tuple((d, n, t, 0 if t is None else t.data_ptr()) for m in module.modules()
                  for d in (m._parameters, m._buffers) for n, t in d.items())
    state = FlatState.of(module.state_dict())
    _LIVE[module] = (slots, state)
    return state.same()


class StackedNets:
    """The forward of networks of one type over their weights stacked (torch.func: the network's own forward,
    vmapped over them): `self(x)`, x of shape (M, N, ...), gives network m's output on rows x[m]."""

    def __init__(self, nets: list[nn.Module]):
        import copy

        from torch.func import functional_call, stack_module_state, vmap

        self.nets = nets
        self.params, self.buffers = stack_module_state(nets)
        base = copy.deepcopy(nets[0]).to("meta")
        self.call = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)))

    @classmethod
    def of(cls, nets: list) -> "StackedNets | None":
        """None where they do not stack (fewer than two, of different types, or torch.func refuses them)."""
        if len(nets) < 2 or not all(isinstance(n, nn.Module) and type(n) is type(nets[0]) for n in nets):
            return None
        try:
            return cls(nets)
        except Exception:   # a network torch.func cannot stack
            return None

    @torch.no_grad()
    def refresh(self, m: int) -> None:
        """Network m took new weights."""
        for name, t in self.nets[m].named_parameters():
            self.params[name][m].copy_(t)
        for name, t in self.nets[m].named_buffers():
            self.buffers[name][m].copy_(t)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor):
        return self.call(self.params, self.buffers, x)


@torch.no_grad()
def load_weights(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """module.load_state_dict(state), for the many loads of an actor's policy: the state of a twin module
    (same names and shapes) is copied without load_state_dict's walk over every submodule, in one copy where
    both lie in one buffer each (a published FlatState into a flattened network, as the compiled acting
    makes it); any other state goes through load_state_dict, which says what differs."""
    own = live_state(module)
    if FlatState.signature(state) != own.sig:
        module.load_state_dict(state)
        return
    own.copy_from(state)


@torch.no_grad()
def flatten(module: nn.Module) -> torch.Tensor:
    """Make every parameter of `module` a view of one contiguous buffer, and return the buffer:
    one kernel then updates them all (an Adam step, a gradient clip, a Polyak average)."""
    params = list(module.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.data.reshape(-1))
        p.data = flat[offset:offset + n].view_as(p)
        offset += n
    return flat


class FlatAdam:
    """Adam over every parameter of `module`, stored in one flat buffer (create it after the
    module is on its device; the module's parameters become views of the buffer); `betas` as
    torch.optim.Adam's."""

    def __init__(self, module: nn.Module, lr: float, max_grad_norm: float = 0.0, eps: float = 1e-8,
                 betas: tuple[float, float] = (0.9, 0.999)):
        params = self.params = list(module.parameters())
        ref = params[0]
        self.flat = flatten(module)
        self.grad = torch.zeros_like(self.flat)
        offset = 0
        for p in params:
            p.grad = self.grad[offset:offset + p.numel()].view_as(p)   # backward accumulates in place
            offset += p.numel()
        self.param = nn.Parameter(self.flat)
        self.param.grad = self.grad
        self.max_grad_norm = max_grad_norm
        self.fused = ref.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
        self.opt = torch.optim.Adam([self.param], lr=lr, betas=betas, eps=eps, fused=self.fused)

    def step(self, loss: torch.Tensor) -> None:
        """Backpropagate `loss` into this module's gradients and take an Adam step."""
        self.grad.zero_()
        loss.backward(inputs=self.params)  # only this module's grads (not the critic's in an actor loss)
        if self.max_grad_norm > 0:   # clip_grad_norm_'s formula, on the one flat gradient (without its per-tensor grouping)
            norm = torch.linalg.vector_norm(self.grad)
            self.grad.mul_(torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0))
        self.opt.step()

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        group = state["param_groups"][0]
        if len(group["params"]) > 1:  # a per-parameter torch.optim.Adam's state (TD3/SAC checkpoints before
            ids, per = group["params"], state["state"]  # their flat buffers): the same moments, concatenated
            flat = {k: torch.cat([per[i][k].reshape(-1) for i in ids]) for k in ("exp_avg", "exp_avg_sq")} if per else {}
            if per:
                flat["step"] = per[ids[0]]["step"]
            state = {"state": {0: flat} if per else {}, "param_groups": [{**group, "params": [0]}]}
        self.opt.load_state_dict(state)


@torch.no_grad()
def soft_update(target: nn.Module | torch.Tensor, source: nn.Module | torch.Tensor, tau: float) -> None:
    """target <- tau * source + (1 - tau) * target  (tau = 1: hard copy); modules, or the flat
    buffers of two networks of the same architecture (see `flatten`: one kernel)."""
    pairs = [(target, source)] if isinstance(target, torch.Tensor) else zip(target.parameters(), source.parameters())
    for t, s in pairs:
        if tau >= 1.0:
            t.copy_(s)
        else:
            t.lerp_(s, tau)
