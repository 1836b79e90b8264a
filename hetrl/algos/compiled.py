"""The learner's optional compiled CPU phase: all K gradient steps of one phase in one native call.

The losses are written once, in hetrl/algos/dqn.py, ddpg.py, td3.py and sac.py (autograd and
`torch.optim.Adam(fused=True)`): that is the reference. On a CPU, one update of a small MLP costs
~1.4 ms in torch eager, of which the arithmetic (three 64x256x256 matrix products) is ~0.3 ms at
this CPU's single-thread BLAS speed; the rest is per-op dispatch and Python. This module runs the
same K updates of a phase as one numba-compiled loop (nogil) whose matrix products are BLAS calls,
so a phase pays one call's overhead instead of ~40-200 ops x K:

* DQN (`_dqn_mlp_phase`): the targets (one pass of the fixed target network over all K batches, or
  the online argmax per step for double DQN), forward, the Huber loss's gradient, backward,
  gradient-norm clip, Adam;
* DDPG and TD3 (`_ac_phase`): the (twin-min, smoothed) target, the critics' squared error, the
  delayed actor step through the critic's input gradient, the Polyak targets;
* SAC (`_sac_phase`): the squashed-Gaussian actor and its log-prob, the entropy coefficient's Adam
  step, the soft twin-min target, the critics, the actor loss through min(Q1, Q2) and the tanh
  correction, the Polyak targets; the Gaussian noise comes from torch's RNG, drawn in the eager
  path's order, so both paths see the same numbers.

It applies to these algorithms with their plain Linear-ReLU networks on vector observations (not
dueling, not pixels) on a CPU learner, and works on the same buffers as the eager path: the FlatAdam
parameter and gradient buffers, the flat target buffers and torch.optim.Adam's own state (exp_avg,
exp_avg_sq, step), so checkpoints, publishing and a switch back to eager see one state. Adam and the
clip follow torch's formulas (`_fused_adam_` on CPU, `clip_grad_norm_`); tests/test_compiled.py
checks TD errors, parameters, targets and Adam moments equal to the eager path's within float
tolerance. It is chosen by `Config.compiled`, which the planner's profile sets where it measures this
kernel the fastest of public / fast / compiled.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from hetrl.algos import sgemm
from hetrl.algos.nets import LOG_STD_MAX, LOG_STD_MIN

try:  # numba is a dependency
    import numba
except ImportError:  # pragma: no cover - reported by available()
    numba = None


def available() -> bool:
    """Whether numba, and scipy (whose OpenBLAS is one of the GEMMs sgemm.py chooses from), are importable here."""
    if numba is None:
        return False
    try:
        import scipy.linalg.cython_blas  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


def _sizes(seq: nn.Sequential, last: type[nn.Module] | None) -> np.ndarray | None:
    """[in, h1, ..., out] of a Linear-ReLU-...-Linear stack ending in `last` (an activation, or None),
    or None for any other structure (which then keeps the eager path)."""
    layers = list(seq)
    if last is not None:
        if not layers or not isinstance(layers[-1], last):
            return None
        layers = layers[:-1]
    lin = layers[0::2]
    if (not layers or len(layers) % 2 == 0 or not all(isinstance(m, nn.Linear) for m in lin)
            or not all(type(m) is nn.ReLU for m in layers[1::2])):
        return None
    return np.array([lin[0].in_features] + [m.out_features for m in lin], np.int64)


def _policy_sizes(net: nn.Module, kind: str) -> np.ndarray | None:
    """The sizes of a policy network as the compiled code takes it: a DQN QNetwork ("q": its MLP, not dueling,
    not pixels), a DDPG/TD3 Actor ("mu": its tanh MLP) or a SAC GaussianActor ("sac": its ReLU body, with
    Linear mean and log_std heads); None where it does not apply."""
    if kind == "q":
        return None if net.pixels or net.dueling else _sizes(net.q, None)
    if kind == "mu":
        return _sizes(net.mu, nn.Tanh)
    heads = all(type(getattr(net, n)) is nn.Linear for n in ("mean", "log_std"))
    return _sizes(net.body, nn.ReLU) if heads else None


def _nets(algo) -> dict | None:
    """The sizes of `algo`'s networks as the compiled phases take them, or None where they do not apply."""
    if algo.name == "dqn":
        sizes = _policy_sizes(algo.q, "q")
        return None if sizes is None else {"q": sizes}
    if algo.name in ("ddpg", "td3", "sac"):
        critic = algo.critic if algo.name == "ddpg" else algo.critics[0]
        actor = _policy_sizes(algo.actor, "sac" if algo.name == "sac" else "mu")
        critic = _sizes(critic.q, None)
        return None if actor is None or critic is None else {"actor": actor, "critic": critic}
    return None


def applies(algo) -> bool:
    """Whether `algo` has a compiled phase: DQN (plain MLP, not dueling), DDPG, TD3 or SAC (their MLPs),
    on vector observations, on a CPU learner, in float32."""
    if not available() or getattr(algo, "pixels", False) or len(algo.obs_shape) != 1 or algo.device.type != "cpu":
        return False
    opts = [algo.opt] if algo.name == "dqn" else [getattr(algo, "actor_opt", None), getattr(algo, "critic_opt", None)]
    if not all(hasattr(o, "flat") and o.flat.dtype == torch.float32 for o in opts):
        return False
    return _nets(algo) is not None


def attach(algo) -> None:
    """Set `algo.compiled_phase` (Config.compiled and it applies) and `algo.compile_s` (numba compiles, or
    loads from its cache, once per process: the seconds it took)."""
    algo.compiled_phase = bool(algo.cfg.compiled) and applies(algo)
    algo.compile_s = warm_up(algo.name) if algo.compiled_phase else 0.0


if numba is not None:
    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def _major(x):  # pragma: no cover - compiled
        """How BLAS can read the float32 matrix x: (0, ld) row-major with leading dimension ld, (1, ld)
        column-major (a transposed view), (-1, 0) neither."""
        r, c = x.shape
        s0, s1 = x.strides[0] // 4, x.strides[1] // 4
        if (c == 1 or s1 == 1) and (r == 1 or s0 >= c):
            return 0, max(s0 if r > 1 else c, 1)
        if (r == 1 or s0 == 1) and (c == 1 or s1 >= r):
            return 1, max(s1 if c > 1 else r, 1)
        return -1, 0

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _dot(a, b, out):  # pragma: no cover - compiled
        """out = a @ b (float32, 2-D; a and b row-major or transposed views, out row-major): np.dot(a, b, out) on
        the GEMM sgemm.bind() chose, on one thread. Row-major C = A B is BLAS's column-major C^T = B^T A^T."""
        m, k = a.shape
        n = b.shape[1]
        if b.shape[0] != k or out.shape[0] != m or out.shape[1] != n:
            raise ValueError("_dot: shapes do not match")
        if m == 0 or n == 0:
            return
        if k == 0:
            out[:] = 0
            return
        ma, lda = _major(a)
        mb, ldb = _major(b)
        mc, ldc = _major(out)
        if ma < 0 or mb < 0 or mc != 0:
            raise ValueError("_dot: an operand BLAS cannot read in place (out must be row-major)")
        ii = np.empty(6, np.int32)
        ii[0], ii[1], ii[2], ii[3], ii[4], ii[5] = n, m, k, ldb, lda, ldc
        ff = np.empty(2, np.float32)
        ff[0], ff[1] = 1.0, 0.0
        tt = np.empty(2, np.uint8)
        tt[0] = 78 if mb == 0 else 84   # 'N' / 'T'
        tt[1] = 78 if ma == 0 else 84
        prev = sgemm.BLAS_LOCAL(1)
        sgemm.SGEMM(tt[0:].ctypes.data, tt[1:].ctypes.data, ii[0:].ctypes.data, ii[1:].ctypes.data,
                    ii[2:].ctypes.data, ff[0:].ctypes.data, b.ctypes.data, ii[3:].ctypes.data, a.ctypes.data,
                    ii[4:].ctypes.data, ff[1:].ctypes.data, out.ctypes.data, ii[5:].ctypes.data)
        sgemm.BLAS_LOCAL(prev)

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _sum_sq(x):  # pragma: no cover - compiled
        s = np.float32(0.0)
        for p in range(x.shape[0]):
            s += x[p] * x[p]
        return s

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _adam_consts(step, lr, beta1, beta2):  # pragma: no cover - compiled
        """Count the step; torch's fused CPU Adam's constants for it: (step_size, 1 - beta1, beta2, 1 - beta2,
        sqrt(bias correction 2))."""
        step[0] += 1
        t = np.float64(step[0])
        return (np.float32(lr / (1.0 - beta1 ** t)), np.float32(1.0 - beta1), np.float32(beta2),
                np.float32(1.0 - beta2), np.float32(np.sqrt(1.0 - beta2 ** t)))

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _adam_span(flat, grad, exp_avg, exp_avg_sq, lo, hi, coef, consts, eps):  # pragma: no cover - compiled
        """Adam on the parameters lo:hi, their gradients scaled by the clip's `coef`: lerp the moments,
        bias-correct, update (torch's fused CPU kernel). The loop runs over views from 0: an index from `lo`
        may be negative as far as numba knows, and its wrap-around check kept LLVM from vectorising (9x slower)."""
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
    def _clip_coef(sum_sq, max_norm):  # pragma: no cover - compiled
        """clip_grad_norm_(max_norm)'s factor: min(1, max_norm / (||g|| + 1e-6)); 1 without a clip."""
        if max_norm > 0:
            return np.float32(min(1.0, max_norm / (np.sqrt(np.float64(sum_sq)) + 1e-6)))
        return np.float32(1.0)

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _clip_adam(flat, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_norm):  # pragma: no cover
        """clip_grad_norm_(max_norm) (g *= min(1, max_norm / (||g|| + 1e-6))), then one step of torch's
        fused CPU Adam: lerp the moments, bias-correct, update."""
        coef = _clip_coef(_sum_sq(grad), max_norm)
        _adam_span(flat, grad, exp_avg, exp_avg_sq, 0, flat.shape[0], coef, _adam_consts(step, lr, beta1, beta2), eps)

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _gather_span(grad, lanes, nl, lo, hi):  # pragma: no cover - compiled
        """grad[lo:hi] += the other lanes' partial gradients there (the rows of `lanes`: none where the lanes
        wrote disjoint parts of `grad`); returns the span's sum of squares."""
        g = grad[lo:hi]
        for l in range(lanes.shape[0]):
            src = lanes[l, lo:hi]
            for p in range(g.shape[0]):
                g[p] += src[p]
        return _sum_sq(g)

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def _lanes_clip_adam(flat, grad, lanes, nl, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps,
                         max_norm):  # pragma: no cover - compiled
        """_clip_adam on the sum of the lanes' gradients (grad += lanes[0 .. nl-2]), the parameters split over
        nl parallel lanes: each sums its span's gradients and their squares, then (after the clip's factor)
        steps its span. (The loops are in the fastmath helpers, which vectorise: a loop written in a prange
        body did not, 10x slower.)"""
        n = flat.shape[0]
        part = np.zeros(nl, np.float32)
        for c in numba.prange(nl):
            part[c] = _gather_span(grad, lanes, nl, c * n // nl, (c + 1) * n // nl)
        coef = _clip_coef(part.sum(), max_norm)
        consts = _adam_consts(step, lr, beta1, beta2)
        for c in numba.prange(nl):
            _adam_span(flat, grad, exp_avg, exp_avg_sq, c * n // nl, (c + 1) * n // nl, coef, consts, eps)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _relu_grad(g, y):  # pragma: no cover - compiled
        """g *= (y > 0): ReLU's backward from its output (threshold_backward), written branch-free so that
        LLVM vectorises it (a conditional store does not: 5x slower)."""
        for i in range(g.shape[0]):
            for j in range(g.shape[1]):
                g[i, j] = g[i, j] if y[i, j] > 0 else np.float32(0.0)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _discounts(steps, terminated, gamma):  # pragma: no cover - compiled
        """gamma ** n * (1 - terminated) per transition (the algorithms' `discount`), in one call: as five torch
        ops around a phase of one step these cost ~40 us, each run cold after the phase evicted the caches."""
        K, B = steps.shape
        out = np.empty((K, B), np.float32)
        g = np.float32(gamma)
        for k in range(K):
            for i in range(B):
                out[k, i] = np.float32(0.0) if terminated[k, i] else g ** np.float32(steps[k, i])
        return out

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _dqn_lane(c, nl, k, obs, action, reward, discount, weight, sizes, flat, grad, double, next_q, next_obs,
                  ws, td_out):  # pragma: no cover - compiled
        """Lane c of nl of DQN update k: the rows lo:hi of the batch on the lane's scratch `ws`, the loss's
        gradient into the lane's `grad` (the phase sums the lanes): the target (a' from next_q, the target
        net's, or from the online net as it is now: double), the Huber loss's gradient, backward."""
        K, B = action.shape
        lo, hi = c * B // nl, (c + 1) * B // nl
        R = hi - lo
        L = sizes.shape[0] - 1
        A = sizes[L]
        pos = np.zeros(1, np.int64)
        acts = [_mat(ws, pos, R, sizes[l + 1]) for l in range(L)]    # layer outputs
        grads = [_mat(ws, pos, R, sizes[l]) for l in range(L)]       # dloss/d(layer input)
        g, target = _mat(ws, pos, R, A), _mat(ws, pos, 1, R)[0]
        one = np.float32(1.0)
        if double:  # a' from the online net as it is now
            _fwd(flat, 0, sizes, next_obs[k, lo:hi], acts, 0, 0)
        for i in range(R):
            best = 0
            for j in range(1, A):
                if (acts[L - 1][i, j] > acts[L - 1][i, best]) if double else (next_q[k, lo + i, j] > next_q[k, lo + i, best]):
                    best = j
            target[i] = reward[k, lo + i] + discount[k, lo + i] * next_q[k, lo + i, best]
        x = obs[k, lo:hi]
        _fwd(flat, 0, sizes, x, acts, 0, 0)
        # d/dq of the loss: w * clip(td, -1, 1) / B at the taken action
        g[:, :] = 0
        for i in range(R):
            ai = action[k, lo + i]
            td = acts[L - 1][i, ai] - target[i]
            td_out[k, lo + i] = td
            cl = min(max(td, -one), one)
            g[i, ai] = weight[k, lo + i] * cl / np.float32(B)
        _bwd(flat, grad, 0, sizes, x, acts, 0, g, grads, True, False, 0)

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def _dqn_mlp_phase(obs, action, reward, next_obs, discount, weight, sizes, flat, target_flat, double,
                       grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_norm, ws, lane_g,
                       td_out):  # pragma: no cover - compiled
        """K updates of mean(w * huber(Q(s)[a] - y)) on an MLP whose parameters (per layer: weight
        (out, in), then bias) are views of `flat`, with y = r + discount * Q_target(s')[a'] where a' is
        argmax Q_target(s') (plain; all K from one pass of the fixed target net) or argmax Q(s') at the
        current parameters (double); Adam as torch's fused CPU kernel; td_out[k] = Q(s)[a] - y. The batch's
        rows are split over len(ws) parallel lanes (lane 0 writes `grad`, lane c > 0 lane_g[c - 1])."""
        K, B = action.shape
        L = sizes.shape[0] - 1
        nl = ws.shape[0]
        # the target net is fixed during the phase: its Q(s') for all K batches in one pass, rows over the lanes
        tacts = [np.empty((K * B, sizes[l + 1]), np.float32) for l in range(L)]
        nxt = next_obs.reshape((K * B, sizes[0]))
        for c in numba.prange(nl):
            lo, hi = c * K * B // nl, (c + 1) * K * B // nl
            _fwd(target_flat, 0, sizes, nxt[lo:hi], [t[lo:hi] for t in tacts], 0, 0)
        next_q = tacts[L - 1].reshape((K, B, sizes[L]))
        for k in range(K):
            for c in numba.prange(nl):
                _dqn_lane(c, nl, k, obs, action, reward, discount, weight, sizes, flat,
                          grad if c == 0 else lane_g[c - 1], double, next_q, next_obs, ws[c], td_out)
            _lanes_clip_adam(flat, grad, lane_g, nl, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_norm)


    # ---- the MLP pieces every phase is built from (DQN, DDPG, TD3, SAC) ----------------------------------
    # A network is `sizes` = [in, h1, ..., out] and the offset `o` of its first parameter in a flat buffer
    # (per layer: weight (out, in), then bias: the order of nn.Module.parameters()). Hidden layers are
    # ReLU; the last layer's activation is NONE, RELU or TANH. `acts[base + l]` holds layer l's output.

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _nparams(sizes):  # pragma: no cover - compiled
        n = 0
        for l in range(sizes.shape[0] - 1):
            n += sizes[l + 1] * sizes[l] + sizes[l + 1]
        return n

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _fwd(flat, o, sizes, x, acts, base, out_act):  # pragma: no cover - compiled
        """acts[base + l] = act(acts[base + l - 1] @ W_l.T + b_l), acts[base - 1] = x."""
        L = sizes.shape[0] - 1
        for l in range(L):
            fi, fo = sizes[l], sizes[l + 1]
            W = flat[o:o + fo * fi].reshape((fo, fi))
            b = flat[o + fo * fi:o + fo * fi + fo]
            o += fo * fi + fo
            a = acts[base + l]
            if l == 0:
                _dot(x, W.T, a)
            else:
                _dot(acts[base + l - 1], W.T, a)
            act = 1 if l < L - 1 else out_act
            for i in range(a.shape[0]):
                for j in range(fo):
                    v = a[i, j] + b[j]
                    if act == 1:
                        v = v if v > 0 else np.float32(0.0)
                    elif act == 2:
                        v = np.tanh(v)
                    a[i, j] = v

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _bwd(flat, grad, o, sizes, x, acts, base, g, gs, params, input_grad, out_act):  # pragma: no cover
        """Backward of _fwd for a loss whose gradient w.r.t. the (activated) output is `g` (overwritten):
        parameter gradients written into `grad` (same offsets as `flat`) if `params`; the gradient
        w.r.t. the input left in gs[0] if `input_grad` (gs[l]: (B, sizes[l]) scratch)."""
        L = sizes.shape[0] - 1
        y = acts[base + L - 1]
        if out_act == 1:
            _relu_grad(g, y)
        elif out_act == 2:
            for i in range(g.shape[0]):
                for j in range(g.shape[1]):
                    g[i, j] *= np.float32(1.0) - y[i, j] * y[i, j]
        offs = np.empty(L, np.int64)
        for l in range(L):
            offs[l] = o
            o += sizes[l + 1] * sizes[l] + sizes[l + 1]
        for l in range(L - 1, -1, -1):
            fi, fo = sizes[l], sizes[l + 1]
            if params:
                dW = grad[offs[l]:offs[l] + fo * fi].reshape((fo, fi))
                db = grad[offs[l] + fo * fi:offs[l] + fo * fi + fo]
                if l == 0:
                    _dot(g.T, x, dW)
                else:
                    _dot(g.T, acts[base + l - 1], dW)
                db[:] = 0
                for i in range(g.shape[0]):
                    for j in range(fo):
                        db[j] += g[i, j]
            if l > 0 or input_grad:
                gp = gs[l]
                _dot(g, flat[offs[l]:offs[l] + fo * fi].reshape((fo, fi)), gp)
                if l > 0:
                    _relu_grad(gp, acts[base + l - 1])
                g = gp

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _mat(ws, pos, r, c):  # pragma: no cover - compiled
        """The next (r, c) float32 buffer carved from the workspace `ws` (pos[0]: the first free float).
        The phases take their scratch from one workspace kept across calls: fresh buffers of a few 100 KB
        each call were fresh pages (~1,200 page faults per SAC step, 1.5 ms of its 7.5)."""
        n = r * c
        if pos[0] + n > ws.shape[0]:
            raise ValueError("compiled phase: workspace too small")
        out = ws[pos[0]:pos[0] + n].reshape((r, c))
        pos[0] += n
        return out

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _cat(a, b, out):  # pragma: no cover - compiled
        """out = [a, b] along the features (a critic's input: observation, action)."""
        da = a.shape[1]
        for i in range(out.shape[0]):
            for j in range(da):
                out[i, j] = a[i, j]
            for j in range(b.shape[1]):
                out[i, da + j] = b[i, j]

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _polyak(target, source, tau):  # pragma: no cover - compiled
        """target <- target + tau (source - target): torch's lerp_(source, tau) for tau < 0.5."""
        t = np.float32(tau)
        for p in range(target.shape[0]):
            target[p] += t * (source[p] - target[p])

    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def _smoothed(mu, e, smooth):  # pragma: no cover - compiled
        """TD3's target action: clip(mu + clip(sigma e, -c, c), -1, 1) for a standard normal e, smooth = (sigma, c)
        (DDPG: (0, 0), the target policy's own action); the eager loss's float32 operations in its order."""
        one = np.float32(1.0)
        return min(max(mu + min(max(e * smooth[0], -smooth[1]), smooth[1]), -one), one)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _ac_lane(part, c, nl, k, obs, action, reward, next_obs, discount, weight, noise, smooth, asizes, csizes, n_critics,
                 actor, agrad, critic, cgrad, actor_t, critic_t, ws, y, td_out):  # pragma: no cover - compiled
        """Lane c of nl of DDPG/TD3 step k: the rows lo:hi of the batch, on the lane's scratch `ws` and its own
        gradient buffers (the phase sums the lanes). part 1: the (twin-min, smoothed) target and the critics'
        loss gradient; part 2 (a delayed actor step, after the critics' step): -mean Q_1(s, mu(s))'s gradient."""
        K, B, do = obs.shape
        A = action.shape[2]
        lo, hi = c * B // nl, (c + 1) * B // nl
        R = hi - lo
        La, Lc = asizes.shape[0] - 1, csizes.shape[0] - 1
        nc = _nparams(csizes)
        pos = np.zeros(1, np.int64)
        aacts = [_mat(ws, pos, R, asizes[l + 1]) for l in range(La)]
        ags = [_mat(ws, pos, R, asizes[l]) for l in range(La)]
        cacts = [_mat(ws, pos, R, csizes[l + 1]) for l in range(Lc)]
        cgs = [_mat(ws, pos, R, csizes[l]) for l in range(Lc)]
        x, na, gmu, g = _mat(ws, pos, R, do + A), _mat(ws, pos, R, A), _mat(ws, pos, R, A), _mat(ws, pos, R, 1)
        one, Bf = np.float32(1.0), np.float32(B)
        xo = obs[k, lo:hi]
        if part == 1:
            xn = next_obs[k, lo:hi]
            _fwd(actor_t, 0, asizes, xn, aacts, 0, 2)
            mu_t = aacts[La - 1]
            for i in range(R):
                for j in range(A):
                    na[i, j] = _smoothed(mu_t[i, j], noise[k, lo + i, j], smooth)
            _cat(xn, na, x)
            for cc in range(n_critics):
                _fwd(critic_t, cc * nc, csizes, x, cacts, 0, 0)
                q = cacts[Lc - 1]
                for i in range(R):
                    y[lo + i] = q[i, 0] if cc == 0 else min(y[lo + i], q[i, 0])
            for i in range(R):
                y[lo + i] = reward[k, lo + i] + discount[k, lo + i] * y[lo + i]
                td_out[k, lo + i] = 0
            _cat(xo, action[k, lo:hi], x)
            for cc in range(n_critics):
                _fwd(critic, cc * nc, csizes, x, cacts, 0, 0)
                q = cacts[Lc - 1]
                for i in range(R):
                    td = q[i, 0] - y[lo + i]
                    td_out[k, lo + i] += abs(td) / np.float32(n_critics)
                    g[i, 0] = np.float32(2.0) * weight[k, lo + i] * td / Bf
                _bwd(critic, cgrad, cc * nc, csizes, x, cacts, 0, g, cgs, True, False, 0)
            return
        _fwd(actor, 0, asizes, xo, aacts, 0, 2)
        _cat(xo, aacts[La - 1], x)
        _fwd(critic, 0, csizes, x, cacts, 0, 0)
        for i in range(R):
            g[i, 0] = -one / Bf
        _bwd(critic, cgrad, 0, csizes, x, cacts, 0, g, cgs, False, True, 0)
        for i in range(R):
            for j in range(A):
                gmu[i, j] = cgs[0][i, do + j]
        _bwd(actor, agrad, 0, asizes, xo, aacts, 0, gmu, ags, True, False, 2)

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def _ac_phase(obs, action, reward, next_obs, discount, weight, noise, smooth, asizes, csizes, n_critics,
                  actor, agrad, am, av, astep, critic, cgrad, cm, cv, cstep, actor_t, critic_t,
                  updates, delay, by_critic, hp, ws, lane_ag, lane_cg, y, td_out):  # pragma: no cover - compiled
        """K steps of DDPG (n_critics 1, delay 1, smooth (0, 0)) or TD3 (twin critics, smoothing noise, delay):
        y = r + discount * min_c Q_c_t(s', _smoothed(mu_t(s'), noise, smooth)); critic loss sum_c mean(w (Q_c(s, a) - y)^2);
        every delay-th step the actor loss -mean(Q_1(s, mu(s))) and the Polyak targets. The batch's rows are split
        over len(ws) parallel lanes (as _sac_phase); with `by_critic` (as many lanes as critics) the critics' step
        runs a critic per lane on the whole batch. Returns the step count."""
        nl = ws.shape[0]
        alr, clr, b1, b2, eps, max_norm, tau = hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6]
        K, B, do = obs.shape
        by_critic = by_critic and n_critics > 1 and nl == n_critics
        fused = by_critic and max_norm <= 0
        zero5 = (np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0))
        xn = np.empty((B, do + action.shape[2]), np.float32)
        qt, tdc = np.empty((n_critics, B), np.float32), np.empty((n_critics, B), np.float32)
        for k in range(K):
            if by_critic:  # a lane per critic, each on the whole batch (see ac_phase)
                for c in numba.prange(nl):
                    _twin_input_rows(c, nl, k, next_obs, noise, smooth, asizes, actor_t, ws[c], xn)
                for c in numba.prange(nl):
                    _critic_lane(1, c, n_critics, k, obs, action, reward, discount, weight, csizes, critic, cgrad,
                                 critic_t, xn, ws[c], qt, tdc, False, cm, cv, zero5, eps, 0.0)
                # without a clip each critic's Adam step (and its Polyak target, on a delayed step) needs nothing
                # from the other lane: done in its lane (the same operations on the same numbers)
                consts = _adam_consts(cstep, clr, b1, b2) if fused else zero5
                lane_tau = tau if fused and (updates + 1) % delay == 0 else 0.0
                for c in numba.prange(nl):
                    _critic_lane(2, c, n_critics, k, obs, action, reward, discount, weight, csizes, critic, cgrad,
                                 critic_t, xn, ws[c], qt, tdc, fused, cm, cv, consts, eps, lane_tau)
                for i in range(B):
                    t = np.float32(0.0)
                    for c in range(n_critics):
                        t += tdc[c, i] / np.float32(n_critics)
                    td_out[k, i] = t
                if not fused:
                    _lanes_clip_adam(critic, cgrad, lane_cg[:0], nl, cm, cv, cstep, clr, b1, b2, eps, max_norm)
            else:
                for c in numba.prange(nl):
                    _ac_lane(1, c, nl, k, obs, action, reward, next_obs, discount, weight, noise, smooth, asizes, csizes,
                             n_critics, actor, agrad if c == 0 else lane_ag[c - 1], critic,
                             cgrad if c == 0 else lane_cg[c - 1], actor_t, critic_t, ws[c], y, td_out)
                _lanes_clip_adam(critic, cgrad, lane_cg, nl, cm, cv, cstep, clr, b1, b2, eps, max_norm)
            updates += 1
            if updates % delay == 0:
                for c in numba.prange(nl):
                    _ac_lane(2, c, nl, k, obs, action, reward, next_obs, discount, weight, noise, smooth, asizes, csizes,
                             n_critics, actor, agrad if c == 0 else lane_ag[c - 1], critic,
                             cgrad if c == 0 else lane_cg[c - 1], actor_t, critic_t, ws[c], y, td_out)
                _lanes_clip_adam(actor, agrad, lane_ag, nl, am, av, astep, alr, b1, b2, eps, max_norm)
                if not fused:  # (fused: each critic's lane did its own)
                    _lanes_polyak(critic_t, critic, tau, nl)
                _lanes_polyak(actor_t, actor, tau, nl)
        return updates

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def _lanes_polyak(target, source, tau, nl):  # pragma: no cover - compiled
        """_polyak with the parameters split over nl parallel lanes."""
        n = target.shape[0]
        for c in numba.prange(nl):
            lo, hi = c * n // nl, (c + 1) * n // nl
            _polyak(target[lo:hi], source[lo:hi], tau)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _twin_input_rows(c, nl, k, next_obs, noise, smooth, asizes, actor_t, ws, xn):  # pragma: no cover - compiled
        """Lane c of nl: the rows lo:hi of the target critics' input (s', smoothed mu_t(s'): _smoothed) into xn."""
        K, B, do = next_obs.shape
        A = noise.shape[2]
        lo, hi = c * B // nl, (c + 1) * B // nl
        La = asizes.shape[0] - 1
        pos = np.zeros(1, np.int64)
        aacts = [_mat(ws, pos, hi - lo, asizes[l + 1]) for l in range(La)]
        s = next_obs[k, lo:hi]
        _fwd(actor_t, 0, asizes, s, aacts, 0, 2)
        mu_t = aacts[La - 1]
        for i in range(hi - lo):
            for j in range(do):
                xn[lo + i, j] = s[i, j]
            for j in range(A):
                xn[lo + i, do + j] = _smoothed(mu_t[i, j], noise[k, lo + i, j], smooth)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _critic_lane(part, cc, n_critics, k, obs, action, reward, discount, weight, csizes, critic, cgrad, critic_t,
                     xn, ws, qt, tdc, adam, cm, cv, consts, eps, tau):  # pragma: no cover - compiled
        """Critic cc of a twin-critic step on the whole batch (its own lane: the critics' parameters are disjoint
        spans of `critic` and `cgrad`). part 1: its target Q_cc_t(xn) into qt[cc]; part 2 (after every critic's
        part 1): y = r + discount * min_c qt[c], its squared error's gradient and backward into its span of cgrad,
        |td| into tdc[cc]; with `adam` (no gradient clip: nothing to wait for) its span's Adam step (`consts`:
        this step's, counted once) and, where tau > 0, its Polyak target, while its gradient is in cache."""
        K, B, do = obs.shape
        A = action.shape[2]
        Lc = csizes.shape[0] - 1
        nc = _nparams(csizes)
        pos = np.zeros(1, np.int64)
        cacts = [_mat(ws, pos, B, csizes[l + 1]) for l in range(Lc)]
        if part == 1:
            _fwd(critic_t, cc * nc, csizes, xn, cacts, 0, 0)
            for i in range(B):
                qt[cc, i] = cacts[Lc - 1][i, 0]
            return
        cgs = [_mat(ws, pos, B, csizes[l]) for l in range(Lc)]
        x, g = _mat(ws, pos, B, do + A), _mat(ws, pos, B, 1)
        _cat(obs[k], action[k], x)
        _fwd(critic, cc * nc, csizes, x, cacts, 0, 0)
        q, Bf = cacts[Lc - 1], np.float32(B)
        for i in range(B):
            y = qt[0, i]
            for j in range(1, n_critics):
                y = min(y, qt[j, i])
            td = q[i, 0] - (reward[k, i] + discount[k, i] * y)
            tdc[cc, i] = abs(td)
            g[i, 0] = np.float32(2.0) * weight[k, i] * td / Bf
        _bwd(critic, cgrad, cc * nc, csizes, x, cacts, 0, g, cgs, True, False, 0)
        if adam:
            _adam_span(critic, cgrad, cm, cv, cc * nc, (cc + 1) * nc, np.float32(1.0), consts, eps)
            if tau > 0:
                _polyak(critic_t[cc * nc:(cc + 1) * nc], critic[cc * nc:(cc + 1) * nc], tau)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _squashed(actor, asizes, x, acts, e, mean, lsr, u, a, logp):  # pragma: no cover - compiled
        """SAC's actor on x: (mean, raw log_std) heads on the ReLU body, u = mean + exp(clamp(log_std)) e,
        a = tanh(u), log pi(a|s) with the stable tanh correction (as GaussianActor.sample)."""
        B, A = mean.shape
        La = asizes.shape[0] - 1
        H = asizes[La]
        _fwd(actor, 0, asizes, x, acts, 0, 1)
        h = acts[La - 1]
        o = _nparams(asizes)
        _dot(h, actor[o:o + A * H].reshape((A, H)).T, mean)
        _dot(h, actor[o + A * H + A:o + 2 * A * H + A].reshape((A, H)).T, lsr)
        half_log_2pi, log2 = np.float32(0.5 * np.log(2 * np.pi)), np.float32(np.log(2.0))
        for i in range(B):
            s = np.float32(0.0)
            for j in range(A):
                m = mean[i, j] + actor[o + A * H + j]
                mean[i, j] = m
                r = lsr[i, j] + actor[o + 2 * A * H + A + j]
                lsr[i, j] = r
                ls = min(max(r, np.float32(LOG_STD_MIN)), np.float32(LOG_STD_MAX))
                uu = m + np.exp(ls) * e[i, j]
                u[i, j] = uu
                a[i, j] = np.tanh(uu)
                z = np.float32(-2.0) * uu
                sp = z if z > 20 else np.log1p(np.exp(z))   # softplus (torch's threshold 20)
                s += np.float32(-0.5) * e[i, j] * e[i, j] - ls - half_log_2pi
                s -= np.float32(2.0) * (log2 - uu - sp)
            logp[i] = s

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _sac_lane(part, c, nl, k, obs, action, reward, next_obs, discount, weight, eps_pi, eps_next, asizes, csizes,
                  actor, agrad, critic, cgrad, critic_t, alpha, ws, logp, nlogp, y, td_out):  # pragma: no cover
        """Lane c of nl of SAC step k: the rows lo:hi of the batch, on the lane's own scratch `ws` and its own
        gradient buffers (agrad, cgrad; the phase sums the lanes). part 1: both actions and log-probs, the
        soft twin-min target, the critics' loss gradient; part 2 (after the critics' step): the actor loss's
        gradient through min(Q1, Q2) and the tanh correction. Losses are means over the whole batch."""
        K, B, do = obs.shape
        A = action.shape[2]
        lo, hi = c * B // nl, (c + 1) * B // nl
        R = hi - lo
        La, Lc = asizes.shape[0] - 1, csizes.shape[0] - 1
        H = asizes[La]
        ob, nc = _nparams(asizes), _nparams(csizes)
        pos = np.zeros(1, np.int64)   # the same views of `ws` in both parts: part 2 reads part 1's actor pass
        aacts = [_mat(ws, pos, R, asizes[l + 1]) for l in range(La)]
        nacts = [_mat(ws, pos, R, asizes[l + 1]) for l in range(La)]
        ags = [_mat(ws, pos, R, asizes[l]) for l in range(La)]
        cacts = [_mat(ws, pos, R, csizes[(l % Lc) + 1]) for l in range(2 * Lc)]  # both critics
        cgs = [_mat(ws, pos, R, csizes[l]) for l in range(Lc)]
        mean, lsr, u, a = _mat(ws, pos, R, A), _mat(ws, pos, R, A), _mat(ws, pos, R, A), _mat(ws, pos, R, A)
        nmean, nlsr, nu, na = _mat(ws, pos, R, A), _mat(ws, pos, R, A), _mat(ws, pos, R, A), _mat(ws, pos, R, A)
        ga, dmean, dls = _mat(ws, pos, R, A), _mat(ws, pos, R, A), _mat(ws, pos, R, A)
        dh, dh2 = _mat(ws, pos, R, H), _mat(ws, pos, R, H)
        x, g, qa = _mat(ws, pos, R, do + A), _mat(ws, pos, R, 1), _mat(ws, pos, 2, R)
        one, Bf = np.float32(1.0), np.float32(B)
        xo, xn = obs[k, lo:hi], next_obs[k, lo:hi]
        if part == 1:
            _squashed(actor, asizes, xo, aacts, eps_pi[k, lo:hi], mean, lsr, u, a, logp[lo:hi])
            _squashed(actor, asizes, xn, nacts, eps_next[k, lo:hi], nmean, nlsr, nu, na, nlogp[lo:hi])
            _cat(xn, na, x)
            for cc in range(2):
                _fwd(critic_t, cc * nc, csizes, x, cacts, 0, 0)
                q = cacts[Lc - 1]
                for i in range(R):
                    y[lo + i] = q[i, 0] if cc == 0 else min(y[lo + i], q[i, 0])
            for i in range(R):
                y[lo + i] = reward[k, lo + i] + discount[k, lo + i] * (y[lo + i] - alpha * nlogp[lo + i])
                td_out[k, lo + i] = 0
            _cat(xo, action[k, lo:hi], x)
            for cc in range(2):  # critic loss 0.5 mean(w td1^2) + 0.5 mean(w td2^2)
                _fwd(critic, cc * nc, csizes, x, cacts, 0, 0)
                q = cacts[Lc - 1]
                for i in range(R):
                    td = q[i, 0] - y[lo + i]
                    td_out[k, lo + i] += np.float32(0.5) * abs(td)
                    g[i, 0] = weight[k, lo + i] * td / Bf
                _bwd(critic, cgrad, cc * nc, csizes, x, cacts, 0, g, cgs, True, False, 0)
            return
        # part 2: actor loss mean(alpha log pi(a|s) - min(Q1(s, a), Q2(s, a))), critics after their step
        _cat(xo, a, x)
        for cc in range(2):
            _fwd(critic, cc * nc, csizes, x, cacts, cc * Lc, 0)
            for i in range(R):
                qa[cc, i] = cacts[cc * Lc + Lc - 1][i, 0]
        ga[:, :] = 0
        for cc in range(2):
            for i in range(R):  # torch.min's gradient: to the smaller, halved on a tie
                q, other = qa[cc, i], qa[1 - cc, i]
                g[i, 0] = 0 if q > other else (-one / Bf if q < other else np.float32(-0.5) / Bf)
            _bwd(critic, cgrad, cc * nc, csizes, x, cacts, cc * Lc, g, cgs, False, True, 0)
            for i in range(R):
                for j in range(A):
                    ga[i, j] += cgs[0][i, do + j]
        for i in range(R):
            for j in range(A):
                # d/du: through a = tanh(u) and the log-prob's correction (d log pi / du = 2 tanh(u))
                du = ga[i, j] * (one - a[i, j] * a[i, j]) + alpha / Bf * np.float32(2.0) * a[i, j]
                dmean[i, j] = du
                r = lsr[i, j]
                inside = r >= np.float32(LOG_STD_MIN) and r <= np.float32(LOG_STD_MAX)
                dls[i, j] = (du * np.exp(r) * eps_pi[k, lo + i, j] - alpha / Bf) if inside else np.float32(0.0)
        h = aacts[La - 1]
        _dot(dmean.T, h, agrad[ob:ob + A * H].reshape((A, H)))
        _dot(dls.T, h, agrad[ob + A * H + A:ob + 2 * A * H + A].reshape((A, H)))
        for j in range(A):
            sm, sl = np.float32(0.0), np.float32(0.0)
            for i in range(R):
                sm += dmean[i, j]
                sl += dls[i, j]
            agrad[ob + A * H + j] = sm
            agrad[ob + 2 * A * H + A + j] = sl
        _dot(dmean, actor[ob:ob + A * H].reshape((A, H)), dh)
        _dot(dls, actor[ob + A * H + A:ob + 2 * A * H + A].reshape((A, H)), dh2)
        for i in range(R):
            for j in range(H):
                dh[i, j] += dh2[i, j]
        _bwd(actor, agrad, 0, asizes, xo, aacts, 0, dh, ags, True, False, 1)

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def _sac_phase(obs, action, reward, next_obs, discount, weight, eps_pi, eps_next, asizes, csizes,
                   actor, agrad, am, av, astep, critic, cgrad, cm, cv, cstep, critic_t,
                   log_alpha, galpha, alm, alv, alstep, learn_alpha, hp, ws, lane_ag, lane_cg, rows,
                   td_out):  # pragma: no cover - compiled
        """K steps of SAC (the order and math of sac.py's docstring) with the Gaussian noise given:
        eps_pi for the actor/alpha losses, eps_next for the target's next action. The batch's rows are split
        over len(ws) lanes, run in parallel (numba's threads, one BLAS thread each); lane 0 writes the real
        gradient buffers, lane c > 0 lane_ag/lane_cg[c - 1], summed before each optimizer step."""
        K, B, do = obs.shape
        nl = ws.shape[0]
        alr, clr, b1, b2, eps, max_norm, tau, te = hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6], hp[7]
        al_lr, al_b1, al_b2, al_eps = hp[8], hp[9], hp[10], hp[11]
        logp, nlogp, y = rows[0], rows[1], rows[2]
        for k in range(K):
            alpha = np.float32(np.exp(log_alpha[0]))  # before this step's alpha update
            for c in numba.prange(nl):
                _sac_lane(1, c, nl, k, obs, action, reward, next_obs, discount, weight, eps_pi, eps_next, asizes,
                          csizes, actor, agrad if c == 0 else lane_ag[c - 1], critic, cgrad if c == 0 else lane_cg[c - 1],
                          critic_t, alpha, ws[c], logp, nlogp, y, td_out)
            if learn_alpha:
                s = np.float32(0.0)
                for i in range(B):
                    s += logp[i] + np.float32(te)
                galpha[0] = -s / np.float32(B)
                _clip_adam(log_alpha, galpha, alm, alv, alstep, al_lr, al_b1, al_b2, al_eps, 0.0)
            _lanes_clip_adam(critic, cgrad, lane_cg, nl, cm, cv, cstep, clr, b1, b2, eps, max_norm)
            for c in numba.prange(nl):
                _sac_lane(2, c, nl, k, obs, action, reward, next_obs, discount, weight, eps_pi, eps_next, asizes,
                          csizes, actor, agrad if c == 0 else lane_ag[c - 1], critic, cgrad if c == 0 else lane_cg[c - 1],
                          critic_t, alpha, ws[c], logp, nlogp, y, td_out)
            _lanes_clip_adam(actor, agrad, lane_ag, nl, am, av, astep, alr, b1, b2, eps, max_norm)
            _polyak(critic_t, critic, tau)


    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _act(flat, sizes, x, e, kind, ws, out):  # pragma: no cover - compiled
        """A policy's forward on the observations x (B, d) into out: kind 0 the Q values (a linear last layer),
        2 DDPG/TD3's mu(s) (tanh), 3 SAC's a = tanh(mean + std e) (sizes: its ReLU body; e = 0: tanh(mean))."""
        B = x.shape[0]
        pos = np.zeros(1, np.int64)
        L = sizes.shape[0] - 1
        acts = [_mat(ws, pos, B, sizes[l + 1]) for l in range(L)]
        if kind == 3:
            A = out.shape[1]
            mean, lsr, u = _mat(ws, pos, B, A), _mat(ws, pos, B, A), _mat(ws, pos, B, A)
            _squashed(flat, sizes, x, acts, e, mean, lsr, u, out, _mat(ws, pos, 1, B)[0])
        else:
            _fwd(flat, 0, sizes, x, acts, 0, kind)
            out[:, :] = acts[L - 1]


_blas_threads: list[int] = []


def _limit_blas(threads: int) -> None:
    """The compiled phase's BLAS (scipy's OpenBLAS) runs on `threads` threads (the lanes call it: one each)."""
    if _blas_threads[-1:] != [threads]:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")
        _blas_threads[:] = [threads]


def use_threads(algo, n: int) -> None:
    """Run `algo`'s compiled phase on n lanes (numba's threads, one BLAS thread each), and torch (the small
    ops around the phase: sampling, acting, publishing) on one. Two thread pools on the same cores (torch's
    OpenMP threads spin after each parallel region) fight for them: measured here, a 2-thread compiled SAC
    update took 12 ms in a run against 6 ms with torch on one thread."""
    algo.lane_threads = max(1, int(n))
    torch.set_num_threads(1)


def _lane_threads(algo, B: int) -> int:
    """A lane-parallel phase: its lanes on numba's threads (set for the calling thread), one BLAS thread each."""
    nl = lanes(algo, B)
    sgemm.bind()
    _limit_blas(1)
    numba.set_num_threads(nl)
    return nl


def _f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.numpy(), np.float32)


def _discount_of(b: dict[str, torch.Tensor], gamma: float) -> np.ndarray:
    """The batches' gamma ** n * (1 - terminated), (K, B) float32 (as the algorithms' eager losses)."""
    return _discounts(np.ascontiguousarray(b["steps"].numpy()), np.ascontiguousarray(b["terminated"].numpy()),
                      float(gamma))


class Acting:
    """A policy network's forward as one compiled call (`_act`): acting on a CPU spends ~40 small torch ops
    per env step on a 2x256 MLP (250 us warm, ~800 us right after a learner phase has evicted the caches,
    measured in an inline SAC run), the compiled call ~20 us. The network stays the policy's nn.Module
    (loaded with load_weights, evaluated by torch where this does not apply): on first use in a process its
    parameters become views of one flat buffer, which the kernel reads. tests/test_compiled.py checks it
    equal to the torch forward."""

    KINDS = {"q": 0, "mu": 2, "sac": 3}

    def __init__(self, net: nn.Module, kind: str, sizes: np.ndarray):
        self.net, self.kind, self.sizes = net, self.KINDS[kind], sizes
        self._flat: torch.Tensor | None = None
        self._ws = np.zeros(0, np.float32)

    @staticmethod
    def of(net: nn.Module, kind: str) -> "Acting | None":
        """The compiled forward of `net` (a DQN QNetwork, DDPG/TD3 Actor or SAC GaussianActor) where it applies:
        numba here, plain Linear-ReLU layers, vector observations, float32 on the CPU; else None."""
        if not available() or any(p.device.type != "cpu" or p.dtype != torch.float32 for p in net.parameters()):
            return None
        if getattr(net, "obs_ndim", 1) != 1:
            return None
        sizes = _policy_sizes(net, kind)
        return None if sizes is None else Acting(net, kind, sizes)

    def __getstate__(self) -> dict:
        # the flat buffer is made again where the policy is unpickled (views do not survive pickling)
        return {**self.__dict__, "_flat": None, "_ws": np.zeros(0, np.float32)}

    def __call__(self, obs: np.ndarray, eps: np.ndarray | None = None, out_dim: int = 0) -> np.ndarray:
        """Q values (kind q), mu(s) (mu) or SAC's tanh(mean + std eps) (sac; eps None: tanh(mean)), (B, out)."""
        if self._flat is None:
            from hetrl.algos.nets import flatten

            sgemm.bind()

            self._flat = flatten(self.net)
        x = np.ascontiguousarray(obs, np.float32).reshape(len(obs), -1)
        B = x.shape[0]
        out = np.empty((B, out_dim or int(self.sizes[-1])), np.float32)
        need = B * (int(self.sizes.sum()) + 4 * out.shape[1] + 1)
        if self._ws.shape[0] < need:
            self._ws = np.zeros(need, np.float32)
        e = eps if eps is not None else np.zeros((B, out.shape[1]), np.float32)
        _act(self._flat.numpy(), self.sizes, x, np.ascontiguousarray(e, np.float32), self.kind, self._ws, out)
        return out


def _adam(opt) -> tuple[list[np.ndarray], list[float]]:
    """A FlatAdam's (flat, grad, exp_avg, exp_avg_sq, step) as numpy views (torch.optim.Adam's own state,
    created as its first step would) and its (lr, beta1, beta2, eps)."""
    return _adam_of(opt.opt, opt.param, opt.flat, opt.grad)


def _adam_of(torch_opt, param, flat, grad) -> tuple[list[np.ndarray], list[float]]:
    st = torch_opt.state[param]
    if not st:
        st["step"] = torch.zeros((), dtype=torch.float32)
        st["exp_avg"] = torch.zeros_like(flat)
        st["exp_avg_sq"] = torch.zeros_like(flat)
    g = torch_opt.param_groups[0]
    # the views are kept on the optimizer while its tensors are the same objects (a loaded checkpoint
    # replaces them): making them each phase was ~0.1 ms of a SAC step, with the caches a phase leaves cold
    key = (flat, grad, st["exp_avg"], st["exp_avg_sq"], st["step"])
    cached = torch_opt.__dict__.get("_hetrl_views")
    if cached is None or any(a is not b for a, b in zip(cached[0], key)):
        if g["weight_decay"] or g.get("amsgrad") or g.get("maximize"):
            raise ValueError("the compiled phase implements plain Adam (no weight decay, amsgrad or maximize)")
        views = [flat.detach().view(-1).numpy(), grad.view(-1).numpy(), st["exp_avg"].view(-1).numpy(),
                 st["exp_avg_sq"].view(-1).numpy(), st["step"].view(1).numpy()]
        cached = torch_opt._hetrl_views = (key, views)
    beta1, beta2 = g["betas"]
    return cached[1], [float(g["lr"]), float(beta1), float(beta2), float(g["eps"])]


def _nets_of(algo) -> dict:
    """_nets(algo), worked out once per algorithm (its networks keep their structure)."""
    nets = algo.__dict__.get("_compiled_nets")
    if nets is None:
        nets = algo._compiled_nets = _nets(algo)
    return nets


def dqn_phase(algo, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """The K updates of a DQN phase (batches of shape (K, B, ...), weights (K, B)) in one compiled call
    on the algorithm's own buffers, targets included; returns td = Q(s, a) - y of shape (K, B)."""
    (flat, grad, m, v, step), (lr, beta1, beta2, eps) = _adam(algo.opt)
    sizes = _nets_of(algo)["q"]
    b = batches
    B = weights.shape[1]
    nl = _lane_threads(algo, B)
    ws, lane_g, _, _ = _lane_buffers(algo, B, nl, list(sizes), flat.shape[0])
    with torch.no_grad():
        discount = _discount_of(b, algo.cfg.gamma)
        target_flat = torch.cat([p.reshape(-1) for p in algo.q_target.parameters()])
        td = np.empty(tuple(b["action"].shape), np.float32)
        _dqn_mlp_phase(_f32(b["obs"]), np.ascontiguousarray(b["action"].numpy(), np.int64), _f32(b["reward"]),
                       _f32(b["next_obs"]), discount, _f32(weights), sizes, flat, target_flat.numpy(),
                       bool(algo.cfg.double), grad, m, v, step, lr, beta1, beta2, eps, float(algo.opt.max_grad_norm),
                       ws, lane_g, td)
    return torch.from_numpy(td)


def lanes(algo, B: int) -> int:
    """How many lanes a lane-parallel phase splits its batch rows over: the learner's threads (`use_threads`, else
    torch's count), at most numba's threads and B."""
    n = getattr(algo, "lane_threads", 0) or torch.get_num_threads()
    return max(1, min(int(n), B, numba.config.NUMBA_NUM_THREADS))


def _lane_buffers(algo, B: int, nl: int, widths: list, n_actor: int, n_critic: int = 0, rows: int = 0) -> tuple:
    """Per lane: a workspace for its ceil(B / nl) rows (every scratch matrix of a lane's step is at most its rows
    x the widest layer of `widths`, the sizes of its networks, and there are fewer than 3 x len(widths) + 24 of
    them); lanes 1 .. nl-1: partial gradients of the actor (DQN: the Q network) and the critics; and (3, B) rows
    for the log-probs and targets. Kept on the algorithm for the (B, nl) in use (see _mat). `rows`: the most
    rows a lane works on, where that is more than its share of the batch (a lane per critic: all B)."""
    rows = max(rows, -(-B // nl))
    key = (B, nl, n_actor, n_critic, rows)
    got = algo.__dict__.get("_lane_buffers")
    if got is None or got[0] != key:
        ws = np.zeros((nl, rows * max(widths) * (3 * len(widths) + 24)), np.float32)
        got = algo._lane_buffers = (key, (ws, np.zeros((nl - 1, n_actor), np.float32),
                                          np.zeros((nl - 1, n_critic), np.float32), np.zeros((3, B), np.float32)))
    return got[1]


def ac_phase(algo, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """The K steps of a DDPG or TD3 phase in one compiled call on the algorithm's own buffers; TD3's
    smoothing noise is drawn here from torch's RNG in the eager path's order. Returns |TD| (K, B)."""
    cfg, b, nets = algo.cfg, batches, _nets_of(algo)
    K, B, A = b["action"].shape
    if algo.name == "td3":   # standard normals, scaled and clipped in the kernel (_smoothed)
        noise = torch.stack([torch.randn(B, A, generator=algo.rng) for _ in range(K)])
        smooth = np.array([cfg.target_policy_noise, cfg.target_noise_clip], np.float32)
        n_critics, delay = 2, int(cfg.policy_delay)
    else:
        noise, smooth, n_critics, delay = torch.zeros(K, B, A), np.zeros(2, np.float32), 1, 1
    (af, ag, am, av, ast), (alr, b1, b2, eps) = _adam(algo.actor_opt)
    (cf, cg, cm, cv, cst), (clr, *_) = _adam(algo.critic_opt)
    hp = np.array([alr, clr, b1, b2, eps, float(algo.critic_opt.max_grad_norm), float(cfg.tau)], np.float64)
    nl = _lane_threads(algo, B)
    # twin critics on two lanes: a lane per critic, each on the whole batch, instead of half the batch's rows through
    # both: the same products at 256 rows instead of 128 (faster per FLOP) and a core's cache holding one critic;
    # the lanes write disjoint halves of the gradient, so there are no partial gradients to sum (_ac_phase)
    by_critic = n_critics > 1 and nl == n_critics and getattr(algo, "critic_lanes", True)
    algo.lane_split = "critics" if by_critic else "rows"
    ws, lane_ag, lane_cg, rows = _lane_buffers(algo, B, nl, [*nets["actor"], *nets["critic"]], af.shape[0], cf.shape[0],
                                               rows=B if by_critic else 0)
    with torch.no_grad():
        discount = _discount_of(b, cfg.gamma)
        td = np.empty(tuple(weights.shape), np.float32)
        algo.updates = int(_ac_phase(_f32(b["obs"]), _f32(b["action"]), _f32(b["reward"]), _f32(b["next_obs"]),
                                     discount, _f32(weights), _f32(noise), smooth, nets["actor"], nets["critic"],
                                     n_critics, af, ag, am, av, ast, cf, cg, cm, cv, cst,
                                     algo.actor_target_flat.numpy(), algo.critic_target_flat.numpy(),
                                     int(algo.updates), delay, by_critic, hp, ws, lane_ag, lane_cg, rows[0], td))
    return torch.from_numpy(td)


def sac_phase(algo, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """The K steps of a SAC phase in one compiled call on the algorithm's own buffers; the Gaussian noise
    is drawn here from torch's RNG in the eager path's order (per step: the actor's, then the next
    action's). Returns |TD| (K, B)."""
    cfg, b, nets = algo.cfg, batches, _nets_of(algo)
    K, B = weights.shape
    A = b["action"].shape[-1]
    noise = torch.stack([torch.randn(B, A, generator=algo.rng) for _ in range(2 * K)]).view(K, 2, B, A)
    (af, ag, am, av, ast), (alr, b1, b2, eps) = _adam(algo.actor_opt)
    (cf, cg, cm, cv, cst), (clr, *_) = _adam(algo.critic_opt)
    learn_alpha = algo.alpha_opt is not None
    galpha = algo.__dict__.get("_compiled_galpha")
    if galpha is None:
        galpha = algo._compiled_galpha = torch.zeros(1)
    if learn_alpha:  # log_alpha's own Adam (torch.optim.Adam's state)
        (la, _, lm, lv, lst), (al_lr, al_b1, al_b2, al_eps) = _adam_of(algo.alpha_opt, algo.log_alpha, algo.log_alpha,
                                                                       galpha)
    else:  # a fixed coefficient: the kernel never reads these
        la, (lm, lv, lst) = algo.log_alpha.detach().view(1).numpy(), np.zeros((3, 1), np.float32)
        al_lr = al_b1 = al_b2 = al_eps = 0.0
    hp = np.array([alr, clr, b1, b2, eps, float(algo.critic_opt.max_grad_norm), float(cfg.tau),
                   float(algo.target_entropy), al_lr, al_b1, al_b2, al_eps], np.float64)
    nl = _lane_threads(algo, B)
    ws, lane_ag, lane_cg, rows = _lane_buffers(algo, B, nl, [*nets["actor"], *nets["critic"]], af.shape[0], cf.shape[0])
    with torch.no_grad():
        discount = _discount_of(b, cfg.gamma)
        td = np.empty((K, B), np.float32)
        _sac_phase(_f32(b["obs"]), _f32(b["action"]), _f32(b["reward"]), _f32(b["next_obs"]), discount,
                   _f32(weights), _f32(noise[:, 0]), _f32(noise[:, 1]), nets["actor"], nets["critic"],
                   af, ag, am, av, ast, cf, cg, cm, cv, cst, algo.critic_target_flat.numpy(),
                   la, galpha.numpy(), lm, lv, lst, learn_alpha, hp, ws, lane_ag, lane_cg, rows, td)
    algo.updates += K
    return torch.from_numpy(td)


def phase(algo, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """The K gradient steps of `algo`'s phase (batches (K, B, ...), weights (K, B)) as one compiled call;
    returns |TD| (K, B) for the priorities and counts the steps in `algo.updates`."""
    if algo.name == "dqn":
        algo.updates += weights.shape[0]
        return dqn_phase(algo, batches, weights).abs_()
    if algo.name == "sac":
        return sac_phase(algo, batches, weights)
    return ac_phase(algo, batches, weights)


_warm: dict[str, float] = {}


def warm_up(name: str = "dqn") -> float:
    """Compile (or load from numba's cache) the phase of algorithm `name` before timing or training, once
    per process; returns the seconds it took (0.0 after the first time). torch's thread count is kept: numba's
    parallel regions share torch's OpenMP runtime, and their first launch sets its count to numba's."""
    if not available() or name in _warm:
        return 0.0
    t, torch_threads = time.perf_counter(), torch.get_num_threads()
    sgemm.bind()   # (timing the GEMMs is part of the warm-up's seconds)
    f = np.float32
    K, B = 1, 2
    kb, z = np.zeros((K, B), f), lambda n: np.zeros(n, f)
    if name == "dqn":
        sizes = np.array([2, 3, 2], np.int64)
        n = 2 * 3 + 3 + 3 * 2 + 2
        for double in (False, True):
            _dqn_mlp_phase(np.zeros((K, B, 2), f), np.zeros((K, B), np.int64), kb, np.zeros((K, B, 2), f), kb, kb + 1,
                           sizes, z(n), z(n), double, z(n), z(n), z(n), z(1), 1e-3, 0.9, 0.999, 1e-8, 10.0,
                           np.zeros((1, 100), f), np.zeros((0, n), f), np.empty((K, B), f))
    elif name in ("ddpg", "td3"):
        asizes, csizes = np.array([2, 3, 1], np.int64), np.array([3, 3, 1], np.int64)
        na, nc = 2 * 3 + 3 + 3 + 1, 3 * 3 + 3 + 3 + 1
        o3, a3 = np.zeros((K, B, 2), f), np.zeros((K, B, 1), f)
        _ac_phase(o3, a3, kb, o3, kb, kb + 1, a3, np.zeros(2, f), asizes, csizes, 2, z(na), z(na), z(na), z(na), z(1),
                  z(2 * nc), z(2 * nc), z(2 * nc), z(2 * nc), z(1), z(na), z(2 * nc), 0, 1, False,
                  np.array([1e-3, 1e-3, 0.9, 0.999, 1e-8, 10.0, 0.005]), np.zeros((1, 1000), f),
                  np.zeros((0, na), f), np.zeros((0, 2 * nc), f), z(B), np.empty((K, B), f))
    elif name == "sac":
        asizes, csizes = np.array([2, 3], np.int64), np.array([3, 3, 1], np.int64)
        na, nc = 2 * 3 + 3 + 2 * (3 + 1), 3 * 3 + 3 + 3 + 1
        o3, a3 = np.zeros((K, B, 2), f), np.zeros((K, B, 1), f)
        _sac_phase(o3, a3, kb, o3, kb, kb + 1, a3, a3, asizes, csizes, z(na), z(na), z(na), z(na), z(1),
                   z(2 * nc), z(2 * nc), z(2 * nc), z(2 * nc), z(1), z(2 * nc), z(1), z(1), z(1), z(1), z(1), True,
                   np.array([1e-3, 1e-3, 0.9, 0.999, 1e-8, 10.0, 0.005, -1.0, 1e-3, 0.9, 0.999, 1e-8]),
                   np.zeros((1, 1000), f), np.zeros((0, na), f), np.zeros((0, 2 * nc), f), np.zeros((3, B), f),
                   np.empty((K, B), f))
    _discounts(np.ones((K, B), np.uint8), np.zeros((K, B), np.bool_), 0.99)
    x, ws = np.zeros((1, 2), f), np.zeros(64, f)
    _act(z(2 * 3 + 3 + 3 * 2 + 2), np.array([2, 3, 2], np.int64), x, np.zeros((1, 2), f), 0, ws, np.empty((1, 2), f))
    torch.set_num_threads(torch_threads)
    _warm[name] = time.perf_counter() - t
    return _warm[name]
