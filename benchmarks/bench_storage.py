"""Micro-benchmark of the ways to gather replay rows into CPU torch tensors.

Run with ``python benchmarks/bench_storage.py``.  For a few typical
fields and batch sizes 64 and 256, prints microseconds per gather (median of
5 rounds, 1 thread) of:

* ``np.take``      -- ``torch.from_numpy(np.take(arr, idx, axis=0))``
* ``arr[idx]``     -- ``torch.from_numpy(arr[idx])``
* ``index_select`` -- ``torch.from_numpy(arr).index_select(0, torch.from_numpy(idx))``
* ``tensor[idx]``  -- ``torch.from_numpy(arr)[torch.from_numpy(idx)]``

``Storage.get`` (``hetrl/replay/storage.py``) uses the winner.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

FIELDS = [((), np.int64), ((), np.float32), ((4,), np.float32), ((17,), np.float32), ((4, 84, 84), np.uint8)]


def main(capacity: int = 100_000, rounds: int = 5) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"capacity={capacity} (us per gather, median of {rounds} rounds)")
    print(f"{'field':>18} {'batch':>5} {'np.take':>9} {'arr[idx]':>9} {'index_select':>12} {'tensor[idx]':>11}")
    for shape, dtype in FIELDS:
        arr = rng.integers(0, 100, (capacity, *shape), dtype=np.uint8).astype(dtype)
        ten = torch.from_numpy(arr)
        for batch in (64, 256):
            idx = rng.integers(0, capacity, batch)
            variants = [
                lambda: torch.from_numpy(np.take(arr, idx, axis=0)),
                lambda: torch.from_numpy(arr[idx]),
                lambda: ten.index_select(0, torch.from_numpy(idx)),
                lambda: ten[torch.from_numpy(idx)],
            ]
            ref = variants[0]()
            iters = 2000 if arr[0].size < 1000 else 100
            res = []
            for fn in variants:
                assert torch.equal(fn(), ref)
                times = []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        fn()
                    times.append((time.perf_counter() - t0) / iters * 1e6)
                res.append(statistics.median(times))
            name = f"{shape} {np.dtype(dtype).name}"
            print(f"{name:>18} {batch:>5} {res[0]:9.1f} {res[1]:9.1f} {res[2]:12.1f} {res[3]:11.1f}", flush=True)


if __name__ == "__main__":
    main()
