"""Schedules: realisations of the training protocol (inline, local; ray builds on them)."""

from __future__ import annotations

from hetrl.actors.envs import EnvSpec
from hetrl.config import Config


def make_schedule(cfg: Config, env: EnvSpec):
    if cfg.schedule == "local":  # actor processes + learner process (hetrl/runtime/local.py)
        from hetrl.runtime.local import LocalSchedule

        return LocalSchedule(cfg, env)
    from hetrl.runtime.inline import InlineSchedule

    return InlineSchedule(cfg, env)
