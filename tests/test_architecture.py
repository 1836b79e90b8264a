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


def test_every_schedule_is_a_schedule_of_the_core():
    from hetrl.runtime.core import Schedule
    from hetrl.runtime.inline import InlineSchedule
    from hetrl.runtime.local import LocalSchedule
    from hetrl.runtime.ray_schedule import RaySchedule

    for cls in (InlineSchedule, LocalSchedule, RaySchedule):
        assert issubclass(cls, Schedule)
        for name in ("figures", "state_dict", "load_state_dict"):  # written once, in the core
            assert getattr(cls, name) is getattr(Schedule, name), (cls.__name__, name)
