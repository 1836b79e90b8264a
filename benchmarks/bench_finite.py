"""Cost of the non-finite guard on the hot path: ``python benchmarks/bench_finite.py``.

Times ``ReplayBuffer.insert`` of a CartPole-sized batch (256 rows, obs (4,)) with and without
``check_finite``, the check alone, and a DQN CartPole learner phase (128 updates of batch 64 on a
256x256 MLP, one thread) for scale. Run by hand, never asserted in tests.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch

from hetrl.replay.buffer import ReplayBuffer
from hetrl.replay.finite import first_non_finite


def main(rows: int = 256, repeat: int = 2000) -> None:
    """Insert cost with and without the check, next to a DQN CartPole learner phase."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    spec = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
            "next_obs": ((4,), "float32"), "terminated": ((), "bool"), "truncated": ((), "bool"),
            "steps": ((), "uint8")}   # hetrl.algos.replay_spec of CartPole
    batch = {"obs": rng.standard_normal((rows, 4), dtype=np.float32), "action": rng.integers(0, 2, rows),
             "reward": np.ones(rows, np.float32), "next_obs": rng.standard_normal((rows, 4), dtype=np.float32),
             "terminated": np.zeros(rows, bool), "truncated": np.zeros(rows, bool), "steps": np.ones(rows, np.uint8)}

    def per_insert(check: bool) -> float:
        rb = ReplayBuffer(100_000, spec, check_finite=check)
        best = float("inf")
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(repeat):
                rb.insert(batch)
            best = min(best, (time.perf_counter() - t) / repeat)
        return best

    def per_check() -> float:
        best = float("inf")
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(repeat):
                first_non_finite(batch)
            best = min(best, (time.perf_counter() - t) / repeat)
        return best

    net = torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 2))
    target = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    rb = ReplayBuffer(100_000, spec, seed=0)
    for _ in range(40):
        rb.insert(batch)

    def phase() -> float:
        t = time.perf_counter()
        for _ in range(128):
            b, _, _ = rb.sample(64)
            with torch.no_grad():
                y = b["reward"] + 0.99 * target(b["next_obs"]).max(1).values * (~b["terminated"])
            q = net(b["obs"]).gather(1, b["action"].view(-1, 1)).squeeze(1)
            loss = torch.nn.functional.smooth_l1_loss(q, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return time.perf_counter() - t

    phase()
    learner = sorted(phase() for _ in range(5))[2]
    on, off, chk = per_insert(True), per_insert(False), per_check()
    print(f"insert {rows} rows: {on * 1e6:.1f} us with the check, {off * 1e6:.1f} us without "
          f"(first_non_finite alone {chk * 1e6:.1f} us); DQN learner phase (128 x batch 64, 256x256 MLP): "
          f"{learner * 1e3:.0f} ms; the check adds {(on - off) / learner:.4%} of a phase per insert")


if __name__ == "__main__":
    main()
