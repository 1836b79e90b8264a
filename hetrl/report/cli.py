"""`hetrl report RUN_DIR [RUN_DIR ...]`: many runs side by side, with the statistics of
Agarwal et al. (2021), and their learning curves (wired into hetrl/cli.py through `register`).

Each argument is a group: a hetrl run or an SB3 EvalCallback log is a group of one; a
population gives one group per setting; a quoted glob ('sb3/seed*') pools the runs it matches.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hetrl.errors import UsageError

EPILOG = """examples:
  hetrl report runs/dqn-cartpole                       # a population: one row per setting
  hetrl report runs/dqn-cartpole 'sb3/dqn-cartpole-s*' --out cartpole.png   # hetrl vs SB3 seeds
  hetrl report 'runs/dqn-CartPole-v1-s*' --metric best --target 500
"""

COLUMNS = ("name", "library", "env", "runs", "IQM [CI]", "mean [CI]", "median [CI]", "optimality gap [CI]")


def register(subparsers) -> None:
    import argparse

    p = subparsers.add_parser(
        "report", help="tables and learning curves of many runs (IQM, mean, median, optimality gap, 95%% CIs)",
        description="One row per group of runs: IQM, mean, median and optimality gap of their scores with "
                    "95% stratified bootstrap confidence intervals (Agarwal et al. 2021); their IQM learning "
                    "curves side by side. See docs/population.md.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="a hetrl run or population directory, an SB3 EvalCallback log directory "
                        "(evaluations.npz), or a quoted glob of runs or logs pooled as one group")
    p.add_argument("--target", type=float, default=None, metavar="X",
                   help="the return the optimality gap measures against (default: the env's reward_threshold "
                        "when Gymnasium registers one, e.g. 475 for CartPole-v1)")
    p.add_argument("--metric", choices=("final", "best"), default="final",
                   help="final: the evaluation of each run's policy at the end (default); best: each run's best "
                        "evaluation during training")
    p.add_argument("--out", default="report.png", metavar="PNG", help="the learning curves' image (default report.png)")
    p.add_argument("--no-plot", action="store_true", help="print the table only")
    p.add_argument("--env", default=None, metavar="ID", help="the env of SB3 logs that do not record it (no Monitor file)")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON object instead of the table")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from hetrl.report.runs import load_runs
    from hetrl.report.summary import check_target, row

    check_target(args.target)
    out = None if args.no_plot else _check_out(Path(args.out))
    groups = [g for path in args.runs for g in load_runs(path, env=args.env)]
    rows = [row(g, args.metric, args.target, curve=out is not None) for g in groups]
    if not any(r["runs"] for r in rows):
        raise UsageError(f"no run in {' '.join(args.runs)} has a {args.metric} score; train with evaluations "
                         "(hetrl: --set eval_episodes=N; SB3: an EvalCallback)")
    if out is not None and not any(r["curve"] for r in rows):
        raise UsageError(f"no evaluations to draw in {' '.join(args.runs)} (result.json has no `evaluations`); "
                         "give --no-plot for the table alone, or train with periodic evaluations")
    if args.json:
        print(json.dumps({"metric": args.metric, "rows": rows}))
    else:
        render(rows, args.metric)
    if out is not None:
        from hetrl.report.curves import draw

        draw(rows, out)
        n = sum(1 for r in rows if r["curve"])
        print(f"hetrl: drew {n} learning curve{'s' if n != 1 else ''} into {out}", file=sys.stderr)
    return 0


def _check_out(out: Path) -> Path:
    from matplotlib.figure import Figure

    kinds = Figure().canvas.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in kinds:
        raise UsageError(f"--out {out}: matplotlib cannot write {out.suffix or 'a file without extension'}; "
                         "give a .png (or .pdf, .svg) file")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: the directory {out.parent} does not exist; create it or write elsewhere")
    return out


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 1 else f"{v:.3g}"


def cell(s: dict | None) -> str:
    if not s:
        return "-"
    ci = f"[{fmt(s['low'])}, {fmt(s['high'])}]" if s["low"] is not None else "[-]"
    return f"{fmt(s['value'])} {ci}"


def cells(r: dict) -> list[str]:
    st = r["stats"]
    runs = str(r["runs"]) if r["runs"] == r["members"] else f"{r['runs']} of {r['members']}"
    return [r["name"], r["library"], r["env"], runs,
            *(cell(st.get(k)) for k in ("iqm", "mean", "median", "optimality_gap"))]


def notes(rows: list[dict], metric: str) -> list[str]:
    from hetrl.report import stats
    from hetrl.report.summary import METRICS

    lines = [f"scores: {metric}, {METRICS[metric]}",
             f"intervals: {stats.CONFIDENCE:.0%} percentile bootstrap over runs, stratified by env "
             f"({stats.N_RESAMPLES} resamples, seed {stats.SEED}); [-]: one run, no interval"]
    targets = {}
    for r in rows:
        t = r["target"]
        key = ("given by --target" if r["target_source"] == "given" else f"{r['env']}'s reward_threshold") \
            if t is not None else "no target: the env has no reward_threshold (give --target X)"
        targets.setdefault(key, (t, []))[1].append(r["name"])
    for key, (t, names) in targets.items():
        what = f"{fmt(t) if not isinstance(t, list) else ', '.join(map(fmt, t))} ({key})" if t is not None else key
        lines.append(f"optimality gap target: {what}" + (f" for {', '.join(names)}" if len(targets) > 1 else ""))
    few = [r["name"] for r in rows if 1 < r["runs"] < 5]
    if few:
        lines.append(f"fewer than 5 runs in {', '.join(few)}: percentile intervals from so few runs are too "
                     "narrow to trust")
    missing = [r["name"] for r in rows if r["runs"] < r["members"]]
    if missing:
        lines.append(f"runs without a {metric} score are left out in {', '.join(missing)}")
    return lines


def render(rows: list[dict], metric: str, file=None) -> None:
    """The table: rich on a terminal, plain columns otherwise (pipes, files, tests)."""
    file = file or sys.stdout
    body = [cells(r) for r in rows]
    if file.isatty():
        from rich import box
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        t = Table(box=box.SIMPLE_HEAVY, title=f"hetrl report ({metric} scores)")
        for i, c in enumerate(COLUMNS):
            t.add_column(c, justify="right" if i >= 3 else "left")
        for b in body:
            t.add_row(*(Text(c) for c in b))  # names and "[-]" are text, not rich markup
        con = Console(file=file)
        con.print(t)
        for line in notes(rows, metric):
            con.print(line, style="dim", highlight=False, markup=False)
        return
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(COLUMNS)]
    for line in (COLUMNS, *body):
        print("  ".join(s.ljust(w) if i < 3 else s.rjust(w) for i, (s, w) in enumerate(zip(line, widths))).rstrip(),
              file=file)
    for line in notes(rows, metric):
        print(line, file=file)
