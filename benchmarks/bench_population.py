"""A population of seeds as one hetrl run, against the ways people train many seeds today, alternating in one run.

    python benchmarks/bench_population.py [--seeds 8] [--rounds 1] [--cases dqn:CartPole-v1:50000,sac:Pendulum-v1:20000]
        [--variants population,groups,one,pairs,sb3] [--out FILE]

Per case (ALGO:ENV:STEPS[:key=value...], the rl-zoo preset otherwise), each variant in fresh subprocesses:
  population  the N seeds as one hetrl population in one process (`hetrl.train(..., seeds=N)`, plan none: the
              members' phases as lanes over the cores where the learner kernel allows)
  groups      the N seeds as one hetrl population, a process per core (`schedule="local"`, plan none: what the
              planner picks on several CPU cores), each acting and learning for its share of the members
  one         seed 0 alone (hetrl, plan none: inline, the learner on every core)
  pairs       the N seeds as separate hetrl runs, two at a time (each with the default threads, as a user
              starting them by hand would)
  sb3         Stable-Baselines3 on seed 0 (benchmarks/sb3_preset.py); N runs one after another cost N times it,
              which is what is reported (running it N times adds only time)
The order of the variants rotates from round to round. Prints wall times and the ratios the population targets
(population / one, pairs / population, SB3 x N / population), the population's peak RSS against N x one run's
replay bytes + one run's fixed overhead, and writes the figures as JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time, resource
kind, algo, env, steps, extra, seeds, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6], sys.argv[7]
t = time.perf_counter()
if kind == "sb3":
    sys.path.insert(0, __BENCH_DIR__)
    from hetrl.config import make_config
    from sb3_preset import sb3_model
    cfg = make_config(algo, env, {"steps": steps, **extra})
    model = sb3_model(cfg, env, lib="sb3", device="cpu")
    model.learn(total_timesteps=steps)
    r = {"env_steps": model.num_timesteps}
else:
    import hetrl
    kw = dict(steps=steps, plan="none", progress=False, evaluate_episodes=0, eval_episodes=0, **extra)
    if kind == "population":
        run = hetrl.train(algo, env, seeds=int(seeds), out=out, **kw)
        r = {k: run.result.get(k) for k in ("members", "env_steps", "wall_s", "lanes", "parallel_lanes",
                                            "learner_kernel", "groups", "group_peak_rss_mb", "peak_rss_mb")}
        r["processes_peak_rss_mb"] = r.pop("peak_rss_mb")
        m = json.loads(open(out + "/members/seed0/result.json").read())
        r.update(member_replay_bytes=m.get("replay_bytes"), member_learner_busy_s=m.get("learner_busy_s"))
    else:
        run = hetrl.train(algo, env, seed=int(seeds), **kw)
        r = {k: run.result.get(k) for k in ("env_steps", "wall_s", "learner_kernel", "replay_bytes", "learner_busy_s")}
r["process_s"] = time.perf_counter() - t
r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(r))
""".replace("__BENCH_DIR__", repr(str(HERE)))


def child(kind: str, algo: str, env: str, steps: int, extra: dict, seeds: int | str, out: str = "") -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, kind, algo, env, str(steps), json.dumps(extra), str(seeds), out],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{kind} {algo} {env} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def variant(kind: str, algo: str, env: str, steps: int, extra: dict, n: int, tmp: str) -> dict:
    t = time.perf_counter()
    if kind in ("population", "groups"):
        r = child("population", algo, env, steps, {**extra, "schedule": "local"} if kind == "groups" else extra, n,
                  f"{tmp}/pop")
        if kind == "groups":   # every process's peak (the groups' and the driver's)
            r["peak_rss_mb"] = r.get("processes_peak_rss_mb") or r["peak_rss_mb"]
    elif kind == "one":
        r = child("one", algo, env, steps, extra, 0)
    elif kind == "pairs":
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda s: child("one", algo, env, steps, extra, s), range(n)))
        r = {"runs": runs, "peak_rss_mb": max(x["peak_rss_mb"] for x in runs)}
    elif kind == "sb3":
        r = child("sb3", algo, env, steps, extra, 0)
    else:
        raise SystemExit(f"unknown variant {kind!r}; choose from population, groups, one, pairs, sb3")
    r["wall_s_outside"] = time.perf_counter() - t   # the whole variant, process start-up and imports included
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cases", default="dqn:CartPole-v1:50000,sac:Pendulum-v1:20000")
    ap.add_argument("--variants", default="population,groups,one,pairs,sb3")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import yaml

    kinds = args.variants.split(",")
    report = {"command": "python " + " ".join(sys.argv), "seeds": args.seeds, "cases": [],
              "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                          "?"), "cores": os.cpu_count()}
    for case in args.cases.split(","):
        algo, env, steps, *kv = case.split(":")
        steps, extra = int(steps), {k: yaml.safe_load(v) for k, v in (x.split("=", 1) for x in kv)}
        rows: dict[str, list] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                with tempfile.TemporaryDirectory() as tmp:
                    res = variant(kind, algo, env, steps, extra, args.seeds, tmp)
                rows[kind].append(res)
                print(f"{algo} {env} round {r} {kind:>10}: {res['wall_s_outside']:8.1f} s", flush=True)
        wall = {k: statistics.median(x["wall_s_outside"] for x in v) for k, v in rows.items()}
        ratios, memory = {}, {}
        for pop in ("population", "groups"):
            if pop not in wall:
                continue
            if "one" in wall:
                ratios[f"{pop}/one"] = wall[pop] / wall["one"]
            if "pairs" in wall:
                ratios[f"pairs/{pop}"] = wall["pairs"] / wall[pop]
            if "sb3" in wall:
                ratios[f"sb3_x_seeds/{pop}"] = args.seeds * wall["sb3"] / wall[pop]
            if rows.get("one"):
                p, one = rows[pop][0], rows["one"][0]
                replay = (p.get("member_replay_bytes") or 0) / 2**20
                fixed = one["peak_rss_mb"] - (one.get("replay_bytes") or 0) / 2**20
                memory.update({f"{pop}_peak_rss_mb": p["peak_rss_mb"], "one_peak_rss_mb": one["peak_rss_mb"],
                               "member_replay_mb": replay, "one_fixed_overhead_mb": fixed,
                               "bound_mb": args.seeds * replay + fixed})
        print(f"==> {algo} {env}: wall s " + ", ".join(f"{k} {v:.1f}" for k, v in wall.items())
              + "".join(f"; {k} {v:.2f}" for k, v in ratios.items())
              + "".join(f"; {k} {v:.0f} MB" for k, v in memory.items() if k.endswith("peak_rss_mb"))
              + (f" (bound {memory['bound_mb']:.0f} MB)" if memory else ""))
        report["cases"].append({"algo": algo, "env": env, "steps": steps, "extra": extra, "runs": rows,
                                "median_wall_s": wall, "ratios": ratios, "memory": memory})
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    out = Path(args.out or result_path("bench_population", args.cases))
    out.parent.mkdir(exist_ok=True)
    report["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
