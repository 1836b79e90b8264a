"""The learner's optional compiled CPU phase: all K gradient steps of one DQN phase in one native call.

The loss is written once, in hetrl/algos/dqn.py (autograd and `torch.optim.Adam(fused=True)`): that
is the reference. On a CPU, one update of a small MLP costs ~1.4 ms in torch eager, of which the
arithmetic (three 64x256x256 matrix products) is ~0.3 ms at this CPU's single-thread BLAS speed; the
rest is per-op dispatch and Python. This module runs the same K updates of a phase (the targets:
one pass of the fixed target network over all K batches, or the online argmax per step for double
DQN; forward, the Huber loss's gradient, backward, gradient-norm clip, Adam) as one numba-compiled
loop whose matrix products are BLAS calls, so a phase pays one call's overhead instead of ~40 ops x K.

It applies to DQN with a plain Linear-ReLU Q-network on vector observations (not dueling, not
pixels) on a CPU learner, and works on the same buffers as the eager path: the FlatAdam parameter
and gradient buffers and torch.optim.Adam's own state (exp_avg, exp_avg_sq, step), so checkpoints,
publishing and a switch back to eager see one state. Adam and the clip follow torch's formulas
(`_fused_adam_` on CPU, `clip_grad_norm_`); tests/test_compiled.py checks TD errors, parameters and
Adam moments equal to the eager path's within float tolerance. It is chosen by `Config.compiled`,
which the planner's profile sets where it measures this kernel the fastest of public / fast / compiled.
"""

from __future__ import annotations

import time

import numpy as np
import torch

try:  # numba is a dependency
    import numba
except ImportError:  # pragma: no cover - reported by available()
    numba = None


def available() -> bool:
    """Whether numba, and the scipy whose BLAS numba's np.dot calls, are importable here."""
    if numba is None:
        return False
    try:
        import scipy.linalg.cython_blas  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


def applies(algo) -> bool:
    """Whether `algo` has a compiled phase: DQN, plain MLP Q-network, vector observations, on a CPU."""
    return (available() and algo.name == "dqn" and not algo.cfg.dueling and not getattr(algo, "pixels", False)
            and len(algo.obs_shape) == 1 and algo.device.type == "cpu" and algo.opt.flat.dtype == torch.float32)


if numba is not None:
    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _sum_sq(x):  # pragma: no cover - compiled
        s = np.float32(0.0)
        for p in range(x.shape[0]):
            s += x[p] * x[p]
        return s

    @numba.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def _clip_adam(flat, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_norm):  # pragma: no cover
        """clip_grad_norm_(max_norm) (g *= min(1, max_norm / (||g|| + 1e-6))), then one step of torch's
        fused CPU Adam: lerp the moments, bias-correct, update."""
        n = flat.shape[0]
        coef = np.float32(1.0)
        if max_norm > 0:
            coef = np.float32(min(1.0, max_norm / (np.sqrt(np.float64(_sum_sq(grad))) + 1e-6)))
        step[0] += 1
        t = np.float64(step[0])
        bc1 = 1.0 - beta1 ** t
        step_size = np.float32(lr / bc1)
        b1, b2 = np.float32(1.0 - beta1), np.float32(beta2)
        ib2, e, bc2f = np.float32(1.0 - beta2), np.float32(eps), np.float32(np.sqrt(1.0 - beta2 ** t))
        for p in range(n):
            g = grad[p] * coef
            m = exp_avg[p] + b1 * (g - exp_avg[p])
            v = b2 * exp_avg_sq[p] + ib2 * g * g
            exp_avg[p] = m
            exp_avg_sq[p] = v
            flat[p] -= step_size * m / (np.sqrt(v) / bc2f + e)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _offsets(sizes):  # pragma: no cover - compiled
        """Where each layer's weight (out, in) and then bias start in a flat parameter buffer."""
        offs = np.empty(sizes.shape[0] - 1, np.int64)
        o = 0
        for l in range(sizes.shape[0] - 1):
            offs[l] = o
            o += sizes[l + 1] * sizes[l] + sizes[l + 1]
        return offs

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _forward(flat, sizes, offs, x, acts):  # pragma: no cover - compiled
        """acts[l] = relu(acts[l-1] @ W_l.T + b_l) (acts[-1] = x; no relu on the last layer)."""
        L = sizes.shape[0] - 1
        for l in range(L):
            fi, fo = sizes[l], sizes[l + 1]
            W = flat[offs[l]:offs[l] + fo * fi].reshape((fo, fi))
            b = flat[offs[l] + fo * fi:offs[l] + fo * fi + fo]
            a = acts[l]
            np.dot(x if l == 0 else acts[l - 1], W.T, a)
            last = l == L - 1
            for i in range(a.shape[0]):
                for j in range(fo):
                    v = a[i, j] + b[j]
                    a[i, j] = v if (last or v > 0) else np.float32(0.0)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _dqn_mlp_phase(obs, action, reward, next_obs, discount, weight, sizes, flat, target_flat, double,
                       grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_norm, td_out):  # pragma: no cover
        """K updates of mean(w * huber(Q(s)[a] - y)) on an MLP whose parameters (per layer: weight
        (out, in), then bias) are views of `flat`, with y = r + discount * Q_target(s')[a'] where a' is
        argmax Q_target(s') (plain; all K from one pass of the fixed target net) or argmax Q(s') at the
        current parameters (double); Adam as torch's fused CPU kernel; td_out[k] = Q(s)[a] - y."""
        K, B = action.shape
        L = sizes.shape[0] - 1
        A = sizes[L]
        offs = _offsets(sizes)
        acts = [np.empty((B, sizes[l + 1]), np.float32) for l in range(L)]   # layer outputs
        grads = [np.empty((B, sizes[l]), np.float32) for l in range(L + 1)]  # dloss/d(layer input)
        # the target net is fixed during the phase: its Q(s') for all K batches in one pass
        tacts = [np.empty((K * B, sizes[l + 1]), np.float32) for l in range(L)]
        _forward(target_flat, sizes, offs, next_obs.reshape((K * B, sizes[0])), tacts)
        next_q = tacts[L - 1].reshape((K, B, A))
        target = np.empty(B, np.float32)
        one = np.float32(1.0)
        for k in range(K):
            if double:  # a' from the online net as it is now
                _forward(flat, sizes, offs, next_obs[k], acts)
            for i in range(B):
                best = 0
                for j in range(1, A):
                    if (acts[L - 1][i, j] > acts[L - 1][i, best]) if double else (next_q[k, i, j] > next_q[k, i, best]):
                        best = j
                target[i] = reward[k, i] + discount[k, i] * next_q[k, i, best]
            x = obs[k]
            _forward(flat, sizes, offs, x, acts)
            # d/dq of the loss: w * clip(td, -1, 1) / B at the taken action
            g = grads[L]
            g[:, :] = 0
            for i in range(B):
                ai = action[k, i]
                td = acts[L - 1][i, ai] - target[i]
                td_out[k, i] = td
                c = min(max(td, -one), one)
                g[i, ai] = weight[k, i] * c / np.float32(B)
            # backward: dW_l = g_l.T @ a_{l-1}, db_l = sum g_l, g_{l-1} = (g_l @ W_l) * (a_{l-1} > 0)
            for l in range(L - 1, -1, -1):
                fi, fo = sizes[l], sizes[l + 1]
                gl = grads[l + 1]
                dW = grad[offs[l]:offs[l] + fo * fi].reshape((fo, fi))
                db = grad[offs[l] + fo * fi:offs[l] + fo * fi + fo]
                np.dot(gl.T, x if l == 0 else acts[l - 1], dW)
                for j in range(fo):
                    db[j] = 0
                for i in range(B):
                    for j in range(fo):
                        db[j] += gl[i, j]
                if l > 0:
                    W = flat[offs[l]:offs[l] + fo * fi].reshape((fo, fi))
                    gp = grads[l]
                    np.dot(gl, W, gp)
                    ap = acts[l - 1]
                    for i in range(B):
                        for j in range(fi):
                            if ap[i, j] <= 0:
                                gp[i, j] = 0
            _clip_adam(flat, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_norm)


_blas_threads: list[int] = []


def _limit_blas(threads: int) -> None:
    """The compiled phase's BLAS (scipy's OpenBLAS) gets the learner's thread count, as torch's does."""
    if _blas_threads[-1:] != [threads]:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")
        _blas_threads[:] = [threads]


def _f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.numpy(), np.float32)


def dqn_phase(algo, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """The K updates of a DQN phase (batches of shape (K, B, ...), weights (K, B)) in one compiled call
    on the algorithm's own buffers, targets included; returns td = Q(s, a) - y of shape (K, B)."""
    opt = algo.opt
    st = opt.opt.state[opt.param]
    if not st:  # torch.optim.Adam's state, created as its first step would
        st["step"] = torch.zeros((), dtype=torch.float32)
        st["exp_avg"] = torch.zeros_like(opt.flat)
        st["exp_avg_sq"] = torch.zeros_like(opt.flat)
    g = opt.opt.param_groups[0]
    beta1, beta2 = g["betas"]
    if g["weight_decay"]:
        raise ValueError("the compiled DQN phase has no weight decay")
    sizes = np.array([lin.in_features for lin in algo.q.q if isinstance(lin, torch.nn.Linear)]
                     + [algo.n_actions], dtype=np.int64)
    _limit_blas(torch.get_num_threads())
    b = batches
    with torch.no_grad():
        discount = algo.cfg.gamma ** b["steps"].float() * (~b["terminated"]).float()
        target_flat = torch.cat([p.reshape(-1) for p in algo.q_target.parameters()])
        td = np.empty(tuple(b["action"].shape), np.float32)
        _dqn_mlp_phase(_f32(b["obs"]), np.ascontiguousarray(b["action"].numpy(), np.int64), _f32(b["reward"]),
                       _f32(b["next_obs"]), _f32(discount), _f32(weights), sizes, opt.flat.numpy(),
                       target_flat.numpy(), bool(algo.cfg.double), opt.grad.numpy(), st["exp_avg"].numpy(),
                       st["exp_avg_sq"].numpy(), st["step"].view(1).numpy(), float(g["lr"]), float(beta1),
                       float(beta2), float(g["eps"]), float(opt.max_grad_norm), td)
    return torch.from_numpy(td)


def warm_up() -> float:
    """Compile (or load from numba's cache) before timing or training; returns the seconds it took."""
    if not available():
        return 0.0
    t = time.perf_counter()
    K, B, sizes = 1, 2, np.array([2, 3, 2], np.int64)
    n = 2 * 3 + 3 + 3 * 2 + 2
    z, kb = np.zeros(n, np.float32), np.zeros((K, B), np.float32)
    for double in (False, True):
        _dqn_mlp_phase(np.zeros((K, B, 2), np.float32), np.zeros((K, B), np.int64), kb, np.zeros((K, B, 2), np.float32),
                       kb, kb + 1, sizes, z.copy(), z.copy(), double, z.copy(), z.copy(), z.copy(),
                       np.zeros(1, np.float32), 1e-3, 0.9, 0.999, 1e-8, 10.0, np.empty((K, B), np.float32))
    return time.perf_counter() - t

