"""The compiled program's interpreter: one numba function, compiled once per machine (numba's cache), that runs
any algorithm's phase from tables (program.py makes them). It is the lowering's precompiled library: nothing is
generated or compiled per algorithm, so a new algorithm or shape costs no compile time.

A program is a list of *instructions* grouped into *segments*; a segment's work is a list of *tasks*, which the
lanes (numba's threads) take one at a time from a shared ticket counter and which may run in any order and on any
lane; a segment's tasks start only when every task of the earlier segments has finished. Tasks are fixed by the
program (a block of a batch's rows, a span of a parameter buffer, one serial list), never by the number of lanes,
and a task writes what it computes into memory of its own (a block's rows, a block's partial sums, which a later
task sums in a fixed order): so a phase computes bit for bit the same on one lane or on several.

A lane that finds no task it may start yet waits on the counter of finished tasks: it spins briefly, then yields
its core (sched_yield): a lane whose thread the system has descheduled (another process on its core) holds up no
more than the task it is in, and the other lanes take the rest.

Instructions:

* EXPR: a fused elementwise pass over an iteration space of up to 4 dims, as a list of register ops (`CODE`) run on
  tiles of up to T elements: loads (strided, broadcast, gathered through index registers, or the iteration index),
  arithmetic, and outputs stored, accumulated, scattered or reduced (sum, prod, max, min, argmax, argmin) over the
  dims whose output stride is 0. Registers are float32 or float64 (per instruction: float64 where integers or
  float64 data pass through).
* GEMM: C = alpha op(A) op(B) + beta C on the machine's float32 GEMM (sgemm.py), for row-major or transposed operands,
  in one call per task (a block of C's rows or columns), looped over a batch dim for batched products.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from hetrl.kernels.compiled import sgemm

try:
    import numba
    from llvmlite import binding as _llvm
    from llvmlite import ir as _ir
    from numba import types
    from numba.core.extending import intrinsic
except ImportError:  # pragma: no cover
    numba = None

T = 256          # elements per tile (a register)

# instruction kinds
K_EXPR, K_GEMM = 0, 1
# INS columns
I_KIND, I_REGDT, I_D0, I_SPLIT, I_EXT, I_NB, I_CODE, I_NCODE, I_CONST, I_NCONST, I_NREGS = 0, 1, 2, 6, 7, 8, 9, 10, 11, \
    12, 13
I_OUT, I_NOUT = 14, 15
I_A, I_B, I_C, I_M, I_N, I_K, I_ALPHA, I_BETA, I_BATCH = 9, 10, 11, 12, 13, 14, 15, 16, 17
INS_W = 18
# OPD columns (operands: loads and outputs of EXPR, matrices of GEMM)
O_ST, O_DT, O_OFF, O_S0, O_USTR, O_BSTR, O_REG, O_MODE, O_NIDX, O_IREG, O_ISTR, O_ARGDIM, O_PAIR = 0, 1, 2, 3, 7, 8, 9, \
    10, 11, 12, 14, 16, 17
OPD_W = 18
# GEMM operand: O_S0 row stride, O_S0 + 1 column stride, O_S0 + 2 batch stride
# dtypes
DT_F32, DT_F64, DT_I64, DT_I32, DT_U8, DT_BOOL, DT_I8, DT_I16, DT_IOTA = range(9)
# output modes
M_STORE, M_ADD, M_SUM, M_MAX, M_MIN, M_PROD, M_ARGMAX, M_ARGMIN, M_ARGVAL = range(9)
# (M_ARGVAL: the running value of an argmax/argmin, which that output initialises and updates)
# constant kinds (CST rows: reg, kind, index)
C_LIT, C_RC, C_UNIFORM = 0, 1, 2
# register ops (CODE rows: op, dst, a, b, c)
(OP_LOAD, OP_COPY, OP_NEG, OP_ABS, OP_EXP, OP_LOG, OP_LOG1P, OP_EXPM1, OP_SQRT, OP_RSQRT, OP_RECIP, OP_TANH,
 OP_SIGMOID, OP_SIGN, OP_FLOOR, OP_CEIL, OP_ROUND, OP_TRUNC, OP_NOT, OP_SIN, OP_COS, OP_ERF, OP_F32, OP_ISNAN, OP_ATAN,
 OP_LOG2, OP_EXP2, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_MIN, OP_MAX, OP_LT, OP_LE, OP_GT, OP_GE, OP_EQ, OP_NE,
 OP_AND, OP_OR, OP_XOR, OP_FMOD, OP_REM, OP_ATAN2, OP_WHERE) = range(47)
OPCODES = {"copy": OP_COPY, "neg": OP_NEG, "abs": OP_ABS, "exp": OP_EXP, "log": OP_LOG, "log1p": OP_LOG1P,
           "expm1": OP_EXPM1, "sqrt": OP_SQRT, "rsqrt": OP_RSQRT, "recip": OP_RECIP, "tanh": OP_TANH,
           "sigmoid": OP_SIGMOID, "sign": OP_SIGN, "floor": OP_FLOOR, "ceil": OP_CEIL, "round": OP_ROUND,
           "trunc": OP_TRUNC, "not": OP_NOT, "sin": OP_SIN, "cos": OP_COS, "erf": OP_ERF, "f32": OP_F32,
           "isnan": OP_ISNAN, "atan": OP_ATAN, "log2": OP_LOG2, "exp2": OP_EXP2, "add": OP_ADD, "sub": OP_SUB,
           "mul": OP_MUL, "div": OP_DIV, "pow": OP_POW, "min": OP_MIN, "max": OP_MAX, "lt": OP_LT, "le": OP_LE,
           "gt": OP_GT, "ge": OP_GE, "eq": OP_EQ, "ne": OP_NE, "and": OP_AND, "or": OP_OR, "xor": OP_XOR,
           "fmod": OP_FMOD, "rem": OP_REM, "atan2": OP_ATAN2, "where": OP_WHERE}

SPIN = 2000      # polls of the finished-task counter before a waiting lane starts yielding its core

if numba is not None:
    # ---- intrinsics: raw pointers, atomics, the CPU's pause ------------------------------------------------------
    def _ptr_intrinsic(nbtype):
        @intrinsic
        def ptr(typingctx, addr):
            sig = types.CPointer(nbtype)(types.int64)

            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
            return sig, codegen
        return ptr

    p_f32, p_f64, p_i64, p_i32 = (_ptr_intrinsic(t) for t in (types.float32, types.float64, types.int64, types.int32))
    p_u8, p_i8, p_i16 = (_ptr_intrinsic(t) for t in (types.uint8, types.int8, types.int16))

    @intrinsic
    def atomic_add(typingctx, arr, idx, val):
        sig = types.int64(arr, idx, val)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            return builder.atomic_rmw("add", ptr, args[2], "seq_cst")
        return sig, codegen

    @intrinsic
    def atomic_load(typingctx, arr, idx):
        sig = types.int64(arr, idx)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            return builder.load_atomic(ptr, "seq_cst", 8)
        return sig, codegen

    @intrinsic
    def cpu_pause(typingctx):
        sig = types.void()

        def codegen(context, builder, signature, args):
            fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=_ir.FunctionType(_ir.VoidType(), []))
            builder.call(fn, [])
            return context.get_dummy_value()
        return sig, codegen

    _libc = ctypes.CDLL(None)
    _llvm.add_symbol("hetrl_vm_sched_yield", ctypes.cast(_libc.sched_yield, ctypes.c_void_p).value)
    sched_yield = types.ExternalFunction("hetrl_vm_sched_yield", types.int32())

    from hetrl.kernels.compiled.layers import exp_neg, tanh32

    # ---- scalar helpers ----------------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True, inline="always")
    def _exp(x):  # pragma: no cover - compiled
        """exp of a float64, vectorisable (exp_neg of -|x|, inverted for x > 0)."""
        e = exp_neg(-abs(x))
        return 1.0 / e if x > 0 else e

    @numba.njit(cache=True, nogil=True, inline="always")
    def _mem_get(addr, dt, k):  # pragma: no cover - compiled
        if dt == DT_F32:
            return np.float64(p_f32(addr)[k])
        if dt == DT_F64:
            return p_f64(addr)[k]
        if dt == DT_I64:
            return np.float64(p_i64(addr)[k])
        if dt == DT_I32:
            return np.float64(p_i32(addr)[k])
        if dt == DT_U8 or dt == DT_BOOL:
            return np.float64(p_u8(addr)[k])
        if dt == DT_I8:
            return np.float64(p_i8(addr)[k])
        return np.float64(p_i16(addr)[k])

    @numba.njit(cache=True, nogil=True, inline="always")
    def _mem_set(addr, dt, k, v):  # pragma: no cover - compiled
        if dt == DT_F32:
            p_f32(addr)[k] = np.float32(v)
        elif dt == DT_F64:
            p_f64(addr)[k] = v
        elif dt == DT_I64:
            p_i64(addr)[k] = np.int64(v)
        elif dt == DT_I32:
            p_i32(addr)[k] = np.int32(v)
        elif dt == DT_BOOL:
            p_u8(addr)[k] = np.uint8(1 if v != 0 else 0)
        elif dt == DT_U8:
            p_u8(addr)[k] = np.uint8(v)
        elif dt == DT_I8:
            p_i8(addr)[k] = np.int8(v)
        else:
            p_i16(addr)[k] = np.int16(v)

    # ---- loads into a register ---------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True)
    def _load(reg, addr, dt, bases, nl, ni, i0, s3):  # pragma: no cover - compiled
        """reg[l * ni + j] = mem[bases[l] + (i0 + j) * s3] for the tile's nl lines of ni elements (typed loops per
        dtype and stride, so that the contiguous float32 case vectorises)."""
        if dt == DT_F32:
            src = p_f32(addr)
            for l in range(nl):
                b = bases[l] + i0 * s3
                r = reg[l * ni:(l + 1) * ni]
                if s3 == 1:
                    for j in range(ni):
                        r[j] = src[b + j]
                elif s3 == 0:
                    v = src[b]
                    for j in range(ni):
                        r[j] = v
                else:
                    for j in range(ni):
                        r[j] = src[b + j * s3]
            return
        for l in range(nl):
            b = bases[l] + i0 * s3
            for j in range(ni):
                reg[l * ni + j] = _mem_get(addr, dt, b + j * s3)

    @numba.njit(cache=True, nogil=True)
    def _gather(reg, addr, dt, bases, nl, ni, i0, s3, regs, nidx, ireg0, istr0, ireg1, istr1):  # pragma: no cover
        """A load whose address adds index registers times their strides (gather, advanced indexing)."""
        for l in range(nl):
            b = bases[l] + i0 * s3
            for j in range(ni):
                t = l * ni + j
                k = b + j * s3 + np.int64(regs[ireg0, t]) * istr0
                if nidx > 1:
                    k += np.int64(regs[ireg1, t]) * istr1
                reg[t] = _mem_get(addr, dt, k)

    @numba.njit(cache=True, nogil=True)
    def _iota(reg, lines, nl, ni, i0, opd_row):  # pragma: no cover - compiled
        """reg = sum_d index_d * s_d (the iteration index as a value: arange, one_hot)."""
        s0, s1, s2, s3 = opd_row[O_S0], opd_row[O_S0 + 1], opd_row[O_S0 + 2], opd_row[O_S0 + 3]
        for l in range(nl):
            b = lines[0, l] * s0 + lines[1, l] * s1 + lines[2, l] * s2 + opd_row[O_OFF]
            for j in range(ni):
                reg[l * ni + j] = b + (i0 + j) * s3

    # ---- register ops ------------------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True)
    def _unary(op, z, x, n):  # pragma: no cover - compiled
        if op == OP_COPY:
            for t in range(n):
                z[t] = x[t]
        elif op == OP_NEG:
            for t in range(n):
                z[t] = -x[t]
        elif op == OP_ABS:
            for t in range(n):
                z[t] = abs(x[t])
        elif op == OP_EXP:
            for t in range(n):
                z[t] = _exp(np.float64(x[t]))
        elif op == OP_LOG:
            for t in range(n):
                z[t] = np.log(np.float64(x[t]))
        elif op == OP_LOG1P:
            for t in range(n):
                z[t] = np.log1p(np.float64(x[t]))
        elif op == OP_EXPM1:
            for t in range(n):
                v = np.float64(x[t])
                z[t] = np.expm1(v) if abs(v) < 0.5 else _exp(v) - 1.0
        elif op == OP_SQRT:
            for t in range(n):
                z[t] = np.sqrt(x[t])
        elif op == OP_RSQRT:
            for t in range(n):
                z[t] = 1.0 / np.sqrt(np.float64(x[t]))
        elif op == OP_RECIP:
            for t in range(n):
                z[t] = 1.0 / np.float64(x[t])
        elif op == OP_TANH:
            for t in range(n):
                z[t] = tanh32(x[t])
        elif op == OP_SIGMOID:
            for t in range(n):
                z[t] = 1.0 / (1.0 + _exp(-np.float64(x[t])))
        elif op == OP_SIGN:
            for t in range(n):
                v = x[t]
                z[t] = 1.0 if v > 0 else (-1.0 if v < 0 else 0.0)
        elif op == OP_FLOOR:
            for t in range(n):
                z[t] = np.floor(x[t])
        elif op == OP_CEIL:
            for t in range(n):
                z[t] = np.ceil(x[t])
        elif op == OP_ROUND:
            for t in range(n):
                z[t] = np.round(np.float64(x[t]))
        elif op == OP_TRUNC:
            for t in range(n):
                z[t] = np.trunc(x[t])
        elif op == OP_NOT:
            for t in range(n):
                z[t] = 1.0 if x[t] == 0 else 0.0
        elif op == OP_SIN:
            for t in range(n):
                z[t] = np.sin(np.float64(x[t]))
        elif op == OP_COS:
            for t in range(n):
                z[t] = np.cos(np.float64(x[t]))
        elif op == OP_ERF:
            for t in range(n):
                z[t] = _erf(np.float64(x[t]))
        elif op == OP_F32:
            for t in range(n):
                z[t] = np.float32(x[t])
        elif op == OP_ISNAN:
            for t in range(n):
                z[t] = 1.0 if np.isnan(x[t]) else 0.0
        elif op == OP_ATAN:
            for t in range(n):
                z[t] = np.arctan(np.float64(x[t]))
        elif op == OP_LOG2:
            for t in range(n):
                z[t] = np.log2(np.float64(x[t]))
        elif op == OP_EXP2:
            for t in range(n):
                z[t] = np.exp2(np.float64(x[t]))

    @numba.njit(cache=True, nogil=True)
    def _erf(x):  # pragma: no cover - compiled
        return math.erf(x)

    @numba.njit(cache=True, nogil=True)
    def _binary(op, z, x, y, n):  # pragma: no cover - compiled
        if op == OP_ADD:
            for t in range(n):
                z[t] = x[t] + y[t]
        elif op == OP_SUB:
            for t in range(n):
                z[t] = x[t] - y[t]
        elif op == OP_MUL:
            for t in range(n):
                z[t] = x[t] * y[t]
        elif op == OP_DIV:
            for t in range(n):
                z[t] = x[t] / y[t]
        elif op == OP_POW:
            for t in range(n):
                z[t] = np.float64(x[t]) ** np.float64(y[t])
        elif op == OP_MIN:
            for t in range(n):
                a, b = x[t], y[t]
                z[t] = a if a < b or np.isnan(a) else b
        elif op == OP_MAX:
            for t in range(n):
                a, b = x[t], y[t]
                z[t] = a if a > b or np.isnan(a) else b
        elif op == OP_LT:
            for t in range(n):
                z[t] = 1.0 if x[t] < y[t] else 0.0
        elif op == OP_LE:
            for t in range(n):
                z[t] = 1.0 if x[t] <= y[t] else 0.0
        elif op == OP_GT:
            for t in range(n):
                z[t] = 1.0 if x[t] > y[t] else 0.0
        elif op == OP_GE:
            for t in range(n):
                z[t] = 1.0 if x[t] >= y[t] else 0.0
        elif op == OP_EQ:
            for t in range(n):
                z[t] = 1.0 if x[t] == y[t] else 0.0
        elif op == OP_NE:
            for t in range(n):
                z[t] = 1.0 if x[t] != y[t] else 0.0
        elif op == OP_AND:
            for t in range(n):
                z[t] = 1.0 if x[t] != 0 and y[t] != 0 else 0.0
        elif op == OP_OR:
            for t in range(n):
                z[t] = 1.0 if x[t] != 0 or y[t] != 0 else 0.0
        elif op == OP_XOR:
            for t in range(n):
                z[t] = 1.0 if (x[t] != 0) != (y[t] != 0) else 0.0
        elif op == OP_FMOD:
            for t in range(n):
                z[t] = np.fmod(np.float64(x[t]), np.float64(y[t]))
        elif op == OP_REM:
            for t in range(n):
                a, b = np.float64(x[t]), np.float64(y[t])
                z[t] = a - np.floor(a / b) * b
        elif op == OP_ATAN2:
            for t in range(n):
                z[t] = np.arctan2(np.float64(x[t]), np.float64(y[t]))

    @numba.njit(cache=True, nogil=True)
    def _where(z, c, x, y, n):  # pragma: no cover - compiled
        for t in range(n):
            z[t] = x[t] if c[t] != 0 else y[t]

    # ---- outputs -------------------------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True)
    def _store(reg, addr, dt, bases, nl, ni, i0, s3, mode, regs, nidx, ireg0, istr0, ireg1, istr1):  # pragma: no cover
        """Store, accumulate or scatter reg into memory (see M_*: reductions are _reduce's)."""
        if dt == DT_F32 and nidx == 0 and mode == M_STORE:
            dst = p_f32(addr)
            for l in range(nl):
                b = bases[l] + i0 * s3
                r = reg[l * ni:(l + 1) * ni]
                if s3 == 1:
                    for j in range(ni):
                        dst[b + j] = np.float32(r[j])
                else:
                    for j in range(ni):
                        dst[b + j * s3] = np.float32(r[j])
            return
        for l in range(nl):
            b = bases[l] + i0 * s3
            for j in range(ni):
                t = l * ni + j
                k = b + j * s3
                if nidx > 0:
                    k += np.int64(regs[ireg0, t]) * istr0
                    if nidx > 1:
                        k += np.int64(regs[ireg1, t]) * istr1
                if mode == M_ADD:
                    _mem_set(addr, dt, k, _mem_get(addr, dt, k) + np.float64(reg[t]))
                else:
                    _mem_set(addr, dt, k, np.float64(reg[t]))

    @numba.njit(cache=True, nogil=True)
    def _reduce(reg, addr, dt, bases, nl, ni, i0, s3, mode):  # pragma: no cover - compiled
        """Accumulate reg into a reduction's output: over the inner dim per line where s3 == 0 (the line's values
        combined first, in float64), element by element otherwise."""
        for l in range(nl):
            b = bases[l] + i0 * s3
            r = reg[l * ni:(l + 1) * ni]
            if s3 == 0:
                if mode == M_SUM:
                    acc = 0.0
                    for j in range(ni):
                        acc += np.float64(r[j])
                    _mem_set(addr, dt, b, _mem_get(addr, dt, b) + acc)
                elif mode == M_PROD:
                    acc = 1.0
                    for j in range(ni):
                        acc *= np.float64(r[j])
                    _mem_set(addr, dt, b, _mem_get(addr, dt, b) * acc)
                elif mode == M_MAX:
                    acc = _mem_get(addr, dt, b)
                    for j in range(ni):
                        v = np.float64(r[j])
                        if v > acc or np.isnan(v):
                            acc = v
                    _mem_set(addr, dt, b, acc)
                else:
                    acc = _mem_get(addr, dt, b)
                    for j in range(ni):
                        v = np.float64(r[j])
                        if v < acc or np.isnan(v):
                            acc = v
                    _mem_set(addr, dt, b, acc)
            elif dt == DT_F32 and mode == M_SUM:
                dst = p_f32(addr)
                for j in range(ni):
                    dst[b + j * s3] += np.float32(r[j])
            else:
                for j in range(ni):
                    k = b + j * s3
                    v = np.float64(r[j])
                    old = _mem_get(addr, dt, k)
                    if mode == M_SUM:
                        _mem_set(addr, dt, k, old + v)
                    elif mode == M_PROD:
                        _mem_set(addr, dt, k, old * v)
                    elif mode == M_MAX:
                        if v > old or np.isnan(v):
                            _mem_set(addr, dt, k, v)
                    elif v < old or np.isnan(v):
                        _mem_set(addr, dt, k, v)

    @numba.njit(cache=True, nogil=True)
    def _argreduce(reg, addr, dt, bases, vaddr, vdt, vbases, nl, ni, i0, s3, vs3, lines, argdim, mode):  # pragma: no cover
        """argmax/argmin: where reg beats the running value (vaddr), the value and the index along argdim."""
        for l in range(nl):
            for j in range(ni):
                t = l * ni + j
                v = np.float64(reg[t])
                kv = vbases[l] + (i0 + j) * vs3
                cur = _mem_get(vaddr, vdt, kv)
                better = (v > cur) if mode == M_ARGMAX else (v < cur)
                if better or (np.isnan(v) and not np.isnan(cur)):
                    _mem_set(vaddr, vdt, kv, v)
                    idx = lines[argdim, l] if argdim < 3 else i0 + j
                    _mem_set(addr, dt, bases[l] + (i0 + j) * s3, np.float64(idx))

    @numba.njit(cache=True, nogil=True)
    def _init_region(addr, dt, off, d, s, value):  # pragma: no cover - compiled
        """Set the output region (dims d, strides s; dims with stride 0 once) to value."""
        n0 = d[0] if s[0] != 0 else 1
        n1 = d[1] if s[1] != 0 else 1
        n2 = d[2] if s[2] != 0 else 1
        n3 = d[3] if s[3] != 0 else 1
        for a in range(n0):
            for b in range(n1):
                for c in range(n2):
                    base = off + a * s[0] + b * s[1] + c * s[2]
                    for e in range(n3):
                        _mem_set(addr, dt, base + e * s[3], value)

    # ---- one EXPR instruction on a block ---------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True)
    def run_expr(ins, OPD, CODE, CST, F, rc, addr, regs, lines, bases, unit, chunk):  # pragma: no cover - compiled
        d = np.empty(4, np.int64)
        for k in range(4):
            d[k] = ins[I_D0 + k]
        lo = np.int64(0)
        split = ins[I_SPLIT]
        if split >= 0:   # the task's block of the split dim
            E, NB = ins[I_EXT], ins[I_NB]
            lo = chunk * E // NB
            d[split] = (chunk + 1) * E // NB - lo
        for k in range(4):
            if d[k] == 0:
                return
        nout = ins[I_NOUT]
        # the outputs' offsets for this unit and block; reductions start from their identity
        for o in range(ins[I_OUT], ins[I_OUT] + nout):
            mode = OPD[o, O_MODE]
            if mode >= M_SUM and mode != M_ARGVAL:
                init = 0.0
                if mode == M_PROD:
                    init = 1.0
                elif mode == M_MAX or mode == M_ARGMAX:
                    init = -np.inf
                elif mode == M_MIN or mode == M_ARGMIN:
                    init = np.inf
                off = _opd_off(OPD, o, unit, chunk, lo, split)
                if mode == M_ARGMAX or mode == M_ARGMIN:
                    pv = OPD[o, O_PAIR]
                    _init_region(addr[OPD[pv, O_ST]], OPD[pv, O_DT], _opd_off(OPD, pv, unit, chunk, lo, split), d,
                                 OPD[pv, O_S0:O_S0 + 4], init)
                    _init_region(addr[OPD[o, O_ST]], OPD[o, O_DT], off, d, OPD[o, O_S0:O_S0 + 4], 0.0)
                else:
                    _init_region(addr[OPD[o, O_ST]], OPD[o, O_DT], off, d, OPD[o, O_S0:O_S0 + 4], init)
        # constants into their registers (whole tiles, once)
        for c in range(ins[I_CONST], ins[I_CONST] + ins[I_NCONST]):
            r, kind, idx = CST[c, 0], CST[c, 1], CST[c, 2]
            if kind == C_LIT:
                v = F[idx]
            elif kind == C_RC:
                v = rc[idx]
            else:
                v = _mem_get(addr[OPD[idx, O_ST]], OPD[idx, O_DT], _opd_off(OPD, idx, unit, chunk, lo, split))
            for t in range(T):
                regs[r, t] = v
        nlines = d[0] * d[1] * d[2]
        inner = d[3]
        ni = inner if inner < T else T
        per = T // ni
        c0, c1 = ins[I_CODE], ins[I_CODE] + ins[I_NCODE]
        for line0 in range(0, nlines, per):
            nl = min(per, nlines - line0)
            for l in range(nl):   # the tile's lines as (i0, i1, i2)
                q = line0 + l
                lines[2, l] = q % d[2]
                q //= d[2]
                lines[1, l] = q % d[1]
                lines[0, l] = q // d[1]
            for i0 in range(0, inner, ni):
                nn = min(ni, inner - i0)
                n = nl * nn
                for k in range(c0, c1):
                    op, dst = CODE[k, 0], CODE[k, 1]
                    if op == OP_LOAD:
                        o = CODE[k, 2]
                        dt = OPD[o, O_DT]
                        if dt == DT_IOTA:
                            _iota(regs[dst], lines, nl, nn, i0, OPD[o])
                            continue
                        _bases(OPD, o, lines, nl, bases, unit, chunk, lo, split)
                        if OPD[o, O_NIDX] == 0:
                            _load(regs[dst], addr[OPD[o, O_ST]], dt, bases, nl, nn, i0, OPD[o, O_S0 + 3])
                        else:
                            _gather(regs[dst], addr[OPD[o, O_ST]], dt, bases, nl, nn, i0, OPD[o, O_S0 + 3], regs,
                                    OPD[o, O_NIDX], OPD[o, O_IREG], OPD[o, O_ISTR], OPD[o, O_IREG + 1],
                                    OPD[o, O_ISTR + 1])
                    elif op == OP_WHERE:
                        _where(regs[dst], regs[CODE[k, 2]], regs[CODE[k, 3]], regs[CODE[k, 4]], n)
                    elif op >= OP_ADD:
                        _binary(op, regs[dst], regs[CODE[k, 2]], regs[CODE[k, 3]], n)
                    else:
                        _unary(op, regs[dst], regs[CODE[k, 2]], n)
                for o in range(ins[I_OUT], ins[I_OUT] + nout):
                    mode = OPD[o, O_MODE]
                    if mode == M_ARGVAL:
                        continue
                    _bases(OPD, o, lines, nl, bases, unit, chunk, lo, split)
                    a = addr[OPD[o, O_ST]]
                    r = regs[OPD[o, O_REG]]
                    if mode <= M_ADD:
                        _store(r, a, OPD[o, O_DT], bases, nl, nn, i0, OPD[o, O_S0 + 3], mode, regs, OPD[o, O_NIDX],
                               OPD[o, O_IREG], OPD[o, O_ISTR], OPD[o, O_IREG + 1], OPD[o, O_ISTR + 1])
                    elif mode == M_ARGMAX or mode == M_ARGMIN:
                        pv = OPD[o, O_PAIR]
                        vb = bases[T:]
                        _bases(OPD, pv, lines, nl, vb, unit, chunk, lo, split)
                        _argreduce(r, a, OPD[o, O_DT], bases, addr[OPD[pv, O_ST]], OPD[pv, O_DT], vb, nl, nn, i0,
                                   OPD[o, O_S0 + 3], OPD[pv, O_S0 + 3], lines, OPD[o, O_ARGDIM], mode)
                    else:
                        _reduce(r, a, OPD[o, O_DT], bases, nl, nn, i0, OPD[o, O_S0 + 3], mode)

    @numba.njit(cache=True, nogil=True, inline="always")
    def _opd_off(OPD, o, unit, chunk, lo, split):  # pragma: no cover - compiled
        """An operand's offset for this unit and block: its own, the unit's, the block's partial slot, and the start
        of the block's rows along the split dim."""
        off = OPD[o, O_OFF] + unit * OPD[o, O_USTR] + chunk * OPD[o, O_BSTR]
        if split >= 0:
            off += lo * OPD[o, O_S0 + split]
        return off

    @numba.njit(cache=True, nogil=True)
    def _bases(OPD, o, lines, nl, bases, unit, chunk, lo, split):  # pragma: no cover - compiled
        off = _opd_off(OPD, o, unit, chunk, lo, split)
        s0, s1, s2 = OPD[o, O_S0], OPD[o, O_S0 + 1], OPD[o, O_S0 + 2]
        for l in range(nl):
            bases[l] = off + lines[0, l] * s0 + lines[1, l] * s1 + lines[2, l] * s2

    # ---- GEMM ----------------------------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True)
    def run_gemm(ins, OPD, F, addr, unit, chunk, ii, ff, tt):  # pragma: no cover - compiled
        """C = alpha A B + beta C, row-major C; a task's block of C's rows (split 0) or columns (split 1)."""
        a, b, c = ins[I_A], ins[I_B], ins[I_C]
        M, N, K = ins[I_M], ins[I_N], ins[I_K]
        offa = OPD[a, O_OFF] + unit * OPD[a, O_USTR]
        offb = OPD[b, O_OFF] + unit * OPD[b, O_USTR]
        offc = OPD[c, O_OFF] + unit * OPD[c, O_USTR]
        split = ins[I_SPLIT]
        if split >= 0:
            E, NB = ins[I_EXT], ins[I_NB]
            lo, hi = chunk * E // NB, (chunk + 1) * E // NB
            if split == 0:
                offa += lo * OPD[a, O_S0]
                offc += lo * OPD[c, O_S0]
                M = hi - lo
            else:
                offb += lo * OPD[b, O_S0 + 1]
                offc += lo * OPD[c, O_S0 + 1]
                N = hi - lo
        if M == 0 or N == 0:
            return
        alpha, beta = F[ins[I_ALPHA]], F[ins[I_BETA]]
        for bi in range(ins[I_BATCH]):
            pa = addr[OPD[a, O_ST]] + 4 * (offa + bi * OPD[a, O_S0 + 2])
            pb = addr[OPD[b, O_ST]] + 4 * (offb + bi * OPD[b, O_S0 + 2])
            pc = addr[OPD[c, O_ST]] + 4 * (offc + bi * OPD[c, O_S0 + 2])
            if K == 0:
                if beta == 0:
                    for i in range(M):
                        for j in range(N):
                            p_f32(pc)[i * OPD[c, O_S0] + j] = np.float32(0.0)
                continue
            # A (M x K): row-major (ld = row stride) or transposed (ld = column stride); likewise B; C row-major
            ta, lda = _major(OPD[a, O_S0], OPD[a, O_S0 + 1], M, K)
            tb, ldb = _major(OPD[b, O_S0], OPD[b, O_S0 + 1], K, N)
            ldc = OPD[c, O_S0] if M > 1 else N
            # row-major C = A B is BLAS's column-major C^T = B^T A^T
            ii[0], ii[1], ii[2], ii[3], ii[4], ii[5] = N, M, K, ldb, lda, max(ldc, 1)
            ff[0], ff[1] = alpha, beta
            tt[0] = 78 if tb == 0 else 84
            tt[1] = 78 if ta == 0 else 84
            prev = sgemm.BLAS_LOCAL(1)
            sgemm.SGEMM(tt[0:].ctypes.data, tt[1:].ctypes.data, ii[0:].ctypes.data, ii[1:].ctypes.data,
                        ii[2:].ctypes.data, ff[0:].ctypes.data, pb, ii[3:].ctypes.data, pa, ii[4:].ctypes.data,
                        ff[1:].ctypes.data, pc, ii[5:].ctypes.data)
            sgemm.BLAS_LOCAL(prev)

    @numba.njit(cache=True, nogil=True, inline="always")
    def _major(s0, s1, r, c):  # pragma: no cover - compiled
        """(0, ld) for a row-major (r x c) operand with row stride s0, (1, ld) for a transposed one (column stride
        s1); program.py copies any other layout first."""
        if c == 1 or s1 == 1:
            if r == 1 or s0 >= c:
                return 0, max(s0 if r > 1 else c, 1)
        return 1, max(s1 if c > 1 else r, 1)

    # ---- tasks, lanes, the phase ---------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True)
    def run_task(task, INS, OPD, CODE, CST, F, TASKS, rc, addr, unit, regs32, regs64, lines, bases, ii, ff,
                 tt):  # pragma: no cover - compiled
        chunk = TASKS[task, 3]
        for i in range(TASKS[task, 1], TASKS[task, 2]):
            ins = INS[i]
            if ins[I_KIND] == K_GEMM:
                run_gemm(ins, OPD, F, addr, unit, chunk, ii, ff, tt)
            elif ins[I_REGDT] == 0:
                run_expr(ins, OPD, CODE, CST, F, rc, addr, regs32, lines, bases, unit, chunk)
            else:
                run_expr(ins, OPD, CODE, CST, F, rc, addr, regs64, lines, bases, unit, chunk)

    @numba.njit(cache=True, nogil=True)
    def lane(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs32, regs64):  # pragma: no cover
        """One lane: take tickets until none is left; run each task once every earlier segment is done."""
        P = TASKS.shape[0]
        total = units * P
        lines = np.empty((3, T), np.int64)
        bases = np.empty(2 * T, np.int64)
        ii = np.empty(6, np.int32)
        ff = np.empty(2, np.float32)
        tt = np.empty(2, np.uint8)
        while True:
            t = atomic_add(counters, 0, 1)
            if t >= total:
                break
            unit, r = t // P, t % P
            need = unit * P + SEGSTART[TASKS[r, 0]]
            spins = 0
            while atomic_load(counters, 1) < need:
                spins += 1
                if spins < SPIN:
                    cpu_pause()
                else:
                    sched_yield()
            run_task(r, INS, OPD, CODE, CST, F, TASKS, rc, addr, unit, regs32, regs64, lines, bases, ii, ff, tt)
            atomic_add(counters, 1, 1)

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _lanes(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs32, regs64):  # pragma: no cover
        for k in numba.prange(regs32.shape[0]):
            lane(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs32[k], regs64[k])

    @numba.njit(cache=True, nogil=True)
    def run_phase(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs32, regs64):  # pragma: no cover
        """The phase: `units` repetitions of the program's tasks, over regs32.shape[0] lanes (one: no parallel
        region)."""
        counters[0] = 0
        counters[1] = 0
        if regs32.shape[0] == 1:
            lane(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs32[0], regs64[0])
        else:
            _lanes(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs32, regs64)
