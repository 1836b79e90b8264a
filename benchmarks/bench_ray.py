"""The Ray replay server against the local shared-memory replay, and the ray schedule against local.

    python benchmarks/bench_ray.py [--only replay,schedule,per] [--calls 300] [--rounds 2] [--lags 0,15]

* replay    per batch size (32 .. 1024 transitions of CartPole-v1's shapes): latency p50 / p99
            and throughput of
              - insert: local = one batched copy into the shared-memory ring (what the local
                schedule's learner does per actor chunk); ray = a remote actor's
                `ray.get(server.insert.remote(batch))`, object transfer and acknowledgement included;
              - prioritised sample (a batch, its keys and importance weights, ready to learn on):
                local = `_BatchSource.draw` of the local schedule (numba sum tree + gather in
                the learner process); ray = `ray.get(server.sample.remote(1, B))` from the learner;
            and the ray insert throughput with 8 calls in flight (what several actors give).
* schedule  DQN CartPole-v1 (preset replay ratio), `--steps` env steps, ray vs local, alternating
            rounds, each in a fresh process: env steps/s and training samples/s.
* per       DQN CartPole-v1 with prioritised replay under the ray schedule (1 actor), one variant per
            `--lags` value of priority_lag (0: exact PER, each batch drawn after the priorities of the
            one before are written; 15: 8 batches per sample call and one call in flight), alternating
            rounds, each in a fresh process: what exact PER costs the ray schedule.

Writes benchmarks/results/bench_ray_<sections>_<date>_<machine>_<commit>.json.  The machine is shared and
noisy: compare ratios measured in one run.
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

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (32, 128, 256, 512, 1024)
SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "next_obs": ((4,), "float32"),
        "terminated": ((), "bool"), "truncated": ((), "bool"), "steps": ((), "uint8")}


def make_batch(n: int, rng) -> dict:
    return {"obs": rng.random((n, 4), dtype=np.float32), "action": rng.integers(0, 2, n),
            "reward": np.ones(n, np.float32), "next_obs": rng.random((n, 4), dtype=np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool), "steps": np.ones(n, np.uint8)}


def stats(lat_s: list[float], n: int) -> dict:
    a = np.asarray(lat_s) * 1e6
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "transitions_per_s": n / (float(np.mean(a)) / 1e6)}


def timed(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bench_replay(calls: int) -> list[dict]:
    import ray

    from hetrl.replay import ReplayBuffer
    from hetrl.replay.server import ReplayServer
    from hetrl.runtime.local import _BatchSource
    from hetrl.runtime.shm import SharedArrays

    rng = np.random.default_rng(0)
    cap = 200_000
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    # a remote pusher, as an actor is: its batches reach the server through the object store
    Pusher = ray.remote(num_cpus=0)(_Pusher)
    server = ray.remote(num_cpus=0, max_concurrency=16)(ReplayServer).remote(
        cap, SPEC, prioritized=True, samples_per_insert=1.0, min_size=1, error_buffer=1e12, rate_limit=False, seed=0)
    pusher = Pusher.remote(server)
    ring = SharedArrays({k: ((cap, *s), d) for k, (s, d) in SPEC.items()})
    local = ReplayBuffer(cap, SPEC, prioritized=True, seed=0, buffers=ring.arrays)
    filler = make_batch(50_000, rng)
    local.insert(filler)
    ray.get(server.insert.remote(filler))
    rows = []
    for B in SIZES:
        b = make_batch(B, rng)
        src = _BatchSource(local, SPEC, B, 1, preallocate=True)
        row = {"batch": B}
        row["local_insert"] = stats(timed(lambda: local.insert(b), calls), B)
        row["ray_insert"] = stats(ray.get(pusher.push.remote(B, calls, 1)), B)
        lat = ray.get(pusher.push.remote(B, calls, 8))
        row["ray_insert_8_in_flight"] = {"transitions_per_s": B * calls / sum(lat)}
        row["local_sample"] = stats(timed(lambda: src.draw(1), calls), B)
        row["ray_sample"] = stats(timed(lambda: ray.get(server.sample.remote(1, B)), calls), B)
        rows.append(row)
        print(f"  B={B:5d}  insert p50 local {row['local_insert']['p50_us']:7.1f} us, ray {row['ray_insert']['p50_us']:7.1f} us"
              f" (p99 {row['ray_insert']['p99_us']:7.1f});  sample p50 local {row['local_sample']['p50_us']:7.1f} us, "
              f"ray {row['ray_sample']['p50_us']:7.1f} us (p99 {row['ray_sample']['p99_us']:7.1f});  ray insert "
              f"{row['ray_insert']['transitions_per_s'] / 1e3:7.0f}k/s, 8 in flight "
              f"{row['ray_insert_8_in_flight']['transitions_per_s'] / 1e3:7.0f}k/s", flush=True)
    ray.shutdown()
    return rows


class _Pusher:
    def __init__(self, server):
        self.server = server
        self.rng = np.random.default_rng(1)

    def push(self, B: int, calls: int, in_flight: int) -> list[float]:
        """Per-call seconds (in_flight=1), or per-window seconds / window (in_flight > 1)."""
        import ray

        b = make_batch(B, self.rng)
        if in_flight == 1:
            return timed(lambda: ray.get(self.server.insert.remote(b)), calls)
        out, t = [], time.perf_counter()
        refs = []
        for _ in range(calls):
            refs.append(self.server.insert.remote(b))
            if len(refs) >= in_flight:
                ray.get(refs.pop(0))
        ray.get(refs)
        return [time.perf_counter() - t]


CHILD = r"""
import json, sys
import hetrl
spec = json.loads(sys.argv[1])
run = hetrl.train("dqn", "CartPole-v1", steps=spec["steps"], seed=0, progress=False, evaluate_episodes=0, **spec["extra"])
print(json.dumps({k: run.result.get(k) for k in ("env_steps_per_s", "env_steps_per_s_learning", "train_samples_per_s",
                  "train_samples_per_wall_s", "wall_s", "startup_s", "actors", "learner_busy_fraction",
                  "actor_busy_fraction", "policy_staleness_mean", "replay_ratio_achieved", "gradient_steps",
                  "priority_lag_max")}))
"""


def alternate(variants: dict, steps: int, rounds: int) -> dict[str, list]:
    """Each variant's settings in a fresh process per round, the order reversed every other round."""
    rows: dict[str, list] = {v: [] for v in variants}
    for r in range(rounds):
        for v in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"steps": steps, "extra": variants[v]})],
                               capture_output=True, text=True)
            if p.returncode:
                raise SystemExit(f"{v} failed:\n{p.stderr[-3000:]}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            rows[v].append(res)
            print(f"  round {r} {v:>5}: {res['env_steps_per_s']:7.0f} env steps/s, {res['train_samples_per_s']:7.0f} "
                  f"samples/s (learner busy {res['learner_busy_fraction']:.2f}, start-up {res['startup_s']:.1f} s)",
                  flush=True)
    return rows


def medians(rows: dict[str, list]) -> dict:
    keys = ("env_steps_per_s", "env_steps_per_s_learning", "train_samples_per_s", "train_samples_per_wall_s")
    return {v: {k: statistics.median(x[k] or 0.0 for x in rs) for k in keys} for v, rs in rows.items()}


def bench_schedule(steps: int, rounds: int) -> dict:
    rows = alternate({"local": {"schedule": "local"}, "ray": {"schedule": "ray"}}, steps, rounds)
    med = medians(rows)
    ratio = med["ray"]["env_steps_per_s"] / med["local"]["env_steps_per_s"]
    print(f"==> ray / local env steps/s {ratio:.2f}x (medians)")
    return {"steps": steps, "rounds": rows, "median": med, "ray_vs_local": ratio}


def bench_per(steps: int, rounds: int, lags: list[int]) -> dict:
    variants = {f"priority_lag={lag}": {"schedule": "ray", "actors": 1, "prioritized": True, "priority_lag": lag}
                for lag in lags}
    rows = alternate(variants, steps, rounds)
    med = medians(rows)
    base = med[f"priority_lag={lags[0]}"]["env_steps_per_s_learning"]
    for v, m in med.items():
        print(f"==> {v}: {m['env_steps_per_s_learning']:.0f} env steps/s while learning "
              f"({m['env_steps_per_s_learning'] / base:.2f}x {list(med)[0]}; medians)")
    return {"steps": steps, "rounds": rows, "median": med}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="replay,schedule")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lags", default="0,15", help="per: the priority_lag values compared")
    args = ap.parse_args()
    only = set(args.only.split(","))
    report = {"machine": {"cpus": os.cpu_count()}, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": "python " + " ".join(sys.argv)}
    if "replay" in only:
        print(f"replay insert / prioritised sample, {args.calls} calls per point")
        report["replay"] = bench_replay(args.calls)
    if "schedule" in only:
        print(f"DQN CartPole-v1, {args.steps} env steps, local vs ray schedule")
        report["schedule"] = bench_schedule(args.steps, args.rounds)
    if "per" in only:
        print(f"DQN CartPole-v1, prioritised replay, {args.steps} env steps, ray schedule, priority_lag {args.lags}")
        report["per"] = bench_per(args.steps, args.rounds, [int(x) for x in args.lags.split(",")])
    RESULTS.mkdir(exist_ok=True)
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    path = result_path("bench_ray", [s for s in ("replay", "schedule", "per") if s in only])
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **report}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
