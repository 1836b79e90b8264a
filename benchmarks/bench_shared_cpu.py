"""A DQN run alone, then with a competing CPU-bound process started mid-run (issue 16, case 7).

    python benchmarks/bench_shared_cpu.py [--steps 30000] [--solo-s 20] [--threads 0]

Trains DQN on CartPole-v1 (--plan none, `threads` learner threads: 0 = all cores, what the
governor in hetrl/runtime/threads.py protects) and, `solo_s` seconds after learning starts, starts
another process that multiplies matrices on every core until the run ends. Env steps/s before and
after come from the run's progress.csv; prints both, their ratio (target >= 0.4), and the learner
thread figures from result.json; writes benchmarks/results/bench_shared_cpu_<case>_<date>_<machine>_<commit>.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOG = "import torch\ntorch.set_num_threads(%d)\na = torch.randn(512, 512)\nwhile True:\n    a = (a @ a).tanh()\n"


def rate(rows: list[tuple[int, float]], t0: float, t1: float) -> float:
    inside = [(s, w) for s, w in rows if t0 <= w <= t1]
    if len(inside) < 2:
        return 0.0
    return (inside[-1][0] - inside[0][0]) / (inside[-1][1] - inside[0][1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30000)
    ap.add_argument("--solo-s", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    import os

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run"
        cmd = [sys.executable, "-m", "hetrl.cli", "train", "dqn", "--env", "CartPole-v1", "--plan", "none",
               "--steps", str(args.steps), "--out", str(out), "--no-progress", "--set", f"threads={args.threads}",
               "--set", "log_interval=500", "--set", "eval_episodes=0", "--set", "learning_starts=1000"]
        run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        csv_path, hog, hog_start = out / "progress.csv", None, None
        while run.poll() is None:
            time.sleep(0.5)
            if hog is None and csv_path.exists():
                rows = list(csv.reader(csv_path.open()))[1:]
                if rows and float(rows[-1][1]) >= args.solo_s:
                    hog = subprocess.Popen([sys.executable, "-c", HOG % cores])
                    hog_start = float(rows[-1][1])
        if hog is not None:
            hog.kill()
        rows = [(int(r[0]), float(r[1])) for r in list(csv.reader(csv_path.open()))[1:]]
        result = json.loads((out / "result.json").read_text())
    if hog_start is None:
        raise SystemExit("the run ended before the competitor started: raise --steps")
    solo, shared = rate(rows, 2.0, hog_start), rate(rows, hog_start + 2.0, rows[-1][1])
    doc = {"solo_env_steps_per_s": solo, "shared_env_steps_per_s": shared, "ratio": shared / solo if solo else 0.0,
           "competitor_started_at_s": hog_start, "threads_setting": args.threads,
           "command": "python " + " ".join(sys.argv), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
           **{k: result.get(k) for k in ("learner_threads_planned", "learner_threads_min", "learner_thread_changes")}}
    print(json.dumps(doc, indent=1))
    from result_files import result_path   # benchmarks/results/<benchmark>_<case>_<date>_<machine>_<commit>.json
    result_path("bench_shared_cpu", "dqn:CartPole-v1").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
