"""Choosing the learner kernel: one that is faster here *and* checked equal to the public one here.

`select` builds twins of the run's algorithm (same settings, same initial weights), gives each candidate
kernel (`check` says which apply: the compiled one on a CPU, the CUDA-graph one on a GPU) the same
synthetic phases of the run's real shapes on the run's device, with the same random draws, and compares
its |TD| errors, parameters and optimizer state with the public kernel's (the algorithm's own `learn`). A
candidate that differs beyond tolerance is dropped, with the size of the difference, whatever its speed;
the fastest of the rest (alternating timed rounds) is chosen. This is what makes a kernel safe to choose
automatically on hardware it has never run on.

The choice is made once per machine and learner shape and cached (hetrl.machine.cache_dir()), so two runs
with the same seed on the same machine run the same kernel (and the same GEMM); a run records it in
result.json and its checkpoint, and `--resume` reuses it. `hetrl plan` explains it (`Choice.explain`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hetrl.errors import UsageError
from hetrl.kernels.kernel import Kernel

NAMES = ("public", "compiled", "cuda_graph")
RTOL, ATOL = 1e-3, 1e-4          # parameters and |TD| after the checked phases, relative to their scale
CACHE_FORMAT = "hetrl-kernels/1"


def kernel_class(name: str) -> type[Kernel]:
    if name == "public":
        from hetrl.kernels.public import PublicKernel

        return PublicKernel
    if name == "compiled":
        from hetrl.kernels.compiled import CompiledKernel

        return CompiledKernel
    if name == "cuda_graph":
        from hetrl.kernels.cuda_graph import CudaGraphKernel

        return CudaGraphKernel
    raise UsageError(f"learner_kernel={name!r} is not a kernel; choose one of: auto, {', '.join(NAMES)}")


@dataclass
class Choice:
    """The kernel a run's learner uses, and why."""

    name: str = "public"
    options: dict = field(default_factory=dict)      # passed to the kernel (e.g. {"gemm": "mkl"})
    source: str = "only"             # measured | cache | checkpoint | pinned | only (no other kernel applies)
    s_per_update: dict = field(default_factory=dict)     # timed candidates: seconds per gradient step
    differs: dict = field(default_factory=dict)          # candidate -> the largest difference found
    declined: dict = field(default_factory=dict)         # candidate -> why it does not apply (check())
    checked: dict = field(default_factory=dict)          # candidate -> {"max_abs_diff":..., "phases":..., "steps":...}
    loaded: str = ""     # measured while other processes kept cores busy (what they did): provisional, see choose()

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Choice":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def explain(self) -> list[str]:
        """Lines for `hetrl plan`: the kernel, the figures it was chosen on, what was dropped and why."""
        times = ", ".join(f"{n} {s * 1e3:.3f}" for n, s in sorted(self.s_per_update.items(), key=lambda kv: kv[1]))
        how = {"measured": "measured here", "cache": "measured on this machine before",
               "checkpoint": "as the run was started with", "pinned": "set by hand",
               "only": "the only kernel that applies"}.get(self.source, self.source)
        lines = [f"learner kernel: {self.name} ({how}" + (f"; ms per update: {times}" if times else "") + ")"]
        if self.loaded:
            lines.append(f"learner kernel: provisional, timed while {self.loaded}; measured again once the machine "
                         "is quiet")
        for n, why in self.differs.items():
            lines.append(f"learner kernel {n} dropped: it differs from the public kernel here ({why})")
        for n, why in self.declined.items():
            lines.append(f"learner kernel {n} not used: {why}")
        return lines


# ---- the check ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _rng_and_threads_kept():
    """Leave torch's, numpy's and Python's random states and the thread count as they were (a selection must not
    change the run's)."""
    state, host = torch.get_rng_state(), _host_rng()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_rng_state(state)
        _host_rng(host)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        torch.set_num_threads(threads)


def _copied(batches: dict) -> dict:
    return {k: v.clone() for k, v in batches.items()}


def _host_rng(state=None):
    """numpy's and Python's global random states; with `state`, set them back to it."""
    if state is not None:
        np.random.set_state(state[0])
        random.setstate(state[1])
    return np.random.get_state(), random.getstate()


def synthetic_batch(spec: dict, act_space, B: int, K: int, dev: str | torch.device,
                    generator: torch.Generator | None = None) -> tuple[dict, torch.Tensor]:
    """K stacked batches of B synthetic transitions of the replay fields `spec` on `dev`, and their importance
    weights (ones): what kernels are checked and timed on (and the planner's profile times the learner on)."""
    from hetrl.replay.storage import torch_dtype

    g = {"generator": generator} if generator is not None else {}
    out = {}
    for name, (shape, dt) in spec.items():
        full = (K, B, *shape)
        if name in ("obs", "next_obs", "reward"):
            v = torch.randn(full, **g) if torch_dtype(dt).is_floating_point else torch.randint(0, 256, full, **g)
        elif name == "action":
            v = (torch.randint(0, int(act_space.n), full, **g) if hasattr(act_space, "n")
                 else torch.rand(full, **g) * 2 - 1)
        elif name == "terminated":
            v = torch.rand(full, **g) < 0.02
        elif name == "truncated":
            v = torch.zeros(full, dtype=torch.bool)
        else:
            v = torch.ones(full, dtype=torch_dtype(dt))
        out[name] = v.to(dev, torch_dtype(dt))
    return out, torch.ones(K, B, device=dev)


def _tensors(state, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every floating-point tensor in a (nested) state dict, by path."""
    out = {}
    if isinstance(state, torch.Tensor):
        if state.is_floating_point():
            out[prefix] = state
    elif isinstance(state, dict):
        for k, v in state.items():
            out.update(_tensors(v, f"{prefix}/{k}"))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(_tensors(v, f"{prefix}/{i}"))
    return out


CANCELLED = 1e-3    # the share of elements that may differ as a cancelled gradient's do (see _largest_difference)


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                        cancelled_bound: float = 0.0) -> tuple[float, str, int]:
    """The largest |a - b| beyond RTOL x |b| + ATOL x scale (scale: the tensor's largest |value|, at least 1),
    as (excess ratio, where, elements left out); a ratio <= 1 is within tolerance.

    Elements off by at most `cancelled_bound` are left out where they are at most CANCELLED of all elements:
    Adam scales each element's step by its own gradient's size, so a weight whose gradient cancels to rounding
    noise (a bias before a batch normalisation, over a batch where its unit is linear: the normalisation takes the
    bias out) moves by up to its learning rate in whichever direction the rounding gives, in any two
    implementations. A kernel that is wrong differs in far more elements than that."""
    worst, where, loose, total, n_loose = 0.0, "", [], 0, 0
    for k, ref in b.items():
        got = a.get(k)
        if got is None or got.shape != ref.shape:
            return math.inf, f"{k} missing or of another shape", 0
        ref, got = ref.detach().double().cpu(), got.detach().double().cpu()
        if not torch.isfinite(got).all():
            return math.inf, f"{k} not finite", 0
        total += ref.numel()
        if not ref.numel():
            continue
        scale = max(1.0, float(ref.abs().max()))
        diff = (got - ref).abs()
        ratio = diff / (RTOL * ref.abs() + ATOL * scale)
        off = (ratio > 1) & (diff <= cancelled_bound)
        n_loose += int(off.sum())
        loose.append((k, diff, ratio, off))
    forgive = n_loose <= CANCELLED * total
    for k, diff, ratio, off in loose:
        r = ratio.masked_fill(off, 0.0) if forgive else ratio
        m = float(r.max())
        if m > worst:
            d = diff.masked_fill(off, 0.0) if forgive else diff
            worst, where = m, f"{k}: max |diff| {float(d.max()):.3g}"
    return worst, where, n_loose if forgive else 0


def check_equal(make_algo: Callable[[], Any], kernel_cls: type[Kernel], batches: list, weights: torch.Tensor,
                seed: int = 0, options: dict | None = None) -> tuple[bool, dict]:
    """Run `batches` (a list of phases) through the public `learn` of one twin and through `kernel_cls` on
    another, with the same random draws per phase; (equal within tolerance?, details)."""
    with _rng_and_threads_kept():
        torch.manual_seed(seed)
        ref = make_algo()
        torch.manual_seed(seed)
        twin = make_algo()
        kernel = kernel_cls(twin, **(options or {}))
        try:
            kernel.prepare(batches[0], weights)
            worst, where = 0.0, ""
            for p, b in enumerate(batches):
                torch.manual_seed(seed + 1 + p)
                host = _host_rng()   # the same draws from numpy's and Python's global generators too
                td_ref = ref.learn(_copied(b), weights.clone())   # (a learn may write into its batch)
                torch.manual_seed(seed + 1 + p)
                _host_rng(host)
                td = kernel.learn(_copied(b), weights.clone())
                ratio, w, _ = _largest_difference({"td": td}, {"td": td_ref})
                if ratio > worst:
                    worst, where = ratio, f"phase {p + 1}, {w}"
            # Adam moves a weight by about its learning rate per step at most: the cancelled gradients' bound
            steps = len(batches) * int(weights.shape[0])
            bound = 3.0 * steps * float(getattr(getattr(ref, "cfg", None), "lr", 0.0) or 0.0)
            ratio, w, cancelled = _largest_difference(_tensors(twin.state_dict()), _tensors(ref.state_dict()), bound)
            if ratio > worst:
                worst, where = ratio, w
            if twin.updates != ref.updates:
                worst, where = math.inf, f"updates {twin.updates} vs {ref.updates}"
            declined = kernel.declined
        finally:
            kernel.close()
    detail = {"phases": len(batches), "steps": int(weights.shape[0]), "tolerance_used": round(worst, 4),
              "worst": where, "cancelled": cancelled}
    if declined:    # it ran the public learn: equal, but not itself
        detail["declined"] = declined
    return worst <= 1.0, detail


WARM_CALLS, WARM_S = 8, 0.5   # a kernel's warm-up before it is timed: this many calls, or at least two over WARM_S


def time_kernels(kernels: dict[str, Kernel], batches: dict, weights: torch.Tensor, rounds: int = 5,
                 min_round_s: float = 0.02, budget_s: float = 3.0,
                 before: Callable[[], Any] | None = None) -> dict[str, float]:
    """Seconds per gradient step of each kernel (median of alternating rounds of learn calls on the same
    batches), after a warm-up of WARM_CALLS calls each (or WARM_S seconds): a kernel whose lanes settle over its
    first phases (the compiled kernel tries one lane against several, and makes each lane's buffers in its first
    phase on it) is timed as it runs once settled, not in its first phases. `before`, where given, runs before
    each timed call, untimed (benchmarks/bench_derived_vs_head.py --cold: other work between phases)."""
    sync = torch.cuda.synchronize if weights.device.type == "cuda" else (lambda: None)
    steps, threads = int(weights.shape[0]), torch.get_num_threads()
    calls = {}
    for name, k in kernels.items():
        k.use_threads(threads)
        start = time.perf_counter()
        for i in range(WARM_CALLS):
            k.learn(batches, weights)
            sync()
            if i >= 1 and time.perf_counter() - start > WARM_S:
                break
        t = time.perf_counter()
        k.learn(batches, weights)
        sync()
        calls[name] = max(1, int(min_round_s / max(time.perf_counter() - t, 1e-6)))
    times: dict[str, list[float]] = {n: [] for n in kernels}
    deadline = time.perf_counter() + budget_s
    for r in range(rounds):
        for name, k in (kernels.items() if r % 2 == 0 else reversed(list(kernels.items()))):
            k.use_threads(threads)   # each at the learner's threads (the compiled one: its lanes; torch on one)
            sync()
            if before is None:
                t = time.perf_counter()
                for _ in range(calls[name]):
                    k.learn(batches, weights)
                sync()
                spent = time.perf_counter() - t
            else:
                spent = 0.0
                for _ in range(calls[name]):
                    before()
                    t = time.perf_counter()
                    k.learn(batches, weights)
                    sync()
                    spent += time.perf_counter() - t
            times[name].append(spent / (calls[name] * steps))
        if r >= 2 and time.perf_counter() > deadline:
            break
    return {n: statistics.median(v) for n, v in times.items()}


def select(make_algo: Callable[[], Any], spec: dict, act_space, batch_size: int, steps: int,
           device: str | torch.device, candidates: tuple = NAMES, phases: int = 2, seed: int = 0) -> Choice:
    """Measure and check every kernel in `candidates` (names, or Kernel classes) that applies to `make_algo()`'s
    learner here (phases of `steps` gradient steps on `batch_size` synthetic transitions); the fastest of those
    equal to public."""
    choice = Choice()
    classes = {c if isinstance(c, str) else c.name: kernel_class(c) if isinstance(c, str) else c for c in candidates}
    with _rng_and_threads_kept():
        torch.manual_seed(seed)
        probe = make_algo()
        applicable = []
        for name, cls in classes.items():
            if name == "public":
                continue
            why = cls.check(probe)
            if why:
                choice.declined[name] = why
            else:
                applicable.append(name)
        del probe
        if not applicable:
            return choice
        g = torch.Generator().manual_seed(seed)
        phases_b = [synthetic_batch(spec, act_space, batch_size, steps, device, g)[0] for _ in range(phases)]
        weights = torch.ones(steps, batch_size, device=device)
        passed = []
        for name in applicable:
            ok, detail = check_equal(make_algo, classes[name], phases_b, weights, seed)
            if detail.get("declined"):
                choice.declined[name] = detail["declined"]
            elif ok:
                choice.checked[name] = detail
                passed.append(name)
            else:
                choice.differs[name] = detail["worst"] or "a difference beyond tolerance"
        kernels = {"public": kernel_class("public")(make_algo())}
        for name in passed:
            kernels[name] = classes[name](make_algo())
            kernels[name].prepare(phases_b[0], weights)
        try:
            choice.s_per_update = time_kernels(kernels, phases_b[0], weights)
            choice.name = min(choice.s_per_update, key=choice.s_per_update.get)
            choice.options = {k: v for k, v in kernels[choice.name].figures().items() if k == "gemm"}
        finally:
            for k in kernels.values():
                k.close()
    choice.source = "measured"
    return choice


# ---- once per machine ---------------------------------------------------------------------------------
def shape_key(cfg, obs_space, act_space, device, steps: int) -> str:
    """What a choice depends on: the algorithm, its spaces, the settings that shape its learner, the device,
    the phase length."""
    from hetrl import registry

    cls = registry.get(cfg.algo)
    keys = sorted(set(type(cfg).SHAPE_SETTINGS) | set(getattr(cls, "shape_settings", ())))
    act = f"d{act_space.n}" if hasattr(act_space, "n") else f"b{list(act_space.shape)}"
    values = ",".join(f"{k}={cfg.get(k)}" for k in keys)
    return f"{cfg.algo}|obs{list(obs_space.shape)}|{act}|{values}|{torch.device(device)}|K{steps}|t{torch.get_num_threads()}"


def _cache_file() -> Path:
    from hetrl.machine import cache_dir, machine_id, machine_info

    return cache_dir() / f"kernels-{machine_id(machine_info())}.json"


def _read_cache() -> dict:
    """The machine's kernel cache ({} where it is missing, unreadable or of another format)."""
    try:
        data = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("format") == CACHE_FORMAT else {}


@functools.lru_cache(maxsize=1)
def kernels_version() -> str:
    """A digest of the kernels' code (hetrl/kernels/**.py): a choice measured against other kernel code is not
    this code's (a faster derived phase, another lane rule), so the cached choices are dropped when it changes."""
    digest = hashlib.sha256()
    root = Path(__file__).parent
    for f in sorted(root.rglob("*.py")):
        digest.update(str(f.relative_to(root)).encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def cached(key: str) -> Choice | None:
    """This machine's choice for `key`, or None: none made by this kernel code, or a provisional one (timed under
    foreign load) while the machine is quiet now, so that it is measured again."""
    data = _read_cache()
    got = data.get("choices", {}).get(key) if data.get("kernels") == kernels_version() else None
    if got is not None and got.get("loaded"):
        from hetrl.planner.load import quiet_check

        now = quiet_check()
        if now is not None and not now.busy:
            return None
    return Choice.from_json(got) if got is not None else None


def remember(key: str, choice: Choice) -> None:
    def change(data: dict) -> None:
        if data.get("kernels") != kernels_version():   # choices made by other kernel code: measured again
            data["choices"], data["kernels"] = {}, kernels_version()
        data.setdefault("choices", {})[key] = choice.to_json()
    _update_cache(change)


def machine_gemm(kind: str = "") -> str | None:
    """The GEMM this machine's first probe chose (sgemm.bind(None) binds it in every later process), or None;
    kind "thin": the one chosen for thin products (sgemm.THIN)."""
    got = _read_cache().get("gemm")
    return got.get(f"{kind}_name" if kind else "name") if isinstance(got, dict) else None


def remember_gemm(name: str, seconds: dict, kind: str = "") -> None:
    def change(data: dict) -> None:
        rec = data.get("gemm") if isinstance(data.get("gemm"), dict) else {}
        rec.update({f"{kind}_name" if kind else "name": name, f"{kind}_probe_s" if kind else "probe_s": seconds})
        data["gemm"] = rec
    _update_cache(change)


def _update_cache(change: Callable[[dict], Any]) -> None:
    path = _cache_file()
    data = _read_cache()
    data.setdefault("format", CACHE_FORMAT)
    change(data)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass   # a read-only cache: the choice is made again next time


# per process, what choose() settled on per cache file, shape and kernel code: the runs of one process keep one
# kernel per shape even where a provisional choice is measured again by another process meanwhile
_settled: dict[tuple, Choice] = {}


def choose(cfg, make_algo: Callable[[], Any], obs_space, act_space, spec: dict, device, steps: int,
           algo=None, saved: dict | None = None, refresh: bool = False) -> Choice:
    """The kernel for a run: pinned by `cfg.system.learner_kernel`, else the checkpoint's (`saved`), else this
    machine's cached choice for the learner's shape, else `select` now (and cache it)."""
    name = cfg.system.learner_kernel
    probe = algo if algo is not None else None
    if name != "auto":
        cls = kernel_class(name)
        why = cls.check(probe if probe is not None else make_algo()) if name != "public" else None
        if why:
            raise UsageError(f"learner_kernel={name} cannot run this learner: {why}; use learner_kernel=auto")
        return Choice(name=name, source="pinned", options=dict((saved or {}).get("options", {})))
    if saved and saved.get("name") in NAMES:
        got = Choice.from_json(saved)
        cls = kernel_class(got.name)
        if got.name == "public" or not cls.check(probe if probe is not None else make_algo()):
            got.source = "checkpoint"
            return got
    key = shape_key(cfg, obs_space, act_space, device, steps)
    here = (str(_cache_file()), key, kernels_version())
    if not refresh:
        got = _settled.get(here) or cached(key)
        if got is not None:
            got = Choice.from_json({**got.to_json(), "source": "cache"})
            _settled[here] = got
            return got
    # a busy moment must not decide every later run: a choice timed while other processes kept cores busy (a lane
    # that waits for a descheduled one makes a kernel look slow) is cached as provisional and measured again by the
    # first run that finds the machine quiet
    from hetrl.planner.load import Watch

    watch = Watch().start()
    got = select(make_algo, spec, act_space, cfg.batch_size, steps, device, seed=cfg.seed)
    load = watch.stop()
    got.loaded = load.short() if load is not None and load.busy else ""
    remember(key, got)
    _settled[here] = got
    return got


def build(choice: Choice, algo) -> Kernel:
    return kernel_class(choice.name)(algo, **choice.options)
