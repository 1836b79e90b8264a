"""Device power: measured where the machine lets us (RAPL, NVML), else a documented estimate.

Each device gets ``{"idle_w", "busy_w", "source"}``:

* CPU: ``idle_w`` is the package's power with nothing of ours running, ``busy_w`` the extra
  watts of ONE busy core (the model multiplies it by the busy cores of a plan).
  - ``source="rapl"``: read from Linux RAPL (``/sys/class/powercap/intel-rapl:N/energy_uj``,
    package domains, wrap-around handled): package energy over a short idle interval, then
    over the same interval with one core spinning; busy_w = the difference.
  - ``source="estimated"``: :data:`CPU_TDP` by CPU model (TDP / cores per busy core; idle
    = :data:`CPU_IDLE_FRACTION` of TDP, scaled to this machine's cores), else
    :data:`CPU_DEFAULT_W_PER_CORE` per busy core.
* GPU: ``idle_w`` the board's power when idle, ``busy_w`` its board power when busy.
  - ``source="nvml"``: ``pynvml`` (nvidia-ml-py, optional import): busy_w = enforced power
    limit, idle_w = power drawn now (nothing of ours runs on it while profiling).
  - ``source="estimated"``: :data:`GPU_BOARD_W` by name (busy_w = board power, idle_w =
    :data:`GPU_IDLE_FRACTION` of it), else :data:`GPU_DEFAULT_W`.

Anything shown from an estimated entry is labelled "estimated" (see explain.py).

Estimate table (vendor TDP / board power, W; idle fractions from typical idle draws):
"""

from __future__ import annotations

import glob
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# --- the documented estimates --------------------------------------------------------------
CPU_TDP: list[tuple[str, float, int]] = [  # (regex on the CPU model name, TDP W, physical cores)
    (r"EPYC 9654", 360.0, 96),
    (r"EPYC 7763", 280.0, 64),
    (r"EPYC 7742", 225.0, 64),
    (r"Platinum 8480", 350.0, 56),
    (r"Platinum 8380", 270.0, 40),
    (r"Gold 6248", 150.0, 20),
    (r"i9-13900K", 125.0, 24),
    (r"i7-12700", 65.0, 12),
    (r"Ryzen 9 7950X", 170.0, 16),
    (r"Apple M\d", 30.0, 10),
]
CPU_DEFAULT_W_PER_CORE = 8.0        # a server core under load (~200 W / 24-28 cores)
CPU_IDLE_FRACTION = 0.25            # package idle / TDP
GPU_BOARD_W: list[tuple[str, float]] = [  # (substring of the CUDA device name, board power W)
    ("H200", 700.0), ("H100 PCIe", 350.0), ("H100", 700.0), ("A100", 400.0), ("L40S", 350.0),
    ("L40", 300.0), ("L4", 72.0), ("A10G", 300.0), ("A10", 150.0), ("T4", 70.0), ("V100", 300.0),
    ("RTX 4090", 450.0), ("RTX 3090", 350.0), ("RTX A6000", 300.0),
]
GPU_DEFAULT_W = 250.0
GPU_IDLE_FRACTION = 0.12

__doc__ += "\n".join(
    ["    CPU (regex, TDP W, cores): " + "; ".join(f"{r} {w:g}/{c}" for r, w, c in CPU_TDP),
     f"    CPU fallback: {CPU_DEFAULT_W_PER_CORE:g} W per busy core, idle {CPU_IDLE_FRACTION:g} x TDP",
     "    GPU (name, board W): " + "; ".join(f"{n} {w:g}" for n, w in GPU_BOARD_W),
     f"    GPU fallback: {GPU_DEFAULT_W:g} W, idle {GPU_IDLE_FRACTION:g} x board"])

RAPL_ROOT = "/sys/class/powercap"


@dataclass
class DevicePower:
    idle_w: float
    busy_w: float       # CPU: extra watts per busy core; GPU: board watts when busy
    source: str         # "rapl" | "nvml" | "estimated"
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "DevicePower":
        return cls(float(d["idle_w"]), float(d["busy_w"]), str(d["source"]), str(d.get("note", "")))


# --- RAPL ----------------------------------------------------------------------------------
class RaplReader:
    """Package energy counters of Linux RAPL (joules, wrap-around corrected between reads)."""

    def __init__(self, root: str = RAPL_ROOT):
        self.domains: list[tuple[Path, float]] = []
        for d in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
            p = Path(d)
            if p.name.count(":") != 1:  # intel-rapl:0 (package), not intel-rapl:0:0 (core/uncore)
                continue
            energy, rng = p / "energy_uj", p / "max_energy_range_uj"
            try:
                int(energy.read_text())
                wrap = float(rng.read_text()) if rng.exists() else 2.0 ** 32
            except (OSError, ValueError):
                continue
            self.domains.append((energy, wrap))
        self._last = None

    @property
    def available(self) -> bool:
        return bool(self.domains)

    def _raw(self) -> list[float]:
        return [float(e.read_text()) for e, _ in self.domains]

    def joules_during(self, fn, *args) -> tuple[float, float]:
        """(joules, seconds) spent by all packages while fn(*args) runs."""
        before, t0 = self._raw(), time.perf_counter()
        fn(*args)
        after, dt = self._raw(), time.perf_counter() - t0
        uj = sum((a - b) if a >= b else (a + wrap - b) for a, b, (_, wrap) in zip(after, before, self.domains))
        return uj * 1e-6, dt


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def cpu_power(cpu_model: str, cores: int, rapl: RaplReader | None = None, seconds: float = 0.5) -> DevicePower:
    if rapl is None:
        rapl = RaplReader()
    if rapl.available:
        try:
            j_idle, t_idle = rapl.joules_during(time.sleep, seconds)
            j_busy, t_busy = rapl.joules_during(_spin, seconds)
            idle = j_idle / t_idle
            per_core = max(0.5, j_busy / t_busy - idle)
            return DevicePower(idle, per_core, "rapl", f"RAPL package energy, {len(rapl.domains)} domain(s)")
        except OSError:
            pass
    return estimate_cpu_power(cpu_model, cores)


def estimate_cpu_power(cpu_model: str, cores: int) -> DevicePower:
    for pattern, tdp, phys in CPU_TDP:
        if re.search(pattern, cpu_model):
            per_core = tdp / phys
            return DevicePower(CPU_IDLE_FRACTION * per_core * cores, per_core, "estimated",
                               f"TDP table: {pattern} {tdp:g} W / {phys} cores")
    return DevicePower(CPU_IDLE_FRACTION * CPU_DEFAULT_W_PER_CORE * cores, CPU_DEFAULT_W_PER_CORE, "estimated",
                       f"default {CPU_DEFAULT_W_PER_CORE:g} W per busy core (CPU model not in the table)")


# --- NVML ----------------------------------------------------------------------------------
def _import_nvml():
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    return pynvml


def gpu_power(index: int, name: str, nvml: Any = None) -> DevicePower:
    """Board power of CUDA device ``index`` from NVML, else the estimate for ``name``.
    ``nvml`` is the pynvml module (injected in tests); None imports it if installed."""
    nvml = _import_nvml() if nvml is None else nvml
    if nvml is not None:
        try:
            nvml.nvmlInit()
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(index)
                limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
                now_w = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            finally:
                nvml.nvmlShutdown()
            if limit_w > 0:
                return DevicePower(min(now_w, limit_w), limit_w, "nvml", "NVML power limit / current draw")
        except Exception:  # noqa: BLE001 - NVML raises its own NVMLError family; fall back to the table
            pass
    return estimate_gpu_power(name)


def estimate_gpu_power(name: str) -> DevicePower:
    for sub, w in GPU_BOARD_W:
        if sub.lower() in name.lower():
            return DevicePower(GPU_IDLE_FRACTION * w, w, "estimated", f"board-power table: {sub} {w:g} W")
    return DevicePower(GPU_IDLE_FRACTION * GPU_DEFAULT_W, GPU_DEFAULT_W, "estimated",
                       f"default {GPU_DEFAULT_W:g} W board (GPU not in the table)")


def device_power(devices: list[str], machine: dict, rapl: RaplReader | None = None, nvml: Any = None,
                 seconds: float = 0.5) -> dict[str, DevicePower]:
    """Power entries for 'cpu' and each 'cuda:i' of ``devices``."""
    out: dict[str, DevicePower] = {}
    gpus = machine.get("gpus", [])
    for d in devices:
        if d == "cpu":
            out[d] = cpu_power(machine.get("cpu_model", ""), int(machine.get("cores", os.cpu_count() or 1)),
                               rapl, seconds)
        else:
            i = int(d.split(":")[1]) if ":" in d else 0
            out[d] = gpu_power(i, gpus[i] if i < len(gpus) else d, nvml)
    return out
