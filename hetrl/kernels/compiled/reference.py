"""The compiler's IR (graph.py) run in numpy, op by op: the specification the VM is checked against.

`run_reference(cv, arrays)` executes the converted ops in graph order on numpy arrays, one per buffer (`arrays[b]`:
a flat array of the buffer's dtype; state buffers are views of the algorithm's own storages, so the reference
updates it as learn would). Expressions are evaluated in float64 over the whole iteration space at once; matrix
products in the operands' dtype. Slow, exact to the IR's meaning: tests/test_compiler.py runs it beside the
algorithm's public learn and beside the VM.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hetrl.kernels.compiled.graph import MM, Adam, Draw, Kern, Ld, Out

try:
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover
    _erf = np.vectorize(math.erf)

UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "recip": lambda x: 1.0 / x, "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "sign": np.sign, "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "trunc": np.trunc, "not": lambda x: (x == 0).astype(np.float64), "sin": np.sin, "cos": np.cos,
    "erf": _erf, "f32": lambda x: x.astype(np.float32).astype(np.float64), "isnan": lambda x: np.isnan(x) * 1.0,
    "atan": np.arctan, "log2": np.log2, "exp2": np.exp2,
}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power, "min": np.minimum,
    "max": np.maximum, "lt": lambda a, b: (a < b) * 1.0, "le": lambda a, b: (a <= b) * 1.0,
    "gt": lambda a, b: (a > b) * 1.0, "ge": lambda a, b: (a >= b) * 1.0, "eq": lambda a, b: (a == b) * 1.0,
    "ne": lambda a, b: (a != b) * 1.0, "and": lambda a, b: ((a != 0) & (b != 0)) * 1.0,
    "or": lambda a, b: ((a != 0) | (b != 0)) * 1.0, "xor": lambda a, b: ((a != 0) ^ (b != 0)) * 1.0,
    "fmod": np.fmod, "rem": lambda a, b: a - np.floor(a / b) * b, "atan2": np.arctan2,
}


def _grid(shape):
    return np.indices(shape, dtype=np.int64) if shape else np.zeros((0,), np.int64)


def _addr(off, strides, grid, index, env):
    a = np.full(tuple(grid.shape[1:]) if len(grid.shape) > 1 else (), off, np.int64)
    for d, s in enumerate(strides):
        if s:
            a = a + grid[d] * s
    for e, s in index:
        a = a + np.rint(ev(e, env)).astype(np.int64) * s
    return a


def ev(e, env):
    """An expression over the iteration space in env ({"grid", "shape", "arrays", "rc", "memo"})."""
    memo = env["memo"]
    k = id(e)
    got = memo.get(k)
    if got is not None and got[0] is e:
        return got[1]
    op = e[0]
    shape = env["shape"]
    if op == "c":
        v = np.full(shape, e[1], np.float64)
    elif op == "rc":
        v = np.full(shape, env["rc"][e[1]], np.float64)
    elif op == "iota":
        v = env["grid"][e[1]].astype(np.float64)
    elif op == "ld":
        ld: Ld = e[1]
        v = env["arrays"][ld.buf][_addr(ld.off, ld.strides, env["grid"], ld.index, env)].astype(np.float64)
    elif op in UNARY:
        with np.errstate(all="ignore"):
            v = UNARY[op](ev(e[1], env))
    elif op in BINARY:
        with np.errstate(all="ignore"):
            v = BINARY[op](ev(e[1], env), ev(e[2], env))
    elif op == "where":
        v = np.where(ev(e[1], env) != 0, ev(e[2], env), ev(e[3], env))
    elif op == "lerp":
        a, b, w = ev(e[1], env), ev(e[2], env), ev(e[3], env)
        v = np.where(np.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))
    else:
        raise ValueError(f"no reference for {op}")
    v = np.broadcast_to(np.asarray(v, np.float64), shape)
    memo[k] = (e, v)
    return v


def _cast(v, dtype):
    if dtype == np.bool_:
        return v != 0
    if np.issubdtype(dtype, np.integer):
        return np.trunc(v).astype(dtype)
    return v.astype(dtype)


def run_kern(op: Kern, arrays, rc):
    shape = tuple(op.shape)
    grid = _grid(shape)
    env = {"grid": grid, "shape": shape, "arrays": arrays, "rc": rc, "memo": {}}
    results = []
    for o in op.outs:
        results.append(ev(o.expr, env))
    for o, v in zip(op.outs, results):
        a = arrays[o.buf]
        addr = _addr(o.off, o.strides, grid, o.index, env)
        if o.mode == "store":
            a[addr.reshape(-1)] = _cast(v.reshape(-1), a.dtype)
        elif o.mode == "add":
            acc = a.astype(np.float64)
            np.add.at(acc, addr.reshape(-1), v.reshape(-1))
            a[:] = _cast(acc, a.dtype)
        elif o.mode in ("sum", "prod", "max", "min"):
            init = {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}[o.mode]
            fn = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[o.mode]
            flat = addr.reshape(-1)
            acc = np.full(a.shape, np.nan)
            acc[flat] = init
            fn.at(acc, flat, v.reshape(-1))
            a[np.unique(flat)] = _cast(acc[np.unique(flat)], a.dtype)
        elif o.mode in ("argmax", "argmin"):
            # the index along o.dim of the first max/min, per reduced group
            vals = v
            pick = np.argmax(vals, axis=o.dim) if o.mode == "argmax" else np.argmin(vals, axis=o.dim)
            sub = [slice(None)] * len(shape)
            sub[o.dim] = 0
            a[addr[tuple(sub)].reshape(-1)] = pick.reshape(-1).astype(a.dtype)
        else:
            raise ValueError(o.mode)


def run_mm(op: MM, arrays):
    def view(tv):
        arr = arrays[tv.buf]
        return np.lib.stride_tricks.as_strided(arr[tv.off:], tv.shape, [s * arr.itemsize for s in tv.strides])
    a, b = view(op.a), view(op.b)
    prod = (a.astype(np.float64) @ b.astype(np.float64)) * op.alpha
    out = view(op.out)
    if op.beta:
        prod = prod + op.beta * out.astype(np.float64)
    idx = np.lib.stride_tricks.as_strided(np.arange(arrays[op.out.buf].size)[op.out.off:], op.out.shape,
                                          [s * 8 for s in op.out.strides])
    arrays[op.out.buf][idx.reshape(-1)] = prod.reshape(-1).astype(arrays[op.out.buf].dtype)


def run_adam(op: Adam, arrays, rc) -> None:
    def span(tv):
        return arrays[tv.buf][tv.off:tv.off + tv.numel]
    p, g, m, v = span(op.p), span(op.g), span(op.m), span(op.v)
    step_size, bc2s, lrwd = arrays[op.sc.buf][op.sc.off:op.sc.off + 3]
    lr, beta1, beta2, wd, eps = rc[op.rc:op.rc + 5]
    gg = g.astype(np.float64)
    if op.maximize:
        gg = -gg
    pp = p.astype(np.float64)
    if wd:
        if op.adamw:
            pp = pp * (1 - lrwd)
        else:
            gg = gg + wd * pp
    w1 = 1 - beta1
    mm = np.where(w1 < 0.5, m + w1 * (gg - m), gg - (gg - m) * (1 - w1))
    vv = beta2 * v + (1 - beta2) * gg * gg
    if op.amsgrad:
        vx = np.maximum(span(op.vmax), vv)
        span(op.vmax)[:] = vx
        vv = vx
    m[:], v[:] = mm, beta2 * v + (1 - beta2) * gg * gg
    p[:] = pp - step_size * mm / (np.sqrt(vv) / bc2s + eps)


def draw(op: Draw, target: torch.Tensor, generator) -> None:
    """The draw made by torch into `target` (a contiguous tensor of the draw's shape), from `generator`."""
    fn, p = op.fn, op.args
    g = {"generator": generator}
    if fn == "normal":
        target.normal_(p[0], p[1], **g)
    elif fn == "uniform":
        target.uniform_(p[0], p[1], **g)
    elif fn == "bernoulli":
        target.bernoulli_(p[0], **g)
    elif fn == "exponential":
        target.exponential_(p[0], **g)
    else:
        raise ValueError(fn)


def run_reference(cv, arrays, rc, generators) -> None:
    """Every op of cv in order on `arrays` (buffer id -> flat numpy array), runtime constants `rc`, draws from
    `generators` (path -> torch.Generator)."""
    for op in cv.ops:
        if isinstance(op, Kern):
            run_kern(op, arrays, rc)
        elif isinstance(op, MM):
            run_mm(op, arrays)
        elif isinstance(op, Adam):
            run_adam(op, arrays, rc)
        elif isinstance(op, Draw):
            t = torch.from_numpy(arrays[op.out.buf][:int(np.prod(op.out.shape))].reshape(op.out.shape))
            draw(op, t, generators.get(op.generator))
        else:
            raise ValueError(op)


__all__ = ["run_reference", "draw", "Out"]
