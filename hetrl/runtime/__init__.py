"""Schedules: realisations of the training protocol (inline, local, ray; a population: population.py), and
where a run goes (launch.py: this process, or groups in processes or Ray tasks)."""

from __future__ import annotations

from hetrl.actors.envs import EnvSpec
from hetrl.config import Config


def make_schedule(cfg: Config, env: EnvSpec):
    if cfg.system.schedule == "local":  # actor processes + learner process (hetrl/runtime/local.py)
        from hetrl.runtime.local import LocalSchedule

        return LocalSchedule(cfg, env)
    if cfg.system.schedule == "ray":  # actors and a replay server on a Ray cluster (hetrl/runtime/ray_schedule.py)
        from hetrl.runtime.ray_schedule import RaySchedule

        return RaySchedule(cfg, env)
    from hetrl.runtime.inline import InlineSchedule

    return InlineSchedule(cfg, env)
