"""Schedules: realisations of the training protocol (inline, local, ray; a population: population.py), and
where a run goes (launch.py: this process, or groups in processes or Ray tasks)."""

from __future__ import annotations

import importlib

from hetrl.actors.envs import EnvSpec
from hetrl.config import Config

# cfg.system.schedule -> its module and class, imported when used (ray_schedule imports Ray)
SCHEDULES = {"inline": "inline.InlineSchedule", "local": "local.LocalSchedule", "ray": "ray_schedule.RaySchedule"}


def make_schedule(cfg: Config, env: EnvSpec):
    module, cls = SCHEDULES[cfg.system.schedule].split(".")
    return getattr(importlib.import_module(f"hetrl.runtime.{module}"), cls)(cfg, env)
