"""Tabular Q-learning updates/s vs workers (SwiftRL-style scaling) with NumPy baselines.

    .venv/bin/python benchmarks/tabular_scaling.py                 # Taxi-v3, 1M and 10M, 1..ncpu workers
    .venv/bin/python benchmarks/tabular_scaling.py --quick         # smoke run (100k transitions)

Writes benchmarks/results/tabular_scaling_<env>_<date>_<machine>_<commit>.json and the .png beside it.

Per configuration (size N, dtype, backend, W workers) it trains offline for --rounds passes
over one generated dataset and reports updates/s = N * rounds / wall time of the rounds
(table copies + kernels + merges; data generation excluded). Repeats are interleaved over
W so every worker count sees the same background load; the JSON keeps every repeat. Rates
are the best repeat (the least disturbed one; the median is kept too); the speedup over one
worker is the median over repeats of (W-worker rate / 1-worker rate of the run just before),
which cancels the slow drift of a shared VM's speed. Because the
machine may be shared, the script also records how busy the other processes kept the CPUs
(from /proc/stat) during the run.

Baselines (single thread): the same sequential algorithm as a Python loop over NumPy arrays
(on the first --loop-transitions transitions), and a vectorised NumPy batch-update variant
(different semantics: see hetrl/tabular/baseline.py) on the full data.

Two more studies write their own JSON next to it (docs/tabular.md quotes them):
    --study learning   greedy return/success from 1M random transitions, every env/algo/dtype
                       and seeds 0-2 (tabular_scaling_learning_...json)
    --study merge      mean vs weighted vs sum merges against Q* from value iteration, for
                       1..64 workers and 1 or 10 rounds (tabular_scaling_merge_...json)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetrl.tabular.baseline import qlearning_numpy_batched, qlearning_numpy_loop  # noqa: E402
from hetrl.tabular.cli import count  # noqa: E402
from hetrl.tabular.dataset import generate  # noqa: E402
from hetrl.tabular.envs import env_info  # noqa: E402
from hetrl.tabular.evaluate import evaluate  # noqa: E402
from hetrl.tabular.fixedpoint import choose_frac_bits  # noqa: E402
from hetrl.tabular.parallel import schedule, train_offline  # noqa: E402

TARGET_PER_WORKER = 50e6
TARGET_SPEEDUP_1_2 = 1.8


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, or (0, 0) where /proc/stat is missing."""
    try:
        with open("/proc/stat") as fh:
            vals = [int(x) for x in fh.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


def own_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def wait_quiet(max_s: float, threshold: float = 0.1, window: float = 0.3) -> float:
    """Sleep until the machine's busy CPU (all processes) over `window` s is < threshold cores.

    Returns the seconds waited (max_s if it never got quiet). The benchmark measures what the
    cores can do, so on a shared machine it waits for the other jobs' gaps; every repeat
    also records the load it actually saw (other_cores)."""
    hz = os.sysconf("SC_CLK_TCK")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        b0, _ = cpu_jiffies()
        time.sleep(window)
        b1, _ = cpu_jiffies()
        if (b1 - b0) / hz / window < threshold:
            return time.perf_counter() - t0
        time.sleep(0.2)
    return max_s


def run_config(data, algo, dtype, backend, W, rounds, alpha, gamma, bits):
    hz = os.sysconf("SC_CLK_TCK")
    j0, _ = cpu_jiffies()
    c0, t0 = own_cpu_s(), time.perf_counter()
    q, st = train_offline(data, algo, dtype, W, rounds, schedule(alpha, alpha / 10, rounds), gamma,
                          "mean", backend, schedule(0.3, 0.0, rounds, "linear"), "policy", 0, bits)
    wall = time.perf_counter() - t0
    own = own_cpu_s() - c0
    j1, _ = cpu_jiffies()
    return q, {
        "other_cores": max(0.0, ((j1 - j0) / hz - own) / wall),  # load of other processes (10 ms ticks)
        "updates": st.updates, "wall_s": st.wall_s, "updates_per_s": st.updates / st.wall_s,
        "setup_s": st.setup_s,  # int32 reward conversion, once per call before the rounds (not in wall_s)
        "kernel_s": st.kernel_s, "merge_s": st.merge_s,
        "worker_kernel_updates_per_s": [u / t for u, t in zip(st.worker_updates, st.worker_kernel_s)],
        # updates per second of CPU time each worker thread actually got: what a worker does
        # while it runs, whatever the other processes take from the machine
        "worker_cpu_updates_per_s": [u / c if c > 0 else None for u, c in zip(st.worker_updates, st.worker_cpu_s)],
        # share of the kernel time during which >= 2 workers ran at once (GIL released)
        "overlap_fraction": st.overlap_s / st.kernel_s if W > 1 and st.kernel_s > 0 else None,
        # process CPU / wall of the whole call (incl. the set-up before the rounds, e.g. the
        # int32 reward conversion, which the W threads share): ~W when the W threads ran in
        # parallel, lower under other load
        "cpu_per_wall": own / wall,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="Taxi-v3")
    ap.add_argument("--algo", default="qlearning", choices=("qlearning", "sarsa"))
    ap.add_argument("--sizes", default="1M,10M", help="comma list of dataset sizes")
    ap.add_argument("--workers", default=None, help="comma list (default 1..cpu_count)")
    ap.add_argument("--dtypes", default="float32,int32")
    ap.add_argument("--backends", default="threads,prange")
    ap.add_argument("--rounds", type=int, default=10, help="passes over the data per measurement")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--loop-transitions", type=count, default=200_000, help="NumPy-loop baseline size")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--name", default=None, help="file stem in --out (default: the results' naming scheme)")
    ap.add_argument("--quick", action="store_true", help="100k transitions, 2 repeats (smoke test)")
    ap.add_argument("--study", choices=("scaling", "learning", "merge"), default="scaling")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each measured run wait up to S s for the other processes to leave the CPUs idle")
    ap.add_argument("--max-other", type=float, default=None, metavar="C",
                    help="redo a repeat (all worker counts, up to 3 more times) when other processes held more "
                         "than C cores during one of its runs; the JSON keeps the discarded runs")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.study == "learning":
        return learning_study(args, argv)
    if args.study == "merge":
        return merge_study(args, argv)

    sizes = [100_000] if args.quick else [count(x) for x in args.sizes.split(",")]
    repeats = 2 if args.quick else args.repeats
    ncpu = os.cpu_count() or 1
    workers = [int(x) for x in args.workers.split(",")] if args.workers else list(range(1, ncpu + 1))
    dtypes = args.dtypes.split(",")
    backends = args.backends.split(",") if args.algo == "qlearning" else ["threads"]
    alpha, gamma = 0.5, 0.99
    info = env_info(args.env)
    command = "python benchmarks/tabular_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])

    busy0, tot0 = cpu_jiffies()
    own0, wall0 = own_cpu_s(), time.perf_counter()
    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = []
    baselines = []
    for n in sizes:
        t = time.perf_counter()
        data = generate(info, n, seed=0)
        gen_s = time.perf_counter() - t
        print(f"== {args.env}: {n:,} random transitions generated in {gen_s:.2f} s", flush=True)
        bits = choose_frac_bits(data.reward_abs_max, gamma)
        for dtype in dtypes:
            for backend in backends:
                runs = {W: [] for W in workers}
                tables = {}
                # warm-up (compile / load cache) outside the measurements
                run_config(data.slice(0, min(n, 10_000)), args.algo, dtype, backend, 1, 1, alpha, gamma, bits)
                discarded = []
                for rep in range(repeats):
                    tries = 4 if args.max_other is not None else 1
                    for attempt in range(tries):
                        ms = {}
                        for W in workers:  # interleaved: every W sees the same background load
                            waited = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else 0.0
                            tables[W], ms[W] = run_config(data, args.algo, dtype, backend, W, args.rounds, alpha,
                                                          gamma, bits if dtype == "int32" else None)
                            ms[W]["waited_s"] = waited
                        busy = args.max_other is not None and max(m["other_cores"] for m in ms.values()) > args.max_other
                        if not busy or attempt == tries - 1:
                            break
                        discarded.append(ms)
                    for W in workers:
                        runs[W].append(ms[W])
                for W in workers:
                    ups = [m["updates_per_s"] for m in runs[W]]
                    best = max(ups)
                    best_run = runs[W][ups.index(best)]
                    ev = evaluate(info, tables[W], 100)
                    cpu_rates = [statistics.mean(x for x in m["worker_cpu_updates_per_s"] if x) for m in runs[W]
                                 if any(m["worker_cpu_updates_per_s"])] if backend == "threads" else []
                    overlaps = [m["overlap_fraction"] for m in runs[W] if m["overlap_fraction"] is not None]
                    row = {
                        "cpu_time_updates_per_s_per_worker": statistics.median(cpu_rates) if cpu_rates else None,
                        "overlap_fraction_max": max(overlaps) if overlaps else None,
                        "env": args.env, "env_id": info.env_id, "algo": args.algo, "transitions": n,
                        "rounds": args.rounds, "dtype": dtype, "backend": backend, "workers": W,
                        "updates_per_s": best, "updates_per_s_median": statistics.median(ups),
                        "updates_per_s_per_worker": best / W,
                        "cpu_per_wall": best_run["cpu_per_wall"], "other_cores": best_run["other_cores"],
                        "eval_return_mean": ev["eval_return_mean"], "repeats": runs[W],
                        "discarded_busy_repeats": [d[W] for d in discarded],
                    }
                    results.append(row)
                base = {r["workers"]: r["updates_per_s"] for r in results
                        if (r["transitions"], r["dtype"], r["backend"]) == (n, dtype, backend)}
                one = next((r for r in results if (r["transitions"], r["dtype"], r["backend"], r["workers"])
                            == (n, dtype, backend, 1)), None)
                for r in results:
                    if (r["transitions"], r["dtype"], r["backend"]) == (n, dtype, backend) and 1 in base:
                        # repeat i of W workers ran right after repeat i of 1 worker: the median of
                        # these paired ratios is robust to the machine's drifting speed (shared VM)
                        paired = [b["updates_per_s"] / a["updates_per_s"] for a, b in zip(one["repeats"], r["repeats"])]
                        r["speedup_vs_1"] = statistics.median(paired)
                        r["speedup_best_vs_best"] = r["updates_per_s"] / base[1]
                        r["speedup_median_vs_median"] = r["updates_per_s_median"] / one["updates_per_s_median"]
                        r["scaling_efficiency"] = r["speedup_vs_1"] / r["workers"]
                        c1 = next((x["cpu_time_updates_per_s_per_worker"] for x in results
                                   if (x["transitions"], x["dtype"], x["backend"], x["workers"]) == (n, dtype, backend, 1)), None)
                        if c1 and r["cpu_time_updates_per_s_per_worker"]:
                            # what W workers would do on W free cores: W x (their CPU-time rate) / 1 worker's
                            r["cpu_time_speedup_vs_1"] = r["workers"] * r["cpu_time_updates_per_s_per_worker"] / c1
                        print(f"  {dtype:7s} {backend:7s} W={r['workers']}: {r['updates_per_s'] / 1e6:7.1f} M/s total "
                              f"(median {r['updates_per_s_median'] / 1e6:6.1f}), {r['updates_per_s_per_worker'] / 1e6:6.1f} "
                              f"M/s/worker, speedup {r['speedup_vs_1']:.2f}x (paired median; best/best "
                              f"{r['speedup_best_vs_best']:.2f}x), cpu/wall {r['cpu_per_wall']:.2f}, "
                              f"other load {r['other_cores']:.2f}, "
                              + (f"cpu-time rate {r['cpu_time_updates_per_s_per_worker'] / 1e6:.1f} M/s/worker "
                                 f"(x{r.get('cpu_time_speedup_vs_1', 0):.2f}), overlap {r['overlap_fraction_max'] or 0:.2f}, "
                                 if r["cpu_time_updates_per_s_per_worker"] else "")
                              + f"greedy return {r['eval_return_mean']:.2f}", flush=True)
        # NumPy baselines (float64 tables, single thread)
        if args.algo == "qlearning":
            m = min(n, args.loop_transitions)
            best = 0.0
            for _ in range(2):
                q = np.zeros((data.n_states, data.n_actions))
                t = time.perf_counter()
                qlearning_numpy_loop(q, data.s[:m], data.a[:m], data.r[:m], data.s2[:m], data.done[:m], alpha, gamma)
                best = max(best, m / (time.perf_counter() - t))
            baselines.append({"name": "numpy-loop", "transitions": n, "measured_on": m, "updates_per_s": best,
                              "semantics": "same sequential Q-learning, Python loop over NumPy arrays"})
            best = 0.0
            for _ in range(2):
                q = np.zeros((data.n_states, data.n_actions))
                t = time.perf_counter()
                for _r in range(args.rounds):
                    qlearning_numpy_batched(q, data.s, data.a, data.r, data.s2, data.done, alpha, gamma)
                best = max(best, n * args.rounds / (time.perf_counter() - t))
            ev = evaluate(info, q, 100)
            baselines.append({"name": "numpy-batched", "transitions": n, "measured_on": n, "updates_per_s": best,
                              "eval_return_mean": ev["eval_return_mean"],
                              "semantics": "vectorised synchronous batch updates (65536/chunk): not the same algorithm"})
            for b in baselines[-2:]:
                print(f"  baseline {b['name']:13s}: {b['updates_per_s'] / 1e6:7.2f} M/s", flush=True)
        del data

    busy1, tot1 = cpu_jiffies()
    own = own_cpu_s() - own0
    wall = time.perf_counter() - wall0
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    machine_busy_cores = ((busy1 - busy0) / hz) / wall if tot1 > tot0 else None
    other = (machine_busy_cores - own / wall) if machine_busy_cores is not None else None

    def pick(n, dtype, backend, W):
        for r in results:
            if (r["transitions"], r["dtype"], r["backend"], r["workers"]) == (n, dtype, backend, W):
                return r
        return None

    checks = []
    for n in sizes:
        for dtype in dtypes:
            r1, r2 = pick(n, dtype, "threads", 1), pick(n, dtype, "threads", 2)
            if r1 is None:
                continue
            c = {"transitions": n, "dtype": dtype,
                 "per_worker_1": r1["updates_per_s_per_worker"],
                 "per_worker_2": r2["updates_per_s_per_worker"] if r2 else None,
                 "speedup_1_to_2": r2["speedup_vs_1"] if r2 else None}
            c["per_worker_target_met"] = min(x for x in (c["per_worker_1"], c["per_worker_2"]) if x) >= TARGET_PER_WORKER
            c["speedup_target_met"] = (c["speedup_1_to_2"] or 0) >= TARGET_SPEEDUP_1_2 if r2 else None
            c["cpu_time_per_worker_1"] = r1.get("cpu_time_updates_per_s_per_worker")
            c["cpu_time_per_worker_2"] = r2.get("cpu_time_updates_per_s_per_worker") if r2 else None
            c["cpu_time_speedup_1_to_2"] = r2.get("cpu_time_speedup_vs_1") if r2 else None
            c["overlap_fraction_2"] = r2.get("overlap_fraction_max") if r2 else None
            checks.append(c)

    report = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": ncpu, "platform": platform.platform(), "processor": platform.processor(),
                    "python": platform.python_version(), "numpy": np.__version__,
                    "numba": __import__("numba").__version__},
        "env": args.env, "env_id": info.env_id, "algo": args.algo, "rounds": args.rounds, "repeats": repeats,
        "max_other": args.max_other,
        "targets": {"updates_per_s_per_worker": TARGET_PER_WORKER, "speedup_1_to_2": TARGET_SPEEDUP_1_2},
        "load": {"loadavg_start": load0, "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
                 "machine_busy_cores": machine_busy_cores, "this_process_cores": own / wall,
                 "other_processes_cores": other, "wall_s": wall},
        "checks": checks, "results": results, "baselines": baselines,
    }
    os.makedirs(args.out, exist_ok=True)
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    args.name = args.name or result_path("tabular_scaling", args.env, folder=args.out).stem
    jpath = os.path.join(args.out, args.name + ".json")
    with open(jpath, "w") as fh:
        json.dump(report, fh, indent=2)
        fh.write("\n")
    ppath = os.path.join(args.out, args.name + ".png")
    plot(report, ppath)
    print(f"other processes kept {other if other is not None else float('nan'):.2f} cores busy on average")
    for c in checks:
        print(f"check N={c['transitions']:,} {c['dtype']}: per worker {c['per_worker_1'] / 1e6:.1f} (W=1) / "
              f"{(c['per_worker_2'] or 0) / 1e6:.1f} (W=2) M/s, speedup 1->2 {c['speedup_1_to_2'] or 0:.2f}x; "
              f"cpu-time per worker {(c['cpu_time_per_worker_1'] or 0) / 1e6:.1f} / "
              f"{(c['cpu_time_per_worker_2'] or 0) / 1e6:.1f} M/s (x{c['cpu_time_speedup_1_to_2'] or 0:.2f}), "
              f"overlap {c['overlap_fraction_2'] or 0:.2f}")
    print(f"wrote {jpath} and {ppath}")
    return 0


def _name(args, study: str) -> str:
    """--name, else the results' naming scheme: tabular_scaling_<study>_<date>_<machine>_<commit>.json."""
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    return args.name + ".json" if args.name else result_path("tabular_scaling", study, folder=args.out).name


def _write(args, name: str, report: dict) -> str:
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, name)
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2)
        fh.write("\n")
    print(f"wrote {path}")
    return path


def learning_study(args, argv) -> int:
    """Issue targets from 1M random transitions: every env x algo x dtype, workers 2, seeds 0-2."""
    from hetrl.tabular import train_tabular

    envs = ["CliffWalking-v0", "Taxi-v3", "FrozenLake-v1"]
    rows = []
    for env in envs:
        for seed in (0, 1, 2):
            data = generate(env_info(env), 100_000 if args.quick else 1_000_000, seed=seed)
            for algo in ("qlearning", "sarsa"):
                for dtype in ("float32", "int32"):
                    r = train_tabular(algo, env, workers=2, data=data, dtype=dtype, seed=seed,
                                      measure_scaling=False).result
                    keep = ("env", "env_id", "algo", "dtype", "workers", "transitions", "rounds", "alpha",
                            "alpha_final", "gamma", "epsilon", "sarsa_next", "seed", "eval_episodes",
                            "eval_return_mean", "success_rate", "updates_per_s")
                    rows.append({k: r[k] for k in keep})
                    print(f"{env:16s} {algo:9s} {dtype:7s} seed {seed}: return {r['eval_return_mean']:8.3f} "
                          f"success {r['success_rate']:.3f} ({r['eval_episodes']} episodes)", flush=True)
    cmd = "python benchmarks/tabular_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    _write(args, _name(args, "learning"), {"command": cmd, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                           "results": rows})
    return 0


def q_star(info, gamma: float, tol: float = 1e-9) -> np.ndarray:
    """Optimal Q by value iteration on the env's transition table."""
    m = info.model
    p = np.diff(np.concatenate([np.zeros(m.cum_p.shape[:2] + (1,)), m.cum_p], axis=2), axis=2)
    p = p * (np.arange(p.shape[2])[None, None, :] < m.n_out[:, :, None])
    q = np.zeros(m.n_out.shape)
    for _ in range(100_000):
        new = (p * (m.reward + gamma * (1 - m.term) * q.max(axis=1)[m.next_s])).sum(axis=2)
        if np.abs(new - q).max() < tol:
            return new
        q = new
    return q


def merge_study(args, argv) -> int:
    """Merge strategies vs worker count: mean |Q - Q*| over the pairs in the data, greedy return."""
    envs = ["Taxi-v3", "FrozenLake-v1", "CliffWalking-v0"]
    rows = []
    gamma = 0.99
    for env in envs:
        info = env_info(env)
        data = generate(info, 100_000 if args.quick else 1_000_000, seed=0)
        qs = q_star(info, gamma)
        seen = np.bincount(data.s.astype(np.int64) * info.n_actions + data.a,
                           minlength=info.n_states * info.n_actions).reshape(qs.shape) > 0
        episodes = 1000 if env.startswith("FrozenLake") else 100
        for rounds in (1, 10):
            for W in (1, 4, 16, 64):
                for merge in ("mean", "weighted", "sum"):
                    q, _ = train_offline(data, "qlearning", "float32", W, rounds,
                                         schedule(0.5, 0.05 if rounds > 1 else None, rounds), gamma, merge)
                    with np.errstate(all="ignore"):
                        err = float(np.abs(q.astype(np.float64) - qs)[seen].mean())
                    ev = evaluate(info, q, episodes)
                    rows.append({"env": env, "rounds": rounds, "workers": W, "merge": merge,
                                 "q_error_mean": err, "eval_return_mean": ev["eval_return_mean"],
                                 "success_rate": ev["success_rate"]})
                print(f"{env:16s} R={rounds:2d} W={W:2d} " + " | ".join(
                    f"{r['merge']}: |Q-Q*| {r['q_error_mean']:9.3g} return {r['eval_return_mean']:8.2f}"
                    for r in rows[-3:]), flush=True)
    cmd = "python benchmarks/tabular_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    _write(args, _name(args, "merge"), {"command": cmd, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                        "alpha": "0.5 (-> 0.05 over 10 rounds)", "gamma": gamma,
                                        "transitions": len(data), "results": rows})
    return 0


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 5))
    markers = {"float32": "o", "int32": "s"}
    styles = {"threads": "-", "prange": ":"}
    sizes = sorted({r["transitions"] for r in report["results"]})
    colors = dict(zip(sizes, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for n in sizes:
        for dtype in sorted({r["dtype"] for r in report["results"]}):
            for backend in sorted({r["backend"] for r in report["results"]}):
                rows = sorted((r for r in report["results"] if (r["transitions"], r["dtype"], r["backend"]) == (n, dtype, backend)),
                              key=lambda r: r["workers"])
                if not rows:
                    continue
                W = [r["workers"] for r in rows]
                lab = f"{n / 1e6:g}M {dtype} {backend}"
                ax1.plot(W, [r["updates_per_s"] / 1e6 for r in rows], styles[backend], marker=markers[dtype],
                         color=colors[n], label=lab)
                ax2.plot(W, [r["updates_per_s_per_worker"] / 1e6 for r in rows], styles[backend],
                         marker=markers[dtype], color=colors[n], label=lab)
                ax3.plot(W, [r.get("speedup_vs_1", float("nan")) for r in rows], styles[backend],
                         marker=markers[dtype], color=colors[n], label=lab)
                if backend == "threads" and all(r.get("cpu_time_updates_per_s_per_worker") for r in rows):
                    ax2.plot(W, [r["cpu_time_updates_per_s_per_worker"] / 1e6 for r in rows], "--",
                             marker=markers[dtype], color=colors[n], alpha=0.5, label=lab + " per CPU-second")
                if backend == "threads" and dtype == "float32" and rows[0]["workers"] == 1:
                    ax1.plot(W, [rows[0]["updates_per_s"] / 1e6 * w for w in W], "--", color="grey", lw=0.8,
                             label=f"{n / 1e6:g}M linear" if n == sizes[0] else None)
    for b in report["baselines"]:
        if b["transitions"] == sizes[-1]:
            ax1.axhline(b["updates_per_s"] / 1e6, color="black" if b["name"] == "numpy-loop" else "brown",
                        lw=0.8, ls="-." , label=f"{b['name']} (1 thread)")
    ax2.axhline(report["targets"]["updates_per_s_per_worker"] / 1e6, color="red", lw=0.8, ls="--", label="target 50M/s/worker")
    wk = sorted({r["workers"] for r in report["results"]})
    ax3.plot(wk, wk, "--", color="grey", lw=0.8, label="linear")
    ax3.axhline(report["targets"]["speedup_1_to_2"], color="red", lw=0.8, ls="--", label="target 1.8x at 2")
    ax3.set_xlabel("workers")
    ax3.set_ylabel("speedup vs 1 worker (median of paired repeats)")
    ax3.set_xticks(wk)
    ax3.grid(alpha=0.3)
    ax3.legend(fontsize=6, loc="upper left", ncol=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("workers")
    ax1.set_ylabel("updates/s total (M, log)")
    ax2.set_xlabel("workers")
    ax2.set_ylabel("updates/s per worker (M)")
    ax2.set_ylim(bottom=0)
    wk = sorted({r["workers"] for r in report["results"]})
    for ax in (ax1, ax2):
        ax.set_xticks(wk)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=6, loc="center left", ncol=2)
    ax2.legend(fontsize=6, loc="lower left", ncol=2)
    other = report["load"]["other_processes_cores"]
    fig.suptitle(f"{report['algo']} on {report['env_id']}, {report['rounds']} passes, rates: best of {report['repeats']}; "
                 f"{report['machine']['cpus']} CPUs" + (f", other load {other:.2f} cores" if other is not None else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
