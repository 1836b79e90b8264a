"""The traced aten graph as the compiler's own small IR: buffers, views of them, and three kinds of operations.

Every tensor of the graph is a view `TV(buf, off, shape, strides, dtype)` of a `Buf`: a storage of the algorithm
(its path), an input of the unit (a batch field or the weights), a random draw made before the phase, a literal, or a
temporary the program plans. View operations (view, permute, select, slice, expand, split, detach, ...) make no
operation: their output is the same buffer at the offset and strides the trace recorded. Uniform tensors
(zeros_like, full, scalar_tensor, ...) are constants (`Const`) folded into the expressions that read them, but for
one that an in-place op later writes into (a scatter_add_ into zeros_like): that one is a temporary filled first.

The operations:

* `Kern`: an iteration space (a shape) and outputs, each an expression of loads over that space stored (or
  accumulated, or reduced over the dims its strides are 0 on) into a view: every elementwise operation, reduction,
  gather and scatter, copy, cat, softmax, normalisation, and the optimizers' updates, written as expressions over the
  `OPS` vocabulary (which the VM runs, vm.py);
* `MM`: out = alpha a @ b + beta c for 2-D (or batched 3-D) views: the matrix products, on the machine's GEMM;
* `Draw`: a tensor of random numbers the algorithm's generator draws, made by torch before the phase, in the order of
  the graph (the draws do not depend on the values the phase computes).

An operation the conversion has no rule for raises Declined naming it.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hetrl.kernels.compiled.trace import Declined, Trace

aten = torch.ops.aten


# ---- buffers and views ---------------------------------------------------------------------------------------------
@dataclass
class Buf:
    id: int
    kind: str                  # state | input | draw | literal | temp
    dtype: torch.dtype
    numel: int                 # elements of dtype
    info: Any = None           # state: path; input: batch key; literal: numpy array; draw: Draw


@dataclass(frozen=True)
class TV:
    buf: int
    off: int
    shape: tuple
    strides: tuple
    dtype: torch.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    def extent(self) -> tuple[int, int]:
        """[lo, hi) elements of its buffer that it may touch."""
        lo = hi = self.off
        for n, s in zip(self.shape, self.strides):
            if n == 0:
                return self.off, self.off
            if s >= 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
        return lo, hi + 1


@dataclass(frozen=True)
class Const:
    value: float
    dtype: torch.dtype
    shape: tuple


# expression nodes (tuples):  ("ld", Ld) | ("c", value) | ("rc", slot) | ("iota", dim) | (op, *args)
@dataclass(frozen=True)
class Ld:
    """A load over an iteration space: element at buf[off + sum(i_d * strides[d]) + sum(idx_k * istrides[k])]."""
    buf: int
    off: int
    strides: tuple
    dtype: torch.dtype
    index: tuple = ()          # ((expr, stride), ...) gathered dims


@dataclass
class Out:
    """An output of a Kern: `expr` at every point of the space, into buf at off + sum(i_d * strides[d]) (+ gathered
    dims); mode store | add | sum | max | min | prod | argmax | argmin (reduced over the dims whose stride is 0)."""
    buf: int
    off: int
    strides: tuple
    dtype: torch.dtype
    expr: tuple
    mode: str = "store"
    index: tuple = ()          # ((expr, stride), ...) scattered dims
    dim: int = -1              # argmax/argmin: the reduced dim (the index counts along it)
    pair: Any = None           # argmax/argmin: the Out holding the running max/min value


@dataclass
class Kern:
    shape: tuple
    outs: list
    seq: int = 0               # position in the graph (program order)
    what: str = ""


@dataclass
class MM:
    out: TV
    a: TV
    b: TV
    alpha: float = 1.0
    beta: float = 0.0          # out = alpha a @ b + beta out (the accumulating form: out read too)
    seq: int = 0
    what: str = "mm"


@dataclass
class Adam:
    """One torch fused Adam/AdamW step over a dense float32 parameter (the optimizer's one kernel, optim's formulas):
    p, g, m, v (and vmax) of `numel` elements; `sc` the step's float64 scalars (step_size, sqrt of bias correction 2,
    lr * weight_decay); the group's hyper-parameters from runtime constant `rc` on; the gradient scaled by `scale`
    first where given (a clip's factor, written back to g)."""
    p: TV
    g: TV
    m: TV
    v: TV
    vmax: TV | None
    sc: TV
    rc: int
    adamw: bool = False
    amsgrad: bool = False
    maximize: bool = False
    scale: object = None
    seq: int = 0
    what: str = "adam"


@dataclass
class Draw:
    out: TV
    fn: str                    # normal | uniform | bernoulli | exponential | randint
    args: tuple
    generator: Any             # path of the algorithm's generator, or None (torch's default)
    seq: int = 0
    what: str = "draw"


# ---- the elementwise vocabulary ------------------------------------------------------------------------------------
# op -> arity; the VM (vm.py) implements each on a tile of registers
OPS = {
    "neg": 1, "abs": 1, "exp": 1, "log": 1, "log1p": 1, "expm1": 1, "sqrt": 1, "rsqrt": 1, "recip": 1, "tanh": 1,
    "sigmoid": 1, "sign": 1, "floor": 1, "ceil": 1, "round": 1, "trunc": 1, "not": 1, "sin": 1, "cos": 1, "erf": 1,
    "f32": 1, "isnan": 1, "atan": 1, "log2": 1, "exp2": 1,
    "add": 2, "sub": 2, "mul": 2, "div": 2, "pow": 2, "min": 2, "max": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2,
    "eq": 2, "ne": 2, "and": 2, "or": 2, "xor": 2, "fmod": 2, "rem": 2, "atan2": 2,
    "where": 3, "lerp": 3,
}


def C(v) -> tuple:
    return ("c", float(v))


def _is_c(e) -> bool:
    return e[0] == "c"


def mk(op: str, *args) -> tuple:
    """An expression node, folded where its arguments are constants and simplified for common identities."""
    if all(_is_c(a) for a in args) and op in _FOLD:
        try:
            return C(_FOLD[op](*[a[1] for a in args]))
        except (ValueError, ZeroDivisionError, OverflowError):
            pass
    if op == "mul":
        a, b = args
        if _is_c(a) and a[1] == 1.0:
            return b
        if _is_c(b) and b[1] == 1.0:
            return a
    if op == "add":
        a, b = args
        if _is_c(a) and a[1] == 0.0:
            return b
        if _is_c(b) and b[1] == 0.0:
            return a
    if op == "sub" and _is_c(args[1]) and args[1][1] == 0.0:
        return args[0]
    if op == "div" and _is_c(args[1]) and args[1][1] == 1.0:
        return args[0]
    if op == "where" and _is_c(args[0]):
        return args[1] if args[0][1] else args[2]
    return (op, *args)


def _where(c, a, b):
    return a if c else b


_FOLD = {
    "neg": operator.neg, "abs": abs, "exp": math.exp, "log": math.log, "log1p": math.log1p, "expm1": math.expm1,
    "sqrt": math.sqrt, "rsqrt": lambda x: 1 / math.sqrt(x), "recip": lambda x: 1 / x, "tanh": math.tanh,
    "sigmoid": lambda x: 1 / (1 + math.exp(-x)), "sign": lambda x: float((x > 0) - (x < 0)), "floor": math.floor,
    "ceil": math.ceil, "trunc": math.trunc, "not": lambda x: float(not x), "f32": lambda x: float(np.float32(x)),
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv, "pow": math.pow,
    "min": min, "max": max, "lt": lambda a, b: float(a < b), "le": lambda a, b: float(a <= b),
    "gt": lambda a, b: float(a > b), "ge": lambda a, b: float(a >= b), "eq": lambda a, b: float(a == b),
    "ne": lambda a, b: float(a != b), "and": lambda a, b: float(bool(a) and bool(b)),
    "or": lambda a, b: float(bool(a) or bool(b)), "where": _where,
}

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
KNOWN_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool, torch.int8,
                torch.int16)


def is_float(dt) -> bool:
    return dt in FLOATS


def cast_to(e: tuple, src: torch.dtype, dst: torch.dtype) -> tuple:
    """The expression e (of dtype src) as dst: bools are 0/1, floats to integers truncate toward zero, a float32
    result of float64 arithmetic rounds to float32 (what torch computes in float32)."""
    if dst == torch.bool:
        return e if src == torch.bool else mk("ne", e, C(0))
    if is_float(dst):
        return e
    if is_float(src):
        return mk("trunc", e)
    return e


# ---- the conversion ------------------------------------------------------------------------------------------------
VIEW_OPS = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze", "select", "slice",
    "alias", "detach", "as_strided", "split", "split_with_sizes", "unbind", "narrow", "diagonal", "view_as", "expand_as",
    "unflatten", "flatten", "movedim", "swapaxes", "chunk", "unsafe_split", "unsafe_split_with_sizes", "_reshape_alias",
    "lift_fresh", "lift", "squeeze_copy", "unsqueeze_copy", "view_copy", "permute_copy", "t_copy", "expand_copy",
    "alias_copy", "detach_copy", "select_copy", "slice_copy",
}


def opname(target) -> str:
    """aten.add_.Tensor -> add_ (the packet name)."""
    return getattr(getattr(target, "overloadpacket", None), "__name__", None) or getattr(target, "__name__", str(target))


class Converter:
    """Walks the graph in order, building buffers and ops (see the module docstring)."""

    def __init__(self, tr: Trace):
        self.tr = tr
        self.bufs: list[Buf] = []
        self.ops: list = []
        self.env: dict = {}
        self.written: set = set()                 # nodes an in-place op writes into (written_bases)
        self.state_bufs: dict[int, int] = {}      # twin storage data_ptr -> buf id
        self.literal_bufs: dict[int, int] = {}
        self.inputs: dict[str, int] = {}          # batch key / "weights" -> buf id
        self.rconst: list = []                    # runtime constants: (kind, ...) -> slot
        self.outputs: list = []                   # graph outputs (TV or Const)
        self.seq = 0
        self.who = tr.who

    # -- buffers --
    def buf(self, kind: str, dtype: torch.dtype, numel: int, info=None) -> int:
        if dtype not in KNOWN_DTYPES:
            raise Declined(f"{self.who}'s learn computes on {dtype} tensors; the compiled kernel runs float32 and "
                           "float64, integers and bools")
        self.bufs.append(Buf(len(self.bufs), kind, dtype, int(numel), info))
        return len(self.bufs) - 1

    def temp(self, meta) -> TV:
        """A new temporary laid out as the traced tensor `meta` (its strides: dense, maybe permuted)."""
        shape, strides = tuple(meta.shape), tuple(meta.stride())
        numel = 1 + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0 and s > 0)
        if any(n == 0 for n in shape):
            numel = 1
        b = self.buf("temp", meta.dtype, numel, (shape, strides))
        return TV(b, 0, shape, strides, meta.dtype)

    def temp_like_shape(self, shape, dtype) -> TV:
        shape = tuple(int(n) for n in shape)
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= max(n, 1)
        strides = tuple(reversed(strides))
        b = self.buf("temp", dtype, max(acc, 1), (shape, strides))
        return TV(b, 0, shape, strides, dtype)

    def constant(self, t: torch.Tensor):
        """A tensor constant of the graph: a view of an algorithm storage, else a literal."""
        s = t.untyped_storage()
        key = s.data_ptr()
        if key in self.tr.roots and s.nbytes():
            b = self.state_bufs.get(key)
            if b is None:
                nbytes = self.tr.root_meta[key][0]
                b = self.buf("state", t.dtype, nbytes // t.element_size(), (self.tr.roots[key], nbytes))
                self.state_bufs[key] = b
            elif self.bufs[b].dtype != t.dtype:
                raise Declined(f"{self.who}'s learn reads {t.dtype} and {self.bufs[b].dtype} views of one storage, "
                               "which the compiled kernel does not take")
            return TV(b, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() == 1 and t.ndim == 0:
            return Const(float(t.item()), t.dtype, ())
        b = self.literal_bufs.get(id(t))
        if b is None:
            arr = t.detach().contiguous().cpu().numpy().copy()
            b = self.buf("literal", t.dtype, arr.size, arr.reshape(-1))
            self.literal_bufs[id(t)] = b
            return TV(b, 0, tuple(t.shape), tuple(t.contiguous().stride()), t.dtype)
        return TV(b, 0, tuple(t.shape), tuple(t.contiguous().stride()), t.dtype)

    # -- values --
    def val(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.val(x) for x in a)
        return a

    def load(self, v, shape: tuple) -> tuple:
        """An expression reading v (TV, Const or number) broadcast to the iteration space `shape`."""
        if isinstance(v, (int, float, bool)):
            return C(v)
        if isinstance(v, Const):
            return C(v.value)
        if not isinstance(v, TV):
            raise Declined(f"{self.who}'s learn passes a {type(v).__name__} where a tensor is expected")
        return ("ld", Ld(v.buf, v.off, bstrides(v, shape), v.dtype))

    def dtype_of(self, v) -> torch.dtype:
        if isinstance(v, (TV, Const)):
            return v.dtype
        if isinstance(v, bool):
            return torch.bool
        if isinstance(v, int):
            return torch.int64
        return torch.float32

    def emit(self, op) -> None:
        op.seq = self.seq
        if isinstance(op, Kern):   # size-1 dims step nowhere: stride 0 (one layout per access, for comparisons)
            for o in op.outs:
                o.strides = _unit_strides(o.strides, op.shape)
                o.expr = _norm_expr(o.expr, op.shape, {})
                o.index = tuple((_norm_expr(e, op.shape, {}), st) for e, st in o.index)
        self.ops.append(op)

    def kern(self, out: TV, expr: tuple, what: str, mode: str = "store", src_dtype=None) -> None:
        """out[...] = expr over out's shape (the common elementwise case)."""
        if src_dtype is not None:
            expr = cast_to(expr, src_dtype, out.dtype)
        self.emit(Kern(out.shape, [Out(out.buf, out.off, out.strides, out.dtype, expr, mode)], what=what))

    # -- the walk --
    def run(self):
        gm = self.tr.gm
        self.written = written_bases(gm.graph)
        for node in gm.graph.nodes:
            self.seq += 1
            if node.op == "placeholder":
                self.placeholder(node)
            elif node.op == "get_attr":
                obj = getattr(gm, node.target)
                self.env[node] = obj if isinstance(obj, torch.Generator) else self.constant(obj)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.outputs = [self.val(a) for a in node.args[0]]
        return self

    def placeholder(self, node) -> None:
        key = dict((p, k) for k, p in self.tr.inputs)[node.target]
        m = node.meta["val"]
        b = self.buf("input", m.dtype, m.numel(), key)
        self.inputs[key] = b
        self.env[node] = TV(b, 0, tuple(m.shape), tuple(m.stride()), m.dtype)

    def call(self, node) -> None:
        t = node.target
        if t is operator.getitem:
            self.env[node] = self.val(node.args[0])[node.args[1]]
            return
        name = opname(t)
        if name in ("_record_function_enter_new", "_record_function_exit", "_record_function_enter"):
            self.env[node] = None
            return
        meta = node.meta.get("val")
        args = [self.val(a) for a in node.args]
        kwargs = {k: self.val(v) for k, v in node.kwargs.items()}
        if name in VIEW_OPS:
            self.env[node] = self.view(node, args, meta)
            return
        rule = RULES.get(name)
        if rule is None:
            raise Declined(f"{self.who}'s learn uses aten.{name}, which the compiled kernel has no lowering for")
        try:
            value = rule(self, args, kwargs, meta, node)
            if isinstance(value, Const) and node in self.written:   # a constant written in place later: in memory
                out = self.temp(meta)
                self.kern(out, C(value.value), "constant")
                value = out
            self.env[node] = value
        except Declined:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, AssertionError) as e:
            if __debug__ and __import__("os").environ.get("HETRL_COMPILER_DEBUG"):
                raise
            raise Declined(f"{self.who}'s learn uses aten.{name} in a form the compiled kernel does not take "
                           f"({type(e).__name__}: {e})") from None

    def view(self, node, args, meta):
        """A view op: the same buffer at the offset and strides the op gives (computed on a meta tensor of the base's
        layout: the trace's recorded metadata does not keep views' storage offsets)."""
        base = args[0]
        if isinstance(base, Const):
            if isinstance(meta, (list, tuple)):
                return [Const(base.value, base.dtype, tuple(m.shape)) for m in meta]
            return Const(base.value, base.dtype, tuple(meta.shape))
        if not isinstance(base, TV):
            raise Declined(f"{self.who}'s learn takes a view of a {type(base).__name__}")
        numel = max(self.bufs[base.buf].numel, base.extent()[1])
        src = torch.empty(numel, dtype=base.dtype, device="meta").as_strided(base.shape, base.strides, base.off)
        rest = [a.value if isinstance(a, Const) else a for a in args[1:]]
        got = node.target(src, *rest, **{k: v for k, v in node.kwargs.items()})

        def one(m):
            if m.dtype != base.dtype:
                self._dtype_view(base, m)
            return TV(base.buf, m.storage_offset(), tuple(m.shape), tuple(m.stride()), base.dtype)
        if isinstance(got, (list, tuple)):
            return [one(m) for m in got]
        return one(got)

    def _dtype_view(self, base, m):
        raise Declined(f"{self.who}'s learn views {base.dtype} memory as {m.dtype}, which the compiled kernel does not "
                       "take")


def _unit_strides(strides, shape) -> tuple:
    return tuple(0 if n == 1 else st for n, st in zip(shape, strides))


def _norm_expr(e, shape, memo):
    k = id(e)
    if k in memo:
        return memo[k]
    if e[0] == "ld":
        ld = e[1]
        r = ("ld", Ld(ld.buf, ld.off, _unit_strides(ld.strides, shape), ld.dtype,
                      tuple((_norm_expr(ie, shape, memo), st) for ie, st in ld.index)))
    elif e[0] in ("c", "rc", "iota"):
        r = e
    else:
        r = (e[0], *[_norm_expr(a, shape, memo) for a in e[1:]])
    memo[k] = r
    return r


def bstrides(v: TV, shape: tuple) -> tuple:
    """v's strides broadcast to `shape` (aligned from the right; 0 where v is broadcast)."""
    nd = len(shape)
    if v.ndim > nd:
        raise ValueError(f"a {v.shape} tensor does not broadcast to {shape}")
    out = [0] * (nd - v.ndim)
    for n, s, full in zip(v.shape, v.strides, shape[nd - v.ndim:]):
        if n == full:
            out.append(s if n > 1 else 0)
        elif n == 1:
            out.append(0)
        else:
            raise ValueError(f"a {v.shape} tensor does not broadcast to {shape}")
    return tuple(out)


def shape_of(v) -> tuple:
    if isinstance(v, (TV, Const)):
        return v.shape
    return ()


def result(cv: Converter, meta, out=None) -> TV:
    return out if out is not None else cv.temp(meta)


# ---- rules: aten op name -> (converter, args, kwargs, meta, node) -> value -----------------------------------------
RULES: dict = {}


def rule(*names):
    def deco(f):
        for n in names:
            RULES[n] = f
        return f
    return deco


def written_bases(graph) -> set:
    """The nodes an in-place op writes into (through views of them): a constant such as `torch.zeros_like(x)`
    that is then scattered or copied into must live in memory, not be folded into the expressions that read it."""
    out = set()
    for n in graph.nodes:
        if n.op != "call_function" or not opname(n.target).endswith("_") or not n.args:
            continue
        for b in n.args[0] if isinstance(n.args[0], (list, tuple)) else [n.args[0]]:   # (_foreach_*_: a list)
            while isinstance(b, torch.fx.Node) and b.op == "call_function" and opname(b.target) in VIEW_OPS and b.args:
                b = b.args[0]
            if isinstance(b, torch.fx.Node):
                out.add(b)
    return out


def _elementwise(name: str, build, inplace: bool = False, out_float: bool = False):
    """A rule for an elementwise op: build(cv, [exprs], args, kwargs) -> expr, over the output's shape."""
    def f(cv: Converter, args, kwargs, meta, node):
        tensors = [a for a in args if isinstance(a, (TV, Const))]
        if inplace:
            out = args[0]
            if isinstance(out, Const):
                raise Declined(f"{cv.who}'s learn writes in place into a constant tensor ({name})")
            shape = out.shape
        else:
            shape = tuple(meta.shape)
            out = None
        exprs = [cv.load(a, shape) if isinstance(a, (TV, Const, int, float)) else None for a in args]
        expr = build(cv, exprs, args, kwargs)
        odt = out.dtype if inplace else meta.dtype
        src = _compute_dtype(cv, tensors, odt)
        if not inplace and all(isinstance(a, Const) or not isinstance(a, TV) for a in args) and expr[0] == "c":
            return Const(expr[1], odt, shape)
        target = out if inplace else cv.temp(meta)
        cv.kern(target, expr, name, src_dtype=src)
        return target
    return f


def _compute_dtype(cv, tensors, odt):
    for a in tensors:
        if is_float(a.dtype):
            return a.dtype
    return odt if not tensors else (odt if is_float(odt) else tensors[0].dtype)


def E(name, build, out_float=False):
    """Register an elementwise op and its in-place variant."""
    RULES[name] = _elementwise(name, build, False, out_float)
    RULES[name + "_"] = _elementwise(name + "_", build, True, out_float)


def _alpha(kwargs, args, i=2):
    return kwargs.get("alpha", args[i] if len(args) > i else 1)


E("add", lambda cv, e, a, k: mk("add", e[0], _scaled(e[1] if e[1] is not None else C(a[1]), _alpha(k, a))))
E("sub", lambda cv, e, a, k: mk("sub", e[0], _scaled(e[1] if e[1] is not None else C(a[1]), _alpha(k, a))))
E("rsub", lambda cv, e, a, k: mk("sub", e[1] if e[1] is not None else C(a[1]), _scaled(e[0], _alpha(k, a))))
E("mul", lambda cv, e, a, k: mk("mul", e[0], e[1] if e[1] is not None else C(a[1])))
E("neg", lambda cv, e, a, k: mk("neg", e[0]))
E("abs", lambda cv, e, a, k: mk("abs", e[0]))
E("exp", lambda cv, e, a, k: mk("exp", e[0]))
E("exp2", lambda cv, e, a, k: mk("exp2", e[0]))
E("log", lambda cv, e, a, k: mk("log", e[0]))
E("log2", lambda cv, e, a, k: mk("log2", e[0]))
E("log10", lambda cv, e, a, k: mk("mul", mk("log", e[0]), C(1 / math.log(10))))
E("log1p", lambda cv, e, a, k: mk("log1p", e[0]))
E("expm1", lambda cv, e, a, k: mk("expm1", e[0]))
E("sqrt", lambda cv, e, a, k: mk("sqrt", e[0]))
E("rsqrt", lambda cv, e, a, k: mk("rsqrt", e[0]))
E("reciprocal", lambda cv, e, a, k: mk("recip", e[0]))
E("tanh", lambda cv, e, a, k: mk("tanh", e[0]))
E("sigmoid", lambda cv, e, a, k: mk("sigmoid", e[0]))
E("sin", lambda cv, e, a, k: mk("sin", e[0]))
E("cos", lambda cv, e, a, k: mk("cos", e[0]))
E("atan", lambda cv, e, a, k: mk("atan", e[0]))
E("erf", lambda cv, e, a, k: mk("erf", e[0]))
# atanh(x) = log1p(2x / (1 - x)) / 2: a Gaussian action's log-probability from its squashed value (TQC, AWAC, IQL)
E("atanh", lambda cv, e, a, k: mk("mul", mk("log1p", mk("div", mk("mul", C(2.0), e[0]), mk("sub", C(1.0), e[0]))),
                                  C(0.5)))
E("sign", lambda cv, e, a, k: mk("sign", e[0]))
E("sgn", lambda cv, e, a, k: mk("sign", e[0]))
E("floor", lambda cv, e, a, k: mk("floor", e[0]))
E("ceil", lambda cv, e, a, k: mk("ceil", e[0]))
E("round", lambda cv, e, a, k: mk("round", e[0]))
E("trunc", lambda cv, e, a, k: mk("trunc", e[0]))
E("relu", lambda cv, e, a, k: mk("max", e[0], C(0)))
E("square", lambda cv, e, a, k: mk("mul", e[0], e[0]))
E("silu", lambda cv, e, a, k: mk("mul", e[0], mk("sigmoid", e[0])))
E("isnan", lambda cv, e, a, k: mk("isnan", e[0]))
E("logical_not", lambda cv, e, a, k: mk("not", e[0]))
E("logical_and", lambda cv, e, a, k: mk("and", e[0], _e1(e, a)))
E("logical_or", lambda cv, e, a, k: mk("or", e[0], _e1(e, a)))
E("logical_xor", lambda cv, e, a, k: mk("xor", e[0], _e1(e, a)))
E("minimum", lambda cv, e, a, k: mk("min", e[0], e[1]))
E("maximum", lambda cv, e, a, k: mk("max", e[0], e[1]))
E("fmin", lambda cv, e, a, k: mk("min", e[0], e[1]))
E("fmax", lambda cv, e, a, k: mk("max", e[0], e[1]))
E("atan2", lambda cv, e, a, k: mk("atan2", e[0], _e1(e, a)))
E("fmod", lambda cv, e, a, k: mk("fmod", e[0], _e1(e, a)))
E("remainder", lambda cv, e, a, k: mk("rem", e[0], _e1(e, a)))
for _n, _o in (("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne")):
    E(_n, (lambda o: lambda cv, e, a, k: mk(o, e[0], _e1(e, a)))(_o))
E("where", lambda cv, e, a, k: mk("where", e[0], _e1(e, a), e[2] if e[2] is not None else C(a[2])))
E("clamp", lambda cv, e, a, k: _clamp(e[0], _opt(a, k, 1, "min", e), _opt(a, k, 2, "max", e)))
E("clamp_min", lambda cv, e, a, k: _clamp(e[0], _e1(e, a), None))
E("clamp_max", lambda cv, e, a, k: _clamp(e[0], None, _e1(e, a)))
E("hardtanh", lambda cv, e, a, k: _clamp(e[0], C(a[1] if len(a) > 1 else -1), C(a[2] if len(a) > 2 else 1)))
E("leaky_relu", lambda cv, e, a, k: mk("where", mk("gt", e[0], C(0)), e[0],
                                        mk("mul", e[0], C(a[1] if len(a) > 1 else 0.01))))
E("lerp", lambda cv, e, a, k: _lerp(e[0], e[1], e[2] if e[2] is not None else C(a[2])))
E("addcmul", lambda cv, e, a, k: mk("add", e[0], mk("mul", C(k.get("value", 1)), mk("mul", e[1], e[2]))))
E("addcdiv", lambda cv, e, a, k: mk("add", e[0], mk("mul", C(k.get("value", 1)), mk("div", e[1], e[2]))))
E("bitwise_not", lambda cv, e, a, k: _bitwise_not(e[0], a[0]))
E("bitwise_and", lambda cv, e, a, k: _bool_only(a, "and", e))
E("bitwise_or", lambda cv, e, a, k: _bool_only(a, "or", e))
E("bitwise_xor", lambda cv, e, a, k: _bool_only(a, "xor", e))
E("elu", lambda cv, e, a, k: _elu(e[0], *(list(a[1:4]) + [1, 1, 1][len(a) - 1:])))
E("softplus", lambda cv, e, a, k: _softplus(e[0], a[1] if len(a) > 1 else 1, a[2] if len(a) > 2 else 20))
E("gelu", lambda cv, e, a, k: _gelu(e[0], k.get("approximate", "none")))
E("nan_to_num", lambda cv, e, a, k: mk("where", mk("isnan", e[0]), C(a[1] if len(a) > 1 and a[1] is not None else 0),
                                      e[0]))


def _e1(e, a):
    return e[1] if e[1] is not None else C(a[1])


def _opt(a, k, i, key, e):
    v = k.get(key, a[i] if len(a) > i else None)
    if v is None:
        return None
    if isinstance(v, (TV, Const)):
        return e[i] if i < len(e) and e[i] is not None else C(v.value)
    return C(v)


def _scaled(e, alpha):
    return e if alpha == 1 else mk("mul", e, C(alpha))


def _clamp(x, lo, hi):
    if lo is not None:
        x = mk("max", x, lo)
    if hi is not None:
        x = mk("min", x, hi)
    return x


def _lerp(a, b, w):
    """torch's lerp: a + w (b - a) for |w| < 0.5, b - (b - a)(1 - w) otherwise (exact at w = 1)."""
    return mk("lerp", a, b, w)


def _bitwise_not(e, a):
    if isinstance(a, (TV, Const)) and a.dtype == torch.bool:
        return mk("not", e)
    return mk("sub", mk("neg", e), C(1))


def _bool_only(a, op, e):
    if not all(isinstance(x, (TV, Const)) and x.dtype == torch.bool for x in a[:2] if isinstance(x, (TV, Const))):
        raise Declined("bitwise operations on integers are not taken by the compiled kernel")
    return mk(op, e[0], _e1(e, a))


def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    neg = mk("mul", C(alpha * scale), mk("expm1", mk("mul", x, C(input_scale))))
    return mk("where", mk("gt", x, C(0)), mk("mul", x, C(scale)), neg)


def _softplus(x, beta, threshold):
    bx = mk("mul", x, C(beta))
    return mk("where", mk("gt", bx, C(threshold)), x, mk("div", mk("log1p", mk("exp", bx)), C(beta)))


def _gelu(x, approximate):
    if approximate == "tanh":
        inner = mk("mul", C(math.sqrt(2 / math.pi)), mk("add", x, mk("mul", C(0.044715), mk("mul", x, mk("mul", x, x)))))
        return mk("mul", mk("mul", C(0.5), x), mk("add", C(1), mk("tanh", inner)))
    return mk("mul", mk("mul", C(0.5), x), mk("add", C(1), mk("erf", mk("mul", x, C(1 / math.sqrt(2))))))


def _div_build(cv, e, a, k):
    d = mk("div", e[0], _e1(e, a))
    mode = k.get("rounding_mode")
    if mode == "trunc":
        return mk("trunc", d)
    if mode == "floor":
        return mk("floor", d)
    return d


E("div", _div_build)


def _pow_build(cv, e, a, k):
    base, ex = a[0], a[1]
    if isinstance(ex, (int, float)) and not isinstance(ex, bool):
        x = e[0]
        if ex == 2:
            return mk("mul", x, x)
        if ex == 1:
            return x
        if ex == 0.5:
            return mk("sqrt", x)
        if ex == -1:
            return mk("recip", x)
        if ex == 3:
            return mk("mul", x, mk("mul", x, x))
        if ex == 0:
            return C(1)
        return mk("pow", x, C(ex))
    if isinstance(base, (int, float)):
        return mk("pow", C(base), e[1])
    return mk("pow", e[0], e[1])


E("pow", _pow_build)


@rule("_to_copy", "clone", "contiguous", "to", "_copy")
def _copy_rule(cv, args, kwargs, meta, node):
    x = args[0]
    if isinstance(x, Const):
        dt = meta.dtype
        return Const(float(cast_value(x.value, dt)), dt, x.shape)
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        raise Declined(f"{cv.who}'s learn moves tensors to {dev}; the compiled kernel runs on the CPU")
    out = cv.temp(meta)
    cv.kern(out, cv.load(x, out.shape), "copy", src_dtype=x.dtype)
    return out


def cast_value(v, dt):
    if dt == torch.bool:
        return float(bool(v))
    if not is_float(dt):
        return float(math.trunc(v))
    return v


@rule("copy_", "copy")
def _copy_into(cv, args, kwargs, meta, node):
    dst, src = args[0], args[1]
    if isinstance(dst, Const):
        raise Declined(f"{cv.who}'s learn copies into a constant tensor")
    if node.target is aten.copy.default:
        dst = cv.temp(meta)
    cv.kern(dst, cv.load(src, dst.shape), "copy_", src_dtype=cv.dtype_of(src))
    return dst


@rule("fill_", "zero_")
def _fill_(cv, args, kwargs, meta, node):
    dst = args[0]
    v = 0.0 if opname(node.target) == "zero_" else args[1]
    v = v.value if isinstance(v, Const) else v
    cv.kern(dst, cv.load(v, dst.shape), "fill_", src_dtype=dst.dtype if not isinstance(v, TV) else v.dtype)
    return dst


@rule("fill")
def _fill(cv, args, kwargs, meta, node):
    v = args[1]
    if isinstance(v, TV):
        out = cv.temp(meta)
        cv.kern(out, cv.load(v, out.shape), "fill", src_dtype=v.dtype)
        return out
    return Const(float(v.value if isinstance(v, Const) else v), meta.dtype, tuple(meta.shape))


@rule("full", "full_like", "new_full", "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones",
      "scalar_tensor", "empty", "empty_like", "new_empty", "empty_permuted", "empty_strided", "new_empty_strided")
def _create(cv, args, kwargs, meta, node):
    name = opname(node.target)
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        raise Declined(f"{cv.who}'s learn makes tensors on {dev}; the compiled kernel runs on the CPU")
    if name.startswith("empty") or name == "new_empty" or name == "new_empty_strided":
        return cv.temp(meta)
    if name in ("zeros", "zeros_like", "new_zeros"):
        v = 0.0
    elif name in ("ones", "ones_like", "new_ones"):
        v = 1.0
    elif name == "scalar_tensor":
        v = args[0]
    elif name == "new_full":
        v = args[2]
    else:   # full, full_like
        v = args[1]
    if isinstance(v, Const):
        v = v.value
    return Const(float(cast_value(v, meta.dtype)), meta.dtype, tuple(meta.shape))


@rule("lift_fresh_copy")
def _lift(cv, args, kwargs, meta, node):
    """torch.tensor(...) made in learn: its literal, or a copy of it where learn then writes into it (the literal
    must stay as traced for the next phase)."""
    x = args[0]
    if node in cv.written and isinstance(x, TV):
        out = cv.temp(meta)
        cv.kern(out, cv.load(x, out.shape), "lift_fresh_copy")
        return out
    return x


# ---- reductions -----------------------------------------------------------------------------------------------------
def _dims(dims, ndim) -> list[int]:
    if dims is None:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    out = sorted({d % ndim if ndim else 0 for d in dims})
    return out if out or ndim == 0 else list(range(ndim))


def reduce_out(cv, meta_shape, in_shape, dims, keepdim, dtype, existing: TV | None = None) -> tuple[TV, tuple]:
    """A temp for the reduced result and its strides over the input's iteration space (0 on reduced dims)."""
    out = existing if existing is not None else cv.temp_like_shape(meta_shape, dtype)
    strides, j = [], 0
    ostr = list(out.strides)
    for d in range(len(in_shape)):
        if d in dims:
            strides.append(0)
            if keepdim:
                j += 1
        else:
            strides.append(ostr[j] if in_shape[d] > 1 else 0)
            j += 1
    return out, tuple(strides)


def reduction(cv, x, dims, keepdim, meta, mode, what, expr=None, scale=None, out_dtype=None):
    """out = reduce_mode(expr over x's shape) over dims (times `scale`, e.g. 1/n for a mean)."""
    shape = x.shape if isinstance(x, (TV, Const)) else ()
    e = expr if expr is not None else cv.load(x, shape)
    dt = out_dtype or meta.dtype
    out, strides = reduce_out(cv, tuple(meta.shape), shape, dims, keepdim, dt)
    if not shape:   # a 0-dim input: the reduction is the value itself
        cv.kern(out, e if scale is None else mk("mul", e, C(scale)), what, src_dtype=cv.dtype_of(x))
        return out
    if scale is None:
        cv.emit(Kern(shape, [Out(out.buf, out.off, strides, dt, e, mode)], what=what))
        return out
    acc, astr = reduce_out(cv, tuple(meta.shape), shape, dims, keepdim, torch.float64 if dt == torch.float64 else
                           torch.float32)
    cv.emit(Kern(shape, [Out(acc.buf, acc.off, astr, acc.dtype, e, mode)], what=what))
    cv.kern(out, mk("mul", cv.load(acc, out.shape), C(scale)), what)
    return out


@rule("sum")
def _sum(cv, args, kwargs, meta, node):
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim"), len(shape_of(x)))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if isinstance(x, Const):
        n = int(np.prod([x.shape[d] for d in dims])) if x.shape else 1
        return Const(x.value * n, meta.dtype, tuple(meta.shape))
    return reduction(cv, x, dims, keep, meta, "sum", "sum", expr=cast_to(cv.load(x, x.shape), x.dtype, meta.dtype))


@rule("mean")
def _mean(cv, args, kwargs, meta, node):
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim"), len(shape_of(x)))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    n = int(np.prod([x.shape[d] for d in dims])) if x.shape else 1
    if isinstance(x, Const):
        return Const(x.value, meta.dtype, tuple(meta.shape))
    return reduction(cv, x, dims, keep, meta, "sum", "mean", scale=1.0 / max(n, 1))


@rule("prod")
def _prod(cv, args, kwargs, meta, node):
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else None, len(shape_of(x)))
    keep = bool(args[2] if len(args) > 2 else False)
    return reduction(cv, x, dims, keep, meta, "prod", "prod")


@rule("amax", "amin")
def _amax(cv, args, kwargs, meta, node):
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim", []), len(shape_of(x)))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    return reduction(cv, x, dims, keep, meta, "max" if opname(node.target) == "amax" else "min", "amax")


@rule("max", "min")
def _maxmin(cv, args, kwargs, meta, node):
    name = opname(node.target)
    x = args[0]
    if len(args) >= 2 and isinstance(args[1], (TV, Const)):   # max(a, b): elementwise
        out = cv.temp(meta)
        cv.kern(out, mk(name, cv.load(x, out.shape), cv.load(args[1], out.shape)), name)
        return out
    if len(args) == 1:
        return reduction(cv, x, list(range(x.ndim)), False, meta, name, name)
    dim = args[1] % x.ndim
    keep = bool(args[2] if len(args) > 2 else False)
    return _arg_reduce(cv, x, dim, keep, meta, name, with_values=True)


@rule("argmax", "argmin")
def _argmax(cv, args, kwargs, meta, node):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    kind = "max" if opname(node.target) == "argmax" else "min"
    if dim is None:
        raise Declined("argmax/argmin over a flattened tensor is not taken by the compiled kernel")
    return _arg_reduce(cv, x, dim % x.ndim, keep, meta, kind, with_values=False)


def _arg_reduce(cv, x, dim, keep, meta, kind, with_values):
    shape = x.shape
    vmeta = meta[0] if with_values else meta
    vals, vstr = reduce_out(cv, tuple(vmeta.shape), shape, [dim], keep, x.dtype)
    idx, istr = reduce_out(cv, tuple(vmeta.shape), shape, [dim], keep, torch.int64)
    e = cv.load(x, shape)
    vout = Out(vals.buf, vals.off, vstr, x.dtype, e, kind)
    iout = Out(idx.buf, idx.off, istr, torch.int64, e, "arg" + kind, dim=dim, pair=vout)
    cv.emit(Kern(shape, [vout, iout], what="arg" + kind))
    return (vals, idx) if with_values else idx


@rule("sort")
def _sort(cv, args, kwargs, meta, node):
    """(values, indices) along a dim, stable: element i's rank is the number of elements that come before it (in
    the order, or equal and earlier), and each is written at its rank. That is n^2 comparisons a row: meant for the
    tens to hundreds of values a row of a distributional critic's quantiles has (TQC sorts its critics'). NaN
    comes last ascending and first descending, as in torch."""
    x = args[0]
    dim = args[1] if len(args) > 1 and not isinstance(args[1], bool) else kwargs.get("dim", -1)
    desc = bool(args[2] if len(args) > 2 else kwargs.get("descending", False))
    return _sorted(cv, x, dim % max(x.ndim, 1), desc, meta[0].dtype)


@rule("topk")
def _topk(cv, args, kwargs, meta, node):
    x, k = args[0], int(args[1])
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", -1)) % max(x.ndim, 1)
    largest = bool(args[3] if len(args) > 3 else kwargs.get("largest", True))
    vals, idx = _sorted(cv, x, dim, largest, meta[0].dtype)
    outs = []
    for src, m in ((vals, meta[0]), (idx, meta[1])):
        out = cv.temp(m)
        cv.kern(out, cv.load(TV(src.buf, src.off, tuple(k if d == dim else n for d, n in enumerate(src.shape)),
                                src.strides, src.dtype), out.shape), "topk")
        outs.append(out)
    return tuple(outs)


@rule("cumsum")
def _cumsum(cv, args, kwargs, meta, node):
    """out_i = sum of x_j for j <= i along a dim, as a masked sum over a second axis: n^2 additions a row, for the
    short dims a learn sums along (quantile fractions, an episode's rewards)."""
    x = args[0]
    if not isinstance(x, TV):
        raise Declined(f"{cv.who}'s learn takes a cumulative sum of a constant")
    dim = (args[1] if len(args) > 1 else kwargs["dim"]) % max(x.ndim, 1)
    shape = tuple(x.shape)
    xs = bstrides(x, shape)
    xj = ("ld", Ld(x.buf, x.off, tuple(0 if d == dim else s for d, s in enumerate(xs)) + (x.strides[dim],), x.dtype))
    keep = mk("le", ("iota", len(shape)), ("iota", dim))
    out = cv.temp(meta)
    acc, astr = reduce_out(cv, shape + (1,), shape + (shape[dim],), [len(shape)], True,
                           torch.float64 if meta.dtype == torch.float64 else torch.float32)
    cv.emit(Kern(shape + (shape[dim],), [Out(acc.buf, acc.off, astr, acc.dtype,
                                              mk("where", keep, cast_to(xj, x.dtype, acc.dtype), C(0.0)), "sum")],
                 what="cumsum"))
    cv.kern(out, cv.load(TV(acc.buf, acc.off, shape, acc.strides[:-1], acc.dtype), shape), "cumsum",
            src_dtype=acc.dtype)
    return out


@rule("flip")
def _flip(cv, args, kwargs, meta, node):
    x, dims = args[0], [d % max(args[0].ndim, 1) for d in args[1]]
    if isinstance(x, Const):
        return x
    off, strides = x.off, list(x.strides)
    for d in dims:
        off += (x.shape[d] - 1) * x.strides[d]
        strides[d] = -x.strides[d]
    out = cv.temp(meta)
    cv.kern(out, cv.load(TV(x.buf, off, tuple(x.shape), tuple(strides), x.dtype), out.shape), "flip")
    return out


def _sorted(cv, x, dim, descending, dtype):
    if not isinstance(x, TV):
        raise Declined(f"{cv.who}'s learn sorts a constant")
    shape, n = tuple(x.shape), x.shape[dim]
    space = shape + (n,)                  # element i (along dim) against element j (the last dim)
    xs = bstrides(x, shape)
    xi = ("ld", Ld(x.buf, x.off, xs + (0,), x.dtype))
    xj = ("ld", Ld(x.buf, x.off, tuple(0 if d == dim else s for d, s in enumerate(xs)) + (x.strides[dim],),
                   x.dtype))
    ni, nj = mk("isnan", xi), mk("isnan", xj)
    ahead = mk("or", mk("gt" if descending else "lt", xj, xi),
               mk("and", nj, mk("not", ni)) if descending else mk("and", ni, mk("not", nj)))
    same = mk("or", mk("eq", xj, xi), mk("and", ni, nj))
    before = mk("or", ahead, mk("and", same, mk("lt", ("iota", len(shape)), ("iota", dim))))
    rank = cv.temp_like_shape(shape, torch.int64)
    cv.emit(Kern(space, [Out(rank.buf, rank.off, rank.strides + (0,), torch.int64, before, "sum")], what="sort rank"))
    vals, idx = cv.temp_like_shape(shape, dtype), cv.temp_like_shape(shape, torch.int64)
    at = cv.load(rank, shape)
    for out, e in ((vals, cv.load(x, shape)), (idx, ("iota", dim))):   # each element written at its rank
        strides = tuple(0 if d == dim else s for d, s in enumerate(out.strides))
        cv.emit(Kern(shape, [Out(out.buf, out.off, strides, out.dtype, e, "store", index=((at, out.strides[dim]),))],
                     what="sort"))
    return vals, idx


@rule("var_mean", "var", "std", "std_mean")
def _var_mean(cv, args, kwargs, meta, node):
    name = opname(node.target)
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim"), x.ndim)
    corr = kwargs.get("correction", 1)
    if corr is None:
        corr = 1
    if "unbiased" in kwargs:
        corr = 1 if kwargs["unbiased"] else 0
    keep = bool(kwargs.get("keepdim", False))
    n = int(np.prod([x.shape[d] for d in dims]))
    vmeta = meta[0] if isinstance(meta, (tuple, list)) else meta
    m_keep, _ = reduce_out(cv, [1 if d in dims else x.shape[d] for d in range(x.ndim)], x.shape, dims, True,
                           torch.float64 if x.dtype == torch.float64 else torch.float32)
    _mean_into(cv, x, dims, m_keep, n)
    dev = mk("sub", cv.load(x, x.shape), cv.load(m_keep, x.shape))
    v = reduction(cv, x, dims, keep, vmeta, "sum", name, expr=mk("mul", dev, dev), scale=1.0 / max(n - corr, 1))
    if name.startswith("std"):
        s = cv.temp_like_shape(v.shape, v.dtype)
        cv.kern(s, mk("sqrt", cv.load(v, s.shape)), "std")
        v = s
    if name in ("var", "std"):
        return v
    return v, TV(m_keep.buf, m_keep.off, tuple(meta[1].shape), _squeeze_strides(m_keep, dims, keep), m_keep.dtype)


def _squeeze_strides(t: TV, dims, keep):
    if keep:
        return t.strides
    return tuple(s for d, s in enumerate(t.strides) if d not in dims)


def _mean_into(cv, x, dims, out: TV, n):
    """out (keepdim shape) = mean of x over dims, in two ops: the sum, then the scale."""
    acc = cv.temp_like_shape(out.shape, out.dtype)
    astr = tuple(0 if d in dims else acc.strides[d] for d in range(x.ndim))
    cv.emit(Kern(x.shape, [Out(acc.buf, acc.off, astr, acc.dtype, cv.load(x, x.shape), "sum")], what="mean"))
    cv.kern(out, mk("mul", cv.load(acc, out.shape), C(1.0 / max(n, 1))), "mean")


@rule("linalg_vector_norm", "norm")
def _norm(cv, args, kwargs, meta, node):
    x = args[0]
    ord_ = args[1] if len(args) > 1 else kwargs.get("ord", 2)
    if isinstance(ord_, Const):
        ord_ = ord_.value
    dims = _dims(args[2] if len(args) > 2 else kwargs.get("dim"), x.ndim)
    keep = bool(args[3] if len(args) > 3 else kwargs.get("keepdim", False))
    return _vector_norm(cv, x, float(2 if ord_ is None else ord_), dims, keep, meta)


def _vector_norm(cv, x, p, dims, keep, meta):
    e = cv.load(x, x.shape) if isinstance(x, TV) else C(x.value)
    if isinstance(x, Const):
        raise Declined("the norm of a constant tensor")
    if p == math.inf:
        return reduction(cv, x, dims, keep, meta, "max", "norm", expr=mk("abs", e))
    if p == -math.inf:
        return reduction(cv, x, dims, keep, meta, "min", "norm", expr=mk("abs", e))
    if p == 1:
        return reduction(cv, x, dims, keep, meta, "sum", "norm", expr=mk("abs", e))
    if p == 0:
        return reduction(cv, x, dims, keep, meta, "sum", "norm", expr=mk("ne", e, C(0)))
    acc = reduction(cv, x, dims, keep, meta, "sum", "norm",
                    expr=mk("mul", e, e) if p == 2 else mk("pow", mk("abs", e), C(p)))
    out = cv.temp_like_shape(acc.shape, acc.dtype)
    cv.kern(out, mk("sqrt", cv.load(acc, out.shape)) if p == 2 else mk("pow", cv.load(acc, out.shape), C(1 / p)), "norm")
    return out


@rule("any", "all")
def _anyall(cv, args, kwargs, meta, node):
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else None, x.ndim)
    keep = bool(args[2] if len(args) > 2 else False)
    e = mk("ne", cv.load(x, x.shape), C(0))
    return reduction(cv, x, dims, keep, meta, "max" if opname(node.target) == "any" else "min", "any", expr=e)


@rule("_softmax", "_log_softmax", "softmax", "log_softmax", "logsumexp")
def _softmax(cv, args, kwargs, meta, node):
    name = opname(node.target)
    x = args[0]
    dims = _dims(args[1], x.ndim)
    keepd = [1 if d in dims else x.shape[d] for d in range(x.ndim)]
    m, mstr = reduce_out(cv, keepd, x.shape, dims, True, torch.float32 if x.dtype != torch.float64 else x.dtype)
    cv.emit(Kern(x.shape, [Out(m.buf, m.off, mstr, m.dtype, cv.load(x, x.shape), "max")], what=name))
    shifted = mk("sub", cv.load(x, x.shape), cv.load(m, x.shape))
    s, sstr = reduce_out(cv, keepd, x.shape, dims, True, m.dtype)
    cv.emit(Kern(x.shape, [Out(s.buf, s.off, sstr, s.dtype, mk("exp", shifted), "sum")], what=name))
    if name == "logsumexp":
        keep = bool(args[2] if len(args) > 2 else False)
        out = cv.temp(meta)
        mv = TV(m.buf, m.off, out.shape, _squeeze_strides(m, dims, keep), m.dtype)
        sv = TV(s.buf, s.off, out.shape, _squeeze_strides(s, dims, keep), s.dtype)
        cv.kern(out, mk("add", cv.load(mv, out.shape), mk("log", cv.load(sv, out.shape))), name)
        return out
    out = cv.temp(meta)
    if "log" in name:
        e = mk("sub", shifted, mk("log", cv.load(s, x.shape)))
    else:
        e = mk("div", mk("exp", shifted), cv.load(s, x.shape))
    cv.kern(out, e, name)
    return out


@rule("native_layer_norm")
def _layer_norm(cv, args, kwargs, meta, node):
    x, nshape, w, b, eps = args
    k = len(nshape)
    dims = list(range(x.ndim - k, x.ndim))
    n = int(np.prod(nshape))
    acc_dt = torch.float32 if x.dtype != torch.float64 else x.dtype
    mean = cv.temp(meta[1])
    mean_k = TV(mean.buf, mean.off, tuple(1 if d in dims else x.shape[d] for d in range(x.ndim)),
                _keep_strides(mean, x.ndim, dims), mean.dtype)
    _mean_into(cv, x, dims, mean_k, n)
    dev = mk("sub", cv.load(x, x.shape), cv.load(mean_k, x.shape))
    var, vstr = reduce_out(cv, mean_k.shape, x.shape, dims, True, acc_dt)
    cv.emit(Kern(x.shape, [Out(var.buf, var.off, vstr, var.dtype, mk("mul", dev, dev), "sum")], what="layer_norm"))
    rstd = cv.temp(meta[2])
    rstd_k = TV(rstd.buf, rstd.off, mean_k.shape, _keep_strides(rstd, x.ndim, dims), rstd.dtype)
    cv.kern(rstd_k, mk("rsqrt", mk("add", mk("mul", cv.load(var, mean_k.shape), C(1.0 / n)), C(eps))), "layer_norm")
    y = mk("mul", dev, cv.load(rstd_k, x.shape))
    if w is not None:
        y = mk("mul", y, cv.load(w, x.shape))
    if b is not None:
        y = mk("add", y, cv.load(b, x.shape))
    out = cv.temp(meta[0])
    cv.kern(out, y, "layer_norm")
    return out, mean, rstd


def _keep_strides(t: TV, ndim, dims):
    """Strides of t viewed with its reduced dims kept as size 1 (t has the keepdim shape or fewer dims)."""
    if t.ndim == ndim:
        return t.strides
    it = iter(t.strides[-(ndim - len(dims)):] if ndim - len(dims) else ())
    return tuple(0 if d in dims else next(it) for d in range(ndim))


@rule("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
      "_native_batch_norm_legit_functional")
def _batch_norm(cv, args, kwargs, meta, node):
    name = opname(node.target)
    x, w, b = args[0], args[1], args[2]
    if name == "_native_batch_norm_legit" and len(args) == 6:   # (x, w, b, training, momentum, eps): no stats
        rm = rv = None
        training, momentum, eps = args[3], args[4], args[5]
    elif name == "_native_batch_norm_legit_no_training":
        rm, rv, momentum, eps = args[3], args[4], args[5], args[6]
        training = False
    else:
        rm, rv, training, momentum, eps = args[3], args[4], args[5], args[6], args[7]
    dims = [d for d in range(x.ndim) if d != 1]
    C_ = x.shape[1]
    bshape = tuple(C_ if d == 1 else 1 for d in range(x.ndim))
    n = int(np.prod([x.shape[d] for d in dims]))

    def chan(v):   # a per-channel (C,) tensor broadcast over x
        return TV(v.buf, v.off, bshape, tuple(v.strides[0] if d == 1 else 0 for d in range(x.ndim)), v.dtype) \
            if isinstance(v, TV) else v
    outs = []
    if training:
        mean = cv.temp(meta[1])
        mk_ = chan(mean)
        _mean_into(cv, x, dims, TV(mk_.buf, mk_.off, bshape, tuple(mean.strides[0] if d == 1 else 0
                                                                      for d in range(x.ndim)), mean.dtype), n)
        dev = mk("sub", cv.load(x, x.shape), cv.load(mk_, x.shape))
        var, vstr = reduce_out(cv, bshape, x.shape, dims, True, torch.float32 if x.dtype != torch.float64 else x.dtype)
        cv.emit(Kern(x.shape, [Out(var.buf, var.off, vstr, var.dtype, mk("mul", dev, dev), "sum")], what="batch_norm"))
        invstd = cv.temp(meta[2])
        iv = chan(invstd)
        cv.kern(TV(iv.buf, iv.off, bshape, iv.strides, iv.dtype),
                mk("rsqrt", mk("add", mk("mul", cv.load(var, bshape), C(1.0 / n)), C(eps))), "batch_norm")
        if isinstance(rm, TV):
            cv.kern(rm, mk("add", mk("mul", cv.load(rm, rm.shape), C(1 - momentum)),
                           mk("mul", cv.load(mean, rm.shape), C(momentum))), "running_mean")
        if isinstance(rv, TV):
            vv = TV(var.buf, var.off, rv.shape, (var.strides[1],), var.dtype)
            cv.kern(rv, mk("add", mk("mul", cv.load(rv, rv.shape), C(1 - momentum)),
                           mk("mul", cv.load(vv, rv.shape), C(momentum / max(n - 1, 1)))), "running_var")
        y = mk("mul", dev, cv.load(iv, x.shape))
        outs = [mean, invstd]
    else:
        if not isinstance(rm, TV) or not isinstance(rv, TV):
            raise Declined("batch norm in evaluation mode without running statistics")
        y = mk("mul", mk("sub", cv.load(x, x.shape), cv.load(chan(rm), x.shape)),
               mk("rsqrt", mk("add", cv.load(chan(rv), x.shape), C(eps))))
        outs = [cv.temp(meta[1]), cv.temp(meta[2])]
    if w is not None:
        y = mk("mul", y, cv.load(chan(w), x.shape))
    if b is not None:
        y = mk("add", y, cv.load(chan(b), x.shape))
    out = cv.temp(meta[0])
    cv.kern(out, y, "batch_norm")
    result = [out, *outs]
    if name == "_native_batch_norm_legit_functional":
        result += [rm, rv]
    return tuple(result)


# ---- matrix products ------------------------------------------------------------------------------------------------
@rule("mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot")
def _mm(cv, args, kwargs, meta, node):
    name = opname(node.target)
    beta = kwargs.get("beta", 1)
    alpha = kwargs.get("alpha", 1)
    if name in ("addmm", "baddbmm", "addmv"):
        c, a, b = args[0], args[1], args[2]
    else:
        c, (a, b) = None, args[:2]
    if name in ("mv", "addmv", "dot"):   # vectors as matrices: (n,) -> (n, 1), (1, n)
        if name == "dot":
            a = TV(a.buf, a.off, (1, a.shape[0]), (0, a.strides[0]), a.dtype)
        b = TV(b.buf, b.off, (b.shape[0], 1), (b.strides[0], 0), b.dtype)
    a, b = _materialize(cv, a), _materialize(cv, b)
    out = cv.temp(meta)
    o = out
    if name in ("mv", "addmv"):
        o = TV(out.buf, out.off, (out.shape[0], 1), (out.strides[0], 0), out.dtype)
    elif name == "dot":
        o = TV(out.buf, out.off, (1, 1), (0, 0), out.dtype)
    cv.emit(MM(o, a, b, float(alpha), 0.0, what=name))
    if c is not None and beta != 0:   # the bias after the product: an elementwise pass the activation joins
        cv.kern(o, mk("add", cv.load(o, o.shape), _scaled(cv.load(c, o.shape), beta)), "bias")
    return out


def _materialize(cv, v):
    """A constant (uniform) tensor as a temp filled with its value (an operand that must be in memory)."""
    if isinstance(v, TV):
        return v
    if not isinstance(v, Const):
        raise Declined(f"{cv.who}'s learn multiplies a {type(v).__name__}")
    out = cv.temp_like_shape(v.shape, v.dtype)
    cv.kern(out, C(v.value), "constant")
    return out


# ---- indexing ------------------------------------------------------------------------------------------------------
@rule("gather")
def _gather(cv, args, kwargs, meta, node):
    x, dim, idx = args[0], args[1], args[2]
    dim %= x.ndim
    out = cv.temp(meta)
    e = gathered(cv, x, out.shape, [(dim, cv.load(idx, out.shape))])
    cv.kern(out, e, "gather")
    return out


def gathered(cv, x: TV, shape, index) -> tuple:
    """A load of x over `shape` whose dims in `index` [(dim, index expr)] are taken from the index values."""
    strides = list(bstrides(TV(x.buf, x.off, tuple(1 if d in dict(index) else n for d, n in enumerate(x.shape)),
                               x.strides, x.dtype), shape)) if len(shape) == x.ndim else None
    if strides is None:
        raise Declined("a gather whose index has another rank than its source")
    for d, _ in index:
        strides[d] = 0
    return ("ld", Ld(x.buf, x.off, tuple(strides), x.dtype, tuple((e, x.strides[d]) for d, e in index)))


@rule("scatter_add", "scatter_add_", "scatter", "scatter_", "scatter_reduce", "scatter_reduce_")
def _scatter(cv, args, kwargs, meta, node):
    name = opname(node.target)
    base, dim, idx, src = args[0], args[1], args[2], args[3]
    dim %= len(shape_of(base))
    if name.endswith("_"):
        out = base
    else:
        out = cv.temp(meta)
        cv.kern(out, cv.load(base, out.shape), "scatter base")
    if name.startswith("scatter_reduce"):
        red = args[4] if len(args) > 4 else kwargs.get("reduce")
        if red != "sum":
            raise Declined(f"scatter_reduce with reduce={red!r} is not taken by the compiled kernel")
    mode = "add" if name.startswith(("scatter_add", "scatter_reduce")) else "store"
    ishape = idx.shape
    strides = [0 if d == dim else s for d, s in enumerate(out.strides)]
    value = cv.load(src, ishape) if isinstance(src, (TV, Const)) else C(src)
    cv.emit(Kern(ishape, [Out(out.buf, out.off, tuple(strides if ishape == out.shape else
                                                          _sub_strides(out, ishape, dim)), out.dtype, value, mode,
                              index=((cv.load(idx, ishape), out.strides[dim]),))], what=name))
    return out


def _sub_strides(out: TV, ishape, dim):
    return tuple(0 if d == dim else s for d, s in enumerate(out.strides[:len(ishape)]))


@rule("index", "_unsafe_index")
def _index(cv, args, kwargs, meta, node):
    x, indices = args[0], args[1]
    out = cv.temp(meta)
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims or dims != list(range(dims[0], dims[0] + len(dims))):
        raise Declined("advanced indexing with non-adjacent index tensors is not taken by the compiled kernel")
    ishape = torch.broadcast_shapes(*[i.shape for i in indices if i is not None])
    d0 = dims[0]
    # out's dims: x's dims before d0, the broadcast index shape, x's dims after the indexed ones
    before, after = list(range(d0)), list(range(dims[-1] + 1, x.ndim))
    oshape = out.shape
    nb, ni = len(before), len(ishape)
    strides = [x.strides[d] for d in before] + [0] * ni + [x.strides[d] for d in after]
    iview = list(range(nb, nb + ni))
    index = []
    for d in dims:
        it = indices[d]
        itv = TV(it.buf, it.off, tuple(oshape[k] if k in iview else 1 for k in range(len(oshape))),
                 tuple(bstrides(it, tuple(ishape))[iview.index(k)] if k in iview else 0 for k in range(len(oshape))),
                 it.dtype)
        index.append((cv.load(itv, oshape), x.strides[d]))
    cv.kern(out, ("ld", Ld(x.buf, x.off, tuple(strides), x.dtype, tuple(index))), "index")
    return out


@rule("index_put", "index_put_", "_unsafe_index_put")
def _index_put(cv, args, kwargs, meta, node):
    name = opname(node.target)
    base, indices, values = args[0], args[1], args[2]
    acc = bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    if name.endswith("_"):
        out = base
    else:
        out = cv.temp(meta)
        cv.kern(out, cv.load(base, out.shape), "index_put base")
    dims = [d for d, i in enumerate(indices) if i is not None]
    if dims != list(range(len(dims))):
        raise Declined("index_put with index tensors that are not the leading dims is not taken by the compiled kernel")
    ishape = tuple(torch.broadcast_shapes(*[i.shape for i in indices if i is not None]))
    rest = out.shape[len(dims):]
    space = ishape + tuple(rest)
    strides = [0] * len(ishape) + list(out.strides[len(dims):])
    index = []
    for d in dims:
        it = indices[d]
        itv = TV(it.buf, it.off, space[:len(ishape)] + (1,) * len(rest),
                 bstrides(it, ishape) + (0,) * len(rest), it.dtype)
        index.append((cv.load(itv, space), out.strides[d]))
    cv.emit(Kern(space, [Out(out.buf, out.off, tuple(strides), out.dtype, cv.load(values, space),
                             "add" if acc else "store", index=tuple(index))], what=name))
    return out


@rule("index_select")
def _index_select(cv, args, kwargs, meta, node):
    x, dim, idx = args[0], args[1] % args[0].ndim, args[2]
    out = cv.temp(meta)
    shape = out.shape
    iv = TV(idx.buf, idx.off, tuple(n if d == dim else 1 for d, n in enumerate(shape)),
            tuple(idx.strides[0] if d == dim else 0 for d in range(len(shape))), idx.dtype)
    strides = [0 if d == dim else s for d, s in enumerate(x.strides)]
    cv.kern(out, ("ld", Ld(x.buf, x.off, tuple(strides), x.dtype, ((cv.load(iv, shape), x.strides[dim]),))),
            "index_select")
    return out


@rule("cat", "concat", "concatenate")
def _cat(cv, args, kwargs, meta, node):
    tensors = [t for t in args[0]]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    out = cv.temp(meta)
    dim %= out.ndim
    at = 0
    for t in tensors:
        shape = shape_of(t)
        if len(shape) == 1 and shape[0] == 0:
            continue
        n = shape[dim]
        part = TV(out.buf, out.off + at * out.strides[dim], tuple(shape), out.strides, out.dtype)
        cv.kern(part, cv.load(t, part.shape), "cat", src_dtype=cv.dtype_of(t))
        at += n
    return out


@rule("slice_scatter")
def _slice_scatter(cv, args, kwargs, meta, node):
    """input with src written over a slice of one dim: the gradient of `x[:, a:b]` (src into zeros). (torch's
    decompositions turn select_scatter into a where.)"""
    base, src = args[0], args[1]
    out = cv.temp(meta)
    cv.kern(out, cv.load(base, out.shape), "slice_scatter base", src_dtype=cv.dtype_of(base))
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % out.ndim
    start = args[3] if len(args) > 3 else kwargs.get("start")
    end = args[4] if len(args) > 4 else kwargs.get("end")
    step = args[5] if len(args) > 5 else kwargs.get("step", 1)
    r = range(out.shape[dim])[slice(start, end, step)]
    shape, strides = list(out.shape), list(out.strides)
    shape[dim], strides[dim] = len(r), out.strides[dim] * r.step
    part = TV(out.buf, out.off + (r.start if len(r) else 0) * out.strides[dim], tuple(shape), tuple(strides),
              out.dtype)
    if part.numel:
        cv.kern(part, cv.load(src, part.shape), "slice_scatter", src_dtype=cv.dtype_of(src))
    return out


@rule("stack")
def _stack(cv, args, kwargs, meta, node):
    tensors = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    out = cv.temp(meta)
    dim %= out.ndim
    for i, t in enumerate(tensors):
        shape = tuple(n for d, n in enumerate(out.shape) if d != dim)
        strides = tuple(s for d, s in enumerate(out.strides) if d != dim)
        part = TV(out.buf, out.off + i * out.strides[dim], shape, strides, out.dtype)
        cv.kern(part, cv.load(t, shape), "stack", src_dtype=cv.dtype_of(t))
    return out


@rule("repeat")
def _repeat(cv, args, kwargs, meta, node):
    x, reps = args[0], list(args[1])
    out = cv.temp(meta)
    nd = len(reps)
    xs = (1,) * (nd - x.ndim) + tuple(x.shape)
    xst = (0,) * (nd - x.ndim) + tuple(x.strides)
    # view out as (r0, n0, r1, n1, ...): each x dim repeated
    shape, ostr, istr = [], [], []
    for r, n, s, os_ in zip(reps, xs, xst, out.strides):
        shape += [r, n]
        ostr += [os_ * n, os_]
        istr += [0, s]
    part = TV(out.buf, out.off, tuple(shape), tuple(ostr), out.dtype)
    cv.kern(part, ("ld", Ld(x.buf, x.off, tuple(istr), x.dtype)), "repeat")
    return out


@rule("arange")
def _arange(cv, args, kwargs, meta, node):
    nums = [a for a in args if isinstance(a, (int, float))]
    start, step = (0, 1)
    if len(nums) >= 2:
        start = nums[0]
    if len(nums) >= 3:
        step = nums[2]
    step = kwargs.get("step", step)
    out = cv.temp(meta)
    cv.kern(out, mk("add", C(start), mk("mul", ("iota", 0), C(step))), "arange")
    return out


@rule("one_hot")
def _one_hot(cv, args, kwargs, meta, node):
    idx = args[0]
    out = cv.temp(meta)
    shape = out.shape
    e = mk("eq", cv.load(TV(idx.buf, idx.off, shape[:-1] + (1,), idx.strides + (0,), idx.dtype), shape),
           ("iota", len(shape) - 1))
    cv.kern(out, e, "one_hot")
    return out


@rule("tril", "triu")
def _tri(cv, args, kwargs, meta, node):
    raise Declined("tril/triu are not taken by the compiled kernel")


# ---- random draws ---------------------------------------------------------------------------------------------------
def _generator(cv, g):
    if g is None:
        return None
    if id(g) not in cv.tr.generators:
        raise Declined(f"{cv.who}'s learn draws from a torch.Generator that is not one of its attributes, which a "
                       "compiled phase could not draw from")
    return cv.tr.generators[id(g)]


@rule("randn", "rand", "randn_like", "rand_like", "normal", "normal_", "uniform", "uniform_", "bernoulli",
      "bernoulli_", "exponential_", "randint", "randint_like", "random_")
def _draw(cv, args, kwargs, meta, node):
    name = opname(node.target)
    gen = _generator(cv, kwargs.get("generator"))
    if name in ("randn", "randn_like"):
        fn, params = "normal", (0.0, 1.0)
    elif name in ("rand", "rand_like"):
        fn, params = "uniform", (0.0, 1.0)
    elif name in ("normal", "normal_"):
        mean = args[1] if len(args) > 1 else kwargs.get("mean", 0.0)
        std = args[2] if len(args) > 2 else kwargs.get("std", 1.0)
        if isinstance(mean, (TV, Const)) or isinstance(std, (TV, Const)):
            raise Declined(f"{cv.who}'s learn draws torch.normal with tensor parameters; draw torch.randn and scale it")
        fn, params = "normal", (float(mean), float(std))
    elif name in ("uniform", "uniform_"):
        fn, params = "uniform", (float(args[1] if len(args) > 1 else kwargs.get("from", 0.0)),
                                 float(args[2] if len(args) > 2 else kwargs.get("to", 1.0)))
    elif name in ("bernoulli", "bernoulli_"):
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        if isinstance(p, (TV, Const)) or name == "bernoulli":
            raise Declined(f"{cv.who}'s learn draws bernoulli with probabilities it computes, which depend on the "
                           "phase's values")
        fn, params = "bernoulli", (float(p),)
    elif name == "exponential_":
        fn, params = "exponential", (float(args[1] if len(args) > 1 else kwargs.get("lambd", 1.0)),)
    else:
        raise Declined(f"{cv.who}'s learn draws {name}, which the compiled kernel does not take")
    shape, dt = tuple(meta.shape), meta.dtype
    b = cv.buf("draw", dt, max(1, int(np.prod(shape))))
    out = TV(b, 0, shape, tuple(torch.empty(shape).stride()) if shape else (), dt)
    d = Draw(out, fn, params, gen, what=name)
    cv.bufs[b].info = d
    cv.emit(d)
    if name.endswith("_"):   # in place into an existing tensor: copy the draw there
        target = args[0]
        cv.kern(target, cv.load(out, target.shape), name)
        return target
    return out


# ---- the optimizers' fused step ------------------------------------------------------------------------------------
@rule("_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw")
def _fused_adam(cv, args, kwargs, meta, node):
    name = opname(node.target)
    params, grads, m1, m2, vmax, steps = args[:6]
    amsgrad = bool(kwargs.get("amsgrad", False))
    maximize = bool(kwargs.get("maximize", False))
    if kwargs.get("grad_scale") is not None or kwargs.get("found_inf") is not None:
        raise Declined("a fused Adam with a gradient scaler is not taken by the compiled kernel")
    node_params = node.args[0]
    ids = tuple(id(getattr(cv.tr.gm, p.target)) for p in node_params if p.op == "get_attr")
    where = cv.tr.optim_groups.get(ids)
    if where is None:
        raise Declined(f"{cv.who}'s learn steps a fused Adam over parameters that are not one param group of an "
                       "optimizer it holds")
    slot = len(cv.rconst)
    cv.rconst.append(("group", where[0], where[1]))   # lr, beta1, beta2, weight_decay, eps from the group
    lr, b1, b2, wd, eps = (("rc", slot + i) for i in range(5))
    cv.rconst.extend([None] * 4)
    adamw = "adamw" in name
    for i, p in enumerate(params):
        g, m, v, st = grads[i], m1[i], m2[i], steps[i]
        # the step's scalars (torch's fused CPU kernel: bias corrections from the step count in float64)
        sc = cv.temp_like_shape((3,), torch.float64)
        stl = cv.load(st, ())
        outs = []
        for j, e in enumerate((mk("div", lr, mk("sub", C(1), mk("pow", b1, stl))),
                               mk("sqrt", mk("sub", C(1), mk("pow", b2, stl))),
                               mk("mul", lr, wd))):
            outs.append(Out(sc.buf, sc.off + j, (), torch.float64, e))
        cv.emit(Kern((), outs, what="adam scalars"))
        scv = TV(sc.buf, sc.off, (3,), (1,), torch.float64)
        if all(isinstance(t, TV) and _dense(t) and t.numel == p.numel and t.dtype == torch.float32
               for t in (p, g, m, v) + ((vmax[i],) if amsgrad else ())):
            cv.emit(Adam(p, g, m, v, vmax[i] if amsgrad else None, scv, slot, adamw, amsgrad, maximize))
            continue
        shape = p.shape
        step_size = cv.load(TV(sc.buf, sc.off, (), (), torch.float64), shape)
        bc2s = cv.load(TV(sc.buf, sc.off + 1, (), (), torch.float64), shape)
        lrwd = cv.load(TV(sc.buf, sc.off + 2, (), (), torch.float64), shape)
        ge = cv.load(g, shape)
        pe = cv.load(p, shape)
        if maximize:
            ge = mk("neg", ge)
        if adamw:
            pe = mk("where", mk("ne", wd, C(0)), mk("sub", pe, mk("mul", lrwd, pe)), pe)
        else:
            ge = mk("where", mk("ne", wd, C(0)), mk("add", ge, mk("mul", pe, wd)), ge)
        me = _lerp(cv.load(m, shape), ge, mk("sub", C(1), b1))
        ve = mk("add", mk("mul", cv.load(v, shape), b2), mk("mul", mk("sub", C(1), b2), mk("mul", ge, ge)))
        outs = [Out(m.buf, m.off, bstrides(m, shape), m.dtype, me), Out(v.buf, v.off, bstrides(v, shape), v.dtype, ve)]
        vv = ve
        if amsgrad:
            mx = vmax[i]
            vv = mk("max", cv.load(mx, shape), ve)
            outs.append(Out(mx.buf, mx.off, bstrides(mx, shape), mx.dtype, vv))
        denom = mk("add", mk("div", mk("sqrt", vv), bc2s), eps)
        pn = mk("sub", pe, mk("div", mk("mul", step_size, me), denom))
        outs.append(Out(p.buf, p.off, bstrides(p, shape), p.dtype, pn))
        cv.emit(Kern(shape, outs, what="adam"))
    return None


def _dense(t: TV) -> bool:
    """The view covers one contiguous span of its buffer in row-major order."""
    acc = 1
    for n, st in reversed(list(zip(t.shape, t.strides))):
        if n != 1 and st != acc:
            return False
        acc *= n
    return True


# ---- foreach: the op per tensor ---------------------------------------------------------------------------------------
def _foreach(cv, args, kwargs, meta, node):
    name = opname(node.target)
    base = name[len("_foreach_"):]
    inplace = base.endswith("_")
    lists = [a for a in args if isinstance(a, (list, tuple))]
    n = len(lists[0])
    outs = []
    for i in range(n):
        one = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
        m = meta[i] if isinstance(meta, (list, tuple)) and meta else None
        if base.rstrip("_") == "norm":
            x = one[0]
            ord_ = one[1] if len(one) > 1 else 2
            outs.append(_vector_norm(cv, x, float(ord_), list(range(x.ndim)), False, m))
            continue
        rule_ = RULES.get(base)
        if rule_ is None:
            raise Declined(f"{cv.who}'s learn uses aten.{name}, which the compiled kernel has no lowering for")

        class _Fake:   # the per-tensor node: the op's packet (the rules read its name only)
            target = getattr(aten, base)
        outs.append(rule_(cv, one, kwargs, m if not inplace else None, _Fake()))
    return None if inplace else outs


for _name in ("add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "addcmul", "addcmul_", "addcdiv",
              "addcdiv_", "lerp", "lerp_", "sqrt", "sqrt_", "neg", "neg_", "abs", "abs_", "exp", "exp_", "maximum",
              "maximum_", "minimum", "minimum_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "reciprocal",
              "reciprocal_", "sign", "sign_", "pow", "pow_", "zero_", "copy_", "norm"):
    RULES["_foreach_" + _name] = _foreach


def convert(tr: Trace) -> Converter:
    return Converter(tr).run()
