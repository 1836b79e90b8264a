"""The derived phase: an algorithm's learn traced (trace.py), converted (graph.py), lowered (program.py) and run on
the VM (vm.py) on the algorithm's own tensors.

`Derived(algo)` makes programs on demand, one per (updates per unit, residue of `updates` modulo
`graph_period()`, batch fields' shapes and dtypes, folded hyper-parameters), shared by every algorithm object of the
same class and settings in the process (a selection's twins, a population's members). A phase of K updates runs
units of U = gcd(K, graph_period()) updates: one program when K is a multiple of the period, one per residue
otherwise. Each phase:

1. finds the algorithm's tensors again by their paths (a checkpoint load that replaced a tensor is followed; a
   path that does not resolve yet, such as an optimizer's state before its first step, makes the phase run the
   public learn instead);
2. draws the phase's random numbers from the algorithm's generators into the program's draw buffers, unit by unit in
   graph order (what learn would draw);
3. runs the units on the VM (one native call, without the GIL) over the lanes the `Lanes` governor picks (fewer
   than asked where more are measured slower: a small phase, or a core another process holds);
4. replays learn's Python-side effect (counters) and writes back the tensors learn assigns.
"""

from __future__ import annotations

import math
import statistics
import threading
import time

import numpy as np
import torch

from hetrl.kernels.compiled import fused, vm
from hetrl.kernels.compiled.graph import convert
from hetrl.kernels.compiled.program import Program, lower
from hetrl.kernels.compiled.reference import draw as draw_into
from hetrl.kernels.compiled.trace import Declined, _objects_with_paths, assign, describe, resolve, trace_unit

_PROGRAMS: dict = {}
_LOCK = threading.Lock()
_TRACING = threading.Lock()   # held while a unit is traced and lowered (population members trace from threads)
UNREADY_PHASES = 8            # phases in a row an optimizer may go without state (unstepped) before the kernel declines


class Lanes:
    """How many lanes run one program's phases where n > 1 are asked for: n, or one where one is measured faster.

    More lanes lose where a phase's work per segment is below what handing tasks between lanes costs (a small
    network's update), and where another process holds a core: a lane descheduled in the middle of a segment
    holds up every later one. A phase computes the same bits on any number of lanes (fixed tasks, sums in a fixed
    order), so the choice is free to follow the clock:

    * a program none of whose segments holds two tasks (`lane_share` 0) runs one lane from its first phase: more
      lanes could only wait for each other;
    * otherwise its first 2 KEEP phases alternate n and one lane, and the count whose median wall time per unit is
      lower is chosen (n unless one is faster by more than MARGIN);
    * then the other count is tried for one phase at a time, at gaps that double (GAP_S up to GAP_MAX_S, at least
      GAP_PHASES phases) while the tries confirm the choice; a try that looks faster goes on to KEEP phases before
      the choice changes. Where the chosen count's phases become SHIFT times slower or faster than when it was
      chosen (a process took or gave back a core), the other is tried at the next phase."""

    KEEP = 3            # phases per count compared (their median)
    MARGIN = 1.05       # n lanes are kept unless one is faster by more than this
    GAP_S, GAP_MAX_S = 0.25, 2.0
    GAP_PHASES = 8
    SHIFT = 1.5

    def __init__(self, n: int, share: float = 1.0):
        self.n = n
        self.fixed = share <= 0.0
        self.times: dict[int, list[float]] = {n: [], 1: []}
        self.use: int | None = 1 if self.fixed else None   # None: the first phases, alternating
        self.base = 0.0         # the chosen count's median when it was chosen
        self.gap = self.GAP_S
        self.tried_at = 0.0
        self.since = 0
        self.trying = False
        self.due = False
        self.tries = 0

    def other(self) -> int:
        return 1 if self.use == self.n else self.n

    def pick(self, now: float | None = None) -> int:
        if self.fixed:
            return 1
        if self.use is None:
            return self.n if len(self.times[self.n]) <= len(self.times[1]) else 1
        if self.trying:
            return self.other()
        now = time.perf_counter() if now is None else now
        self.since += 1
        if self.due or (self.since > self.GAP_PHASES and now - self.tried_at >= self.gap):
            self.trying, self.due = True, False
            self.tries += 1
            self.times[self.other()].clear()
            return self.other()
        return self.use

    def _prefer(self) -> int:
        one, many = statistics.median(self.times[1]), statistics.median(self.times[self.n])
        return 1 if one * self.MARGIN < many else self.n

    def _choose(self, now: float) -> None:
        use = self._prefer()
        if use == self.use:
            self.gap = min(2 * self.gap, self.GAP_MAX_S)
        else:
            self.gap = self.GAP_S
        self.use = use
        self.base = statistics.median(self.times[use])
        self.tried_at, self.since, self.trying = now, 0, False

    def record(self, lanes: int, s_per_unit: float, now: float | None = None) -> None:
        if self.fixed:
            return
        now = time.perf_counter() if now is None else now
        t = self.times[lanes]
        t.append(s_per_unit)
        del t[:-self.KEEP]
        if self.use is None:
            if len(self.times[1]) >= self.KEEP and len(self.times[self.n]) >= self.KEEP:
                self._choose(now)
            return
        if self.trying:
            # a try that looks faster runs KEEP phases before the choice changes; one that is slower ends at once
            if self._prefer() == lanes and len(t) < self.KEEP:
                return
            self._choose(now)
            return
        med = statistics.median(t)
        if len(t) >= self.KEEP and self.base > 0 and not self.base / self.SHIFT <= med <= self.base * self.SHIFT:
            self.due = True
            self.gap = self.GAP_S


def task_work(prog: Program) -> np.ndarray:
    """An estimate of each task's work (multiply-adds, element passes times their expression's length): a job's
    instructions run once per task of the job, each task on its share (a chunk of rows, columns or elements)."""
    INS = prog.INS
    per = np.zeros(len(INS), np.float64)
    for i, row in enumerate(INS):
        kind = int(row[vm.I_KIND])
        if kind == vm.K_GEMM:
            per[i] = float(row[vm.I_M]) * float(row[vm.I_N]) * float(row[vm.I_K]) * max(1, int(row[vm.I_BATCH]))
        elif kind == vm.K_ADAM:
            per[i] = 8.0 * float(row[vm.I_NUMEL])
        else:
            dims = [max(1, int(d)) for d in row[vm.I_D0:vm.I_SPLIT]]
            per[i] = float(np.prod(dims)) * max(1, int(row[vm.I_NCODE]))
    jobs: dict[tuple, int] = {}
    for s, i0, i1, _ in prog.TASKS:
        jobs[(int(s), int(i0), int(i1))] = jobs.get((int(s), int(i0), int(i1)), 0) + 1
    return np.array([per[int(i0):int(i1)].sum() / jobs[(int(s), int(i0), int(i1))] for s, i0, i1, _ in prog.TASKS],
                    np.float64)


def lane_share(prog: Program, n: int) -> float:
    """The share of a phase's work that n lanes take off one lane (0: no segment holds two tasks, so more lanes
    only wait for each other): per segment, its work less its tasks' longest-first makespan on n lanes."""
    if n <= 1 or len(prog.TASKS) == 0:
        return 0.0
    work = task_work(prog)
    total = float(work.sum()) or 1.0
    saved = 0.0
    for s in range(len(prog.SEGSTART) - 1):
        w = sorted(work[prog.SEGSTART[s]:prog.SEGSTART[s + 1]], reverse=True)
        if len(w) < 2:
            continue
        loads = [0.0] * n
        for x in w:
            loads[loads.index(min(loads))] += x
        saved += sum(w) - max(loads)
    return saved / total


def _numpy_dtype(dt):
    return torch.empty(0, dtype=dt).numpy().dtype


def settings_key(algo) -> tuple:
    """What a traced program depends on beside the batch: the class, its settings, its spaces, and the structure of
    the networks and optimizers it holds (a layer replaced on one object after construction is another program)."""
    cfg = getattr(algo, "cfg", None)
    held = tuple((name, repr(v) if isinstance(v, torch.nn.Module) else type(v).__qualname__)
                 for name, v in sorted(vars(algo).items())
                 if isinstance(v, (torch.nn.Module, torch.optim.Optimizer)) or hasattr(v, "param_groups"))
    return (type(algo), repr(cfg), tuple(getattr(algo, "obs_shape", ())), repr(getattr(algo, "act_space", None)), held)


def hyper_key(algo, optimizers=None) -> tuple:
    """The hyper-parameters a trace folds (optimizers other than Adam/AdamW): a change means a new trace."""
    from hetrl.kernels.compiled.trace import PLAIN, optimizers_of
    out = []
    for opt in optimizers_of(algo) if optimizers is None else optimizers:
        if type(opt) in (torch.optim.Adam, torch.optim.AdamW):
            continue
        for g in opt.param_groups:
            out.append(tuple((k, v) for k, v in sorted(g.items()) if k != "params" and isinstance(v, PLAIN)))
    return tuple(out)


class Unit:
    """One traced and lowered unit of updates, and what a phase needs to run it."""

    def __init__(self, algo, batches, weights):
        self.trace = trace_unit(algo, batches, weights)
        self.cv = convert(self.trace)
        self.prog: Program = lower(self.cv, int(weights.shape[0]), int(weights.shape[1]))
        self.fused = fused.attach(self.prog)   # the large elementwise passes as generated loops
        self.units = int(weights.shape[0])


def unit_batch(batches: dict, weights: torch.Tensor, U: int) -> tuple[dict, torch.Tensor]:
    return {k: v[:U].contiguous() for k, v in batches.items()}, weights[:U].contiguous()


class Bound:
    """One program's slots bound for phases of `units` units on one algorithm object: the buffers' and literals'
    addresses (kept), and the state tensors last found at the traced paths (looked up again each phase)."""

    def __init__(self, d: "Derived", unit: Unit, units: int):
        prog = unit.prog
        self.addr = np.zeros(len(prog.slots), np.int64)
        self.state: list[tuple] = []      # (slot, path, bytes)
        self.tensors: list = []           # the tensors last bound to them (None: not yet)
        self.ptrs: list[int] = []
        self.inputs: list[tuple] = []     # (slot, batch field or "weights", dtype, elements)
        self.fed: list = []               # the tensors last bound to them
        self.result: tuple | None = None  # (slot, elements, dtype) of the phase's result
        self.outs: dict = {}              # output k > 0 -> its array
        self.arrays: dict = {}            # slot -> its buffer (the draws', the arena, outputs k > 0)
        for i, s in enumerate(prog.slots):
            if s.kind == "state":
                path, nbytes = s.info
                self.state.append((i, path, nbytes))
                self.tensors.append(None)
                self.ptrs.append(0)
            elif s.kind == "input":
                self.inputs.append((i, s.info, s.dtype, s.numel * units))
                self.fed.append(None)
            elif s.kind == "literal":
                self.addr[i] = s.info.ctypes.data
            elif s.kind == "out" and s.info == 0:
                self.result = (i, s.numel * (units if s.per_unit else 1), _numpy_dtype(s.dtype))
            else:
                arr = d._array(unit, i, s, units)
                self.addr[i] = arr.ctypes.data
                self.arrays[i] = arr
                if s.kind == "out":
                    self.outs[s.info] = arr


class Derived:
    """Runs an algorithm's phases on derived programs (see the module docstring)."""

    def __init__(self, algo, lanes: int = 1):
        self.algo = algo
        self.period = max(1, int(algo.graph_period()))
        self.skey = settings_key(algo)
        self._scratch: dict = {}
        self.profile_cycles: np.ndarray | None = None   # (lanes, instructions + 1): set to profile (see profile())
        self.compile_s = 0.0    # seconds this object spent tracing and lowering (a program another made is free)
        self._lanes: dict = {}  # (program, lanes asked) -> its Lanes
        self.lanes_run: dict[int, int] = {}   # lanes -> phases run on that many
        self._optimizers: tuple | None = None  # (the ids of the attributes holding optimizers, the optimizers)
        self._ready: tuple | None = None  # the optimizers' state dicts when every parameter was last found in them
        self._unready = 0                 # phases in a row an optimizer had no state for (see learn)
        self._last: tuple | None = None   # (the last phase's shapes and folded hyper-parameters, its (unit, U))
        self._bound: dict = {}            # (program, units) -> Bound

    def unit_for(self, batches, weights) -> tuple[Unit, int]:
        """(the program for this phase's units, U)."""
        K = int(weights.shape[0])
        U = math.gcd(K, self.period)
        r = int(self.algo.updates) % self.period
        if self._optimizers is None:   # (learn's ready() walks them each phase)
            self.optimizers()
        hk = hyper_key(self.algo, self._optimizers[2]) if self._optimizers[2] else ()
        quick = (K, r, tuple((k, v.shape, v.dtype) for k, v in batches.items()), weights.shape, hk)
        if self._last is not None and self._last[0] == quick:   # (the usual phase: the last one's program)
            return self._last[1]
        shapes = tuple((k, tuple(v.shape[1:]), v.dtype) for k, v in sorted(batches.items()))
        key = (self.skey, U, r, shapes, tuple(weights.shape[1:]), hk)
        with _LOCK:
            got = _PROGRAMS.get(key)
        if got is None:
            with _TRACING:   # (one trace at a time: make_fx's tracing state is global to the process)
                with _LOCK:
                    got = _PROGRAMS.get(key)
                if got is None:
                    t0 = time.perf_counter()
                    b, w = unit_batch(batches, weights, U)
                    got = Unit(self.algo, b, w)
                    self.compile_s += time.perf_counter() - t0
                    with _LOCK:
                        _PROGRAMS[key] = got
        self._last = (quick, (got, U))
        return got, U

    def optimizers(self) -> list:
        """The optimizers the algorithm holds, found by a walk of its objects once (the walk costs tens of
        microseconds, a phase of a small network not much more) and again where an attribute holding an optimizer
        is replaced."""
        from hetrl.kernels.compiled.trace import optimizers_of
        held = tuple(id(v) for v in vars(self.algo).values() if isinstance(v, torch.optim.Optimizer))
        if self._optimizers is None or self._optimizers[0] != held:
            opts = optimizers_of(self.algo)
            folded = [o for o in opts if type(o) not in (torch.optim.Adam, torch.optim.AdamW)]
            self._optimizers = (held, opts, folded)
        return self._optimizers[1]

    def ready(self) -> str | None:
        """None where every optimizer the algorithm holds has its state (made by its first step), else why not.
        Once found, it is looked for again only where an optimizer's state dict or groups were replaced (a
        checkpoint load): a state dropped otherwise makes the phase's bind fail, and the public learn runs."""
        opts = self.optimizers()
        now = tuple((o.state, len(o.param_groups)) for o in opts)
        if self._ready is not None and len(now) == len(self._ready) and all(
                a[0] is b[0] and a[1] == b[1] for a, b in zip(now, self._ready)):
            return None
        self._ready = None
        for opt in opts:
            for g in opt.param_groups:
                for p in g["params"]:
                    if p.requires_grad and not opt.state.get(p):
                        return f"optimizer {_path_of(self.algo, opt)} has no state yet (its first step makes it)"
        self._ready = now
        return None

    def learn(self, batches: dict, weights: torch.Tensor, lanes: int) -> torch.Tensor | None:
        """The phase on the VM; None where it must run the public learn (an optimizer's state not made yet). An
        optimizer the learn never steps (one a subclass no longer uses, say) would keep it public for good: after
        UNREADY_PHASES phases in a row the kernel declines, in one line naming it."""
        why = self.ready()
        if why is not None:
            self._unready += 1
            if self._unready >= UNREADY_PHASES:
                cls = type(self.algo)
                what = why.split(" (")[0].replace(" yet", "")
                raise Declined(f"{cls.__module__}.{cls.__qualname__}'s {what} after {self._unready} phases: its "
                               "learn does not step it, and a compiled phase needs the state a first step makes")
            return None
        self._unready = 0
        K, P = int(weights.shape[0]), self.period
        if K % P == 0:
            unit, U = self.unit_for(batches, weights)
            return self.run(unit, batches, weights, K // U, lanes)
        U = math.gcd(K, P)
        out = torch.empty(weights.shape, dtype=weights.dtype)
        for s in range(0, K, U):
            b, w = {k: v[s:s + U] for k, v in batches.items()}, weights[s:s + U]
            unit, _ = self.unit_for(b, w)
            got = self.run(unit, b, w, 1, lanes)
            if got is None:
                if s == 0:
                    return None
                out[s:] = self.algo.learn({k: v[s:] for k, v in batches.items()}, weights[s:])
                return out
            out[s:s + U] = got
        return out

    # ---- one call of the VM --------------------------------------------------------------------------------------------
    def bind(self, unit: Unit, batches, weights, units):
        """(the slots' addresses, the output arrays, the Bound, which holds every tensor the VM reads), or None where a
        state tensor is not found as traced. What does not change from phase to phase (buffers, literals, a state
        tensor still the same object on the same memory) is kept from the last phase of the same program: a phase's
        own bookkeeping runs on caches the phase has just emptied, where each lookup costs several times what it
        does warm."""
        b = self._bound.get((id(unit), units))
        if b is None:
            b = self._bound[(id(unit), units)] = Bound(self, unit, units)
        algo, addr = self.algo, b.addr
        for j, (i, path, nbytes) in enumerate(b.state):
            try:
                t = resolve(algo, path)
            except (LookupError, AttributeError, KeyError, IndexError):
                return None
            if t is not b.tensors[j] or t.data_ptr() != b.ptrs[j]:
                st = t.untyped_storage()
                if st.nbytes() != nbytes or t.device.type != "cpu":
                    return None
                addr[i] = st.data_ptr()
                b.tensors[j], b.ptrs[j] = t, t.data_ptr()
        for j, (i, field, dtype, numel) in enumerate(b.inputs):
            src = weights if field == "weights" else batches[field]
            if src is b.fed[j] and src.data_ptr() == addr[i] and src.numel() == numel:   # (a batch refilled in place)
                continue
            if not src.is_contiguous():
                src = src.contiguous()
            if src.dtype != dtype or src.numel() != numel:
                raise Declined(f"the batch field {field!r} is {src.dtype} {tuple(src.shape)}, not as traced")
            addr[i] = src.data_ptr()
            b.fed[j] = src
        outs = b.outs
        if b.result is not None:   # (the phase's result is a fresh array: the caller keeps it)
            i, n, dt = b.result
            arr = np.empty(n, dt)
            addr[i] = arr.ctypes.data
            outs = dict(outs)
            outs[0] = arr
        return addr, outs, b

    def _array(self, unit, i, s, units):
        """A draw buffer, the arena or an output: kept across phases (the phase's result is a fresh tensor)."""
        n = s.numel * (units if s.per_unit else 1)
        if s.kind == "out" and s.info == 0:
            return np.empty(n, _numpy_dtype(s.dtype))
        key = (id(unit), i)
        got = self._scratch.get(key)
        if got is None or got.size < n:
            if s.kind == "arena":
                raw = np.zeros(n + 64, np.uint8)
                got = raw[(-raw.ctypes.data) % 64:][:n]
            else:
                got = np.zeros(n, _numpy_dtype(s.dtype))
            self._scratch[key] = got
        return got[:n]

    def registers(self, prog, lanes):
        key = ("regs", lanes, prog.nregs)
        got = self._scratch.get(key)
        if got is None:
            got = self._scratch[key] = (np.zeros((lanes, prog.nregs, vm.T), np.float64), np.zeros(2, np.int64))
        return got

    def rconst(self, prog) -> np.ndarray:
        """The Adam groups' hyper-parameters as the phase reads them (read again each phase: a schedule changes lr)."""
        out = self._scratch.get(("rconst", id(prog)))
        if out is None:
            out = self._scratch[("rconst", id(prog))] = np.zeros(max(1, len(prog.rconst)), np.float64)
        for i, spec in enumerate(prog.rconst):
            if spec is None:
                continue
            opt = resolve(self.algo, spec[1])
            g = opt.param_groups[spec[2]]
            b1, b2 = g["betas"]
            out[i:i + 5] = (float(g["lr"]), float(b1), float(b2), float(g.get("weight_decay", 0.0)), float(g["eps"]))
        return out

    def run(self, unit: Unit, batches, weights, units: int, lanes: int):
        prog = unit.prog
        bound = self.bind(unit, batches, weights, units)
        if bound is None:
            return None
        addr, outs, b = bound
        # the draws, unit by unit in graph order
        if prog.draws:
            gens = {}
            for d, slot in prog.draws:
                if d.generator not in gens:
                    gens[d.generator] = resolve(self.algo, d.generator) if d.generator is not None else None
            arrays = b.arrays
            for u in range(units):
                for d, slot in prog.draws:
                    n = prog.slots[slot].numel
                    t = torch.from_numpy(arrays[slot][u * n:(u + 1) * n]).view(d.out.shape)
                    draw_into(d, t, gens[d.generator])
        gov = None
        if lanes > 1 and self.profile_cycles is None:
            gov = self._lanes.get((id(unit), lanes))
            if gov is None:
                gov = self._lanes[(id(unit), lanes)] = Lanes(lanes, lane_share(prog, lanes))
            lanes = gov.pick()
        self.lanes_run[lanes] = self.lanes_run.get(lanes, 0) + 1
        regs, counters = self.registers(prog, lanes)
        prof = self.profile_cycles
        if prof is None:
            prof = self._scratch.get(("noprof", lanes))
            if prof is None:
                prof = self._scratch[("noprof", lanes)] = np.zeros((lanes, 0), np.int64)
        elif prof.shape[0] != lanes or prof.shape[1] != prog.INS.shape[0] + 1:
            prof = self.profile_cycles = np.zeros((lanes, prog.INS.shape[0] + 1), np.int64)
        rc = self.rconst(prog)
        t0 = time.perf_counter()
        vm.run_phase(prog.INS, prog.OPD, prog.CODE, prog.CST, prog.F, prog.TASKS, prog.SEGSTART, rc,
                     addr, units, counters, regs, prof)
        if gov is not None:
            gov.record(lanes, (time.perf_counter() - t0) / units)
        tr = unit.trace
        for path, delta in tr.replay.delta.items():
            assign(self.algo, path, resolve(self.algo, path) + delta * units)
        for path, value in tr.replay.value.items():
            assign(self.algo, path, value)
        for path, old in tr.aliased:
            assign(self.algo, path, resolve(self.algo, old))
        result = None
        for k, (slot, tv) in enumerate(prog.outputs):
            arr = outs[k]
            if k == 0:
                result = torch.from_numpy(arr).view(units * tv.shape[0], *tv.shape[1:])
            else:
                path = tr.assigned[k - 1][0]
                assign(self.algo, path, torch.from_numpy(arr.copy()).view(tv.shape))
        return result


def _path_of(root, obj) -> str:
    """obj's attribute path from root, as code would write it (`self.critic_opt`)."""
    return next((describe(path) for path, o in _objects_with_paths(root) if o is obj), type(obj).__name__)
