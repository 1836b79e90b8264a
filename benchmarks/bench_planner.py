"""The planner's predictions against measured runs: predicted vs measured env steps/s.

    python benchmarks/bench_planner.py [--workloads dqn-cartpole,ddpg-pendulum,dqn-slowcartpole]
                                       [--max-runs 12] [--seconds 8] [--repeats 2]
                                       [--refresh] [--all]
    python benchmarks/bench_planner.py --repredict benchmarks/results/bench_planner.json

For each workload it profiles the machine (or takes the cached table), asks the planner for
the auto plan, then runs the auto plan and a spread of the other runnable candidate plans one
by one (short runs, in this process, one after the other) and measures steady-state env
steps/s: the run's first part (learning_starts, actor start-up, 2 s for the replay ratio to
settle) is left out, then `--seconds` are timed, as gradient steps/s / replay ratio (see
measure_run). The machines here are shared: around each run a probe
(hetrl/planner/load.py) measures how many cores our processes get, and the plan is also
predicted for that many cores. It prints predicted vs measured per plan and writes
benchmarks/results/bench_planner.json and benchmarks/results/bench_planner.png.

Workloads (presets of hetrl/presets.yaml, learning_starts lowered to 500 so short runs reach
the steady state):
* dqn-cartpole:      DQN on CartPole-v1 (replay ratio 0.5, batch 64, 256x256)
* ddpg-pendulum:     DDPG on Pendulum-v1 (replay ratio 1, batch 256, 400x300)
* dqn-slowcartpole:  DQN on SlowCartPole-v1 = CartPole-v1 whose step burns 1 ms of CPU (a busy
                     loop, not a sleep: a slow simulator occupies its core), replay ratio 0.125
                     (train_freq 256, gradient_steps 32): the env, not the learner, is the cost.

Candidates with schedule=local run when this build's `make_schedule` accepts schedule="local";
otherwise they are skipped with a note. Each plan is run (--all: every candidate, else
--max-runs of them spread over the predicted range, the auto plan always included), `--repeats`
times, the order flipped every repeat (the figure is the median of a plan's repeats). The
machines here are shared: read the ranking and the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BURN_S = 1e-3


class SlowCartPole(gym.Wrapper):
    """CartPole-v1 whose every step costs BURN_S seconds of CPU (busy loop)."""

    def __init__(self, burn_s: float = BURN_S):
        super().__init__(gym.make("CartPole-v1"))
        self.burn_s = burn_s

    def step(self, action):
        end = time.perf_counter() + self.burn_s
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


if "SlowCartPole-v1" not in gym.registry:
    gym.register("SlowCartPole-v1", entry_point="bench_planner:SlowCartPole")

WORKLOADS = {
    "dqn-cartpole": ("dqn", "CartPole-v1", {"learning_starts": 500}),
    "ddpg-pendulum": ("ddpg", "Pendulum-v1", {"learning_starts": 500}),
    "dqn-slowcartpole": ("dqn", "bench_planner:SlowCartPole-v1",
                         {"learning_starts": 500, "train_freq": 256, "gradient_steps": 32, "batch_size": 64,
                          "net_arch": [256, 256], "buffer_size": 100_000, "target_update_interval": 10}),
}


def local_available() -> tuple[bool, str]:
    from hetrl.planner.search import runtime_schedules

    if "local" not in runtime_schedules():
        return False, "Config does not accept schedule=local yet"
    try:
        from hetrl.runtime.local import LocalSchedule  # noqa: F401
    except ImportError as e:
        return False, f"hetrl.runtime.local cannot be imported ({e})"
    return True, ""


def measure_run(cfg, seconds: float, warm_s: float = 2.0) -> dict:
    """Run cfg for `seconds` of steady state: timing starts once learning has started and
    `warm_s` more seconds have passed (actor start-up, the rate limiter settling), and stops
    after `seconds` (or at cfg.steps).

    The figure is gradient steps/s / replay ratio: the env steps the learner consumed at the
    ratio the rate limiter holds. Gradient steps come one at a time, env steps in chunks (up
    to actors x chunk at once), which a window of a few seconds would miscount; both agree
    over a long run (the achieved ratio is reported next to it)."""
    from hetrl.runtime import make_schedule

    t_build = time.perf_counter()
    s = make_schedule(cfg, cfg.env)
    build_s = time.perf_counter() - t_build
    t0 = time.perf_counter()
    t_learn = t_warm = steps_warm = grads_warm = None
    try:
        while not s.done():
            s.phase()
            now = time.perf_counter()
            if t_learn is None and s.c.gradient_steps > 0:
                t_learn = now
            if t_warm is None and t_learn is not None and now - t_learn >= warm_s:
                t_warm, steps_warm, grads_warm = now, s.c.env_steps, s.c.gradient_steps
            if t_warm is not None and now - t_warm >= seconds:
                break
        t_end = time.perf_counter()
        steps, grads = s.c.env_steps, s.c.gradient_steps
    finally:
        if hasattr(s, "close"):
            s.close()
    if t_warm is None or t_end - t_warm <= 0 or steps <= steps_warm or grads <= grads_warm:
        raise RuntimeError("run too short to time its steady state")
    window = t_end - t_warm
    return {"env_steps_per_s": (grads - grads_warm) / cfg.replay_ratio / window,
            "env_steps_per_s_counted": (steps - steps_warm) / window,
            "gradient_steps_per_s": (grads - grads_warm) / window,
            "replay_ratio": (grads - grads_warm) / (steps - steps_warm),
            "timed_s": window, "total_s": t_end - t0, "build_s": build_s, "env_steps": steps}


def pick(preds: list, auto, max_runs: int, run_all: bool) -> list:
    """The auto plan plus a spread over the predicted range (by rank)."""
    ranked = sorted(preds, key=lambda p: -p.env_steps_per_s)
    if run_all or len(ranked) <= max_runs:
        chosen = ranked
    else:
        idx = sorted({round(i * (len(ranked) - 1) / (max_runs - 2)) for i in range(max_runs - 1)})
        chosen = [ranked[i] for i in idx]
    if auto.plan not in [p.plan for p in chosen]:
        chosen = [auto] + chosen
    return chosen


def spearman(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3:
        return float("nan")

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = rank
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den if den else float("nan")


def summarize(runs: list[dict]) -> dict:
    """Median errors and rank correlations of the measured runs."""
    ok = [r for r in runs if "measured" in r]
    pr = [r["predicted"]["env_steps_per_s"] for r in ok]
    pl = [r["predicted_under_load"]["env_steps_per_s"] for r in ok]
    me = [r["measured"]["env_steps_per_s"] for r in ok]
    best = max(me) if me else float("nan")
    auto_row = next((r for r in ok if r["auto"]), None)
    return {
        "runs": len(runs), "failed": len(runs) - len(ok),
        "median_abs_log_error": statistics.median(abs(math.log(m / p)) for m, p in zip(me, pr)) if ok else None,
        "median_ratio_measured_over_predicted": statistics.median(m / p for m, p in zip(me, pr)) if ok else None,
        "spearman_predicted_vs_measured": spearman(pr, me),
        "median_abs_log_error_under_load": statistics.median(abs(math.log(m / p)) for m, p in zip(me, pl)) if ok else None,
        "median_ratio_under_load": statistics.median(m / p for m, p in zip(me, pl)) if ok else None,
        "spearman_under_load": spearman(pl, me),
        "median_cores_available": statistics.median(r["cores_available"] for r in ok) if ok else None,
        "auto_measured": auto_row["measured"]["env_steps_per_s"] if auto_row else None,
        "best_measured": best, "best_measured_plan": ok[me.index(best)]["describe"] if ok else None,
        "auto_over_best_measured": (auto_row["measured"]["env_steps_per_s"] / best) if auto_row and ok else None,
    }


def bench_workload(name: str, args, local_ok: bool, local_note: str) -> dict:
    from hetrl.config import make_config
    from hetrl.planner import Workload, plan, predict
    from hetrl.planner.profile import load_or_profile
    from hetrl.planner.load import available_cores
    from hetrl.planner.search import candidates

    algo, env, over = WORKLOADS[name]
    cfg = make_config(algo, env, over)
    t0 = time.perf_counter()
    table = load_or_profile(cfg, refresh=args.refresh,
                            progress=lambda m: print(f"  [{name}] profile: {m}", file=sys.stderr) if args.verbose else None)
    profile_s = table.data.get("profile_s") if not table.from_cache else None
    print(f"[{name}] profile {'cached' if table.from_cache else f'measured in {time.perf_counter() - t0:.1f} s'}: "
          f"{table.path}", flush=True)
    schedules = ("inline", "local") if local_ok else ("inline",)
    result = plan(cfg, profile=table, schedules=schedules)
    work = Workload.from_config(cfg)
    preds = [predict(p, table, work) for p in candidates(table, work, table.cores, {}, schedules)]
    print(f"[{name}] auto plan: {result.plan.describe()}: predicted {result.predicted_env_steps_per_s:,.0f} "
          f"env steps/s; {result.bottleneck}", flush=True)
    chosen = pick(preds, result.prediction, args.max_runs, args.all)
    rows = []
    for pred in chosen:
        p = pred.plan
        # enough steps for learning_starts, the warm-up and the timed seconds at 3x the prediction
        steps = int(min(500_000, cfg.learning_starts + cfg.batch_size + 3 * pred.env_steps_per_s * (args.seconds + 2)))
        rows.append({"plan": p.to_json(), "describe": p.describe(), "auto": p == result.plan,
                     "predicted": pred.to_json(), "steps": steps, "repeats": [], "_pred": pred})
    for rep in range(args.repeats):  # every plan once per repeat; the order flips every repeat
        for row in (rows if rep % 2 == 0 else rows[::-1]):
            p, pred = row["_pred"].plan, row["_pred"]
            run_cfg = make_config(algo, env, {**over, **p.settings(), "steps": row["steps"], "eval_episodes": 0,
                                              "log_interval": 10 ** 9})
            try:
                avail = available_cores()
                m = measure_run(run_cfg, args.seconds)
                m["cores_available"] = (avail + available_cores()) / 2   # before and after the run
                row["repeats"].append(m)
            except Exception as e:  # noqa: BLE001 - report and go on with the other plans
                row["error"] = f"{type(e).__name__}: {e}"
            last = row["repeats"][-1]["env_steps_per_s"] if row["repeats"] and "error" not in row else None
            print(f"  {'*' if row['auto'] else ' '} {p.describe():<52} predicted {pred.env_steps_per_s:>7,.0f}  "
                  f"measured {'-' if last is None else f'{last:>7,.0f}'} (repeat {rep + 1})"
                  + (f"  {row['error']}" if "error" in row else ""), flush=True)
    runs = []
    for row in rows:
        pred = row.pop("_pred")
        reps = row["repeats"]
        if reps:
            med = lambda key: statistics.median(r[key] for r in reps)  # noqa: E731
            row["measured"] = {k: med(k) for k in reps[0] if isinstance(reps[0][k], (int, float))}
            avail = row["measured"].pop("cores_available")
            row["cores_available"], row["load_avg"] = avail, os.getloadavg()[0]
            loaded = predict(pred.plan, table, work, cores=avail)
            row["predicted_under_load"] = loaded.to_json()
            row["ratio"] = row["measured"]["env_steps_per_s"] / pred.env_steps_per_s
            row["ratio_under_load"] = row["measured"]["env_steps_per_s"] / loaded.env_steps_per_s
            print(f"  {'*' if row['auto'] else ' '} {pred.plan.describe():<52} predicted {pred.env_steps_per_s:>7,.0f}  "
                  f"measured {row['measured']['env_steps_per_s']:>7,.0f} (median of {len(reps)})  ratio {row['ratio']:.2f}",
                  flush=True)
        runs.append(row)
    summary = summarize(runs)
    return {"workload": name, "algo": algo, "env": env, "overrides": over, "replay_ratio": cfg.replay_ratio,
            "cores": table.cores,
            "profile_path": str(table.path), "profile_from_cache": table.from_cache, "profile_s": profile_s,
            "auto_plan": result.to_json(), "local_note": None if local_ok else local_note,
            "candidates": len(preds), "runs": runs, "summary": summary}


def repredict(doc: dict) -> dict:
    """Price the stored runs again with the current model and profiles (no run is repeated)."""
    from hetrl.config import make_config
    from hetrl.planner import Plan, Workload, plan, predict
    from hetrl.planner.profile import ProfileTable

    for res in doc["workloads"]:
        cfg = make_config(res["algo"], res["env"], res["overrides"])
        table = ProfileTable.load(Path(res["profile_path"]))
        work = Workload.from_config(cfg)
        schedules = ("inline", "local") if doc.get("local_schedule", True) else ("inline",)
        auto = plan(cfg, profile=table, schedules=schedules)
        res["auto_plan"] = auto.to_json()
        for row in res["runs"]:
            p = Plan(**row["plan"])
            row["auto"] = p == auto.plan
            row["predicted"] = predict(p, table, work).to_json()
            if "measured" in row:
                loaded = predict(p, table, work, cores=row["cores_available"])
                row["predicted_under_load"] = loaded.to_json()
                row["ratio"] = row["measured"]["env_steps_per_s"] / row["predicted"]["env_steps_per_s"]
                row["ratio_under_load"] = row["measured"]["env_steps_per_s"] / loaded.env_steps_per_s
        res["summary"] = summarize(res["runs"])
    doc["repredicted"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    return doc


def report(results: list[dict]) -> None:
    fmt = lambda v, f: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, f)  # noqa: E731
    print("\n(predictions for the whole machine | for the cores a probe found ours around each run)")
    print("workload            runs  auto measured  best measured  auto/best  meas/pred  rank corr  meas/pred@avail"
          "  rank corr@avail  cores ours")
    for r in results:
        s = r["summary"]
        print(f"{r['workload']:<19} {s['runs']:>4}  {fmt(s['auto_measured'], '>13,.0f')}  {fmt(s['best_measured'], '>13,.0f')}"
              f"  {fmt(s['auto_over_best_measured'], '>9.2f')}  {fmt(s['median_ratio_measured_over_predicted'], '>9.2f')}"
              f"  {fmt(s['spearman_predicted_vs_measured'], '>9.2f')}  {fmt(s['median_ratio_under_load'], '>15.2f')}"
              f"  {fmt(s['spearman_under_load'], '>15.2f')}  {fmt(s['median_cores_available'], '>10.2f')}")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.8), squeeze=False)
    for ax, res in zip(axes[0], results):
        ok = [r for r in res["runs"] if "measured" in r]
        for sched, marker in (("inline", "o"), ("local", "s")):
            pts = [r for r in ok if r["plan"]["schedule"] == sched]
            ax.scatter([r["predicted"]["env_steps_per_s"] for r in pts], [r["measured"]["env_steps_per_s"] for r in pts],
                       marker=marker, facecolors="none", edgecolors="gray", alpha=0.6,
                       label=f"{sched}, predicted for an idle machine")
            ax.scatter([r["predicted_under_load"]["env_steps_per_s"] for r in pts],
                       [r["measured"]["env_steps_per_s"] for r in pts], marker=marker, alpha=0.8,
                       label=f"{sched}, predicted for the cores we had")
        auto = [r for r in ok if r["auto"]]
        if auto:
            ax.scatter([auto[0]["predicted_under_load"]["env_steps_per_s"]], [auto[0]["measured"]["env_steps_per_s"]],
                       marker="*", s=260, c="red", edgecolors="black", zorder=5, label="auto plan")
        vals = [v for r in ok for v in (r["predicted"]["env_steps_per_s"], r["measured"]["env_steps_per_s"],
                                        r["predicted_under_load"]["env_steps_per_s"])]
        if vals:
            lo, hi = min(vals) / 1.3, max(vals) * 1.3
            ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = predicted")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        s = res["summary"]
        ax.set_title(f"{res['workload']} (~{s['median_cores_available'] or 0:.2f} of "
                     f"{res['cores']} cores ours)\n"
                     f"on those: median |log err| {s['median_abs_log_error_under_load'] or float('nan'):.2f}, "
                     f"rank corr {s['spearman_under_load']:.2f}", fontsize=9)
        ax.set_xlabel("predicted env steps/s")
        ax.set_ylabel("measured env steps/s (steady state)")
        ax.legend(fontsize=6.5)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("hetrl planner: predicted vs measured throughput", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--max-runs", type=int, default=12, help="plans run per workload (the auto plan included)")
    ap.add_argument("--all", action="store_true", help="run every runnable candidate plan")
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds of steady state per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs per plan (order flipped every repeat); median")
    ap.add_argument("--refresh", action="store_true", help="re-profile instead of using the cached tables")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--out", default=None, help="FILE stem for .json and .png (default: benchmarks/results/"
                                                 "bench_planner_<workloads>_<date>_<machine>_<commit>)")
    ap.add_argument("--repredict", metavar="FILE.json",
                    help="no runs: price the runs stored in FILE.json again with the current model, re-plot")
    args = ap.parse_args(argv)
    # a job started in the background inherits SIGINT ignored; restore Ctrl-C / SIGTERM (the local
    # schedule turns SIGTERM into SIGINT) so that the benchmark can be stopped
    signal.signal(signal.SIGINT, signal.default_int_handler)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    # actor processes of the local schedule import this module for SlowCartPole
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    out = Path(args.out or result_path("bench_planner", names).with_suffix(""))
    if args.repredict:
        doc = repredict(json.loads(Path(args.repredict).read_text()))
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
        plot(doc["workloads"], out.with_suffix(".png"))
        report(doc["workloads"])
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
        return 0
    local_ok, note = local_available()
    if not local_ok:
        print(f"note: schedule=local candidates are skipped: {note}", flush=True)
    t0 = time.perf_counter()
    results = [bench_workload(n, args, local_ok, note) for n in names]
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "bench_planner", "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": {"cores": os.cpu_count(), "load_avg_at_end": os.getloadavg()}, "wall_s": time.perf_counter() - t0,
           "local_schedule": local_ok, "local_note": None if local_ok else note, "workloads": results}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    plot(results, out.with_suffix(".png"))
    report(results)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
