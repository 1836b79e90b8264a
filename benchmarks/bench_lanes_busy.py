#!/usr/bin/env python
"""The compiled kernel's two lanes beside a program that holds one core: does a two-thread phase degrade gracefully?

    python benchmarks/bench_lanes_busy.py [--rounds 5] [--calls 150] [--cases td3,sac,qrdqn] [--out FILE]

For each case, one CompiledKernel per path it has (`head`: the built-ins' hand-derived phase, where one takes the
algorithm; `derived`: the phase traced from the algorithm's own learn), on the preset's shapes, timed in one process
and alternating (the order rotated every round), in four conditions:

    quiet_1   one lane, the machine otherwise idle
    quiet_2   two lanes
    hog_2     two lanes while a CPU hog (a process of its own spinning) holds one core
    hog_1     one lane beside the hog

With --blocks-cost it measures instead what the heads' fixed row blocks (optim.blocks: the same bits on any number
of lanes) cost against a split into as many blocks as there are lanes (the split before the blocks were fixed), on
one and two lanes, quiet, alternating, the stall detector off: "blocks_over_split_1" and "_2" are the ratios.

The figure issue-free lanes must meet: hog_2 / quiet_1 <= 1.3 (a two-thread phase beside a hog takes at most 1.3x the
one-thread phase on a quiet machine; more means lanes that wait for a descheduled partner). Medians of ms per
learn() call. The foreign load around the quiet rounds is recorded (hetrl/planner/load.py): run it on a machine
nobody else uses. Writes benchmarks/results/bench_lanes_busy_<cases>_DATE_MACHINE_COMMIT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

from hetrl.algos import make_algorithm, replay_spec  # noqa: E402
from hetrl.config import make_config  # noqa: E402
from hetrl.kernels import synthetic_batch  # noqa: E402
from hetrl.kernels.compiled import CompiledKernel  # noqa: E402
from hetrl.planner.load import Watch  # noqa: E402
from result_files import commit, result_path  # noqa: E402

CASES = {"td3": ("td3", "Pendulum-v1", {}), "sac": ("sac", "Pendulum-v1", {}),
         "qrdqn": ("qrdqn", "CartPole-v1", {})}   # qrdqn: the tests' user algorithm (tests/qrdqn_example.py)
HOG = "while True:\n    pass\n"
CONDITIONS = ("quiet_1", "quiet_2", "hog_2", "hog_1")


def build(name: str):
    algo_name, env_id, settings = CASES[name]
    if algo_name == "qrdqn":
        sys.path.insert(0, str(HERE.parent / "tests"))
        import qrdqn_example  # noqa: F401  (registers itself where it is imported)
    env = gym.make(env_id)
    cfg = make_config(algo_name, env_id, settings)
    torch.manual_seed(0)
    algo = make_algorithm(cfg, env.observation_space, env.action_space)
    spec = replay_spec(cfg, env.observation_space, env.action_space)
    k = max(1, int(algo.graph_period())) if hasattr(algo, "graph_period") else 1
    g = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(spec, env.action_space, cfg.batch_size, k, "cpu", g) for _ in range(4)]
    return algo, batches


def time_calls(kernel, batches, calls: int) -> float:
    for i in range(5):
        kernel.learn(*batches[i % len(batches)])
    t = time.perf_counter()
    for i in range(calls):
        kernel.learn(*batches[i % len(batches)])
    return (time.perf_counter() - t) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--cases", default="td3,sac,qrdqn")
    ap.add_argument("--out")
    ap.add_argument("--blocks-cost", action="store_true", help="fixed row blocks against one block per lane (heads)")
    args = ap.parse_args()
    if args.blocks_cost:
        return blocks_cost(args)
    torch.set_num_threads(1)
    doc = {"benchmark": "bench_lanes_busy", "command": "python benchmarks/bench_lanes_busy.py " + " ".join(sys.argv[1:]),
           "commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "rounds": args.rounds,
           "calls": args.calls, "cases": {}}
    for name in args.cases.split(","):
        algo, batches = build(name)
        kernels = {}
        for path in ("head", "derived"):
            try:
                kernels[path] = CompiledKernel(algo, path=path)
            except (ValueError, Exception) as e:   # a path that does not take this algorithm
                doc["cases"].setdefault(name, {}).setdefault("not_taken", {})[path] = str(e)[:200]
        times = {p: {c: [] for c in CONDITIONS} for p in kernels}
        foreign = []
        for r in range(args.rounds):
            order = list(CONDITIONS[r % 4:] + CONDITIONS[:r % 4])
            for cond in order:
                hog = subprocess.Popen([sys.executable, "-c", HOG]) if cond.startswith("hog") else None
                try:
                    if hog:
                        time.sleep(0.3)
                    w = Watch().start() if not hog else None
                    for path, kern in kernels.items():
                        kern.use_threads(int(cond[-1]))
                        times[path][cond].append(time_calls(kern, batches, args.calls))
                    if w is not None:
                        load = w.stop()
                        if load is not None:
                            foreign.append(round(load.foreign, 3))
                finally:
                    if hog:
                        hog.kill()
                        hog.wait()
        case = doc["cases"].setdefault(name, {})
        case["foreign_cores_while_quiet"] = foreign
        for path, t in times.items():
            med = {c: round(statistics.median(v), 3) for c, v in t.items()}
            case[path] = {"ms_per_call": t, "median_ms": med, "hog_2_over_quiet_1": round(med["hog_2"] / med["quiet_1"], 3),
                          "quiet_2_over_quiet_1": round(med["quiet_2"] / med["quiet_1"], 3),
                          "lanes": kernels[path].figures().get("lanes"), "gemm": kernels[path].figures().get("gemm")}
            print(f"{name} {path}: " + ", ".join(f"{c} {m:.2f} ms" for c, m in med.items())
                  + f"; hog_2 / quiet_1 = {case[path]['hog_2_over_quiet_1']:.2f}", flush=True)
        for kern in kernels.values():
            kern.close()
    out = Path(args.out) if args.out else result_path("bench_lanes_busy", args.cases.split(","))
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


def blocks_cost(args) -> None:
    """The heads' fixed row blocks against one block per lane, quiet, on one and two lanes, alternating."""
    import importlib

    from hetrl.kernels.compiled import optim

    modules = [importlib.import_module(f"hetrl.kernels.compiled.{m}") for m in ("dqn", "actor_critic", "sac")]
    doc = {"benchmark": "bench_lanes_busy --blocks-cost", "command": "python benchmarks/bench_lanes_busy.py "
           + " ".join(sys.argv[1:]), "commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "cores": os.cpu_count(), "rounds": args.rounds, "calls": args.calls, "cases": {}}
    modes = ("blocks_1", "split_1", "blocks_2", "split_2")
    for name in args.cases.split(","):
        algo, batches = build(name)
        try:
            kern = CompiledKernel(algo, path="head", lane_guard=False)
        except ValueError as e:
            doc["cases"][name] = {"not_taken": str(e)[:200]}
            continue
        times = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in modes[r % 4:] + modes[:r % 4]:
                lanes = int(mode[-1])
                for m in modules:
                    m.blocks = optim.blocks if mode.startswith("blocks") else (lambda B, n=lanes: n)
                kern.use_threads(lanes)
                times[mode].append(time_calls(kern, batches, args.calls))
        for m in modules:
            m.blocks = optim.blocks
        kern.close()
        med = {m: round(statistics.median(v), 3) for m, v in times.items()}
        doc["cases"][name] = {"ms_per_call": times, "median_ms": med, "blocks": optim.blocks(batches[0][1].shape[1]),
                              "blocks_over_split_1": round(med["blocks_1"] / med["split_1"], 3),
                              "blocks_over_split_2": round(med["blocks_2"] / med["split_2"], 3)}
        print(f"{name} head: " + ", ".join(f"{m} {v:.2f} ms" for m, v in med.items()), flush=True)
    out = Path(args.out) if args.out else result_path("bench_lanes_busy", args.cases.split(",")).with_suffix("")
    out = out.with_name(out.name + "-blocks.json") if not args.out else out
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
