"""Workers: W threads, each running a compiled ``nogil`` kernel over its shard, merged per round.

Round r of offline training: every worker copies the merged table, makes one pass over its
contiguous shard (``shard_bounds``) with the round's alpha (and epsilon for learner-side
SARSA), and the W tables are merged (:mod:`hetrl.tabular.merge`). The kernels release the
GIL, so W Python threads give W cores of work without process start-up or data copies (the
shards are zero-copy views of one array).

Backends:
- ``threads`` (default): a ThreadPoolExecutor of W threads, one kernel call per worker and
  round; works for every algo/dtype and times each worker separately.
- ``prange``: one ``numba.prange`` call over workers (numba's own thread pool, at most
  NUMBA_NUM_THREADS threads); Q-learning only, kept for comparison in the benchmark.
The measurement behind the default is in docs/tabular.md.

Online training (``train_online``): each worker owns a compiled copy of the env
(:func:`hetrl.tabular.kernels.online_f32`) and an RNG stream; in round r it takes K steps
epsilon-greedily, learning after each, then the tables are merged. Envs without a transition
table use real Gymnasium env instances stepped in Python by the same threads (correct but
GIL-bound; not fast).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from hetrl.errors import UsageError
from hetrl.tabular import kernels as K
from hetrl.tabular.fixedpoint import choose_frac_bits, const_to_fixed, to_fixed
from hetrl.tabular.merge import merge

from hetrl.tabular.options import BACKENDS, SARSA_NEXT


def schedule(start: float, end: float | None, rounds: int, kind: str = "geometric") -> list[float]:
    """Per-round values from start to end (inclusive); constant when end is None."""
    if end is None or rounds == 1 or end == start:
        return [float(start)] * rounds
    x = np.linspace(0.0, 1.0, rounds)
    if kind == "geometric" and start > 0 and end > 0:
        return [float(start * (end / start) ** t) for t in x]
    return [float(start + (end - start) * t) for t in x]


PAGE = 4096  # bytes between the memory that different workers write


def worker_tables(workers: int, n_states: int, n_actions: int, dtype) -> np.ndarray:
    """(W, S, A) view whose W tables are >= PAGE bytes apart, so no two share a 4 KiB page.

    128 bytes (no shared cache line or adjacent-line pair) is not enough: two concurrent
    workers whose tables share a page run slower than one alone (the page's TLB and
    prefetcher state are shared), with a page between them as fast (docs/tabular.md). Each
    qs[w] is C-contiguous."""
    row = n_actions * np.dtype(dtype).itemsize
    pad = -(-PAGE // row)
    return np.zeros((workers, n_states + pad, n_actions), dtype)[:, :n_states]


def worker_rows(arrays: list) -> list:
    """Copies of small per-worker arrays that the kernels write (RNG and env states), each in
    its own page of one block: separate small allocations can share a cache line."""
    arrays = [np.asarray(x) for x in arrays]
    n = max(x.size for x in arrays)
    block = np.zeros((len(arrays), n + -(-PAGE // arrays[0].itemsize)), arrays[0].dtype)
    out = [block[w, :x.size] for w, x in enumerate(arrays)]
    for dst, x in zip(out, arrays):
        dst[:] = x.ravel()
    return out


@dataclass
class TrainStats:
    """What a training call measured (times in seconds)."""

    updates: int = 0
    wall_s: float = 0.0  # all rounds: table copies + kernels + merges
    setup_s: float = 0.0  # before the rounds: int32 reward conversion (once per call, in parallel)
    kernel_s: float = 0.0  # sum over rounds of the slowest worker's kernel time
    merge_s: float = 0.0
    worker_kernel_s: list = field(default_factory=list)  # per worker, summed over rounds
    worker_cpu_s: list = field(default_factory=list)  # per worker thread CPU time in its kernel
    worker_updates: list = field(default_factory=list)
    overlap_s: float = 0.0  # time two or more worker kernels ran at once (threads backend)
    single_worker_updates_per_s: float | None = None  # same kernel, one thread alone
    online_episodes: int = 0
    online_return_mean: float | None = None


class _Pool:
    """W workers = the calling thread (worker 0) + W-1 pool threads.

    The caller runs worker 0 itself instead of sleeping on the results, so a round starts
    at once on one core and only W-1 threads have to be woken (that wake-up skew, not the
    merge, was the visible sync cost of short rounds)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.ex = (ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix="hetrl-tabular")
                   if workers > 1 else None)

    def map(self, fn, items):
        items = list(items)
        if self.ex is None:
            return [fn(x) for x in items]
        futures = [self.ex.submit(fn, x) for x in items[1:]]
        first = fn(items[0])
        return [first] + [f.result() for f in futures]

    def close(self):
        if self.ex is not None:
            self.ex.shutdown()


class Timing(float):
    """A kernel call's wall seconds (the float value) plus the calling thread's CPU seconds and
    the call's start/end on the perf_counter clock (to see whether workers overlapped)."""

    cpu: float = 0.0
    start: float = 0.0
    end: float = 0.0


def _timed(fn, *args) -> Timing:
    c0, t0 = time.thread_time(), time.perf_counter()
    fn(*args)
    t1 = time.perf_counter()
    out = Timing(t1 - t0)
    out.cpu, out.start, out.end = time.thread_time() - c0, t0, t1
    return out


def overlap_s(times: list) -> float:
    """Seconds during which at least two of the calls ran at once (sweep over start/end)."""
    events = sorted([(t.start, 1) for t in times] + [(t.end, -1) for t in times])
    active, last, total = 0, 0.0, 0.0
    for when, step in events:
        if active >= 2:
            total += when - last
        active += step
        last = when
    return total


def _account(stats: "TrainStats", times: list, sizes: list) -> None:
    stats.kernel_s += max(times)
    if len(times) > 1 and all(isinstance(t, Timing) for t in times):
        stats.overlap_s += overlap_s(times)
    for w, t in enumerate(times):
        stats.worker_kernel_s[w] += float(t)
        stats.worker_cpu_s[w] += getattr(t, "cpu", float(t))
        stats.worker_updates[w] += int(sizes[w])


REWARD_CHUNK = 1 << 16  # rewards per to_fixed call: its float64 temporaries stay small


def prepare_rewards(r: np.ndarray, dtype: str, frac_bits: int | None, bounds=None) -> np.ndarray:
    """Rewards for the kernels: float32 as they are, or int32 fixed point (to_fixed).

    The int32 conversion runs once per call, before the rounds: one thread per shard of
    `bounds` (NumPy releases the GIL), in chunks so that no dataset-sized float64 temporary
    is page-faulted in (about 3x faster than one whole-array conversion)."""
    if dtype != "int32":
        return np.ascontiguousarray(r, np.float32)
    bounds = [0, len(r)] if bounds is None else bounds
    out = np.empty(r.shape, np.int32)

    def convert(w):
        lo, hi = int(bounds[w]), int(bounds[w + 1])
        for i in range(lo, hi, REWARD_CHUNK):
            j = min(i + REWARD_CHUNK, hi)
            out[i:j] = to_fixed(r[i:j], frac_bits)

    W = len(bounds) - 1
    threads = min(W, os.cpu_count() or 1)
    if threads == 1:
        for w in range(W):
            convert(w)
    else:
        with ThreadPoolExecutor(max_workers=threads) as ex:
            list(ex.map(convert, range(W)))  # list(): re-raises a worker's UsageError here
    return out


def train_offline(data, algo: str, dtype: str, workers: int, rounds: int, alphas: list[float],
                  gamma: float, merge_strategy: str = "mean", backend: str = "threads",
                  epsilons: list[float] | None = None, sarsa_next: str = "policy", seed: int = 0,
                  frac_bits: int | None = None, q_init: np.ndarray | None = None,
                  measure_single: bool = False, counts: np.ndarray | None = None,
                  bounds: np.ndarray | None = None) -> tuple[np.ndarray, TrainStats]:
    """Offline rounds over `data` (a Dataset); returns the merged table and measurements."""
    from hetrl.tabular.dataset import shard_bounds, shard_counts

    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "prange" and algo != "qlearning":
        raise UsageError("backend prange supports qlearning only; use --backend threads")
    if sarsa_next not in SARSA_NEXT:
        raise UsageError(f"unknown sarsa_next {sarsa_next!r}; use one of {', '.join(SARSA_NEXT)}")
    W = int(workers)
    nS, nA = data.n_states, data.n_actions
    bounds = shard_bounds(len(data), W) if bounds is None else bounds
    if merge_strategy == "weighted" and counts is None:
        counts = shard_counts(data, bounds)
    tdt = np.int32 if dtype == "int32" else np.float32
    if dtype == "int32" and frac_bits is None:
        frac_bits = choose_frac_bits(data.reward_abs_max, gamma)
    q = np.zeros((nS, nA), tdt) if q_init is None else np.array(q_init, dtype=tdt)
    qs = worker_tables(W, nS, nA, tdt)
    s, a, s2, a2, done = data.s, data.a, data.s2, data.a2, data.done
    rngs = worker_rows([K.rng_state(seed * 1_000_003 + 7919 * w + 1) for w in range(W)])
    epsilons = epsilons or [0.0] * rounds
    stats = TrainStats(worker_kernel_s=[0.0] * W, worker_cpu_s=[0.0] * W, worker_updates=[0] * W)
    t_setup = time.perf_counter()  # once per call, before the timed rounds
    r = prepare_rewards(data.r, dtype, frac_bits, bounds)
    stats.setup_s = time.perf_counter() - t_setup
    pol = algo == "sarsa" and sarsa_next == "policy"

    def consts(rnd):
        if dtype == "int32":
            return np.int64(const_to_fixed(alphas[rnd])), np.int64(const_to_fixed(gamma))
        return np.float32(alphas[rnd]), np.float32(gamma)

    def work(w, rnd, table=None, rng=None, sl=None):
        al, ga = consts(rnd)
        qw = qs[w] if table is None else table
        sl = slice(int(bounds[w]), int(bounds[w + 1])) if sl is None else sl
        if algo == "qlearning":
            fn = K.qlearning_i32 if dtype == "int32" else K.qlearning_f32
            return _timed(fn, qw, s[sl], a[sl], r[sl], s2[sl], done[sl], al, ga)
        if pol:
            fn = K.sarsa_pol_i32 if dtype == "int32" else K.sarsa_pol_f32
            return _timed(fn, qw, s[sl], a[sl], r[sl], s2[sl], done[sl], al, ga,
                          K.eps_threshold(epsilons[rnd]), rngs[w] if rng is None else rng)
        fn = K.sarsa_i32 if dtype == "int32" else K.sarsa_f32
        return _timed(fn, qw, s[sl], a[sl], r[sl], s2[sl], a2[sl], done[sl], al, ga)

    # warm-up: load the compiled kernel (numba cache) outside the timed rounds
    wlo, whi = int(bounds[0]), int(min(bounds[1], bounds[0] + 64))
    work(0, 0, table=q.copy(), rng=K.rng_state(0), sl=slice(wlo, whi))
    if backend == "prange":
        al, ga = consts(0)
        fn = K.qlearning_i32_prange if dtype == "int32" else K.qlearning_f32_prange
        # two padded tables: the same (non-contiguous 3-D) array type as the timed calls
        fn(worker_tables(2, nS, nA, tdt), np.array([wlo, whi, whi], np.int64), s, a, r, s2, done, al, ga)

    if measure_single:  # one worker alone on shard 0 of a throwaway table: the scaling reference
        t = work(0, 0, table=q.copy(), rng=K.rng_state(12345))
        stats.single_worker_updates_per_s = float((bounds[1] - bounds[0]) / t) if t > 0 else None

    pool = _Pool(W) if backend == "threads" else None
    try:
        t_all = time.perf_counter()
        for rnd in range(rounds):
            qs[...] = q  # every worker starts the round from the merged table
            if backend == "threads":
                times = pool.map(lambda w: work(w, rnd), range(W))
            else:
                al, ga = consts(rnd)
                fn = K.qlearning_i32_prange if dtype == "int32" else K.qlearning_f32_prange
                t = _timed(fn, qs, bounds, s, a, r, s2, done, al, ga)
                times = [float(t)] * W  # one call for all workers: no per-worker split
            _account(stats, times, np.diff(bounds))
            t_m = time.perf_counter()
            q = merge(q, qs, merge_strategy, counts)
            stats.merge_s += time.perf_counter() - t_m
        stats.wall_s = time.perf_counter() - t_all
    finally:
        if pool is not None:
            pool.close()
    stats.updates = int(len(data)) * int(rounds)
    return q, stats


def train_online(info, algo: str, dtype: str, workers: int, steps_per_worker: int, rounds: int,
                 alphas: list[float], gamma: float, epsilons: list[float], merge_strategy: str = "mean",
                 seed: int = 0, frac_bits: int | None = None, use_model: bool | None = None
                 ) -> tuple[np.ndarray, TrainStats]:
    """Online epsilon-greedy learning: W env copies, K = steps_per_worker steps, merge per round."""
    W, nS, nA = int(workers), info.n_states, info.n_actions
    if use_model is None:
        use_model = info.model is not None
    tdt = np.int32 if dtype == "int32" else np.float32
    q = np.zeros((nS, nA), tdt)
    qs = worker_tables(W, nS, nA, tdt)
    stats = TrainStats(worker_kernel_s=[0.0] * W, worker_cpu_s=[0.0] * W, worker_updates=[0] * W)
    rngs = worker_rows([K.rng_state(seed * 1_000_003 + 7919 * w + 2) for w in range(W)])
    sarsa = algo == "sarsa"
    if use_model:
        m = info.model
        if dtype == "int32" and frac_bits is None:
            frac_bits = choose_frac_bits(m.reward_abs_max, gamma)
        env_states = worker_rows([np.array([-1, 0, -1], np.int64)] * W)
        ep_stats = worker_rows([np.zeros(3, np.float64)] * W)
        rew_fp = to_fixed(m.reward, frac_bits) if dtype == "int32" else None

        def work(w, rnd, steps=steps_per_worker):
            thr = K.eps_threshold(epsilons[rnd])
            if dtype == "int32":
                return _timed(K.online_i32, qs[w], steps, sarsa, m.cum_p, m.n_out, m.next_s,
                              rew_fp, m.term, m.reward, m.isd_cum, info.max_steps,
                              np.int64(const_to_fixed(alphas[rnd])), np.int64(const_to_fixed(gamma)),
                              thr, rngs[w], env_states[w], ep_stats[w])
            return _timed(K.online_f32, qs[w], steps, sarsa, m.cum_p, m.n_out, m.next_s,
                          m.reward, m.term, m.isd_cum, info.max_steps, np.float32(alphas[rnd]),
                          np.float32(gamma), thr, rngs[w], env_states[w], ep_stats[w])
    else:
        if dtype == "int32" and frac_bits is None:
            frac_bits = 16
        workers_env = [_GymWorker(info, algo, dtype, seed + 10_007 * w, frac_bits) for w in range(W)]
        ep_stats = [wk.stats for wk in workers_env]

        def work(w, rnd, steps=steps_per_worker):
            return _timed(workers_env[w].run, qs[w], steps, alphas[rnd], gamma, epsilons[rnd])

    if use_model:  # warm-up: load the compiled kernel outside the timed rounds
        saved = (qs[0].copy(), env_states[0].copy(), ep_stats[0].copy(), rngs[0].copy())
        work(0, 0, steps=1)
        qs[0], env_states[0][:], ep_stats[0][:], rngs[0][:] = saved

    pool = _Pool(W)
    try:
        t_all = time.perf_counter()
        for rnd in range(rounds):
            qs[...] = q
            times = pool.map(lambda w: work(w, rnd), range(W))
            _account(stats, times, [steps_per_worker] * W)
            t_m = time.perf_counter()
            q = merge(q, qs, merge_strategy)
            stats.merge_s += time.perf_counter() - t_m
        stats.wall_s = time.perf_counter() - t_all
    finally:
        pool.close()
        if not use_model:
            for wk in workers_env:
                wk.close()
    stats.updates = W * steps_per_worker * rounds
    eps_done = sum(int(x[0]) for x in ep_stats)
    stats.online_episodes = eps_done
    stats.online_return_mean = float(sum(x[1] for x in ep_stats) / eps_done) if eps_done else None
    return q, stats


class _GymWorker:
    """One real Gymnasium env instance learning online in Python (envs without a table)."""

    def __init__(self, info, algo, dtype, seed, frac_bits):
        from hetrl.tabular.envs import make_env
        from hetrl.tabular.reference import XorShift64Star

        self.env = make_env(info.env_id, info.env_kwargs)
        self.algo, self.dtype, self.frac_bits = algo, dtype, frac_bits
        self.rng = XorShift64Star(K.splitmix64(seed))
        self.seed = seed
        self.s = None
        self.a = None
        self.ret = 0.0
        self.stats = np.zeros(3, np.float64)

    def _act(self, q, s, eps):
        if eps > 0 and self.rng.unit() < eps:
            return self.rng.below(q.shape[1])
        return int(np.argmax(q[s]))

    def run(self, q, steps, alpha, gamma, eps):
        from hetrl.tabular.reference import update_int

        if self.s is None:
            self.s, _ = self.env.reset(seed=self.seed)
            self.a = None
        alpha_fp, gamma_fp = const_to_fixed(alpha), const_to_fixed(gamma)
        for _ in range(steps):
            s = int(self.s)
            a = self._act(q, s, eps) if self.a is None else self.a
            s2, r, term, trunc, _ = self.env.step(a)
            s2 = int(s2)
            self.ret += float(r)
            a2 = self._act(q, s2, eps) if self.algo == "sarsa" else 0
            kind = "sarsa" if self.algo == "sarsa" else "qlearning"
            if self.dtype == "int32":
                rows = [[int(x) for x in q[s]], [int(x) for x in q[s2]]]
                # a two-row table view for the reference update: row 0 = s, row 1 = s2
                tbl = [rows[0], rows[1]] if s != s2 else [rows[0], rows[0]]
                update_int(tbl, [(0, a, int(round(float(r) * (1 << self.frac_bits))), 1, a2, term)],
                           kind, alpha_fp, gamma_fp)
                q[s, a] = tbl[0][a]
            else:
                target = float(r) if term else float(r) + gamma * (q[s2, a2] if kind == "sarsa" else q[s2].max())
                q[s, a] = np.float32(q[s, a] + np.float32(alpha) * np.float32(target - q[s, a]))
            if term or trunc:
                self.stats[0] += 1
                self.stats[1] += self.ret
                self.ret = 0.0
                self.s, _ = self.env.reset()
                self.a = None
            else:
                self.s = s2
                self.a = a2 if self.algo == "sarsa" else None

    def close(self):
        self.env.close()
