"""Learning equivalence (issue 12): does hetrl's default plan learn what the preset learns, and faster?

    python benchmarks/bench_learning.py [--envs CartPole-v1,Acrobot-v1] [--seeds 0,1,2]
                                        [--runs auto,none,sb3] [--algos dqn,ddpg] [--steps N]

For every DQN / DDPG preset of the classic-control set (CartPole-v1, Acrobot-v1, MountainCar-v0,
LunarLander-v3 if Box2D is installed; Pendulum-v1), every seed, three runs with the same preset
(hetrl/algos/*.yaml, rl-baselines3-zoo's hyperparameters):

* auto  `hetrl train ALGO --env ENV --seed S`: hetrl's default plan (the planner chooses the
        schedule, devices, threads and how the preset's envs are split over actors)
* none  `hetrl train ... --plan none`: the preset's values as they are (inline schedule)
* sb3   Stable-Baselines3 with the same hyperparameters (benchmarks/sb3_preset.py), evaluated
        as hetrl evaluates: every tenth of the run the latest policy plays eval_episodes
        episodes on the selection seeds (seed + 10,000), a new best is confirmed on as many
        again, and at the end the best and the last policy play on the report seeds (seed + 20,000)

Reported per run: best (the kept policy's evaluation return), final (the last policy's), the
training wall time (evaluations left out; hetrl: its result.json wall_s, profiling excluded; the
process time is kept too), whether the best reached the rl-zoo score (benchmark.md of
rl-baselines3-zoo) and the env steps / seconds to the first selection evaluation that did.
Every run is a fresh subprocess, one after the other (run it on a quiet machine).
Writes benchmarks/results/bench_learning_<algos>_<date>_<machine>_<commit>.json (--out) and prints a
table. hetrl's runs leave their run directories under a temporary folder (--keep DIR to keep them).
Needs stable-baselines3 for the sb3 runs (the `bench` extra).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# rl-baselines3-zoo benchmark.md (mean return of the zoo's trained agent); LunarLander: the zoo's v2 score
ZOO_SCORE = {("dqn", "CartPole-v1"): 500.0, ("dqn", "Acrobot-v1"): -76.6, ("dqn", "MountainCar-v0"): -100.8,
             ("dqn", "LunarLander-v3"): 154.4, ("ddpg", "Pendulum-v1"): -152.1, ("td3", "Pendulum-v1"): -151.9,
             ("sac", "Pendulum-v1"): -157.0}
CASES = [("dqn", "CartPole-v1"), ("dqn", "Acrobot-v1"), ("dqn", "MountainCar-v0"), ("dqn", "LunarLander-v3"),
         ("ddpg", "Pendulum-v1"), ("td3", "Pendulum-v1"), ("sac", "Pendulum-v1")]
RUNS = ("auto", "none", "sb3")

SB3_CHILD = r"""
import json, sys, time
sys.path.insert(0, __BENCH_DIR__)
spec = json.loads(sys.argv[1])
from hetrl.api import REPORT_SEED, SELECT_SEED
from hetrl.config import make_config
from hetrl.evaluate import evaluate
from sb3_preset import sb3_model
from stable_baselines3.common.callbacks import BaseCallback
cfg = make_config(spec["algo"], spec["env"], spec["over"])
import torch
if spec.get("threads"):
    torch.set_num_threads(spec["threads"])
model = sb3_model(cfg, cfg.env)
n, every = cfg.eval_episodes or 10, cfg.eval_interval or max(1, cfg.steps // 10)
act = lambda o: model.predict(o, deterministic=True)[0]
st = {"evals": [], "eval_s": 0.0, "best": None, "next": every}

def select():
    t = time.perf_counter()
    seed = cfg.seed + SELECT_SEED
    score = evaluate(act, cfg.env, n, seed)["eval_return_mean"]
    first = score
    if st["best"] is None or score >= st["best"][1]:   # hetrl's confirmation of a new best
        score = (score + evaluate(act, cfg.env, n, seed + n)["eval_return_mean"]) / 2
    if st["best"] is None or score >= st["best"][1]:
        st["best"] = ({k: v.detach().clone() for k, v in model.policy.state_dict().items()}, score, model.num_timesteps)
    st["eval_s"] += time.perf_counter() - t
    st["evals"].append([model.num_timesteps, time.perf_counter() - st["t0"] - st["eval_s"], first])

class Select(BaseCallback):
    def _on_step(self):
        if self.num_timesteps >= st["next"]:
            select()
            st["next"] = (self.num_timesteps // every + 1) * every
        return True

st["t0"] = time.perf_counter()
model.learn(total_timesteps=cfg.steps, callback=Select())
wall = time.perf_counter() - st["t0"] - st["eval_s"]
if not st["evals"] or st["evals"][-1][0] < model.num_timesteps:
    select()
final = evaluate(act, cfg.env, n, cfg.seed + REPORT_SEED)
model.policy.load_state_dict(st["best"][0])
best = evaluate(act, cfg.env, n, cfg.seed + REPORT_SEED)
print(json.dumps({"wall_s": wall, "env_steps": model.num_timesteps, "torch_threads": torch.get_num_threads(),
                  "best": best["eval_return_mean"],
                  "final": final["eval_return_mean"], "best_env_steps": st["best"][2], "evals": st["evals"]}))
""".replace("__BENCH_DIR__", repr(str(HERE)))


def box2d() -> bool:
    try:
        import Box2D  # noqa: F401
    except ImportError:
        return False
    return True


def _tb_evals(out: Path) -> list[list[float]]:
    """[env_steps, wall_s, selection return] of a hetrl run: eval/return_mean from its TensorBoard
    events, the training wall time at that step interpolated from progress.csv."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return []
    acc = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    if "eval/return_mean" not in acc.Tags().get("scalars", []):
        return []
    with open(out / "progress.csv") as f:
        rows = [(float(r["env_steps"]), float(r["wall_s"])) for r in csv.DictReader(f)]

    def wall_at(step: float):
        prev = (0.0, 0.0)
        for s, w in rows:
            if s >= step:
                return prev[1] + (w - prev[1]) * (step - prev[0]) / max(s - prev[0], 1e-9)
            prev = (s, w)
        return rows[-1][1] if rows else None

    return [[e.step, wall_at(e.step), e.value] for e in acc.Scalars("eval/return_mean")]


def run_hetrl(algo: str, env: str, seed: int, plan: str, steps: int | None, work: Path) -> dict:
    out = work / f"{algo}-{env}-s{seed}-{plan}"
    cmd = [sys.executable, "-m", "hetrl.cli", "train", algo, "--env", env, "--seed", str(seed), "--out", str(out),
           "--force", "--no-progress", "--plan", plan] + (["--steps", str(steps)] if steps else [])
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    process_s = time.perf_counter() - t
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}",
                "process_s": process_s, "command": " ".join(cmd[1:])}
    res = json.loads((out / "result.json").read_text())
    plan_doc = res.get("plan") or {}
    return {"best": res.get("eval_return_mean"),
            "final": res.get("final_eval_return_mean", res.get("eval_return_mean")),
            "wall_s": res["wall_s"], "process_s": process_s, "env_steps": res["env_steps"],
            "best_env_steps": res.get("best_env_steps"), "schedule": res["schedule"], "num_envs": res["num_envs"],
            "plan": plan_doc.get("plan"), "chosen": plan_doc.get("chosen"),
            "changed_learning_settings": plan_doc.get("changed_learning_settings"),
            "evals": _tb_evals(out), "command": "hetrl " + " ".join(cmd[4:])}


def run_sb3(algo: str, env: str, seed: int, steps: int | None, threads: int = 0) -> dict:
    spec = {"algo": algo, "env": env, "over": {"seed": seed, **({"steps": steps} if steps else {})},
            "threads": threads}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", SB3_CHILD, json.dumps(spec)], capture_output=True, text=True, cwd=ROOT)
    process_s = time.perf_counter() - t
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}",
                "process_s": process_s}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["process_s"] = process_s
    return r


def to_target(r: dict, target: float | None) -> dict:
    """Whether the kept policy reached the zoo score, and when a selection evaluation first did."""
    if target is None or "error" in r:
        return {}
    hit = next((e for e in r.get("evals") or [] if e[2] >= target - 1e-6), None)
    return {"reached": r.get("best") is not None and r["best"] >= target - 1e-6,
            "target_env_steps": hit[0] if hit else None, "target_s": hit[1] if hit else None}


def fmt(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    head = (f"{'algo':<5} {'env':<15} {'run':<5} {'seeds':>5} {'best (mean)':>12} {'final (mean)':>12} "
            f"{'reached':>8} {'wall s (med)':>12} {'to score s (med)':>16}  plan")
    lines = [head, "-" * len(head)]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["algo"], r["env"], r["run"]), []).append(r)
    for (algo, env, run), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        mean = lambda k: statistics.mean(r[k] for r in ok if r.get(k) is not None) if any(  # noqa: E731
            r.get(k) is not None for r in ok) else None
        med = lambda k: statistics.median(r[k] for r in ok if r.get(k) is not None) if any(  # noqa: E731
            r.get(k) is not None for r in ok) else None
        scored = ZOO_SCORE.get((algo, env)) is not None
        reached = f"{sum(bool(r.get('reached')) for r in ok)}/{len(rs)}" if scored else "-"
        plan = ""
        if ok and ok[0].get("plan"):
            p = ok[0]["plan"]
            plan = f"{p['schedule']} {p['actors']}x{p['envs_per_actor']} {p['learner_device']} {p['threads']}thr"
        elif ok and run == "none":
            plan = f"{ok[0].get('schedule')} num_envs {ok[0].get('num_envs')}"
        elif ok and run == "sb3":
            plan = f"{ok[0].get('torch_threads')} torch threads"
        errors = [r["error"] for r in rs if "error" in r]
        lines.append(f"{algo:<5} {env:<15} {run:<5} {len(rs):>5} {fmt(mean('best')):>12} {fmt(mean('final')):>12} "
                     f"{reached:>8} {fmt(med('wall_s')):>12} {fmt(med('target_s')):>16}  {plan}"
                     + (f"  ERROR: {errors[0]}" if errors else ""))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", help="comma-separated env ids (default: the classic-control set)")
    ap.add_argument("--algos", default="dqn,ddpg", help="comma-separated (default dqn,ddpg; td3,sac also work)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)} (default all)")
    ap.add_argument("--steps", type=int, help="env steps per run (default: the preset's; a smoke test: a few thousand)")
    ap.add_argument("--sb3-threads", type=int, default=0,
                    help="torch threads for SB3 (default 0: torch's default, what an SB3 user gets; hetrl's plan "
                         "chooses its own, see the plan column)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", metavar="DIR", help="keep hetrl's run directories in DIR")
    ap.add_argument("--table", metavar="JSON", help="print the table of an earlier run's JSON and exit")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["runs"]))
        return
    envs = args.envs.split(",") if args.envs else None
    algos, runs = args.algos.split(","), args.runs.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    bad = [r for r in runs if r not in RUNS]
    if bad:
        raise SystemExit(f"--runs: unknown {', '.join(bad)}; choose from {', '.join(RUNS)}")
    from hetrl import registry

    presets = {a: registry.presets(a) for a in registry.names()}
    cases = [(a, e) for a, e in CASES if a in algos and (envs is None or e in envs) and e in presets.get(a, {})]
    if envs:
        unknown = [e for e in envs if not any(e == c[1] for c in cases)]
        if unknown:
            raise SystemExit(f"--envs: no {'/'.join(algos)} preset of the classic-control set for {', '.join(unknown)}")
    if any(e.startswith("LunarLander") for _, e in cases) and not box2d():
        print("bench_learning: LunarLander-v3 skipped (Box2D is not installed: pip install 'gymnasium[box2d]')",
              file=sys.stderr)
        cases = [c for c in cases if not c[1].startswith("LunarLander")]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hetrl-bench-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    out = Path(args.out or result_path("bench_learning", algos))
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:   # after every run: an interrupted benchmark keeps what it measured
        out.write_text(json.dumps({"started": started, "argv": sys.argv[1:], "command": "python " + " ".join(sys.argv),
                                   "python": sys.version.split()[0],
                                   "cores": os.cpu_count(), "zoo_score": {f"{a} {e}": v for (a, e), v in ZOO_SCORE.items()},
                                   "runs": rows}, indent=1))

    # seeds outermost: a benchmark stopped early still covers every case
    for seed, (algo, env), run in ((s, c, r) for s in seeds for c in cases for r in runs):
        print(f"bench_learning: {algo} {env} seed {seed} {run} ...", file=sys.stderr, flush=True)
        if run == "sb3":
            r = run_sb3(algo, env, seed, args.steps, args.sb3_threads)
        else:
            r = run_hetrl(algo, env, seed, run, args.steps, work)
        r.update(algo=algo, env=env, seed=seed, run=run, **to_target(r, ZOO_SCORE.get((algo, env))))
        rows.append(r)
        print(f"  best {fmt(r.get('best'))} final {fmt(r.get('final'))} wall {fmt(r.get('wall_s'))} s"
              + (f"  ERROR: {r['error']}" if "error" in r else ""), file=sys.stderr, flush=True)
        save()
    print(table(rows))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(f"bench_learning: wrote {out}" + (f"; runs in {work}" if args.keep else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
