"""How a population's members are grouped into processes and lanes (a member is never split).

A member's step is acting (its envs, its policy, its replay's inserts: Python, holding the GIL) and then its learner's
phase. On a CPU with several cores the members are split into one group per core, each a process (local) or a Ray task
(ray): every part of a member's step then runs on its own core, and within a group the members' envs step as one vector
env with one policy call per step for all of them. One process with the members' phases as lanes over the cores (the
compiled CPU kernel: its numba phase runs without the GIL, and numba's OpenMP or TBB threading layer takes launches from
several threads at once) parallelises only the learner's share: acting stays on one core. That one process is what
`--schedule inline` pins: it holds one copy of the process's fixed memory (the interpreter, torch) instead of one per
group. A GPU learner takes every member in one process (its phases queue on the device).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class PopulationPlan:
    schedule: str            # inline (one process), local (processes), ray (Ray tasks)
    groups: list[list[int]]  # member indices per process / task
    lanes: int               # member phases learned at once within a group
    kernel: str              # the learner kernel the members run (hetrl/kernels/)
    why: str

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        where = {"inline": "one process", "local": f"{len(self.groups)} processes",
                 "ray": f"{len(self.groups)} Ray tasks"}[self.schedule]
        sizes = "/".join(str(len(g)) for g in self.groups)
        return (f"{sum(len(g) for g in self.groups)} members in {where} (members per group: {sizes}), "
                f"{self.lanes} lane{'s' if self.lanes > 1 else ''} each, learner kernel {self.kernel}: {self.why}")


def split(members: int, groups: int) -> list[list[int]]:
    """`members` indices in `groups` contiguous groups of sizes differing by at most one (the larger first)."""
    return [a.tolist() for a in np.array_split(np.arange(members), max(1, min(groups, members)))]


def plan_population(members: int, cores: float, kernel: str, side_by_side: bool, schedule: str | None = None,
                    device: str = "cpu") -> PopulationPlan:
    """The grouping for `members` members on `cores` cores whose learner runs `kernel`; `schedule` pins it."""
    whole = max(1, math.floor(cores + 1e-9))
    if device != "cpu":
        return PopulationPlan("inline" if schedule in (None, "inline") else schedule, split(members, 1), 1, kernel,
                              f"the learner is on {device}: every member's phase is queued on it from one process")
    if schedule is None:
        schedule = "inline" if whole == 1 or members == 1 else "local"
    if schedule == "inline":
        lanes = min(whole, members) if side_by_side else 1
        why = (f"the {kernel} kernel runs side by side in threads, so {lanes} member phases learn at once on the cores"
               if lanes > 1 else f"the {kernel} kernel's phases do not run side by side in threads: members learn "
               "one after another" if side_by_side is False else "one core")
        return PopulationPlan("inline", split(members, 1), lanes, kernel, why)
    groups = split(members, min(whole, members))
    lanes = max(1, min(whole // len(groups), max(len(g) for g in groups))) if side_by_side else 1
    where = "process" if schedule == "local" else "Ray task"
    why = (f"one group per core, each acting and learning for its members in its own {where} (in one process, "
           f"acting would hold one core{'' if side_by_side else ' and so would learning'})")
    return PopulationPlan(schedule, groups, lanes, kernel, why)


def kernel_of(cfg, env) -> tuple[str, bool]:
    """The learner kernel a population's members will run (the learner core's choice) and whether phases of it run
    side by side in threads."""
    from hetrl import kernels
    from hetrl.actors.envs import prepare_env, probe_spaces
    from hetrl.machine import resolve_device
    from hetrl.runtime.core import choose_kernel

    obs, act = probe_spaces(prepare_env(env, cfg))
    choice = choose_kernel(cfg, obs, act, resolve_device(cfg.system.device))
    return choice.name, kernels.kernel_class(choice.name).side_by_side()
