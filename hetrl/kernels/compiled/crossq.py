"""CrossQ's loss head: K steps of the joint critic pass with batch renormalisation, the delayed squashed-Gaussian
actor, and the entropy coefficient, in the order of hetrl/algos/crossq.py (the reference, whose docstring has
the formulas):

    a' ~ pi(.|s')                                   the actor's body on its running statistics (fixed row blocks
                                                    taken by the lanes)
    [Q_c(s, a_buf); Q_c(s', a')]                    each critic in training mode on the 2B rows at once (a task
                                                    per critic: the batch statistics need all the rows)
    y  = r + gamma**n (1 - terminated) (min_c Q_c(s', a') - alpha log pi(a'|s'))          (a constant)
    critics = 0.5 mean(w (Q_1(s, a_buf) - y)^2) + 0.5 mean(w (Q_2(s, a_buf) - y)^2)     (back through the batch
                                                    statistics of all 2B rows: the s' half's gradient is zero)
    every policy_delay-th step: a ~ pi(.|s) in training mode, actor = mean(alpha log pi(a|s) - min_c Q_c(s, a))
                                with the critics (after their step) on their running statistics; then alpha.

The batch renormalisation layers' running statistics and pass counts (module buffers) are copied into a state
array per network before a phase and back after it (layers.brn_state); the Gaussian draws come from the
algorithm's generator in the eager order (s' every step, then s on a delayed step). The tasks do not depend on the
number of lanes, which take them from ticket counters: the same bits on any number of lanes. The last step's losses
and alpha are the algorithm's `stats`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

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
    vector_obs,
)
from hetrl.kernels.compiled.layers import (
    BRN_HEAD,
    brn_state,
    compile_layers,
    param_offsets,
)
from hetrl.kernels.compiled.optim import blocks

try:
    import numba

    from hetrl.kernels.compiled.head import cat
    from hetrl.kernels.compiled.layers import (
        backward_with,
        forward_with,
        gemm,
        grad_buffers,
        mat,
        tanh32,
        tape,
    )
    from hetrl.kernels.compiled.optim import clip_adam, lanes_clip_adam, n_blocks, ticket
except ImportError:  # pragma: no cover
    numba = None

# the Body's activation functions as the layer modules the pieces know
_ACTS = {F.relu: nn.ReLU, torch.tanh: nn.Tanh, F.elu: nn.ELU}


class States:
    """The batch renormalisation layers of some networks, each at its offset of one float32 state array."""

    def __init__(self):
        self.mods: list[tuple[nn.Module, int]] = []
        self.size = 0

    def offset(self, m: nn.Module) -> int:
        for mod, at in self.mods:
            if mod is m:
                return at
        at, self.size = self.size, self.size + brn_state(m.weight.numel())
        self.mods.append((m, at))
        return at

    def array(self) -> np.ndarray:
        st = np.zeros(self.size, np.float32)
        for m, at in self.mods:
            st[at + 1:at + 6] = (m.warmup_steps, m.momentum, m.r_max, m.d_max, m.eps)
        return st

    def load(self, st: np.ndarray) -> None:
        """The modules' running statistics and pass counts into st."""
        for m, at in self.mods:
            n, h = m.weight.numel(), at + BRN_HEAD
            st[at] = float(m.steps)
            st[h:h + n] = m.running_mean.detach().numpy()
            st[h + n:h + 2 * n] = m.running_var.detach().numpy()

    def store(self, st: np.ndarray) -> None:
        """st's running statistics and pass counts back into the modules' buffers (in place)."""
        for m, at in self.mods:
            n, h = m.weight.numel(), at + BRN_HEAD
            m.steps.fill_(int(st[at]))
            m.running_mean.detach().numpy()[:] = st[h:h + n]
            m.running_var.detach().numpy()[:] = st[h + n:h + 2 * n]


def body_layers(body: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """CrossQ's Body (hetrl/algos/crossq.py) as its ordered layers: [BRN] then (Linear, [LayerNorm], act, [BRN])
    per hidden layer."""
    act = _ACTS.get(getattr(body, "act", None))
    if act is None or not hasattr(body, "linears"):
        raise Declined(f"{prefix.rstrip('.')} is not CrossQ's Body of Linear layers with a ReLU, Tanh or ELU")
    norms, lns = getattr(body, "norms", None), getattr(body, "layer_norms", None)
    out = [(f"{prefix}norms.0", norms[0])] if norms is not None else []
    for i, lin in enumerate(body.linears):
        out.append((f"{prefix}linears.{i}", lin))
        if lns is not None:
            out.append((f"{prefix}layer_norms.{i}", lns[i]))
        out.append((f"{prefix}act", act()))
        if norms is not None:
            out.append((f"{prefix}norms.{i + 1}", norms[i + 1]))
    return out


class CrossQHead(Head):
    algos = ("crossq",)

    @classmethod
    def programs(cls, algo) -> dict:
        vector_obs(algo)
        aopt, copt = optimizer(algo.actor_opt, "the actor"), optimizer(algo.critic_opt, "the critic")
        astates, cstates = States(), States()
        actor = algo.actor
        body = compile_layers(body_layers(actor.body, "body."), param_offsets(aopt.flat), "the actor's body",
                              astates.offset)
        heads = gaussian_heads(actor, body, aopt.flat, algo.act_dim)
        if len(algo.critics) != 2:
            raise Declined(f"the algorithm has {len(algo.critics)} critics; the CrossQ head takes two")
        cprogs = [compile_layers([*body_layers(c.body, "body."), ("q", c.q)], param_offsets(copt.flat),
                                 f"critic {i + 1}", cstates.offset) for i, c in enumerate(algo.critics)]
        if cprogs[1].ops.shape != cprogs[0].ops.shape or not (cprogs[1].ops[:, :3] == cprogs[0].ops[:, :3]).all():
            raise Declined("critic 2 is not built as critic 1, which the twin-critic head needs")
        covers(aopt, body.count + 2 * (algo.act_dim * body.n_out + algo.act_dim), "the actor")
        covers(copt, sum(p.count for p in cprogs), "the critic")
        if cprogs[0].n_out != 1 or cprogs[0].n_in != body.n_in + algo.act_dim:
            raise Declined("the critics' widths do not fit the observation and action sizes")
        Alpha.check(algo)
        return {"body": body, "heads": heads, "critics": cprogs, "actor_opt": aopt,
                "critic_opt": copt, "actor_states": astates, "critic_states": cstates}

    def __init__(self, algo, **options):
        super().__init__(algo, **options)
        p = self.programs(algo)
        self.body, self.heads, self.critics = p["body"], p["heads"], p["critics"]
        self.aopt, self.copt = p["actor_opt"], p["critic_opt"]
        self.astates, self.cstates = p["actor_states"], p["critic_states"]
        self.astate, self.cstate = self.astates.array(), self.cstates.array()
        self.cops = np.ascontiguousarray(np.stack([c.ops for c in self.critics]))
        self.alpha = Alpha(algo)

    def _sizes(self, B: int) -> tuple[int, int, int]:
        """Floats of the workspaces: a lane's of the next actions (a row block's), the actor step's, a critic's."""
        a, c, A = self.body, self.critics[0], self.algo.act_dim
        rn = -(-B // blocks(B))
        return (a.floats(rn, grads=False) + 3 * rn * A + 256, a.floats(B) + B * (8 * A + a.n_out + a.n_in) + 256,
                c.floats(2 * B) + 2 * B + 256)

    def _args(self):
        (af, ag, am, av, ast), (alr, b1, b2, eps) = self.aopt.get()
        (cf, cg, cm, cv, cst), (clr, *_) = self.copt.get()
        algo = self.algo
        al, (al_lr, al_b1, al_b2, al_eps) = self.alpha.get()
        hp = self.consts("hp", (alr, clr, b1, b2, eps, float(algo.critic_opt.max_grad_norm),
                                float(algo.target_entropy), al_lr, al_b1, al_b2, al_eps))
        return [af, ag, am, av, ast], [cf, cg, cm, cv, cst], al, hp

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor, nl: int) -> torch.Tensor:
        algo, b = self.algo, batches
        K, B = weights.shape
        A, delay = algo.act_dim, int(algo.cfg.policy_delay)
        g = getattr(algo, "rng", None)   # the algorithm's generator, drawn from in learn's order
        eps_next, eps_pi = torch.zeros(K, B, A), torch.zeros(K, B, A)
        for k in range(K):
            eps_next[k] = torch.randn(B, A, generator=g)
            if (algo.updates + k + 1) % delay == 0:
                eps_pi[k] = torch.randn(B, A, generator=g)
        a, c, al, hp = self._args()
        nn_, na_, nc_ = self._sizes(B)
        nws, aws, cws = self.buffers((B, nl, nn_, na_, nc_), lambda: (np.zeros((nl, nn_), np.float32), np.zeros(na_, np.float32),
                                                       np.zeros((2, nc_), np.float32)))
        self.astates.load(self.astate)
        self.cstates.load(self.cstate)
        losses = np.full(4, np.nan, np.float32)
        with torch.no_grad():
            td = np.empty((K, B), np.float32)
            algo.updates = int(phase(
                f32(b["obs"], K, B), f32(b["action"], K, B), f32kb(b["reward"]), f32(b["next_obs"], K, B),
                discount_of(b, algo.cfg.gamma), f32kb(weights), eps_pi.numpy(), eps_next.numpy(), self.body.ops,
                self.body.fc, self.heads, self.cops, self.critics[0].fc, *a, self.astate, *c, self.cstate, *al,
                self.alpha.learned, hp, int(algo.updates), delay, nl, nws, aws, cws, td, losses))
        self.astates.store(self.astate)
        self.cstates.store(self.cstate)
        # the last step's, as learn leaves them (the actor's and alpha's: their last delayed step's)
        stats = {**getattr(algo, "stats", {}), "critic_loss": torch.tensor(losses[0]),
                 "ent_coef": torch.tensor(losses[2]).reshape(algo.log_alpha.shape)}
        if not np.isnan(losses[1]):
            stats["actor_loss"] = torch.tensor(losses[1])
        if not np.isnan(losses[3]):
            stats["ent_coef_loss"] = torch.tensor(losses[3])
        algo.stats = stats
        return torch.from_numpy(td)

    def warm(self, nl: int) -> None:
        a, c, al, hp = self._args()
        a, c, al = [x.copy() for x in a], [x.copy() for x in c], [x.copy() for x in al]
        K, B, A, d = 1, 2, self.algo.act_dim, self.body.n_in
        o, act, z = np.zeros((K, B, d), np.float32), np.zeros((K, B, A), np.float32), np.zeros((K, B), np.float32)
        nn_, na_, nc_ = self._sizes(B)
        phase(o, act, z, o, z + 1, z + 1, act, act.copy(), self.body.ops, self.body.fc, self.heads, self.cops,
              self.critics[0].fc, *a, self.astate.copy(), *c, self.cstate.copy(), *al, True, hp, 0, 1, nl,
              np.zeros((nl, nn_), np.float32), np.zeros(na_, np.float32), np.zeros((2, nc_), np.float32),
              np.empty((K, B), np.float32), np.zeros(4, np.float32))


if numba is not None:
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _squashed(ops, fc, heads, actor, x, t, e, mean, lsr, u, a, logp, state, train):  # pragma: no cover
        """The actor on x: its body (program ops; BRN statistics in `state`, training mode where `train`), the mean
        and raw log_std heads, u = mean + exp(clamp(log_std)) e, a = tanh(u), log pi(a|s) with the stable tanh
        correction (CrossQ's Actor.sample)."""
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

    # Calls in a prange body pass the lane as int64 (see actor_critic.py).

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _next_rows(b, nb, k, next_obs, eps_next, aops, afc, heads, actor, astate, ws, na, nlogp):  # pragma: no cover
        """Row block b of nb: rows lo:hi of a' ~ pi(.|s') and its log-prob, the actor on its running statistics."""
        _, B, _ = next_obs.shape
        A = na.shape[1]
        lo, hi = b * B // nb, (b + 1) * B // nb
        R = hi - lo
        pos = np.zeros(1, np.int64)
        t = tape(ws, pos, aops, R)
        mean, lsr, u = mat(ws, pos, R, A), mat(ws, pos, R, A), mat(ws, pos, R, A)
        _squashed(aops, afc, heads, actor, next_obs[k, lo:hi], t, eps_next[k, lo:hi], mean, lsr, u, na[lo:hi],
                  nlogp[lo:hi], astate, False)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _critic(cc, cops, cfc, critic, cgrad, cstate, x, ws, q, g, train, back):  # pragma: no cover - compiled
        """Critic cc on the rows x in its own workspace: forward (q[cc] = its values) or, with `back`, the backward
        of that forward for the gradient g[cc] w.r.t. its values: into its span of cgrad in training mode, else
        the input's gradient (returned). The workspace is carved the same way for both."""
        R = x.shape[0]
        ops = cops[cc]
        pos = np.zeros(1, np.int64)
        t, gs, gm = tape(ws, pos, ops, R), grad_buffers(ws, pos, ops, R), mat(ws, pos, R, 1)
        if not back:
            out = forward_with(ops, cfc, critic, x, t, cstate, train)
            for i in range(R):
                q[cc, i] = out[i, 0]
            return gm
        for i in range(R):
            gm[i, 0] = g[cc, i]
        return backward_with(ops, critic, cgrad, x, t, gs, gm, train, not train, cstate, train)

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def _critics(nl, cops, cfc, critic, cgrad, cstate, x, cws, q, g, train, back, gact, do):  # pragma: no cover
        """_critic for both critics, a task each (on its own workspace) that nl lanes take from a ticket counter; an
        input gradient's action columns into gact[cc]."""
        counter = np.zeros(1, np.int64)
        for c in numba.prange(min(nl, 2)):
            while True:
                cc = ticket(counter)
                if cc >= 2:
                    break
                gin = _critic(cc, cops, cfc, critic, cgrad, cstate, x, cws[cc], q, g, train, back)
                if back and not train:
                    for i in range(x.shape[0]):
                        for j in range(gact.shape[2]):
                            gact[cc, i, j] = gin[i, do + j]

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _actor_step(k, obs, eps_pi, aops, afc, heads, cops, cfc, actor, agrad, astate, critic, cgrad, cstate,
                    alpha, nl, ws, cws, logp):  # pragma: no cover - compiled
        """The actor loss mean(alpha log pi(a|s) - min(Q_1(s, a), Q_2(s, a)))'s gradient into agrad: the actor in
        training mode on the whole batch (its batch statistics), the critics on their running statistics."""
        _, B, do = obs.shape
        A = eps_pi.shape[2]
        pos = np.zeros(1, np.int64)
        t, gb = tape(ws, pos, aops, B), grad_buffers(ws, pos, aops, B)
        mean, lsr, u, a = mat(ws, pos, B, A), mat(ws, pos, B, A), mat(ws, pos, B, A), mat(ws, pos, B, A)
        dmean, dls, ga = mat(ws, pos, B, A), mat(ws, pos, B, A), mat(ws, pos, B, A)
        dh = mat(ws, pos, B, aops[aops.shape[0] - 1, 2])
        xq = mat(ws, pos, B, do + A)
        xo = obs[k]
        _squashed(aops, afc, heads, actor, xo, t, eps_pi[k], mean, lsr, u, a, logp, astate, True)
        cat(xo, a, xq)
        q, g = np.empty((2, B), np.float32), np.empty((2, B), np.float32)
        gact = np.empty((2, B, A), np.float32)
        _critics(nl, cops, cfc, critic, cgrad, cstate, xq, cws, q, g, False, False, gact, do)
        one, Bf = np.float32(1.0), np.float32(B)
        loss = np.float32(0.0)   # mean(alpha log pi - min(Q_1, Q_2)), the algorithm's actor_loss
        for i in range(B):
            loss += (alpha * logp[i] - min(q[0, i], q[1, i])) / Bf
        for cc in range(2):
            for i in range(B):  # torch.min's gradient: to the smaller, halved on a tie
                v, other = q[cc, i], q[1 - cc, i]
                g[cc, i] = 0 if v > other else (-one / Bf if v < other else np.float32(-0.5) / Bf)
        _critics(nl, cops, cfc, critic, cgrad, cstate, xq, cws, q, g, False, True, gact, do)
        for i in range(B):
            for j in range(A):
                ga[i, j] = gact[0, i, j] + gact[1, i, j]
        _heads_grad(ga, a, lsr, eps_pi[k], alpha / Bf, t[3 * aops.shape[0] - 3], heads, actor, agrad, dmean, dls, dh)
        backward_with(aops, actor, agrad, xo, t, gb, dh, True, False, astate, True)
        return loss

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def phase(obs, action, reward, next_obs, discount, weight, eps_pi, eps_next, aops, afc, heads, cops, cfc,
              actor, agrad, am, av, astep, astate, critic, cgrad, cm, cv, cstep, cstate,
              log_alpha, galpha, alm, alv, alstep, learn_alpha, hp, updates, delay, nl, nws, aws, cws,
              td_out, losses):  # pragma: no cover - compiled
        """K steps of CrossQ on nl lanes with the Gaussian noise given (eps_next: a' every step; eps_pi: a on the
        delayed steps); returns the update count. losses: the last step's critic loss and alpha, the last delayed
        step's actor and alpha losses (left as they are where none)."""
        K, B, do = obs.shape
        A = action.shape[2]
        nb = n_blocks(B)
        counter = np.zeros(K, np.int64)
        alr, clr, b1, b2, eps, max_norm, te = hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6]
        al_lr, al_b1, al_b2, al_eps = hp[7], hp[8], hp[9], hp[10]
        x2 = np.empty((2 * B, do + A), np.float32)
        na, nlogp, logp = np.empty((B, A), np.float32), np.empty(B, np.float32), np.empty(B, np.float32)
        q, g = np.empty((2, 2 * B), np.float32), np.zeros((2, 2 * B), np.float32)
        gact = np.empty((2, 1, A), np.float32)
        none_c, none_a = np.zeros((0, critic.shape[0]), np.float32), np.zeros((0, actor.shape[0]), np.float32)
        Bf = np.float32(B)
        for k in range(K):
            alpha = np.float32(np.exp(log_alpha[0]))  # before this step's alpha update
            for c in numba.prange(nl):
                lane = np.int64(c)
                while True:
                    b = ticket(counter[k:k + 1])
                    if b >= nb:
                        break
                    _next_rows(b, nb, k, next_obs, eps_next, aops, afc, heads, actor, astate, nws[lane], na, nlogp)
            cat(obs[k], action[k], x2[:B])
            cat(next_obs[k], na, x2[B:])
            _critics(nl, cops, cfc, critic, cgrad, cstate, x2, cws, q, g, True, False, gact, do)
            l1, l2, half = np.float32(0.0), np.float32(0.0), np.float32(0.5)
            for i in range(B):
                y = reward[k, i] + discount[k, i] * (min(q[0, B + i], q[1, B + i]) - alpha * nlogp[i])
                td1, td2 = q[0, i] - y, q[1, i] - y
                td_out[k, i] = (abs(td1) + abs(td2)) * np.float32(0.5)
                l1 += half * weight[k, i] * td1 * td1 / Bf
                l2 += half * weight[k, i] * td2 * td2 / Bf
                g[0, i] = weight[k, i] * td1 / Bf    # 0.5 mean(w td^2)'s gradient; the s' half's stays 0
                g[1, i] = weight[k, i] * td2 / Bf
            _critics(nl, cops, cfc, critic, cgrad, cstate, x2, cws, q, g, True, True, gact, do)
            lanes_clip_adam(critic, cgrad, none_c, nl, cm, cv, cstep, clr, b1, b2, eps, max_norm)
            losses[0], losses[2] = l1 + l2, alpha
            updates += 1
            if updates % delay == 0:
                losses[1] = _actor_step(k, obs, eps_pi, aops, afc, heads, cops, cfc, actor, agrad, astate, critic, cgrad, cstate,
                            alpha, nl, aws, cws, logp)
                lanes_clip_adam(actor, agrad, none_a, nl, am, av, astep, alr, b1, b2, eps, max_norm)
                if learn_alpha:
                    s = np.float32(0.0)
                    for i in range(B):
                        s += logp[i] + np.float32(te)
                    galpha[0] = -s / Bf
                    losses[3] = log_alpha[0] * galpha[0]   # the alpha loss, at log_alpha before its step
                    clip_adam(log_alpha, galpha, alm, alv, alstep, al_lr, al_b1, al_b2, al_eps, 0.0)
        return updates
