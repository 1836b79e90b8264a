"""Profile: time each primitive of the training protocol on every device present, cache the table.

What is measured (seconds per call; every figure is a :class:`~hetrl.planner.measure.Timing`
repeated until stable, with its spread), for the run's algorithm, env and network, one module per
part of the protocol:

=================  ==============================================================================
envs.py
``env``            one step of a vector of W envs (the actors' SyncVector, random actions), per width W
``act``            one actor vector step of width W: envs + CPU inference + n-step adder (Actor.collect)
``infer``          policy inference (``policy.act``) for W observations, per device
learner.py
``learner_kernel`` the kernel that runs the learner on each device (hetrl.kernels.choose)
``learn``          one gradient step (``algo.learn`` on a synthetic batch of B), per device, per
                   torch thread count (CPU), per batch size B
``learn_grouped``  the same at the run's batch size with K gradient steps per ``learn`` call, per step,
                   per thread count, for the K the schedules use (local: up to 32; inline: a phase)
``param_sync``     publish the learner's weights + load them into an actor policy
loop.py
``loop``           a short real inline run per CPU thread count: wall time per env step beyond the learner's
                   updates (acting, inserting, drawing, counting, publishing), and of it the acting; off-policy
replay.py
``ds_insert``      data storage: ``Storage.insert`` of n transitions already on the device
``ds_gather``      data storage: ``Storage.get`` of n slots (keys already on the device)
``prefetch``       the local schedule's learner loop per group of gradient steps (CPU learner, 1 thread):
                   the next group drawn by a prefetch thread during the update vs drawn in line
``rm_insert``      replay manager: sum-tree update of n new slots at max priority
``rm_sample``      replay manager: prioritized sample of n keys + importance weights
``rm_uniform``     replay manager: uniform sample of n keys
``rm_update``      replay manager: ``ReplayBuffer.update_priorities`` of n keys
transfer.py
``transfer``       latency and bandwidth per ordered device pair ("cpu->cpu": in-memory copy;
                   "cpu->cuda:0" pageable and pinned, "cuda:0->cpu", ...), and "ipc": a pipe
                   between two processes
power.py
``power``          per device idle/busy watts, with their source
=================  ==============================================================================

Every entry is measured with the machine's foreign load watched (hetrl/planner/load.py: the cores
other processes kept busy, from /proc/stat less this process tree's CPU time). An entry measured
while they kept more than the background busy, or one whose median did not settle within its cap,
is *provisional*: measured again at once while the machine is quiet (a bounded retry), else kept with
``"provisional": why`` and measured again by a later ``load_or_profile`` that finds the machine quiet
(:func:`load_or_profile`). The model never takes a provisional multi-thread learner figure as the
truth (table.py: ProfileTable.thread_scaling).

Single-threaded CPU primitives are timed in CPU time of the process (what they cost, not how
long they waited for a core that another program held). A learner of t > 1 threads is its
1-thread figure x the ratio of its wall times with t threads and with 1, from back-to-back pairs
of rounds (measure_threads): how much threads gain depends on OpenMP's barriers and wait policy
and on what the other cores do, not on the CPU time they burn, and only the wall clock sees
that; a ratio taken pair by pair stays right while the speed of a shared machine drifts with its
neighbours' load. GPU work and the pipe are timed in wall time.

The table (table.py: :class:`ProfileTable`) is cached as JSON, one file per machine and per
(algorithm, env, network) in :func:`cache_dir`; it is re-used while it covers the sizes the run
needs, re-measured with ``refresh=True`` (``hetrl profile --refresh``).
"""

from __future__ import annotations

import datetime as _dt
import time
from typing import Callable

from hetrl.errors import UsageError
from hetrl.planner.profile.context import Budget, Context, sync_of
from hetrl.planner.profile.envs import measure_envs, measure_inference
from hetrl.planner.profile.loop import measure_loop
from hetrl.planner.profile.learner import Learners, learn_timing, measure_learner, synthetic_batch
from hetrl.planner.profile.replay import (PREFETCH_MARGIN, measure_prefetch, measure_replay_manager, measure_storage,
                                          prefetch_timing)
from hetrl.planner.profile.table import (DEFAULT_WIDTHS, FORMAT, QUICK_WIDTHS, ProfileTable, _covers, cache_dir,
                                         cache_path, calibrate, grid_for, machine_id, machine_info, network_key,
                                         prefetch_key, present_devices, record_in_run)
from hetrl.planner.profile.transfer import measure_transfers

__all__ = ["DEFAULT_WIDTHS", "FORMAT", "PREFETCH_MARGIN", "QUICK_WIDTHS", "ProfileTable", "cache_dir", "cache_path",
           "calibrate", "grid_for", "learn_timing", "load_or_profile", "machine_id", "machine_info", "network_key",
           "prefetch_key", "prefetch_timing", "present_devices", "record_in_run", "run_profile", "sync_of",
           "synthetic_batch"]


class _NoRapl:
    available = False
    domains: list = []


def _primitives(grid: dict, devices: list[str]) -> int:
    """How many primitives a profile of `grid` on `devices` times (each gets a share of the budget)."""
    W, T, Bs, S, I = grid["widths"], grid["threads"], grid["batches"], grid["samples"], grid["inserts"]
    n_gpu = sum(d != "cpu" for d in devices)
    return (3 * len(W) + len(W) * len(devices) + len(Bs) * (len(T) + n_gpu) + len(devices) * 2
            + len(devices) * (len(I) + len(S)) + (3 * len(S) + len(I)) + 2 * (1 + 3 * n_gpu) + 2
            + 2 * len(grid.get("prefetch", [])) + len(grid.get("loop", [])))


RETRIES = 2              # passes that measure the provisional entries again within one profile, while quiet
QUIET_CHECK_S = 0.5      # how long each reading of a quiet check lasts (load.quiet_check: up to QUIET_READINGS)


def run_profile(cfg, devices: list[str] | None = None, quick: bool = False, budget_s: float = 45.0,
                cap_s: float = 2.0, tol: float = 0.05, progress: Callable[[str], None] | None = None,
                measure_power: bool = True, ipc: bool = True, refresh_kernels: bool = False,
                env=None, reader=None) -> ProfileTable:
    """Measure every primitive for ``cfg`` (algo, env, network, batch sizes) on ``devices``
    (default: every device present). ``budget_s`` bounds the whole profile: each primitive
    gets at most ``cap_s`` and an equal share of what is left. `env`: a factory or Env the run was
    given (default: cfg.env). Every entry is measured with the foreign load watched (``reader``: what
    takes a load sample, hetrl.planner.load.sample by default); the entries measured under load or not
    settled are measured again while the machine is quiet (at most RETRIES passes, within half the budget
    again), and those still so are kept provisional (ProfileTable.provisional_entries)."""
    import torch

    from hetrl.planner.load import Watch
    from hetrl.planner.power import device_power

    t_start = time.perf_counter()
    machine = machine_info()
    devices = devices or present_devices()
    for d in devices:
        if d != "cpu" and not (torch.cuda.is_available() and d.startswith("cuda")):
            raise UsageError(f"cannot profile device {d}: CUDA is not available here; profile cpu only")
    grid = grid_for(cfg, quick, machine["cores"])
    if quick:
        budget_s, cap_s = min(budget_s, 5.0), min(cap_s, 0.2)
    data: dict = {
        "format": FORMAT, "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine, "machine_id": machine_id(machine), "devices": devices,
        "grid": grid, "settings": {"tol": tol, "cap_s": cap_s, "budget_s": budget_s},
    }
    say = progress or (lambda msg: None)
    watch = Watch(reader).start()
    ctx = _pass(cfg, env, devices, grid, data, budget_s, cap_s, tol, quick, say, ipc, refresh_kernels, reader)
    ctx.say("device power (RAPL / NVML, else estimated)")
    power = device_power(devices, machine, seconds=0.3) if measure_power else \
        device_power(devices, machine, rapl=_NoRapl())
    data["power"] = {d: p.to_json() for d, p in power.items()}
    whole = watch.stop()
    data["load"] = whole.to_json() if whole is not None else None
    table = ProfileTable(data)
    retry_until = time.perf_counter() + budget_s / 2   # the retries share half the budget again
    for _ in range(RETRIES):
        todo, left = table.provisional_entries(), retry_until - time.perf_counter()
        if not todo or left < 1.0 or not _remeasure(cfg, env, table, todo, left, cap_s, tol, quick, say, ipc, reader):
            break
    data["profile_s"] = round(time.perf_counter() - t_start, 2)
    return table


def _pass(cfg, env, devices, grid, data, budget_s, cap_s, tol, quick, say, ipc, refresh_kernels, reader,
          only: set | None = None) -> Context:
    """One pass over the sections (every entry, or the entries `only` names, the others kept from `data`); the
    measured sections are written into `data`."""
    import torch

    from hetrl.actors import probe_spaces
    from hetrl.actors.envs import prepare_env
    from hetrl.algos import learn_spec, replay_spec
    from hetrl.planner.load import LoadLog

    mkw = {"tol": tol}
    if quick:
        mkw.update(min_rounds=4, window=3, min_round_s=0.003)
    given = env if env is not None else cfg.env   # as the run is given it (the loop section builds a run of it)
    env = prepare_env(given, cfg)   # the wrappers of the settings (Atari, frame_stack)
    obs_space, act_space = probe_spaces(env)
    count = _primitives(grid, devices) if only is None else len(only)
    ctx = Context(cfg, env, obs_space, act_space, replay_spec(cfg, obs_space, act_space), devices, grid,
                  Budget(budget_s, count, cap_s), mkw, say, only=only, prev=dict(data) if only is not None else None,
                  reader=reader, retried=only is not None, quick=quick,
                  learn_spec=learn_spec(cfg, obs_space, act_space))
    ctx.log = LoadLog(reader).start()   # (a reading from the start: the first entries are judged over it too)
    data["key"] = {"algo": cfg.algo, "env": cfg.env, "network": network_key(cfg), "net_arch": list(cfg.net_arch),
                   "obs_shape": list(obs_space.shape),
                   "action": (f"discrete({act_space.n})" if hasattr(act_space, "n") else f"box{list(act_space.shape)}"),
                   "bytes_per_transition": ctx.bytes_per_transition, "batch_size": cfg.batch_size}
    old_threads = torch.get_num_threads()
    old_denormal = torch.set_flush_denormal(True)
    try:
        torch.set_num_threads(1)  # actors run one torch thread each
        acting = {"env", "act", "infer", "learn", "learn_grouped", "param_sync", "prefetch"}
        learners = None
        if only is None or any(p[0] in acting for p in only):
            learners = Learners(ctx, refresh=refresh_kernels)
            data["learner_kernel"] = learners.choices
        if learners is not None:
            data.update(measure_envs(ctx, learners.policy))
            data.update(measure_inference(ctx, learners.policy))
            data.update(measure_learner(ctx, learners))
        data.update(measure_storage(ctx))
        if learners is not None:
            data.update(measure_prefetch(ctx, learners.cpu))
        data.update(measure_replay_manager(ctx))
        data.update(measure_transfers(ctx, ipc))
        data.update(measure_loop(ctx, given))
    finally:
        torch.set_num_threads(old_threads)
        torch.set_flush_denormal(old_denormal)
    return ctx


def _remeasure(cfg, env, table: ProfileTable, todo: list, budget_s: float, cap_s: float, tol: float, quick: bool,
               say: Callable[[str], None], ipc: bool, reader, load=None) -> bool:
    """Measure the entries `todo` ((path, why) pairs) of `table` again, in place, if the machine is quiet now
    (`load`: a reading already taken, else load.quiet_check's: busy only where each of a few readings of
    QUIET_CHECK_S says so). Returns whether it measured."""
    from hetrl.planner.load import quiet_check

    load = load if load is not None else quiet_check(QUIET_CHECK_S if not quick else 0.25, reader)
    table.load_now = load
    if load is not None and load.busy:
        say(f"{len(todo)} provisional entries kept: the machine is busy now ({load.why()}); measured again when "
            "it is quiet")
        return False
    say(f"measuring {len(todo)} provisional entries again (the machine is quiet now)")
    data = table.data
    _pass(cfg, env, data["devices"], data["grid"], data, budget_s, cap_s, tol, quick, say, ipc, False, reader,
          only={path for path, _ in todo})
    left = table.provisional_entries()
    record = {"at": _dt.datetime.now().isoformat(timespec="seconds"), "entries": len(todo), "provisional": len(left)}
    data.setdefault("remeasured", []).append(record)
    table.remeasured.append(record)
    table._scaling, table._used = {}, {}
    return True


def load_or_profile(cfg, refresh: bool = False, quick: bool = False, progress: Callable[[str], None] | None = None,
                    remeasure: bool = True, reader=None, **kwargs) -> ProfileTable:
    """The cached table for ``cfg`` on this machine, measuring (and caching) it first when it
    is missing, unreadable, does not cover the sizes ``cfg`` needs, or ``refresh`` is set. A cached table
    with provisional entries has them measured again when the machine is quiet now (``remeasure``), and
    saved; while it is busy they stay provisional (``table.load_now`` holds the reading)."""
    machine = machine_info()
    path = cache_path(cfg, machine)
    need = grid_for(cfg, quick, machine["cores"])
    if path.exists() and not refresh:
        try:
            table = ProfileTable.load(path)
            if table.data.get("machine") == machine and _covers(table.data.get("grid", {}), need) \
                    and table.data["key"].get("network") == network_key(cfg):
                todo = table.provisional_entries()
                if remeasure and todo:
                    settings = table.data.get("settings", {})
                    if _remeasure(cfg, kwargs.get("env"), table, todo, float(settings.get("budget_s", 45.0)),
                                  float(settings.get("cap_s", 2.0)), float(settings.get("tol", 0.05)), quick,
                                  progress or (lambda msg: None), kwargs.get("ipc", True), reader):
                        table.save(path)
                return table
            if progress:
                progress(f"cached profile {path} does not cover this run's sizes; re-measuring")
        except (ValueError, KeyError, OSError) as e:
            if progress:
                progress(f"cached profile {path} is unreadable ({e}); re-measuring")
    table = run_profile(cfg, quick=quick, progress=progress, refresh_kernels=refresh, reader=reader, **kwargs)
    table.save(path)
    return table
