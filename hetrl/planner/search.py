"""Search: enumerate candidate plans around the user's pins, predict each, pick the best.

Candidates: schedules x actors (1 for inline; 1 .. 2 x cores for local) x envs per actor (the
profiled widths) x learner / storage / replay / inference device (each device the profile
measured for that role; identical GPUs count once) x learner threads (the profiled counts,
CPU learner only). The preset's env count is kept: actors x envs per actor = num_envs (unless
the workload lets the planner choose it, --allow-more-envs). ``placement="runnable"`` keeps what
this runtime runs (model.runnable_reason: data storage with the learner on ``device``, replay
manager and actor inference on the CPU); ``"all"`` also prices the placements it cannot run
(modelled, not runnable: a plan of those is explained, never applied).

What a plan sets is only Config.SYSTEM_KEYS (schedule, device, threads, actors, envs_per_actor):
never a setting that changes what the agent learns.

Objectives: ``"throughput"`` maximises env steps/s at the preset's settings (its replay ratio,
batch size and env count); ``"efficiency"`` maximises env steps per joule. Plans within ``TIE``
of the best on the objective are ranked by the other figure (so a plan that is as fast with fewer watts wins).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from hetrl.config import MAX_LOCAL_ACTORS
from hetrl.errors import UsageError
from hetrl.planner.model import (SCHEDULES, Plan, Prediction, Workload, bottleneck_words, learner_group,
                                  predict, prefetches, runnable_reason)
from hetrl.planner.profile import ProfileTable
from hetrl.planner.profile.table import entry_name

OBJECTIVES = ("throughput", "efficiency")
TIE = 0.02
MAX_ACTORS = MAX_LOCAL_ACTORS   # hetrl.config.validate's limit on actor processes
SCHEMA = "hetrl-plan/1"
OBJECTIVE_MEANING = {"throughput": "env steps/s at the preset's settings (replay ratio, batch size, num_envs)",
                     "efficiency": "env steps per joule at the preset's settings (replay ratio, batch size, num_envs)"}
PRESET_OWNED_PINS = ("batch_size", "num_envs")   # the preset's: --set them, the planner never chooses them
PLAN_FIELDS = {f.name: f.type for f in dataclasses.fields(Plan) if f.name not in PRESET_OWNED_PINS}
_INT_FIELDS = ("actors", "envs_per_actor", "threads")
_DEVICE_FIELDS = ("learner_device", "storage_device", "replay_device", "actor_inference_device")


def runtime_schedules() -> tuple[str, ...]:
    """Schedules the planner prices that this build's Config accepts (inline, local; ray is
    planned as local over the cluster's CPUs by hetrl.api.auto_plan)."""
    try:
        from hetrl import config

        return tuple(s for s in config._CHOICES.get("schedule", ("inline",)) if s in SCHEDULES)
    except (ImportError, AttributeError):
        return ("inline",)


def normalize_device(value: str) -> str:
    v = str(value).strip().lower()
    if v in ("cuda", "gpu"):
        return "cuda:0"
    if v.startswith("gpu:"):
        return "cuda:" + v[4:]
    return v


def parse_pins(pairs: Iterable[str] | dict | None) -> dict[str, Any]:
    """``["actors=2", "learner_device=cpu"]`` or a dict -> typed pins; UsageError when bad."""
    if pairs is None:
        return {}
    items = pairs.items() if isinstance(pairs, dict) else []
    if not isinstance(pairs, dict):
        parsed = []
        for pair in pairs:
            if "=" not in pair:
                raise UsageError(f"--pin {pair!r} is not key=value; write e.g. --pin actors=2")
            k, v = pair.split("=", 1)
            parsed.append((k.strip(), v.strip()))
        items = parsed
    out: dict[str, Any] = {}
    for k, v in items:
        if k == "device":  # the Config name: learner + data storage
            out.update(parse_pins({"learner_device": v, "storage_device": v}))
            continue
        if k in PRESET_OWNED_PINS:
            raise UsageError(f"{k} is the preset's (it changes what the agent learns), not the planner's; "
                             f"set it with --set {k}=...")
        if k not in PLAN_FIELDS:
            close = difflib.get_close_matches(k, list(PLAN_FIELDS) + ["device"], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"unknown pin {k!r}; {hint}pinnable: {', '.join(PLAN_FIELDS)}")
        if k in _INT_FIELDS:
            try:
                iv = int(str(v).replace("_", ""))
            except ValueError:
                raise UsageError(f"pin {k}={v!r} is not an integer; e.g. --pin {k}=2") from None
            if iv < 1:
                raise UsageError(f"pin {k}={iv} must be >= 1; e.g. --pin {k}=2")
            out[k] = iv
        elif k in _DEVICE_FIELDS:
            dv = normalize_device(v)
            if dv != "cpu" and not (dv.startswith("cuda:") and dv[5:].isdigit()):
                raise UsageError(f"pin {k}={v!r} is not a device; use cpu, cuda or cuda:N")
            out[k] = dv
        else:  # schedule
            sv = str(v).strip().lower()
            if sv not in SCHEDULES:
                raise UsageError(f"pin schedule={v!r} is not plannable; choose one of: {', '.join(SCHEDULES)}")
            out[k] = sv
    return out


def pins_from_settings(settings: dict | None, schedule_default: str | None = None) -> dict[str, Any]:
    """Pins from the system settings a user set by hand (--set, --config, API keywords), so that
    `hetrl train --plan auto` searches around them: device -> learner + storage device,
    schedule, actors, envs_per_actor, threads (0 = auto: not a pin). Every other setting (num_envs
    included) is the preset's and reaches the planner through the Workload, never as a pin.
    (schedule_default: kept for callers; unused.)"""
    settings = dict(settings or {})
    pins: dict[str, Any] = {}
    if settings.get("device") not in (None, "auto"):
        pins["device"] = settings["device"]
    for key in ("schedule", "actors", "envs_per_actor", "threads"):
        if key in settings and str(settings[key]) not in ("0", ""):
            pins[key] = settings[key]
    return parse_pins(pins)


_ROLE_NAMES = {"learn": "learner", "ds_insert": "data storage", "rm_sample": "replay manager",
               "rm_uniform": "replay manager", "infer": "inference"}


def _role_devices(table: ProfileTable, section: str, pinned: str | None) -> list[str]:
    devs = [d for d in table.devices if table.has(section, d)]
    if pinned is not None:
        if pinned not in devs:
            raise UsageError(f"the profile has no {_ROLE_NAMES[section]} measurements on {pinned} (it can run on: "
                             f"{', '.join(devs)}); pin one of those")
        return [pinned]
    seen, out = set(), []
    for d in devs:  # identical GPUs are interchangeable for one learner: keep the first
        name = table.device_name(d) if d != "cpu" else "cpu"
        if name not in seen:
            seen.add(name)
            out.append(d)
    return out


def candidates(table: ProfileTable, work: Workload, cores: int, pins: dict | None = None,
               schedules: Iterable[str] | None = None, placement: str = "runnable") -> list[Plan]:
    pins = dict(pins or {})
    runnable = placement == "runnable"
    scheds = list(schedules) if schedules is not None else list(runtime_schedules())
    if "schedule" in pins:
        scheds = [pins["schedule"]]
    for key in _DEVICE_FIELDS:
        if key in pins and pins[key] not in table.devices:
            raise UsageError(f"pin {key}={pins[key]} but the profile of this machine has no {pins[key]} "
                             f"(devices: {', '.join(table.devices)}); pin one of those or drop the pin")
    if runnable:  # the rule of model.runnable_reason, on the pins before any search
        probe = Plan(learner_device=pins.get("learner_device", pins.get("storage_device", "cpu")),
                     storage_device=pins.get("storage_device", pins.get("learner_device", "cpu")),
                     replay_device=pins.get("replay_device", "cpu"),
                     actor_inference_device=pins.get("actor_inference_device", "cpu"))
        why = runnable_reason(probe)
        if why:
            raise UsageError(f"the pins ask for {why}, which this runtime cannot run; pin device=... for learner "
                             "and data storage together and leave replay and inference on the CPU, or plan with "
                             "--all-placements to see its prediction (modelled, not runnable)")
    learners = _role_devices(table, "learn", pins.get("learner_device"))
    storages = _role_devices(table, "ds_insert", pins.get("storage_device"))
    replays = _role_devices(table, "rm_sample" if work.prioritized else "rm_uniform", pins.get("replay_device"))
    infers = _role_devices(table, "infer", pins.get("actor_inference_device"))
    if runnable:
        replays, infers = ["cpu"], ["cpu"]
    widths = [pins["envs_per_actor"]] if "envs_per_actor" in pins else table.widths
    out = []
    for sched in scheds:
        if sched == "inline":
            if pins.get("actors", 1) != 1:
                if len(scheds) == 1:
                    raise UsageError(f"actors={pins['actors']} needs schedule=local (inline runs one actor); "
                                     "pin schedule=local or drop the actors pin")
                continue
            actor_counts = [1]
        else:
            actor_counts = [pins["actors"]] if "actors" in pins else list(range(1, min(MAX_ACTORS, 2 * cores) + 1))
        for L, DS, RM, INF in itertools.product(learners, storages, replays, infers):
            if runnable and DS != L:   # data storage lives with the learner on `device`
                continue
            if "threads" in pins:
                thread_counts = [pins["threads"]]
            elif L == "cpu":
                thread_counts = [t for t in table.learner_threads("cpu") if t <= cores] or [1]
            else:
                thread_counts = [1]
            for N, w, t in itertools.product(actor_counts, widths, thread_counts):
                if work.num_envs:  # the preset's env count is kept: the planner only splits it over actors
                    if work.num_envs % N or ("envs_per_actor" in pins and pins["envs_per_actor"] * N != work.num_envs):
                        continue
                    w = work.num_envs // N
                out.append(Plan(sched, N, w, L, DS, RM, INF, work.batch_size, t))
    out = list(dict.fromkeys(out))
    if not out:
        if work.num_envs:
            raise UsageError(f"no plan satisfies the pins with the preset's num_envs={work.num_envs} (actors x "
                             "envs_per_actor must equal it); drop a pin, or let the planner change the env count "
                             "with --allow-more-envs")
        raise UsageError("no plan satisfies the pins; drop a pin")
    return out


def _score(pred: Prediction, objective: str) -> tuple[float, float]:
    if objective == "throughput":
        return pred.env_steps_per_s, pred.steps_per_joule
    return pred.steps_per_joule, pred.env_steps_per_s


def rank(preds: list[Prediction], objective: str) -> list[Prediction]:
    """Best first: by the objective; among plans within TIE of the best on it, by the other figure."""
    preds = sorted(preds, key=lambda p: _score(p, objective), reverse=True)
    if not preds:
        return preds
    best = _score(preds[0], objective)[0]
    near = [p for p in preds if _score(p, objective)[0] >= best * (1 - TIE)]
    near.sort(key=lambda p: (_score(p, objective)[1], _score(p, objective)[0]), reverse=True)
    return near + preds[len(near):]


def distinct(ranked: list[Prediction], objective: str, top: int, same_within: float = 0.005) -> list[Prediction]:
    """Runners-up worth showing: a plan is left out when one already shown has the same schedule,
    devices and threads and (nearly) the same figure on the objective (e.g. 3 vs 4 actors of a
    learner-bound plan)."""
    shown = ranked[:1]
    out = []
    for p in ranked[1:]:
        if len(out) >= top:
            break
        key = (p.plan.schedule, p.plan.learner_device, p.plan.storage_device, p.plan.replay_device,
               p.plan.actor_inference_device, p.plan.threads)
        v = _score(p, objective)[0]
        if any(key == (q.plan.schedule, q.plan.learner_device, q.plan.storage_device, q.plan.replay_device,
                       q.plan.actor_inference_device, q.plan.threads)
               and abs(v - _score(q, objective)[0]) <= same_within * max(v, 1e-12) for q in shown):
            continue
        shown.append(p)
        out.append(p)
    return out


def backend_at(backend: dict, width: int) -> dict:
    """The profile's env-backend timings and choice at `width` envs (profile format 12: `widths`), or its
    single choice where the profile timed one width only (a backend set by hand)."""
    return backend.get("widths", {}).get(str(width), backend)


@dataclass
class PlanResult:
    plan: Plan
    prediction: Prediction
    runners_up: list[Prediction]
    bottleneck: str
    objective: str
    cores: float
    workload: Workload
    pins: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    candidates: int = 0
    profile: dict = field(default_factory=dict)
    algo: str = ""
    env: str = ""
    preset_envs: int = 0             # the preset's num_envs (the plan keeps it unless allowed more envs)
    provisional: list = field(default_factory=list)   # the profile's provisional entries: {entry, name, why}
    rests_on: list = field(default_factory=list)      # the provisional entries the chosen plan's prediction read

    @property
    def learning_changes(self) -> dict:
        """Preset-owned settings the plan changes, {key: [preset's, plan's]}: empty unless the
        planner was allowed more envs (--allow-more-envs) and took them."""
        n = self.plan.num_envs
        return {"num_envs": [self.preset_envs, n]} if self.preset_envs and n != self.preset_envs else {}

    @property
    def objective_meaning(self) -> str:
        if self.workload.num_envs:
            return OBJECTIVE_MEANING[self.objective]
        return OBJECTIVE_MEANING[self.objective].replace(", num_envs)", "; num_envs the planner's: --allow-more-envs)")

    # the figures named in the API
    @property
    def kernel(self) -> dict:
        """The learner kernel the profile chose for the plan's learner device (hetrl/kernels/select.py, a
        Choice as JSON; the run's core finds the same choice in the machine's kernel cache)."""
        return (self.profile.get("learner_kernel") or {}).get(self.plan.learner_device) or {}

    @property
    def prefetch(self) -> bool:
        """Whether the plan's learner loop draws the next group in a prefetch thread: allowed by the
        settings and measured faster than the draw in line for its learner device (profile)."""
        return bool(self.profile.get("prefetch", {}).get("on", False))

    @property
    def env_backend(self) -> str:
        """The env backend the profile measured (and chose, for env_backend=auto, at the plan's envs per actor):
        gymnasium or envpool."""
        return backend_at(self.profile.get("env_backend") or {}, self.plan.envs_per_actor).get("chosen", "gymnasium")

    @property
    def predicted_env_steps_per_s(self) -> float:
        return self.prediction.env_steps_per_s

    @property
    def predicted_train_samples_per_s(self) -> float:
        return self.prediction.train_samples_per_s

    @property
    def busy(self) -> dict[str, float]:
        return self.prediction.busy

    @property
    def watts(self) -> float:
        return self.prediction.watts

    @property
    def steps_per_joule(self) -> float:
        return self.prediction.steps_per_joule

    @property
    def power_source(self) -> str:
        return self.prediction.power_source

    def system_settings(self, cfg, pinned=()) -> dict:
        """Every system setting (config.SYSTEM_KEYS) this plan sets on ``cfg``: the placement (schedule,
        device, threads, actors x envs_per_actor), the env backend measured faster (where cfg's is auto) and the
        learner loop's prefetch thread (schedules that have one; unless ``pinned`` by the user). The one place
        a planner setting is added; the learner kernel is chosen by the run itself from the same measurements
        (hetrl/kernels/select.py), so cfg.system.learner_kernel stays as the user set it."""
        out = dict(self.plan.settings())
        if cfg.system.env_backend == "auto":
            out["env_backend"] = self.env_backend
        if self.plan.schedule != "inline" and "prefetch" not in pinned:
            out["prefetch"] = self.prefetch
        return out

    def apply(self, cfg, pinned=()):
        """``cfg`` with this plan's system settings (a new, validated Config). A plan this runtime cannot
        run (``placement="all"``: modelled, not runnable) is a UsageError."""
        why = runnable_reason(self.plan)
        if why:
            raise UsageError(f"the plan puts {why}: modelled, not runnable; plan without --all-placements "
                             "(placement='runnable') to get one this runtime runs")
        new = cfg.replace(**self.system_settings(cfg, pinned))
        new.validate()
        return new

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "algo": self.algo, "env": self.env, "objective": self.objective,
            "objective_meaning": self.objective_meaning, "preset_envs": self.preset_envs,
            "learning_changes": self.learning_changes, "cores": self.cores,
            "replay_ratio": self.workload.replay_ratio, "prioritized": self.workload.prioritized,
            "plan": self.plan.to_json(), "settings": self.plan.settings(),
            "predicted": self.prediction.to_json(), "bottleneck": self.bottleneck,
            "runners_up": [{"plan": p.plan.to_json(), "predicted": p.to_json()} for p in self.runners_up],
            "pins": self.pins, "notes": self.notes, "candidates": self.candidates, "profile": self.profile,
            "provisional": self.provisional, "rests_on_provisional": self.rests_on,
        }


def search(table: ProfileTable, work: Workload, objective: str = "throughput", pins: dict | None = None,
           cores: float | None = None, schedules: Iterable[str] | None = None, placement: str = "runnable",
           top: int = 5, preset_envs: int | None = None) -> PlanResult:
    """The best plan. work.num_envs > 0 keeps the preset's env count (the default); 0 lets the
    planner choose it (opt-in), and then a note says the learning dynamics change (preset_envs:
    the count the preset had)."""
    preset_envs = preset_envs or work.num_envs
    if objective not in OBJECTIVES:
        raise UsageError(f"objective {objective!r} is unknown; choose one of: {', '.join(OBJECTIVES)}")
    if placement not in ("runnable", "all"):
        raise UsageError(f"placement {placement!r} is unknown; choose runnable or all")
    cores = float(cores or table.cores)
    if cores <= 0:
        raise UsageError(f"cores must be > 0, got {cores:g}")
    whole = max(1, math.ceil(cores - 1e-9))   # for counting candidates (actors, threads)
    pins = parse_pins(pins)
    plans = candidates(table, work, whole, pins, schedules, placement)
    ranked = rank([predict(p, table, work, cores) for p in plans], objective)
    best = ranked[0]
    notes = []
    why = runnable_reason(best.plan)
    if why:
        notes.append(f"modelled, not runnable: the chosen plan puts {why}; `hetrl plan` without --all-placements "
                     "shows the best plan this runtime runs")
    total = best.plan.num_envs
    if not work.num_envs and total != preset_envs:
        notes.append(f"the planner changed num_envs from the preset's {preset_envs} to {total} (--allow-more-envs): "
                     "the learning dynamics change (exploration, data correlation, episodes per env)")
    if cores != table.cores:
        notes.append(f"planned for {cores:g} cores (the profiled machine has {table.cores})")
    if best.power_source != "measured":
        notes.append(f"power is {best.power_source} (no RAPL/NVML reading for every device used): "
                     "see hetrl/planner/power.py for the table")
    for (dev, t), (ratio, source) in sorted(table.substitutions().items()):
        notes.append(f"the profile's {t}-thread learner figures on {dev} were measured under load (provisional): "
                     f"priced as the 1-thread figure x {ratio:.2f}, the thread scaling {source}")
    provisional = [{"entry": "/".join(path), "name": entry_name(path), "why": why}
                   for path, why in table.provisional_entries()]
    if provisional:
        notes.append(f"{len(provisional)} profile entries are provisional (measured under load, or not settled): "
                     "measured again when the machine is next quiet")
    _, rests = table.read_by(lambda: predict(best.plan, table, work, cores))
    rests = ["/".join(p) for p in rests]
    if rests:
        notes.append(f"the chosen plan's prediction rests on {len(rests)} provisional entries: a run that may change "
                     "its thread count measures the next-best one too and keeps the faster")
    prefetch_on = prefetches(best.plan, table, work, cores)
    return PlanResult(best.plan, best, distinct(ranked, objective, top), bottleneck_words(best, cores), objective,
                      cores, work,
                      pins, notes, len(plans),
                      {"path": str(table.path) if table.path else None, "from_cache": table.from_cache,
                       "machine_id": table.data.get("machine_id"), "created": table.data.get("created"),
                       "profile_s": table.data.get("profile_s"),
                       "learner_kernel": table.data.get("learner_kernel", {}),
                       "env_backend": table.data.get("env_backend", {}),
                       "prefetch": {**table.prefetch(best.plan.learner_device, work.prioritized,
                                                     learner_group(best.plan, work)),
                                    "on": prefetch_on,
                                    "no_core": not prefetch_on and prefetches(best.plan, table, work, float("inf"))},
                       # the learner figure the prediction used: profiled x the last run's factor
                       "learner_calibration": table.calibration(best.plan.learner_device),
                       "provisional": len(provisional), "load": table.data.get("load"),
                       "load_now": table.load_now.to_json() if table.load_now is not None else None,
                       "remeasured": table.remeasured},
                      table.key.get("algo", ""), table.key.get("env", ""), preset_envs or 0, provisional, rests)
