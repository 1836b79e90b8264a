"""Schedules: realisations of the training protocol (inline now; local and ray build on it)."""

from __future__ import annotations

from hetrl.actors.envs import EnvSpec
from hetrl.config import Config


def make_schedule(cfg: Config, env: EnvSpec):
    from hetrl.runtime.inline import InlineSchedule

    return InlineSchedule(cfg, env)
