"""What every section of a profile measures with: the run's env, spaces and replay spec, the
devices, the sizes to measure (the grid), a share of the time budget per primitive, and the
settings of :func:`~hetrl.planner.measure.measure` (CPU work in CPU time, GPU work in wall time)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


class Budget:
    """Shares a total time budget among the primitives still to measure."""

    def __init__(self, total_s: float, count: int, cap_s: float, floor_s: float = 0.1):
        self.deadline = time.perf_counter() + total_s
        self.left, self.cap_s, self.floor_s = max(1, count), cap_s, floor_s

    def cap(self) -> float:
        remaining = self.deadline - time.perf_counter()
        cap = max(self.floor_s, min(self.cap_s, remaining / self.left))
        self.left = max(1, self.left - 1)
        return cap


def sync_of(dev: str) -> Callable[[], object] | None:
    """What makes a round's asynchronous device work count: torch.cuda.synchronize on a GPU."""
    if not dev.startswith("cuda"):
        return None
    import torch

    return lambda: torch.cuda.synchronize(dev)


@dataclass
class Context:
    """One profile's shared state (built by run_profile)."""

    cfg: Any
    env: Any                       # the env the run trains on (Atari preprocessing, frame_stack applied)
    obs_space: Any
    act_space: Any
    spec: dict                     # the run's replay spec {field: (shape, dtype)}
    devices: list[str]
    grid: dict                     # the sizes to measure (table.grid_for)
    budget: Budget
    mkw: dict                      # measure() settings (tolerance; fewer rounds in a quick profile)
    say: Callable[[str], None]
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    learn_spec: dict | None = None  # the fields of `learn`'s batches where they are not the replay's (on-policy)

    @property
    def learn_fields(self) -> dict:
        return self.learn_spec or self.spec

    @property
    def cpu(self) -> dict:
        """measure() settings for single-threaded CPU work: CPU time of the process (see measure.py)."""
        return {**self.mkw, "clock": time.process_time}

    def kw_of(self, dev: str) -> dict:
        return self.cpu if dev == "cpu" else self.mkw

    def cap(self) -> float:
        return self.budget.cap()

    @property
    def bytes_per_transition(self) -> int:
        return int(sum(int(np.prod(s)) * np.dtype(dt).itemsize for s, dt in self.spec.values()))
