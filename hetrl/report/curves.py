"""Learning curves of groups of runs: the IQM over runs at each evaluation step with its
bootstrap confidence band, drawn with matplotlib and written to TensorBoard.

Runs evaluated at different env steps are interpolated (numpy.interp) onto the union of their
steps, within the span every run covers (no run's curve is extended past its first or last
evaluation). Several envs in one group are stratified as in `stats.interval`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from hetrl.report import stats
from hetrl.report.runs import Group


def learning_curve(group: Group, confidence: float = stats.CONFIDENCE, n_resamples: int = stats.N_RESAMPLES,
                   seed: int = stats.SEED) -> dict | None:
    """{"env_steps", "iqm", "ci_low", "ci_high" (lists; None where there is no interval), "runs"}
    over the members that were evaluated during training; None when none was."""
    members = [m for m in group.members if m.steps.size]
    if not members:
        return None
    lo = max(m.steps[0] for m in members)
    hi = min(m.steps[-1] for m in members)
    grid = np.unique(np.concatenate([m.steps for m in members]))
    grid = grid[(grid >= lo) & (grid <= hi)]
    if grid.size == 0:  # runs whose evaluations do not overlap: their last evaluations, side by side
        grid = np.array([hi])
    by_env: dict = {}
    for m in members:
        by_env.setdefault(m.env, []).append(np.interp(grid, m.steps, m.returns))
    tasks = [np.stack(v) for v in by_env.values()]
    iqm, low, high = stats.interval(tasks, stats.statistic("iqm"), confidence, n_resamples, seed)
    return {"env_steps": [int(s) if float(s).is_integer() else float(s) for s in grid],
            "iqm": [float(v) for v in np.atleast_1d(iqm)],
            "ci_low": [float(v) if np.isfinite(v) else None for v in np.atleast_1d(low)],
            "ci_high": [float(v) if np.isfinite(v) else None for v in np.atleast_1d(high)],
            "runs": len(members)}


def draw(rows: list[dict], path: str | Path, title: str | None = None) -> Path:
    """Draw each row's curve (a dict with name, env, runs, curve, target) into `path`: one panel per
    env, side by side; rows of an unknown env join the panel of the only known env."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = [r for r in rows if r.get("curve")]
    known = sorted({r["env"] for r in rows if r["env"] != "?"})
    panels: dict[str, list[dict]] = {}
    for r in rows:
        env = known[0] if r["env"] == "?" and len(known) == 1 else r["env"]
        panels.setdefault(env, []).append(r)
    fig = Figure(figsize=(5.5 * len(panels), 4.0), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (env, group_rows) in zip(axes, panels.items()):
        targets = set()
        for r in group_rows:
            c = r["curve"]
            x = np.asarray(c["env_steps"], dtype=float)
            line, = ax.plot(x, c["iqm"], marker="o" if x.size == 1 else None,
                            label=f"{r['name']} ({r['library']}, {c['runs']} run{'s' if c['runs'] != 1 else ''})")
            low = np.array([np.nan if v is None else v for v in c["ci_low"]], dtype=float)
            high = np.array([np.nan if v is None else v for v in c["ci_high"]], dtype=float)
            if np.isfinite(low).any():
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            if r.get("target") is not None:
                targets.add(r["target"])
        for t in sorted(targets):
            ax.axhline(t, color="0.4", linestyle="--", linewidth=1, label=f"target {t:g}")
        ax.set_title(env if env != "?" else "env not recorded")
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"return (IQM over runs, {stats.CONFIDENCE:.0%} CI)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def write_tensorboard(rows: list[dict], logdir: str | Path) -> list[Path]:
    """Scalars iqm, ci_low and ci_high at each evaluation step: into `logdir` for a single row,
    else one subdirectory per row (TensorBoard draws them as runs, one over the other)."""
    from torch.utils.tensorboard import SummaryWriter

    rows = [r for r in rows if r.get("curve")]
    written = []
    for r in rows:
        d = Path(logdir) if len(rows) == 1 else Path(logdir) / _safe(r.get("setting") or r["name"])
        w = SummaryWriter(str(d))
        try:
            c = r["curve"]
            for i, step in enumerate(c["env_steps"]):
                for tag in ("iqm", "ci_low", "ci_high"):
                    v = c[tag][i]
                    if v is not None:
                        w.add_scalar(tag, v, int(step))
        finally:
            w.close()
        written.append(d)
    return written


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name).strip("_") or "row"
