"""Compiled (numba, ``nogil``) tabular update kernels: Q-learning and SARSA, float32 and int32.

Each kernel makes one sequential pass over a shard of transitions and updates the Q-table in
place; it holds no Python objects, so it runs with the GIL released and W threads give W-way
parallelism. The int32 kernels follow :mod:`hetrl.tabular.fixedpoint` exactly (int64
intermediates, rounding shifts) and are bit-exact with :mod:`hetrl.tabular.reference`.

Data layout (structure of arrays): ``s, s2`` int32 states, ``a, a2`` int32 actions, ``r``
float32 rewards (int32 fixed point for the int32 kernels), ``done`` uint8 (1 = terminated,
no bootstrap; a time-limit truncation is *not* done).

SARSA offline has two sources for the next action a':
- ``*_sarsa_*``: a' from the data (the behaviour policy's next action): evaluates the
  behaviour policy, as SARSA does on-policy.
- ``*_sarsa_pol_*``: a' drawn by the learner's own epsilon-greedy policy on its current table
  with an xorshift64* generator (state in a 1-element uint64 array, so it carries
  over between rounds and is reproducible); with epsilon -> 0 this is greedy SARSA.

Also here: the xorshift64* / splitmix64 generators, the model-based data generator, and the
online (actor + learner in one loop) kernels, which run a compiled copy of a toy-text env.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from hetrl.tabular.fixedpoint import CONST_BITS

_U0 = np.uint64(0)
_M53 = np.uint64(11)
_HALF = np.int64(1 << (CONST_BITS - 1))
_CB = np.int64(CONST_BITS)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


# --------------------------------------------------------------------------- random numbers
@njit(inline="always", nogil=True)
def xorshift64s(state):
    """Advance the xorshift64* generator in state[0] and return a 64-bit output (uint64)."""
    x = state[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    state[0] = x
    return x * np.uint64(2685821657736338717)


@njit(inline="always", nogil=True)
def rand_below(state, n):
    """Integer in [0, n) from the top 31 bits (modulo bias < 2**-26 for n <= 32)."""
    return np.int64((xorshift64s(state) >> np.uint64(33)) % np.uint64(n))


@njit(inline="always", nogil=True)
def rand_unit(state):
    """Float64 in [0, 1) from the top 53 bits."""
    return np.float64(xorshift64s(state) >> _M53) * _INV53


def splitmix64(seed: int) -> int:
    """A well-mixed, non-zero 64-bit generator state from any integer seed (plain Python)."""
    z = (int(seed) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z or 0x2545F4914F6CDD1D


def rng_state(seed: int) -> np.ndarray:
    """1-element uint64 array holding a generator state for the kernels."""
    return np.array([splitmix64(seed)], dtype=np.uint64)


def eps_threshold(epsilon: float) -> np.uint64:
    """epsilon -> threshold on the 53-bit draw: explore iff (x >> 11) < threshold."""
    return np.uint64(int(min(max(float(epsilon), 0.0), 1.0) * 2.0**53))


@njit(inline="always", nogil=True)
def _egreedy(q, s, thr, state):
    """Epsilon-greedy action on row s (first maximum on ties); thr from eps_threshold."""
    if thr > np.uint64(0) and (xorshift64s(state) >> _M53) < thr:
        return rand_below(state, q.shape[1])
    best = 0
    bv = q[s, 0]
    for b in range(1, q.shape[1]):
        v = q[s, b]
        gt = v > bv
        best = b if gt else best  # written as selects: no unpredictable branch
        bv = v if gt else bv
    return best


# --------------------------------------------------------------------------- offline, float32
@njit(nogil=True, cache=True)
def qlearning_f32(q, s, a, r, s2, done, alpha, gamma):
    """Q(s,a) += alpha * (r + gamma * max_b Q(s',b) * (1-done) - Q(s,a)); float32 table."""
    na = q.shape[1]
    for i in range(s.shape[0]):
        si = s[i]
        ai = a[i]
        target = r[i]
        if done[i] == 0:
            n = s2[i]
            m = q[n, 0]
            for b in range(1, na):
                v = q[n, b]
                if v > m:
                    m = v
            target += gamma * m
        qsa = q[si, ai]
        q[si, ai] = qsa + alpha * (target - qsa)
    return s.shape[0]


@njit(nogil=True, cache=True)
def sarsa_f32(q, s, a, r, s2, a2, done, alpha, gamma):
    """Q(s,a) += alpha * (r + gamma * Q(s',a') * (1-done) - Q(s,a)), a' from the data."""
    for i in range(s.shape[0]):
        si = s[i]
        ai = a[i]
        target = r[i]
        if done[i] == 0:
            target += gamma * q[s2[i], a2[i]]
        qsa = q[si, ai]
        q[si, ai] = qsa + alpha * (target - qsa)
    return s.shape[0]


@njit(nogil=True, cache=True)
def sarsa_pol_f32(q, s, a, r, s2, done, alpha, gamma, thr, state):
    """SARSA with a' ~ epsilon-greedy(Q(s', .)) drawn by the learner (thr = eps_threshold)."""
    na = q.shape[1]
    for i in range(s.shape[0]):
        si = s[i]
        ai = a[i]
        target = r[i]
        if done[i] == 0:
            n = s2[i]
            # epsilon-greedy a' written out inline: a helper taking `q` costs about 4x (array refcounts per call)
            if thr > _U0 and (xorshift64s(state) >> _M53) < thr:
                best = rand_below(state, na)
            else:
                best = 0
                bv = q[n, 0]
                for b in range(1, na):
                    v = q[n, b]
                    if v > bv:
                        bv = v
                        best = b
            target += gamma * q[n, best]
        qsa = q[si, ai]
        q[si, ai] = qsa + alpha * (target - qsa)
    return s.shape[0]


# --------------------------------------------------------------------------- offline, int32
@njit(inline="always", nogil=True)
def _fx_update(q, si, ai, target, alpha_fp):
    """q[si,ai] += round(alpha * (target - q)) in fixed point; target is int64."""
    qsa = np.int64(q[si, ai])
    q[si, ai] = qsa + ((alpha_fp * (target - qsa) + _HALF) >> _CB)


@njit(nogil=True, cache=True)
def qlearning_i32(q, s, a, r, s2, done, alpha_fp, gamma_fp):
    """Fixed-point Q-learning: int32 table and rewards, alpha_fp/gamma_fp with CONST_BITS bits."""
    na = q.shape[1]
    for i in range(s.shape[0]):
        target = np.int64(r[i])
        if done[i] == 0:
            n = s2[i]
            m = q[n, 0]
            for b in range(1, na):
                v = q[n, b]
                if v > m:
                    m = v
            target += (gamma_fp * np.int64(m) + _HALF) >> _CB
        _fx_update(q, s[i], a[i], target, alpha_fp)
    return s.shape[0]


@njit(nogil=True, cache=True)
def sarsa_i32(q, s, a, r, s2, a2, done, alpha_fp, gamma_fp):
    """Fixed-point SARSA, a' from the data."""
    for i in range(s.shape[0]):
        target = np.int64(r[i])
        if done[i] == 0:
            target += (gamma_fp * np.int64(q[s2[i], a2[i]]) + _HALF) >> _CB
        _fx_update(q, s[i], a[i], target, alpha_fp)
    return s.shape[0]


@njit(nogil=True, cache=True)
def sarsa_pol_i32(q, s, a, r, s2, done, alpha_fp, gamma_fp, thr, state):
    """Fixed-point SARSA, a' ~ epsilon-greedy on the learner's table."""
    na = q.shape[1]
    for i in range(s.shape[0]):
        target = np.int64(r[i])
        if done[i] == 0:
            n = s2[i]
            if thr > _U0 and (xorshift64s(state) >> _M53) < thr:
                best = rand_below(state, na)
            else:
                best = 0
                bv = q[n, 0]
                for b in range(1, na):
                    v = q[n, b]
                    if v > bv:
                        bv = v
                        best = b
            target += (gamma_fp * np.int64(q[n, best]) + _HALF) >> _CB
        _fx_update(q, s[i], a[i], target, alpha_fp)
    return s.shape[0]


# --------------------------------------------------------------------------- all workers, prange
@njit(nogil=True, parallel=True, cache=True)
def qlearning_f32_prange(qs, bounds, s, a, r, s2, done, alpha, gamma):
    """Worker w updates qs[w] on transitions bounds[w]:bounds[w+1] (numba threads)."""
    for w in prange(qs.shape[0]):
        lo = bounds[w]
        hi = bounds[w + 1]
        qlearning_f32(qs[w], s[lo:hi], a[lo:hi], r[lo:hi], s2[lo:hi], done[lo:hi], alpha, gamma)
    return bounds[-1] - bounds[0]


@njit(nogil=True, parallel=True, cache=True)
def qlearning_i32_prange(qs, bounds, s, a, r, s2, done, alpha_fp, gamma_fp):
    for w in prange(qs.shape[0]):
        lo = bounds[w]
        hi = bounds[w + 1]
        qlearning_i32(qs[w], s[lo:hi], a[lo:hi], r[lo:hi], s2[lo:hi], done[lo:hi], alpha_fp, gamma_fp)
    return bounds[-1] - bounds[0]


# --------------------------------------------------------------------------- data generation
@njit(inline="always", nogil=True)
def _sample_cum(cum, u):
    """First index k with u < cum[k] (cum is a cumulative distribution)."""
    k = 0
    last = cum.shape[0] - 1
    while k < last and u >= cum[k]:
        k += 1
    return k


@njit(inline="always", nogil=True)
def _outcome(cum_p, n_out, s, a, u):
    k = 0
    last = n_out[s, a] - 1
    while k < last and u >= cum_p[s, a, k]:
        k += 1
    return k


@njit(nogil=True, cache=True)
def generate_model(cum_p, n_out, next_s, rew, term, isd_cum, max_steps, bq, bthr, state,
                   s, a, r, s2, a2, done):
    """Fill the output arrays with transitions of a behaviour policy on a tabular model.

    Behaviour: uniform random when bq has no rows, else epsilon-greedy on table bq with
    threshold bthr. Episodes start from isd_cum, end on termination or after max_steps
    (0 = no limit); a truncation is not marked done. a2 is the behaviour's action at s'.
    Returns the number of episodes started.
    """
    na = n_out.shape[1]
    use_q = bq.shape[0] > 0
    cur = _sample_cum(isd_cum, rand_unit(state))
    if use_q:
        act = _egreedy(bq, cur, bthr, state)
    else:
        act = rand_below(state, na)
    t = 0
    episodes = 1
    for i in range(s.shape[0]):
        k = _outcome(cum_p, n_out, cur, act, rand_unit(state))
        nxt = next_s[cur, act, k]
        d = term[cur, act, k]
        if use_q:
            nact = _egreedy(bq, nxt, bthr, state)
        else:
            nact = rand_below(state, na)
        s[i] = cur
        a[i] = act
        r[i] = rew[cur, act, k]
        s2[i] = nxt
        a2[i] = nact
        done[i] = d
        t += 1
        if d or (max_steps > 0 and t >= max_steps):
            cur = _sample_cum(isd_cum, rand_unit(state))
            if use_q:
                act = _egreedy(bq, cur, bthr, state)
            else:
                act = rand_below(state, na)
            t = 0
            episodes += 1
        else:
            cur = nxt
            act = nact
    return episodes


# --------------------------------------------------------------------------- online (model env)
@njit(nogil=True, cache=True)
def online_f32(q, steps, sarsa, cum_p, n_out, next_s, rew, term, isd_cum, max_steps,
               alpha, gamma, thr, state, env_state, stats):
    """`steps` epsilon-greedy interactions with a compiled env copy, learning after each one.

    env_state (int64[3]) = [s, t, a]: current state (-1: reset first), steps into the
    episode, pending action (SARSA's a'; -1: none). It persists between calls, like an env
    instance. stats (float64[3]) accumulates [episodes finished, sum of their returns,
    return of the running episode].
    """
    na = q.shape[1]
    cur = env_state[0]
    t = env_state[1]
    act = env_state[2]
    if cur < 0:
        cur = _sample_cum(isd_cum, rand_unit(state))
        t = 0
        act = -1
    ret = stats[2]
    for _ in range(steps):
        if act < 0:
            if thr > _U0 and (xorshift64s(state) >> _M53) < thr:
                act = rand_below(state, na)
            else:
                act = 0
                bv = q[cur, 0]
                for b in range(1, na):
                    if q[cur, b] > bv:
                        bv = q[cur, b]
                        act = b
        k = _outcome(cum_p, n_out, cur, act, rand_unit(state))
        nxt = next_s[cur, act, k]
        d = term[cur, act, k]
        rr = rew[cur, act, k]
        ret += rr
        t += 1
        # greedy (and, for SARSA, epsilon-greedy) action at s'
        best = 0
        bv = q[nxt, 0]
        for b in range(1, na):
            if q[nxt, b] > bv:
                bv = q[nxt, b]
                best = b
        nact = -1
        if sarsa:
            nact = best
            if thr > _U0 and (xorshift64s(state) >> _M53) < thr:
                nact = rand_below(state, na)
        target = rr
        if not d:
            if sarsa:
                target += gamma * q[nxt, nact]
            else:
                target += gamma * bv
        qsa = q[cur, act]
        q[cur, act] = qsa + alpha * (target - qsa)
        if d or (max_steps > 0 and t >= max_steps):
            stats[0] += 1
            stats[1] += ret
            ret = 0.0
            cur = _sample_cum(isd_cum, rand_unit(state))
            t = 0
            act = -1
        else:
            cur = nxt
            act = nact
    env_state[0] = cur
    env_state[1] = t
    env_state[2] = act
    stats[2] = ret
    return steps


@njit(nogil=True, cache=True)
def online_i32(q, steps, sarsa, cum_p, n_out, next_s, rew_fp, term, rew, isd_cum, max_steps,
               alpha_fp, gamma_fp, thr, state, env_state, stats):
    """Fixed-point twin of online_f32 (rew_fp: int32 rewards to learn from, rew: for returns)."""
    na = q.shape[1]
    cur = env_state[0]
    t = env_state[1]
    act = env_state[2]
    if cur < 0:
        cur = _sample_cum(isd_cum, rand_unit(state))
        t = 0
        act = -1
    ret = stats[2]
    for _ in range(steps):
        if act < 0:
            if thr > _U0 and (xorshift64s(state) >> _M53) < thr:
                act = rand_below(state, na)
            else:
                act = 0
                bv = q[cur, 0]
                for b in range(1, na):
                    if q[cur, b] > bv:
                        bv = q[cur, b]
                        act = b
        k = _outcome(cum_p, n_out, cur, act, rand_unit(state))
        nxt = next_s[cur, act, k]
        d = term[cur, act, k]
        ret += rew[cur, act, k]
        t += 1
        best = 0
        bv = q[nxt, 0]
        for b in range(1, na):
            if q[nxt, b] > bv:
                bv = q[nxt, b]
                best = b
        nact = -1
        if sarsa:
            nact = best
            if thr > _U0 and (xorshift64s(state) >> _M53) < thr:
                nact = rand_below(state, na)
        target = np.int64(rew_fp[cur, act, k])
        if not d:
            if sarsa:
                target += (gamma_fp * np.int64(q[nxt, nact]) + _HALF) >> _CB
            else:
                target += (gamma_fp * np.int64(bv) + _HALF) >> _CB
        _fx_update(q, cur, act, target, alpha_fp)
        if d or (max_steps > 0 and t >= max_steps):
            stats[0] += 1
            stats[1] += ret
            ret = 0.0
            cur = _sample_cum(isd_cum, rand_unit(state))
            t = 0
            act = -1
        else:
            cur = nxt
            act = nact
    env_state[0] = cur
    env_state[1] = t
    env_state[2] = act
    stats[2] = ret
    return steps
