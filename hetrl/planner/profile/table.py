"""The profile table: what a profile measured, read by the planner's model; where it is cached;
the sizes a run needs measured; the last run's correction (calibrate); what runs measured of the learner
(record_in_run); which entries are provisional and how the model prices them.

The document (JSON, docs/planner.md) holds one section per primitive, each a map from size (or
device, thread count) to a :class:`~hetrl.planner.measure.Timing`; the sections are listed in
hetrl/planner/profile/__init__.py. It is cached one file per machine (hostname, CPU model, cores,
torch version, GPU names) and per (algorithm, env, network) in :func:`cache_dir`, re-used while it
covers the sizes the run needs.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import time
from pathlib import Path

from hetrl.planner.measure import Timing
from hetrl.runtime.layout import grads_per_phase, group_size, learns_rollouts, prefetch_fits  # the runtime's phase and group sizes

FORMAT = "hetrl-profile/15"   # 15: actors step through SyncVector, with leaner acting (tables of 14 timed slower actors)
SECTIONS = ("env", "act", "infer", "learn", "learn_grouped", "param_sync", "ds_insert", "ds_gather", "prefetch",
            "rm_insert", "rm_sample", "rm_uniform", "rm_update", "transfer", "loop")   # the measured sections
# A t-thread learner figure measured under load is priced as the 1-thread figure x this time ratio where no
# quiet measurement of this machine gives one: two threads ~1.3x faster, as quiet 2-core x86 VMs measured
# (docs/planner.md); the run that follows the plan measures the truth and writes it back
DEFAULT_THREAD_TIME = {1: 1.0}


def default_thread_time(t: int) -> float:
    """The prior time ratio of a t-thread learner to a 1-thread one: 1 / (1 + 0.3 (t - 1))."""
    return DEFAULT_THREAD_TIME.get(t, 1.0 / (1.0 + 0.3 * (t - 1)))
DEFAULT_WIDTHS = (1, 2, 4, 8, 16)
QUICK_WIDTHS = (1, 2)


# --- where the table lives (this machine: hetrl/machine.py) ----------------------------------------
from hetrl.machine import cache_dir, machine_id, machine_info, present_devices  # noqa: E402,F401


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", s).strip("_")


def network_key(cfg) -> str:
    key = "x".join(str(h) for h in cfg.net_arch)
    if cfg.qf_arch:   # critics of their own width: another learner to time
        key += "-qf" + "x".join(str(h) for h in cfg.qf_arch)
    key += f"-stack{cfg.frame_stack}" if cfg.frame_stack > 1 else ""   # another input (and CNN) shape
    key += f"-{cfg.activation}" if cfg.activation != "relu" else ""
    key += "-ln" if cfg.layer_norm else ""
    from hetrl import registry

    for name in getattr(registry.get(cfg.algo), "shape_settings", ()):   # the algorithm's own (DQN: dueling)
        value = cfg.get(name)
        key += (f"-{name}" if value else "") if isinstance(value, bool) else f"-{name}{value}"
    return key


def cache_path(cfg, machine: dict | None = None) -> Path:
    machine = machine or machine_info()
    backend = "" if cfg.system.env_backend == "auto" else f"-{cfg.system.env_backend}"   # auto: the profile measured both
    return cache_dir() / f"profile-{cfg.algo}-{_slug(cfg.env)}-{network_key(cfg)}{backend}-{machine_id(machine)}.json"


# --- sizes to measure ------------------------------------------------------------------------
def grid_for(cfg, quick: bool = False, cores: int | None = None) -> dict:
    """The sizes a plan for ``cfg`` needs. ``quick``: a tiny grid (tests)."""
    cores = cores or os.cpu_count() or 1
    B = cfg.batch_size
    widths = sorted(set(QUICK_WIDTHS if quick else DEFAULT_WIDTHS) | ({cfg.num_envs} if not quick else set()))
    threads = sorted({1} | ({t for t in (2, 4, 8, 16, 32, 64) if t <= cores} | {cores} if not quick else set()))
    batches = [B] if quick else sorted({max(1, B // 2), B, 2 * B})
    g = grads_per_phase(cfg)
    k_groups = sorted({k for k in (min(g, 32, 65536 // B), min(g, 65536 // B)) if k > 1})
    samples = sorted(set(batches) | {min(g * B, 65536), min(g, 32) * B})  # inline / local groups
    inserts = sorted({1, 16, 256} | ({cfg.train_freq} if cfg.train_freq <= 4096 else set()))
    if quick:
        inserts = sorted({16, min(cfg.train_freq, 256)})
    # the local schedule's learner loops whose prefetch thread is timed: uniform replay's group, and
    # prioritized replay's where its priority lag leaves room for a prefetch (exact PER never prefetches)
    prefetch = [prefetch_key(False, group_size(g, False))]
    per_group = group_size(g, True, cfg.priority_lag)
    if prefetch_fits(per_group, True, cfg.priority_lag):
        prefetch.append(prefetch_key(True, per_group))
    # the inline loop timed whole per thread count (profile/loop.py): off-policy, and not in a quick profile (tests)
    loop = threads if not quick else []
    if learns_rollouts(cfg):   # on-policy: no prefetch (a rollout is learned in the learner core's phase)
        prefetch, loop = [], []
    return {"widths": widths, "threads": threads, "batches": batches, "samples": samples,
            "inserts": inserts, "k_groups": k_groups[:1] if quick else k_groups, "prefetch": prefetch,
            "loop": loop}


def prefetch_key(prioritized: bool, group: int) -> str:
    """The profile's name of a learner loop whose prefetch thread is timed: 'uniform:32', 'prioritized:1'."""
    return f"{'prioritized' if prioritized else 'uniform'}:{group}"


def _covers(have: dict, need: dict) -> bool:
    for k, v in need.items():
        h = have.get(k)
        if isinstance(v, list):   # (an empty list asks for nothing)
            if v and (not isinstance(h, list) or not set(v) <= set(h)):
                return False
        elif h != v:
            return False
    return True


# --- the table -------------------------------------------------------------------------------
def _interp(points: dict, x: float) -> float:
    """Piecewise-linear in x through the measured points, affine extrapolation outside
    (slope >= 0; never below 0). A call on more items is never cheaper: the points are made
    non-decreasing first (a running max), which irons out measurement noise."""
    if not points:
        raise KeyError("no measurements")
    xs = sorted(points)
    ys = []
    for k in xs:
        ys.append(max(points[k], ys[-1]) if ys else points[k])
    if x in points:
        return ys[xs.index(x)]
    if len(xs) == 1:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    if i == 0:
        lo, hi = 0, 1
    elif i >= len(xs):
        lo, hi = len(xs) - 2, len(xs) - 1
    else:
        lo, hi = i - 1, i
    slope = max(0.0, (ys[hi] - ys[lo]) / (xs[hi] - xs[lo]))
    return max(0.0, ys[lo] + slope * (x - xs[lo])) if i else max(0.0, ys[0] - slope * (xs[0] - x))


def _median_ratio(data: dict, device: str, t: int) -> float | None:
    """The median of a profile's quiet t-thread / 1-thread learner time ratios (single and grouped steps, every
    size where neither figure is provisional); None where there is none."""
    import statistics

    ratios = []
    for section in ("learn", "learn_grouped"):
        by_t = (data.get(section) or {}).get(device) or {}
        one, many = by_t.get("1") or {}, by_t.get(str(t)) or {}
        for size, e in many.items():
            o = one.get(size)
            if o is None or any(isinstance(x, dict) and x.get("provisional") for x in (e, o)):
                continue
            e_s, o_s = Timing.from_json(e).s, Timing.from_json(o).s
            if o_s > 0:
                ratios.append(e_s / o_s)
    return statistics.median(ratios) if ratios else None


class ProfileTable:
    """The profiled figures with the accessors the model uses (all in seconds).

    ``data`` is the JSON document (see docs/planner.md); sizes are string keys there."""

    def __init__(self, data: dict, path: Path | None = None, from_cache: bool = False):
        self.data, self.path, self.from_cache = data, path, from_cache
        self._scaling: dict = {}     # (device, t) -> (ratio, source), computed once
        self._used: dict = {}        # the scalings the model used (substitutions())
        self.load_now = None         # the foreign load when the cache was read (profile.load_or_profile)
        self.as_measured = False     # price provisional learner figures as measured (not by the thread scaling)
        self.remeasured: list = []   # entries re-measured when this table was read
        self.read: set | None = None  # while a set: the provisional entries the model reads are added to it (read_by)

    # -- identity
    @property
    def devices(self) -> list[str]:
        return list(self.data["devices"])

    @property
    def cores(self) -> int:
        return int(self.data["machine"]["cores"])

    @property
    def widths(self) -> list[int]:
        return sorted(int(w) for w in self.data["env"])

    @property
    def key(self) -> dict:
        return self.data["key"]

    @property
    def bytes_per_transition(self) -> int:
        return int(self.data["key"]["bytes_per_transition"])

    def _pts(self, section: str, *path: str) -> dict[int, float]:
        node = self.data[section]
        for p in path:
            node = node[p]
        if self.read is not None:
            self.read.update((section, *path, str(k)) for k, v in node.items()
                             if isinstance(v, dict) and v.get("provisional"))
        return {int(k): Timing.from_json(v).s for k, v in node.items()}

    def read_by(self, fn):
        """(fn(), the paths of the provisional entries it read): what a prediction rested on that is not the
        machine's truth."""
        self.read = set()
        try:
            return fn(), sorted(self.read)
        finally:
            self.read = None

    def has(self, section: str, device: str) -> bool:
        return device in self.data.get(section, {})

    # -- provisional entries
    def provisional_entries(self) -> list[tuple[tuple[str, ...], str]]:
        """(path, why) of every entry that is not the machine's truth: measured while other processes kept cores
        busy, or not settled (profile/__init__.py re-measures them when the machine is quiet)."""
        out: list[tuple[tuple[str, ...], str]] = []

        def walk(node, path):
            if not isinstance(node, dict):
                return
            if any(k in node for k in ("s", "latency_s", "serial_s")):
                if node.get("provisional"):
                    out.append((path, str(node["provisional"])))
                return
            for k, v in node.items():
                walk(v, path + (str(k),))

        for sec in SECTIONS:
            walk(self.data.get(sec), (sec,))
        return out

    def _raw(self, section: str, *path: str):
        node = self.data.get(section)
        for p in path:
            if not isinstance(node, dict) or str(p) not in node:
                return None
            node = node[str(p)]
        return node

    def provisional_threads(self, device: str = "cpu") -> list[int]:
        """The thread counts > 1 with a provisional learner figure on `device`."""
        return sorted({int(p[2]) for p, _ in self.provisional_entries()
                       if p[0] in ("learn", "learn_grouped") and p[1] == device and int(p[2]) > 1})

    def thread_scaling(self, device: str, t: int) -> tuple[float, str]:
        """(time ratio of a t-thread learner to a 1-thread one on a quiet machine, where it comes from): this
        profile's figures measured in runs, else its own quiet t-thread entries (other batch sizes or groups),
        else the quiet entries of other profiles of this machine whose learner costs about as much (within 2x),
        else the prior default_thread_time(t)."""
        key = (device, t)
        if key in self._scaling:
            return self._scaling[key]
        got = self._in_run_ratio(device, t)
        if got is None:
            got = _median_ratio(self.data, device, t)
            got = (got, "of this profile's quiet entries") if got is not None else None
        if got is None:
            got = self._machine_ratio(device, t)
        if got is None:
            got = (default_thread_time(t), "assumed (no quiet measurement of this machine has one)")
        self._scaling[key] = got
        return got

    def of_kernel(self, device: str, entry: dict | None) -> bool:
        """Whether a learner figure a run wrote (in_run, calibration) is of the kernel this profile chose for
        `device`: one from a run on another kernel (pinned by hand), or from before runs recorded theirs, is not."""
        chosen = ((self.data.get("learner_kernel") or {}).get(device) or {}).get("name")
        return bool(entry) and (chosen is None or entry.get("kernel") == chosen)

    def _in_run_ratio(self, device: str, t: int) -> tuple[float, str] | None:
        for schedule, runs in sorted(((self.data.get("in_run") or {}).get("learn", {}).get(device) or {}).items()):
            a, b = runs.get(str(t)), runs.get("1")
            if a and b and not a.get("provisional") and not b.get("provisional") and a.get("batch") == b.get("batch") \
                    and self.of_kernel(device, a) and self.of_kernel(device, b) \
                    and 0.5 <= a.get("k", 1) / max(b.get("k", 1), 1e-9) <= 2 and b["s"] > 0:
                return a["s"] / b["s"], f"measured in {schedule} runs on this machine"
        return None

    def _machine_ratio(self, device: str, t: int) -> tuple[float, str] | None:
        """The median quiet t-thread ratio of the other cached profiles of this machine with a learner of about
        this one's cost (1-thread step within 2x at their batch size)."""
        mine = self._raw("learn", device, "1", str(self.key.get("batch_size")))
        if not self.path or not isinstance(mine, dict):
            return None
        ratios = []
        for other in sorted(Path(self.path).parent.glob(f"profile-*-{self.data.get('machine_id')}.json")):
            if other == Path(self.path):
                continue
            try:
                data = json.loads(other.read_text())
            except (OSError, ValueError):
                continue
            if data.get("format") != FORMAT:
                continue
            theirs = ((data.get("learn") or {}).get(device) or {}).get("1", {}).get(str(data["key"].get("batch_size")))
            if not isinstance(theirs, dict) or not 0.5 <= theirs["s"] / mine["s"] <= 2.0:
                continue
            r = _median_ratio(data, device, t)
            if r is not None:
                ratios.append(r)
        if not ratios:
            return None
        import statistics

        return statistics.median(ratios), f"of {len(ratios)} other quiet profile(s) of this machine"

    def substitutions(self) -> dict[tuple[str, int], tuple[float, str]]:
        """The thread scalings the model priced provisional learner figures with so far: {(device, t): (ratio,
        where from)}."""
        return dict(self._used)

    # -- primitives
    def env(self, w: int) -> float:
        return _interp(self._pts("env"), w)

    def infer(self, device: str, w: int) -> float:
        return _interp(self._pts("infer", device), w)

    def act(self, w: int, infer_device: str = "cpu") -> float:
        """One actor vector step of width w with inference on ``infer_device``."""
        if "act" in self.data and self.data["act"]:
            base = _interp(self._pts("act"), w) - self.infer("cpu", w)
        else:
            base = self.env(w)
        return max(self.env(w), base) + self.infer(infer_device, w)

    def learner_threads(self, device: str) -> list[int]:
        return sorted(int(t) for t in self.data["learn"][device])

    def learn(self, device: str, batch: int, threads: int = 1) -> float:
        ts = self.learner_threads(device)
        t = max([x for x in ts if x <= threads] or [ts[0]])
        return _interp(self._learn_pts("learn", device, t), batch)

    def _learn_pts(self, section: str, device: str, t: int) -> dict[int, float]:
        """A learner section's points at t threads; a provisional t > 1 point (measured under load, where
        threads collapse) priced as the 1-thread point x the quiet machine's thread scaling (thread_scaling),
        or as measured where that is faster (load only slows a figure down), so that a loaded moment never makes a
        plan avoid threads for good."""
        pts = self._pts(section, device, str(t))
        if t <= 1 or self.as_measured:
            return pts
        node, one = self.data[section][device][str(t)], self.data[section][device].get("1", {})
        for k in list(pts):
            if isinstance(node[str(k)], dict) and node[str(k)].get("provisional") and str(k) in one:
                ratio, source = self.thread_scaling(device, t)
                self._used[(device, t)] = (ratio, source)
                pts[k] = min(pts[k], Timing.from_json(one[str(k)]).s * ratio)
        return pts

    def loop(self, device: str, threads: int) -> dict | None:
        """The inline loop's figures at `threads` CPU threads (profile/loop.py: seconds per env step beyond the
        learner's updates, ``s``, of which acting ``act_s``), else at the nearest thread count measured quiet; None
        where none was (a GPU learner, an on-policy workload, a quick profile, or every entry measured under load:
        a loop timed beside another program's work says more about it than about the loop)."""
        by_t = (self.data.get("loop") or {}).get(device) or {}
        quiet = {int(t): e for t, e in by_t.items() if isinstance(e, dict) and not e.get("provisional")}
        return quiet[min(quiet, key=lambda t: (abs(t - threads), t))] if quiet else None

    def prefetch(self, device: str, prioritized: bool, group: int) -> dict:
        """The timing of the local schedule's learner loop with and without its prefetch thread, for a
        learner on `device` drawing groups of `group` batches ({} where not measured: GPU learners)."""
        return (self.data.get("prefetch") or {}).get(prefetch_key(prioritized, group), {}) if device == "cpu" else {}

    def prefetch_pays(self, device: str, prioritized: bool, group: int) -> bool:
        """Whether the prefetch thread measured faster than the draw in line (where not measured: yes,
        the runtime's default)."""
        return bool(self.prefetch(device, prioritized, group).get("chosen", True))

    def calibration(self, device: str) -> dict | None:
        """The last run's correction of the learner's profiled time on `device` (see calibrate()), where that run
        ran the kernel this profile chose."""
        e = self.data.get("calibration", {}).get("learn", {}).get(device)
        return e if self.of_kernel(device, e) else None

    def in_run(self, device: str, batch: int, threads: int, k: float, schedule: str) -> dict | None:
        """What a run of `schedule` on this machine measured of its learner at `threads` (record_in_run), where it is
        this workload (batch, about k steps per call) and not provisional (a local run's figure holds the actors'
        share of the cores: it prices local plans only)."""
        e = (((self.data.get("in_run") or {}).get("learn", {}).get(device) or {}).get(schedule) or {}).get(str(threads))
        if not e or e.get("provisional") or e.get("batch") != batch or not 0.5 <= float(e.get("k", 1)) / max(k, 1) <= 2 \
                or not self.of_kernel(device, e):
            return None
        return e

    def learn_step(self, device: str, batch: int, threads: int = 1, k: int = 1, calibrated: bool = True) -> float:
        """Seconds per gradient step when ``learn`` gets k steps per call: the grouped figure
        profiled at this thread count (the nearest profiled k), else the single-step figure
        scaled by the profiled gain of grouping, else the single-step figure; times the factor the
        last run on this machine measured against it (calibrated=True, see calibrate()). (What a run
        measured of this workload, in_run(), the model takes before it.)"""
        cal = self.calibration(device) if calibrated else None
        return self._learn_step(device, batch, threads, k) * (float(cal["factor"]) if cal else 1.0)

    def _learn_step(self, device: str, batch: int, threads: int, k: int) -> float:
        single = self.learn(device, batch, threads)
        g = self.data.get("learn_grouped", {}).get(device)
        if k <= 1 or not g:
            return single
        ts = sorted(int(t) for t in g)
        th = max([x for x in ts if x <= threads] or [ts[0]])
        pts = self._learn_pts("learn_grouped", device, th)
        kk = min(pts, key=lambda x: (abs(math.log(x / k)), -x))
        if batch == self.key.get("batch_size"):
            return pts[kk]
        at = self.learn(device, int(self.key["batch_size"]), th)
        return single * min(1.0, pts[kk] / at) if at > 0 else single

    def op(self, section: str, device: str, n: int) -> float:
        return _interp(self._pts(section, device), n)

    def param_sync(self, device: str) -> float:
        v = self.data.get("param_sync", {}).get(device)
        return Timing.from_json(v).s if v is not None else 0.0

    def link(self, key: str) -> dict | None:
        return self.data.get("transfer", {}).get(key)

    def xfer(self, src: str, dst: str, nbytes: float, pinned: bool = False) -> float:
        """Seconds to move nbytes from src to dst: latency + bytes / bandwidth (0 on the same
        device; via the host when the pair was not profiled)."""
        if src == dst or nbytes <= 0:
            return 0.0
        link = self.link(f"{src}->{dst}")
        if link is None:
            if src != "cpu" and dst != "cpu":
                return self.xfer(src, "cpu", nbytes, pinned) + self.xfer("cpu", dst, nbytes, pinned)
            raise KeyError(f"transfer {src}->{dst} not in the profile")
        if pinned and "pinned" in link:
            link = link["pinned"]
        return float(link["latency_s"]) + nbytes / float(link["bandwidth_Bps"])

    def ipc(self, nbytes: float) -> float:
        """One message of nbytes between two processes (pipe); falls back to a host copy."""
        link = self.link("ipc") or self.link("cpu->cpu")
        if link is None:
            return 0.0
        return float(link["latency_s"]) + nbytes / float(link["bandwidth_Bps"])

    def power(self, device: str):
        from hetrl.planner.power import DevicePower, estimate_cpu_power, estimate_gpu_power

        entry = self.data.get("power", {}).get(device)
        if entry:
            return DevicePower.from_json(entry)
        if device == "cpu":
            return estimate_cpu_power(self.data["machine"].get("cpu_model", ""), self.cores)
        gpus = self.data["machine"].get("gpus", [])
        i = int(device.split(":")[1]) if ":" in device else 0
        return estimate_gpu_power(gpus[i] if i < len(gpus) else device)

    def device_name(self, device: str) -> str:
        if device == "cpu":
            return self.data["machine"].get("cpu_model", "cpu")
        gpus = self.data["machine"].get("gpus", [])
        i = int(device.split(":")[1]) if ":" in device else 0
        return gpus[i] if i < len(gpus) else device

    # -- persistence
    def to_json(self) -> dict:
        return self.data

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=False))
        os.replace(tmp, path)
        self.path = path
        return path

    @classmethod
    def load(cls, path: Path) -> "ProfileTable":
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} table")
        return cls(data, Path(path), from_cache=True)

    def summary_rows(self) -> list[tuple[str, str, str, str, str]]:
        """(primitive, device, size, median, spread) rows for display."""
        rows = []

        def add(name, dev, size, t):
            mark = " (provisional)" if isinstance(t, dict) and t.get("provisional") else ""
            t = Timing.from_json(t)
            rows.append((name, dev, str(size), _fmt_s(t.s) + mark,
                         f"{100 * t.spread:.1f}%" + ("" if t.stable else " (cap)")))

        for w, t in self.data.get("env", {}).items():
            add("env step (vector)", "cpu", f"W={w}", t)
        for w, t in self.data.get("act", {}).items():
            add("actor step (vector)", "cpu", f"W={w}", t)
        for sec, label in (("infer", "inference"), ("ds_insert", "DS insert"), ("ds_gather", "DS gather"),
                           ("rm_insert", "RM insert"), ("rm_sample", "RM sample (prio)"),
                           ("rm_uniform", "RM sample (uniform)"), ("rm_update", "RM priority update")):
            for dev, pts in self.data.get(sec, {}).items():
                for n, t in pts.items():
                    add(label, dev, f"n={n}", t)
        for dev, by_t in self.data.get("learn", {}).items():
            for th, pts in by_t.items():
                for b, t in pts.items():
                    add("learner update", dev, f"B={b} threads={th}", t)
        B = self.key.get("batch_size")
        for dev, by_t in self.data.get("learn_grouped", {}).items():
            for th, pts in by_t.items():
                for k, t in pts.items():
                    add("learner update, grouped", dev, f"B={B} threads={th} K={k}", t)
        for dev, t in self.data.get("param_sync", {}).items():
            add("param publish+load", dev, "", t)
        for dev, by_t in self.data.get("loop", {}).items():
            for th, t in by_t.items():
                add("inline loop beyond updates, per env step", dev, f"W={t.get('envs')} threads={th}", t)
        for key, link in self.data.get("transfer", {}).items():
            mark = " (provisional)" if link.get("provisional") else ""
            for kind, lk in [("", link)] + ([(" pinned", link["pinned"])] if "pinned" in link else []):
                rows.append((f"transfer{kind}", key, "latency", _fmt_s(lk["latency_s"]) + mark,
                             f"{100 * lk.get('spread', 0):.1f}%"))
                rows.append((f"transfer{kind}", key, "bandwidth", f"{lk['bandwidth_Bps'] / 1e9:.2f} GB/s", ""))
        return rows


_ENTRY_NAMES = {"env": "env step", "act": "actor step", "infer": "inference", "learn": "learner update",
                "learn_grouped": "learner update, grouped", "param_sync": "param publish+load",
                "ds_insert": "DS insert",
                "ds_gather": "DS gather", "prefetch": "learner loop, prefetch vs in line", "rm_insert": "RM insert",
                "rm_sample": "RM sample (prio)", "rm_uniform": "RM sample (uniform)",
                "rm_update": "RM priority update", "transfer": "transfer", "loop": "inline loop beyond updates"}


def entry_name(path: tuple[str, ...]) -> str:
    """A profile entry's path in words: ("learn", "cpu", "2", "256") -> "learner update cpu, 2 threads, B=256"."""
    sec, rest = path[0], list(path[1:])
    name = _ENTRY_NAMES.get(sec, sec)
    if sec in ("env", "act"):
        return f"{name}, {rest[0]} env(s)"
    if sec in ("learn", "learn_grouped"):
        size = f"B={rest[2]}" if sec == "learn" else f"K={rest[2]}"
        return f"{name} {rest[0]}, {rest[1]} thread(s), {size}"
    if sec == "loop":
        return f"{name} {rest[0]}, {rest[1]} thread(s)"
    if sec in ("prefetch", "transfer") or len(rest) == 1:
        return f"{name} {rest[0]}"
    return f"{name} {rest[0]}, n={rest[1]}"


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


CALIBRATION_MIN_STEPS = 500        # a run must have made this many gradient steps ...
CALIBRATION_MIN_S = 2.0            # ... over this many learner seconds to correct the profile
CALIBRATION_RANGE = (0.25, 4.0)    # a factor outside is a different workload, not drift: not kept


def calibrate(path: str | Path, device: str, batch: int, threads: int, k: float, learner_s: float,
              gradient_steps: int, run: str = "", provisional: str | None = None,
              kernel: str | None = None) -> dict | None:
    """Feed a finished run's measured learner time back into its cached profile: the factor between
    the seconds per gradient step the run measured and the profile's figure for the same device,
    batch, threads and steps per call. The next plan on this machine predicts with it (a CPU shared with
    other programs changes speed with their load: a profile measured while it was quiet over-predicts
    a run made while it is busy).
    A run made while other programs kept cores busy (`provisional`: why, as the run's follower saw it) is
    not the machine's truth: its factor is kept apart (``calibration/learn_provisional``), shown, never priced
    with, and the last quiet run's factor stays.
    `kernel`: the learner kernel the run ran; a run on another kernel than the profile's writes nothing.
    Returns the calibration entry written, or None when the run was too short to say."""
    if gradient_steps < CALIBRATION_MIN_STEPS or learner_s < CALIBRATION_MIN_S:
        return None
    try:
        table = ProfileTable.load(Path(path))
        profiled = table.learn_step(device, batch, threads, max(1, round(k)), calibrated=False)
    except (ValueError, KeyError, OSError):
        return None
    if not table.of_kernel(device, {"kernel": kernel}):   # (a run pinned to another kernel is no measure of it)
        return None
    measured = learner_s / gradient_steps
    factor = measured / profiled if profiled > 0 else 0.0
    if not CALIBRATION_RANGE[0] <= factor <= CALIBRATION_RANGE[1]:
        return None
    entry = {"factor": round(factor, 4), "measured_step_s": measured, "profiled_step_s": profiled,
             "threads": threads, "steps_per_call": k, "kernel": kernel, "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
             "run": run,
             **({"provisional": provisional} if provisional else {})}
    section = "learn_provisional" if provisional else "learn"
    table.data.setdefault("calibration", {}).setdefault(section, {})[device] = entry
    table.save(Path(path))
    return entry


IN_RUN_MIN_STEPS = 200             # an in-run learner figure needs this many gradient steps at its thread count


def record_in_run(path: str | Path, device: str, entries: list[dict], kernel: str | None = None) -> list[dict]:
    """Write what a run measured of its learner into its cached profile, marked measured in a run: per schedule and
    thread count (``in_run/learn/DEVICE/SCHEDULE/THREADS``), ``{"threads", "s" (seconds per gradient step), "k"
    (steps per call), "batch", "schedule", "env_steps_per_s", "foreign" (cores other processes kept busy
    meanwhile), "at", "run"}`` and, where other processes kept cores busy throughout, ``provisional`` (why).
    The model prices a plan of that workload and schedule with it (ProfileTable.in_run) instead of the profiled
    figure. `kernel`: the learner kernel the run ran; a run on another kernel than the profile's writes nothing.
    Returns the entries written."""
    try:
        table = ProfileTable.load(Path(path))
    except (ValueError, KeyError, OSError):
        return []
    if not table.of_kernel(device, {"kernel": kernel}):
        return []
    runs = table.data.setdefault("in_run", {}).setdefault("learn", {}).setdefault(device, {})
    written = []
    for e in entries:
        if e.get("gradient_steps", 0) < IN_RUN_MIN_STEPS or e.get("s", 0) <= 0:
            continue
        entry = {**e, "kernel": kernel, "measured": "in run", "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        runs.setdefault(str(e.get("schedule", "inline")), {})[str(e["threads"])] = entry
        written.append(entry)
    if written:
        table.save(Path(path))
    return written
