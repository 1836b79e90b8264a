"""Adam, the gradient-norm clip and the Polyak average, once, for every head of the compiled kernel.

They work in place on the algorithm's own buffers: a FlatAdam's parameter and gradient buffers and
torch.optim.Adam's state (exp_avg, exp_avg_sq, step), so checkpoints, publishing and the public learn see one
state. The formulas are torch's: `clip_grad_norm_` (g *= min(1, max_norm / (||g|| + 1e-6))) and the fused CPU
Adam (lerp the first moment, bias-correct, w -= step_size m / (sqrt(v) / sqrt(bc2) + eps)); `Lanes*` run them
with the parameters split into fixed spans that the kernel's lanes take from a ticket counter, after summing the row
blocks' partial gradients in block order: the same bits on any number of lanes.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    import numba

    from hetrl.kernels.compiled.vm import atomic_add
except ImportError:  # pragma: no cover
    numba = None

SPAN = 8192      # parameters per span of a lanes' Adam step (at most MAX_SPANS spans), a function of the size only
MAX_SPANS = 16
BLOCK_ROWS = 16  # a row block's least rows
MAX_BLOCKS = 4   # row blocks per batch: few, so that the blocks' partial gradients cost little to sum


def blocks(B: int) -> int:
    """The row blocks a batch of B rows is split into: a function of B only (never of the lanes), so that the
    partial gradients, summed in block order, are the same bits on any number of lanes."""
    return max(1, min(MAX_BLOCKS, B // BLOCK_ROWS))


class AdamViews:
    """numpy views of a torch.optim.Adam's state over one flat parameter (made as its first step would make it),
    kept while its tensors are the same objects (a loaded checkpoint replaces them): making them each phase cost
    ~0.1 ms of a SAC step, with the caches a phase leaves cold."""

    def __init__(self, opt: torch.optim.Adam, param: torch.Tensor, flat: torch.Tensor, grad: torch.Tensor):
        self.opt, self.param, self.flat, self.grad = opt, param, flat, grad
        self._key: tuple = ()
        self._views: list[np.ndarray] = []

    @staticmethod
    def check(opt) -> str | None:
        """None where these are plain Adam's settings, else why not."""
        if type(opt) is not torch.optim.Adam or len(opt.param_groups) != 1:
            return f"a {type(opt).__name__} with {len(opt.param_groups)} groups, not torch's Adam over one buffer"
        g = opt.param_groups[0]
        for k in ("weight_decay", "amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay"):
            if g.get(k):
                return f"an Adam with {k}={g[k]}, which the compiled kernel does not implement"
        if isinstance(g["lr"], torch.Tensor):
            return "an Adam whose learning rate is a tensor"
        return None

    def get(self) -> tuple[list[np.ndarray], list[float]]:
        """[flat, grad, exp_avg, exp_avg_sq, step] as numpy views, and [lr, beta1, beta2, eps]."""
        st = self.opt.state[self.param]
        if not st:
            st["step"] = torch.zeros((), dtype=torch.float32)
            st["exp_avg"] = torch.zeros_like(self.flat)
            st["exp_avg_sq"] = torch.zeros_like(self.flat)
        key = (st["exp_avg"], st["exp_avg_sq"], st["step"])
        if len(self._key) != 3 or any(a is not b for a, b in zip(self._key, key)):
            self._views = [self.flat.detach().view(-1).numpy(), self.grad.view(-1).numpy(),
                           st["exp_avg"].view(-1).numpy(), st["exp_avg_sq"].view(-1).numpy(), st["step"].view(1).numpy()]
            self._key = key
        g = self.opt.param_groups[0]
        beta1, beta2 = g["betas"]
        return self._views, [float(g["lr"]), float(beta1), float(beta2), float(g["eps"])]


if numba is not None:
    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def sum_sq(x):  # pragma: no cover - compiled
        s = np.float32(0.0)
        for p in range(x.shape[0]):
            s += x[p] * x[p]
        return s

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def adam_consts(step, lr, beta1, beta2):  # pragma: no cover - compiled
        """Count the step; torch's fused CPU Adam's constants for it: (step_size, 1 - beta1, beta2, 1 - beta2,
        sqrt(bias correction 2))."""
        step[0] += 1
        t = np.float64(step[0])
        return (np.float32(lr / (1.0 - beta1 ** t)), np.float32(1.0 - beta1), np.float32(beta2),
                np.float32(1.0 - beta2), np.float32(np.sqrt(1.0 - beta2 ** t)))

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def adam_span(flat, grad, exp_avg, exp_avg_sq, lo, hi, coef, consts, eps):  # pragma: no cover - compiled
        """Adam on the parameters lo:hi, their gradients scaled by the clip's `coef`. The loop runs over views from
        0: an index from `lo` may be negative as far as numba knows, and its wrap-around check kept LLVM from
        vectorising (9x slower)."""
        step_size, b1, b2, ib2, bc2f = consts
        e = np.float32(eps)
        w, gr, ma, va = flat[lo:hi], grad[lo:hi], exp_avg[lo:hi], exp_avg_sq[lo:hi]
        for p in range(w.shape[0]):
            g = gr[p] * coef
            m = ma[p] + b1 * (g - ma[p])
            v = b2 * va[p] + ib2 * g * g
            ma[p] = m
            va[p] = v
            w[p] -= step_size * m / (np.sqrt(v) / bc2f + e)

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def clip_coef(sq, max_norm):  # pragma: no cover - compiled
        """clip_grad_norm_(max_norm)'s factor for a gradient of squared norm sq; 1 without a clip (max_norm 0)."""
        if max_norm > 0:
            return np.float32(min(1.0, max_norm / (np.sqrt(np.float64(sq)) + 1e-6)))
        return np.float32(1.0)

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def clip_adam(flat, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_norm):  # pragma: no cover
        """clip_grad_norm_(max_norm), then one Adam step, on one thread."""
        coef = clip_coef(sum_sq(grad), max_norm)
        adam_span(flat, grad, exp_avg, exp_avg_sq, 0, flat.shape[0], coef, adam_consts(step, lr, beta1, beta2), eps)

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _gather_span(grad, lanes, lo, hi):  # pragma: no cover - compiled
        """grad[lo:hi] += every row of `lanes` there (the other lanes' partial gradients; none where the lanes
        wrote disjoint parts of grad); returns the span's sum of squares."""
        g = grad[lo:hi]
        for r in range(lanes.shape[0]):
            src = lanes[r, lo:hi]
            for p in range(g.shape[0]):
                g[p] += src[p]
        return sum_sq(g)

    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def ticket(counter):  # pragma: no cover - compiled
        """The next task's number from a region's shared counter (work stealing: a lane takes tasks until none is
        left, so a lane whose core is taken by another process holds up only the task it is in)."""
        return atomic_add(counter, 0, 1)

    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def n_blocks(B):  # pragma: no cover - compiled
        """blocks(B), in compiled code."""
        return max(1, min(MAX_BLOCKS, B // BLOCK_ROWS))

    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def n_spans(n):  # pragma: no cover - compiled
        return max(1, min(MAX_SPANS, n // SPAN))

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def lanes_clip_adam(flat, grad, lanes, nl, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps,
                        max_norm):  # pragma: no cover - compiled
        """clip_adam on the sum of the row blocks' gradients (grad += lanes[0], lanes[1], ... in that order), the
        parameters split into fixed spans (n_spans: a function of the size only) that nl parallel lanes take from a
        ticket counter: each sums its span and its squares, then (after the one clip factor, the spans' squares
        summed in span order) steps its span. (The loops are in the fastmath helpers, which vectorise: a loop written
        in a prange body did not, 10x slower.)"""
        n = flat.shape[0]
        ns = n_spans(n)
        part = np.zeros(ns, np.float32)
        counter = np.zeros(2, np.int64)
        for c in numba.prange(nl):
            while True:
                s = ticket(counter[0:1])
                if s >= ns:
                    break
                part[s] = _gather_span(grad, lanes, s * n // ns, (s + 1) * n // ns)
        sq = np.float32(0.0)
        for s in range(ns):
            sq += part[s]
        coef = clip_coef(sq, max_norm)
        consts = adam_consts(step, lr, beta1, beta2)
        for c in numba.prange(nl):
            while True:
                s = ticket(counter[1:2])
                if s >= ns:
                    break
                adam_span(flat, grad, exp_avg, exp_avg_sq, s * n // ns, (s + 1) * n // ns, coef, consts, eps)

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def polyak(target, source, tau):  # pragma: no cover - compiled
        """target <- lerp(target, source, tau), as torch's lerp_ computes it: target + tau (source - target) for
        tau < 0.5, source - (source - target)(1 - tau) from 0.5 on (so tau = 1 copies)."""
        t = np.float32(tau)
        if tau < 0.5:
            for p in range(target.shape[0]):
                target[p] += t * (source[p] - target[p])
        else:
            u = np.float32(1.0) - t
            for p in range(target.shape[0]):
                target[p] = source[p] - (source[p] - target[p]) * u

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def lanes_polyak(target, source, tau, nl):  # pragma: no cover - compiled
        """polyak with the parameters in fixed spans taken by nl parallel lanes (elementwise: any split gives the
        same bits)."""
        n = target.shape[0]
        ns = n_spans(n)
        counter = np.zeros(1, np.int64)
        for c in numba.prange(nl):
            while True:
                s = ticket(counter)
                if s >= ns:
                    break
                polyak(target[s * n // ns:(s + 1) * n // ns], source[s * n // ns:(s + 1) * n // ns], tau)
