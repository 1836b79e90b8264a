"""What every section of a profile measures with: the run's env, spaces and replay spec, the
devices, the sizes to measure (the grid), a share of the time budget per primitive, the
settings of :func:`~hetrl.planner.measure.measure` (CPU work in CPU time, GPU work in wall time),
and the foreign load watched around every entry (:meth:`Context.entry`: an entry measured under load,
or one that did not settle, is marked provisional). A re-measurement of some entries only (`only`: their
paths in the table, e.g. ``("learn", "cpu", "2", "256")``) skips every other entry."""

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
    only: set | None = None        # the entries to measure (paths); None: every entry
    prev: dict | None = None       # the table being re-measured (entries not measured again are read from it)
    reader: Any = None             # takes a load sample (hetrl.planner.load.sample; tests inject readings)
    retried: bool = False          # a second measurement: an entry that does not settle on a quiet machine is kept
    quick: bool = False
    log: Any = None                # the load readings around each entry (hetrl.planner.load.LoadLog)
    learn_spec: dict | None = None  # the fields of `learn`'s batches where they are not the replay's (on-policy)

    @property
    def learn_fields(self) -> dict:
        return self.learn_spec or self.spec

    def wants(self, *path) -> bool:
        """Whether this pass measures the entry at `path` (str keys)."""
        return self.only is None or tuple(str(p) for p in path) in self.only

    def wants_any(self, section: str) -> bool:
        return self.only is None or any(p[0] == section for p in self.only)

    def previous(self, *path):
        """The entry at `path` in the table being re-measured (None where it has none)."""
        node = self.prev
        for p in path:
            if not isinstance(node, dict) or str(p) not in node:
                return None
            node = node[str(p)]
        return node

    def entry(self, fn: Callable[[], Any]) -> dict:
        """Measure one entry: `fn()` gives a Timing (or a dict of figures); returned as JSON with the foreign load
        it was measured under (``foreign``: cores other processes kept busy) and, where that was more than the
        machine's background or the figure did not settle, ``provisional``: why it is not the machine's truth."""
        from hetrl.planner.load import LoadLog

        if self.log is None:
            self.log = LoadLog(self.reader)
        self.log.start()
        got = fn()
        load = self.log.stop()
        out = got.to_json() if hasattr(got, "to_json") else dict(got)
        why = verdict(out, load, self.retried or self.quick)
        if load is not None:
            out["foreign"] = round(load.foreign, 3)
        if why:
            out["provisional"] = why
        return out

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


def verdict(entry: dict, load, settled_enough: bool) -> str | None:
    """Why an entry is provisional (None: it is the machine's truth): measured while other processes kept
    cores busy, or its median did not settle within its time cap (unless `settled_enough`: a second
    measurement, or a quick profile, keeps an unsettled figure with its spread)."""
    if load is not None and load.busy:
        return f"measured under load: {load.short()}"
    if not entry.get("stable", True) and not settled_enough:
        return f"did not settle within its time cap (spread {100 * float(entry.get('spread', 0)):.0f}%)"
    return None
