"""Profile: time each primitive of the training protocol on every device present, cache the table.

What is measured (seconds per call; every figure is a :class:`~hetrl.planner.measure.Timing`
repeated until stable, with its spread), for the run's algorithm, env and network:

=================  ==============================================================================
``env``            one step of a vector of W envs (SyncVectorEnv, random actions), per width W
``act``            one actor vector step of width W: envs + CPU inference + n-step adder (Actor.collect)
``infer``          policy inference (``policy.act``) for W observations, per device
``learn``          one gradient step (``algo.learn`` on a synthetic batch of B), per device, per
                   torch thread count (CPU), per batch size B
``learn_grouped``  the same at the run's batch size with K gradient steps per ``learn`` call, per step,
                   per thread count, for the K the schedules use (local: up to 32; inline: a phase)
``ds_insert``      data storage: ``Storage.insert`` of n transitions already on the device
``ds_gather``      data storage: ``Storage.get`` of n slots (keys already on the device)
``rm_insert``      replay manager: sum-tree update of n new slots at max priority
``rm_sample``      replay manager: prioritized sample of n keys + importance weights
``rm_uniform``     replay manager: uniform sample of n keys
``rm_update``      replay manager: ``ReplayBuffer.update_priorities`` of n keys
``param_sync``     publish the learner's weights + load them into an actor policy
``prefetch``       the local schedule's learner loop per group of gradient steps (CPU learner, 1 thread):
                   the next group drawn by a prefetch thread during the update vs drawn in line
``transfer``       latency and bandwidth per ordered device pair ("cpu->cpu": in-memory copy;
                   "cpu->cuda:0" pageable and pinned, "cuda:0->cpu", ...), and "ipc": a pipe
                   between two processes
``power``          per device idle/busy watts (see power.py), with their source
=================  ==============================================================================

Single-threaded CPU primitives are timed in CPU time of the process (what they cost, not how
long they waited for a core that another program held). A learner of t > 1 threads is its
1-thread figure x the ratio of its wall times with t threads and with 1, from back-to-back pairs
of rounds (measure_threads): how much threads gain depends on OpenMP's barriers and wait policy
and on what the other cores do, not on the CPU time they burn, and only the wall clock sees
that; a ratio taken pair by pair stays right while the machine's speed drifts (it did, by
+-30 % over minutes, on the development VM). GPU work and the pipe are timed in wall time.

The table is cached as JSON, one file per machine (hostname, CPU model, cores, torch version,
GPU names) and per (algorithm, env, network) in :func:`cache_dir`; it is re-used while it
covers the sizes the run needs, re-measured with ``refresh=True`` (``hetrl profile --refresh``).
"""

from __future__ import annotations

import bisect
import datetime as _dt
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from hetrl.errors import UsageError
from hetrl.planner.measure import Timing, measure, measure_threads
from hetrl.runtime.layout import grads_per_phase, group_size  # the runtime's phase and group sizes

FORMAT = "hetrl-profile/13"   # 13: the learner kernel per device (learner_kernel: a kernels.Choice)
DEFAULT_WIDTHS = (1, 2, 4, 8, 16)
PREFETCH_MARGIN = 0.02   # the prefetch thread is chosen where its learner loop measured >= 2% faster
QUICK_WIDTHS = (1, 2)


# --- where the table lives (this machine: hetrl/machine.py) ----------------------------------------
from hetrl.machine import cache_dir, machine_id, machine_info, present_devices  # noqa: E402,F401


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", s).strip("_")


def network_key(cfg) -> str:
    key = "x".join(str(h) for h in cfg.net_arch)
    key += f"-stack{cfg.frame_stack}" if cfg.frame_stack > 1 else ""   # another input (and CNN) shape
    key += f"-{cfg.activation}" if cfg.activation != "relu" else ""
    key += "-ln" if cfg.layer_norm else ""
    from hetrl import registry

    for name in getattr(registry.get(cfg.algo), "shape_settings", ()):   # the algorithm's own (DQN: dueling)
        value = getattr(cfg, name, None)
        key += (f"-{name}" if value else "") if isinstance(value, bool) else f"-{name}{value}"
    return key


def cache_path(cfg, machine: dict | None = None) -> Path:
    machine = machine or machine_info()
    backend = "" if cfg.env_backend == "auto" else f"-{cfg.env_backend}"   # auto: the profile measured both
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
    # prioritized replay (one batch per call)
    prefetch = [prefetch_key(False, group_size(g, False)), prefetch_key(True, group_size(g, True))]
    return {"widths": widths, "threads": threads, "batches": batches, "samples": samples,
            "inserts": inserts, "k_groups": k_groups[:1] if quick else k_groups, "prefetch": prefetch}


def prefetch_key(prioritized: bool, group: int) -> str:
    """The profile's name of a learner loop whose prefetch thread is timed: 'uniform:32', 'prioritized:1'."""
    return f"{'prioritized' if prioritized else 'uniform'}:{group}"


def _covers(have: dict, need: dict) -> bool:
    for k, v in need.items():
        h = have.get(k)
        if isinstance(v, list):
            if not isinstance(h, list) or not set(v) <= set(h):
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


class ProfileTable:
    """The profiled figures with the accessors the model uses (all in seconds).

    ``data`` is the JSON document (see docs/planner.md); sizes are string keys there."""

    def __init__(self, data: dict, path: Path | None = None, from_cache: bool = False):
        self.data, self.path, self.from_cache = data, path, from_cache

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
        return {int(k): Timing.from_json(v).s for k, v in node.items()}

    def has(self, section: str, device: str) -> bool:
        return device in self.data.get(section, {})

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
        return _interp(self._pts("learn", device, str(t)), batch)

    def prefetch(self, device: str, prioritized: bool, group: int) -> dict:
        """The timing of the local schedule's learner loop with and without its prefetch thread, for a
        learner on `device` drawing groups of `group` batches ({} where not measured: GPU learners)."""
        return (self.data.get("prefetch") or {}).get(prefetch_key(prioritized, group), {}) if device == "cpu" else {}

    def prefetch_pays(self, device: str, prioritized: bool, group: int) -> bool:
        """Whether the prefetch thread measured faster than the draw in line (where not measured: yes,
        the runtime's default)."""
        return bool(self.prefetch(device, prioritized, group).get("chosen", True))

    def calibration(self, device: str) -> dict | None:
        """The last run's correction of the learner's profiled time on `device` (see calibrate())."""
        return self.data.get("calibration", {}).get("learn", {}).get(device)

    def learn_step(self, device: str, batch: int, threads: int = 1, k: int = 1, calibrated: bool = True) -> float:
        """Seconds per gradient step when ``learn`` gets k steps per call: the grouped figure
        profiled at this thread count (the nearest profiled k), else the single-step figure
        scaled by the profiled gain of grouping, else the single-step figure; times the factor the
        last run on this machine measured against it (calibrated=True, see calibrate())."""
        cal = self.calibration(device) if calibrated else None
        return self._learn_step(device, batch, threads, k) * (float(cal["factor"]) if cal else 1.0)

    def _learn_step(self, device: str, batch: int, threads: int, k: int) -> float:
        single = self.learn(device, batch, threads)
        g = self.data.get("learn_grouped", {}).get(device)
        if k <= 1 or not g:
            return single
        ts = sorted(int(t) for t in g)
        th = max([x for x in ts if x <= threads] or [ts[0]])
        pts = {int(kk): Timing.from_json(t).s for kk, t in g[str(th)].items()}
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
            t = Timing.from_json(t)
            rows.append((name, dev, str(size), _fmt_s(t.s), f"{100 * t.spread:.1f}%" + ("" if t.stable else " (cap)")))

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
        for key, link in self.data.get("transfer", {}).items():
            for kind, lk in [("", link)] + ([(" pinned", link["pinned"])] if "pinned" in link else []):
                rows.append((f"transfer{kind}", key, "latency", _fmt_s(lk["latency_s"]),
                             f"{100 * lk.get('spread', 0):.1f}%"))
                rows.append((f"transfer{kind}", key, "bandwidth", f"{lk['bandwidth_Bps'] / 1e9:.2f} GB/s", ""))
        return rows


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


# --- measuring -------------------------------------------------------------------------------
class _Budget:
    """Shares a total time budget among the primitives still to measure."""

    def __init__(self, total_s: float, count: int, cap_s: float, floor_s: float = 0.1):
        self.deadline = time.perf_counter() + total_s
        self.left, self.cap_s, self.floor_s = max(1, count), cap_s, floor_s

    def cap(self) -> float:
        remaining = self.deadline - time.perf_counter()
        cap = max(self.floor_s, min(self.cap_s, remaining / self.left))
        self.left = max(1, self.left - 1)
        return cap


def _echo(conn) -> None:  # child side of the ipc measurement
    try:
        while True:
            msg = conn.recv_bytes()
            if not msg:
                break
            conn.send_bytes(b"k")
    except (EOFError, OSError):
        pass


def _measure_ipc(cap: float, tol: float) -> dict | None:
    import multiprocessing as mp

    try:
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        a, b = ctx.Pipe()
        proc = ctx.Process(target=_echo, args=(b,), daemon=True)
        proc.start()
    except (OSError, ValueError):
        return None
    try:
        small, big = b"x" * 64, b"x" * (1 << 20)

        def rtt(msg):
            def f():
                a.send_bytes(msg)
                a.recv_bytes()
            return f

        t_small = measure(rtt(small), cap_s=cap / 2, tol=tol)
        t_big = measure(rtt(big), cap_s=cap / 2, tol=tol)
        lat = t_small.s / 2
        bw = len(big) / max(1e-9, t_big.s - t_small.s)
        return {"latency_s": lat, "bandwidth_Bps": bw, "spread": max(t_small.spread, t_big.spread)}
    finally:
        try:
            a.send_bytes(b"")
        except OSError:
            pass
        proc.join(timeout=2)
        if proc.is_alive():
            proc.terminate()


def _link(copy_small: Callable, copy_big: Callable, big_bytes: int, cap: float, tol: float, sync=None,
          clock: Callable[[], float] = time.perf_counter) -> dict:
    t_small = measure(copy_small, cap_s=cap / 2, tol=tol, sync=sync, clock=clock)
    t_big = measure(copy_big, cap_s=cap / 2, tol=tol, sync=sync, clock=clock)
    return {"latency_s": t_small.s, "bandwidth_Bps": big_bytes / max(1e-9, t_big.s - t_small.s),
            "spread": max(t_small.spread, t_big.spread)}


def sync_of(dev: str) -> Callable[[], object] | None:
    """What makes a round's asynchronous device work count: torch.cuda.synchronize on a GPU."""
    if not dev.startswith("cuda"):
        return None
    import torch

    return lambda: torch.cuda.synchronize(dev)


def synthetic_batch(spec: dict, act_space, B: int, K: int, dev: str) -> tuple[dict, Any]:
    """K stacked batches of B synthetic transitions of the replay spec ``spec`` on ``dev``, and
    their importance weights (ones): what the profile times the learner on (hetrl/kernels/select.py's)."""
    from hetrl.kernels import synthetic_batch as synth

    return synth(spec, act_space, B, K, dev)


def learn_timing(algo, batch: dict, wts, dev: str, steps: int = 1, *, cap_s: float, tol: float = 0.05,
                 threads: int = 1, one: dict | None = None, **measure_kw) -> Timing:
    """Seconds per gradient step of ``algo.learn(batch, wts)`` (``steps`` per call) on ``dev``: on
    the CPU in CPU time of the process, on a GPU in wall time with a synchronize per round; with
    ``threads`` > 1 CPU threads: the 1-thread figure ``one`` x the t / 1-thread wall-time ratio."""
    if one is None:
        kw = {"tol": tol, **measure_kw}
        if dev == "cpu":
            kw["clock"] = time.process_time
        t = measure(lambda: algo.learn(batch, wts), cap_s=cap_s, sync=sync_of(dev), **kw)
        t.s /= steps
        return t
    r = measure_threads(lambda: algo.learn(batch, wts), threads, tol=tol, cap_s=cap_s)
    return Timing(one["s"] * r.s, r.spread, r.rounds, r.calls, r.stable)


def prefetch_timing(algo, replay, groups, group: int, *, cap_s: float, rounds: int = 6) -> dict:
    """Wall seconds per group of gradient steps of the local schedule's learner loop (runtime/local.py):
    draw the group, learn on it, write its priorities (prioritized replay) -- with the draw in line, and
    with a prefetch thread drawing the next group while the learner learns this one (the priorities are
    written once the prefetch is done with the replay, as the schedule does). The two loops alternate
    `rounds` times on one thread of torch; the figures are the medians. Chosen: the thread where it
    measured faster by more than PREFETCH_MARGIN (a thread that gains nothing measurable stays off: in the
    run it shares the cores with the actors, which the isolated timing does not see)."""
    import statistics
    from concurrent.futures import ThreadPoolExecutor

    def learn(item) -> None:
        batch, keys, weights = item
        td = algo.learn(batch, weights)
        if replay.prioritized:
            replay.update_priorities(keys, td.reshape(-1))

    def in_line(n: int) -> None:
        for _ in range(n):
            learn(groups.draw(group))

    def prefetched(n: int) -> None:
        ready = groups.draw(group)
        for _ in range(n):
            pending = pool.submit(groups.draw, group)
            batch, keys, weights = ready
            td = algo.learn(batch, weights)
            ready = pending.result()
            if replay.prioritized:
                replay.update_priorities(keys, td.reshape(-1))

    with ThreadPoolExecutor(1, thread_name_prefix="hetrl-prefetch") as pool:
        in_line(2)
        prefetched(2)
        t = time.perf_counter()
        in_line(1)
        n = max(3, int(cap_s / (2 * rounds) / max(time.perf_counter() - t, 1e-6)))
        got: dict[str, list[float]] = {"serial_s": [], "prefetch_s": []}
        for r in range(rounds):
            for name, loop in (("serial_s", in_line), ("prefetch_s", prefetched))[:: 1 if r % 2 == 0 else -1]:
                t = time.perf_counter()
                loop(n)
                got[name].append((time.perf_counter() - t) / n)
    out = {name: statistics.median(v) for name, v in got.items()}
    return {"group": group, **out, "chosen": out["prefetch_s"] < (1 - PREFETCH_MARGIN) * out["serial_s"],
            "groups_per_round": n, "rounds": rounds}


def run_profile(cfg, devices: list[str] | None = None, quick: bool = False, budget_s: float = 45.0,
                cap_s: float = 2.0, tol: float = 0.05, progress: Callable[[str], None] | None = None,
                measure_power: bool = True, ipc: bool = True, refresh_kernels: bool = False,
                env=None) -> ProfileTable:
    """Measure every primitive for ``cfg`` (algo, env, network, batch sizes) on ``devices``
    (default: every device present). ``budget_s`` bounds the whole profile: each primitive
    gets at most ``cap_s`` and an equal share of what is left."""
    import numpy as np
    import torch

    from hetrl.actors import ActorSpec, probe_spaces
    from hetrl.actors.envs import envpool_supports, make_vector_env, prepare_env
    from hetrl import kernels
    from hetrl.algos import make_algorithm, replay_spec
    from hetrl.planner.power import device_power
    from hetrl.replay import BatchGroups, ReplayBuffer
    from hetrl.replay.frames import frames_apply
    from hetrl.replay.sampler import UniformSampler
    from hetrl.runtime.params import InProcessParameterStore

    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    machine = machine_info()
    devices = devices or present_devices()
    for d in devices:
        if d != "cpu" and not (torch.cuda.is_available() and d.startswith("cuda")):
            raise UsageError(f"cannot profile device {d}: CUDA is not available here; profile cpu only")
    grid = grid_for(cfg, quick, machine["cores"])
    if quick:
        budget_s, cap_s = min(budget_s, 5.0), min(cap_s, 0.2)
        mkw_quick = {"min_rounds": 4, "window": 3, "min_round_s": 0.003}
    else:
        mkw_quick = {}
    # the env the run trains on (Atari preprocessing, frame_stack); `env`: a factory or Env the run was given
    env = prepare_env(env if env is not None else cfg.env, cfg)
    obs_space, act_space = probe_spaces(env)
    spec = replay_spec(cfg, obs_space, act_space)
    bpt = int(sum(int(np.prod(s)) * np.dtype(dt).itemsize for s, dt in spec.values()))
    W, T, Bs, S, I = grid["widths"], grid["threads"], grid["batches"], grid["samples"], grid["inserts"]
    n_gpu = sum(d != "cpu" for d in devices)
    count = (3 * len(W) + len(W) * len(devices) + len(Bs) * (len(T) + n_gpu) + len(devices) * 2
             + len(devices) * (len(I) + len(S)) + (3 * len(S) + len(I)) + 2 * (1 + 3 * n_gpu) + 2
             + 2 * len(grid.get("prefetch", [])))
    budget = _Budget(budget_s, count, cap_s)
    old_threads = torch.get_num_threads()
    old_denormal = torch.set_flush_denormal(True)
    mkw = {"tol": tol, **mkw_quick}
    cpu = {**mkw, "clock": time.process_time}   # single-threaded CPU work: CPU time (see measure.py)

    def kw_of(dev: str) -> dict:
        return cpu if dev == "cpu" else mkw
    data: dict[str, Any] = {
        "format": FORMAT, "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine, "machine_id": machine_id(machine), "devices": devices,
        "key": {"algo": cfg.algo, "env": cfg.env, "network": network_key(cfg), "net_arch": list(cfg.net_arch),
                "obs_shape": list(obs_space.shape),
                "action": (f"discrete({act_space.n})" if hasattr(act_space, "n") else f"box{list(act_space.shape)}"),
                "bytes_per_transition": bpt, "batch_size": cfg.batch_size},
        "grid": grid, "settings": {"tol": tol, "cap_s": cap_s, "budget_s": budget_s},
        "env": {}, "act": {}, "infer": {}, "learn": {}, "learn_grouped": {}, "ds_insert": {}, "ds_gather": {},
        "rm_insert": {}, "rm_sample": {}, "rm_uniform": {}, "rm_update": {}, "param_sync": {}, "transfer": {},
        "power": {},
    }
    rng = np.random.default_rng(0)

    try:
        torch.set_num_threads(1)  # actors run one torch thread each
        # -- learner (synthetic_batch and learn_timing below: the check in benchmarks/gpu_check.py times with them too)
        def synth(B: int, K: int, dev: str) -> tuple[dict, torch.Tensor]:
            return synthetic_batch(spec, act_space, B, K, dev)

        def timed_learn(dev, th, algo, batch, wts, steps: int, one: dict | None) -> Timing:
            return learn_timing(algo, batch, wts, dev, steps, cap_s=budget.cap(), threads=th, one=one, **mkw)

        # the learner's kernel on each device: the fastest of those checked equal to the public one here
        # (hetrl/kernels/select.py; the same choice a run makes, cached per machine); every learner figure below is
        # of the chosen one, and the actors act through it as the run's will
        data["learner_kernel"] = {}
        K = max(grid["k_groups"] or [1])
        for dev in devices:
            say(f"learner kernel on {dev}: the candidates checked against the public one and timed, {K} steps")
            data["learner_kernel"][dev] = kernels.choose(
                cfg, lambda dev=dev: make_algorithm(cfg, obs_space, act_space, dev), obs_space, act_space, spec, dev,
                K, refresh=refresh_kernels).to_json()

        def learner_on(c, dev: str):
            choice = kernels.Choice.from_json(data["learner_kernel"][dev])
            return kernels.build(choice, make_algorithm(c, obs_space, act_space, dev))

        cpu_kernel = learner_on(cfg, "cpu") if "cpu" in devices else None
        algo_cpu = cpu_kernel.algo if cpu_kernel is not None else make_algorithm(cfg, obs_space, act_space, "cpu")

        explore = (lambda steps: 0.1)

        def cpu_policy(**kw):
            policy = algo_cpu.make_policy(**kw)
            return cpu_kernel.wrap_policy(policy) if cpu_kernel is not None else policy
        # -- envs and actors; env_backend=auto: both backends timed at each width, the faster one there is the one
        # the actors of that width are measured with and a plan with that many envs per actor runs (EnvPool where
        # it has the env, Gymnasium otherwise)
        def env_step(name: str, w: int) -> Timing:
            venv = make_vector_env(env, w, 0, name)
            acts = [venv.action_space.sample() for _ in range(64)]
            it = iter(range(1 << 62))
            try:
                return measure(lambda: venv.step(acts[next(it) % 64]), cap_s=budget.cap(), **cpu)
            finally:
                venv.close()

        # (per width: EnvPool's C++ vector hands each step to its worker threads, which at one or two cheap envs
        # costs more than Gymnasium's step in Python and less from a few envs on)
        backend = "gymnasium" if cfg.env_backend == "auto" else cfg.env_backend
        data["env_backend"] = {"chosen": backend}
        both = cfg.env_backend == "auto" and envpool_supports(env)
        at: dict[str, str] = {}
        for w in W:
            timed = {}
            for name in (("gymnasium", "envpool") if both else (backend,)):
                say(f"env step{f' ({name})' if both else ''}, {w} env(s)")
                timed[name] = env_step(name, w)
            at[str(w)] = min(timed, key=lambda n: timed[n].s)
            data["env"][str(w)] = timed[at[str(w)]].to_json()
            if both:
                data["env_backend"].setdefault("widths", {})[str(w)] = {
                    "chosen": at[str(w)], **{f"{n}_s": t.s / w for n, t in timed.items()}}
            say(f"actor step (env + inference + n-step), {w} env(s)")
            actor = ActorSpec(env, w, 0, cpu_policy(seed=1, num_envs=w), cfg.n_step, cfg.gamma,
                              at[str(w)]).build()

            def step_actor(actor=actor, w=w):
                actor.collect(w, explore)
                actor.episodes.clear()
            data["act"][str(w)] = measure(step_actor, cap_s=budget.cap(), **cpu).to_json()
            actor.close()
        if both:   # the preset's width (the widest without one) for plans made without a width: its backend
            top = data["env_backend"]["widths"][str(cfg.num_envs if str(cfg.num_envs) in at else max(W))]
            data["env_backend"].update(top)
        # -- inference
        for dev in devices:
            data["infer"][dev] = {}
            policy = cpu_policy(seed=1, device=dev)
            for w in W:
                say(f"inference on {dev}, batch {w}")
                obs = rng.standard_normal((w, *obs_space.shape)).astype(np.float32)
                data["infer"][dev][str(w)] = measure(lambda: policy.act(obs, 0.1), cap_s=budget.cap(),
                                                     sync=sync_of(dev), **kw_of(dev)).to_json()

        # -- learner, with the kernel chosen above
        for dev in devices:
            data["learn"][dev] = {}
            for th in (T if dev == "cpu" else [1]):
                torch.set_num_threads(th)
                data["learn"][dev][str(th)] = {}
                for B in Bs:
                    say(f"learner update on {dev}, batch {B}, {th} thread(s)")
                    c = type(cfg)(**{**cfg.to_dict(), "batch_size": B})
                    algo = learner_on(c, dev)
                    batch, wts = synth(B, 1, dev)
                    t = timed_learn(dev, th, algo, batch, wts, 1, data["learn"][dev]["1"][str(B)] if th > 1 else None)
                    data["learn"][dev][str(th)][str(B)] = t.to_json()
                if grid["k_groups"]:
                    data["learn_grouped"].setdefault(dev, {})[str(th)] = {}
                B = cfg.batch_size
                for K in grid["k_groups"]:
                    say(f"learner update on {dev}, batch {B}, {K} grouped steps, {th} thread(s)")
                    algo = learner_on(cfg, dev)
                    batch, wts = synth(B, K, dev)
                    one = data["learn_grouped"][dev]["1"][str(K)] if th > 1 else None
                    t = timed_learn(dev, th, algo, batch, wts, K, one)
                    data["learn_grouped"][dev][str(th)][str(K)] = t.to_json()
            torch.set_num_threads(1)
            algo = make_algorithm(cfg, obs_space, act_space, dev)
            say(f"parameter publish + load from {dev}")
            store, pol = InProcessParameterStore(), algo.make_policy(seed=1)

            def sync_params(store=store, pol=pol, algo=algo):
                store.publish(algo.policy_state())
                pol.load(store.latest(-1)[0])
            data["param_sync"][dev] = measure(sync_params, cap_s=budget.cap(), sync=sync_of(dev),
                                              **kw_of(dev)).to_json()

        # -- data storage (per device) and replay manager (sum tree: CPU)
        # large transitions (pixels): a ring of ~256 MB measures the same memory-bound copies
        capacity = int(min(cfg.buffer_size, 1_000_000, max(4096, 2**28 // bpt)))
        frames = cfg.replay_frames and frames_apply(spec, cfg.frame_stack)   # the storage the run uses

        def host_batch(n: int) -> dict:
            out = {}
            for name, (shape, dt) in spec.items():
                if np.dtype(dt) == np.bool_:
                    out[name] = rng.random((n, *shape)) < 0.02
                else:
                    out[name] = rng.standard_normal((n, *shape)).astype(dt) if np.dtype(dt).kind == "f" \
                        else rng.integers(0, 2, (n, *shape)).astype(dt)
            if frames:  # one env's consecutive stacks, as the frame storage sees them
                K, seq = spec["obs"][0][0], rng.integers(0, 256, (n + spec["obs"][0][0], *spec["obs"][0][1:]), np.uint8)
                win = np.lib.stride_tricks.sliding_window_view(seq, K, axis=0).transpose(0, 3, 1, 2)
                out["obs"], out["next_obs"] = win[:n].copy(), win[1:n + 1].copy()
            return out

        for dev in devices:
            rb = ReplayBuffer(capacity, spec, dev, prioritized=False, seed=0, frames=frames)
            for s in range(0, capacity, 65536):
                rb.insert(host_batch(min(65536, capacity - s)))
            data["ds_insert"][dev], data["ds_gather"][dev] = {}, {}
            for n in I:
                say(f"data storage insert on {dev}, {n} transitions")
                b = host_batch(n)
                if dev != "cpu":
                    b = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in b.items()}
                data["ds_insert"][dev][str(n)] = measure(lambda: rb.storage.insert(b), cap_s=budget.cap(),
                                                         sync=sync_of(dev), **kw_of(dev)).to_json()
            for n in S:
                say(f"data storage gather on {dev}, {n} transitions")
                keys = rng.integers(0, capacity, n)
                if dev != "cpu":
                    keys = torch.from_numpy(keys).to(dev)
                data["ds_gather"][dev][str(n)] = measure(lambda: rb.storage.get(keys), cap_s=budget.cap(),
                                                         sync=sync_of(dev), **kw_of(dev)).to_json()
            del rb
        # -- the local schedule's learner loop with the next group drawn by a prefetch thread during the
        # update, against drawing it in line: the thread pays only where the draw outlasts its handoff
        data["prefetch"] = {}
        for name in (grid.get("prefetch", []) if "cpu" in devices else []):
            say(f"prefetch thread vs the draw in line, {name} batches per learner call")
            kind, K = name.split(":")
            rb = ReplayBuffer(capacity, spec, "cpu", prioritized=kind == "prioritized", seed=0, frames=frames)
            for s in range(0, capacity, 65536):
                rb.insert(host_batch(min(65536, capacity - s)))
            groups = BatchGroups(rb, spec, cfg.batch_size, int(K), preallocate=True)
            data["prefetch"][name] = prefetch_timing(cpu_kernel or algo_cpu, rb, groups, int(K), cap_s=budget.cap() + budget.cap())
            del rb, groups
        rbp = ReplayBuffer(capacity, {"reward": ((), "float32")}, "cpu", prioritized=True, seed=0)
        rbp.storage.size = capacity
        rbp.tree.update(np.arange(capacity), rng.random(capacity) + 0.01)
        for sec in ("rm_insert", "rm_sample", "rm_uniform", "rm_update"):
            data[sec]["cpu"] = {}
        for n in I:
            say(f"replay manager insert (sum tree), {n} transitions")
            keys = rng.integers(0, capacity, n)
            data["rm_insert"]["cpu"][str(n)] = measure(
                lambda: rbp.sampler.on_insert(keys), cap_s=budget.cap(), **cpu).to_json()

        uniform = UniformSampler(rbp.rng)

        for n in S:
            say(f"replay manager sample / update, {n} keys")
            data["rm_sample"]["cpu"][str(n)] = measure(lambda: rbp.sampler.sample(n, capacity), cap_s=budget.cap(), **cpu).to_json()
            data["rm_uniform"]["cpu"][str(n)] = measure(
                lambda: (uniform.sample(n, capacity), torch.ones(n)),
                cap_s=budget.cap(), **cpu).to_json()
            keys = rng.integers(0, capacity, n)
            td = torch.rand(n)
            data["rm_update"]["cpu"][str(n)] = measure(lambda: rbp.update_priorities(keys, td), cap_s=budget.cap(),
                                                       **cpu).to_json()
        # -- transfers
        big = 8 << 20
        say("transfer cpu->cpu (in-memory copy)")
        src_s, dst_s = np.ones(64, np.uint8), np.empty(64, np.uint8)
        src_b, dst_b = np.ones(big, np.uint8), np.empty(big, np.uint8)
        data["transfer"]["cpu->cpu"] = _link(lambda: np.copyto(dst_s, src_s), lambda: np.copyto(dst_b, src_b),
                                             big, budget.cap() + budget.cap(), tol, clock=time.process_time)
        if ipc:
            say("transfer between processes (pipe)")
            link = _measure_ipc(budget.cap() + budget.cap(), tol)
            if link:
                data["transfer"]["ipc"] = link
        gpus = [d for d in devices if d != "cpu"]
        for g in gpus:
            def sync():
                for d in gpus:
                    torch.cuda.synchronize(d)
            hs, hb = torch.ones(16, dtype=torch.float32), torch.ones(big // 4, dtype=torch.float32)
            ps, pb = hs.pin_memory(), hb.pin_memory()
            say(f"transfer cpu<->{g}")
            link = _link(lambda: hs.to(g), lambda: hb.to(g), big, budget.cap() + budget.cap(), tol, sync)
            link["pinned"] = _link(lambda: ps.to(g, non_blocking=True), lambda: pb.to(g, non_blocking=True), big,
                                   budget.cap() + budget.cap(), tol, sync)
            data["transfer"][f"cpu->{g}"] = link
            ds, db = hs.to(g), hb.to(g)
            data["transfer"][f"{g}->cpu"] = _link(lambda: ds.cpu(), lambda: db.cpu(), big,
                                                  budget.cap() + budget.cap(), tol, sync)
            for h in gpus:
                if h != g:
                    data["transfer"][f"{g}->{h}"] = _link(lambda: ds.to(h), lambda: db.to(h), big,
                                                          budget.cap() + budget.cap(), tol, sync)
        # -- power
        say("device power (RAPL / NVML, else estimated)")
        power = device_power(devices, machine, seconds=0.3) if measure_power else \
            device_power(devices, machine, rapl=_NoRapl())
        data["power"] = {d: p.to_json() for d, p in power.items()}
    finally:
        torch.set_num_threads(old_threads)
        torch.set_flush_denormal(old_denormal)
    data["profile_s"] = round(time.perf_counter() - t_start, 2)
    return ProfileTable(data)


class _NoRapl:
    available = False
    domains: list = []


CALIBRATION_MIN_STEPS = 500        # a run must have made this many gradient steps ...
CALIBRATION_MIN_S = 2.0            # ... over this many learner seconds to correct the profile
CALIBRATION_RANGE = (0.25, 4.0)    # a factor outside is a different workload, not drift: not kept


def calibrate(path: str | Path, device: str, batch: int, threads: int, k: float, learner_s: float,
              gradient_steps: int, run: str = "") -> dict | None:
    """Feed a finished run's measured learner time back into its cached profile: the factor between
    the seconds per gradient step the run measured and the profile's figure for the same device,
    batch, threads and steps per call. The next plan on this machine predicts with it (this CPU's
    speed drifts with the load of its neighbours: a profile measured quiet over-predicts a busy day).
    Returns the calibration entry written, or None when the run was too short to say."""
    if gradient_steps < CALIBRATION_MIN_STEPS or learner_s < CALIBRATION_MIN_S:
        return None
    try:
        table = ProfileTable.load(Path(path))
        profiled = table.learn_step(device, batch, threads, max(1, round(k)), calibrated=False)
    except (ValueError, KeyError, OSError):
        return None
    measured = learner_s / gradient_steps
    factor = measured / profiled if profiled > 0 else 0.0
    if not CALIBRATION_RANGE[0] <= factor <= CALIBRATION_RANGE[1]:
        return None
    entry = {"factor": round(factor, 4), "measured_step_s": measured, "profiled_step_s": profiled,
             "threads": threads, "steps_per_call": k, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), "run": run}
    table.data.setdefault("calibration", {}).setdefault("learn", {})[device] = entry
    table.save(Path(path))
    return entry


def load_or_profile(cfg, refresh: bool = False, quick: bool = False, progress: Callable[[str], None] | None = None,
                    **kwargs) -> ProfileTable:
    """The cached table for ``cfg`` on this machine, measuring (and caching) it first when it
    is missing, unreadable, does not cover the sizes ``cfg`` needs, or ``refresh`` is set."""
    machine = machine_info()
    path = cache_path(cfg, machine)
    need = grid_for(cfg, quick, machine["cores"])
    if path.exists() and not refresh:
        try:
            table = ProfileTable.load(path)
            if table.data.get("machine") == machine and _covers(table.data.get("grid", {}), need) \
                    and table.data["key"].get("network") == network_key(cfg):
                return table
            if progress:
                progress(f"cached profile {path} does not cover this run's sizes; re-measuring")
        except (ValueError, KeyError, OSError) as e:
            if progress:
                progress(f"cached profile {path} is unreadable ({e}); re-measuring")
    table = run_profile(cfg, quick=quick, progress=progress, refresh_kernels=refresh, **kwargs)
    table.save(path)
    return table


# --- synthetic tables (tests, what-if questions) -----------------------------------------------
def synthetic_table(*, algo: str = "dqn", env: str = "Synthetic-v0", cores: int = 2, gpus: tuple[str, ...] = (),
                    widths: tuple[int, ...] = DEFAULT_WIDTHS, env_step_s: float = 50e-6,
                    act_overhead_s: float = 30e-6, infer_s: dict | None = None,
                    learn_s: dict | None = None, batch_size: int = 64, rm_s: float = 10e-6,
                    ds_s: dict | None = None, transfer: dict | None = None, power: dict | None = None,
                    bytes_per_transition: int = 64, param_sync_s: float = 0.0) -> ProfileTable:
    """A profile table from a few numbers, for tests and what-if questions.

    * env: a vector step of width w costs ``w * env_step_s``; the actor adds ``act_overhead_s``.
    * infer_s: {device: (fixed_s, per_item_s)} (default cpu (40 us, 1 us)).
    * learn_s: {device: seconds per gradient step at ``batch_size``} or {device: {threads: s}};
      the time scales as 0.5 + 0.5 * B / batch_size.
    * rm_s: seconds per replay-manager call (+ 20 ns per item); ds_s: {device: seconds per call}.
    * transfer: {"cpu->cuda:0": (latency_s, bandwidth_Bps), ...}.
    * power: {device: {"idle_w", "busy_w", "source"}} (default: estimated table entries).
    """
    devices = ["cpu"] + [f"cuda:{i}" for i in range(len(gpus))]
    infer_s = infer_s or {"cpu": (40e-6, 1e-6)}
    learn_s = learn_s or {"cpu": 1e-3}
    ds_s = ds_s or {d: 5e-6 for d in devices}
    batches = [max(1, batch_size // 2), batch_size, 2 * batch_size]
    samples = batches + [batch_size * 32]
    inserts = [1, 16, 256]

    def affine(fixed, per, sizes):
        return {str(n): fixed + per * n for n in sizes}

    learn: dict = {}
    for d, v in learn_s.items():
        by_t = v if isinstance(v, dict) else {1: v}
        learn[d] = {str(t): {str(b): s * (0.5 + 0.5 * b / batch_size) for b in batches} for t, s in by_t.items()}
    data = {
        "format": FORMAT, "created": "synthetic",
        "machine": {"hostname": "synthetic", "cpu_model": "synthetic", "cores": cores, "torch": "-",
                    "gpus": list(gpus)},
        "machine_id": "synthetic", "devices": devices,
        "key": {"algo": algo, "env": env, "network": "synthetic", "net_arch": [], "obs_shape": [],
                "action": "", "bytes_per_transition": bytes_per_transition, "batch_size": batch_size},
        "grid": {"widths": list(widths), "batches": batches, "samples": samples, "inserts": inserts},
        "env": {str(w): w * env_step_s for w in widths},
        "act": {str(w): w * env_step_s + act_overhead_s + infer_s.get("cpu", (40e-6, 1e-6))[0]
                + infer_s.get("cpu", (40e-6, 1e-6))[1] * w for w in widths},
        "infer": {d: affine(f, p, widths) for d, (f, p) in infer_s.items()},
        "learn": learn, "learn_grouped": {},
        "ds_insert": {d: affine(s, 2e-9 * bytes_per_transition, inserts) for d, s in ds_s.items()},
        "ds_gather": {d: affine(s, 2e-9 * bytes_per_transition, samples) for d, s in ds_s.items()},
        "rm_insert": {"cpu": affine(rm_s, 20e-9, inserts)},
        "rm_sample": {"cpu": affine(rm_s, 20e-9, samples)},
        "rm_uniform": {"cpu": affine(rm_s / 2, 5e-9, samples)},
        "rm_update": {"cpu": affine(rm_s, 20e-9, samples)},
        "param_sync": {d: param_sync_s for d in devices},
        "transfer": {"cpu->cpu": {"latency_s": 1e-6, "bandwidth_Bps": 5e9},
                     "ipc": {"latency_s": 20e-6, "bandwidth_Bps": 2e9}},
        "power": power or {},
    }
    for key, (lat, bw) in (transfer or {}).items():
        data["transfer"][key] = {"latency_s": lat, "bandwidth_Bps": bw}
    for g in devices[1:]:  # defaults for GPU links not given
        data["transfer"].setdefault(f"cpu->{g}", {"latency_s": 10e-6, "bandwidth_Bps": 10e9})
        data["transfer"].setdefault(f"{g}->cpu", {"latency_s": 10e-6, "bandwidth_Bps": 10e9})
    return ProfileTable(data)
