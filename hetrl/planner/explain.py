"""Explain: the chosen plan, its predicted figures, the runners-up and the bottleneck, as tables."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from hetrl.planner.model import Prediction
from hetrl.planner.profile import ProfileTable
from hetrl.planner.search import PlanResult, backend_at


def _est(pred: Prediction) -> str:
    return "" if pred.power_source == "measured" else f" ({pred.power_source})"


def _busy(pred: Prediction, cores: float) -> str:
    parts = []
    for dev, f in pred.busy.items():
        extra = f" = {f * cores:.1f} of {cores:g} cores" if dev == "cpu" else ""
        parts.append(f"{dev} {100 * f:.0f}%{extra}")
    return ", ".join(parts)


def _prefetch(measured: dict, on: bool) -> str:
    """The local schedule's draw of the next group: in a prefetch thread or in line, and the measurement."""
    what = "next group drawn by a prefetch thread during the update" if on else "next group drawn in line"
    if "serial_s" not in measured:
        return what
    why = ("; no core left for the thread: the actors and the learner's threads hold them all"
           if measured.get("no_core") else "")
    return (f"{what} (measured us per group of {measured['group']}: in line {measured['serial_s'] * 1e6:,.0f}, "
            f"prefetched {measured['prefetch_s'] * 1e6:,.0f}{why})")


def _kernel(choice: dict) -> list[str]:
    """The learner's kernel and why (hetrl/kernels/select.py): the first line for the table, then what was
    dropped (it differed from the public kernel here) or does not apply (which network or layer)."""
    from hetrl.kernels import Choice

    if not choice:
        return ["learner kernel: chosen by the run (not profiled)"]
    return Choice.from_json(choice).explain()


def _backend(b: dict, width: int) -> str:
    """The env backend and why: each measured one's time per env step at `width` envs (profile, env_backend=auto)."""
    at = backend_at(b, width)
    chosen = at.get("chosen", "gymnasium")
    timed = [f"{n} {at[n + '_s'] * 1e6:.0f}" for n in ("gymnasium", "envpool") if f"{n}_s" in at]
    where = f" at {width} env{'s' if width > 1 else ''}" if at is not b else ""
    return f"{chosen} envs" + (f" (fastest measured{where}, us/env step: {', '.join(timed)})" if len(timed) > 1 else "")


def render_plan(result: PlanResult, console: Console | None = None) -> None:
    con = console or Console()
    p, pred, w = result.plan, result.prediction, result.workload
    envs = result.preset_envs or p.num_envs
    con.print(f"[bold]hetrl plan[/]: {result.algo} on {result.env}, objective [bold]{result.objective}[/]: "
              f"{result.objective_meaning} ({result.cores:g} cores; the preset's num_envs {envs}, "
              f"replay ratio {w.replay_ratio:g}, batch {p.batch_size}{', prioritized' if w.prioritized else ''}; "
              f"{result.candidates} candidate plans)", soft_wrap=True)
    for key, (was, now) in result.learning_changes.items():
        con.print(f"[bold yellow]the learning dynamics change[/]: --allow-more-envs let the planner set {key} "
                  f"{now} (the preset's is {was}); the agent will not learn as the preset does", soft_wrap=True)
    prof = result.profile
    if prof.get("path"):
        how = "cached" if prof.get("from_cache") else f"measured now in {prof.get('profile_s')} s"
        con.print(f"profile: {prof['path']} ({how}, {prof.get('created')})")
    for r in prof.get("remeasured") or []:
        con.print(f"profile: {r['entries']} provisional entries measured again now (the machine was quiet); "
                  f"{r['provisional']} still provisional")
    _provisional(con, result.provisional)

    t = Table(title="chosen plan", show_header=False, title_justify="left", box=None, padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("schedule", p.schedule + ("" if p.runnable else " (modelled, not runnable)"))
    t.add_row("actors", f"{p.actors} x {p.envs_per_actor} envs (inference on {p.actor_inference_device}); "
              + _backend(prof.get("env_backend") or {}, p.envs_per_actor))
    kernel = _kernel((prof.get("learner_kernel") or {}).get(p.learner_device) or {})
    t.add_row("learner", f"{p.learner_device}, {p.threads} thread{'s' if p.threads > 1 else ''}; {kernel[0]}")
    t.add_row("data storage", p.storage_device)
    t.add_row("replay manager", p.replay_device + (f"; {_prefetch(prof.get('prefetch') or {}, result.prefetch)}"
                                                   if p.schedule != "inline" else ""))
    t.add_row("settings", " ".join(f"{k}={v}" for k, v in p.settings().items())
              + ("" if p.runnable else "  (not runnable: see the note)"))
    con.print(t)
    for line in kernel[1:]:
        con.print(line, soft_wrap=True)

    f = Table(title="predicted", show_header=False, title_justify="left", box=None, padding=(0, 2))
    f.add_column(style="bold")
    f.add_column(justify="right")
    f.add_column()
    f.add_row("env steps/s", f"{pred.env_steps_per_s:,.0f}", "")
    f.add_row("train samples/s", f"{pred.train_samples_per_s:,.0f}", f"{pred.gradient_steps_per_s:,.0f} gradient steps/s")
    f.add_row("busy", "", _busy(pred, result.cores))
    f.add_row("power", f"{pred.watts:,.0f} W", _est(pred).strip(" ()") + " " + ", ".join(
        f"{d} {v:.0f} W" for d, v in pred.power_by_device.items()))
    f.add_row("steps per joule", f"{pred.steps_per_joule:,.1f}", _est(pred).strip(" ()"))
    con.print(f)
    con.print(f"[bold]bottleneck[/]: {result.bottleneck}")

    if result.runners_up:
        shown = [pred] + result.runners_up
        # placement columns only where some plan shown puts that part apart
        extra = [(name, key) for name, key in (("DS", "storage_device"), ("RM", "replay_device"),
                                                ("infer", "actor_inference_device"))
                 if any(getattr(q.plan, key) != (q.plan.learner_device if key == "storage_device" else "cpu")
                        for q in shown)]
        r = Table(title="next best plans (* = chosen; N x W = actors x envs each)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
        cols = [("#", "right"), ("schedule", "left"), ("N x W", "right"), ("learner", "left"),
                ("thr", "right")] + [(name, "left") for name, _ in extra] + \
               [("env steps/s", "right"), ("steps/J", "right"), ("bound", "left")]
        for col, just in cols:
            r.add_column(col, justify=just, no_wrap=True, min_width=len(col))
        for i, q in enumerate(shown):
            qp = q.plan
            r.add_row("*" if i == 0 else str(i + 1), qp.schedule + ("" if qp.runnable else " (m)"),
                      f"{qp.actors} x {qp.envs_per_actor}",
                      qp.learner_device, str(qp.threads), *[getattr(qp, key) for _, key in extra],
                      f"{q.env_steps_per_s:,.0f}", f"{q.steps_per_joule:,.1f}", q.bound)
        con.print(r)
        if pred.power_source != "measured":
            con.print(f"[dim]steps/J: {pred.power_source} power[/]")
        if not all(q.plan.runnable for q in shown):
            con.print("[dim](m): modelled, not runnable by this runtime (--all-placements)[/]")
    for note in result.notes:
        if "learning dynamics" not in note:   # said above, in full
            con.print(f"[dim]note: {note}[/]")


def _provisional(con: Console, entries: list[dict]) -> None:
    """The provisional entries of a profile, a line each: which, and why it is not the machine's truth."""
    if not entries:
        return
    con.print(f"[bold]provisional profile entries[/] ({len(entries)}; not the machine's truth, measured again when it "
              "is next quiet):", soft_wrap=True)
    for e in entries:
        con.print(f"  {e['name']}: {e['why']}", soft_wrap=True, highlight=False)


def render_profile(table: ProfileTable, console: Console | None = None) -> None:
    con = console or Console()
    d = table.data
    m = d["machine"]
    src = "cached" if table.from_cache else f"measured in {d.get('profile_s')} s"
    con.print(f"[bold]hetrl profile[/]: {d['key']['algo']} on {d['key']['env']} (network {d['key']['network']}, "
              f"{d['key']['bytes_per_transition']} bytes/transition)")
    con.print(f"machine: {m['hostname']}, {m['cpu_model']}, {m['cores']} cores, torch {m['torch']}"
              f"{', GPUs: ' + ', '.join(m['gpus']) if m['gpus'] else ', no GPU'}")
    con.print(f"table: {table.path} ({src}, {d.get('created')})")
    t = Table(title="primitives (median per call; spread = interquartile range / median; "
                    "(cap) = time cap reached before the median settled)", title_justify="left")
    for col, just in (("primitive", "left"), ("device", "left"), ("size", "left"), ("median", "right"),
                      ("spread", "right")):
        t.add_column(col, justify=just)
    for row in table.summary_rows():
        t.add_row(*row)
    con.print(t)
    from hetrl.planner.profile.table import entry_name

    _provisional(con, [{"name": entry_name(path), "why": why} for path, why in table.provisional_entries()])
    pw = Table(title="power", title_justify="left")
    for col in ("device", "idle W", "busy W", "source", "note"):
        pw.add_column(col)
    for dev in table.devices:
        e = table.power(dev)
        pw.add_row(dev, f"{e.idle_w:.1f}", f"{e.busy_w:.1f}" + (" per core" if dev == "cpu" else ""),
                   e.source, e.note)
    con.print(pw)
