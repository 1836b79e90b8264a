"""How much memory the data storage takes, and whether the device it goes to has it.

Checked before anything is allocated, so a replay that cannot fit is refused at once with one line,
instead of a run that dies of memory hours later (a buffer of 500M CartPole transitions needs
~24 GB; SB3 users meet this as DLR-RM/stable-baselines3#1936). Two callers: the learner core, for
the whole replay before any storage, staging or shared ring exists (hetrl/runtime/core.py), and
`Storage.__init__` for the arrays it allocates itself (every replay buffer, the replay server on
its own node, a library user's `ReplayBuffer`). NumPy's zeroed arrays are committed lazily, so
without this check a too-large replay is often accepted and the process is killed when it fills.
The same warning is printed once per process (both callers check the same replay).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

from hetrl.errors import UsageError

WARN_FRACTION = 0.8      # warn above this share of the available memory; the largest size offered keeps it
_warned: set = set()     # (bytes, device) already warned about in this process


def storage_bytes(spec: dict, capacity: int) -> int:
    """Bytes of a full storage: capacity x the bytes of one item of every field."""
    per_item = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in spec.values())
    return int(capacity) * per_item


def arrays_bytes(arrays: dict) -> int:
    """Bytes of arrays given as {name: (full shape, dtype)} (a storage's layout, e.g. the frame storage's)."""
    return int(sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in arrays.values()))


def available_bytes(device: str | torch.device) -> int | None:
    """Memory available now on `device`: the host's MemAvailable, or a GPU's free memory; None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} KB"


def check_replay_memory(spec: dict, capacity: int, device: str | torch.device, arrays: dict | None = None) -> int:
    """The storage's full size in bytes; UsageError (one line: the size, what is available, the largest
    buffer_size that fits) when the device does not have it, a warning above WARN_FRACTION of it.
    `arrays` ({name: (full shape, dtype)}): the storage's own layout when it is not one row per
    transition of `spec` (the frame storage, hetrl/replay/frames.py)."""
    need = storage_bytes(spec, capacity) if arrays is None else arrays_bytes(arrays)
    have = available_bytes(device)
    if have is None or need == 0:
        return need
    per_item = need // int(capacity)
    fits = int(WARN_FRACTION * have // per_item)
    where = "this machine" if torch.device(device).type == "cpu" else str(device)
    if need > have:
        raise UsageError(f"the replay would need {_gb(need)} (buffer_size={capacity:,} x {per_item} bytes) but "
                         f"{where} has {_gb(have)} available; lower buffer_size (at most ~{fits:,} fits)")
    if need > WARN_FRACTION * have and (need, where) not in _warned:
        _warned.add((need, where))
        print(f"hetrl: warning: the replay will take {_gb(need)} of the {_gb(have)} available on {where} when "
              f"full; buffer_size={fits:,} would leave room for the rest", file=sys.stderr, flush=True)
    return need
