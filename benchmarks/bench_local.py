"""The local schedule against the inline schedule and Stable-Baselines3, on the same presets.

    python benchmarks/bench_local.py [--rounds 2] [--only throughput,t475,ddpg,sweep,ablation]

Every measurement runs in a fresh subprocess; within a round the libraries run one after the
other and the order flips every round, so all see the same machine load.  Sections:

* throughput  DQN CartPole-v1, `--dqn-steps` env steps at the preset's replay ratio (128
              gradient steps of batch 64 per 256 env steps): env steps/s and training samples/s
              (per second of wall time) of inline, local and SB3.
* t475        DQN CartPole-v1 to an evaluation return >= 475: every `--eval-every` env steps
              the current policy plays 5 episodes (fixed seeds); the clock is paused meanwhile.
              Reports the training wall time to the first evaluation >= 475 (and the time
              including evaluations), up to `--t475-max` env steps; training seeds 0, 1, ...
              (`--t475-seeds`), one per round.
* ddpg        DDPG Pendulum-v1: `--ddpg-steps` env steps (warm-up `--ddpg-learning-starts`),
              local vs inline vs SB3 env steps/s.
* sweep       local env steps/s against the number of actors (1..4), at the preset's ratio and
              without the rate limiter; plot beside the JSON (.png).
* ablation    local with each scheduling optimisation switched off in turn, and with a
              2-thread learner.
* pays        where overlapping pays: DQN CartPole-v1 (preset) on an env whose step burns
              0.2 ms more CPU (`benchmarks.bench_local:HeavyCartPole-v1`, a stand-in for a
              costlier simulator), and plain CartPole at a 16x lower replay ratio
              (gradient_steps=8 per 256 env steps): inline vs local.

Writes benchmarks/results/bench_local_<case>_<date>_<machine>_<commit>.json.  The machine is shared and
noisy: compare ratios within a round, not absolute figures across runs.  Needs stable-baselines3 (make bench).
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
HEAVY_STEP_S = 0.0002


def _heavy_cartpole(**kwargs):
    import gymnasium as gym

    class Heavy(gym.Wrapper):
        def step(self, action):  # burn CPU like a costlier simulator would (not sleep)
            end = time.perf_counter() + HEAVY_STEP_S
            while time.perf_counter() < end:
                pass
            return self.env.step(action)

    return Heavy(gym.make("CartPole-v1", **kwargs))


def _register() -> None:
    import gymnasium as gym

    if "HeavyCartPole-v1" not in gym.registry:
        gym.register("HeavyCartPole-v1", entry_point=_heavy_cartpole, max_episode_steps=None)


try:  # `benchmarks.bench_local:HeavyCartPole-v1` imports this module in every actor process
    _register()
except ImportError:  # pragma: no cover
    pass

CHILD = r"""
import json, sys, time
spec = json.loads(sys.argv[1])
lib, algo, env, steps, extra, mode = spec["lib"], spec["algo"], spec["env"], spec["steps"], spec["extra"], spec["mode"]
from hetrl.config import make_config
from hetrl.evaluate import evaluate
cfg = make_config(algo, spec.get("preset_env", env), {"steps": steps, "eval_episodes": 0, "keep_best": False, **extra})
EVAL_EP, TARGET, EVERY = spec.get("eval_episodes", 5), spec.get("target", 475.0), spec.get("eval_every", 5000)
out = {}
if lib == "hetrl":
    import hetrl
    from hetrl.api import Policy, Run
    t0 = time.perf_counter()
    run = Run(cfg, env)
    t_built = time.perf_counter()
    s = run.schedule
    evals, train_s, hit = [], 0.0, None
    t = time.perf_counter()
    next_eval = EVERY
    while not s.done():
        s.phase()
        if mode == "t475" and s.c.env_steps >= next_eval:
            train_s += time.perf_counter() - t
            ev = Policy(s.algo, cfg, env).evaluate(EVAL_EP, seed=10_000)["eval_return_mean"]
            evals.append((s.c.env_steps, train_s, time.perf_counter() - t_built, ev))
            next_eval += EVERY
            t = time.perf_counter()
            if ev >= TARGET:
                hit = evals[-1]
                break
    train_s += time.perf_counter() - t
    s.c.wall_s = train_s
    f = s.figures()
    if hasattr(s, "close"):
        s.close()
    out = {"wall_s": train_s, "setup_s": t_built - t0, "env_steps": f["env_steps"],
           "gradient_steps": f["gradient_steps"], "learner_busy_s": f["learner_busy_s"],
           "local": {k: f[k] for k in ("actors", "envs_per_actor", "actor_busy_fraction", "learner_busy_fraction",
                                        "policy_staleness_mean", "replay_ratio_achieved", "learner_wait_s")
                     if k in f}}
else:
    from stable_baselines3.common.callbacks import BaseCallback
    sys.path.insert(0, __BENCH_DIR__)
    from sb3_preset import sb3_model
    model = sb3_model(cfg, env)
    state = {"evals": [], "eval_s": 0.0, "hit": None, "next": EVERY}

    class Eval(BaseCallback):
        def _on_step(self):
            if mode != "t475" or self.num_timesteps < state["next"]:
                return True
            t = time.perf_counter()
            ev = evaluate(lambda o: self.model.predict(o, deterministic=True)[0], env, EVAL_EP, 10_000)["eval_return_mean"]
            state["eval_s"] += time.perf_counter() - t
            state["next"] += EVERY
            state["evals"].append((self.num_timesteps, time.perf_counter() - state["t0"] - state["eval_s"],
                                   time.perf_counter() - state["t0"], ev))
            if ev >= TARGET:
                state["hit"] = state["evals"][-1]
                return False
            return True

    state["t0"] = time.perf_counter()
    model.learn(total_timesteps=steps, callback=Eval())
    wall = time.perf_counter() - state["t0"] - state["eval_s"]
    evals, hit = state["evals"], state["hit"]
    out = {"wall_s": wall, "env_steps": model.num_timesteps, "gradient_steps": model._n_updates}
out["env_steps_per_s"] = out["env_steps"] / out["wall_s"]
out["train_samples_per_s"] = out["gradient_steps"] * cfg.batch_size / out["wall_s"]
if mode == "t475":
    out["evals"] = evals
    out["t475_s"] = hit[1] if hit else None
    out["t475_with_eval_s"] = hit[2] if hit else None
    out["t475_env_steps"] = hit[0] if hit else None
print(json.dumps(out))
""".replace("__BENCH_DIR__", repr(str(HERE)))


def run_child(lib: str, algo: str, env: str, steps: int, extra: dict, mode: str = "throughput", **kw) -> dict:
    spec = {"lib": lib, "algo": algo, "env": env, "steps": steps, "extra": extra, "mode": mode, **kw}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{lib} {algo} {env} {extra} failed:\n{p.stderr[-3000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["process_s"] = time.perf_counter() - t
    return r


def label(variant: str) -> tuple[str, dict]:
    """inline | local | sb3 -> (lib, extra settings)."""
    return {"inline": ("hetrl", {"schedule": "inline"}), "local": ("hetrl", {"schedule": "local"}),
            "local-2t": ("hetrl", {"schedule": "local", "threads": 2}),
            "inline-1t": ("hetrl", {"schedule": "inline", "threads": 1}), "sb3": ("sb3", {})}[variant]


def rounds_of(variants: list[str], rounds: int, fn, seeded: bool = False) -> dict[str, list[dict]]:
    """Run fn(variant) (fn(variant, seed) when `seeded`: seed = round) for every variant, rounds times."""
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            res = fn(v, r) if seeded else fn(v)
            res["seed"] = r if seeded else 0
            rows[v].append(res)
            extra = f" t475 {res['t475_s']:.1f} s" if res.get("t475_s") else ""
            print(f"  round {r} {v:>8}: {res['env_steps_per_s']:8.0f} env steps/s "
                  f"{res['train_samples_per_s']:8.0f} samples/s ({res['wall_s']:.1f} s){extra}", flush=True)
    return rows


def median(rows: list[dict], key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarise(name: str, rows: dict[str, list[dict]], keys=("env_steps_per_s", "train_samples_per_s")) -> dict:
    med = {v: {k: median(rs, k) for k in keys} for v, rs in rows.items()}
    for k in keys:
        line = ", ".join(f"{v} {m[k]:.1f}" if m[k] is not None else f"{v} -" for v, m in med.items())
        print(f"==> {name} {k} (median): {line}")
    return {"runs": rows, "median": med}


def ratio(a, b):
    return a / b if a and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="throughput,t475,ddpg,sweep,ablation")
    ap.add_argument("--dqn-steps", type=int, default=20_000)
    ap.add_argument("--t475-max", type=int, default=50_000)
    ap.add_argument("--t475-seeds", type=int, default=3, help="one seed per round (0, 1, ...)")
    ap.add_argument("--eval-every", type=int, default=5_000)
    ap.add_argument("--ddpg-steps", type=int, default=6_000)
    ap.add_argument("--ddpg-learning-starts", type=int, default=1_000,
                    help="shorter warm-up than the preset's 10k so the timed part is mostly learning")
    ap.add_argument("--sweep-steps", type=int, default=20_000)
    ap.add_argument("--pays-steps", type=int, default=20_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    only = set(args.only.split(","))
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    out = Path(args.out or result_path("bench_local", "dqn-cartpole+ddpg-pendulum"))
    report = json.loads(out.read_text()) if out.exists() else {}
    report.update({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                   "python": sys.version.split()[0], "loadavg_start": os.getloadavg(),
                   "command": "python " + " ".join(sys.argv)})
    variants = ["inline", "local", "sb3"]

    if "throughput" in only:
        print(f"DQN CartPole-v1 throughput, {args.dqn_steps} env steps at the preset's replay ratio")
        # inline-1t: inline with the local learner's thread count (1 here), to separate the gain of
        # overlapping from that of the thread count (inline's default is all cores)
        rows = rounds_of(["inline", "inline-1t", "local", "sb3"], args.rounds, lambda v: run_child(
            label(v)[0], "dqn", "CartPole-v1", args.dqn_steps, label(v)[1]))
        s = summarise("dqn throughput", rows)
        m = s["median"]
        s["local_vs_inline"] = ratio(m["local"]["env_steps_per_s"], m["inline"]["env_steps_per_s"])
        s["local_vs_inline_1t"] = ratio(m["local"]["env_steps_per_s"], m["inline-1t"]["env_steps_per_s"])
        s["local_vs_sb3"] = ratio(m["local"]["env_steps_per_s"], m["sb3"]["env_steps_per_s"])
        print(f"==> local / inline {s['local_vs_inline']:.2f}x (1-thread inline {s['local_vs_inline_1t']:.2f}x), "
              f"local / SB3 {s['local_vs_sb3']:.2f}x env steps/s")
        report["dqn_throughput"] = {"steps": args.dqn_steps, **s}

    if "t475" in only:
        print(f"DQN CartPole-v1 wall time to eval return >= 475 (eval every {args.eval_every}, 5 episodes)")
        rows = rounds_of(variants, args.t475_seeds, lambda v, seed: run_child(
            label(v)[0], "dqn", "CartPole-v1", args.t475_max, {**label(v)[1], "seed": seed}, mode="t475",
            eval_every=args.eval_every), seeded=True)
        s = summarise("dqn time to 475", rows, keys=("t475_s", "t475_with_eval_s", "t475_env_steps",
                                                     "env_steps_per_s"))
        m = s["median"]
        s["local_vs_sb3_time"] = ratio(m["local"]["t475_s"], m["sb3"]["t475_s"])
        s["reached"] = {v: sum(r.get("t475_s") is not None for r in rs) for v, rs in rows.items()}
        report["dqn_t475"] = {"max_steps": args.t475_max, "eval_every": args.eval_every, **s}

    if "ddpg" in only:
        extra = {"learning_starts": args.ddpg_learning_starts}
        print(f"DDPG Pendulum-v1, {args.ddpg_steps} env steps (learning_starts {args.ddpg_learning_starts})")
        # local-2t: the learner takes both cores (its one actor is idle ~95 % of the time here)
        rows = rounds_of(["inline", "local", "local-2t", "sb3"], args.rounds, lambda v: run_child(
            label(v)[0], "ddpg", "Pendulum-v1", args.ddpg_steps, {**label(v)[1], **extra}))
        s = summarise("ddpg throughput", rows)
        m = s["median"]
        s["local_vs_sb3"] = ratio(m["local"]["env_steps_per_s"], m["sb3"]["env_steps_per_s"])
        s["local_2t_vs_sb3"] = ratio(m["local-2t"]["env_steps_per_s"], m["sb3"]["env_steps_per_s"])
        s["local_vs_inline"] = ratio(m["local"]["env_steps_per_s"], m["inline"]["env_steps_per_s"])
        print(f"==> DDPG local / SB3 {s['local_vs_sb3']:.2f}x (2 learner threads {s['local_2t_vs_sb3']:.2f}x), "
              f"local / inline {s['local_vs_inline']:.2f}x")
        report["ddpg_throughput"] = {"steps": args.ddpg_steps, "extra": extra, **s}

    if "sweep" in only:
        print(f"local: env steps/s against actors, {args.sweep_steps} env steps")
        sweep = {"steps": args.sweep_steps, "preset_ratio": {}, "no_rate_limit": {}}
        for n in (1, 2, 3, 4):
            m = max(1, 8 // n)
            for key, extra in (("preset_ratio", {}), ("no_rate_limit", {"rate_limit": False})):
                r = run_child("hetrl", "dqn", "CartPole-v1", args.sweep_steps,
                              {"schedule": "local", "actors": n, "envs_per_actor": m, **extra})
                sweep[key][n] = r
                print(f"  actors {n} x {m} envs {key:>14}: {r['env_steps_per_s']:8.0f} env steps/s, "
                      f"{r['gradient_steps']} gradient steps, actor busy {r['local']['actor_busy_fraction']:.2f}, "
                      f"learner busy {r['local']['learner_busy_fraction']:.2f}", flush=True)
        report["sweep"] = sweep
        plot_sweep(report, out.with_suffix(".png"))

    if "ablation" in only:
        print(f"local ablation: each optimisation off in turn, DQN CartPole-v1 {args.dqn_steps} env steps")
        cases = {"all on (default)": {}, "overlap off (lockstep)": {"overlap": False},
                 "batched insert off": {"batched_insert": False}, "prefetch off": {"prefetch": False},
                 "actor BLAS threads = cores": {"actor_one_thread": False},
                 "preallocate off": {"preallocate": False}, "learner threads = 2": {"threads": 2}}
        rows = rounds_of(list(cases), args.rounds, lambda c: run_child(
            "hetrl", "dqn", "CartPole-v1", args.dqn_steps, {"schedule": "local", **cases[c]}))
        report["ablation"] = {"steps": args.dqn_steps, **summarise("ablation", rows)}

    if "pays" in only:
        cases = {"heavy env (+0.2 ms CPU per step), preset ratio": ("benchmarks.bench_local:HeavyCartPole-v1", {}),
                 "CartPole, replay ratio 1/32 (gradient_steps=8)": ("CartPole-v1", {"gradient_steps": 8})}
        report["pays"] = {"steps": args.pays_steps}
        for name, (env, extra) in cases.items():
            print(f"{name}: {args.pays_steps} env steps")
            rows = rounds_of(["inline", "local"], args.rounds, lambda v: run_child(
                "hetrl", "dqn", env, args.pays_steps, {**label(v)[1], **extra}, preset_env="CartPole-v1"))
            s = summarise(name, rows)
            s["local_vs_inline"] = ratio(s["median"]["local"]["env_steps_per_s"], s["median"]["inline"]["env_steps_per_s"])
            print(f"==> {name}: local / inline {s['local_vs_inline']:.2f}x")
            report["pays"][name] = {"env": env, "extra": extra, **s}

    report["loadavg_end"] = os.getloadavg()
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


def plot_sweep(report: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = report["sweep"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, name in (("preset_ratio", "local, preset replay ratio"), ("no_rate_limit", "local, no rate limiter")):
        pts = sorted((int(n), r["env_steps_per_s"]) for n, r in sweep[key].items())
        ax.plot([n for n, _ in pts], [v for _, v in pts], marker="o", label=name)
    thr = report.get("dqn_throughput", {}).get("median", {})
    for v, style in (("inline", "--"), ("sb3", ":")):
        if v in thr and thr[v]["env_steps_per_s"]:
            ax.axhline(thr[v]["env_steps_per_s"], linestyle=style, color="gray", label=f"{v} (preset ratio)")
    ax.set_xlabel("actor processes (8 // actors envs each)")
    ax.set_ylabel("env steps / s")
    ax.set_yscale("log")
    ax.set_xticks([1, 2, 3, 4])
    ax.set_title(f"DQN CartPole-v1, {sweep['steps']} env steps, {os.cpu_count()} cores")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
