"""`model.logger`: SB3's logger interface (record, record_mean, dump, get_dir) for the SB3-style classes and the
callbacks (EvalCallback records eval/mean_reward and dumps).

Outputs as SB3 configures them: a table on stdout when verbose >= 1, TensorBoard scalars when tensorboard_log
is set (tensorboard_log/<tb_log_name>_<N>, N counting up per learn() with reset_num_timesteps, as SB3 names
them). `model.set_logger(...)` takes any logger with record/dump, SB3's own included.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

DEBUG, INFO, WARN, ERROR, DISABLED = 10, 20, 30, 40, 50


class Logger:
    def __init__(self, folder: str | None = None, stdout: bool = False, tensorboard: bool = False):
        self.dir = folder
        self.level = INFO
        self.name_to_value: dict[str, Any] = defaultdict(float)
        self.name_to_count: dict[str, int] = defaultdict(int)
        self.name_to_excluded: dict[str, tuple] = {}
        self.stdout = stdout
        self._tb = None
        if tensorboard and folder is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(folder)
        self.output_formats = [f for f, on in (("stdout", stdout), ("tensorboard", self._tb is not None)) if on]

    def record(self, key: str, value: Any, exclude: str | tuple | None = None) -> None:
        self.name_to_value[key] = value
        self.name_to_excluded[key] = (exclude,) if isinstance(exclude, str) else tuple(exclude or ())

    def record_mean(self, key: str, value: Any, exclude: str | tuple | None = None) -> None:
        old, n = self.name_to_value[key], self.name_to_count[key]
        self.name_to_value[key] = old * n / (n + 1) + value / (n + 1)
        self.name_to_count[key] = n + 1
        self.name_to_excluded[key] = (exclude,) if isinstance(exclude, str) else tuple(exclude or ())

    def dump(self, step: int = 0) -> None:
        if self.stdout and self.name_to_value:
            self._table()
        if self._tb is not None:
            for k, v in self.name_to_value.items():
                if "tensorboard" in self.name_to_excluded.get(k, ()):
                    continue
                if isinstance(v, (int, float, np.integer, np.floating)) and np.isfinite(v):
                    self._tb.add_scalar(k, float(v), step)
            self._tb.flush()
        self.name_to_value.clear()
        self.name_to_count.clear()
        self.name_to_excluded.clear()

    def _table(self) -> None:
        rows = []
        for k in sorted(self.name_to_value):
            if "stdout" in self.name_to_excluded.get(k, ()):
                continue
            v = self.name_to_value[k]
            text = f"{v:<8.3g}" if isinstance(v, (float, np.floating)) else str(v)
            rows.append((k, text))
        if not rows:
            return
        kw, vw = max(len(k) for k, _ in rows), max(len(v) for _, v in rows)
        line = "-" * (kw + vw + 7)
        print(line)
        for k, v in rows:
            print(f"| {k:<{kw}} | {v:<{vw}} |")
        print(line, flush=True)

    def log(self, *args, level: int = INFO) -> None:
        if self.level <= level and self.stdout:
            print(*args)

    def debug(self, *args) -> None:
        self.log(*args, level=DEBUG)

    def info(self, *args) -> None:
        self.log(*args, level=INFO)

    def warn(self, *args) -> None:
        self.log(*args, level=WARN)

    def error(self, *args) -> None:
        self.log(*args, level=ERROR)

    def set_level(self, level: int) -> None:
        self.level = level

    def get_dir(self) -> str | None:
        return self.dir

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def tb_dir(tensorboard_log: str, tb_log_name: str, reset_num_timesteps: bool) -> str:
    """SB3's run directory: tensorboard_log/<tb_log_name>_<N>, N one more than the last (the last when continuing)."""
    root = Path(tensorboard_log)
    last = 0
    if root.is_dir():
        for p in root.iterdir():
            head, _, tail = p.name.rpartition("_")
            if head == tb_log_name and tail.isdigit():
                last = max(last, int(tail))
    n = last + 1 if reset_num_timesteps or last == 0 else last
    return os.fspath(root / f"{tb_log_name}_{n}")


def configure(verbose: int, tensorboard_log: str | None, tb_log_name: str, reset_num_timesteps: bool) -> Logger:
    folder = tb_dir(tensorboard_log, tb_log_name, reset_num_timesteps) if tensorboard_log else None
    return Logger(folder, stdout=verbose >= 1, tensorboard=folder is not None)

