"""Soak (issue 16): a long local run with the RSS of every process of the run sampled every 10 s.

    python benchmarks/soak.py [--steps 1000000] [--every 10] [-- extra hetrl train args]

Runs `hetrl train dqn --env CartPole-v1 --steps N --schedule local --plan none` and samples, from
/proc, the resident set size of the main process and of each of its descendants (actor processes,
the forkserver). After the warm-up (the first 20% of the samples; the replay fills up during it)
the total RSS must stay flat within 5% to the end (over the samples taken while every process
of the run is alive: the shutdown is not a drift). Writes
benchmarks/results/soak_<case>_<date>_<machine>_<commit>.json and the .png beside it (RSS of each process
and the total against time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def children(pid: int) -> list[int]:
    """Every descendant of pid, from /proc/*/stat's parent ids."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def summarise(samples: list[dict]) -> dict:
    """Drift of the total RSS after the warm-up (the first 20% of the samples), over the samples
    taken while every process of the run was alive (the run's shutdown, where actors exit one by
    one, is not a change of the steady state)."""
    steady = max((len(s["rss_mb"]) for s in samples), default=0)
    totals = [s["total_mb"] for s in samples]
    warm = max(1, len(totals) // 5)
    after = [s["total_mb"] for s in samples[warm:] if len(s["rss_mb"]) == steady] or totals
    drift = (max(after) - min(after)) / min(after) if after and min(after) else None
    return {"warmup_samples": warm, "steady_processes": steady,
            "rss_after_warmup_mb": {"min": min(after), "max": max(after), "first": after[0], "last": after[-1]},
            "drift_after_warmup": drift, "target": "drift <= 0.05"}


def write(result: dict, out: Path, steps: int) -> None:
    """The JSON and its plot (RSS of each process and the total against time)."""
    samples, drift = result["samples"], result["drift_after_warmup"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([s["t"] for s in samples], [s["total_mb"] for s in samples], label="total", lw=2)
        for key in sorted({k for s in samples for k in s["rss_mb"]}):
            pts = [(s["t"], s["rss_mb"][key]) for s in samples if key in s["rss_mb"]]
            ax.plot(*zip(*pts), lw=1, label=key)
        ax.set_xlabel("s")
        ax.set_ylabel("RSS (MB)")
        ax.set_title(f"soak: {steps:,} env steps, drift after warm-up {drift:.1%}" if drift is not None else "soak")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=110)
    except ImportError:
        pass
    rss = result["rss_after_warmup_mb"]
    print(f"soak: exit {result['exit']}, RSS after warm-up {rss['min']:.0f}-{rss['max']:.0f} MB "
          f"(drift {drift:.1%}); wrote {out}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("extra", nargs="*", help="more `hetrl train` arguments (after --)")
    ap.add_argument("--summarise", metavar="JSON", help="recompute the summary and plot of an earlier soak's JSON")
    args = ap.parse_args()
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    args.out = args.out or str(result_path("soak", "dqn:CartPole-v1"))
    if args.summarise:
        result = json.loads(Path(args.summarise).read_text())
        result.update(summarise(result["samples"]))
        write(result, Path(args.out), args.steps)
        return
    run_dir = Path(tempfile.mkdtemp(prefix="hetrl-soak-")) / "run"
    cmd = [sys.executable, "-m", "hetrl.cli", "train", "dqn", "--env", "CartPole-v1", "--steps", str(args.steps),
           "--schedule", "local", "--plan", "none", "--out", str(run_dir), "--no-progress", *args.extra]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=HERE.parent)
    samples = []
    while proc.poll() is None:
        per = {"main": rss_mb(proc.pid)}
        for c in children(proc.pid):
            r = rss_mb(c)
            if r is not None:
                per[f"pid {c}"] = r
        per = {k: v for k, v in per.items() if v is not None}
        samples.append({"t": time.time() - t0, "rss_mb": per, "total_mb": sum(per.values())})
        print(f"soak: {samples[-1]['t']:7.0f} s  total RSS {samples[-1]['total_mb']:8.1f} MB  "
              f"({len(per)} processes)", file=sys.stderr, flush=True)
        time.sleep(args.every)
    rc = proc.wait()
    result = {"command": "hetrl " + " ".join(cmd[3:]), "exit": rc, "wall_s": time.time() - t0,
              "samples": samples, **summarise(samples)}
    res = run_dir / "result.json"
    if res.exists():
        r = json.loads(res.read_text())
        result["run"] = {k: r.get(k) for k in ("env_steps", "env_steps_per_s", "eval_return_mean", "wall_s",
                                               "actor_restarts", "replay_bytes")}
    write(result, Path(args.out), args.steps)



if __name__ == "__main__":
    main()
