#!/usr/bin/env python
"""The Atari DQN learner (Nature CNN, batch 32) on a CPU: one update with the convolutions on NCHW
activations against channels-last (NHWC), the layout hetrl's NatureCNN uses on a CPU.

Usage:
    python benchmarks/bench_cnn_layout.py [--threads 1,2] [--rounds 6] [--updates 15]
           [--out FILE]

Two DQN learners with the same weights live in one process; each round times `--updates` calls of
`learn` (online forward and backward, the target network's forward, fused Adam, a gradient-norm
clip) on each, alternating, after 3 warm-up calls; the figure is the median over rounds. Batches are
uint8 frames (4 x 84 x 84) as the replay returns them. Compare the two layouts in the same run: the
machines here are shared and noisy.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hetrl.algos.dqn import DQN
from hetrl.config import make_config

LAYOUTS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


def learner(layout: torch.memory_format) -> DQN:
    torch.manual_seed(0)
    cfg = make_config("dqn", "ALE/Breakout-v5", {"learner_kernel": "public"})
    algo = DQN(cfg, (4, 84, 84), 4, pixels=True)
    algo.q.features.cpu_layout = algo.q_target.features.cpu_layout = layout
    return algo


def batch(k: int, b: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    frames = lambda: torch.randint(0, 256, (k, b, 4, 84, 84), dtype=torch.uint8, generator=gen)  # noqa: E731
    return {"obs": frames(), "next_obs": frames(), "action": torch.randint(0, 4, (k, b), generator=gen),
            "reward": torch.randn(k, b, generator=gen), "steps": torch.ones(k, b, dtype=torch.int64),
            "terminated": torch.zeros(k, b, dtype=torch.bool)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--updates", type=int, default=15)
    ap.add_argument("--out", default=None, help="default: benchmarks/results/ under the naming scheme")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    algos = {name: learner(fmt) for name, fmt in LAYOUTS.items()}
    b = algos["nchw"].cfg.batch_size
    batches = [batch(1, b, gen) for _ in range(4)]
    weights = torch.ones(1, b)
    out = {"batch_size": b, "torch": torch.__version__, "ms_per_update": {}, "command": "python " + " ".join(sys.argv)}
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        times = {name: [] for name in algos}
        for _ in range(args.rounds):
            for name, algo in algos.items():
                for i in range(3):
                    algo.learn(batches[i % 4], weights)
                t = time.perf_counter()
                for i in range(args.updates):
                    algo.learn(batches[i % 4], weights)
                times[name].append((time.perf_counter() - t) / args.updates * 1e3)
        med = {name: statistics.median(v) for name, v in times.items()}
        out["ms_per_update"][str(threads)] = {"median": med, "rounds": times}
        print(f"{threads} thread{'s' if threads > 1 else ''}: NCHW {med['nchw']:.1f} ms, NHWC {med['nhwc']:.1f} ms "
              f"per update ({med['nchw'] / med['nhwc']:.2f}x)")
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    args.out = args.out or str(result_path("bench_cnn_layout", "dqn:ALE/Breakout-v5"))
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
