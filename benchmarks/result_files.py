"""The names of the result files in benchmarks/results/: one scheme for every benchmark.

    <benchmark>_<case>_<YYYY-MM-DD>_<machine>_<commit>.json

- benchmark: the script that wrote the file (benchmarks/<benchmark>.py); `train` for the result.json
  of `hetrl train` runs, `notes` for figures kept by hand (with their command) where no file was kept;
- case: what it measured, in lower-case words joined by '-', several cases joined by '+'
  (`dqn-cartpole`, `td3-pendulum+sac-pendulum`); left out where the benchmark has one case (gpu_check);
- date: the day it ran;
- machine: a key of benchmarks/results/machines.json (`machine_key()` derives it from the CPU, or the
  GPU's name; `HETRL_MACHINE=key` overrides);
- commit: the short commit of the code measured.

A plot or a summary of a result shares its JSON's stem (`..._755ff3a.png`, `..._755ff3a.txt`); a second one
adds `-<part>` (`..._755ff3a-sweep.png`).
`python benchmarks/results_md.py` reads these files and writes docs/results.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

PSEUDO = ("train", "notes")   # not scripts: `hetrl train` runs, and figures kept by hand
_REST = re.compile(r"^(?:(?P<case>[a-z0-9+-]+)_)?(?P<date>\d{4}-\d{2}-\d{2})_(?P<machine>[a-z0-9-]+)_(?P<commit>[0-9a-z]+)(?:-(?P<part>[a-z0-9-]+))?$")


def benchmarks() -> list[str]:
    """The benchmark names a result file may start with, longest first (bench_sb3_api before bench_sb3)."""
    names = {p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_")} | set(PSEUDO)
    return sorted(names, key=len, reverse=True)


def parse(name: str) -> dict | None:
    """{benchmark, case, date, machine, commit, part} of a file name under the scheme, else None."""
    stem = name.split(".", 1)[0] if "." in name else name
    for bench in benchmarks():
        if stem.startswith(bench + "_"):
            m = _REST.match(stem[len(bench) + 1:])
            if m:
                return {"benchmark": bench, **m.groupdict()}
    return None


def _slug_one(case: str) -> str:
    parts = case.split(":")
    if len(parts) >= 2:   # ALGO:ENV[:STEPS[:key=value]]: the algorithm and the env's name
        case = f"{parts[0]}-{parts[1].rsplit('/', 1)[-1]}"
    case = re.sub(r"-v\d+$", "", case)   # without its version
    return re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-")


def case_slug(cases) -> str:
    """`dqn:CartPole-v1:50000,sac:ALE/Breakout-v5:1000` -> `dqn-cartpole+sac-breakout`; a list works too."""
    if isinstance(cases, str):
        cases = cases.split(",")
    slugs = [s for s in (_slug_one(c) for c in cases if c) if s]
    return "+".join(dict.fromkeys(slugs))


def machine_key() -> str:
    """The machines.json key of this machine: HETRL_MACHINE, else its NVIDIA GPU's model (a GPU machine's
    host CPU is that machine too), else the CPU's vendor and vector units."""
    if os.environ.get("HETRL_MACHINE"):
        return os.environ["HETRL_MACHINE"]
    for info_file in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        model = re.search(r"^Model:\s*(.+)$", info_file.read_text(errors="replace"), re.M)
        if model:
            return gpu_key(model.group(1).strip())
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    except OSError:
        import platform

        return re.sub(r"[^a-z0-9]+", "-", platform.machine().lower()) or "unknown"
    flags, model = set(info.get("flags", "").split()), info.get("model name", "")
    vector = "amx" if "amx_tile" in flags else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else ""
    if info.get("vendor_id") == "AuthenticAMD":
        name = "epyc" if "EPYC" in model else "amd"
        if name == "epyc" and vector == "avx512":
            return "epyc"   # the EPYC with AVX-512 measured first holds the plain key
    elif info.get("vendor_id") == "GenuineIntel":
        name = "xeon" if "Xeon" in model else "intel"
    else:
        name = "x86"
    return f"{name}-{vector}" if vector else name


def gpu_key(device_name: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `h100`."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", device_name)
    if m:
        return m.group(1).lower()
    words = [w for w in re.split(r"[^a-z0-9]+", device_name.lower()) if w and w not in ("nvidia", "geforce", "tesla")]
    return "-".join(words) or "gpu"


def commit() -> str:
    """The short commit of the tree the benchmarks run from ('nocommit' outside git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=HERE, capture_output=True, text=True)
        return out.stdout.strip() or "nocommit"
    except OSError:
        return "nocommit"


def result_path(benchmark: str, cases="", ext: str = "json", folder: Path | None = None,
                machine: str | None = None) -> Path:
    """Where a benchmark writes its result by default: benchmarks/results/<the scheme>.<ext>."""
    case = case_slug(cases)
    name = "_".join([benchmark] + ([case] if case else []) + [time.strftime("%Y-%m-%d"), machine or machine_key(),
                                                              commit()])
    return Path(folder or RESULTS) / f"{name}.{ext}"
