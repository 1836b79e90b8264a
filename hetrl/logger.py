"""Training progress: a rich progress bar, TensorBoard event files and a CSV of the same scalars."""

from __future__ import annotations

import csv
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np


class Logger:
    REDRAW_S = 0.1   # the progress bar's update interval (rich redraws at 10 Hz)

    def __init__(self, out: Path | None, total_steps: int, interval: int, progress: bool = True,
                 start_step: int = 0):
        self.out, self.interval, self.total = out, interval, total_steps
        self.returns: deque[float] = deque(maxlen=20)
        self._next_log = start_step + interval
        self._writer = None
        self._csv = None
        if out is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(out / "tb"))
            new = not (out / "progress.csv").exists()
            self._csv_file = open(out / "progress.csv", "a", newline="")
            self._csv = csv.writer(self._csv_file)
            if new:
                self._csv.writerow(["env_steps", "wall_s", "env_steps_per_s", "train_samples_per_s",
                                    "episode_return", "episodes"])
        self._progress = None
        if progress and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                      TextColumn("{task.completed:,}/{task.total:,} steps"),
                                      TextColumn("{task.fields[stats]}"), TimeRemainingColumn(),
                                      transient=False)
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, stats="")
            self._progress.start()
        self._plain = progress and self._progress is None
        self._redraw_at = 0.0

    def due(self, env_steps: int) -> bool:
        """Whether update() at env_steps would show or write anything: a row every `interval` env steps and at
        the end, or a progress bar last updated REDRAW_S ago. Callers gather the figures for update() only then:
        gathered after every phase of one env step (train_freq 1), they cost more than the env step itself."""
        if env_steps >= self._next_log or env_steps >= self.total:
            return True
        return self._progress is not None and time.perf_counter() >= self._redraw_at

    @property
    def recent_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    def episodes(self, eps: list[tuple[float, int]]) -> None:
        self.returns.extend(r for r, _ in eps)

    def update(self, env_steps: int, wall_s: float, env_sps: float, train_sps: float, episodes: int) -> None:
        stats = f"{env_sps:,.0f} env steps/s  {train_sps:,.0f} samples/s  return {self.recent_return:.1f}"
        if self._progress is not None:
            self._progress.update(self._task, completed=env_steps, stats=stats)
            self._redraw_at = time.perf_counter() + self.REDRAW_S
        if env_steps < self._next_log and env_steps < self.total:
            return
        self._next_log = env_steps + self.interval
        if self._plain:
            print(f"[{env_steps:>9,}/{self.total:,}] {stats}", file=sys.stderr, flush=True)
        if self._writer is not None:
            for k, v in (("env_steps_per_s", env_sps), ("train_samples_per_s", train_sps),
                         ("episode_return", self.recent_return)):
                if np.isfinite(v):
                    self._writer.add_scalar(f"train/{k}", v, env_steps)
            self._csv.writerow([env_steps, f"{wall_s:.3f}", f"{env_sps:.1f}", f"{train_sps:.1f}",
                                f"{self.recent_return:.3f}", episodes])
            self._csv_file.flush()

    def scalar(self, name: str, value: float, step: int) -> None:
        if self._writer is not None:
            self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._writer is not None:
            self._writer.close()
            self._csv_file.close()
