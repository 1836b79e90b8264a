"""Generated fused loops for the VM's large elementwise passes (vm.py's EXPR instructions).

The VM interprets a pass one register op at a time over tiles of T elements: each op is a loop of its own that reads
and writes float64 registers in memory. For the large passes of a network's layers (bias, activation and its
derivative, a bias's gradient: a hidden layer's rows x units) that costs several times the arithmetic. Here such a
pass gets one generated numba loop over a tile of a line of its iteration space: loads, every op and the stores in
one pass over the elements, its registers held as local values, vectorised by LLVM where the inner strides are 0 or
1. The VM's `run_fused` walks the lines and tiles as the interpreter does, makes each operand's address and calls the
loop through its address (INS's I_FN column).

*Bit for bit the interpreter's.* The loop computes every op with the interpreter's own formulas (float64 values, vm's
exp/log/tanh, the same NaN rules, float32 rounding where stored), in the same order per element; a reduction over
the inner dim is written to its register's tile and handed, tile by tile, to the interpreter's own reduction
(`c_reduce`); a column reduction accumulates element by element in row order as the interpreter does. So a phase
gives the same bits with or without its fused loops (tests/test_compiler.py), on any number of lanes.

*What it takes.* A pass of at least MIN_ELEMENTS elements whose loads and outputs are plain strided accesses (no
gather, scatter, iota or argmax) and whose ops all have a formula here; any other runs on the interpreter. A loop is
generated per *signature* (the ops and their registers, each operand's dtype, mode and inner stride class: 0, 1 or
other), not per instruction, shape or algorithm: offsets, strides and constants come from the program's tables at run
time, so the layers of every network with one activation share a loop. Each loop is a numba cfunc in a source file
of its own under hetrl's cache (`fused/`), named by a hash of its source and of the VM's sources, and cached by
numba: a second run, or another algorithm with the same layers, compiles nothing (about 0.2-0.4 s a loop where it
does). HETRL_FUSED=0 leaves every pass to the interpreter.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import warnings

import numpy as np

from hetrl.kernels.compiled import vm

# a pass with fewer elements per unit than this stays on the interpreter (its loop would cost a compile for little)
MIN_ELEMENTS = 2048

_UNARY = {
    vm.OP_COPY: "{x}", vm.OP_NEG: "-{x}", vm.OP_ABS: "abs({x})", vm.OP_EXP: "_exp({x})", vm.OP_LOG: "_log({x})",
    vm.OP_LOG1P: "_log1p({x})", vm.OP_EXPM1: "_expm1({x})", vm.OP_SQRT: "np.sqrt({x})",
    vm.OP_RSQRT: "1.0 / np.sqrt(np.float64({x}))", vm.OP_RECIP: "1.0 / np.float64({x})", vm.OP_TANH: "_tanh({x})",
    vm.OP_SIGMOID: "1.0 / (1.0 + _exp(-{x}))", vm.OP_SIGN: "(1.0 if {x} > 0 else (-1.0 if {x} < 0 else 0.0))",
    vm.OP_FLOOR: "np.floor({x})", vm.OP_CEIL: "np.ceil({x})", vm.OP_ROUND: "np.round(np.float64({x}))",
    vm.OP_TRUNC: "np.trunc({x})", vm.OP_NOT: "(1.0 if {x} == 0 else 0.0)", vm.OP_F32: "np.float64(np.float32({x}))",
    vm.OP_ISNAN: "(1.0 if np.isnan({x}) else 0.0)", vm.OP_LOG2: "_log({x}) * 1.4426950408889634",
    vm.OP_EXP2: "_exp({x} * 0.6931471805599453)",
}
_BINARY = {
    vm.OP_ADD: "{x} + {y}", vm.OP_SUB: "{x} - {y}", vm.OP_MUL: "{x} * {y}", vm.OP_DIV: "{x} / {y}",
    vm.OP_MIN: "({x} if {x} < {y} or np.isnan({x}) else {y})",
    vm.OP_MAX: "({x} if {x} > {y} or np.isnan({x}) else {y})",
    vm.OP_LT: "(1.0 if {x} < {y} else 0.0)", vm.OP_LE: "(1.0 if {x} <= {y} else 0.0)",
    vm.OP_GT: "(1.0 if {x} > {y} else 0.0)", vm.OP_GE: "(1.0 if {x} >= {y} else 0.0)",
    vm.OP_EQ: "(1.0 if {x} == {y} else 0.0)", vm.OP_NE: "(1.0 if {x} != {y} else 0.0)",
    vm.OP_AND: "(1.0 if {x} != 0 and {y} != 0 else 0.0)", vm.OP_OR: "(1.0 if {x} != 0 or {y} != 0 else 0.0)",
    vm.OP_XOR: "(1.0 if ({x} != 0) != ({y} != 0) else 0.0)",
}
# per dtype: its typed pointer, and an element's value as the interpreter's _load / _mem_get makes it
_LOAD = {vm.DT_F32: ("p_f32", "np.float64({v})"), vm.DT_F64: ("p_f64", "{v}"), vm.DT_I64: ("p_i64", "np.float64({v})"),
         vm.DT_I32: ("p_i32", "np.float64({v})"), vm.DT_U8: ("p_u8", "np.float64({v})"),
         vm.DT_BOOL: ("p_u8", "np.float64({v})"), vm.DT_I8: ("p_i8", "np.float64({v})"),
         vm.DT_I16: ("p_i16", "np.float64({v})")}


def _cls(s: int) -> int:
    return 0 if s == 0 else (1 if s == 1 else 2)


def signature(prog, i: int) -> tuple | None:
    """The signature of EXPR instruction i (what its generated loop depends on), or None where it is not taken."""
    ins = prog.INS[i]
    if int(ins[vm.I_KIND]) != vm.K_EXPR or int(np.prod(ins[vm.I_D0:vm.I_D0 + 4])) < MIN_ELEMENTS:
        return None
    code = []
    for k in range(int(ins[vm.I_CODE]), int(ins[vm.I_CODE] + ins[vm.I_NCODE])):
        op, dst, a, b, c = (int(x) for x in prog.CODE[k])
        if op == vm.OP_LOAD:
            o = prog.OPD[a]
            dt = int(o[vm.O_DT])
            if dt not in _LOAD or int(o[vm.O_NIDX]) != 0:
                return None
            code.append(("ld", dst, dt, _cls(int(o[vm.O_S0 + 3]))))
        elif op in _UNARY:
            code.append(("un", dst, op, a))
        elif op in _BINARY:
            code.append(("bin", dst, op, a, b))
        elif op in (vm.OP_WHERE, vm.OP_LERP):
            code.append(("tri", dst, op, a, b, c))
        else:
            return None
    # the constants' registers (their values, of whatever kind, are filled in by the VM's run_fused)
    consts = tuple(int(r) for r in prog.CST[int(ins[vm.I_CONST]):int(ins[vm.I_CONST] + ins[vm.I_NCONST]), 0])
    outs = []
    for o in range(int(ins[vm.I_OUT]), int(ins[vm.I_OUT] + ins[vm.I_NOUT])):
        row = prog.OPD[o]
        mode, dt = int(row[vm.O_MODE]), int(row[vm.O_DT])
        if mode not in (vm.M_STORE, vm.M_ADD, vm.M_SUM, vm.M_PROD, vm.M_MAX, vm.M_MIN) or int(row[vm.O_NIDX]) != 0 \
                or dt not in _LOAD:
            return None
        outs.append((mode, dt, int(row[vm.O_REG]), _cls(int(row[vm.O_S0 + 3]))))
    return tuple(code), consts, tuple(outs)


def source(sig: tuple, name: str) -> str:
    """The numba source of the fused loop for one signature: one line's tile of nn elements, every operand's
    address (loads, then outputs; an inner reduction's output is its tile buffer) in P and inner stride in S, the
    constants by register in C (vm's run_fused walks the lines and tiles and calls it)."""
    code, consts, outs = sig
    loads = [c for c in code if c[0] == "ld"]
    nq = len(loads) + len(outs)
    nr = 1 + max([c[1] for c in code] + list(consts) + [o[2] for o in outs])
    used = " ".join(_UNARY.get(c[2], "") for c in code if c[0] == "un")
    helpers = [h for h in ("_exp", "_log", "_log1p", "_expm1", "_tanh") if h + "(" in used]
    ptrs = sorted({_LOAD[c[2]][0] for c in loads} | {_LOAD[o[1]][0] for o in outs} | {"p_i64", "p_f64"})
    L = []
    w = L.append
    w("import numba\nimport numpy as np\nfrom numba import types\n")
    w(f"from hetrl.kernels.compiled.vm import {', '.join(helpers + ['_mem_get', '_mem_set'] + ptrs)}\n\n")
    w("@numba.cfunc(types.void(types.intp, types.intp, types.intp, types.intp), cache=True, nopython=True,"
      " error_model='numpy')")
    w(f"def {name}(nn, P, S, C):  # pragma: no cover - compiled")
    w(f"    ptr = numba.carray(p_i64(P), ({nq},))")
    w(f"    st = numba.carray(p_i64(S), ({nq},))")
    w(f"    cv = numba.carray(p_f64(C), ({nr},))")
    for r in consts:
        w(f"    r{r} = cv[{r}]")
    q = 0
    qof = {}
    for k, c in enumerate(code):
        if c[0] != "ld":
            continue
        qof[k] = q
        p_ = _LOAD[c[2]][0]
        if c[3] == 1:
            w(f"    v{q} = numba.carray({p_}(ptr[{q}]), (nn,))")
        elif c[3] == 0:
            w(f"    v{q} = {p_}(ptr[{q}])[0]")
        else:
            w(f"    v{q} = {p_}(ptr[{q}])")
            w(f"    s{q} = st[{q}]")
        q += 1
    for m, (mode, dt, reg, cl) in enumerate(outs):
        p_ = _LOAD[dt][0]
        if mode >= vm.M_SUM and cl == 0:
            w(f"    w{m} = numba.carray(p_f64(ptr[{q + m}]), (nn,))")
        elif cl == 1 and dt in (vm.DT_F32, vm.DT_F64):
            w(f"    w{m} = numba.carray({p_}(ptr[{q + m}]), (nn,))")
        else:
            w(f"    A{m} = ptr[{q + m}]")
            w(f"    S{m} = st[{q + m}]")
    w("    for j in range(nn):")
    ind = " " * 8
    for k, c in enumerate(code):
        kind, dst = c[0], c[1]
        if kind == "ld":
            conv, qq = _LOAD[c[2]][1], qof[k]
            v = {1: f"v{qq}[j]", 0: f"v{qq}"}.get(c[3], f"v{qq}[j * s{qq}]")
            w(f"{ind}r{dst} = " + conv.format(v=v))
        elif kind == "un":
            w(f"{ind}r{dst} = " + _UNARY[c[2]].format(x=f"r{c[3]}"))
        elif kind == "bin":
            w(f"{ind}r{dst} = " + _BINARY[c[2]].format(x=f"r{c[3]}", y=f"r{c[4]}"))
        elif c[2] == vm.OP_WHERE:
            w(f"{ind}r{dst} = r{c[4]} if r{c[3]} != 0 else r{c[5]}")
        else:   # lerp: torch's, as the interpreter's _lerp
            a, b, wt = f"r{c[3]}", f"r{c[4]}", f"r{c[5]}"
            w(f"{ind}dl = {b} - {a}")
            w(f"{ind}r{dst} = {a} + {wt} * dl if abs({wt}) < 0.5 else {b} - dl * (1.0 - {wt})")
    for m, (mode, dt, reg, cl) in enumerate(outs):
        r = f"r{reg}"
        at = f"j * S{m}"
        if mode >= vm.M_SUM and cl == 0:
            w(f"{ind}w{m}[j] = {r}")
        elif mode == vm.M_STORE:
            if cl == 1 and dt == vm.DT_F32:
                w(f"{ind}w{m}[j] = np.float32({r})")
            elif cl == 1 and dt == vm.DT_F64:
                w(f"{ind}w{m}[j] = {r}")
            elif dt == vm.DT_F32:
                w(f"{ind}p_f32(A{m})[{at}] = np.float32({r})")
            elif dt == vm.DT_BOOL:
                w(f"{ind}p_u8(A{m})[{at}] = np.uint8(1) if {r} != 0 else np.uint8(0)")
            else:
                w(f"{ind}_mem_set(A{m}, {dt}, {at}, np.float64({r}))")
        elif mode == vm.M_ADD:
            w(f"{ind}_mem_set(A{m}, {dt}, {at}, _mem_get(A{m}, {dt}, {at}) + np.float64({r}))")
        elif dt == vm.DT_F32 and mode == vm.M_SUM:   # a column reduction: the interpreter's float32 accumulation
            if cl == 1:
                w(f"{ind}w{m}[j] += np.float32({r})")
            else:
                w(f"{ind}p_f32(A{m})[{at}] += np.float32({r})")
        else:
            w(f"{ind}vv = np.float64({r})")
            w(f"{ind}old = _mem_get(A{m}, {dt}, {at})")
            if mode == vm.M_SUM:
                w(f"{ind}_mem_set(A{m}, {dt}, {at}, old + vv)")
            elif mode == vm.M_PROD:
                w(f"{ind}_mem_set(A{m}, {dt}, {at}, old * vv)")
            elif mode == vm.M_MAX:
                w(f"{ind}if vv > old or np.isnan(vv):\n{ind}    _mem_set(A{m}, {dt}, {at}, vv)")
            else:
                w(f"{ind}if vv < old or np.isnan(vv):\n{ind}    _mem_set(A{m}, {dt}, {at}, vv)")
    return "\n".join(L) + "\n"


_LOCK = threading.Lock()
_LOOPS: dict[tuple, int] = {}      # signature -> the loop's address
COMPILED = [0]                     # loops this process compiled (not loaded from numba's cache)


def _stamp() -> str:
    from hetrl.kernels.compiled.cache import package_stamp
    return package_stamp().hex()[:16]


def loop_address(sig: tuple) -> int:
    """The address of the fused loop for sig, generated and compiled (or loaded from numba's cache) on first use."""
    with _LOCK:
        got = _LOOPS.get(sig)
        if got:
            return got
        if got is not None:
            raise RuntimeError("it did not compile before")
        name = "fused_" + hashlib.sha256(repr((sig, _stamp())).encode()).hexdigest()[:20]
        src = source(sig, name)
        from hetrl.machine import cache_dir
        d = cache_dir() / "fused"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{name}.py"
        if not path.exists() or path.read_text() != src:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(src)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"hetrl_fused_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod   # (numba's cache finds a function's module by its name)
        spec.loader.exec_module(mod)
        loop = getattr(mod, name)
        COMPILED[0] += loop.cache_hits == 0
        got = _LOOPS[sig] = int(loop.address)
        return got


def attach(prog) -> int:
    """Give every EXPR instruction of prog that has a signature its fused loop (INS's I_FN column); the number
    attached (none with HETRL_FUSED=0)."""
    if os.environ.get("HETRL_FUSED", "1") == "0" or vm.numba is None:
        return 0
    n = 0
    for i in range(prog.INS.shape[0]):
        sig = signature(prog, i)
        if sig is None:
            continue
        try:
            prog.INS[i, vm.I_FN] = loop_address(sig)
            n += 1
        except Exception as e:   # (a loop that does not compile leaves its pass to the interpreter, which is exact)
            _LOOPS[sig] = 0
            warnings.warn(f"hetrl: a fused loop did not compile ({type(e).__name__}: {e}); the interpreter runs "
                          "its pass", RuntimeWarning, stacklevel=2)
    return n
