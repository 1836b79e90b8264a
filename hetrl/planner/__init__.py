"""The planner: profile the machine, model any placement of the protocol's parts, pick the best.

    from hetrl.config import make_config
    from hetrl.planner import plan
    result = plan(make_config("dqn", "CartPole-v1"), objective="throughput", pins={"actors": 2})
    result.plan.settings()          # Config settings: schedule, device, threads, actors x envs_per_actor = num_envs
    cfg = result.apply(cfg)         # the same, applied (validated Config)
    result.to_json()                # plan, predicted figures, runners-up, bottleneck (docs/planner.md)

Parts: profile/ (measure, one module per part of the protocol, + the cached table), model.py (the formulas), search.py (candidates, objective,
pins), power.py (RAPL / NVML / estimated watts), explain.py (tables), cli.py (`hetrl profile`,
`hetrl plan`), load.py (the machine's foreign load: entries measured under it are provisional), follow.py
(a run's measured rate held against its plan, the next-best thread count tried at a phase boundary).
"""

from __future__ import annotations

from typing import Callable, Iterable

from hetrl.planner.model import Plan, Prediction, Workload, predict
from hetrl.planner.search import OBJECTIVES, PlanResult, parse_pins, pins_from_settings, search


def plan(cfg, objective: str = "throughput", pins: dict | Iterable[str] | None = None, profile=None, *,
         cores: float | str | None = None, schedules: Iterable[str] | None = None, placement: str = "runnable",
         refresh: bool = False, quick: bool = False, progress: Callable[[str], None] | None = None,
         top: int = 5, allow_more_envs: bool = False, env=None) -> PlanResult:
    """The best plan for ``cfg`` (a hetrl Config) on this machine.

    The plan sets only config.SYSTEM_KEYS (schedule, device, threads, how cfg.num_envs envs are
    split over actors); every other setting of cfg is kept. ``profile``: a ProfileTable (default:
    the cached one for cfg, measured first if missing);
    ``pins``: plan fields fixed by the user ({"actors": 2, "learner_device": "cpu"} or
    ["actors=2", ...]); ``cores``: plan for this many cores (default: the profiled machine's;
    a fraction where other programs take part of the machine);
    ``schedules``: restrict the schedules; ``placement``: "runnable" (what this runtime runs:
    data storage with the learner on ``device``, replay manager and inference on the CPU) or "all"
    (also placements the model prices but the runtime cannot run: explained, never applied); ``quick``: profile a tiny grid if nothing
    is cached (smoke tests); ``allow_more_envs``: let the planner change the preset's num_envs for
    throughput (it changes what the agent learns; off by default). ``cores="auto"`` plans for the cores this machine gives us now
    (a probe, see load.py), useful where other programs share it."""
    pins = parse_pins(pins)  # bad pins fail before any measuring
    if objective not in OBJECTIVES:
        from hetrl.errors import UsageError

        raise UsageError(f"objective {objective!r} is unknown; choose one of: {', '.join(OBJECTIVES)}")
    if profile is None:
        from hetrl.planner.profile import load_or_profile

        profile = load_or_profile(cfg, refresh=refresh, quick=quick, progress=progress, env=env)
    fixed = _threads_fixed_now(profile)
    if cores == "auto":
        from hetrl.planner.load import available_cores

        cores = round(available_cores(), 2)
    result = search(profile, Workload.from_config(cfg, allow_more_envs), objective, pins, cores, schedules, placement,
                    top, preset_envs=cfg.num_envs)
    if fixed:
        result.notes.insert(0, fixed)
    return result


def _threads_fixed_now(table) -> str | None:
    """Where another program holds a core now (``Load.heavy``, over every reading of the quiet check: the
    provisional entries could not be measured again) and the CPU learner's kernel gives results that depend on
    its thread count (so a run keeps the threads it starts with): price the provisional learner figures as they
    were measured, under load, which is the machine a run started now meets; returns the note that says so.
    Otherwise (None) the model prices them by the quiet machine's thread scaling: a machine only somewhat busy
    (the background of a shared one, a program that just ended) is not taken for one that stays loaded, and a
    figure measured under load never decides a plan as if it were the truth."""
    load = getattr(table, "load_now", None)
    threads = table.provisional_threads("cpu") if "cpu" in table.devices else []
    if load is None or not load.busy or not load.heavy or not threads:
        return None
    from hetrl.kernels import Choice, kernel_class

    choice = (table.data.get("learner_kernel") or {}).get("cpu")
    try:
        exact = kernel_class(Choice.from_json(choice).name if choice else "public").threads_exact
    except (KeyError, ValueError):
        exact = False
    if exact:
        return None
    table.as_measured = True
    return (f"another program holds a core now ({load.why()}) and the learner kernel's results depend on its thread "
            f"count, so a run keeps the threads it starts with: the provisional {', '.join(map(str, threads))}-thread "
            "learner figures are priced as measured under load")


__all__ = ["plan", "Plan", "PlanResult", "Prediction", "Workload", "predict", "parse_pins", "pins_from_settings",
           "OBJECTIVES"]
