"""DQN's loss head (plain and double): K updates of mean(w * huber(Q(s)[a] - y)) in one compiled call.

    y = r + gamma**n (1 - terminated) Q_target(s')[a'],   a' = argmax Q_target(s')  (plain)
                                                           a' = argmax Q(s')         (double: the current net)

The target network is fixed during a phase, so Q_target(s') of all K batches comes from one pass over the
K B rows (in fixed chunks that stay in cache, taken by the lanes); then per step, over fixed row blocks taken by
the lanes, the forward, the Huber loss's gradient w * clip(td, -1, 1) / B at the taken action and the backward
(a block's partial gradient in its own slot), the clip and Adam. The last step's loss is the algorithm's `stats`.
"""

from __future__ import annotations

import numpy as np
import torch

from hetrl.kernels.compiled.head import (
    Declined,
    Head,
    covers,
    discount_of,
    f32,
    f32kb,
    optimizer,
    program,
    vector_obs,
)
from hetrl.kernels.compiled.layers import Program
from hetrl.kernels.compiled.optim import blocks

try:
    import numba

    from hetrl.kernels.compiled.layers import backward, forward, grad_buffers, mat, tape
    from hetrl.kernels.compiled.optim import lanes_clip_adam, ticket
except ImportError:  # pragma: no cover
    numba = None

CHUNK = 512   # rows of the target network's pass at a time


class DQNHead(Head):
    algos = ("dqn",)

    @classmethod
    def programs(cls, algo) -> dict:
        vector_obs(algo)
        if getattr(algo.q, "dueling", False):
            raise Declined("the Q network is dueling (value and advantage heads), which the compiled kernel has no "
                           "piece for")
        opt = optimizer(algo.opt, "the Q network")
        q = program(algo.q.q, opt.flat, "the Q network")
        covers(opt, q.count, "the Q network")
        tq = program(algo.q_target.q, algo.q_target_flat, "the target Q network")
        if not ((tq.ops == q.ops).all() and (tq.fc == q.fc).all()):
            raise Declined("the target Q network is not laid out as the Q network")
        return {"q": q, "opt": opt}

    def __init__(self, algo, **options):
        super().__init__(algo, **options)
        p = self.programs(algo)
        self.q: Program = p["q"]
        self.opt = p["opt"]

    def _need(self, rows: int) -> int:
        return max(self.q.floats(rows) + rows * (self.q.n_out + 1), self.q.floats(CHUNK, grads=False)) + 64

    def _lane_buffers(self, B: int, nl: int, n: int) -> tuple:
        """The lanes' workspaces (one per lane, for a block's rows) and the row blocks' partial gradients (one slot
        per block after the first, which writes the optimizer's)."""
        def make():
            nb = blocks(B)
            return (np.zeros((nl, self._need(-(-B // nb))), np.float32), np.zeros((nb - 1, n), np.float32),
                    np.zeros(B, np.float32))
        return self.buffers((B, nl, n, blocks(B)), make)

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor, nl: int) -> torch.Tensor:
        algo, b = self.algo, batches
        K, B = weights.shape
        (flat, grad, m, v, step), (lr, beta1, beta2, eps) = self.opt.get()
        ws, slots, rows = self._lane_buffers(B, nl, flat.shape[0])
        with torch.no_grad():
            target_flat = algo.q_target_flat.numpy()   # (the target's parameters are views of it)
            td = np.empty((K, B), np.float32)
            next_q = np.empty((K, B, self.q.n_out), np.float32)
            phase(f32(b["obs"], K, B), np.ascontiguousarray(b["action"].numpy(), np.int64), f32kb(b["reward"]),
                  f32(b["next_obs"], K, B), discount_of(b, algo.cfg.gamma), f32kb(weights), self.q.ops, self.q.fc,
                  flat, target_flat, bool(algo.cfg.double), grad, m, v, step, lr, beta1, beta2, eps,
                  float(algo.opt.max_grad_norm), nl, ws, slots, next_q, td, rows)
        algo.updates += K
        algo.stats = {"loss": torch.tensor(_sum(rows))}   # mean(w huber(td)) of the last step, as learn's
        return torch.from_numpy(td).abs_()

    def warm(self, nl: int) -> None:
        (flat, grad, m, v, step), (lr, beta1, beta2, eps) = self.opt.get()
        K, B, d = 1, 2, self.q.n_in
        c = [x.copy() for x in (flat, grad, m, v, step)]
        ws, slots = np.zeros((nl, self._need(B)), np.float32), np.zeros((0, flat.shape[0]), np.float32)
        z = np.zeros((K, B), np.float32)
        for double in (False, True):
            phase(np.zeros((K, B, d), np.float32), np.zeros((K, B), np.int64), z, np.zeros((K, B, d), np.float32),
                  z + 1, z + 1, self.q.ops, self.q.fc, c[0], c[0].copy(), double, c[1], c[2], c[3], c[4],
                  lr, beta1, beta2, eps, 1.0, nl, ws, slots, np.empty((K, B, self.q.n_out), np.float32),
                  np.empty((K, B), np.float32), np.zeros(B, np.float32))


if numba is not None:
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _target_rows(ops, fc, target_flat, nxt, nq, lo, hi, ws):  # pragma: no cover - compiled
        """nq[lo:hi] = Q_target(nxt[lo:hi]), CHUNK rows at a time on the workspace ws."""
        for s in range(lo, hi, CHUNK):
            e = min(s + CHUNK, hi)
            pos = np.zeros(1, np.int64)
            nq[s:e] = forward(ops, fc, target_flat, nxt[s:e], tape(ws, pos, ops, e - s))

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _sum(x):  # pragma: no cover - compiled
        """x's sum in row order, in float32 (as the loss's mean reduces its rows, up to the order of additions)."""
        s = np.float32(0.0)
        for i in range(x.shape[0]):
            s += x[i]
        return s

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _block(b, nb, k, obs, action, reward, discount, weight, ops, fc, flat, grad, double, next_q, next_obs, ws,
               td_out, rows):  # pragma: no cover - compiled
        """Row block b of nb of update k: rows lo:hi of the batch, the loss's gradient into the block's `grad`, each
        row's share of the loss w huber(td) / B into rows."""
        _, B = action.shape
        lo, hi = b * B // nb, (b + 1) * B // nb
        R = hi - lo
        n = ops.shape[0]
        A = ops[n - 1, 2]
        pos = np.zeros(1, np.int64)
        t = tape(ws, pos, ops, R)
        gs = grad_buffers(ws, pos, ops, R)
        g, target = mat(ws, pos, R, A), mat(ws, pos, 1, R)[0]
        one, half, Bf = np.float32(1.0), np.float32(0.5), np.float32(B)
        q = t[3 * n - 3]
        if double:  # a' from the online net as it is now
            forward(ops, fc, flat, next_obs[k, lo:hi], t)
        for i in range(R):
            best = 0
            for j in range(1, A):
                if (q[i, j] > q[i, best]) if double else (next_q[k, lo + i, j] > next_q[k, lo + i, best]):
                    best = j
            target[i] = reward[k, lo + i] + discount[k, lo + i] * next_q[k, lo + i, best]
        x = obs[k, lo:hi]
        forward(ops, fc, flat, x, t)
        g[:, :] = 0   # d/dq of the loss: w * clip(td, -1, 1) / B at the taken action
        for i in range(R):
            ai = action[k, lo + i]
            td = q[i, ai] - target[i]
            td_out[k, lo + i] = td
            w = weight[k, lo + i]
            g[i, ai] = w * min(max(td, -one), one) / Bf
            a = abs(td)
            rows[lo + i] = w * (half * td * td if a < one else a - half) / Bf
        backward(ops, flat, grad, x, t, gs, g, True, False)

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def phase(obs, action, reward, next_obs, discount, weight, ops, fc, flat, target_flat, double, grad, exp_avg,
              exp_avg_sq, step, lr, beta1, beta2, eps, max_norm, nl, ws, slots, next_q, td_out,
              rows):  # pragma: no cover
        """K updates on nl lanes; td_out[k] = Q(s)[a] - y, rows: the last update's loss per row. Row block 0 writes
        `grad`, block b > 0 slots[b - 1]; the lanes take chunks and blocks from ticket counters."""
        K, B = action.shape
        nb = slots.shape[0] + 1
        D, A = next_obs.shape[2], next_q.shape[2]
        nxt, nq = next_obs.reshape((K * B, D)), next_q.reshape((K * B, A))
        counter = np.zeros(K + 1, np.int64)
        chunks = -(-(K * B) // CHUNK)
        for c in numba.prange(nl):
            lane = np.int64(c)   # (one type for the loop index, one compile of the callee: see actor_critic.py)
            while True:
                s = ticket(counter[0:1])
                if s >= chunks:
                    break
                _target_rows(ops, fc, target_flat, nxt, nq, s * CHUNK, min((s + 1) * CHUNK, K * B), ws[lane])
        for k in range(K):
            for c in numba.prange(nl):
                lane = np.int64(c)
                while True:
                    b = ticket(counter[k + 1:k + 2])
                    if b >= nb:
                        break
                    _block(b, nb, k, obs, action, reward, discount, weight, ops, fc, flat,
                           grad if b == 0 else slots[b - 1], double, next_q, next_obs, ws[lane], td_out, rows)
            lanes_clip_adam(flat, grad, slots, nl, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_norm)
