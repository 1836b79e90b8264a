"""DDPG's and TD3's loss head: K steps of the (twin-min, smoothed) critic loss and the delayed actor loss.

    a'     = clip(mu_t(s') + clip(sigma e, -c, c), -1, 1)           (DDPG: mu_t(s'); e: torch's RNG, eager order)
    y      = r + gamma**n (1 - terminated) min_c Q_c,t(s', a')
    critic = sum_c mean(w (Q_c(s, a) - y)^2)                        (one Adam step over the critics' buffer)
    every policy_delay-th step (counted over the run): actor = -mean(Q_1(s, mu(s))) through the critic's
    input gradient, then the Polyak targets (critics and actor).

The work is split into tasks that do not depend on the number of lanes, which take them from ticket counters:
fixed row blocks (optim.blocks), each writing its partial gradient into its own slot, summed in block order.
Twin critics run a task per critic, each on the whole batch, instead of row blocks through both: the same
products at B rows (faster per FLOP), a core's caches holding one critic, and disjoint halves of the gradient
(nothing to sum); without a gradient clip each critic's Adam step (and its Polyak target on a delayed step) is
done in its task while its gradient is in cache. The last step's losses are the algorithm's `stats`.
"""

from __future__ import annotations

import itertools

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
    same_layout,
    vector_obs,
)
from hetrl.kernels.compiled.optim import blocks

try:
    import numba

    from hetrl.kernels.compiled.head import cat
    from hetrl.kernels.compiled.layers import backward, forward, grad_buffers, mat, tape
    from hetrl.kernels.compiled.optim import (
        adam_consts,
        adam_span,
        lanes_clip_adam,
        lanes_polyak,
        polyak,
        ticket,
    )
except ImportError:  # pragma: no cover
    numba = None


class ActorCriticHead(Head):
    algos = ("ddpg", "td3")

    @classmethod
    def programs(cls, algo) -> dict:
        vector_obs(algo)
        twin = hasattr(algo, "critics")
        critics = list(algo.critics) if twin else [algo.critic]
        targets = list(algo.critics_target) if twin else [algo.critic_target]
        aopt, copt = optimizer(algo.actor_opt, "the actor"), optimizer(algo.critic_opt, "the critic")
        actor = program(algo.actor.mu, aopt.flat, "the actor")
        actor_t = program(algo.actor_target.mu, algo.actor_target_flat, "the target actor")
        same_layout(actor, actor_t, "the target actor")
        names = [f"critic {i + 1}" for i in range(len(critics))] if twin else ["the critic"]
        cprogs = [program(c.q, copt.flat, n) for c, n in zip(critics, names)]
        for c, p, n in zip(targets, cprogs, names):
            same_layout(p, program(c.q, algo.critic_target_flat, f"the target of {n}"), f"the target of {n}")
        for p, n in zip(cprogs[1:], names[1:]):
            if p.ops.shape != cprogs[0].ops.shape or not (p.shifted(cprogs[0].lo - p.lo).ops == cprogs[0].ops).all():
                raise Declined(f"{n} is not built as critic 1, which the twin-critic head needs")
        covers(aopt, actor.count, "the actor")
        covers(copt, sum(p.count for p in cprogs), "the critic")
        if actor.n_out != algo.act_dim or cprogs[0].n_out != 1 or cprogs[0].n_in != actor.n_in + algo.act_dim:
            raise Declined("the actor's and the critic's widths do not fit the observation and action sizes")
        return {"actor": actor, "critics": cprogs, "actor_opt": aopt, "critic_opt": copt}

    def __init__(self, algo, critic_lanes: bool = True, **options):
        super().__init__(algo, **options)
        p = self.programs(algo)
        self.actor, self.critics = p["actor"], p["critics"]
        self.aopt, self.copt = p["actor_opt"], p["critic_opt"]
        self.cops = np.ascontiguousarray(np.stack([c.ops for c in self.critics]))
        self.nc = self.critics[0].hi - self.critics[0].lo   # a critic's span of the buffer
        self.cbase = np.array([c.lo for c in self.critics], np.int64)
        # a task per critic steps its own span of the critics' buffer: the critics must tile it
        spans = sorted((c.lo, c.hi) for c in self.critics)
        tiled = spans[0][0] == 0 and spans[-1][1] == self.copt.flat.numel() and all(
            a[1] == b[0] and b[1] - b[0] == self.nc for a, b in itertools.pairwise(spans))
        self.critic_lanes = critic_lanes and tiled
        self.td3 = type(algo).__name__ == "TD3"

    def _need(self, rows: int) -> int:
        """Floats of a lane's workspace for `rows` rows (the most any lane function carves)."""
        a, c = self.actor, self.critics[0]
        return a.floats(rows) + c.floats(rows) + rows * (c.n_in + 2 * a.n_out + 1) + 256

    def _lane_buffers(self, B: int, nl: int, rows: int, na: int, nc: int) -> tuple:
        """The lanes' workspaces, the row blocks' partial gradients (a slot per block after the first) and the rows'
        scratch (the target, the losses' terms)."""
        def make():
            nb = blocks(B)
            return (np.zeros((nl, self._need(rows)), np.float32), np.zeros((nb - 1, na), np.float32),
                    np.zeros((nb - 1, nc), np.float32), np.zeros((4, B), np.float32))
        return self.buffers((B, nl, rows, na, nc, blocks(B)), make)

    def _hp(self):
        (af, ag, am, av, ast), (alr, b1, b2, eps) = self.aopt.get()
        (cf, cg, cm, cv, cst), (clr, *_) = self.copt.get()
        hp = self.consts("hp", (alr, clr, b1, b2, eps, float(self.algo.critic_opt.max_grad_norm),
                                float(self.algo.cfg.tau)))
        return (af, ag, am, av, ast), (cf, cg, cm, cv, cst), hp

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor, nl: int) -> torch.Tensor:
        algo, cfg, b = self.algo, self.algo.cfg, batches
        K, B = weights.shape
        A = self.actor.n_out
        if self.td3:   # standard normals, scaled and clipped in the kernel (_smoothed), drawn as the eager loss does
            g = getattr(algo, "rng", None)   # the algorithm's generator, drawn from in learn's order
            noise = torch.stack([torch.randn(B, A, generator=g) for _ in range(K)])
            smooth = self.consts("smooth", (cfg.target_policy_noise, cfg.target_noise_clip), np.float32)
            delay = int(cfg.policy_delay)
        else:
            noise, smooth, delay = torch.zeros(K, B, A), np.zeros(2, np.float32), 1
        (af, ag, am, av, ast), (cf, cg, cm, cv, cst), hp = self._hp()
        n_critics = len(self.critics)
        by_critic = n_critics > 1 and self.critic_lanes   # (the same tasks on any number of lanes)
        self.lane_split = ("critics" if by_critic else "rows") if n_critics > 1 else None
        ws, slot_ag, slot_cg, rows = self._lane_buffers(B, nl, B if by_critic else -(-B // blocks(B)), af.shape[0],
                                                        cf.shape[0])
        losses = np.full(2, np.nan, np.float32)
        with torch.no_grad():
            td = np.empty((K, B), np.float32)
            algo.updates = int(phase(
                f32(b["obs"], K, B), f32(b["action"], K, B), f32kb(b["reward"]), f32(b["next_obs"], K, B),
                discount_of(b, cfg.gamma), f32kb(weights), f32(noise, K, B), smooth, self.actor.ops, self.actor.fc,
                self.cops, self.critics[0].fc, self.cbase, self.nc, af, ag, am, av, ast, cf, cg, cm, cv, cst,
                algo.actor_target_flat.numpy(), algo.critic_target_flat.numpy(), int(algo.updates), delay, by_critic,
                hp, nl, ws, slot_ag, slot_cg, rows, td, losses))
        # the last step's losses, as learn leaves them (the actor's: its last delayed step's, maybe an earlier phase's)
        stats = {**getattr(algo, "stats", {}), "critic_loss": torch.tensor(losses[0])}
        if not np.isnan(losses[1]):
            stats["actor_loss"] = torch.tensor(losses[1])
        algo.stats = stats
        return torch.from_numpy(td)

    def warm(self, nl: int) -> None:
        (af, ag, am, av, ast), (cf, cg, cm, cv, cst), hp = self._hp()
        a, c = [x.copy() for x in (af, ag, am, av, ast)], [x.copy() for x in (cf, cg, cm, cv, cst)]
        K, B, A, d = 1, 2, self.actor.n_out, self.actor.n_in
        o, act, z = np.zeros((K, B, d), np.float32), np.zeros((K, B, A), np.float32), np.zeros((K, B), np.float32)
        for by_critic in (False, True):
            ws = np.zeros((nl, self._need(B)), np.float32)
            phase(o, act, z, o, z + 1, z + 1, act, np.zeros(2, np.float32), self.actor.ops, self.actor.fc, self.cops,
                  self.critics[0].fc, self.cbase, self.nc, *a, *c, a[0].copy(), c[0].copy(), 0, 1, by_critic, hp,
                  nl, ws, np.zeros((0, a[0].shape[0]), np.float32), np.zeros((0, c[0].shape[0]), np.float32),
                  np.zeros((4, B), np.float32), np.empty((K, B), np.float32), np.zeros(2, np.float32))


if numba is not None:
    # Calls in a prange body pass the lane as int64: numba types the loop index as int64 when it first types the
    # phase and as uint64 in the parallel body it makes of it, which would compile each callee twice.

    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def _smoothed(mu, e, smooth):  # pragma: no cover - compiled
        """TD3's target action clip(mu + clip(sigma e, -c, c), -1, 1) for a standard normal e, smooth = (sigma, c)
        (DDPG: (0, 0), the target policy's own action); the eager loss's float32 operations in its order."""
        one = np.float32(1.0)
        return min(max(mu + min(max(e * smooth[0], -smooth[1]), smooth[1]), -one), one)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _critic_rows(b, nb, k, obs, action, reward, next_obs, discount, weight, noise, smooth, aops, afc, cops, cfc,
                     critic, cgrad, actor_t, critic_t, ws, y, closs, td_out):  # pragma: no cover - compiled
        """Row block b of nb of step k, rows lo:hi of the batch: the target and the critics' loss gradient (into the
        block's cgrad), each row's share of the critics' loss into closs."""
        _, B, do = obs.shape
        A = action.shape[2]
        lo, hi = b * B // nb, (b + 1) * B // nb
        R = hi - lo
        n_critics = cops.shape[0]
        pos = np.zeros(1, np.int64)
        ta = tape(ws, pos, aops, R)
        tc, gc = tape(ws, pos, cops[0], R), grad_buffers(ws, pos, cops[0], R)
        x, na, g = mat(ws, pos, R, do + A), mat(ws, pos, R, A), mat(ws, pos, R, 1)
        Bf = np.float32(B)
        xo, xn = obs[k, lo:hi], next_obs[k, lo:hi]
        mu_t = forward(aops, afc, actor_t, xn, ta)
        for i in range(R):
            for j in range(A):
                na[i, j] = _smoothed(mu_t[i, j], noise[k, lo + i, j], smooth)
        cat(xn, na, x)
        for cc in range(n_critics):
            q = forward(cops[cc], cfc, critic_t, x, tc)
            for i in range(R):
                y[lo + i] = q[i, 0] if cc == 0 else min(y[lo + i], q[i, 0])
        for i in range(R):
            y[lo + i] = reward[k, lo + i] + discount[k, lo + i] * y[lo + i]
            td_out[k, lo + i] = 0
        cat(xo, action[k, lo:hi], x)
        for cc in range(n_critics):
            q = forward(cops[cc], cfc, critic, x, tc)
            for i in range(R):
                td = q[i, 0] - y[lo + i]
                td_out[k, lo + i] += abs(td) / np.float32(n_critics)
                g[i, 0] = np.float32(2.0) * weight[k, lo + i] * td / Bf
                closs[cc, lo + i] = weight[k, lo + i] * td * td / Bf
            backward(cops[cc], critic, cgrad, x, tc, gc, g, True, False)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _actor_rows(b, nb, k, obs, aops, afc, cops, cfc, actor, agrad, critic, cgrad, ws,
                    aloss):  # pragma: no cover
        """Row block b of nb of a delayed actor step k (after the critics' step), rows lo:hi: -mean Q_1(s, mu(s))'s
        gradient through critic 1's input gradient (into the block's agrad), each row's share of it into aloss."""
        _, B, do = obs.shape
        A = aops[aops.shape[0] - 1, 2]
        lo, hi = b * B // nb, (b + 1) * B // nb
        R = hi - lo
        pos = np.zeros(1, np.int64)
        ta, ga = tape(ws, pos, aops, R), grad_buffers(ws, pos, aops, R)
        tc, gc = tape(ws, pos, cops[0], R), grad_buffers(ws, pos, cops[0], R)
        x, gmu, g = mat(ws, pos, R, do + A), mat(ws, pos, R, A), mat(ws, pos, R, 1)
        xo = obs[k, lo:hi]
        mu = forward(aops, afc, actor, xo, ta)
        cat(xo, mu, x)
        q = forward(cops[0], cfc, critic, x, tc)
        for i in range(R):
            g[i, 0] = np.float32(-1.0) / np.float32(B)
            aloss[lo + i] = -q[i, 0] / np.float32(B)
        gin = backward(cops[0], critic, cgrad, x, tc, gc, g, False, True)
        for i in range(R):
            for j in range(A):
                gmu[i, j] = gin[i, do + j]
        backward(aops, actor, agrad, xo, ta, ga, gmu, True, False)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _target_input_rows(b, nb, k, next_obs, noise, smooth, aops, afc, actor_t, ws, xn):  # pragma: no cover
        """Row block b of nb: rows lo:hi of the target critics' input (s', the smoothed mu_t(s')) into xn."""
        _, B, do = next_obs.shape
        A = noise.shape[2]
        lo, hi = b * B // nb, (b + 1) * B // nb
        pos = np.zeros(1, np.int64)
        s = next_obs[k, lo:hi]
        mu_t = forward(aops, afc, actor_t, s, tape(ws, pos, aops, hi - lo))
        for i in range(hi - lo):
            for j in range(do):
                xn[lo + i, j] = s[i, j]
            for j in range(A):
                xn[lo + i, do + j] = _smoothed(mu_t[i, j], noise[k, lo + i, j], smooth)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _target_q(cc, cops, cfc, critic_t, xn, ws, qt):  # pragma: no cover - compiled
        """Critic cc's target Q_cc,t(xn) on the whole batch into qt[cc] (a task of its own)."""
        pos = np.zeros(1, np.int64)
        q = forward(cops[cc], cfc, critic_t, xn, tape(ws, pos, cops[cc], xn.shape[0]))
        for i in range(xn.shape[0]):
            qt[cc, i] = q[i, 0]

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _critic_step(cc, k, obs, action, reward, discount, weight, cops, cfc, critic, cgrad, critic_t, ws, qt, tdc,
                     closs, adam, cm, cv, consts, eps, tau, lo, hi):  # pragma: no cover - compiled
        """Critic cc of the twins on the whole batch, a task of its own (its parameters: critic[lo:hi]), after every
        critic's target: y = r + discount min_c qt[c], its squared error's gradient and backward into its span of
        cgrad, |td| into tdc[cc], each row's share of its loss into closs[cc]; with `adam` (no clip: nothing to wait
        for) its span's Adam step (`consts`: this step's, counted once) and, where tau > 0, its Polyak target."""
        _, B, do = obs.shape
        A = action.shape[2]
        n_critics = cops.shape[0]
        ops = cops[cc]
        pos = np.zeros(1, np.int64)
        t, gs = tape(ws, pos, ops, B), grad_buffers(ws, pos, ops, B)
        x, g = mat(ws, pos, B, do + A), mat(ws, pos, B, 1)
        cat(obs[k], action[k], x)
        q = forward(ops, cfc, critic, x, t)
        Bf = np.float32(B)
        for i in range(B):
            yy = qt[0, i]
            for j in range(1, n_critics):
                yy = min(yy, qt[j, i])
            td = q[i, 0] - (reward[k, i] + discount[k, i] * yy)
            tdc[cc, i] = abs(td)
            g[i, 0] = np.float32(2.0) * weight[k, i] * td / Bf
            closs[cc, i] = weight[k, i] * td * td / Bf
        backward(ops, critic, cgrad, x, t, gs, g, True, False)
        if adam:
            adam_span(critic, cgrad, cm, cv, lo, hi, np.float32(1.0), consts, eps)
            if tau > 0:
                polyak(critic_t[lo:hi], critic[lo:hi], tau)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _loss(rows, n):  # pragma: no cover - compiled
        """The sum of the first n rows of `rows`, each in row order, added up in row order (sum_c mean(...))."""
        s = np.float32(0.0)
        for r in range(n):
            t = np.float32(0.0)
            for i in range(rows.shape[1]):
                t += rows[r, i]
            s += t
        return s

    @numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
    def phase(obs, action, reward, next_obs, discount, weight, noise, smooth, aops, afc, cops, cfc, cbase, nc,
              actor, agrad, am, av, astep, critic, cgrad, cm, cv, cstep, actor_t, critic_t, updates, delay, by_critic,
              hp, nl, ws, slot_ag, slot_cg, rows, td_out, losses):  # pragma: no cover - compiled
        """K steps of DDPG (one critic, delay 1, smooth (0, 0)) or TD3 on nl lanes; returns the step count. With
        `by_critic` the critics' step runs a task per critic on the whole batch; the rest runs in row blocks (block 0
        writing the optimizers' gradient buffers, block b > 0 slot_ag / slot_cg[b - 1]). losses: the last step's
        critic loss and the last delayed step's actor loss (NaN where none)."""
        alr, clr, b1, b2, eps, max_norm, tau = hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6]
        K, B, do = obs.shape
        nb = slot_cg.shape[0] + 1
        n_critics = cops.shape[0]
        by_critic = by_critic and n_critics > 1
        fused = by_critic and max_norm <= 0
        zero5 = (np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0))
        xn = np.empty((B, do + action.shape[2]), np.float32)
        qt, tdc = np.empty((n_critics, B), np.float32), np.empty((n_critics, B), np.float32)
        y, closs, aloss = rows[0], rows[1:1 + n_critics], rows[3]
        counter = np.zeros((K, 4), np.int64)
        for k in range(K):
            if by_critic:
                for c in numba.prange(nl):
                    lane = np.int64(c)
                    while True:
                        b = ticket(counter[k, 0:1])
                        if b >= nb:
                            break
                        _target_input_rows(b, nb, k, next_obs, noise, smooth, aops, afc, actor_t, ws[lane], xn)
                for c in numba.prange(nl):
                    lane = np.int64(c)
                    while True:
                        cc = ticket(counter[k, 1:2])
                        if cc >= n_critics:
                            break
                        _target_q(cc, cops, cfc, critic_t, xn, ws[lane], qt)
                consts = adam_consts(cstep, clr, b1, b2) if fused else zero5
                lane_tau = tau if fused and (updates + 1) % delay == 0 else 0.0
                for c in numba.prange(nl):
                    lane = np.int64(c)
                    while True:
                        cc = ticket(counter[k, 2:3])
                        if cc >= n_critics:
                            break
                        _critic_step(cc, k, obs, action, reward, discount, weight, cops, cfc, critic, cgrad, critic_t,
                                     ws[lane], qt, tdc, closs, fused, cm, cv, consts, eps, lane_tau, cbase[cc],
                                     cbase[cc] + nc)
                for i in range(B):
                    t = np.float32(0.0)
                    for c in range(n_critics):
                        t += tdc[c, i] / np.float32(n_critics)
                    td_out[k, i] = t
                if not fused:
                    lanes_clip_adam(critic, cgrad, slot_cg[:0], nl, cm, cv, cstep, clr, b1, b2, eps, max_norm)
            else:
                for c in numba.prange(nl):
                    lane = np.int64(c)
                    while True:
                        b = ticket(counter[k, 0:1])
                        if b >= nb:
                            break
                        _critic_rows(b, nb, k, obs, action, reward, next_obs, discount, weight, noise, smooth, aops,
                                     afc, cops, cfc, critic, cgrad if b == 0 else slot_cg[b - 1], actor_t, critic_t,
                                     ws[lane], y, closs, td_out)
                lanes_clip_adam(critic, cgrad, slot_cg, nl, cm, cv, cstep, clr, b1, b2, eps, max_norm)
            losses[0] = _loss(closs, n_critics)
            updates += 1
            if updates % delay == 0:
                for c in numba.prange(nl):
                    lane = np.int64(c)
                    while True:
                        b = ticket(counter[k, 3:4])
                        if b >= nb:
                            break
                        _actor_rows(b, nb, k, obs, aops, afc, cops, cfc, actor, agrad if b == 0 else slot_ag[b - 1],
                                    critic, cgrad if b == 0 else slot_cg[b - 1], ws[lane], aloss)
                lanes_clip_adam(actor, agrad, slot_ag, nl, am, av, astep, alr, b1, b2, eps, max_norm)
                losses[1] = _loss(rows[3:4], 1)
                if not fused:  # (fused: each critic's task did its own)
                    lanes_polyak(critic_t, critic, tau, nl)
                lanes_polyak(actor_t, actor, tau, nl)
        return updates
