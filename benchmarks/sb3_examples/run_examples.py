"""Stable-Baselines3's documentation examples with the algorithm imported from hetrl: a held-out check of the SB3
classes (hetrl/sb3/). Each example (this folder's other .py files, as SB3's docs write them; each file's first lines
say where it comes from and what was changed: the import, small budgets, headless rendering, an installed env) runs
in its own subprocess and working directory; the result is pass / fail / skip (a module it needs is not installed)
or, for what hetrl refuses on purpose, refused (a UsageError naming the reason).

    PYTHONPATH=$PWD python benchmarks/sb3_examples/run_examples.py            # all, one at a time
    PYTHONPATH=$PWD python benchmarks/sb3_examples/run_examples.py quickstart_a2c es_parameters --timeout 300

SB3's results_plotter (the Monitor example) needs pandas and matplotlib; LunarLander needs Box2D.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIRES = {"basic_usage_dqn_lunar": ["Box2D"], "monitoring_training_td3": ["Box2D", "pandas", "matplotlib"],
            "monitoring_training_td3_pendulum": ["pandas", "matplotlib"], "tensorboard_hparams": ["tensorboard"],
            "tensorboard_basic": ["tensorboard"], "tensorboard_more_values": ["tensorboard"],
            "progress_bar_callback": ["tqdm", "rich"]}
# what hetrl refuses with a UsageError, on purpose (docs/sb3.md says why)
REFUSED = {"dict_observations": "a Dict observation holding an image, which SB3 runs through a CNN"}


def examples() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if p.name != Path(__file__).name)


def run(name: str, timeout: float) -> dict:
    missing = [m for m in REQUIRES.get(name, []) if importlib.util.find_spec(m) is None]
    if missing:
        return {"example": name, "result": "skip", "why": f"needs {', '.join(missing)}", "seconds": 0.0}
    # headless: SDL's dummy video driver, and no SDL signal handlers (pygame, under render_mode="human", would catch
    # SIGTERM in SubprocVecEnv's workers, and the script's exit would wait for them for ever, under SB3's PPO too)
    env = {**os.environ, "MPLBACKEND": "Agg", "SDL_VIDEODRIVER": "dummy", "SDL_NO_SIGNAL_HANDLERS": "1",
           "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix=f"sb3ex-{name}-") as cwd:
        try:
            p = subprocess.run([sys.executable, str(HERE / f"{name}.py")], cwd=cwd, env=env, capture_output=True,
                               text=True, timeout=timeout)
            rc, err = p.returncode, (p.stderr or "").strip().splitlines()
        except subprocess.TimeoutExpired:
            return {"example": name, "result": "fail", "why": f"timed out after {timeout:.0f} s",
                    "seconds": round(time.time() - t0, 1)}
    last = err[-1] if err else ""
    if name in REFUSED:
        ok = rc != 0 and "UsageError" in last
        result, why = ("refused", last) if ok else ("fail", f"expected a UsageError ({REFUSED[name]}), rc={rc}: {last}")
    else:
        result, why = ("pass", "") if rc == 0 else ("fail", f"rc={rc}: {last}")
    return {"example": name, "result": result, "why": why[:300], "seconds": round(time.time() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="examples to run (default: all)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per example")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    names = args.names or examples()
    unknown = sorted(set(names) - set(examples()))
    if unknown:
        print(f"unknown examples {unknown}; they are: {', '.join(examples())}", file=sys.stderr)
        return 2
    results = []
    for name in names:
        r = run(name, args.timeout)
        results.append(r)
        print(f"{r['result']:8} {r['seconds']:7.1f} s  {name}  {r['why']}", flush=True)
    counts = {k: sum(r["result"] == k for r in results) for k in ("pass", "refused", "fail", "skip")}
    print(" ".join(f"{k} {v}" for k, v in counts.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "counts": counts}, indent=2) + "\n")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
