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
  dims whose output stride is 0. Registers are float64 (float32 data is computed in float64 and rounded where it is
  stored; integers up to 2**53 stay exact). A pass with a generated fused loop (fused.py; its address in I_FN) runs
  through it instead (`run_fused`), with the same bits.
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

T = 1024         # elements per tile (a register)

# instruction kinds
K_EXPR, K_GEMM, K_ADAM = 0, 1, 2
# INS columns
I_KIND, I_REGDT, I_D0, I_SPLIT, I_EXT, I_NB, I_CODE, I_NCODE, I_CONST, I_NCONST, I_NREGS = 0, 1, 2, 6, 7, 8, 9, 10, 11, \
    12, 13
I_OUT, I_NOUT = 14, 15
I_A, I_B, I_C, I_M, I_N, I_K, I_ALPHA, I_BETA, I_BATCH = 9, 10, 11, 12, 13, 14, 15, 16, 17
# ADAM: operands param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq (or -1), the step's scalars (float64 step_size,
# sqrt(bias correction 2), lr * weight_decay), the gradient's scale (a uniform load, or -1); the first runtime
# constant of its group (lr, beta1, beta2, weight_decay, eps); flags; elements
I_P, I_G, I_M1, I_M2, I_VMAX, I_SC, I_SCALE, I_RC, I_FLAGS, I_NUMEL = 9, 10, 11, 12, 13, 14, 15, 16, 17, 3
F_ADAMW, F_AMSGRAD, F_MAXIMIZE, F_SCALE_BACK = 1, 2, 4, 8
I_FN = 18        # EXPR: the address of its generated fused loop (fused.py), or 0 (interpreted)
INS_W = 19
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
 OP_AND, OP_OR, OP_XOR, OP_FMOD, OP_REM, OP_ATAN2, OP_WHERE, OP_LERP) = range(48)
OPCODES = {"copy": OP_COPY, "neg": OP_NEG, "abs": OP_ABS, "exp": OP_EXP, "log": OP_LOG, "log1p": OP_LOG1P,
           "expm1": OP_EXPM1, "sqrt": OP_SQRT, "rsqrt": OP_RSQRT, "recip": OP_RECIP, "tanh": OP_TANH,
           "sigmoid": OP_SIGMOID, "sign": OP_SIGN, "floor": OP_FLOOR, "ceil": OP_CEIL, "round": OP_ROUND,
           "trunc": OP_TRUNC, "not": OP_NOT, "sin": OP_SIN, "cos": OP_COS, "erf": OP_ERF, "f32": OP_F32,
           "isnan": OP_ISNAN, "atan": OP_ATAN, "log2": OP_LOG2, "exp2": OP_EXP2, "add": OP_ADD, "sub": OP_SUB,
           "mul": OP_MUL, "div": OP_DIV, "pow": OP_POW, "min": OP_MIN, "max": OP_MAX, "lt": OP_LT, "le": OP_LE,
           "gt": OP_GT, "ge": OP_GE, "eq": OP_EQ, "ne": OP_NE, "and": OP_AND, "or": OP_OR, "xor": OP_XOR,
           "fmod": OP_FMOD, "rem": OP_REM, "atan2": OP_ATAN2, "where": OP_WHERE, "lerp": OP_LERP}

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

    @intrinsic
    def cycles(typingctx):
        """The CPU's cycle counter (a phase's own profile: time per instruction, `Derived.profile`)."""
        sig = types.int64()

        def codegen(context, builder, signature, args):
            fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=_ir.FunctionType(_ir.IntType(64), []))
            return builder.call(fn, [])
        return sig, codegen

    @intrinsic
    def call_kernel(typingctx, fn, nn, P, S, C):
        """Call the generated fused loop at address fn (fused.py) on one tile: void(nn, operands, strides, consts)."""
        sig = types.void(types.int64, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            fnty = _ir.FunctionType(_ir.VoidType(), [_ir.IntType(64)] * 4)
            builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
            return context.get_dummy_value()
        return sig, codegen

    _libc = ctypes.CDLL(None)
    _llvm.add_symbol("hetrl_vm_sched_yield", ctypes.cast(_libc.sched_yield, ctypes.c_void_p).value)
    sched_yield = types.ExternalFunction("hetrl_vm_sched_yield", types.int32())

    @intrinsic
    def _bits(typingctx, x):
        """The bits of a float64 as an int64 (a bitcast: vectorises)."""
        sig = types.int64(types.float64)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], _ir.IntType(64))
        return sig, codegen

    @intrinsic
    def _from_bits(typingctx, i):
        sig = types.float64(types.int64)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], _ir.DoubleType())
        return sig, codegen

    # ---- vectorisable float64 math (libm's scalar calls kept a register op from vectorising: 10-20 ns an element) ---
    LN2_HI, LN2_LO, LOG2E = 6.93147180369123816490e-01, 1.90821492927058770002e-10, 1.4426950408889634
    SQRT2 = 1.4142135623730951
    MAGIC = 6755399441055744.0           # 2^52 + 2^51: an integer-valued double added to it lies in its low bits
    MAGIC_BITS = 4843621399236968448     # its bits

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _exp(x):  # pragma: no cover - compiled
        """exp(x) for a float64: x = k ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor series to r^13 (relative error
        ~1e-16), times 2^k made from its bits; below -708 it is 0's neighbour, above 709 inf."""
        xc = min(max(x, -708.0), 709.0)
        kb = xc * LOG2E + MAGIC            # k = round(x / ln 2) in the low bits of kb (AVX2 has no packed
        k = kb - MAGIC                     # float64 <-> int64 conversion: these bit tricks vectorise)
        r = (xc - k * LN2_HI) - k * LN2_LO
        p = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720 + r * (
            1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880 + r * (1.0 / 3628800 + r * (1.0 / 39916800 + r * (
                1.0 / 479001600 + r / 6227020800.0))))))))))))
        v = p * _from_bits((_bits(kb) - MAGIC_BITS + 1023) << 52)
        if x > 709.0:
            v = np.inf
        if x != x:
            v = x
        return v

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _log(x):  # pragma: no cover - compiled
        """log(x) for a float64: x = 2^e m with m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh((m - 1) / (m + 1)) by its
        series to s^21; subnormals scaled first; log(0) = -inf, log of a negative or NaN is NaN."""
        small = x < 2.2250738585072014e-308
        xs = x * 18014398509481984.0 if small else x   # 2^54
        b = _bits(xs)
        e = ((b >> 52) & 2047) - 1023
        m = _from_bits((b & 4503599627370495) | 4607182418800017408)
        big = m > SQRT2
        m = m * 0.5 if big else m
        e = e + 1 if big else e
        sm = (m - 1.0) / (m + 1.0)
        s2 = sm * sm
        q = 1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (1.0 / 11 + s2 * (1.0 / 13 + s2 * (
            1.0 / 15 + s2 * (1.0 / 17 + s2 * (1.0 / 19 + s2 / 21.0)))))))))
        ef = _from_bits(e + MAGIC_BITS) - MAGIC
        v = 2.0 * sm * q + (ef - (54.0 if small else 0.0)) * 0.6931471805599453
        if x == 0.0:
            v = -np.inf
        if x < 0.0 or x != x:
            v = np.nan
        if x == np.inf:
            v = np.inf
        return v

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _log1p(x):  # pragma: no cover - compiled
        """log(1 + x), accurate for small x: log(u) x / (u - 1) with u = 1 + x (Goldberg's)."""
        u = 1.0 + x
        d = u - 1.0
        return x if d == 0.0 else _log(u) * (x / d)

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _expm1(x):  # pragma: no cover - compiled
        """exp(x) - 1: its Taylor series to x^16 for |x| <= 1/2 (relative error ~1e-16), exp(x) - 1 beyond (where
        that loses nothing); selects, not branches, so that the loop vectorises."""
        p = x * (1.0 + x * (1.0 / 2 + x * (1.0 / 6 + x * (1.0 / 24 + x * (1.0 / 120 + x * (1.0 / 720 + x * (
            1.0 / 5040 + x * (1.0 / 40320 + x * (1.0 / 362880 + x * (1.0 / 3628800 + x * (1.0 / 39916800 + x * (
                1.0 / 479001600 + x * (1.0 / 6227020800 + x * (1.0 / 87178291200 + x * (
                    1.0 / 1307674368000 + x / 20922789888000.0)))))))))))))))
        return p if abs(x) <= 0.5 else _exp(x) - 1.0

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _tanh(x):  # pragma: no cover - compiled
        """tanh(x) = -expm1(-2|x|) / (2 + expm1(-2|x|)), signed: accurate near 0 and exactly +-1 from |x| > 19."""
        a = min(abs(x), 20.0)
        e = _expm1(-2.0 * a)
        t = -e / (2.0 + e)
        return t if x >= 0 else -t

    @numba.njit(cache=True, nogil=True, error_model="numpy")
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

    @numba.njit(cache=True, nogil=True, error_model="numpy")
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
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _load(reg, addr, dt, bases, nl, ni, i0, s3):  # pragma: no cover - compiled
        """reg[l * ni + j] = mem[bases[l] + (i0 + j) * s3] for the tile's nl lines of ni elements (typed loops per
        dtype and stride, so that the contiguous float32 case vectorises)."""
        if dt == DT_F32:
            src = p_f32(addr)
            for l in range(nl):
                b = bases[l] + i0 * s3
                r = reg[l * ni:(l + 1) * ni]
                if s3 == 1:
                    sv = numba.carray(p_f32(addr + 4 * b), (ni,))
                    for j in range(ni):
                        r[j] = sv[j]
                elif s3 == 0:
                    v = src[b]
                    for j in range(ni):
                        r[j] = v
                else:
                    for j in range(ni):
                        r[j] = src[b + j * s3]
            return
        if dt == DT_BOOL or dt == DT_U8:
            for l in range(nl):
                b = bases[l] + i0 * s3
                r = reg[l * ni:(l + 1) * ni]
                if s3 == 1:
                    sv = numba.carray(p_u8(addr + b), (ni,))
                    for j in range(ni):
                        r[j] = sv[j]
                else:
                    src8 = p_u8(addr)
                    for j in range(ni):
                        r[j] = src8[b + j * s3]
            return
        if dt == DT_F64:
            src64 = p_f64(addr)
            for l in range(nl):
                b = bases[l] + i0 * s3
                for j in range(ni):
                    reg[l * ni + j] = src64[b + j * s3]
            return
        if dt == DT_I64:
            srci = p_i64(addr)
            for l in range(nl):
                b = bases[l] + i0 * s3
                for j in range(ni):
                    reg[l * ni + j] = srci[b + j * s3]
            return
        for l in range(nl):
            b = bases[l] + i0 * s3
            for j in range(ni):
                reg[l * ni + j] = _mem_get(addr, dt, b + j * s3)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
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

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _iota(reg, lines, nl, ni, i0, opd_row, start):  # pragma: no cover - compiled
        """reg = sum_d index_d * s_d (the iteration index as a value: arange, one_hot); `start`: the task's block's
        first index along the split dim times its s_d (a block's lines count from its own start)."""
        s0, s1, s2, s3 = opd_row[O_S0], opd_row[O_S0 + 1], opd_row[O_S0 + 2], opd_row[O_S0 + 3]
        for l in range(nl):
            b = lines[0, l] * s0 + lines[1, l] * s1 + lines[2, l] * s2 + opd_row[O_OFF] + start
            for j in range(ni):
                reg[l * ni + j] = b + (i0 + j) * s3

    # ---- register ops ------------------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True, error_model="numpy")
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
                z[t] = _exp(x[t])
        elif op == OP_LOG:
            for t in range(n):
                z[t] = _log(x[t])
        elif op == OP_LOG1P:
            for t in range(n):
                z[t] = _log1p(x[t])
        elif op == OP_EXPM1:
            for t in range(n):
                z[t] = _expm1(x[t])
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
                z[t] = _tanh(x[t])
        elif op == OP_SIGMOID:
            for t in range(n):
                z[t] = 1.0 / (1.0 + _exp(-x[t]))
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
                z[t] = _log(x[t]) * 1.4426950408889634
        elif op == OP_EXP2:
            for t in range(n):
                z[t] = _exp(x[t] * 0.6931471805599453)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _erf(x):  # pragma: no cover - compiled
        return math.erf(x)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
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

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _where(z, c, x, y, n):  # pragma: no cover - compiled
        for t in range(n):
            z[t] = x[t] if c[t] != 0 else y[t]

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _lerp(z, a, b, w, n):  # pragma: no cover - compiled
        """torch's lerp: a + w (b - a) for |w| < 0.5, b - (b - a)(1 - w) from 0.5 on (exact at w = 1)."""
        for t in range(n):
            d = b[t] - a[t]
            z[t] = a[t] + w[t] * d if abs(w[t]) < 0.5 else b[t] - d * (1.0 - w[t])

    # ---- Adam over a span of a flat buffer (torch's fused CPU kernel's formulas, in float32) ---------------------
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _adam_span(p, g, m, v, vmax, lo, hi, step_size, bc2s, lrwd, beta1, beta2, wd, eps, scale,
                   flags):  # pragma: no cover - compiled
        w1 = np.float32(1.0 - beta1)
        b2, ib2 = np.float32(beta2), np.float32(1.0 - beta2)
        ss, bc, e = np.float32(step_size), np.float32(bc2s), np.float32(eps)
        sc, wdf, lw = np.float32(scale), np.float32(wd), np.float32(1.0 - lrwd)
        pp, gg, mm, vv = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
        plain = flags & (F_ADAMW | F_AMSGRAD | F_MAXIMIZE) == 0 and wd == 0.0
        if plain and w1 < 0.5:   # the common case in one vectorised loop
            if flags & F_SCALE_BACK:
                for i in range(pp.shape[0]):
                    gi = gg[i] * sc
                    gg[i] = gi
                    mi = mm[i] + w1 * (gi - mm[i])
                    vi = b2 * vv[i] + ib2 * gi * gi
                    mm[i] = mi
                    vv[i] = vi
                    pp[i] -= ss * mi / (np.sqrt(vi) / bc + e)
            else:
                for i in range(pp.shape[0]):
                    gi = gg[i]
                    mi = mm[i] + w1 * (gi - mm[i])
                    vi = b2 * vv[i] + ib2 * gi * gi
                    mm[i] = mi
                    vv[i] = vi
                    pp[i] -= ss * mi / (np.sqrt(vi) / bc + e)
            return
        for i in range(pp.shape[0]):
            gi = gg[i] * sc
            if flags & F_SCALE_BACK:
                gg[i] = gi
            if flags & F_MAXIMIZE:
                gi = -gi
            if wd != 0.0:
                if flags & F_ADAMW:
                    pp[i] *= lw
                else:
                    gi += wdf * pp[i]
            d = gi - mm[i]
            mi = mm[i] + w1 * d if w1 < 0.5 else gi - d * (np.float32(1.0) - w1)
            vi = b2 * vv[i] + ib2 * gi * gi
            mm[i] = mi
            vv[i] = vi
            if flags & F_AMSGRAD:
                vx = max(vmax[lo + i], vi)
                vmax[lo + i] = vx
                vi = vx
            pp[i] -= ss * mi / (np.sqrt(vi) / bc + e)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def run_adam(ins, OPD, rc, addr, unit, chunk):  # pragma: no cover - compiled
        n = ins[I_NUMEL]
        lo, hi = np.int64(0), n
        if ins[I_SPLIT] >= 0:
            NB = ins[I_NB]
            lo, hi = chunk * n // NB, (chunk + 1) * n // NB
        def arr(o):
            return numba.carray(p_f32(addr[OPD[o, O_ST]] + 4 * OPD[o, O_OFF]), (n,))
        p, g, m, v = arr(ins[I_P]), arr(ins[I_G]), arr(ins[I_M1]), arr(ins[I_M2])
        vmax = arr(ins[I_VMAX]) if ins[I_VMAX] >= 0 else m
        so = ins[I_SC]
        sc = numba.carray(p_f64(addr[OPD[so, O_ST]] + 8 * OPD[so, O_OFF]), (3,))
        scale = 1.0
        if ins[I_SCALE] >= 0:
            so2 = ins[I_SCALE]
            scale = _mem_get(addr[OPD[so2, O_ST]], OPD[so2, O_DT], OPD[so2, O_OFF])
        r = ins[I_RC]
        _adam_span(p, g, m, v, vmax, lo, hi, sc[0], sc[1], sc[2], rc[r + 1], rc[r + 2], rc[r + 3], rc[r + 4], scale,
                   ins[I_FLAGS])

    # ---- outputs -------------------------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _store(reg, addr, dt, bases, nl, ni, i0, s3, mode, regs, nidx, ireg0, istr0, ireg1, istr1):  # pragma: no cover
        """Store, accumulate or scatter reg into memory (see M_*: reductions are _reduce's)."""
        if dt == DT_F32 and nidx == 0 and mode == M_STORE:
            dst = p_f32(addr)
            for l in range(nl):
                b = bases[l] + i0 * s3
                r = reg[l * ni:(l + 1) * ni]
                if s3 == 1:
                    d = numba.carray(p_f32(addr + 4 * b), (ni,))
                    for j in range(ni):
                        d[j] = np.float32(r[j])
                else:
                    for j in range(ni):
                        dst[b + j * s3] = np.float32(r[j])
            return
        if dt == DT_BOOL and nidx == 0 and mode == M_STORE:
            for l in range(nl):
                b = bases[l] + i0 * s3
                r = reg[l * ni:(l + 1) * ni]
                d8 = p_u8(addr)
                for j in range(ni):
                    d8[b + j * s3] = np.uint8(1) if r[j] != 0 else np.uint8(0)
            return
        if dt == DT_F64 and nidx == 0 and mode == M_STORE and s3 == 1:
            for l in range(nl):
                d = numba.carray(p_f64(addr + 8 * (bases[l] + i0)), (ni,))
                r = reg[l * ni:(l + 1) * ni]
                for j in range(ni):
                    d[j] = r[j]
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

    @numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
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
            elif dt == DT_F32 and mode == M_SUM and s3 == 1:
                dst = numba.carray(p_f32(addr + 4 * b), (ni,))
                for j in range(ni):
                    dst[j] += np.float32(r[j])
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

    @numba.njit(cache=True, nogil=True, error_model="numpy")
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

    @numba.njit(cache=True, nogil=True, error_model="numpy")
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

    # ---- the leaves as C functions, called by symbol (each compiled and cached once; see _expr_c below) -----------
    IP = types.intp
    F64 = types.float64

    def _c(name, sig):
        def deco(f):
            import os, time as _t
            t0 = _t.time()
            c = numba.cfunc(sig, cache=True, nopython=True, error_model="numpy")(f)
            if os.environ.get("HETRL_VM_TIMES"):
                print(name, round(_t.time() - t0, 1))
            _llvm.add_symbol(name, c.address)
            return types.ExternalFunction(name, sig)
        return deco

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _v(p, n):  # pragma: no cover - compiled
        """A float64 register (or scratch) vector from its address."""
        return numba.carray(p_f64(p), (n,))

    @_c("hetrl_vm_load", types.void(IP, IP, IP, IP, IP, IP, IP, IP))
    def c_load(reg, addr, dt, bases, nl, ni, i0, s3):  # pragma: no cover - compiled
        _load(_v(reg, T), addr, dt, numba.carray(p_i64(bases), (2 * T,)), nl, ni, i0, s3)

    @_c("hetrl_vm_gather", types.void(*([IP] * 15)))
    def c_gather(reg, addr, dt, bases, nl, ni, i0, s3, regs, nregs, nidx, ireg0, istr0, ireg1, istr1):  # pragma: no cover
        _gather(_v(reg, T), addr, dt, numba.carray(p_i64(bases), (2 * T,)), nl, ni, i0, s3,
                numba.carray(p_f64(regs), (nregs, T)), nidx, ireg0, istr0, ireg1, istr1)

    @_c("hetrl_vm_iota", types.void(*([IP] * 7)))
    def c_iota(reg, lines, nl, ni, i0, row, start):  # pragma: no cover - compiled
        _iota(_v(reg, T), numba.carray(p_i64(lines), (3, T)), nl, ni, i0, numba.carray(p_i64(row), (OPD_W,)), start)

    @_c("hetrl_vm_unary", types.void(IP, IP, IP, IP))
    def c_unary(op, z, x, n):  # pragma: no cover - compiled
        _unary(op, _v(z, T), _v(x, T), n)

    @_c("hetrl_vm_binary", types.void(IP, IP, IP, IP, IP))
    def c_binary(op, z, x, y, n):  # pragma: no cover - compiled
        _binary(op, _v(z, T), _v(x, T), _v(y, T), n)

    @_c("hetrl_vm_where", types.void(IP, IP, IP, IP, IP))
    def c_where(z, c, x, y, n):  # pragma: no cover - compiled
        _where(_v(z, T), _v(c, T), _v(x, T), _v(y, T), n)

    @_c("hetrl_vm_lerp", types.void(IP, IP, IP, IP, IP))
    def c_lerp(z, a, b, w, n):  # pragma: no cover - compiled
        _lerp(_v(z, T), _v(a, T), _v(b, T), _v(w, T), n)

    @_c("hetrl_vm_store", types.void(*([IP] * 16)))
    def c_store(reg, addr, dt, bases, nl, ni, i0, s3, mode, regs, nregs, nidx, ireg0, istr0, ireg1,
                istr1):  # pragma: no cover - compiled
        _store(_v(reg, T), addr, dt, numba.carray(p_i64(bases), (2 * T,)), nl, ni, i0, s3, mode,
               numba.carray(p_f64(regs), (nregs, T)), nidx, ireg0, istr0, ireg1, istr1)

    @_c("hetrl_vm_reduce", types.void(*([IP] * 9)))
    def c_reduce(reg, addr, dt, bases, nl, ni, i0, s3, mode):  # pragma: no cover - compiled
        _reduce(_v(reg, T), addr, dt, numba.carray(p_i64(bases), (2 * T,)), nl, ni, i0, s3, mode)

    @_c("hetrl_vm_argreduce", types.void(*([IP] * 15)))
    def c_argreduce(reg, addr, dt, bases, vaddr, vdt, vbases, nl, ni, i0, s3, vs3, lines, argdim,
                    mode):  # pragma: no cover - compiled
        _argreduce(_v(reg, T), addr, dt, numba.carray(p_i64(bases), (2 * T,)), vaddr, vdt,
                   numba.carray(p_i64(vbases), (T,)), nl, ni, i0, s3, vs3, numba.carray(p_i64(lines), (3, T)),
                   argdim, mode)

    @_c("hetrl_vm_init", types.void(IP, IP, IP, IP, IP, F64))
    def c_init(addr, dt, off, d, st, value):  # pragma: no cover - compiled
        _init_region(addr, dt, off, numba.carray(p_i64(d), (4,)), numba.carray(p_i64(st), (4,)), value)

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _block(ins, chunk, d):  # pragma: no cover - compiled
        """d = a pass's dims for this task (its block of the split dim); the block's first index along that dim."""
        for k in range(4):
            d[k] = ins[I_D0 + k]
        lo = np.int64(0)
        split = ins[I_SPLIT]
        if split >= 0:
            E, NB = ins[I_EXT], ins[I_NB]
            lo = chunk * E // NB
            d[split] = (chunk + 1) * E // NB - lo
        return lo

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _init_outputs(ins, OPD, addr, unit, chunk, lo, split, d, st):  # pragma: no cover - compiled
        """A pass's reductions start from their identity over this unit's and block's region."""
        nout = ins[I_NOUT]
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
                    for k in range(4):
                        st[k] = OPD[pv, O_S0 + k]
                    c_init(addr[OPD[pv, O_ST]], OPD[pv, O_DT], _opd_off(OPD, pv, unit, chunk, lo, split),
                           d.ctypes.data, st.ctypes.data, init)
                    init = 0.0
                for k in range(4):
                    st[k] = OPD[o, O_S0 + k]
                c_init(addr[OPD[o, O_ST]], OPD[o, O_DT], off, d.ctypes.data, st.ctypes.data, init)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _const(CST, c, F, rc, addr, OPD, unit, chunk, lo, split):  # pragma: no cover - compiled
        kind, idx = CST[c, 1], CST[c, 2]
        if kind == C_LIT:
            return F[idx]
        if kind == C_RC:
            return rc[idx]
        return _mem_get(addr[OPD[idx, O_ST]], OPD[idx, O_DT], _opd_off(OPD, idx, unit, chunk, lo, split))

    # ---- one EXPR instruction on a block ---------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def run_expr(ins, OPD, CODE, CST, F, rc, addr, regs, lines, bases, unit, chunk):  # pragma: no cover - compiled
        d = np.empty(4, np.int64)
        lo = _block(ins, chunk, d)
        split = ins[I_SPLIT]
        if d.min() == 0:
            return
        nout = ins[I_NOUT]
        nregs = regs.shape[0]
        rp = regs.ctypes.data
        lp = lines.ctypes.data
        bp = bases.ctypes.data
        st = np.empty(4, np.int64)
        _init_outputs(ins, OPD, addr, unit, chunk, lo, split, d, st)
        # constants into their registers (whole tiles, once)
        for c in range(ins[I_CONST], ins[I_CONST] + ins[I_NCONST]):
            v = _const(CST, c, F, rc, addr, OPD, unit, chunk, lo, split)
            for t in range(T):
                regs[CST[c, 0], t] = v
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
                    zp = rp + dst * (T * 8)
                    if op == OP_LOAD:
                        o = CODE[k, 2]
                        dt = OPD[o, O_DT]
                        if dt == DT_IOTA:
                            c_iota(zp, lp, nl, nn, i0, OPD[o:].ctypes.data,
                                   lo * OPD[o, O_S0 + split] if split >= 0 else 0)
                            continue
                        _bases(OPD, o, lines, nl, bases, unit, chunk, lo, split)
                        if OPD[o, O_NIDX] == 0:
                            c_load(zp, addr[OPD[o, O_ST]], dt, bp, nl, nn, i0, OPD[o, O_S0 + 3])
                        else:
                            c_gather(zp, addr[OPD[o, O_ST]], dt, bp, nl, nn, i0, OPD[o, O_S0 + 3], rp, nregs,
                                     OPD[o, O_NIDX], OPD[o, O_IREG], OPD[o, O_ISTR], OPD[o, O_IREG + 1],
                                     OPD[o, O_ISTR + 1])
                    elif op == OP_WHERE:
                        c_where(zp, rp + CODE[k, 2] * (T * 8), rp + CODE[k, 3] * (T * 8), rp + CODE[k, 4] * (T * 8),
                                n)
                    elif op == OP_LERP:
                        c_lerp(zp, rp + CODE[k, 2] * (T * 8), rp + CODE[k, 3] * (T * 8), rp + CODE[k, 4] * (T * 8),
                               n)
                    elif op >= OP_ADD:   # (OP_WHERE and OP_LERP, the ternaries, are above)
                        c_binary(op, zp, rp + CODE[k, 2] * (T * 8), rp + CODE[k, 3] * (T * 8), n)
                    else:
                        c_unary(op, zp, rp + CODE[k, 2] * (T * 8), n)
                for o in range(ins[I_OUT], ins[I_OUT] + nout):
                    mode = OPD[o, O_MODE]
                    if mode == M_ARGVAL:
                        continue
                    _bases(OPD, o, lines, nl, bases, unit, chunk, lo, split)
                    a = addr[OPD[o, O_ST]]
                    r = rp + OPD[o, O_REG] * (T * 8)
                    if mode <= M_ADD:
                        c_store(r, a, OPD[o, O_DT], bp, nl, nn, i0, OPD[o, O_S0 + 3], mode, rp, nregs, OPD[o, O_NIDX],
                                OPD[o, O_IREG], OPD[o, O_ISTR], OPD[o, O_IREG + 1], OPD[o, O_ISTR + 1])
                    elif mode == M_ARGMAX or mode == M_ARGMIN:
                        pv = OPD[o, O_PAIR]
                        vb = bases[T:]
                        _bases(OPD, pv, lines, nl, vb, unit, chunk, lo, split)
                        c_argreduce(r, a, OPD[o, O_DT], bp, addr[OPD[pv, O_ST]], OPD[pv, O_DT], vb.ctypes.data, nl,
                                    nn, i0, OPD[o, O_S0 + 3], OPD[pv, O_S0 + 3], lp, OPD[o, O_ARGDIM], mode)
                    else:
                        c_reduce(r, a, OPD[o, O_DT], bp, nl, nn, i0, OPD[o, O_S0 + 3], mode)

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _opd_off(OPD, o, unit, chunk, lo, split):  # pragma: no cover - compiled
        """An operand's offset for this unit and block: its own, the unit's, the block's partial slot, and the start
        of the block's rows along the split dim."""
        off = OPD[o, O_OFF] + unit * OPD[o, O_USTR] + chunk * OPD[o, O_BSTR]
        if split >= 0:
            off += lo * OPD[o, O_S0 + split]
        return off

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _bases(OPD, o, lines, nl, bases, unit, chunk, lo, split):  # pragma: no cover - compiled
        off = _opd_off(OPD, o, unit, chunk, lo, split)
        s0, s1, s2 = OPD[o, O_S0], OPD[o, O_S0 + 1], OPD[o, O_S0 + 2]
        for l in range(nl):
            bases[l] = off + lines[0, l] * s0 + lines[1, l] * s1 + lines[2, l] * s2

    # ---- GEMM ----------------------------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True, error_model="numpy")
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
            sgemm.call(M, N, tt, ii, ff, pa, pb, pc)

    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _major(s0, s1, r, c):  # pragma: no cover - compiled
        """(0, ld) for a row-major (r x c) operand with row stride s0, (1, ld) for a transposed one (column stride
        s1); program.py copies any other layout first."""
        if c == 1 or s1 == 1:
            if r == 1 or s0 >= c:
                return 0, max(s0 if r > 1 else c, 1)
        return 1, max(s1 if c > 1 else r, 1)

    # ---- one EXPR as a C function: compiled and cached once, called by symbol -----------------------------------------
    # (numba links a callee's code into every caller and optimises it again there: run_expr called directly from the
    # lanes' loop was compiled four more times, minutes on a busy 2-core machine)
    _EXPR_SIG = types.void(*([types.intp] * 17))

    @numba.cfunc(_EXPR_SIG, cache=True, nopython=True, error_model="numpy")
    def _expr_c(ins_p, opd_p, nopd, code_p, ncode, cst_p, ncst, f_p, nf, rc_p, nrc, addr_p, naddr, regs_p, nregs,
                unit, chunk):  # pragma: no cover - compiled
        ins = numba.carray(p_i64(ins_p), (INS_W,))
        OPD = numba.carray(p_i64(opd_p), (nopd, OPD_W))
        CODE = numba.carray(p_i64(code_p), (ncode, 5))
        CST = numba.carray(p_i64(cst_p), (ncst, 3))
        F = numba.carray(p_f64(f_p), (nf,))
        rc = numba.carray(p_f64(rc_p), (nrc,))
        addr = numba.carray(p_i64(addr_p), (naddr,))
        regs = numba.carray(p_f64(regs_p), (nregs, T))
        lines = np.empty((3, T), np.int64)
        bases = np.empty(2 * T, np.int64)
        run_expr(ins, OPD, CODE, CST, F, rc, addr, regs, lines, bases, unit, chunk)

    _llvm.add_symbol("hetrl_vm_expr", _expr_c.address)
    EXPR = types.ExternalFunction("hetrl_vm_expr", _EXPR_SIG)

    # ---- one EXPR through its generated fused loop (fused.py) --------------------------------------------------------
    @numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _itemsize(dt):  # pragma: no cover - compiled
        if dt == DT_F64 or dt == DT_I64:
            return 8
        if dt == DT_F32 or dt == DT_I32:
            return 4
        if dt == DT_I16:
            return 2
        return 1

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def run_fused(ins, OPD, CODE, CST, F, rc, addr, regs, unit, chunk):  # pragma: no cover - compiled
        """The pass as run_expr computes it, through its fused loop: this walks the lines and the tiles of T elements
        (as run_expr does), makes each operand's address, and hands the inner reductions' tiles to _reduce."""
        d = np.empty(4, np.int64)
        lo = _block(ins, chunk, d)
        split = ins[I_SPLIT]
        if d.min() == 0:
            return
        st = np.empty(4, np.int64)
        _init_outputs(ins, OPD, addr, unit, chunk, lo, split, d, st)
        nregs = regs.shape[0]
        cv = np.zeros(nregs, np.float64)
        for c in range(ins[I_CONST], ins[I_CONST] + ins[I_NCONST]):
            cv[CST[c, 0]] = _const(CST, c, F, rc, addr, OPD, unit, chunk, lo, split)
        # the operands: the loads in code order, then the outputs
        c0, c1 = ins[I_CODE], ins[I_CODE] + ins[I_NCODE]
        nq = ins[I_NOUT]
        for k in range(c0, c1):
            if CODE[k, 0] == OP_LOAD:
                nq += 1
        opd = np.empty(nq, np.int64)
        q = 0
        for k in range(c0, c1):
            if CODE[k, 0] == OP_LOAD:
                opd[q] = CODE[k, 2]
                q += 1
        for o in range(ins[I_OUT], ins[I_OUT] + ins[I_NOUT]):
            opd[q] = o
            q += 1
        base = np.empty(nq, np.int64)     # the operand's address
        off = np.empty(nq, np.int64)      # its offset (elements) for this unit and block
        size = np.empty(nq, np.int64)
        tile = np.zeros(nq, np.int64)     # an inner reduction's output: its tile buffer (its register)
        ptr = np.empty(nq, np.int64)
        strd = np.empty(nq, np.int64)
        for q in range(nq):
            o = opd[q]
            base[q] = addr[OPD[o, O_ST]]
            off[q] = _opd_off(OPD, o, unit, chunk, lo, split)
            size[q] = _itemsize(OPD[o, O_DT])
            strd[q] = OPD[o, O_S0 + 3]
            if q >= nq - ins[I_NOUT] and OPD[o, O_MODE] >= M_SUM and OPD[o, O_S0 + 3] == 0:
                tile[q] = regs[OPD[o, O_REG]:].ctypes.data
        bb = np.zeros(2, np.int64)
        fn = ins[I_FN]
        inner = d[3]
        ni = inner if inner < T else T
        for i0 in range(d[0]):
            for i1 in range(d[1]):
                for i2 in range(d[2]):
                    for j0 in range(0, inner, ni):
                        nn = min(ni, inner - j0)
                        for q in range(nq):
                            o = opd[q]
                            e = off[q] + i0 * OPD[o, O_S0] + i1 * OPD[o, O_S0 + 1] + i2 * OPD[o, O_S0 + 2]
                            ptr[q] = tile[q] if tile[q] != 0 else base[q] + size[q] * (e + j0 * strd[q])
                        call_kernel(fn, nn, ptr.ctypes.data, strd.ctypes.data, cv.ctypes.data)
                        for q in range(nq):
                            if tile[q] != 0:
                                o = opd[q]
                                bb[0] = off[q] + i0 * OPD[o, O_S0] + i1 * OPD[o, O_S0 + 1] + i2 * OPD[o, O_S0 + 2]
                                c_reduce(tile[q], base[q], OPD[o, O_DT], bb.ctypes.data, 1, nn, j0, 0, OPD[o, O_MODE])

    @numba.cfunc(_EXPR_SIG, cache=True, nopython=True, error_model="numpy")
    def _fused_c(ins_p, opd_p, nopd, code_p, ncode, cst_p, ncst, f_p, nf, rc_p, nrc, addr_p, naddr, regs_p, nregs,
                 unit, chunk):  # pragma: no cover - compiled
        run_fused(numba.carray(p_i64(ins_p), (INS_W,)), numba.carray(p_i64(opd_p), (nopd, OPD_W)),
                  numba.carray(p_i64(code_p), (ncode, 5)), numba.carray(p_i64(cst_p), (ncst, 3)),
                  numba.carray(p_f64(f_p), (nf,)), numba.carray(p_f64(rc_p), (nrc,)),
                  numba.carray(p_i64(addr_p), (naddr,)), numba.carray(p_f64(regs_p), (nregs, T)), unit, chunk)

    _llvm.add_symbol("hetrl_vm_fused", _fused_c.address)
    FUSED = types.ExternalFunction("hetrl_vm_fused", _EXPR_SIG)

    @numba.njit(cache=True, parallel=True)
    def touch(x):  # pragma: no cover - compiled
        """A parallel region (the first one in a process makes numba start its threading layer)."""
        for i in numba.prange(x.shape[0]):
            x[i] += 1.0

    # ---- tasks, lanes, the phase -----------------------------------------------------------------------------------------
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def lane(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs, prof):  # pragma: no cover
        """One lane: take tickets until none is left; run each task once every earlier segment is done. With a
        profile array (one slot per instruction, and one for waiting), the cycles spent in each."""
        P = TASKS.shape[0]
        profiling = prof.shape[0] > 0
        total = units * P
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
            w0 = cycles() if profiling else 0
            while atomic_load(counters, 1) < need:
                spins += 1
                if spins < SPIN:
                    cpu_pause()
                else:
                    sched_yield()
            if profiling:
                prof[INS.shape[0]] += cycles() - w0
            chunk = TASKS[r, 3]
            for i in range(TASKS[r, 1], TASKS[r, 2]):
                c0 = cycles() if profiling else 0
                kind = INS[i, I_KIND]
                if kind == K_GEMM:
                    run_gemm(INS[i], OPD, F, addr, unit, chunk, ii, ff, tt)
                elif kind == K_ADAM:
                    run_adam(INS[i], OPD, rc, addr, unit, chunk)
                elif INS[i, I_FN] != 0:
                    FUSED(INS[i:].ctypes.data, OPD.ctypes.data, OPD.shape[0], CODE.ctypes.data, CODE.shape[0],
                          CST.ctypes.data, CST.shape[0], F.ctypes.data, F.shape[0], rc.ctypes.data, rc.shape[0],
                          addr.ctypes.data, addr.shape[0], regs.ctypes.data, regs.shape[0], unit, chunk)
                else:
                    EXPR(INS[i:].ctypes.data, OPD.ctypes.data, OPD.shape[0], CODE.ctypes.data, CODE.shape[0],
                         CST.ctypes.data, CST.shape[0], F.ctypes.data, F.shape[0], rc.ctypes.data, rc.shape[0],
                         addr.ctypes.data, addr.shape[0], regs.ctypes.data, regs.shape[0], unit, chunk)
                if profiling:
                    prof[i] += cycles() - c0
            atomic_add(counters, 1, 1)

    @numba.njit(cache=True, nogil=True, parallel=True, error_model="numpy")
    def _lanes(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs, prof):  # pragma: no cover
        for k in numba.prange(regs.shape[0]):
            lane(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs[k], prof[k])

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def run_phase(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs, prof):  # pragma: no cover
        """The phase: `units` repetitions of the program's tasks, over regs.shape[0] lanes (one: no parallel
        region). The tables must be C-contiguous (their rows are read through pointers). prof: (lanes, instructions
        + 1) cycles, or (lanes, 0) not to profile."""
        counters[0] = 0
        counters[1] = 0
        if regs.shape[0] == 1:
            lane(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs[0], prof[0])
        else:
            _lanes(INS, OPD, CODE, CST, F, TASKS, SEGSTART, rc, addr, units, counters, regs, prof)
