"""A population: M members (seeds x a sweep of settings that keep shapes) as one schedule that api.Run drives
(PopulationSchedule), and the population's files (population.json, result.json with the report).

Each member runs exactly what its own inline run would (its envs, acting policy, replay and learner seeded and
drawing as that run's), so member i equals the inline run of seed i (tests/test_population.py).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrl import registry
from hetrl.actors import Actor
from hetrl.checkpoint import write_json
from hetrl.config import SYSTEM_KEYS, Config, check_value, make_config, settings_class
from hetrl.errors import HetrlError, UsageError
from hetrl.machine import give_back_freed_memory
from hetrl.runtime.core import LearnerCore, Schedule
from hetrl.runtime.inline import InlineSchedule

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


# ---- who the members are ---------------------------------------------------------------------------------------
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
    if isinstance(sweep, dict):
        pairs = [(str(k), list(v) if isinstance(v, (list, tuple)) else [v]) for k, v in sweep.items()]
    else:
        pairs = []
        for pair in sweep or ():
            if "=" not in pair:
                raise UsageError(f"--sweep {pair!r} is not KEY=V1,V2,...; write e.g. --sweep lr=0.001,0.0003")
            k, v = pair.split("=", 1)
            pairs.append((k.strip(), [x.strip() for x in v.split(",") if x.strip()]))
    out: dict[str, list] = {}
    for k, values in pairs:
        if k in out:
            raise UsageError(f"--sweep {k} is given twice; give all its values in one --sweep {k}=V1,V2")
        if not values:
            raise UsageError(f"--sweep {k}= has no values; give e.g. --sweep {k}=V1,V2")
        out[k] = values
    return out


def fixed_settings(algo: str) -> set[str]:
    """What every member of a population of `algo` shares: the settings that shape its networks or its
    learner's program, those that set when it acts and learns, the system's, and what names the run."""
    cls, settings = registry.get(algo), settings_class(algo)
    return (set(settings.SHAPE_SETTINGS) | set(settings.SCHEDULE_SETTINGS) | set(getattr(cls, "shape_settings", ()))
            | set(getattr(cls, "schedule_settings", ())) | set(SYSTEM_KEYS) | {"algo", "env", "seed"})


def make_members(algo: str, env: str, overrides: dict[str, Any], seeds: list[int],
                 sweep: dict[str, list]) -> list[Member]:
    """The members: every combination of the swept values (grid) x every seed, each with its config."""
    cls, fixed = settings_class(algo), fixed_settings(algo)
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
    for combo in itertools.product(*typed.values()):
        settings = dict(zip(typed, combo))
        for seed in seeds:
            label = [f"{k}{str(v).replace(' ', '').replace('/', '_')}" for k, v in settings.items()]
            cfg = make_config(algo, env, {**overrides, **settings, "seed": seed})
            members.append(Member("-".join([f"seed{seed}", *label]), seed, settings, cfg))
    return members


# ---- the population's files ------------------------------------------------------------------------------------
def is_population(path: str | Path) -> bool:
    return (Path(path) / POPULATION_FILE).is_file()


def read_population(path: str | Path) -> dict:
    f = Path(path) / POPULATION_FILE
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{f} is unreadable ({type(e).__name__}); give the directory of a population hetrl "
                         "wrote") from None
    if data.get("format") != FORMAT:
        raise UsageError(f"{f} is not a hetrl population (format {data.get('format')!r})")
    return data


def write_members(out: Path, members: list[Member], spec: dict) -> dict:
    """OUT/population.json, what --resume rebuilds the members from (written before the members train, so that
    a driver that is killed leaves a population that resumes); returns its "population" entry."""
    out.mkdir(parents=True, exist_ok=True)
    base = members[0].cfg
    pop = {"seeds": spec.get("seeds", sorted({m.seed for m in members})), "sweep": spec.get("sweep", {}),
           "members": [m.to_json() for m in members], "groups": spec.get("groups")}
    write_json({"format": FORMAT, "algo": base.algo, "env": base.env, "population": pop,
                "schedule": base.system.schedule}, out / POPULATION_FILE)
    return pop


def write_population(out: Path, members: list[Member], spec: dict, figures: dict, info: dict) -> dict:
    """OUT/population.json and OUT/result.json (figures, `info`, and the report once every member has a result)."""
    base = members[0].cfg
    result = {"algo": base.algo, "env": base.env, "population": write_members(out, members, spec), **figures, **info,
              "config": {k: v for k, v in base.to_dict().items() if k != "seed"}}
    write_json(result, out / "result.json")
    if all((out / m.to_json()["dir"] / "result.json").is_file() for m in members):
        from hetrl.report import write_population_report

        result["aggregate"] = write_population_report(out)
        write_json(result, out / "result.json")
    return result


# ---- the schedule ------------------------------------------------------------------------------------------------
class MemberSchedule(Schedule):
    """One member of a population seen as a schedule of its own (its core and replay): what a Run saves,
    evaluates and reports of it. The population's schedule steps it."""

    name = "inline"

    def __init__(self, population: "PopulationSchedule", index: int):
        self.population, self.index = population, index
        self.core, self.replay = population.cores[index], population.replays[index]

    def _step(self) -> None:
        raise HetrlError("a population member is stepped by its population")

    def done(self) -> bool:
        return self.c.env_steps >= self.core.cfg.steps

    def _close(self) -> None:
        self.population.close()

    def actors_state(self) -> dict:
        return {"unsaved": "a population's actors are not saved"}

    def _restart_actors(self) -> None:
        self.population.stale = True   # (every member is loaded before the next phase)


class PopulationSchedule(InlineSchedule):
    """The inline schedule over the members of a population (their configs differ only in seed and swept settings
    that keep shapes and step schedules): one vector env (member m: envs m*n .. m*n+n-1) acting through
    Algorithm.stacked_policy, each member's own replay and learner core, `lanes` member phases learned at once.
    Its counters are member 0's (every member steps alike); `views` are the members as schedules of their own."""

    stacked = True
    stale = False                  # the members were loaded: one new actor at the next phase

    def __init__(self, members: list[Member], env, lanes: int = 0, spec: dict | None = None):
        if not members:
            raise HetrlError("a population needs at least one member")
        self.members, self.env, self.spec = members, env, dict(spec or {})
        cores: list[LearnerCore] = []
        try:
            for m in members:   # one thread each: the members are the lanes
                cores.append(LearnerCore(m.cfg, env, threads=1))
        except BaseException:
            for core in cores:
                core.close()
            raise
        self._setup(cores)
        self.views = [MemberSchedule(self, i) for i in range(len(self.cores))]
        self.lanes = max(1, min(lanes or os.cpu_count() or 1, len(self.cores)))
        # phases of members in threads only where the kernel runs without the GIL (the compiled one): torch's
        # eager ops on small networks hold it most of the time, and a loop is then faster
        self.parallel = self.lanes > 1 and all(core.kernel.side_by_side() for core in self.cores)
        self._pool = ThreadPoolExecutor(self.lanes, thread_name_prefix="hetrl-member") if self.parallel else None
        # on a GPU with the CUDA-graph kernel: every member's phase replayed from one graph, the members as parallel
        # branches (the GPU runs their small kernels side by side)
        self.graph = None
        if len(self.cores) > 1 and all(core.kernel.name == "cuda_graph" for core in self.cores):
            from hetrl.kernels.cuda_graph import MembersGraph

            self.graph = MembersGraph([core.algo for core in self.cores])

    def _restart_actors(self) -> None:
        """One actor over every member's envs, each env seeded as its member's own inline run seeds it."""
        if self.actor is not None:
            self.actor.close()
        M, n = len(self.cores), self.core.cfg.num_envs
        specs = [core.actor_spec(0, n) for core in self.cores]
        s0 = specs[0]
        policy = self.core.algo.stacked_policy([s.policy for s in specs], n)
        self.actor = Actor(s0.env, n * M, s0.env_seed, policy, s0.n_step, s0.gamma, s0.backend, groups=M,
                           seeds=[s.env_seed + j for s in specs for j in range(n)])
        self.versions = [-1] * M   # (the first _step loads every member's policy)

    def _refresh(self) -> list[int]:
        """Each member's newest policy into its part of the stacked policy, where newer than the one it acts with."""
        for m, store in enumerate(self.stores):
            new = store.latest(self.versions[m])
            if new is not None:
                self.actor.policy.load_member(m, new[0])
                self.versions[m] = new[1]
        return self.versions

    # ---- the protocol, one phase of every member ------------------------------------------------------
    def phase(self) -> list[tuple[float, int]]:
        if self.stale:   # members loaded from checkpoints: actors seeded for their step counts
            self.stale = False
            self._restart_actors()
        return super().phase()

    def _learn(self) -> None:
        """What each member's learner core allows now (its inline run's replay ratio), members as lanes."""
        owed = [core.ratio.allowed(len(replay)) for core, replay in zip(self.cores, self.replays)]
        learning = [m for m, k in enumerate(owed) if k]
        if self.graph is not None and owed[0] and len(set(owed)) == 1 and not self.core.cfg.prioritized \
                and not self.core.rollout:   # (an on-policy phase is each core's own: learn_rollout)
            self._learn_together(owed[0])
        else:   # the gradient steps each member's learner core allows, as its inline run takes them
            list((self._pool.map if self._pool is not None and len(learning) > 1 else map)(
                lambda m: self.cores[m].learn_from(self.replays[m]), learning))

    def _learn_together(self, n: int) -> None:
        """n gradient steps of every member, replayed from one CUDA graph with a branch per member."""
        M = len(self.cores)
        t0 = time.perf_counter()
        drawn = [core.draw(replay, n) for core, replay in zip(self.cores, self.replays)]
        t1 = time.perf_counter()
        tds = self.graph.learn([stack for stack, _, _ in drawn], [weights for _, _, weights in drawn])
        dt = (time.perf_counter() - t1) / M
        for core, td in zip(self.cores, tds):
            core.learned(td, n, dt)
            core.c.replay_s += (t1 - t0) / M

    def done(self) -> bool:
        return self.c.env_steps >= self.core.cfg.steps

    def figures(self) -> dict:
        """Env steps per member, and throughput counted over all members."""
        member, M = self.views[0].figures(), len(self.cores)
        wall, grads = member["wall_s"], sum(core.c.gradient_steps for core in self.cores)
        return {"members": M, "env_steps": member["env_steps"], "wall_s": wall,
                "env_steps_per_s": M * member["env_steps"] / wall if wall else 0.0,
                "member_env_steps_per_s": member["env_steps_per_s"], "gradient_steps": grads,
                "train_samples_per_s": self.core.cfg.batch_size * grads / wall if wall else 0.0,
                "lanes": self.lanes, "parallel_lanes": self.parallel,
                "learner_kernel": member.get("learner_kernel"), "peak_rss_mb": member.get("peak_rss_mb")}

    def drop_replays(self) -> None:
        """Let go of the members' replays once training is over and they are saved (replay.pt in a member's directory):
        their memory is freed for what follows (the report), the C allocator asked to return it (malloc_trim)."""
        self.replays = [None] * len(self.replays)
        self.replay = None
        for view in self.views:
            view.replay = None
        give_back_freed_memory()

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        super()._close()
