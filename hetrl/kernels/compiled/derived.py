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
import threading
import time

import numpy as np
import torch

from hetrl.kernels.compiled import vm
from hetrl.kernels.compiled.graph import convert
from hetrl.kernels.compiled.program import Program, lower
from hetrl.kernels.compiled.reference import draw as draw_into
from hetrl.kernels.compiled.trace import Declined, assign, resolve, trace_unit

_PROGRAMS: dict = {}
_LOCK = threading.Lock()


class Lanes:
    """How many lanes run one program's phases where n > 1 are asked for: n, or one where one is measured faster.

    More lanes lose where a phase's work per segment is below what handing tasks between lanes costs (a small
    network's update), and where another process holds a core: a lane descheduled in the middle of a segment
    holds up every later one. A phase computes the same bits on any number of lanes (fixed tasks, sums in a fixed
    order), so the choice is free to follow the clock: the wall time per unit of the last few phases on each
    count, their medians compared; the count not in use is tried again every PROBE phases, so a core given back
    (or taken) is seen within a few probes."""

    PROBE = 20          # phases between tries of the count not in use
    KEEP = 3            # phases per count whose times are compared (their median)
    MARGIN = 1.05       # n lanes are kept unless one is faster by more than this

    def __init__(self, n: int):
        self.n = n
        self.times: dict[int, list[float]] = {n: [], 1: []}
        self.use = n
        self.since = 0

    def pick(self) -> int:
        if not self.times[self.n]:
            return self.n
        if not self.times[1]:
            return 1
        self.since += 1
        if self.since >= self.PROBE:
            self.since = 0
            return 1 if self.use == self.n else self.n
        return self.use

    def record(self, lanes: int, s_per_unit: float) -> None:
        t = self.times[lanes]
        t.append(s_per_unit)
        del t[:-self.KEEP]
        if self.times[1] and self.times[self.n]:
            one, many = float(np.median(self.times[1])), float(np.median(self.times[self.n]))
            self.use = 1 if one * self.MARGIN < many else self.n


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


def hyper_key(algo) -> tuple:
    """The hyper-parameters a trace folds (optimizers other than Adam/AdamW): a change means a new trace."""
    from hetrl.kernels.compiled.trace import PLAIN, optimizers_of
    out = []
    for opt in optimizers_of(algo):
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
        self.units = int(weights.shape[0])


def unit_batch(batches: dict, weights: torch.Tensor, U: int) -> tuple[dict, torch.Tensor]:
    return {k: v[:U].contiguous() for k, v in batches.items()}, weights[:U].contiguous()


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

    def unit_for(self, batches, weights) -> tuple[Unit, int]:
        """(the program for this phase's units, U)."""
        K = int(weights.shape[0])
        U = math.gcd(K, self.period)
        r = int(self.algo.updates) % self.period
        shapes = tuple((k, tuple(v.shape[1:]), v.dtype) for k, v in sorted(batches.items()))
        key = (self.skey, U, r, shapes, tuple(weights.shape[1:]), hyper_key(self.algo))
        with _LOCK:
            got = _PROGRAMS.get(key)
        if got is None:
            t0 = time.perf_counter()
            b, w = unit_batch(batches, weights, U)
            got = Unit(self.algo, b, w)
            self.compile_s += time.perf_counter() - t0
            with _LOCK:
                _PROGRAMS[key] = got
        return got, U

    def ready(self) -> str | None:
        """None where every optimizer the algorithm holds has its state (made by its first step), else why not."""
        from hetrl.kernels.compiled.trace import optimizers_of
        for opt in optimizers_of(self.algo):
            for g in opt.param_groups:
                for p in g["params"]:
                    if p.requires_grad and not opt.state.get(p):
                        return "an optimizer has no state yet (its first step makes it)"
        return None

    def learn(self, batches: dict, weights: torch.Tensor, lanes: int) -> torch.Tensor | None:
        """The phase on the VM; None where it must run the public learn (an optimizer's state not made yet)."""
        if self.ready() is not None:
            return None
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
        prog = unit.prog
        algo = self.algo
        keep, addr = [], np.zeros(len(prog.slots), np.int64)
        outs = {}
        for i, s in enumerate(prog.slots):
            if s.kind == "state":
                path, nbytes = s.info
                try:
                    t = resolve(algo, path)
                except (LookupError, AttributeError, KeyError, IndexError):
                    return None
                st = t.untyped_storage()
                if st.nbytes() != nbytes or t.device.type != "cpu":
                    return None
                addr[i] = st.data_ptr()
                keep.append(t)
            elif s.kind == "input":
                src = weights if s.info == "weights" else batches[s.info]
                if not src.is_contiguous():
                    src = src.contiguous()
                if src.dtype != s.dtype or src.numel() != s.numel * units:
                    raise Declined(f"the batch field {s.info!r} is {src.dtype} {tuple(src.shape)}, not as traced")
                addr[i] = src.data_ptr()
                keep.append(src)
            elif s.kind == "literal":
                addr[i] = s.info.ctypes.data
            else:
                arr = self._array(unit, i, s, units)
                addr[i] = arr.ctypes.data
                keep.append(arr)
                if s.kind == "out":
                    outs[s.info] = arr
        return addr, keep, outs

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
        out = np.zeros(max(1, len(prog.rconst)), np.float64)
        for i, spec in enumerate(prog.rconst):
            if spec is None:
                continue
            opt = resolve(self.algo, spec[1])
            g = opt.param_groups[spec[2]]
            b1, b2 = g["betas"]
            out[i:i + 5] = [float(g["lr"]), float(b1), float(b2), float(g.get("weight_decay", 0.0)), float(g["eps"])]
        return out

    def run(self, unit: Unit, batches, weights, units: int, lanes: int):
        prog = unit.prog
        bound = self.bind(unit, batches, weights, units)
        if bound is None:
            return None
        addr, keep, outs = bound
        # the draws, unit by unit in graph order
        if prog.draws:
            gens = {}
            for d, slot in prog.draws:
                if d.generator not in gens:
                    gens[d.generator] = resolve(self.algo, d.generator) if d.generator is not None else None
            arrays = {slot: keep_arr for slot, keep_arr in ((sl, self._array(unit, sl, prog.slots[sl], units))
                                                           for _, sl in prog.draws)}
            for u in range(units):
                for d, slot in prog.draws:
                    n = prog.slots[slot].numel
                    t = torch.from_numpy(arrays[slot][u * n:(u + 1) * n]).view(d.out.shape)
                    draw_into(d, t, gens[d.generator])
        gov = None
        if lanes > 1 and self.profile_cycles is None:
            gov = self._lanes.get((id(unit), lanes))
            if gov is None:
                gov = self._lanes[(id(unit), lanes)] = Lanes(lanes)
            lanes = gov.pick()
        self.lanes_run[lanes] = self.lanes_run.get(lanes, 0) + 1
        regs, counters = self.registers(prog, lanes)
        prof = self.profile_cycles if self.profile_cycles is not None else np.zeros((lanes, 0), np.int64)
        if prof.shape[0] != lanes or (prof.shape[1] and prof.shape[1] != prog.INS.shape[0] + 1):
            prof = self.profile_cycles = np.zeros((lanes, prog.INS.shape[0] + 1), np.int64)
        rc = self.rconst(prog)
        t0 = time.perf_counter()
        vm.run_phase(prog.INS, prog.OPD, prog.CODE, prog.CST, prog.F, prog.TASKS, prog.SEGSTART, rc,
                     addr, units, counters, regs, prof)
        if gov is not None:
            gov.record(lanes, (time.perf_counter() - t0) / units)
        del keep
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
