#!/usr/bin/env python
"""A user's algorithm (tests/qrdqn_example.py: QR-DQN in plain torch, registered from outside hetrl; or
tests/c51_example.py: C51 in CleanRL's form, its target built by scatter_add_ into zeros) trained on CartPole-v1
inline on one thread, on its public kernel and on the compiled kernel derived from its learn: learning env steps/s
(env_steps_per_s_learning), runs alternating in one process.

Usage:
    python benchmarks/bench_user_algorithm.py [--algo qrdqn|c51] [--steps 8000] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    import hetrl
    import c51_example  # noqa: F401  (registers "c51")
    import qrdqn_example  # noqa: F401  (registers "qrdqn")

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", default="qrdqn", choices=["qrdqn", "c51"])
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    got: dict[str, list[float]] = {"public": [], "compiled": []}
    for r in range(a.rounds):
        for kernel in (("public", "compiled") if r % 2 == 0 else ("compiled", "public")):
            with tempfile.TemporaryDirectory() as out:
                run = hetrl.train(a.algo, "CartPole-v1", plan="none", schedule="inline", steps=a.steps, seed=r,
                                  out=out, progress=False, learner_kernel=kernel, threads=1, eval_episodes=0)
            rate = run.result.get("env_steps_per_s_learning") or run.result["env_steps_per_s"]
            got[kernel].append(rate)
            print(json.dumps({"round": r, "kernel": kernel, "env_steps_per_s_learning": round(rate, 1),
                              "compile_s": run.result.get("compile_s")}), flush=True)
    pub, comp = statistics.median(got["public"]), statistics.median(got["compiled"])
    print(json.dumps({"public": round(pub, 1), "compiled": round(comp, 1), "ratio": round(comp / pub, 2)}))


if __name__ == "__main__":
    main()
