"""How a population's members are grouped into processes and lanes (a member is never split).

A member's phase is the learner's unit of work. Members learn side by side in one process, as lanes over its
cores, where the learner kernel runs without Python's GIL (the compiled CPU kernel: its numba phase releases
it); there one process with a lane per core takes every member, with one vector env and one policy call per
step for all of them. A kernel that holds the GIL (the public torch kernel on small networks) gains nothing
from threads: members are then split into one group per core, each a process (local) or a Ray task (ray)
learning its members one after another. A GPU learner takes every member in one process (its phases queue on
the device).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class PopulationPlan:
    schedule: str            # inline (one process), local (processes), ray (Ray tasks)
    groups: list[list[int]]  # member indices per process / task
    lanes: int               # member phases learned at once within a group
    kernel: str              # the learner kernel the members run (hetrl/kernels/)
    why: str

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self, names: list[str] | None = None) -> str:
        where = {"inline": "one process", "local": f"{len(self.groups)} processes",
                 "ray": f"{len(self.groups)} Ray tasks"}[self.schedule]
        sizes = "/".join(str(len(g)) for g in self.groups)
        return (f"{sum(len(g) for g in self.groups)} members in {where} (members per group: {sizes}), "
                f"{self.lanes} lane{'s' if self.lanes > 1 else ''} each, learner kernel {self.kernel}: {self.why}")


def split(members: int, groups: int) -> list[list[int]]:
    """`members` indices in `groups` contiguous groups of sizes differing by at most one."""
    groups = max(1, min(groups, members))
    size, extra = divmod(members, groups)
    out, start = [], 0
    for g in range(groups):
        n = size + (g < extra)
        out.append(list(range(start, start + n)))
        start += n
    return out


def plan_population(members: int, cores: float, kernel: str, releases_gil: bool, schedule: str | None = None,
                    device: str = "cpu") -> PopulationPlan:
    """The grouping for `members` members on `cores` cores whose learner runs `kernel`; `schedule` pins it."""
    whole = max(1, math.floor(cores + 1e-9))
    if device != "cpu":
        return PopulationPlan("inline" if schedule in (None, "inline") else schedule, split(members, 1), 1, kernel,
                              f"the learner is on {device}: every member's phase is queued on it from one process")
    if schedule is None:
        schedule = "inline" if releases_gil or whole == 1 or members == 1 else "local"
    if schedule == "inline":
        lanes = min(whole, members) if releases_gil else 1
        why = (f"the {kernel} kernel runs without the GIL, so {lanes} member phases learn at once on the cores"
               if lanes > 1 else f"the {kernel} kernel holds the GIL: members learn one after another"
               if releases_gil is False else "one core")
        return PopulationPlan("inline", split(members, 1), lanes, kernel, why)
    groups = split(members, min(whole, members))
    lanes = max(1, min(whole // len(groups), max(len(g) for g in groups))) if releases_gil else 1
    why = (f"one group per core, each learning its members in its own {'process' if schedule == 'local' else 'Ray task'}"
           + ("" if releases_gil else f" (the {kernel} kernel holds the GIL, so threads would not help)"))
    return PopulationPlan(schedule, groups, lanes, kernel, why)
