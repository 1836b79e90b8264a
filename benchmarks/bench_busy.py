"""A busy machine: a profile taken while another program holds a core, then the default plan against hand-set ones.

    python benchmarks/bench_busy.py [--quick] [--rounds 2] [--cases td3,dqn] [--phases loaded,quiet] [--steps N]
                                    [--out FILE] [--cache DIR]

For each case (TD3 on Pendulum-v1, DQN on CartPole-v1), in a fresh cache (so the profile is the one taken
here), two phases:

* loaded: starts a CPU hog (a process of its own spinning on one core), profiles the case with `hetrl profile
  --refresh` while it runs, stops it, and then trains;
* quiet: profiles the case with `hetrl profile --refresh` with no hog, and then trains;

each time in the same run and alternating (the order flipped every round), under the default plan and under
three hand-set plans:

    default        hetrl train ALGO --env ID                               (the planner's choice)
    inline_2thr    hetrl train ALGO --env ID --schedule inline --set threads=2
    inline_1thr    hetrl train ALGO --env ID --schedule inline --set threads=1
    local          hetrl train ALGO --env ID --schedule local

Each run's env steps/s while learning (result.json: env_steps_per_s_learning) is its figure; each phase reports
the default plan's median over the best hand-set plan's median and the default plan's measured / predicted rate,
and prints its verdicts on what must hold: after the loaded profile, default >= 0.9 x the best hand-set plan;
after the quiet one, the same and the prediction within 15% of the measured rate. It also reports the profile's provisional entries (taken under the hog), what the
first planned run measured again once the hog was gone, and what each run's follower did (plans_tried). Around
every run the foreign load (other programs' work, hetrl/planner/load.py) is recorded, to judge the figures by:
run it on a machine nobody else uses. Writes benchmarks/results/bench_busy_td3-pendulum+dqn-cartpole_DATE_MACHINE_
COMMIT.json (benchmarks/result_files.py; --quick: a smoke run of tiny runs, one round, written to the temporary
folder unless --out).
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from hetrl.planner.load import Watch  # noqa: E402
from result_files import commit, result_path  # noqa: E402  (benchmarks/result_files.py: the naming scheme)

CASES = {   # name: (algo, env, steps, quick steps, settings of the quick runs)
    "td3": ("td3", "Pendulum-v1", 15000, 1500, ["--set", "learning_starts=300", "--set", "net_arch=[64,64]"]),
    "dqn": ("dqn", "CartPole-v1", 20000, 2000, ["--set", "learning_starts=300"]),
}
VARIANTS = {"default": [], "inline_2thr": ["--schedule", "inline", "--set", "threads=2"],
            "inline_1thr": ["--schedule", "inline", "--set", "threads=1"], "local": ["--schedule", "local"]}
HOG = "while True:\n    pass\n"


def cpu() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    return {"model": model, "cores": os.cpu_count(), "avx512": "avx512f" in flags, "avx2": "avx2" in flags,
            "amx": "amx_tile" in flags}


def loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError):
        return None


def hetrl(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetrl.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


MUST = {"default_over_best": 0.9, "prediction_error": 0.15}   # the planner's must-hold (docs/planner.md)


def profile_case(algo: str, env_id: str, extra: list[str], env: dict, hog: bool) -> dict:
    """`hetrl profile --refresh`, while a hog spins on a core where `hog`; the entries it left provisional."""
    hog = subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True) if hog else None
    try:
        time.sleep(1.0 if hog else 0.0)
        w = Watch().start()
        t0 = time.perf_counter()
        # (a full profile even with --quick: `hetrl train` plans from the full grid)
        p = hetrl(["profile", algo, "--env", env_id, "--refresh", "--json", *extra],
                  env, 900)
        seconds = time.perf_counter() - t0
        load = w.stop()
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    if p.returncode != 0:
        raise SystemExit(f"hetrl profile failed:\n{p.stderr[-3000:]}")
    doc = json.loads(p.stdout)
    from hetrl.planner.profile import ProfileTable

    prov = ProfileTable(doc).provisional_entries()
    return {"hog": hog is not None, "seconds": round(seconds, 1),
            "foreign_while_profiling": load.to_json() if load else None,
            "provisional": len(prov), "provisional_learner_threads": sorted({p[2] for p, _ in prov
                                                                            if p[0] in ("learn", "learn_grouped")}),
            "provisional_entries": ["/".join(p) for p, _ in prov], "path": doc.get("path")}


def train(algo: str, env_id: str, steps: int, variant: str, extra: list[str], env: dict, out: Path) -> dict:
    args = ["train", algo, "--env", env_id, "--steps", str(steps), "--seed", "0", "--out", str(out), "--force",
            "--no-progress", "--set", "eval_episodes=0", *extra, *VARIANTS[variant]]
    w = Watch().start()
    t0 = time.perf_counter()
    p = hetrl(args, env, 1800)
    wall = time.perf_counter() - t0
    load = w.stop()
    if p.returncode != 0:
        raise SystemExit(f"hetrl {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    r = json.loads((out / "result.json").read_text())
    plan = (r.get("plan") or {}).get("plan") or {}
    prof = (r.get("plan") or {}).get("profile") or {}
    return {"variant": variant, "env_steps_per_s_learning": r.get("env_steps_per_s_learning"),
            "env_steps_per_s": r.get("env_steps_per_s"),
            "predicted_env_steps_per_s": r.get("predicted_env_steps_per_s"),
            "plan": {k: plan.get(k) for k in ("schedule", "actors", "envs_per_actor", "threads")},
            "threads": r.get("threads"), "learner_kernel": r.get("learner_kernel"),
            "plans_tried": r.get("plans_tried"), "plan_follow": r.get("plan_follow"),
            "rests_on_provisional": len((r.get("plan") or {}).get("rests_on_provisional") or []),
            "plan_notes": (r.get("plan") or {}).get("notes"),
            "profile_remeasured": prof.get("remeasured"), "profile_provisional": prof.get("provisional"),
            "wall_s": round(wall, 1), "foreign_during_run": round(load.foreign, 3) if load else None,
            "loadavg_after": loadavg()}


def run_phase(name: str, phase: str, algo: str, env_id: str, steps: int, extra: list[str], rounds: int, env: dict,
              tmp: Path) -> dict:
    """One phase of a case: the profile (under a hog where `phase` is loaded), then the runs, alternating."""
    say = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    say(f"{name} ({phase}): profiling {algo} on {env_id}" + (" while a hog holds a core ..." if phase == "loaded"
                                                            else " on a machine without the hog ..."))
    prof = profile_case(algo, env_id, extra, env, hog=phase == "loaded")
    say(f"  {prof['provisional']} provisional entries (of learner threads {prof['provisional_learner_threads']})")
    time.sleep(2.0)   # the hog's core given back
    runs = []
    order = list(VARIANTS)
    for r in range(rounds):
        for variant in (order if r % 2 == 0 else order[::-1]):
            got = train(algo, env_id, steps, variant, extra, env, tmp / f"{name}-{phase}-{variant}-{r}")
            runs.append({"round": r, **got})
            say(f"  round {r} {variant:12s} {got['env_steps_per_s_learning'] or 0:8,.0f} env steps/s learning (plan "
                f"{got['plan']}, threads {got['threads']}, predicted {got['predicted_env_steps_per_s'] or 0:,.0f}, "
                f"foreign load {got['foreign_during_run']}; follower: {(got['plan_follow'] or {}).get('why')})")
    med = {v: statistics.median(x["env_steps_per_s_learning"] or 0.0 for x in runs if x["variant"] == v)
           for v in VARIANTS}
    hand = {v: m for v, m in med.items() if v != "default"}
    best = max(hand, key=hand.get)
    defaults = [x for x in runs if x["variant"] == "default"]
    pred = statistics.median(x["predicted_env_steps_per_s"] or 0.0 for x in defaults)
    ratio = med["default"] / hand[best] if hand[best] else None
    mp = med["default"] / pred if pred else None
    verdicts = {f"default >= {MUST['default_over_best']} x best hand-set ({best})":
                ratio is not None and ratio >= MUST["default_over_best"]}
    if phase == "quiet":
        verdicts[f"prediction within {100 * MUST['prediction_error']:.0f}% of the measured rate"] = \
            bool(pred) and abs(pred - med["default"]) <= MUST["prediction_error"] * med["default"]
    foreign = [x["foreign_during_run"] for x in runs if x["foreign_during_run"] is not None]
    out = {"profile": prof, "runs": runs, "median_env_steps_per_s_learning": med, "best_hand_set": best,
           "default_over_best_hand_set": ratio, "default_measured_over_predicted": mp,
           "default_plans": [x["plan"] for x in defaults], "verdicts": verdicts,
           "max_foreign_during_runs": max(foreign) if foreign else None}
    say(f"  default / best hand-set ({best}): {ratio or 0:.2f}; default measured / predicted: {mp or 0:.2f}")
    for what, ok in verdicts.items():
        say(f"  {'PASS' if ok else 'FAIL'}  {phase}: {what}")
    if foreign and max(foreign) > 0.5:
        say(f"  (other programs kept up to {max(foreign):.2f} cores busy during the runs: the figures are not a quiet "
            "machine's)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny runs, one round")
    ap.add_argument("--rounds", type=int, default=None, help="runs of each plan, alternating (default 2; quick 1)")
    ap.add_argument("--cases", default="td3,dqn", help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--phases", default="loaded,quiet", help="comma-separated, of: loaded, quiet")
    ap.add_argument("--steps", type=int, default=None, help="env steps of each run (default: the case's)")
    ap.add_argument("--out", help="the result file (default benchmarks/results/bench_busy_DATE_MACHINE_COMMIT.json)")
    ap.add_argument("--cache", help="the cache directory to profile into (default: a fresh temporary one)")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    phases = args.phases.split(",")
    if any(p not in ("loaded", "quiet") for p in phases):
        raise SystemExit(f"--phases {args.phases}: choose among loaded, quiet")
    c = cpu()
    doc = {"date": time.strftime("%Y-%m-%d"), "when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": c,
           "commit": commit(), "command": "python " + " ".join(sys.argv), "quick": args.quick, "rounds": rounds,
           "must": MUST, "loadavg_before": loadavg(), "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HETRL_CACHE_DIR": args.cache or str(Path(tmp) / "cache"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        for name in args.cases.split(","):
            algo, env_id, steps, quick_steps, quick_extra = CASES[name]
            extra = quick_extra if args.quick else []
            steps = args.steps or (quick_steps if args.quick else steps)
            case = {"algo": algo, "env": env_id, "steps": steps, "settings": extra, "phases": {}}
            for phase in phases:
                case["phases"][phase] = run_phase(name, phase, algo, env_id, steps, extra, rounds, env, Path(tmp))
            doc["cases"][name] = case
    doc["loadavg_after"] = loadavg()
    cases = ",".join(f"{CASES[n][0]}:{CASES[n][1]}" for n in args.cases.split(","))
    out = Path(args.out) if args.out else result_path("bench_busy", cases,
                                                      folder=Path(tempfile.gettempdir()) if args.quick else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: {ph: {kk: v[kk] for kk in ("median_env_steps_per_s_learning", "default_over_best_hand_set",
                                                    "default_measured_over_predicted", "verdicts")}
                           for ph, v in case["phases"].items()} for k, case in doc["cases"].items()}, indent=1))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
