"""The architecture the code keeps: a schedule is a transport around the one learner core."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[1] / "hetrl" / "runtime"
SCHEDULES = {"inline": {"inline"}, "local": {"local", "local_actor"}, "ray": {"ray_schedule", "ray_actor"}}


def runtime_imports(module: str) -> set[str]:
    tree = ast.parse((RUNTIME / f"{module}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hetrl.runtime."):
            out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("hetrl.runtime."))
    return out


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_no_schedule_imports_another_schedule(schedule):
    others = set().union(*(mods for name, mods in SCHEDULES.items() if name != schedule))
    for module in SCHEDULES[schedule]:
        assert runtime_imports(module) & others == set(), module


def test_algorithms_never_import_the_runtime():
    algos = RUNTIME.parent / "algos"
    for f in algos.glob("*.py"):
        assert "hetrl.runtime" not in f.read_text(), f.name


def test_the_sb3_front_end_is_one_wing():
    """The algorithms know nothing of SB3 (their SB3 facts are the wing's table), and the wing drives a Run by its
    public methods, never the schedule's parts."""
    hetrl_dir = RUNTIME.parent
    for f in (hetrl_dir / "algos").glob("*.py"):
        text = f.read_text()
        assert "hetrl.sb3" not in text and "SB3Compat" not in text, f.name
    for f in (hetrl_dir / "sb3").glob("*.py"):
        text = f.read_text()
        assert ".schedule." not in text and "schedule.core" not in text, f.name
    from hetrl import registry
    from hetrl.sb3.compat import BUILTIN, GENERIC, of

    assert all(of(registry.get(name)) is BUILTIN[name] for name in BUILTIN)
    assert of(type("Mine", (registry.get("dqn"),), {"sb3": None})) is GENERIC


def test_every_schedule_is_a_schedule_of_the_core():
    from hetrl.runtime.core import Schedule
    from hetrl.runtime.inline import InlineSchedule
    from hetrl.runtime.local import LocalSchedule
    from hetrl.runtime.ray_schedule import RaySchedule

    for cls in (InlineSchedule, LocalSchedule, RaySchedule):
        assert issubclass(cls, Schedule)
        for name in ("figures", "state_dict", "load_state_dict"):  # written once, in the core
            assert getattr(cls, name) is getattr(Schedule, name), (cls.__name__, name)


# what a schedule must not compute itself: the replay ratio and its rate limiter, the priority lag and
# the restart policy of actors are the learner core's (hetrl/runtime/core.py, ratio.py), written once
POLICY_NAMES = {"replay_ratio", "grad_debt", "learning_starts", "RatioRule", "RateLimiter", "can_insert", "can_sample",
                "samples_per_insert", "spi", "min_size", "error_buffer", "min_diff", "max_diff", "priority_lag",
                "max_lag", "lag_room", "MAX_RESTARTS"}


def names_used(module: str) -> set[str]:
    tree = ast.parse((RUNTIME / f"{module}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name.split(".")[-1])
    return out


@pytest.mark.parametrize("module", sorted(set().union(*SCHEDULES.values(), {"population"})))
def test_no_schedule_computes_the_replay_ratio_or_the_restart_policy(module):
    assert names_used(module) & POLICY_NAMES == set(), module


def test_the_learner_core_owns_that_policy():
    """The names the schedules leave alone are the core's (the rest: gone, or the replay server's side)."""
    used = names_used("core") | names_used("ratio") | names_used("layout")
    assert POLICY_NAMES - {"grad_debt", "RateLimiter", "can_sample", "samples_per_insert", "max_diff"} <= used
