"""One report row per group of runs, and the report a population run writes of itself."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hetrl.errors import UsageError
from hetrl.report import stats
from hetrl.report.curves import draw, learning_curve, write_tensorboard
from hetrl.report.runs import Group, load_population

METRICS = {"final": "the evaluation of each run's policy at the end (eval_return_mean; SB3: its last evaluation)",
           "best": "each run's best evaluation during training (best_select_return_mean, else the highest "
                   "periodic evaluation)"}


def env_target(env: str | None) -> float | None:
    """The env's `reward_threshold` in its Gymnasium registration, when it has one."""
    if not env:
        return None
    try:
        import gymnasium as gym

        threshold = gym.spec(env).reward_threshold
    except Exception:  # an unregistered id, a module:Id that does not import, ...: no default target
        return None
    return float(threshold) if threshold is not None else None


def check_target(target: float | None) -> float | None:
    if target is not None and not math.isfinite(target):
        raise UsageError(f"--target {target} is not a finite return; give the score the runs should reach, "
                         "e.g. --target 475 for CartPole-v1")
    return target


def row(group: Group, metric: str = "final", target: float | None = None, curve: bool = True,
        confidence: float = stats.CONFIDENCE, n_resamples: int = stats.N_RESAMPLES, seed: int = stats.SEED) -> dict:
    """The group's scores under `metric`, their aggregates with intervals (stratified by env), the
    target the optimality gap measures against and, with `curve`, the IQM learning curve."""
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; give one of {', '.join(METRICS)}")
    by_env: dict = {}
    for m in group.members:
        s = m.score(metric)
        if s is not None:
            by_env.setdefault(m.env, []).append(s)
    envs = list(by_env) or group.envs   # the targets line up with the tasks that have scores
    if target is not None:
        targets, source = [target] * len(envs), "given"
    else:
        found = [env_target(e) for e in envs]
        ok = bool(found) and all(t is not None for t in found)
        targets = found if ok else None
        source = "reward_threshold" if ok else None
    out = {"name": group.name, "library": group.library, "env": group.env_label, "settings": group.settings,
           "metric": metric, "runs": sum(len(v) for v in by_env.values()), "members": len(group.members),
           "scores": [{"name": m.name, "score": m.score(metric)} for m in group.members],
           "target": (targets[0] if targets and len(set(targets)) == 1 else targets) if targets else None,
           "target_source": source,
           "stats": stats.aggregate([np.asarray(v) for v in by_env.values()], targets, confidence, n_resamples, seed)}
    if curve:
        out["curve"] = learning_curve(group, confidence, n_resamples, seed)
    return out


def write_population_report(pop_dir: str | Path, target: float | None = None) -> dict:
    """Read a population's members, aggregate their final and best scores per setting, draw
    `curves.png` and write the IQM curves to TensorBoard (`tb/population`). The returned dict is
    what the population's result.json keeps under "aggregate"."""
    pop_dir = Path(pop_dir)
    check_target(target)
    groups = load_population(pop_dir)
    rows = []
    for g in groups:
        final, best = row(g, "final", target), row(g, "best", target, curve=False)
        rows.append({"name": g.name, "setting": " ".join(f"{k}={v}" for k, v in g.settings.items()),
                     "settings": g.settings, "env": final["env"], "library": "hetrl", "runs": final["runs"],
                     "target": final["target"], "target_source": final["target_source"],
                     "final": final["stats"], "best": best["stats"], "curve": final["curve"]})
    members = [{"name": m.name, "seed": m.seed, "settings": m.settings, "final": m.final, "best": m.best}
               for g in groups for m in g.members]
    drawn = any(r["curve"] for r in rows)
    if drawn:
        draw(rows, pop_dir / "curves.png", title=pop_dir.name)
        write_tensorboard(rows, pop_dir / "tb" / "population")
    return {"statistics": "Agarwal et al. 2021 (rliable's definitions): IQM, mean, median, optimality gap",
            "interval": {"confidence": stats.CONFIDENCE, "method": "percentile bootstrap over runs, stratified by env",
                         "n_resamples": stats.N_RESAMPLES, "seed": stats.SEED},
            "metrics": METRICS, "members": members, "rows": rows,
            "curves_png": "curves.png" if drawn else None, "tensorboard": "tb/population" if drawn else None}
