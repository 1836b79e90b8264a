"""Replay memory of Atari DQN: the frame storage (each frame once) against both stacks in full.

    python benchmarks/bench_atari_memory.py [--game ALE/Breakout-v5] [--transitions 10000] [--envs 4]

1. From the layouts (no allocation): bytes per transition of hetrl.replay.FrameStorage and of the
   plain Storage for the 4 x 84 x 84 uint8 stacks and DQN's other fields, and what a replay of
   100,000 (the zoo's preset) and 1,000,000 transitions takes.
2. Measured: a ReplayBuffer of `--transitions` slots (frames=True, then frames=False) is filled with
   real transitions (the preprocessed game, uniform random actions, `--envs` envs interleaved as an
   actor inserts them); the process's resident set size grows by what the replay really holds
   (NumPy commits pages as they are written), divided by the transitions = measured bytes per
   transition, scaled to 1,000,000. Writes benchmarks/results/bench_atari_memory_<game>_<date>_<machine>_<commit>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--game", default="ALE/Breakout-v5")
    ap.add_argument("--transitions", type=int, default=10_000)
    ap.add_argument("--envs", type=int, default=4)
    args = ap.parse_args()

    import numpy as np

    from hetrl.actors import Actor
    from hetrl.actors.envs import prepare_env
    from hetrl.algos import make_algorithm, replay_spec
    from hetrl.actors.envs import probe_spaces
    from hetrl.config import make_config
    from hetrl.replay import FrameStorage, ReplayBuffer, Storage
    from hetrl.replay.memory import arrays_bytes

    cfg = make_config("dqn", args.game)
    env = prepare_env(args.game, cfg)
    obs_space, act_space = probe_spaces(env)
    spec = replay_spec(cfg, obs_space, act_space)
    out: dict = {"game": args.game, "obs": list(obs_space.shape), "spec": {k: [list(s), str(d)] for k, (s, d) in spec.items()}}

    layout = {}
    for name, cls in (("frames", FrameStorage), ("plain", Storage)):
        per = {n: arrays_bytes(cls.layout(n, spec)) for n in (100_000, 1_000_000)}
        layout[name] = {"bytes_per_transition": per[1_000_000] / 1_000_000, "replay_100k_bytes": per[100_000],
                        "replay_1M_bytes": per[1_000_000]}
    out["layout"] = layout

    # real transitions, collected once, inserted into both storages in the same order
    policy = make_algorithm(cfg, obs_space, act_space).make_policy(seed=0)
    actor = Actor(env, args.envs, seed=0, policy=policy)
    t0 = time.perf_counter()
    batches, n = [], 0
    while n < args.transitions:
        b = actor.collect(32 * args.envs, lambda steps: None)
        batches.append(b)
        n += len(b["obs"])
    actor.close()
    collect_s = time.perf_counter() - t0
    measured = {}
    for name, frames in (("frames", True), ("plain", False)):
        before = rss()
        rb = ReplayBuffer(args.transitions, spec, frames=frames, seed=0)
        t0 = time.perf_counter()
        for b in batches:
            rb.insert(b)
        insert_s = time.perf_counter() - t0
        grown = rss() - before
        held = len(rb)
        measured[name] = {"transitions": held, "rss_growth_bytes": grown, "bytes_per_transition": grown / held,
                          "replay_1M_bytes_scaled": grown / held * 1_000_000, "insert_us_per_transition":
                          insert_s / sum(len(b["obs"]) for b in batches) * 1e6}
        if frames:
            measured[name]["frames_used"] = rb.storage.frames_used
            measured[name]["frames_per_transition"] = rb.storage.frames_used / held
        del rb
    out.update(measured=measured, collect_s=collect_s, envs=args.envs, command="python " + " ".join(sys.argv))
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    path = result_path("bench_atari_memory", f"dqn:{args.game}")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'storage':<8} {'layout B/transition':>20} {'1M replay (layout)':>20} {'measured B/transition':>22} "
          f"{'1M replay (measured)':>21}")
    for name in ("frames", "plain"):
        lay, m = layout[name], measured[name]
        print(f"{name:<8} {lay['bytes_per_transition']:>20,.0f} {lay['replay_1M_bytes'] / 1e9:>18.2f} GB "
              f"{m['bytes_per_transition']:>22,.0f} {m['replay_1M_bytes_scaled'] / 1e9:>19.2f} GB")
    print(f"frames per transition: {measured['frames']['frames_per_transition']:.3f}; wrote {path}")


if __name__ == "__main__":
    main()
