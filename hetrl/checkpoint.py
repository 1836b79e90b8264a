"""Run directories: checkpoint.pt (+ replay.pt), result.json; loading with clear errors.

checkpoint.pt holds plain tensors, numbers and strings only, so it loads with
torch.load(weights_only=True).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from hetrl.errors import UsageError

FORMAT = "hetrl-checkpoint-v1"
RUN_FILES = ("checkpoint.pt", "result.json", "replay.pt")


def check_out_dir(out: Path, force: bool) -> None:
    """Before any profiling or training: refuse to write over an existing run unless force, and make
    sure the directory can be created and written (a probe file), so a run never fails at its end."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"output path {out} is a file, not a directory; choose another --out")
    if not force and out.is_dir() and any((out / f).exists() for f in RUN_FILES):
        raise UsageError(f"{out} already holds a run; pass --force to overwrite it, "
                         f"--resume {out} to continue it, or choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".hetrl-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write the run directory {out} ({e.strerror or type(e).__name__}); "
                         "choose another --out") from None


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_json(obj: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_checkpoint(run_dir: str | Path) -> dict:
    d = Path(run_dir)
    if not d.is_dir():
        raise UsageError(f"run directory {d} does not exist; pass the --out directory of a finished run")
    f = d / "checkpoint.pt"
    if not f.is_file():
        raise UsageError(f"{d} has no checkpoint.pt; pass the --out directory of a run that saved one")
    try:
        ckpt = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated file, not a torch file, unsafe pickle ...
        raise UsageError(f"{f} is corrupt or not a hetrl checkpoint ({type(e).__name__}); "
                         "re-run training or restore the file") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise UsageError(f"{f} is not a hetrl checkpoint (format {ckpt.get('format') if isinstance(ckpt, dict) else '?'}); "
                         "pass the directory of a run made by hetrl")
    return ckpt


def read_replay(run_dir: str | Path) -> dict | None:
    f = Path(run_dir) / "replay.pt"
    if not f.is_file():
        return None
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"{f} is corrupt ({type(e).__name__}); delete it to resume with an empty replay") from None


def save_run(d: Path, *, config: dict, env: str, state: dict, result: dict, replay: dict | None = None) -> Path:
    """A run directory: checkpoint.pt (the learner core's `state` with the run's config and env), replay.pt when
    `replay` is given, and result.json; each file replaced atomically (an interrupted save leaves the previous)."""
    from hetrl import __version__

    d.mkdir(parents=True, exist_ok=True)
    atomic_save({"format": FORMAT, "hetrl_version": __version__, "config": config, "env": env, **state},
                d / "checkpoint.pt")
    if replay is not None:
        atomic_save(replay, d / "replay.pt")
    write_json(result, d / "result.json")
    return d
