"""SAC's loss head: K steps of the squashed-Gaussian actor, the entropy coefficient, the twin soft critics.

Per step, in the order of hetrl/algos/sac.py (the reference):
    a = tanh(u), u = mean(s) + exp(clamp(log_std(s))) e        (the actor's body program, then its two Linear heads)
    log pi(a|s) = sum(-e^2 / 2 - log_std - log(2 pi) / 2 - 2 (log 2 - u - softplus(-2u)))     (stable tanh term)
    alpha loss  = -mean(log_alpha (log pi + target_entropy))    (its own Adam step, where alpha is learned)
    y           = r + gamma**n (1 - terminated) (min_c Q_c,t(s', a') - alpha log pi(a'|s'))
    critics     = 0.5 mean(w (Q_1(s, a_buf) - y)^2) + 0.5 mean(w (Q_2(s, a_buf) - y)^2)
    actor       = mean(alpha log pi(a|s) - min(Q_1(s, a), Q_2(s, a)))       (the critics after their step)
    Polyak targets (critics).
alpha is the value before this step's update; the two Gaussian draws per step come from torch's RNG in the
eager order. The rows run in fixed row blocks (optim.blocks) that the lanes take from ticket counters, each on its
own workspace (the actor's part reads the actor pass its critics' part kept) and writing its partial gradients into
its own slots, summed in block order: the same bits on any number of lanes. The last step's losses and alpha are
the algorithm's `stats`. The actor's gradient goes back through min (halved on a tie, as torch's), tanh, the log-prob's
2 tanh(u) and the clamped log_std.
"""

from __future__ import annotations

import numpy as np
import torch

from hetrl.algos.nets import LOG_STD_MAX, LOG_STD_MIN
from hetrl.kernels.compiled.head import (
    Alpha,
    Declined,
    Head,
    covers,
    discount_of,
    f32,
    f32kb,
    gaussian_heads,
    optimizer,
    program,
    same_layout,
    vector_obs,
)
from hetrl.kernels.compiled.optim import blocks

try:
    import numba

    from hetrl.kernels.compiled.head import cat
    from hetrl.kernels.compiled.layers import (
        backward,
        forward,
        forward_with,
        gemm,
        grad_buffers,
        mat,
        tanh32,
        tape,
    )
    from hetrl.kernels.compiled.optim import clip_adam, lanes_clip_adam, lanes_polyak, ticket
except ImportError:  # pragma: no cover
    numba = None


class SACHead(Head):
    algos = ("sac",)

    @classmethod
    def programs(cls, algo) -> dict:
        vector_obs(algo)
        aopt, copt = optimizer(algo.actor_opt, "the actor"), optimizer(algo.critic_opt, "the critic")
        actor = algo.actor
        body = program(actor.body, aopt.flat, "the actor's body")
        heads = gaussian_heads(actor, body, aopt.flat, algo.act_dim)
        names = ["critic 1", "critic 2"]
        if len(algo.critics) != 2:
            raise Declined(f"the algorithm has {len(algo.critics)} critics; the SAC head takes two")
        cprogs = [program(c.q, copt.flat, n) for c, n in zip(algo.critics, names)]
        for c, p, n in zip(algo.critics_target, cprogs, names):
            same_layout(p, program(c.q, algo.critic_target_flat, f"the target of {n}"), f"the target of {n}")
        if cprogs[1].ops.shape != cprogs[0].ops.shape or not (
                cprogs[1].shifted(cprogs[0].lo - cprogs[1].lo).ops == cprogs[0].ops).all():
            raise Declined("critic 2 is not built as critic 1, which the twin-critic head needs")
        covers(aopt, body.count + 2 * (algo.act_dim * body.n_out + algo.act_dim), "the actor")
        covers(copt, sum(p.count for p in cprogs), "the critic")
        if cprogs[0].n_out != 1 or cprogs[0].n_in != body.n_in + algo.act_dim:
            raise Declined("the critics' widths do not fit the observation and action sizes")
        Alpha.check(algo)
        return {"body": body, "heads": heads, "critics": cprogs, "actor_opt": aopt,
                "critic_opt": copt}

    def __init__(self, algo, **options):
        super().__init__(algo, **options)
        p = self.programs(algo)
        self.body, self.heads, self.critics = p["body"], p["heads"], p["critics"]
        self.aopt, self.copt = p["actor_opt"], p["critic_opt"]
        self.cops = np.ascontiguousarray(np.stack([c.ops for c in self.critics]))
        self.alpha = Alpha(algo)

    def _need(self, rows: int) -> int:
        """Floats of a row block's workspace for `rows` rows (what _carve carves)."""
        a, c = self.body, self.critics[0]
        A, H = self.algo.act_dim, a.n_out
        return (2 * a.floats(rows, grads=False) + a.floats(rows) - a.floats(rows, grads=False) + 2 * c.floats(rows)
                + rows * (11 * A + H + c.n_in + 3) + 256)

    def _args(self):
        (af, ag, am, av, ast), (alr, b1, b2, eps) = self.aopt.get()
        (cf, cg, cm, cv, cst), (clr, *_) = self.copt.get()
        algo = self.algo
        al, (al_lr, al_b1, al_b2, al_eps) = self.alpha.get()
        hp = self.consts("hp", (alr, clr, b1, b2, eps, float(algo.critic_opt.max_grad_norm), float(algo.cfg.tau),
                                float(algo.target_entropy), al_lr, al_b1, al_b2, al_eps))
        return [af, ag, am, av, ast], [cf, cg, cm, cv, cst], al, hp

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor, nl: int) -> torch.Tensor:
        algo, b = self.algo, batches
        K, B = weights.shape
        A = algo.act_dim
        g = getattr(algo, "rng", None)   # the algorithm's generator, drawn from in learn's order (s, then s')
        noise = torch.stack([torch.randn(B, A, generator=g) for _ in range(2 * K)]).view(K, 2, B, A)
        a, c, al, hp = self._args()
        nb = blocks(B)
        rows = -(-B // nb)
        ws, slot_ag, slot_cg, rb = self.buffers(   # a workspace and a gradient slot per row block
            (B, a[0].shape[0], c[0].shape[0], nb),
            lambda: (np.zeros((nb, self._need(rows)), np.float32), np.zeros((nb - 1, a[0].shape[0]), np.float32),
                     np.zeros((nb - 1, c[0].shape[0]), np.float32), np.zeros((6, B), np.float32)))
        losses = np.zeros(4, np.float32)
        with torch.no_grad():
            td = np.empty((K, B), np.float32)
            phase(f32(b["obs"], K, B), f32(b["action"], K, B), f32kb(b["reward"]), f32(b["next_obs"], K, B),
                  discount_of(b, algo.cfg.gamma), f32kb(weights), np.ascontiguousarray(noise[:, 0].numpy()),
                  np.ascontiguousarray(noise[:, 1].numpy()), self.body.ops, self.body.fc, self.heads, self.cops,
                  self.critics[0].fc, *a, *c, algo.critic_target_flat.numpy(), *al, self.alpha.learned, hp, nl, ws,
                  slot_ag, slot_cg, rb, td, losses)
        algo.updates += K
        # the last step's, as learn leaves them: alpha before its update, the alpha loss where alpha is learned
        stats = {"ent_coef": torch.tensor(losses[2]).reshape(algo.log_alpha.shape)}
        if self.alpha.learned:
            stats["ent_coef_loss"] = torch.tensor(losses[3])
        algo.stats = {**stats, "actor_loss": torch.tensor(losses[1]), "critic_loss": torch.tensor(losses[0])}
        return torch.from_numpy(td)

    def warm(self, nl: int) -> None:
        a, c, al, hp = self._args()
        a, c, al = [x.copy() for x in a], [x.copy() for x in c], [x.copy() for x in al]
        K, B, A, d = 1, 2, self.algo.act_dim, self.body.n_in
        o, act, z = np.zeros((K, B, d), np.float32), np.zeros((K, B, A), np.float32), np.zeros((K, B), np.float32)
        phase(o, act, z, o, z + 1, z + 1, act, act.copy(), self.body.ops, self.body.fc, self.heads, self.cops,
              self.critics[0].fc, *a, *c, c[0].copy(), *al, True, hp, nl, np.zeros((1, self._need(B)), np.float32),
              np.zeros((0, a[0].shape[0]), np.float32), np.zeros((0, c[0].shape[0]), np.float32),
              np.zeros((6, B), np.float32), np.empty((K, B), np.float32), np.zeros(4, np.float32))


if numba is not None:
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _squashed(ops, fc, heads, actor, x, t, e, mean, lsr, u, a, logp, state, train):  # pragma: no cover
        """The actor on x: its body (program ops; BRN statistics in `state`, training mode where `train`), the mean
        and raw log_std heads, u = mean + exp(clamp(log_std)) e, a = tanh(u), log pi(a|s) with the stable tanh
        correction (GaussianActor.sample; CrossQ's Actor.sample)."""
        B, A = mean.shape
        h = forward_with(ops, fc, actor, x, t, state, train)
        H = h.shape[1]
        mw, mb, lw, lb = heads[0], heads[1], heads[2], heads[3]
        gemm(h, actor[mw:mw + A * H].reshape((A, H)).T, mean, np.float32(0.0))
        gemm(h, actor[lw:lw + A * H].reshape((A, H)).T, lsr, np.float32(0.0))
        half_log_2pi, log2 = np.float32(0.5 * np.log(2 * np.pi)), np.float32(np.log(2.0))
        for i in range(B):
            s = np.float32(0.0)
            for j in range(A):
                m = mean[i, j] + actor[mb + j]
                mean[i, j] = m
                r = lsr[i, j] + actor[lb + j]
                lsr[i, j] = r
                ls = min(max(r, np.float32(LOG_STD_MIN)), np.float32(LOG_STD_MAX))
                uu = m + np.exp(ls) * e[i, j]
                u[i, j] = uu
                a[i, j] = tanh32(uu)
                z = np.float32(-2.0) * uu
                sp = z if z > 20 else np.log1p(np.exp(z))   # softplus (torch's threshold 20)
                s += np.float32(-0.5) * e[i, j] * e[i, j] - ls - half_log_2pi
                s -= np.float32(2.0) * (log2 - uu - sp)
            logp[i] = s

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _carve(ws, R, aops, cops, do, A):  # pragma: no cover - compiled
        """A row block's matrices for R rows, carved from ws the same way for both parts of a step (the actor's part
        reads the actor pass the critics' part kept)."""
        H = aops[aops.shape[0] - 1, 2]
        pos = np.zeros(1, np.int64)
        ta, tn, ga = tape(ws, pos, aops, R), tape(ws, pos, aops, R), grad_buffers(ws, pos, aops, R)
        tc0, tc1, gc = tape(ws, pos, cops[0], R), tape(ws, pos, cops[0], R), grad_buffers(ws, pos, cops[0], R)
        heads = (mat(ws, pos, R, A), mat(ws, pos, R, A), mat(ws, pos, R, A), mat(ws, pos, R, A))   # mean, lsr, u, a
        nheads = (mat(ws, pos, R, A), mat(ws, pos, R, A), mat(ws, pos, R, A), mat(ws, pos, R, A))
        grads = (mat(ws, pos, R, A), mat(ws, pos, R, A), mat(ws, pos, R, A), mat(ws, pos, R, H))  # d a, d mean, d ls, d h
        x, g, qa = mat(ws, pos, R, do + A), mat(ws, pos, R, 1), mat(ws, pos, 2, R)
        return ta, tn, ga, tc0, tc1, gc, heads, nheads, grads, x, g, qa

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _critic_rows(b, nb, k, obs, action, reward, next_obs, discount, weight, eps_pi, eps_next, aops, afc, heads,
                     cops, cfc, actor, critic, cgrad, critic_t, alpha, ws, logp, nlogp, y, closs,
                     td_out):  # pragma: no cover
        """Row block b of nb of step k, rows lo:hi of the batch: both actions and log-probs, the soft twin-min
        target, the critics' loss gradient (into the block's cgrad), each row's share of the critics' losses into
        closs."""
        _, B, do = obs.shape
        A = action.shape[2]
        lo, hi = b * B // nb, (b + 1) * B // nb
        R = hi - lo
        ta, tn, _, tc0, _, gc, (mean, lsr, u, a), (nmean, nlsr, nu, na), _, x, g, _ = _carve(ws, R, aops, cops,
                                                                                             do, A)
        Bf = np.float32(B)
        xo, xn = obs[k, lo:hi], next_obs[k, lo:hi]
        _squashed(aops, afc, heads, actor, xo, ta, eps_pi[k, lo:hi], mean, lsr, u, a, logp[lo:hi], actor, False)
        _squashed(aops, afc, heads, actor, xn, tn, eps_next[k, lo:hi], nmean, nlsr, nu, na, nlogp[lo:hi], actor,
                  False)
        cat(xn, na, x)
        for cc in range(2):
            q = forward(cops[cc], cfc, critic_t, x, tc0)
            for i in range(R):
                y[lo + i] = q[i, 0] if cc == 0 else min(y[lo + i], q[i, 0])
        for i in range(R):
            y[lo + i] = reward[k, lo + i] + discount[k, lo + i] * (y[lo + i] - alpha * nlogp[lo + i])
            td_out[k, lo + i] = 0
        cat(xo, action[k, lo:hi], x)
        for cc in range(2):  # critic loss 0.5 mean(w td1^2) + 0.5 mean(w td2^2)
            q = forward(cops[cc], cfc, critic, x, tc0)
            for i in range(R):
                td = q[i, 0] - y[lo + i]
                td_out[k, lo + i] += np.float32(0.5) * abs(td)
                g[i, 0] = weight[k, lo + i] * td / Bf
                closs[cc, lo + i] = np.float32(0.5) * weight[k, lo + i] * td * td / Bf
            backward(cops[cc], critic, cgrad, x, tc0, gc, g, True, False)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _actor_rows(b, nb, k, obs, eps_pi, aops, heads, cops, cfc, actor, agrad, critic, cgrad, alpha,
                    ws, logp, aloss):  # pragma: no cover - compiled
        """Row block b of nb of step k (after the critics' step), rows lo:hi: the gradient of the actor loss
        mean(alpha log pi(a|s) - min(Q1(s, a), Q2(s, a))) into the block's agrad, from _critic_rows' actor pass
        (the block's workspace), each row's share of the loss into aloss."""
        _, B, do = obs.shape
        A = eps_pi.shape[2]
        lo, hi = b * B // nb, (b + 1) * B // nb
        R = hi - lo
        ta, _, ga, tc0, tc1, gc, (_, lsr, _, a), _, (ga_, dmean, dls, dh), x, g, qa = _carve(ws, R, aops, cops,
                                                                                            do, A)
        one, Bf = np.float32(1.0), np.float32(B)
        xo = obs[k, lo:hi]
        cat(xo, a, x)
        q0 = forward(cops[0], cfc, critic, x, tc0)
        q1 = forward(cops[1], cfc, critic, x, tc1)
        for i in range(R):
            qa[0, i] = q0[i, 0]
            qa[1, i] = q1[i, 0]
            aloss[lo + i] = (alpha * logp[lo + i] - min(q0[i, 0], q1[i, 0])) / Bf
        ga_[:, :] = 0
        for cc in range(2):
            for i in range(R):  # torch.min's gradient: to the smaller, halved on a tie
                q, other = qa[cc, i], qa[1 - cc, i]
                g[i, 0] = 0 if q > other else (-one / Bf if q < other else np.float32(-0.5) / Bf)
            gin = backward(cops[cc], critic, cgrad, x, tc0 if cc == 0 else tc1, gc, g, False, True)
            for i in range(R):
                for j in range(A):
                    ga_[i, j] += gin[i, do + j]
        _heads_grad(ga_, a, lsr, eps_pi[k, lo:hi], alpha / Bf, ta[3 * aops.shape[0] - 3], heads, actor, agrad, dmean,
                    dls, dh)
        backward(aops, actor, agrad, xo, ta, ga, dh, True, False)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _heads_grad(ga_, a, lsr, e, alpha_n, h, heads, actor, agrad, dmean, dls, dh):  # pragma: no cover - compiled
        """The actor loss's gradient through the squashed Gaussian and its two Linear heads: ga_ the loss's gradient
        w.r.t. the actions a = tanh(u), alpha_n the entropy term's weight per row (alpha / B); the heads' gradients
        into agrad, the body's output's into dh."""
        R, A = a.shape
        one = np.float32(1.0)
        for i in range(R):
            for j in range(A):
                # d/du: through a = tanh(u) and the log-prob's correction (d log pi / du = 2 tanh(u))
                du = ga_[i, j] * (one - a[i, j] * a[i, j]) + alpha_n * np.float32(2.0) * a[i, j]
                dmean[i, j] = du
                r = lsr[i, j]
                inside = r >= np.float32(LOG_STD_MIN) and r <= np.float32(LOG_STD_MAX)
                dls[i, j] = (du * np.exp(r) * e[i, j] - alpha_n) if inside else np.float32(0.0)
        H = h.shape[1]
        mw, mb, lw, lb = heads[0], heads[1], heads[2], heads[3]
        zero = np.float32(0.0)
        gemm(dmean.T, h, agrad[mw:mw + A * H].reshape((A, H)), zero)
        gemm(dls.T, h, agrad[lw:lw + A * H].reshape((A, H)), zero)
        for j in range(A):
            sm, sl = zero, zero
            for i in range(R):
                sm += dmean[i, j]
                sl += dls[i, j]
            agrad[mb + j] = sm
            agrad[lb + j] = sl
        gemm(dmean, actor[mw:mw + A * H].reshape((A, H)), dh, zero)
        gemm(dls, actor[lw:lw + A * H].reshape((A, H)), dh, one)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _sum(x):  # pragma: no cover - compiled
        s = np.float32(0.0)
        for i in range(x.shape[0]):
            s += x[i]
        return s

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def phase(obs, action, reward, next_obs, discount, weight, eps_pi, eps_next, aops, afc, heads, cops, cfc,
              actor, agrad, am, av, astep, critic, cgrad, cm, cv, cstep, critic_t,
              log_alpha, galpha, alm, alv, alstep, learn_alpha, hp, nl, ws, slot_ag, slot_cg, rows,
              td_out, losses):  # pragma: no cover - compiled
        """K steps of SAC on nl lanes with the Gaussian noise given (eps_pi: the actor's and alpha's, eps_next: the
        target's next action). Row block 0 writes the optimizers' gradient buffers, block b > 0 slot_ag / slot_cg[b -
        1], each on its workspace ws[b]. losses: the last step's critic loss, actor loss, alpha, alpha loss."""
        K, B, _ = obs.shape
        nb = ws.shape[0]
        alr, clr, b1, b2, eps, max_norm, tau, te = hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6], hp[7]
        al_lr, al_b1, al_b2, al_eps = hp[8], hp[9], hp[10], hp[11]
        logp, nlogp, y, closs, aloss = rows[0], rows[1], rows[2], rows[3:5], rows[5]
        counter = np.zeros((K, 2), np.int64)
        for k in range(K):
            alpha = np.float32(np.exp(log_alpha[0]))  # before this step's alpha update
            for c in numba.prange(nl):
                while True:
                    b = ticket(counter[k, 0:1])
                    if b >= nb:
                        break
                    _critic_rows(b, nb, k, obs, action, reward, next_obs, discount, weight, eps_pi, eps_next, aops,
                                 afc, heads, cops, cfc, actor, critic, cgrad if b == 0 else slot_cg[b - 1], critic_t,
                                 alpha, ws[b], logp, nlogp, y, closs, td_out)
            losses[2] = alpha
            if learn_alpha:
                s = np.float32(0.0)
                for i in range(B):
                    s += logp[i] + np.float32(te)
                galpha[0] = -s / np.float32(B)
                losses[3] = log_alpha[0] * galpha[0]   # -mean(log_alpha (log pi + target_entropy)), before its step
                clip_adam(log_alpha, galpha, alm, alv, alstep, al_lr, al_b1, al_b2, al_eps, 0.0)
            lanes_clip_adam(critic, cgrad, slot_cg, nl, cm, cv, cstep, clr, b1, b2, eps, max_norm)
            losses[0] = _sum(closs[0]) + _sum(closs[1])
            for c in numba.prange(nl):
                while True:
                    b = ticket(counter[k, 1:2])
                    if b >= nb:
                        break
                    _actor_rows(b, nb, k, obs, eps_pi, aops, heads, cops, cfc, actor,
                                agrad if b == 0 else slot_ag[b - 1], critic, cgrad if b == 0 else slot_cg[b - 1],
                                alpha, ws[b], logp, aloss)
            lanes_clip_adam(actor, agrad, slot_ag, nl, am, av, astep, alr, b1, b2, eps, max_norm)
            losses[1] = _sum(aloss)
            lanes_polyak(critic_t, critic, tau, nl)
