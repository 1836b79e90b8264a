"""Micro-benchmark of the SumTree backends (numba vs NumPy) across fanouts.

Run with ``python benchmarks/bench_sumtree.py [--capacity N] [--batch B]``.
Prints microseconds per ``update`` and per ``sample`` call (median of
``--rounds`` rounds) for every backend and fanout; one update + one sample of
a batch is what one prioritized-replay learner step costs.  Runs on one
thread so the figures do not depend on the machine's load from other cores
more than necessary.  ``sumtree.py``'s choice of backend and fanout rests on it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from hetrl.replay.sumtree import BACKENDS, SumTree


def bench(capacity: int, batch: int, fanout: int, backend: str, rounds: int, iters: int) -> tuple[float, float]:
    """Return (update_us, sample_us) medians for one configuration."""
    rng = np.random.default_rng(0)
    tree = SumTree(capacity, fanout, backend=backend)
    tree.update(np.arange(capacity), rng.random(capacity) + 0.01)  # full tree (also compiles numba)
    idx = [rng.integers(0, capacity, batch) for _ in range(iters)]
    pri = [rng.random(batch) + 0.01 for _ in range(iters)]
    tree.sample(batch, rng)
    upd, smp = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(iters):
            tree.update(idx[i], pri[i])
        t1 = time.perf_counter()
        for _ in range(iters):
            tree.sample(batch, rng)
        t2 = time.perf_counter()
        upd.append((t1 - t0) / iters * 1e6)
        smp.append((t2 - t1) / iters * 1e6)
    return statistics.median(upd), statistics.median(smp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--fanouts", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    try:
        import numba

        numba.set_num_threads(1)
    except ImportError:
        pass
    print(f"capacity={args.capacity} batch={args.batch} (us per call, median of {args.rounds} rounds)")
    print(f"{'backend':>8} {'fanout':>6} {'depth':>5} {'update':>9} {'sample':>9}")
    for backend in args.backends:
        for fanout in args.fanouts:
            depth = SumTree(args.capacity, fanout, backend=backend).depth
            u, s = bench(args.capacity, args.batch, fanout, backend, args.rounds, args.iters)
            print(f"{backend:>8} {fanout:>6} {depth:>5} {u:9.1f} {s:9.1f}", flush=True)


if __name__ == "__main__":
    main()
