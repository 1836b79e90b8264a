"""This machine: its identity (CPU model, cores, torch, GPUs, optional packages), where hetrl caches what it
measured on it (the planner's profiles, the learner kernels chosen), and a process's memory on it."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import hashlib
import json
import os
import platform
import socket
from pathlib import Path


def cache_dir() -> Path:
    """$HETRL_CACHE_DIR, else $XDG_CACHE_HOME/hetrl, else ~/.cache/hetrl."""
    if os.environ.get("HETRL_CACHE_DIR"):
        return Path(os.environ["HETRL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hetrl"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    # OpenBLAS picks its kernels for the CPU when it loads, unless OPENBLAS_CORETYPE names others (some machines
    # set it): the compiled learner's speed depends on it (AVX2 kernels on an AVX-512 CPU: about half the
    # single-core GEMM rate), so a profile measured under one setting does not hold under another
    blas = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    return {"hostname": socket.gethostname(), "cpu_model": _cpu_model(), "cores": os.cpu_count() or 1,
            "torch": torch.__version__, "gpus": gpus, "optional": _optional_versions(), "blas_env": blas}


def _optional_versions() -> dict:
    """The versions of the optional packages a plan may pick (None: not installed). Part of the machine's
    id, so an environment without EnvPool or numba measures its own profile instead of reading one made
    where they were installed (whose plan would ask for them)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("envpool", "numba"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def machine_id(machine: dict) -> str:
    return hashlib.sha1(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:10]


def present_devices() -> list[str]:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu"] + [f"cuda:{i}" for i in range(n)]


def resolve_device(name: str) -> "torch.device":
    """The torch device of a `device` setting (auto: CUDA where available); a UsageError naming the fix for a
    device this machine does not have."""
    import torch

    from hetrl.errors import UsageError

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"device={name} asked but CUDA is not available (torch {torch.__version__}); "
                             "install a CUDA build of torch (see README) or use --set device=cpu")
        idx = torch.device(name).index or 0
        if idx >= torch.cuda.device_count():
            raise UsageError(f"device={name} does not exist: {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device(name)


def peak_memory(device: "torch.device") -> dict:
    """Peak memory so far: the learner process's RSS, the largest RSS of its finished child processes
    (local actors that were joined), and the GPU's max_memory_allocated when the learner is on one."""
    import resource   # (Unix only)

    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "peak_rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
    if device.type == "cuda":
        import torch

        out["gpu_max_memory_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def give_back_freed_memory() -> bool:
    """Ask the C allocator to return the free memory it holds to the system (glibc's malloc_trim), after a
    large release (a population's replays before its report): glibc serves arrays of up to 32 MB from its
    heap once a free has raised its mmap threshold, and such memory, once freed, stays in the process's RSS
    until trimmed. True where it asked (glibc), False where there is no glibc (macOS, Windows, musl)."""
    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)   # 1: memory released, 0: none
        return True
    except (OSError, AttributeError, TypeError):
        return False
