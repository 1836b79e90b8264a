"""Populations: many agents (seeds, and a sweep of settings that keep shapes) trained as one run.

    run = hetrl.train("dqn", env="CartPole-v1", seeds=8, sweep={"lr": [1e-3, 3e-4]}, out="runs/pop")
    hetrl train dqn --env CartPole-v1 --seeds 8 --sweep lr=0.001,0.0003

Members share the env, the algorithm, every setting that shapes their networks or their step schedule
(`Config.SHAPE_SETTINGS`, `SCHEDULE_SETTINGS` and the algorithm's own); they differ in seed and in the swept
settings. One run drives them all (hetrl/runtime/population.py): the envs of every member step as one vector
env, each member keeps its own replay and learner, and one learner call runs every member's phase, members as
lanes over the cores. Each member is a complete run in `OUT/members/NAME/` (result.json, checkpoint.pt:
`hetrl.load`, `hetrl eval`, `--resume` take it alone); OUT/result.json holds the population's figures and the
statistics researchers publish (IQM, mean, median, optimality gap with 95% bootstrap intervals, hetrl/report/),
OUT/curves.png the IQM learning curves. Under the local and ray schedules the members are split into groups (a
member is never split), each group a process (local) or a Ray task placed on a node of the cluster (ray).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrl.config import SYSTEM_KEYS, Config, check_value, make_config, settings_class
from hetrl.errors import HetrlError, UsageError

POPULATION_FILE = "population.json"
FORMAT = "hetrl-population/1"


@dataclass
class Member:
    name: str                                   # seed3, or seed3-lr0.001 in a sweep
    seed: int
    settings: dict = field(default_factory=dict)    # the swept settings' values
    cfg: Config | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "seed": self.seed, "settings": self.settings, "dir": f"members/{self.name}"}


def parse_seeds(seeds: Any) -> list[int]:
    """`8` (seeds 0-7), `"0,3,5"` or [0, 3, 5] -> the list; one line naming the problem otherwise."""
    if isinstance(seeds, str):
        text = seeds.strip()
        try:
            seeds = int(text) if "," not in text else [int(s) for s in text.split(",") if s.strip()]
        except ValueError:
            raise UsageError(f"--seeds {text!r} is not a count (8) or a list of seeds (0,3,5)") from None
    if isinstance(seeds, bool) or not isinstance(seeds, (int, list, tuple, range)):
        raise UsageError(f"seeds={seeds!r} is not a count or a list of seeds; e.g. --seeds 8 or --seeds 0,3,5")
    if isinstance(seeds, int):
        if seeds < 1:
            raise UsageError(f"--seeds {seeds}: a population needs at least one member; e.g. --seeds 8 (seeds 0-7)")
        return list(range(seeds))
    out = [int(s) for s in seeds]
    if not out:
        raise UsageError("--seeds lists no seed; e.g. --seeds 0,3,5")
    if any(s < 0 for s in out):
        raise UsageError(f"--seeds {','.join(map(str, out))}: seeds are >= 0")
    dup = sorted({s for s in out if out.count(s) > 1})
    if dup:
        raise UsageError(f"--seeds lists seed {dup[0]} twice; each member needs its own seed")
    return out


def parse_sweep(sweep: Any) -> dict[str, list]:
    """{"lr": [1e-3, 3e-4]} or ["lr=0.001,0.0003", ...] (the CLI's repeated --sweep) -> {key: values}."""
    if not sweep:
        return {}
    if isinstance(sweep, dict):
        out = {}
        for k, v in sweep.items():
            values = list(v) if isinstance(v, (list, tuple)) else [v]
            if not values:
                raise UsageError(f"sweep {k} has no values; give e.g. {k}=V1,V2")
            out[str(k)] = values
        return out
    out = {}
    for pair in sweep:
        if "=" not in pair:
            raise UsageError(f"--sweep {pair!r} is not KEY=V1,V2,...; write e.g. --sweep lr=0.001,0.0003")
        k, v = pair.split("=", 1)
        k = k.strip()
        if k in out:
            raise UsageError(f"--sweep {k} is given twice; give all its values in one --sweep {k}=V1,V2")
        values = [x.strip() for x in v.split(",") if x.strip()]
        if not values:
            raise UsageError(f"--sweep {k}= has no values; give e.g. --sweep {k}=V1,V2")
        out[k] = values
    return out


def fixed_settings(algo: str) -> set[str]:
    """What every member of a population of `algo` shares: the settings that shape its networks or its
    learner's program, those that set when it acts and learns, the system's, and what names the run."""
    from hetrl import registry

    cls, settings = registry.get(algo), settings_class(algo)
    return (set(settings.SHAPE_SETTINGS) | set(settings.SCHEDULE_SETTINGS) | set(getattr(cls, "shape_settings", ()))
            | set(getattr(cls, "schedule_settings", ())) | set(SYSTEM_KEYS) | {"algo", "env", "seed"})


def _label(value: Any) -> str:
    return str(value).replace(" ", "").replace("/", "_")


def make_members(algo: str, env: str, overrides: dict[str, Any], seeds: list[int], sweep: dict[str, list]) -> list[Member]:
    """The members: every combination of the swept values (grid) x every seed, each with its config."""
    cls = settings_class(algo)
    fixed = fixed_settings(algo)
    typed: dict[str, list] = {}
    for key, values in sweep.items():
        check_value(key, values[0], cls)   # an unknown key: one line with the close match
        if key in fixed:
            why = ("the seeds are given with --seeds" if key == "seed" else
                   "it is a system setting (the same for every member)" if key in SYSTEM_KEYS else
                   "it changes the shapes of the networks or the step schedule of one member against another")
            raise UsageError(f"--sweep {key}: members cannot differ in {key} ({why}); sweep a learning setting "
                             "such as lr, gamma or tau, or train separate populations")
        typed[key] = [check_value(key, v, cls) for v in values]
        if len({json.dumps(v, default=str) for v in typed[key]}) != len(typed[key]):
            raise UsageError(f"--sweep {key} lists a value twice; give each value once")
    members = []
    for combo in itertools.product(*typed.values()) if typed else [()]:
        settings = dict(zip(typed, combo))
        for seed in seeds:
            name = "-".join([f"seed{seed}", *(f"{k}{_label(v)}" for k, v in settings.items())])
            cfg = make_config(algo, env, {**overrides, **settings, "seed": seed})
            members.append(Member(name, seed, settings, cfg))
    return members


class PopulationRun:
    """A population's training run: its members (each an api.Run over a member of the population's schedule),
    driven together. `learn()` trains every member to cfg.steps, evaluates each on the way (each keeps its best
    policy), saves every member's run directory and the population's result and report on every way out."""

    def __init__(self, members: list[Member], env, out: Path, save_replay: bool = False,
                 plan_info: dict | None = None, lanes: int = 0, spec: dict | None = None, group: int | None = None):
        from hetrl.api import Run
        from hetrl.runtime.population import PopulationSchedule

        self.members, self.env, self.out = members, env, Path(out)
        # group g of a population trained in groups: it writes its members' directories and its own progress
        # (OUT/groups/g/); the population's files (population.json, result.json, the report) are its driver's
        self.group = group
        self.plan_info = dict(plan_info or {})
        self.spec = dict(spec or {})
        self.schedule = PopulationSchedule([m.cfg for m in members], env, lanes)
        self.runs = [Run(m.cfg, env, self.out / "members" / m.name, save_replay, schedule=self.schedule.members[i])
                     for i, m in enumerate(members)]
        self.result: dict[str, Any] = {}
        self.interrupted: str | bool = False

    @property
    def cfg(self) -> Config:
        return self.members[0].cfg

    def close(self) -> None:
        self.schedule.close()

    def __enter__(self) -> "PopulationRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _clocks_paused(self):
        with contextlib.ExitStack() as stack:
            for core in self.schedule.cores:
                stack.enter_context(core.clock_paused())
            yield

    def learn(self, progress: bool = True, callback=None, stopped=None) -> "PopulationRun":
        """Train every member to its steps. Stops at the end of a phase, every member saved, on SIGINT / SIGTERM
        or where `stopped(env_steps)` (a group's driver asking, before each phase) turns true."""
        from hetrl.api import _hook, stop_signals
        from hetrl.logger import Logger

        pop, cfg = self.schedule, self.cfg
        if self.group is None:
            write_members(self.out, self.members, self.spec)
        logger = Logger(self.out if self.group is None else self.out / "groups" / str(self.group), cfg.steps,
                        cfg.system.log_interval, progress, start_step=pop.c.env_steps)
        for r in self.runs:
            r.evaluations.start(pop.c.env_steps)
        pop.start_clock()
        self.interrupted = False
        try:
            with stop_signals() as stop:
                _hook(callback, "training_start", self)
                while not pop.done() and not stop:
                    if stopped is not None and stopped(pop.c.env_steps):
                        stop.signal = "stopped by the population's driver"
                        break
                    eps = pop.phase()
                    pop.tick()
                    for r in self.runs:
                        if r.evaluations.due(pop.c.env_steps, pop.done()):
                            with self._clocks_paused():
                                r.evaluate_now()
                    for m_eps in eps:
                        logger.episodes(m_eps)
                    if logger.due(pop.c.env_steps):
                        f = self.figures()
                        logger.update(f["env_steps"], f["wall_s"], f["env_steps_per_s"], f["train_samples_per_s"],
                                      len(logger.returns))
                    if _hook(callback, "phase", self, eps) is False:
                        self.interrupted = "callback"
                        break
            self.interrupted = stop.signal or self.interrupted
            _hook(callback, "training_end", self)
            self.save(finished=True)
        except BaseException as e:  # keep every member's work, then re-raise
            self.interrupted = "SIGINT" if isinstance(e, KeyboardInterrupt) else f"error: {type(e).__name__}: {e}"
            if pop.c.env_steps and getattr(e, "learner_ok", True):
                with contextlib.suppress(Exception):
                    self.save()
                    print(f"hetrl: stopped by {self.interrupted.split(':')[0]} at {pop.c.env_steps:,} env steps per "
                          f"member; every member's checkpoint saved in {self.out} (continue with "
                          f"`hetrl train --resume {self.out}`)", file=sys.stderr)
            self.close()
            raise
        finally:
            logger.close()
        self.close()
        return self

    def evaluate(self, episodes: int | None = None) -> list[dict]:
        """Evaluate every member's policy (its best when keep_best) on fresh seeds, as a single run does."""
        return [r.evaluate(episodes) for r in self.runs]

    def figures(self) -> dict:
        """The population's figures: env steps per member, and throughput counted over all members."""
        member = self.schedule.members[0].figures()
        M = len(self.members)
        wall = member["wall_s"]
        grads = sum(c.c.gradient_steps for c in self.schedule.cores)
        return {"members": M, "env_steps": member["env_steps"], "wall_s": wall,
                "env_steps_per_s": M * member["env_steps"] / wall if wall else 0.0,
                "member_env_steps_per_s": member["env_steps_per_s"],
                "gradient_steps": grads,
                "train_samples_per_s": self.cfg.batch_size * grads / wall if wall else 0.0,
                "lanes": self.schedule.lanes, "parallel_lanes": self.schedule.parallel,
                "learner_kernel": member.get("learner_kernel"), "peak_rss_mb": member.get("peak_rss_mb")}

    def save(self, finished: bool = False) -> Path:
        """Every member's run directory, then the population's result.json (with the report) and curves.png.
        `finished`: training is over, so the members' replays are let go once saved, before the report loads the
        libraries it draws and bootstraps with."""
        for r in self.runs:
            r.save(r.out)
        if finished:
            self.schedule.drop_replays()
        if self.group is None:
            self.result = write_population(self.out, self.members, self.spec, self.figures(), self.plan_info,
                                           self.interrupted)
        return self.out


def write_population(out: Path, members: list[Member], spec: dict, figures: dict, plan_info: dict | None = None,
                     interrupted: str | bool = False) -> dict:
    """OUT/population.json (what --resume rebuilds the members from) and OUT/result.json (figures + report)."""
    from hetrl.checkpoint import write_json

    base = members[0].cfg
    pop = write_members(out, members, spec)
    result = {"algo": base.algo, "env": base.env, "population": pop, **figures, "interrupted": interrupted,
              **(plan_info or {}), "config": {k: v for k, v in base.to_dict().items() if k != "seed"}}
    write_json(result, out / "result.json")
    if all((out / m.to_json()["dir"] / "result.json").is_file() for m in members):
        from hetrl.report import write_population_report

        result["aggregate"] = write_population_report(out)
        write_json(result, out / "result.json")
    return result


def write_members(out: Path, members: list[Member], spec: dict) -> dict:
    """OUT/population.json, what --resume rebuilds the members from (written before the members train, so that
    a driver that is killed leaves a population that resumes); returns its "population" entry."""
    from hetrl.checkpoint import write_json

    out.mkdir(parents=True, exist_ok=True)
    base = members[0].cfg
    pop = {"seeds": spec.get("seeds", sorted({m.seed for m in members})), "sweep": spec.get("sweep", {}),
           "members": [m.to_json() for m in members], "groups": spec.get("groups")}
    write_json({"format": FORMAT, "algo": base.algo, "env": base.env, "population": pop,
                "schedule": base.system.schedule}, out / POPULATION_FILE)
    return pop


def is_population(path: str | Path) -> bool:
    return (Path(path) / POPULATION_FILE).is_file()


def read_population(path: str | Path) -> dict:
    f = Path(path) / POPULATION_FILE
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{f} is unreadable ({type(e).__name__}); give the directory of a population hetrl wrote") from None
    if data.get("format") != FORMAT:
        raise UsageError(f"{f} is not a hetrl population (format {data.get('format')!r})")
    return data


# ---- training a population ---------------------------------------------------------------------------------
def default_out(cfg: Config, members: int) -> Path:
    return Path(f"runs/{cfg.algo}-{cfg.env.replace(':', '_').replace('/', '_')}-pop{members}")


def _kernel_of(cfg: Config, env) -> tuple[str, bool]:
    """The learner kernel the members will run (the machine's cached choice, else measured now) and whether it
    runs without the GIL."""
    from hetrl import kernels
    from hetrl.actors.envs import prepare_env, probe_spaces
    from hetrl.algos import learn_spec, make_algorithm
    from hetrl.runtime.core import resolve_device
    from hetrl.runtime.layout import grads_per_phase, group_size

    obs, act = probe_spaces(prepare_env(env, cfg))
    device = resolve_device(cfg.system.device)
    choice = kernels.choose(cfg, lambda: make_algorithm(cfg, obs, act, device), obs, act, learn_spec(cfg, obs, act),
                            device, group_size(grads_per_phase(cfg), cfg.prioritized))
    return choice.name, kernels.kernel_class(choice.name).side_by_side()


def train(algo: str, env="CartPole-v1", seeds: Any = 1, sweep: Any = None, steps: int | None = None,
          out: str | Path | bool | None = None, force: bool = False, config=None, save_replay: bool = False,
          progress: bool = True, evaluate_episodes: int | None = None, plan: str = "auto",
          objective: str = "throughput", allow_more_envs: bool = False, callback=None, lanes: int = 0,
          **settings: Any) -> PopulationRun:
    """Train a population (see the module docstring); `hetrl.train(..., seeds=, sweep=)` comes here. Returns the
    finished population run, every member evaluated and saved in `out` (default runs/ALGO-ENV-popN)."""
    import os

    from hetrl import api
    from hetrl.actors.envs import env_name
    from hetrl.planner.population import plan_population

    seeds, sweep = parse_seeds(seeds), parse_sweep(sweep)
    if settings.get("seed") is not None:
        raise UsageError("a population takes its seeds from --seeds (seeds=); drop --seed / seed=")
    settings.pop("seed", None)
    env_id = env if isinstance(env, str) else env_name(env)
    probe = make_config(algo, env_id, api._overrides(config, {"steps": steps, **settings}))
    n = len(seeds) * math.prod(len(v) for v in sweep.values())
    target = default_out(probe, n) if out in (None, True) else Path(out)
    cfg, out_path, planned = api.prepare(algo, env, steps, seeds[0], target, force, config, plan, objective,
                                         allow_more_envs, progress, **settings)
    system = {k: cfg.get(k) for k in SYSTEM_KEYS}
    overrides = api._overrides(config, {"steps": steps, **settings})
    members = make_members(algo, env_id, {**overrides, **system}, seeds, sweep)
    kernel, free = _kernel_of(members[0].cfg, env)
    pinned = settings.get("schedule")
    pp = plan_population(len(members), os.cpu_count() or 1, kernel, free,
                         schedule=pinned or (None if plan == "auto" else cfg.system.schedule), device=cfg.system.device)
    if lanes:
        pp.lanes = int(lanes)
    spec = {"seeds": seeds, "sweep": {k: [str(v) for v in vs] for k, vs in sweep.items()},
            "groups": [[members[i].name for i in g] for g in pp.groups], "plan": pp.to_json()}
    planned = {**planned, "population_plan": pp.to_json()}
    if progress:
        print(f"hetrl: training a population of {len(members)} {cfg.algo} agents on {cfg.env} for {cfg.steps:,} env "
              f"steps each: {pp.describe()} -> {out_path}", file=sys.stderr)
    if pp.schedule == "inline":
        for m in members:
            m.cfg.system.schedule = "inline"
        run = PopulationRun(members, env, out_path, save_replay, planned, pp.lanes, spec)
        run.learn(progress=progress, callback=callback)
        n_eval = cfg.eval_episodes if evaluate_episodes is None else evaluate_episodes
        if n_eval and run.interrupted in (False, "callback"):
            run.evaluate(n_eval)
            run.save()
        return run
    return _train_groups(members, env, out_path, pp, spec, planned, save_replay, progress, evaluate_episodes)


def _group_main(group: int, configs: list, names: list[str], seeds: list[int], settings: list[dict], env, out: str,
                lanes: int, save_replay: bool, evaluate_episodes: int | None, ship: bool, stopped=None) -> dict:
    """Group `group` of a population, in its own process or Ray task: its members trained as an inline
    population, saved in OUT/members/NAME, its progress in OUT/groups/GROUP; returns their files (`ship`: a Ray
    task on another node) and figures. `stopped(env_steps)`: whether the driver asks the group to stop (before a
    phase; every member saved)."""
    members = [Member(n, s, st, c) for n, s, st, c in zip(names, seeds, settings, configs)]
    for m in members:
        m.cfg.system.schedule = "inline"
    run = PopulationRun(members, env, Path(out), save_replay, lanes=lanes, group=group)
    run.learn(progress=False, stopped=stopped)
    n_eval = members[0].cfg.eval_episodes if evaluate_episodes is None else evaluate_episodes
    if n_eval and run.interrupted in (False, "callback"):
        run.evaluate(n_eval)
    for r in run.runs:
        r.save(r.out)
    files = {}
    if ship:
        for d in [Path(out) / "members" / m.name for m in members] + [Path(out) / "groups" / str(group)]:
            files.update({str(p.relative_to(out)): p.read_bytes() for p in d.rglob("*") if p.is_file()})
    return {"figures": run.figures(), "files": files, "interrupted": run.interrupted}


def _train_groups(members: list[Member], env, out: Path, pp, spec: dict, planned: dict, save_replay: bool,
                  progress: bool, evaluate_episodes: int | None) -> "GroupedPopulation":
    """The groups of `pp` as processes (local) or Ray tasks (ray), each an inline population of its members."""
    t0 = time.perf_counter()
    jobs = [(n, [members[i].cfg for i in g], [members[i].name for i in g], [members[i].seed for i in g],
             [members[i].settings for i in g]) for n, g in enumerate(pp.groups)]
    write_members(out, members, spec)
    if pp.schedule == "ray":
        results = _run_ray(jobs, env, out, pp.lanes, save_replay, evaluate_episodes, members[0].cfg)
    else:
        results = _run_processes(jobs, env, out, pp.lanes, save_replay, evaluate_episodes)
    wall = time.perf_counter() - t0
    steps = members[0].cfg.steps
    figures = {"members": len(members), "env_steps": steps, "wall_s": wall,
               "env_steps_per_s": len(members) * steps / wall if wall else 0.0,
               "groups": len(pp.groups), "lanes": pp.lanes,
               "learner_kernel": results[0]["figures"].get("learner_kernel") if results else None}
    if pp.schedule == "local":   # every process's peak: the groups' and this one's (their sum bounds the run's)
        import resource

        groups_rss = [r["figures"].get("peak_rss_mb") or 0.0 for r in results]
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        figures.update(group_peak_rss_mb=groups_rss, peak_rss_mb=own + sum(groups_rss))
    interrupted = next((r["interrupted"] for r in results if r["interrupted"]), False)
    result = write_population(out, members, spec, figures, planned, interrupted)
    return GroupedPopulation(members, out, result, interrupted)


class _DriverStop:
    """A group process's view of its driver, asked at the start of every phase with the members' env steps.

    The driver asks the groups to stop (it got SIGINT / SIGTERM) by setting `stop_at` to one past the furthest
    group's count; every group then stops at the first phase boundary at or beyond it. A phase is the same
    number of env steps per member in every group, so all members stop at the same count and the population
    resumes as one. The lock makes "record my count, read stop_at" and "read every count, set stop_at" happen
    one at a time. A group whose starting process (the driver, or its fork server) has ended stops at once
    rather than train on alone."""

    def __init__(self, lock, progress, stop_at):
        import os

        self.lock, self.progress, self.stop_at, self.parent = lock, progress, stop_at, os.getppid()

    def __call__(self, env_steps: int) -> bool:
        import os

        if os.getppid() != self.parent:
            return True
        with self.lock:
            self.progress.value = env_steps
            at = self.stop_at.value
        return 0 <= at <= env_steps


def _group_process(conn, lock, progress, stop_at, *args) -> None:
    """A group's process: the terminal's Ctrl-C goes to the driver alone (this process leads its own process group),
    which asks every group to stop (_DriverStop); sends back ("ok", figures) or ("error", the exception)."""
    import os

    os.setpgrp()
    try:
        conn.send(("ok", _group_main(*args, stopped=_DriverStop(lock, progress, stop_at))))
    except BaseException as e:  # noqa: BLE001 - sent to the driver, which raises it
        try:
            conn.send(("error", e))
        except Exception:   # an exception that does not pickle: its line
            conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _run_processes(jobs: list, env, out: Path, lanes: int, save_replay: bool, evaluate_episodes) -> list[dict]:
    """The groups as processes. SIGINT / SIGTERM to this driver asks every group to stop at the end of its phase
    with its members saved; a second one stops the driver's wait, which still gives the groups a minute to save."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from hetrl.api import stop_signals

    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    lock, stop_at = ctx.Lock(), ctx.Value("q", -1, lock=False)
    progress = [ctx.Value("q", 0, lock=False) for _ in jobs]

    def ask_to_stop() -> None:   # every group stops at the first phase boundary past the furthest one
        with lock:
            if stop_at.value < 0:
                stop_at.value = max(v.value for v in progress) + 1

    procs, conns = [], []
    results: list = [None] * len(jobs)
    try:
        with stop_signals() as stop:
            for job, mine in zip(jobs, progress):
                recv, send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_group_process, name="hetrl-group",
                                args=(send, lock, mine, stop_at, *job, env, str(out), lanes, save_replay,
                                      evaluate_episodes, False))
                p.start()
                send.close()
                procs.append(p)
                conns.append(recv)
            while any(r is None for r in results):
                if stop:
                    ask_to_stop()
                for c in wait([c for c, r in zip(conns, results) if r is None], timeout=0.5):
                    i = conns.index(c)
                    try:
                        results[i] = c.recv()
                    except EOFError:
                        results[i] = ("error", f"the process of group {i} ended with exit code {procs[i].exitcode}")
    except BaseException:
        ask_to_stop()
        for p in procs:
            p.join(60)
        raise
    for p in procs:
        p.join()
    errors = [r[1] for r in results if r[0] != "ok"]
    if errors:   # the groups share their settings: the first one's error is the one to show
        raise errors[0] if isinstance(errors[0], BaseException) else HetrlError(f"a population's group failed: "
                                                                                 f"{errors[0]}")
    out_results = [r[1] for r in results]
    if stop.signal:
        for r in out_results:
            r["interrupted"] = stop.signal
    return out_results


def _run_ray(jobs: list, env, out: Path, lanes: int, save_replay: bool, evaluate_episodes, cfg: Config) -> list[dict]:
    import ray

    from hetrl.runtime.ray_schedule import connect, disconnect

    connect(cfg)
    try:
        task = ray.remote(num_cpus=max(1, lanes))(_group_main)
        refs = [task.remote(*job, env, str(out), lanes, save_replay, evaluate_episodes, True) for job in jobs]
        results = ray.get(refs)
    finally:
        disconnect()   # a Ray this run started (a cluster or the caller's Ray is left running)
    for r in results:   # every member's files, wherever its task ran
        for rel, data in r["files"].items():
            p = out / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        r["files"] = {}
    return results


class GroupedPopulation:
    """A population trained in groups (local processes, Ray tasks): its members' directories and figures."""

    def __init__(self, members: list[Member], out: Path, result: dict, interrupted):
        self.members, self.out, self.result, self.interrupted = members, out, result, interrupted

    def policies(self) -> dict:
        return load(self.out)


def load(path: str | Path, env=None) -> dict:
    """Every member's trained policy of the population in `path`: {member name: Policy}."""
    from hetrl.api import load as load_run

    data = read_population(path)
    return {m["name"]: load_run(Path(path) / m["dir"], env) for m in data["population"]["members"]}


def resume(path: str | Path, steps: int | None = None, env=None, progress: bool = True,
           evaluate_episodes: int | None = None, lanes: int = 0, **system: Any) -> PopulationRun:
    """Continue every member of the population in `path` (to `steps` env steps each if given), as one process."""
    from hetrl.api import _saved_config
    from hetrl.checkpoint import read_checkpoint, read_replay

    path = Path(path)
    data = read_population(path)
    members, states = [], []
    for m in data["population"]["members"]:
        ckpt = read_checkpoint(path / m["dir"])
        done = ckpt["counters"]["env_steps"]
        if steps is not None and steps <= done:
            raise UsageError(f"--steps {steps} is not beyond the {done} env steps member {m['name']} has done; "
                             "pass a larger total")
        cfg = _saved_config(ckpt, **{k: v for k, v in system.items() if v is not None},
                            **({"steps": steps} if steps is not None else {}))
        cfg.system.schedule = "inline"
        replay = read_replay(path / m["dir"])
        state = dict(ckpt)
        if replay is not None:
            state["replay"] = replay
        members.append(Member(m["name"], int(m["seed"]), m.get("settings") or {}, cfg))
        states.append(state)
    spec = {"seeds": data["population"]["seeds"], "sweep": data["population"].get("sweep", {}),
            "groups": data["population"].get("groups")}
    run = PopulationRun(members, env or members[0].cfg.env, path, any("replay" in s for s in states), lanes=lanes,
                        spec=spec)
    try:
        for r, state in zip(run.runs, states):
            r.schedule.load_state_dict(state)
            r.evaluations.load_state_dict({"best": state.get("best"), "history": state.get("evaluations", [])})
    except BaseException:
        run.close()
        raise
    run.learn(progress=progress)
    n_eval = members[0].cfg.eval_episodes if evaluate_episodes is None else evaluate_episodes
    if n_eval and run.interrupted in (False, "callback"):
        run.evaluate(n_eval)
        run.save()
    return run
