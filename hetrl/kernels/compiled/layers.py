"""Per-layer forward/backward pieces, and a network compiled once into a small integer program over them.

A `torch.nn.Sequential` of Linear, LayerNorm, ReLU, Tanh and ELU layers (any depth and widths; nested
Sequentials and Identity are taken too), or any ordered list of such layers and batch renormalisation
(`compile_layers`), becomes a `Program`: one row per op,

    [kind, in width, out width, weight offset, bias offset, activation, state offset]      (int64)
    [LayerNorm eps, ELU alpha]                                                              (float32)

where kind is LINEAR or NORM (LayerNorm over the last dimension: biased variance, elementwise affine, torch's
formulas) or ACT (an activation on its own) or BRN (batch renormalisation over the rows, CrossQ's
BatchRenorm), the offsets index the flat parameter buffer the parameters are views of (FlatAdam's, in torch's
`parameters()` order; -1: none), and an activation that follows a Linear or a LayerNorm is fused into it
(applied in the same pass as the bias). A BRN op's running statistics live in a float32 *state* array beside
the parameters, at its state offset (see `brn_state`). Generic loops interpret a program:

* `forward_with(ops, fc, flat, x, t, state, train)` runs it on the rows x, keeping in the tape `t` (carved by
  `tape`) what the backward needs: each op's output (ReLU's and Tanh's derivatives are read from it),
  LayerNorm's normalised input and 1/std per row, ELU's derivative, BRN's normalised input; `train` makes its
  BRN ops normalise by the batch's statistics (and update the running ones), else by the running ones;
* `backward_with(ops, flat, grad, x, t, gs, g, params, input_grad, state, train)` takes the loss's gradient g
  with respect to the output and writes the parameters' gradients into `grad` (same offsets as `flat`;
  overwritten, not accumulated) and/or returns the gradient with respect to the input;
* `forward` and `backward` are those two for programs without BRN ops.

Matrix products go through `sgemm.dot` (the bound GEMM, one thread). Each piece is checked against autograd
(tests/test_kernel_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hetrl.kernels.compiled import sgemm

try:
    import numba
except ImportError:  # pragma: no cover - the kernel's check() reports it
    numba = None

LINEAR, NORM, ACT, BRN = 0, 1, 2, 3
NONE, RELU, TANH, ELU = 0, 1, 2, 3
ACTIVATIONS = {nn.ReLU: RELU, nn.Tanh: TANH, nn.ELU: ELU}
COLS = 7   # kind, fi, fo, weight offset, bias offset, activation, state offset

# A BRN op's floats in the state array, from its state offset: a header [passes, warm-up passes, momentum,
# r_max, d_max, eps, -, -], then running mean, running variance, and the last training pass's r, d and
# 1 / sqrt(var_B + eps) (what its backward reads), F each. The pass count is a float32: exact to 2**24.
BRN_HEAD = 8


def brn_state(features: int) -> int:
    """Floats of the state array one BRN op of `features` features takes."""
    return BRN_HEAD + 5 * features


@dataclass(frozen=True)
class Program:
    """A network as the compiled pieces run it: `ops` (n, 6) int64 and `fc` (n, 2) float32 (see the module's
    docstring); `n_in` / `n_out` its input and output widths; its `count` parameters at offsets lo:hi of its flat
    buffer."""

    ops: np.ndarray
    fc: np.ndarray
    n_in: int
    n_out: int
    lo: int
    hi: int
    count: int = 0

    def shifted(self, by: int) -> Program:
        """The same network with its parameters `by` floats further into the buffer."""
        ops = self.ops.copy()
        for c in (3, 4):
            ops[:, c] = np.where(ops[:, c] >= 0, ops[:, c] + by, -1)
        return Program(ops, self.fc, self.n_in, self.n_out, self.lo + by, self.hi + by, self.count)

    def floats(self, rows: int, grads: bool = True) -> int:
        """Floats of workspace that `tape` (and, with grads, `grad_buffers`) carve for `rows` rows."""
        kind, fi, fo, act = self.ops[:, 0], self.ops[:, 1], self.ops[:, 2], self.ops[:, 5]
        per_row = (fo.sum() + np.where(kind == NORM, fo + 1, 0).sum() + np.where(kind == BRN, fo, 0).sum()
                   + np.where(act == ELU, fo, 0).sum())
        if grads:
            per_row += np.where(kind == LINEAR, fi, 0).sum()
        return int(rows * per_row)


class Declined(Exception):
    """A network the compiled pieces cannot run; the message is the one line that says which layer and why."""


def param_offsets(flat: torch.Tensor) -> Callable[[torch.Tensor], int]:
    """offset(p): where the parameter p (a view of `flat`) starts in it; raises Declined otherwise."""
    base, n = flat.data_ptr(), flat.numel()

    def offset(p: torch.Tensor) -> int:
        d = p.data_ptr() - base
        if (p.dtype != torch.float32 or not p.is_contiguous() or d % 4 or not 0 <= d // 4 <= n - p.numel()
                or p.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()):
            raise Declined("is not a view of its optimizer's flat float32 buffer")
        return d // 4
    return offset


def order_offsets(module: nn.Module) -> Callable[[torch.Tensor], int]:
    """offset(p) in the buffer `nets.flatten(module)` makes: parameters() order, each one contiguous."""
    at, o = {}, 0
    for p in module.parameters():
        at[id(p)] = o
        o += p.numel()
    return lambda p: at[id(p)]


def _layers(seq: nn.Sequential, prefix: str = ""):
    for name, m in seq.named_children():
        if type(m) is nn.Sequential:
            yield from _layers(m, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", m


def compile_program(seq: nn.Module, offset: Callable[[torch.Tensor], int], what: str) -> Program:
    """`seq` (an nn.Sequential) as a Program whose offsets `offset(param)` gives; raises Declined with one line
    naming `what` ("the critic") and the layer it cannot take."""
    if type(seq) is not nn.Sequential:
        raise Declined(f"{what} is a {type(seq).__name__}, not an nn.Sequential of layers the compiled kernel has "
                       "pieces for")
    return compile_layers(_layers(seq), offset, what)


def compile_layers(layers, offset: Callable[[torch.Tensor], int], what: str,
                   state_of: Callable[[nn.Module], int] | None = None) -> Program:
    """The ordered (name, module) `layers` of a network as a Program (see compile_program); a batch
    renormalisation layer (CrossQ's BatchRenorm) takes its state offset from `state_of(module)` (None: declined,
    the caller keeps no running statistics)."""
    rows: list[list[int]] = []
    consts: list[list[float]] = []
    width = None
    params: list[tuple[int, int]] = []

    def off(p, name):
        if p is None:
            return -1
        try:
            o = offset(p)
        except Declined as e:
            raise Declined(f"{what}'s layer {name}: its parameter {e}") from None
        params.append((o, o + p.numel()))
        return o

    for name, m in layers:
        t = type(m)
        if t is nn.Identity:
            continue
        if t is nn.Linear:
            if width is not None and m.in_features != width:
                raise Declined(f"{what}'s layer {name} takes {m.in_features} features but gets {width}")
            rows.append([LINEAR, m.in_features, m.out_features, off(m.weight, name), off(m.bias, name), NONE, -1])
            consts.append([0.0, 1.0])
            width = m.out_features
        elif t is nn.LayerNorm:
            shape = tuple(m.normalized_shape)
            if len(shape) != 1 or (width is not None and shape[0] != width):
                raise Declined(f"{what}'s layer {name} is a LayerNorm over {shape}, which the compiled kernel takes "
                               "only over the last dimension of a layer's output")
            width = shape[0]
            rows.append([NORM, width, width, off(m.weight, name), off(getattr(m, "bias", None), name), NONE, -1])
            consts.append([float(m.eps), 1.0])
        elif t in ACTIVATIONS:
            act = ACTIVATIONS[t]
            alpha = float(m.alpha) if t is nn.ELU else 1.0
            if rows and rows[-1][5] == NONE and rows[-1][0] in (LINEAR, NORM):
                rows[-1][5] = act
                consts[-1][1] = alpha
            else:
                w = -1 if width is None else width
                rows.append([ACT, w, w, -1, -1, act, -1])
                consts.append([0.0, alpha])
        elif t.__name__ == "BatchRenorm" and t.__module__.startswith("hetrl."):
            n = m.weight.numel()
            if state_of is None:
                raise Declined(f"{what}'s layer {name} is a batch renormalisation, whose running statistics only a "
                               "loss head that keeps them can run")
            if width is not None and n != width:
                raise Declined(f"{what}'s layer {name} normalises {n} features but gets {width}")
            width = n
            rows.append([BRN, n, n, off(m.weight, name), off(m.bias, name), NONE, state_of(m)])
            consts.append([float(m.eps), 1.0])
        else:
            raise Declined(f"{what}'s layer {name} is a{'n' if t.__name__[0] in 'AEIOU' else ''} {t.__name__}, "
                           "which the compiled kernel has no piece for")
    if width is None or not any(r[0] != ACT for r in rows):
        raise Declined(f"{what} has no Linear or LayerNorm layer for the compiled kernel to run")
    nxt = width
    for r in reversed(rows):   # activations before the first layer with a width: that layer's input width
        if r[1] < 0:
            r[1] = r[2] = nxt
        nxt = r[1]
    ops = np.array(rows, np.int64).reshape(-1, COLS)
    lo = min((a for a, _ in params), default=0)
    hi = max((b for _, b in params), default=0)
    return Program(ops, np.array(consts, np.float32).reshape(-1, 2), int(ops[0, 1]), int(width), lo, hi,
                   sum(b - a for a, b in params))


# a forward pass of at most this many rows multiplies in its own loops instead of calling the GEMM (acting)
FEW_ROWS = 4

# ---- the compiled pieces ------------------------------------------------------------------------------
if numba is not None:
    dot, gemm = sgemm.dot, sgemm.gemm

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def mat(ws, pos, r, c):  # pragma: no cover - compiled
        """The next (r, c) float32 matrix carved from the workspace `ws` (pos[0]: its first free float). The
        kernel's scratch comes from workspaces kept across calls: fresh buffers of a few 100 KB each call were
        fresh pages (~1,200 page faults per SAC step)."""
        n = r * c
        if pos[0] + n > ws.shape[0]:
            raise ValueError("compiled kernel: workspace too small")
        out = ws[pos[0]:pos[0] + n].reshape((r, c))
        pos[0] += n
        return out

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _slot(ops, s):  # pragma: no cover - compiled
        """Columns of tape slot s: 3 per op (its output; LayerNorm's x-hat and 1/std, BRN's x-hat; ELU's
        derivative)."""
        i, part = s // 3, s % 3
        fo = ops[i, 2]
        if part == 0:
            return fo
        if part == 1:
            return fo + 1 if ops[i, 0] == NORM else (fo if ops[i, 0] == BRN else 0)
        return fo if ops[i, 5] == ELU else 0

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def tape(ws, pos, ops, R):  # pragma: no cover - compiled
        """The matrices a forward pass of R rows keeps for its backward (3 per op, see _slot)."""
        return [mat(ws, pos, R, _slot(ops, s)) for s in range(3 * ops.shape[0])]

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def grad_buffers(ws, pos, ops, R):  # pragma: no cover - compiled
        """A backward pass's input-gradient matrices: (R, in width) for a Linear op (the others work in place)."""
        return [mat(ws, pos, R, ops[i, 1] if ops[i, 0] == LINEAR else 0) for i in range(ops.shape[0])]

    # -- activations --
    # tanh and exp are computed here, in float64 arithmetic that LLVM vectorises, rather than by libm's scalar
    # tanhf / expf (numba's np.tanh): a Tanh network's update ran 3.5x slower than a ReLU one's on those calls, and
    # tanhf is off by up to 2 ulp where this rounds correctly (torch's vectorised tanh is within 1 ulp)
    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def exp_neg(y):  # pragma: no cover - compiled
        """exp(y) for a float64 y <= 0 (below -88: exp(-88), under float32's smallest normal): a degree-9 Taylor
        polynomial at y / 256 (|y / 256| < 0.35: a relative error under 1e-11), squared 8 times."""
        z = max(y, -88.0) * (1.0 / 256.0)
        p = 1.0 + z * (1.0 + z * (1.0 / 2 + z * (1.0 / 6 + z * (1.0 / 24 + z * (1.0 / 120 + z * (
            1.0 / 720 + z * (1.0 / 5040 + z * (1.0 / 40320 + z * (1.0 / 362880)))))))))
        for _ in range(8):
            p = p * p
        return p

    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def tanh32(x):  # pragma: no cover - compiled
        """tanh of a float32, correctly rounded: (1 - e) / (1 + e) with e = exp(-2|x|) in float64 (|x| clamped to
        9, where tanh is 1 in float32), x itself below 1e-4 (where tanh(x) = x to float32's precision)."""
        a = min(abs(np.float64(x)), 9.0)
        e = exp_neg(-2.0 * a)
        t = (1.0 - e) / (1.0 + e)
        return np.float32(np.float64(x) if a < 1e-4 else (t if x >= 0 else -t))

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _bias_act(a, flat, bo, act, alpha, d):  # pragma: no cover - compiled
        """a = act(a + b) in one pass (b = flat[bo:], none where bo < 0); ELU also writes its derivative into d.
        Each case is its own loop, branch-free where it can be, so that LLVM vectorises it."""
        R, F = a.shape
        zero = np.float32(0.0)
        b = flat[bo:bo + F] if bo >= 0 else np.zeros(F, np.float32)
        if act == RELU:
            for i in range(R):
                for j in range(F):
                    v = a[i, j] + b[j]
                    a[i, j] = v if v > zero else zero
        elif act == TANH:
            for i in range(R):
                for j in range(F):
                    a[i, j] = tanh32(a[i, j] + b[j])
        elif act == ELU:   # alpha (exp(v) - 1) for v <= 0, and the derivative alpha exp(v)
            al = np.float64(alpha)
            for i in range(R):
                for j in range(F):
                    v = a[i, j] + b[j]
                    e = exp_neg(min(np.float64(v), 0.0))
                    a[i, j] = v if v > zero else np.float32(al * (e - 1.0))
                    d[i, j] = np.float32(1.0) if v > zero else np.float32(al * e)
        elif bo >= 0:
            for i in range(R):
                for j in range(F):
                    a[i, j] += b[j]

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _act_grad(g, y, d, act):  # pragma: no cover - compiled
        """g *= act'(.) in place: ReLU from its output y (y > 0; torch's threshold_backward), Tanh from y
        (1 - y^2), ELU from the derivative its forward kept in d."""
        R, F = g.shape
        zero, one = np.float32(0.0), np.float32(1.0)
        if act == RELU:   # written branch-free: a conditional store does not vectorise (5x slower)
            for i in range(R):
                for j in range(F):
                    g[i, j] = g[i, j] if y[i, j] > zero else zero
        elif act == TANH:
            for i in range(R):
                for j in range(F):
                    g[i, j] *= one - y[i, j] * y[i, j]
        elif act == ELU:
            for i in range(R):
                for j in range(F):
                    g[i, j] *= d[i, j]

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _act_grad_colsum(g, y, d, act, db):  # pragma: no cover - compiled
        """_act_grad, and db = the column sums of the result (the bias's gradient), in one pass."""
        R, F = g.shape
        zero, one = np.float32(0.0), np.float32(1.0)
        db[:] = zero
        if act == RELU:
            for i in range(R):
                for j in range(F):
                    v = g[i, j] if y[i, j] > zero else zero
                    g[i, j] = v
                    db[j] += v
        elif act == TANH:
            for i in range(R):
                for j in range(F):
                    v = g[i, j] * (one - y[i, j] * y[i, j])
                    g[i, j] = v
                    db[j] += v
        elif act == ELU:
            for i in range(R):
                for j in range(F):
                    v = g[i, j] * d[i, j]
                    g[i, j] = v
                    db[j] += v
        else:
            for i in range(R):
                for j in range(F):
                    db[j] += g[i, j]

    # -- LayerNorm --
    # LayerNorm's row sums may be reassociated (the float64 sums vectorise; no other fast-math assumption)
    @numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
    def _norm_fwd(x, out, st, d, flat, wo, bo, eps, act, alpha):  # pragma: no cover - compiled
        """out = act(x-hat * gamma + beta) per row, x-hat = (x - mean) / sqrt(var + eps) (biased variance);
        st[:, :F] = x-hat and st[:, F] = 1 / sqrt(var + eps), for the backward."""
        R, F = out.shape
        for i in range(R):
            m = 0.0
            for j in range(F):
                m += x[i, j]
            m /= F
            v = 0.0
            for j in range(F):
                e = x[i, j] - m
                v += e * e
            v /= F
            r = 1.0 / np.sqrt(v + eps)
            st[i, F] = np.float32(r)
            for j in range(F):
                st[i, j] = np.float32((x[i, j] - m) * r)
        for i in range(R):
            for j in range(F):
                out[i, j] = st[i, j]
        if wo >= 0:
            w = flat[wo:wo + F]
            for i in range(R):
                for j in range(F):
                    out[i, j] *= w[j]
        _bias_act(out, flat, bo, act, alpha, d)

    @numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
    def _norm_bwd(g, st, flat, grad, wo, bo, params):  # pragma: no cover - compiled
        """LayerNorm's backward in place: g (the gradient w.r.t. its output, after the activation's) becomes the
        gradient w.r.t. its input; with `params`, gamma's and beta's gradients into grad[wo:], grad[bo:]."""
        R, F = g.shape
        if params and wo >= 0:
            dw = grad[wo:wo + F]
            dw[:] = 0
            for i in range(R):
                for j in range(F):
                    dw[j] += g[i, j] * st[i, j]
        if params and bo >= 0:
            db = grad[bo:bo + F]
            db[:] = 0
            for i in range(R):
                for j in range(F):
                    db[j] += g[i, j]
        if wo >= 0:
            w = flat[wo:wo + F]
            for i in range(R):
                for j in range(F):
                    g[i, j] *= w[j]
        for i in range(R):   # dx = (dx-hat - mean(dx-hat) - x-hat mean(dx-hat x-hat)) / std
            s1 = 0.0
            s2 = 0.0
            for j in range(F):
                s1 += g[i, j]
                s2 += g[i, j] * st[i, j]
            s1 /= F
            s2 /= F
            r = st[i, F]
            for j in range(F):
                g[i, j] = np.float32((g[i, j] - s1 - st[i, j] * s2) * r)


    # -- batch renormalisation (CrossQ's BatchRenorm, hetrl/algos/crossq.py: the formulas are in its docstring) --
    # (The row loops below read per-feature coefficients from arrays made here, not from the state or parameter
    # buffers: LLVM vectorises a loop only where it can check that its arrays do not overlap, and gives up on
    # more than a few; reading the buffers there made a pass over 512 x 256 five times slower.)
    @numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
    def _brn_fwd(x, out, xh, flat, wo, bo, state, so, train):  # pragma: no cover - compiled
        """out = gamma (x-hat r + d) + beta over the rows of x; x-hat into xh. Training: x-hat by the batch's mean
        and biased variance, r and d from the running statistics (1 and 0 for the warm-up passes), then the
        running statistics lerped toward the batch's and the pass counted; r, d, 1/sigma_B kept for the backward.
        Evaluation: x-hat by the running statistics, r = 1, d = 0."""
        R, F = out.shape
        w, b = flat[wo:wo + F], flat[bo:bo + F]
        h = so + BRN_HEAD
        rm, rv = state[h:h + F], state[h + F:h + 2 * F]
        rr, dd, isb = state[h + 2 * F:h + 3 * F], state[h + 3 * F:h + 4 * F], state[h + 4 * F:h + 5 * F]
        eps = state[so + 5]
        mu, inv, scale, shift = (np.empty(F, np.float32), np.empty(F, np.float32), np.empty(F, np.float32),
                                 np.empty(F, np.float32))
        if not train:
            for j in range(F):
                mu[j] = rm[j]
                inv[j] = np.float32(1.0) / np.sqrt(rv[j] + eps)
                scale[j], shift[j] = w[j], b[j]
        else:
            mean, var = np.zeros(F), np.zeros(F)
            for i in range(R):
                for j in range(F):
                    mean[j] += x[i, j]
            for j in range(F):
                mean[j] /= R
            for i in range(R):
                for j in range(F):
                    e = x[i, j] - mean[j]
                    var[j] += e * e
            warm = state[so] >= state[so + 1]
            mom = np.float32(1.0) - state[so + 2]
            r_max, d_max = state[so + 3], state[so + 4]
            for j in range(F):
                m32, v32 = np.float32(mean[j]), np.float32(var[j] / R)
                sigma = np.sqrt(rv[j] + eps)
                if warm:
                    rr[j] = min(max(np.sqrt(v32 + eps) / sigma, np.float32(1.0) / r_max), r_max)
                    dd[j] = min(max((m32 - rm[j]) / sigma, -d_max), d_max)
                else:
                    rr[j], dd[j] = np.float32(1.0), np.float32(0.0)
                isb[j] = np.float32(1.0) / np.sqrt(v32 + eps)
                rm[j] += mom * (m32 - rm[j])      # lerp_(batch, 1 - momentum), as torch's (weight < 0.5)
                rv[j] += mom * (v32 - rv[j])
                mu[j], inv[j] = m32, isb[j]
                scale[j], shift[j] = w[j] * rr[j], b[j] + w[j] * dd[j]
            state[so] += 1
        for i in range(R):
            for j in range(F):
                v = (x[i, j] - mu[j]) * inv[j]
                xh[i, j] = v
                out[i, j] = v * scale[j] + shift[j]

    @numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
    def _brn_bwd(g, xh, flat, grad, wo, bo, params, state, so, train):  # pragma: no cover - compiled
        """BRN's backward in place: g (the gradient w.r.t. its output) becomes the gradient w.r.t. its input (r, d
        constants, as the eager loss treats them); with `params`, gamma's and beta's gradients into grad[wo:],
        grad[bo:]. A training pass's backward reads the r, d, 1/sigma_B its forward kept: no other training pass
        of the layer may come between the two."""
        R, F = g.shape
        w = flat[wo:wo + F]
        h = so + BRN_HEAD
        rr, dd, isb = state[h + 2 * F:h + 3 * F], state[h + 3 * F:h + 4 * F], state[h + 4 * F:h + 5 * F]
        s1, s2, coef = np.zeros(F, np.float32), np.zeros(F, np.float32), np.empty(F, np.float32)
        for i in range(R):
            for j in range(F):
                s1[j] += g[i, j]
                s2[j] += g[i, j] * xh[i, j]
        if params:
            dw, db = grad[wo:wo + F], grad[bo:bo + F]
            for j in range(F):
                dw[j] = s2[j] * rr[j] + s1[j] * dd[j] if train else s2[j]
                db[j] = s1[j]
        if not train:   # (the running statistics have not moved since the forward: no pass between the two)
            for j in range(F):
                coef[j] = w[j] / np.sqrt(state[h + F + j] + state[so + 5])
            for i in range(R):
                for j in range(F):
                    g[i, j] *= coef[j]
            return
        for j in range(F):   # dx = gamma r / sigma_B (dx-hat - mean(dx-hat) - x-hat mean(dx-hat x-hat))
            s1[j] /= R
            s2[j] /= R
            coef[j] = w[j] * rr[j] * isb[j]
        for i in range(R):
            for j in range(F):
                g[i, j] = coef[j] * (g[i, j] - s1[j] - xh[i, j] * s2[j])

    @numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
    def _few_rows(x, w, out):  # pragma: no cover - compiled
        """out = x @ w.T for a few rows x (acting on a handful of envs): a dot product per output, in
        vectorised loops: a GEMM call's fixed cost (OpenBLAS's above all) is larger than such a product."""
        for r in range(x.shape[0]):
            for j in range(w.shape[0]):
                acc = np.float32(0.0)
                for i in range(w.shape[1]):
                    acc += x[r, i] * w[j, i]
                out[r, j] = acc

    # -- the interpreter --
    # (one loop each way, without a function per op: numba links every callee's code into each caller and
    # optimises it again there, so each level of calls costs compile time)
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def forward_with(ops, fc, flat, x, t, state, train):  # pragma: no cover - compiled
        """Run the program on the rows x (R, n_in); every op's output in the tape t (tape(ws, pos, ops, R)),
        the network's (returned) in t[3 * (n - 1)]; BRN ops in training mode where `train` (their running
        statistics in `state`)."""
        xin = x
        for i in range(ops.shape[0]):
            kind, fi, fo, wo, bo, act = ops[i, 0], ops[i, 1], ops[i, 2], ops[i, 3], ops[i, 4], ops[i, 5]
            out = t[3 * i]
            if kind == LINEAR:
                if xin.shape[0] <= FEW_ROWS:
                    _few_rows(xin, flat[wo:wo + fo * fi].reshape((fo, fi)), out)
                else:
                    gemm(xin, flat[wo:wo + fo * fi].reshape((fo, fi)).T, out, np.float32(0.0))
                _bias_act(out, flat, bo, act, fc[i, 1], t[3 * i + 2])
            elif kind == NORM:
                _norm_fwd(xin, out, t[3 * i + 1], t[3 * i + 2], flat, wo, bo, fc[i, 0], act, fc[i, 1])
            elif kind == BRN:
                _brn_fwd(xin, out, t[3 * i + 1], flat, wo, bo, state, ops[i, 6], train)
            else:
                out[:, :] = xin
                _bias_act(out, flat, bo, act, fc[i, 1], t[3 * i + 2])
            xin = out
        return xin

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def forward(ops, fc, flat, x, t):  # pragma: no cover - compiled
        """forward_with for a program without BRN ops."""
        return forward_with(ops, fc, flat, x, t, flat, False)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def backward_with(ops, flat, grad, x, t, gs, g, params, input_grad, state, train):  # pragma: no cover
        """The backward of forward_with(ops, fc, flat, x, t, state, train) for a loss whose gradient w.r.t. the
        network's output is g (a workspace matrix, overwritten): the parameters' gradients written into `grad`
        (same offsets as `flat`) if `params`; returns the gradient w.r.t. the input x if `input_grad` (gs:
        grad_buffers)."""
        zero = np.float32(0.0)
        for i in range(ops.shape[0] - 1, -1, -1):
            kind, fi, fo, wo, bo, act = ops[i, 0], ops[i, 1], ops[i, 2], ops[i, 3], ops[i, 4], ops[i, 5]
            y, d = t[3 * i], t[3 * i + 2]
            if kind == LINEAR:
                if params and bo >= 0:
                    _act_grad_colsum(g, y, d, act, grad[bo:bo + fo])
                else:
                    _act_grad(g, y, d, act)
                if params:
                    gemm(g.T, x if i == 0 else t[3 * i - 3], grad[wo:wo + fo * fi].reshape((fo, fi)), zero)
                if i > 0 or input_grad:
                    gp = gs[i]
                    gemm(g, flat[wo:wo + fo * fi].reshape((fo, fi)), gp, zero)
                    g = gp
            elif kind == BRN:
                _brn_bwd(g, t[3 * i + 1], flat, grad, wo, bo, params, state, ops[i, 6], train)
            else:
                _act_grad(g, y, d, act)
                if kind == NORM:
                    _norm_bwd(g, t[3 * i + 1], flat, grad, wo, bo, params)
        return g

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def backward(ops, flat, grad, x, t, gs, g, params, input_grad):  # pragma: no cover - compiled
        """backward_with for a program without BRN ops."""
        return backward_with(ops, flat, grad, x, t, gs, g, params, input_grad, flat, False)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def run(ops, fc, flat, x, ws, out):  # pragma: no cover - compiled
        """out = the program's output on x, its scratch carved from ws (acting, tests)."""
        pos = np.zeros(1, np.int64)
        out[:, :] = forward(ops, fc, flat, x, tape(ws, pos, ops, x.shape[0]))

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def value_and_grads(ops, fc, flat, grad, x, g, ws, out, gin, state, train):  # pragma: no cover - compiled
        """out = the program's output on x; for the loss sum(out * g): the parameters' gradients into grad and the
        input's into gin (one forward and one backward, as the heads run them; BRN ops' statistics in `state`,
        in training mode where `train`)."""
        R = x.shape[0]
        pos = np.zeros(1, np.int64)
        t = tape(ws, pos, ops, R)
        gs = grad_buffers(ws, pos, ops, R)
        gg = mat(ws, pos, R, g.shape[1])
        gg[:, :] = g
        out[:, :] = forward_with(ops, fc, flat, x, t, state, train)
        gin[:, :] = backward_with(ops, flat, grad, x, t, gs, gg, True, True, state, train)
