"""Runs correct their plan: the measured rate held against the prediction while the run trains.

A planned run carries the model's prediction (env steps/s at the preset's settings). `Follower.phase()`,
called by api.Run at every phase boundary, measures the run in *windows* of about WINDOW_S seconds of
training (evaluations excluded) once learning has run WARM_S seconds: the rate (gradient steps / replay
ratio per second: the rate limiter holds the ratio, and gradient steps come more evenly than env steps),
the learner's seconds per gradient step, and the foreign load (hetrl/planner/load.py). After
WATCH_WINDOWS windows it compares the median rate with the prediction. It tries the next-best plan the run
can switch to at a phase boundary without changing what is learned (another learner thread count, where
the kernel's results do not depend on the thread count: `Kernel.threads_exact`; best first by the model)
where the run falls short by more than the model's error (MODEL_ERROR), and also where the run is within
it but the plan's prediction rested on provisional profile entries (measured under load, priced by a prior:
search.py's `rests_on_provisional`), since the plan chosen then may not be the best one. A run short of its
prediction on a quiet machine tries nothing where the model's error measured on the run itself (its rate against
the model's price of its plan), applied to the alternatives, leaves none faster than the run measures: the model
was off for every thread count alike. It runs that plan and the run's own in alternating windows (TRIAL_PAIRS of
each; a trial window running below ABORT of the plan's rate once a quarter of it has run ends the trial there,
so a plan far slower costs the run little), keeps the faster (by KEEP_MARGIN at least),
and writes what it measured at each thread count back into the profile, marked measured in a run
(profile/table.py: record_in_run; from the windows in which other processes kept no cores busy, and
provisional where there were none), so the next plan on this machine prices that workload with it.

What never changes: the schedule (the local schedule runs in phases, its actors a phase behind the learner,
so a seed's local run is not its inline run: switching between them changes what is learned; it also
costs starting the actor processes and copying the replay): it is chosen once, before the first update,
by the plan; the actors and envs, the device, anything the user set by hand (a pinned thread count stays),
and the thread count of a kernel whose results depend on it (the public torch kernel: its GEMM reductions
follow the threads). Such a run still measures and writes back. result.json records `plans_tried` (each
plan, its prediction, its measured rate and learner time, whether it was kept) and `plan_follow` (what the
follower decided and why, whether the prediction rested on provisional entries, what stays fixed); `threads`
is the count the run ended with.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

MODEL_ERROR = 0.15     # a run measured this far under its prediction is within the model's error
WARM_S = 2.0           # seconds of learning before the first window (compilation, caches, the rate limiter settling)
WINDOW_S = 2.0         # seconds of training per window
WATCH_WINDOWS = 2      # windows of the plan before it is judged
TRIAL_PAIRS = 2        # windows of the alternative, each followed by one of the plan
KEEP_MARGIN = 0.03     # the alternative is kept only where it measured this much faster
ABORT = 0.8            # a trial window running below this share of the plan's rate ends the trial at once
ABORT_AFTER = 0.25     # ... judged once this share of a window has run
MAX_TRIALS = 2         # alternatives tried per run
PAYBACK = 3.0          # a trial starts only where the run has this many trials' time left
SCHEDULE_FIXED = ("chosen once, before the first update: a seed's local run (actors a phase behind the learner) is "
                  "not its inline run, so switching would change what is learned")


@dataclass
class Window:
    threads: int
    t0: float
    grads0: int
    env0: int
    learner0: float
    calls0: int
    t1: float = 0.0
    rate: float = 0.0          # env steps/s (gradient steps / replay ratio, per second)
    grads: int = 0
    learner_s: float = 0.0
    calls: int = 0
    foreign: float | None = None
    loaded: str = ""           # why the window was measured under load ("" where not)


@dataclass
class Tried:
    """One plan the run ran, and what it measured."""

    threads: int
    predicted: float | None
    windows: list[Window] = field(default_factory=list)
    kept: bool = True

    def rate(self) -> float:
        return statistics.median(w.rate for w in self.windows) if self.windows else 0.0


class Follower:
    """See the module docstring. `core`: the run's learner core (counters, clock, thread governor, kernel);
    `plan_info`: what api.auto_plan gave the run (its plan, prediction, pins, profile path)."""

    def __init__(self, core, cfg, plan_info: dict, *, warm_s: float | None = None, window_s: float | None = None,
                 table=None, reader=None):
        from hetrl.planner.load import LoadLog

        self.core, self.cfg, self.info = core, cfg, plan_info.get("plan") or {}
        # (the module's settings read now, not when the class was defined: a test or a caller may set them)
        self.warm_s = WARM_S if warm_s is None else warm_s
        self.window_s = WINDOW_S if window_s is None else window_s
        self.log = LoadLog(reader, min_s=0.0)
        self.plan = dict(self.info.get("plan") or {})
        self.predicted = float(plan_info.get("predicted_env_steps_per_s") or 0.0)
        self.exact = bool(getattr(core.kernel, "threads_exact", False))
        self.rr = float(cfg.replay_ratio) or 1.0
        self.rests = list(self.info.get("rests_on_provisional") or [])   # provisional entries the prediction read
        self.state, self.why = "warm", "waiting for learning to start"
        self.short: bool | None = None
        self.window: Window | None = None
        self._next = 0.0
        self.queue: list[int] = []
        self.trials = 0
        self.alt: int | None = None     # the thread count under trial
        self.cause = ""                 # why the trial was started
        self._table = table
        self.tried: dict[int, Tried] = {core.governor.threads: Tried(core.governor.threads, self.predicted or None)}
        self.base = core.governor.threads
        self.stopped = False            # the last trial ended early, its first window clearly slower

    # ---- what the run can switch to --------------------------------------------------------------------
    def alternatives(self) -> list[tuple[int, float | None]]:
        """(threads, predicted env steps/s) of the plans the run may switch to, best predicted first: the other thread
        counts of a CPU learner up to the cores planned for (those a profile measures), where the user did not pin
        the threads and the kernel's results do not depend on them."""
        pins = self.info.get("pins") or {}
        if not self.exact or "threads" in pins or self.plan.get("learner_device", "cpu") != "cpu":
            return []
        table = self.table()
        cores = int(float(self.info.get("cores") or (table.cores if table is not None else os.cpu_count() or 1)))
        counts = {t for t in (1, 2, 4, 8, 16, 32, 64) if t <= cores} | {max(1, cores)}   # as the profile's grid
        out = []
        for t in sorted(counts):
            if t not in self.tried:
                out.append((t, self.predict(t)))
        return sorted(out, key=lambda x: -(x[1] or 0.0))

    def table(self):
        if self._table is None:
            path = (self.info.get("profile") or {}).get("path")
            if path:
                from hetrl.planner.profile import ProfileTable

                try:
                    self._table = ProfileTable.load(path)
                except (ValueError, KeyError, OSError):
                    self._table = False
        return self._table or None

    def predict(self, threads: int) -> float | None:
        table = self.table()
        if table is None or not self.plan:
            return None
        from hetrl.planner.model import Plan, Workload, predict

        fields = {k: self.plan[k] for k in Plan.__dataclass_fields__ if k in self.plan}
        try:
            return predict(Plan(**{**fields, "threads": threads}), table, Workload.from_config(self.cfg),
                           self.info.get("cores")).env_steps_per_s
        except (KeyError, ValueError):
            return None

    # ---- the hook ----------------------------------------------------------------------------------------
    def phase(self) -> None:
        """At a phase boundary: start or end a window, judge the plan, switch threads for a trial."""
        if self.state == "off":
            return
        now = self.core.elapsed()
        if now < self._next:
            if self.state == "trial" and self._clearly_slower(now):
                self._close(now)
                self.queue = []
                self.stopped = True
                self._decide()
                self._open(self.core.elapsed())
            return
        if self.state == "warm":
            mark = self.core.learn_mark
            if mark is None:
                return
            if now < mark[0] + self.warm_s:
                self._next = mark[0] + self.warm_s
                return
            self.state, self.why = "watch", "measuring the plan"
            self._open(now)
            return
        self._close(now)
        if self.state == "watch" and len(self.tried[self.base].windows) >= WATCH_WINDOWS:
            self._judge()
        elif self.state == "trial" and not self.queue:
            self._decide()
        if self.queue:
            self._switch(self.queue.pop(0))
        self._open(self.core.elapsed())

    def _clearly_slower(self, now: float) -> bool:
        """Whether the trial's window in progress, a quarter of it run, is clearly slower than the plan (ABORT): a
        trial of a plan far below costs the run no more than that quarter."""
        w, c = self.window, self.core.c
        if w is None or w.threads != self.alt or w.threads != self.core.governor.threads:
            return False
        dt = now - w.t0
        base = self.tried[self.base].windows
        if dt < ABORT_AFTER * self.window_s or not base:
            return False
        grads = c.gradient_steps - w.grads0
        rate = (grads / self.rr if grads else c.env_steps - w.env0) / dt
        return rate < ABORT * statistics.median(x.rate for x in base[-(TRIAL_PAIRS + 1):])

    def _open(self, now: float) -> None:
        c = self.core.c
        self.window = Window(self.core.governor.threads, now, c.gradient_steps, c.env_steps, c.learner_s, c.phases)
        self.log.start()
        self._next = now + self.window_s

    def _close(self, now: float) -> None:
        w, c = self.window, self.core.c
        if w is None:
            return
        self.window = None
        w.t1, w.grads, w.calls = now, c.gradient_steps - w.grads0, c.phases - w.calls0
        w.learner_s = c.learner_s - w.learner0
        dt = max(now - w.t0, 1e-9)
        w.rate = (w.grads / self.rr if w.grads else c.env_steps - w.env0) / dt
        load = self.log.stop()
        if load is not None:
            w.foreign = load.foreign
            w.loaded = load.short() if load.busy else ""
        if w.threads == self.core.governor.threads and w.grads:   # (a window the governor changed is not one plan's)
            self.tried.setdefault(w.threads, Tried(w.threads, self.predict(w.threads))).windows.append(w)

    def _judge(self) -> None:
        """The plan measured WATCH_WINDOWS windows: within the model's error of its prediction, or short."""
        rate = self.tried[self.base].rate()
        self.short = bool(self.predicted) and rate < self.predicted * (1 - MODEL_ERROR)
        if not self.short and self.rests:
            self._try_next(rate, f"against {self.predicted:,.0f} predicted, a prediction that rested on "
                                 f"{len(self.rests)} provisional profile entries")
            return
        if not self.short:
            self.state = "settled"
            self.why = (f"measured {rate:,.0f} env steps/s against {self.predicted:,.0f} predicted: within the model's "
                        f"error ({100 * MODEL_ERROR:.0f}%)" if self.predicted else "no prediction to hold it against")
            return
        none = self._none_faster(rate)
        if none:
            self.state, self.why = "settled", f"measured {rate:,.0f} env steps/s against {self.predicted:,.0f} " \
                                              f"predicted; {none}"
            return
        self._try_next(rate)

    def _none_faster(self, rate: float) -> str:
        """Why no other plan is worth a trial ("" where one is): on a quiet machine the model's error measured on
        this run (its rate against the model's price of the plan) holds for the other thread counts too, so an
        alternative is tried only where, corrected by it, it is still predicted faster than the run measures. Under
        foreign load the thread counts are hurt unequally (a lane waits for a descheduled one): every alternative
        is tried."""
        if any(w.loaded for w in self.tried[self.base].windows):
            return ""
        own = self.predict(self.base)
        alts = self.alternatives()
        if not own or not alts or any(p is None for _, p in alts):
            return ""
        err = rate / own
        best_t, best = alts[0]
        if best * err > rate * (1 + KEEP_MARGIN):
            return ""
        return (f"the model's error measured on this run ({100 * (err - 1):+.0f}% on a quiet machine) applied to the "
                f"other thread counts leaves none faster ({best_t} thread(s): {best * err:,.0f} env steps/s)")

    def _try_next(self, rate: float, reason: str = "") -> None:
        short = f"measured {rate:,.0f} env steps/s " + (reason or f"against {self.predicted:,.0f} predicted")
        alts = self.alternatives()
        if not alts or self.trials >= MAX_TRIALS:
            self.state = "settled"
            self.why = short + "; " + self._cannot_try()
            return
        left = (self.cfg.steps - self.core.c.env_steps) / max(rate, 1e-9)
        cost = 2 * TRIAL_PAIRS * self.window_s
        if left < PAYBACK * cost:
            self.state = "settled"
            self.why = short + f"; the run ends in about {left:.0f} s, too soon to try another plan ({cost:.0f} s)"
            return
        t, pred = alts[0]
        self.trials, self.alt, self.cause = self.trials + 1, t, short
        self.tried[t] = Tried(t, pred, kept=False)
        self.queue = [x for _ in range(TRIAL_PAIRS) for x in (t, self.base)]
        self.state = "trial"
        self.why = short + f"; trying {t} learner thread(s) in alternating windows"

    def _cannot_try(self) -> str:
        if not self.exact:
            return ("the learner kernel's results depend on its thread count, so the run keeps the threads it started "
                    "with")
        if "threads" in (self.info.get("pins") or {}):
            return "the thread count was set by hand"
        if self.plan.get("learner_device", "cpu") != "cpu":
            return "the learner is not on the CPU"
        return "no other plan the run can switch to at a phase boundary without changing what it learns"

    def _decide(self) -> None:
        """A trial's windows are in: keep the faster plan, write both back."""
        alt = self.alt
        a, b = self.tried[alt], self.tried[self.base]
        if not a.windows:   # (every window of the trial was changed by the governor under load)
            self._switch(self.base)
            self.state, self.why = "settled", self.why + f"; {alt} thread(s) could not be measured"
            return
        recent = b.windows[-(TRIAL_PAIRS + 1):]
        base_rate = statistics.median(w.rate for w in recent)
        if self.stopped:
            self.cause += f" (the trial stopped early: its first window ran under {100 * ABORT:.0f}% of the plan's rate)"
            self.stopped = False
        if a.rate() > base_rate * (1 + KEEP_MARGIN):
            a.kept, b.kept = True, False
            self.base = alt
            self.why = (f"{self.cause}; {alt} learner thread(s) measured {a.rate():,.0f} env steps/s against "
                        f"{base_rate:,.0f}: kept")
        else:
            self.why = (f"{self.cause}; {alt} learner thread(s) measured {a.rate():,.0f} env steps/s against "
                        f"{base_rate:,.0f}: not kept")
        self._switch(self.base)
        self.write_back()
        if self.base == alt and a.rate() < self.predicted * (1 - MODEL_ERROR) and self.trials < MAX_TRIALS \
                and self.alternatives():
            self._try_next(a.rate())
            if self.state == "trial":
                return
        self.state = "settled"

    def _switch(self, threads: int) -> None:
        if threads != self.core.governor.threads or threads != self.core.governor.planned:
            self.core.governor.replan(threads)

    # ---- the record --------------------------------------------------------------------------------------
    def write_back(self, run: str = "") -> list[dict]:
        """What the run measured at each thread count, into the profile it was planned from (measured in a run)."""
        path = (self.info.get("profile") or {}).get("path")
        device = self.plan.get("learner_device", "cpu")
        if not path:
            return []
        from hetrl.planner.profile import record_in_run

        entries = []
        for t, tried in self.tried.items():
            quiet = [w for w in tried.windows if not w.loaded]
            ws = quiet or tried.windows
            grads = sum(w.grads for w in ws)
            if not grads:
                continue
            e = {"threads": t, "s": sum(w.learner_s for w in ws) / grads, "gradient_steps": grads,
                 "k": grads / max(1, sum(w.calls for w in ws)), "batch": self.cfg.batch_size,
                 "schedule": self.plan.get("schedule", self.cfg.system.schedule),
                 "env_steps_per_s": statistics.median(w.rate for w in ws),
                 "foreign": max((w.foreign or 0.0) for w in ws), "run": run}
            if not quiet:
                e["provisional"] = f"measured in a run under load: {ws[-1].loaded}"
            entries.append(e)
        return record_in_run(path, device, entries, kernel=getattr(self.core.kernel, "name", None))

    def finish(self, run: str = "") -> None:
        """At the end of training: the last window closed, what was measured written back."""
        if self.state == "off":
            return
        self._close(self.core.elapsed())
        if self.state == "trial":   # the run ended inside a trial: back to the plan, judged as far as measured
            self.queue = []
            self._switch(self.base)
            self.state, self.why = "settled", self.why + "; the run ended during the trial"
        elif self.state in ("warm", "watch"):
            n = len(self.tried[self.base].windows)
            self.why = (f"the run ended before its rate could be judged ({n} of {WATCH_WINDOWS} windows of "
                        f"{self.window_s:g} s measured after {self.warm_s:g} s of learning)")
        self.write_back(run)

    def loaded(self) -> str | None:
        """Why the run's learner figures are not the machine's truth (other programs kept cores busy in most of its
        windows), else None: its calibration is then kept apart (profile/table.py: calibrate)."""
        if self.state == "off":
            return None
        ws = [w for x in self.tried.values() for w in x.windows]
        busy = [w for w in ws if w.loaded]
        if not ws or 2 * len(busy) <= len(ws):
            return None
        return f"measured in a run under load ({len(busy)} of {len(ws)} windows): {busy[-1].loaded}"

    def figures(self) -> dict:
        if self.state == "off":
            return {}
        tried = []
        for t, x in self.tried.items():
            p = {k: self.plan.get(k) for k in ("schedule", "actors", "envs_per_actor", "learner_device")}
            tried.append({"plan": {**p, "threads": t}, "predicted_env_steps_per_s": x.predicted,
                          "measured_env_steps_per_s": round(x.rate(), 2) if x.windows else None,
                          "measured_step_s": (sum(w.learner_s for w in x.windows)
                                              / max(1, sum(w.grads for w in x.windows)) if x.windows else None),
                          "windows": len(x.windows), "loaded_windows": sum(bool(w.loaded) for w in x.windows),
                          "kept": t == self.base})
        return {"plans_tried": tried,
                "plan_follow": {"state": self.state, "why": self.why, "short": self.short, "model_error": MODEL_ERROR,
                                "threads_exact": self.exact, "trials": self.trials,
                                "rested_on_provisional": len(self.rests), "schedule_fixed": SCHEDULE_FIXED}}


class _Off(Follower):
    """A run without a plan to hold it against (plan none, a population's member)."""

    def __init__(self):
        self.state = "off"


def follower(schedule, cfg, plan_info: dict | None) -> Follower:
    """The run's follower (one that does nothing where the run was not planned)."""
    core = getattr(schedule, "core", None)
    if not (plan_info or {}).get("plan") or core is None or getattr(core, "governor", None) is None:
        return _Off()
    return Follower(core, cfg, plan_info)
