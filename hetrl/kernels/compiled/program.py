"""Lowering the IR (graph.py) into the VM's tables (vm.py): rows, fusion, blocks, segments, buffers, encoding.

1. *Rows.* The batch dimension is found by analysis: the inputs' rows (dim 1 of each (units, B, ...) field) mark
   their buffers; an operation whose iteration space reads or writes a marked buffer along its rows has that dim as
   its row dim, and marks the temporaries it writes. A matrix product is split over its rows when A's (or C's)
   rows are batch rows, over its columns when B's are; a product that sums over the rows (a weight's gradient,
   X^T G) and everything without rows is global.
2. *Fusion.* Elementwise passes and reductions over the same iteration space (and row dim) join one pass where moving
   them is legal (no operation in between reads or writes what they touch); a value stored and read again in the
   same pass with the same layout is forwarded as an expression, and a stored temporary nobody reads is dropped.
3. *Blocks.* An operation with a row dim runs as a fixed number of row blocks, `blocks(N)`, a function of the rows
   only (never of the threads); a reduction over the rows writes one partial per block, which a later pass sums in
   block order. Large global passes are split into fixed spans the same way, and a wide product over a batch of one
   row block into two fixed halves of its columns.
4. *Segments.* Every operation is placed, in graph order, in the earliest segment its dependencies allow: in the same
   segment (one job) as the row blocks it depends on where the dependency stays inside a block, after them
   otherwise. A segment's jobs are independent: its tasks (blocks, spans, serial lists) run in any order and on any
   lane.
5. *Buffers.* Temporaries get offsets in one arena, reused across segments where their lifetimes do not meet.
6. *Encoding.* Passes become EXPR instructions (the iteration space collapsed to at most 4 dims, expressions as
   register code with registers reused), products GEMM instructions (transposed operands folded; a layout BLAS
   cannot read is copied first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from hetrl.kernels.compiled import vm
from hetrl.kernels.compiled.graph import MM, TV, Adam, Buf, Const, Converter, Draw, Kern, Ld, Out, bstrides, mk
from hetrl.kernels.compiled.trace import Declined

# Row blocks: the fewer, the larger the products (a 256-row product in 8 blocks of 32 rows ran at 0.80x (MKL) and
# 0.62x (OpenBLAS) of one 256-row product on one thread of an AVX2 EPYC, in 2 blocks at 0.92x and 0.98x; a 64-row
# batch in one block, not two, made DQN's phase 1.1x faster); the more, the finer two lanes share the rows
BLOCK_ROWS = 64          # a row block has at least this many rows
BLOCKS = (2, 4)          # and there are at most this many blocks: below 512 rows, from 512 rows
SPAN = 1 << 15           # elements per span of a large global pass
BIG = 1 << 15            # a global pass of at least this many elements is split into spans
GEMM_CHUNK = 64          # output rows (or columns) per task of a global matrix product
ALIGN = 64               # bytes: arena offsets
COLUMN_HALVES = True     # a wide product over a batch of one row block runs in two halves of its columns
COLUMN_HALF = 128        # columns of a half, at least
JOB_SLABS = True         # temporaries living inside one row job share memory in the job's order (Encoder._job_slabs)

DTYPES = {torch.float32: vm.DT_F32, torch.float64: vm.DT_F64, torch.int64: vm.DT_I64, torch.int32: vm.DT_I32,
          torch.uint8: vm.DT_U8, torch.bool: vm.DT_BOOL, torch.int8: vm.DT_I8, torch.int16: vm.DT_I16}
MODES = {"store": vm.M_STORE, "add": vm.M_ADD, "sum": vm.M_SUM, "max": vm.M_MAX, "min": vm.M_MIN,
         "prod": vm.M_PROD, "argmax": vm.M_ARGMAX, "argmin": vm.M_ARGMIN}
REDUCE = ("sum", "max", "min", "prod")


def blocks(n: int) -> int:
    """The fixed number of blocks n rows are split into (whatever the number of threads)."""
    return max(1, min(BLOCKS[0] if n < 512 else BLOCKS[1], n // BLOCK_ROWS))


def spans(n: int) -> int:
    return max(1, -(-n // SPAN))


# ---- accesses ------------------------------------------------------------------------------------------------------
def loads_of(e, out: list) -> list:
    """Every Ld in expression e (index expressions included)."""
    if e[0] == "ld":
        out.append(e[1])
        for ie, _ in e[1].index:
            loads_of(ie, out)
    elif e[0] not in ("c", "rc", "iota"):
        for a in e[1:]:
            loads_of(a, out)
    return out


def _loads_once(e) -> list:
    """Every Ld in expression e, each shared subexpression walked once (an inlined producer is one tuple referred
    to from every place it is read: a walk of the tree would visit it once per path)."""
    out, seen, stack = [], set(), [e]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x[0] == "ld":
            out.append(x[1])
            stack.extend(ie for ie, _ in x[1].index)
        elif x[0] not in ("c", "rc", "iota"):
            stack.extend(x[1:])
    return out


def extent(off, shape, strides) -> tuple[int, int]:
    lo = hi = off
    for n, s in zip(shape, strides):
        if n <= 0:
            return off, off
        if s > 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + 1


@dataclass
class Access:
    buf: int
    lo: int
    hi: int
    write: bool
    row: tuple | None = None     # (row stride, rows' inner [lo, hi) relative to a row's start) along the op's row dim


@dataclass
class Item:
    """A schedulable operation: a fused pass (Kern) or a product (MM)."""
    op: object
    seq: int
    rowdim: int = -1             # the iteration dim (Kern) or "M"/"N" split (MM: 0 rows of A, 1 columns of B)
    N: int = 0                   # rows (row space) or span extent
    kind: str = "serial"         # rows | serial | big
    accesses: list = field(default_factory=list)
    seg: int = -1
    job: int = -1
    partial: bool = False        # has partial outputs (one per block)
    most: int = 0                # a product's tasks, where fixed (else gemm_chunks)


class Lowering:
    def __init__(self, cv: Converter, units: int, batch: int):
        self.cv = cv
        self.bufs: list[Buf] = cv.bufs
        self.units = units
        self.B = batch
        self.layout: dict[int, tuple[int, int]] = {}     # buf -> (row stride, rows)
        self.alloc: dict[int, tuple] = {}               # temp buf -> (shape, strides) as allocated
        self.items: list[Item] = []
        self.draws = [op for op in cv.ops if isinstance(op, Draw)]
        self.keep: set[int] = set()                     # buffers that must hold their values after the unit
        self.outputs: list = []                         # [(kind, buf or value, TV)]

    # ---- 0. buffers' facts -------------------------------------------------------------------------------------------
    def setup(self):
        for b in self.bufs:
            if b.kind == "temp" and isinstance(b.info, tuple):
                self.alloc[b.id] = b.info
        for key, b in self.cv.inputs.items():
            buf = self.bufs[b]
            shape = self._input_shape(key)
            if len(shape) >= 2 and shape[1] == self.B:
                strides = _contig(shape)
                self.layout[b] = (strides[1], self.B)
        for b in self.bufs:
            if b.kind in ("state", "literal", "input", "draw"):
                self.keep.add(b.id)

    def _input_shape(self, key):
        for node in self.cv.tr.gm.graph.nodes:
            if node.op == "placeholder" and dict(self.cv.tr.inputs).get(key) == node.target:
                return tuple(node.meta["val"].shape)
        return ()

    # ---- 1. preprocessing: products BLAS can read, outputs --------------------------------------------------------------
    def prepare_ops(self) -> list:
        ops = []
        for op in self.cv.ops:
            if isinstance(op, Draw):
                continue
            if isinstance(op, MM):
                ops.extend(self._blas_ready(op))
            elif isinstance(op, Kern):
                ops.append(_squeezed(op))
            else:
                ops.append(op)
        return ops

    def _blas_ready(self, op: MM) -> list:
        """The product with operands a BLAS reads in place (row-major or transposed 2-D/3-D), copies where not, and C
        row-major (a transposed C is computed as C^T = B^T A^T)."""
        pre = []

        def fixed(tv: TV) -> TV:
            if _blas_ok(tv):
                return tv
            t = self.cv.temp_like_shape(tv.shape, tv.dtype)
            self.alloc[t.buf] = (t.shape, t.strides)
            pre.append(Kern(t.shape, [Out(t.buf, t.off, t.strides, t.dtype, ("ld", Ld(tv.buf, tv.off,
                                                                                        bstrides(tv, t.shape),
                                                                                        tv.dtype)))],
                            seq=op.seq, what="operand copy"))
            return t
        for tv in (op.a, op.b, op.out):
            if tv.dtype != torch.float32:
                raise Declined(f"{self.cv.who}'s learn multiplies {tv.dtype} matrices; the compiled kernel multiplies "
                               "float32")
        a, b, out = fixed(op.a), fixed(op.b), op.out
        if not _row_major(out):
            if _row_major(_t(out)):
                a, b, out = _t(b), _t(a), _t(out)
            else:
                raise Declined(f"{self.cv.who}'s learn writes a product into a layout the compiled kernel cannot")
        return pre + [MM(out, a, b, op.alpha, op.beta, seq=op.seq, what=op.what)]

    # ---- 1b. peepholes: accumulate into zeroed gradients ----------------------------------------------------------------
    def simplify(self, ops: list) -> list:
        ops = self._fold_mm_accumulate(ops)
        ops = self._fold_zero(ops)
        ops = self._forward_copies(ops)
        ops = self._fold_grad_scale(ops)
        ops = self._inline_producers(ops)
        return ops

    def _inline_producers(self, ops):
        """A pass whose one output (a temporary) one later pass over the same space reads, element for element, is
        computed inside that pass instead (its expression in place of the load): a relu's mask is not stored by the
        forward to be loaded by the backward, an intermediate of a loss is not kept. Sweeps until none is left, the
        readers and writers kept up to date as passes are inlined (not found again after each: a graph of a few
        hundred passes made that quadratic, seconds)."""
        ops = list(ops)
        readers, writers = self._readers(ops), self._writers(ops)
        changed = True
        while changed:
            changed = False
            for i, op in enumerate(ops):
                if not isinstance(op, Kern) or len(op.outs) != 1:
                    continue
                o = op.outs[0]
                b = o.buf
                if o.mode != "store" or o.index or self.bufs[b].kind != "temp" or b in self.keep:
                    continue
                if len(writers.get(b, [])) != 1:
                    continue
                rs = readers.get(b, [])
                cons = {j for j, _ in rs}
                if len(cons) != 1:
                    continue
                j = cons.pop()
                c = ops[j]
                if j <= i or not isinstance(c, Kern) or tuple(c.shape) != tuple(op.shape):
                    continue
                if any(not isinstance(ld, Ld) or ld.index or (ld.off, tuple(ld.strides)) != (o.off, tuple(o.strides))
                       for _, ld in rs):
                    continue
                if any(any(ie[0] == "ld" and ie[1].buf == b for ie, _ in w.index) for w in c.outs):
                    continue
                # nothing between may write what the producer reads
                ins = _loads_once(o.expr)
                if any(self._touches_write(ops[k], ld.buf, *extent(ld.off, op.shape, ld.strides))
                       for k in range(i + 1, j) for ld in ins):
                    continue
                if any(self._writes_in(c, ld.buf, *extent(ld.off, op.shape, ld.strides)) for ld in ins):
                    continue
                expr = _cast_expr(o.expr, self.bufs[b].dtype, o.dtype)
                memo: dict = {}

                def sub(e):
                    k_ = id(e)
                    if k_ in memo:
                        return memo[k_]
                    if e[0] == "ld" and e[1].buf == b:
                        r = expr
                    elif e[0] in ("ld", "c", "rc", "iota"):
                        r = e
                    else:
                        r = (e[0], *[sub(x) for x in e[1:]])
                    memo[k_] = r
                    return r
                for w in c.outs:
                    w.expr = sub(w.expr)
                ops[i] = None
                # the producer's reads are the consumer's now; b is read and written by no one
                for buf in {ld.buf for ld in ins}:
                    readers[buf] = [(k, x) for k, x in readers.get(buf, []) if k != i]
                for ld in ins:
                    readers[ld.buf].append((j, ld))
                readers.pop(b, None)
                writers.pop(b, None)
                changed = True
        return [x for x in ops if x is not None]

    def _touches_write(self, op, buf, lo, hi) -> bool:
        if op is None:
            return False
        if isinstance(op, MM):
            tv = op.out
            return tv.buf == buf and _overlap(extent(tv.off, tv.shape, tv.strides), (lo, hi))
        if isinstance(op, Adam):
            return any(tv.buf == buf and _overlap(extent(tv.off, tv.shape, tv.strides), (lo, hi))
                       for tv in _adam_tvs(op, writes=True))
        return self._writes_in(op, buf, lo, hi)

    @staticmethod
    def _writes_in(op: Kern, buf, lo, hi) -> bool:
        for w in op.outs:
            if w.buf == buf and (w.index or _overlap(extent(w.off, op.shape, w.strides), (lo, hi))):
                return True
        return False

    def _fold_grad_scale(self, ops):
        """g = g * c (c one value: a clip's factor) right before Adam's step over g -> Adam scales g itself."""
        for i, op in enumerate(ops):
            if not isinstance(op, Adam) or op.scale is not None:
                continue
            g = op.g
            glo, ghi = extent(g.off, g.shape, g.strides)
            for j in range(i - 1, -1, -1):
                k = ops[j]
                if k is None:
                    continue
                scale = self._scale_of(k, g, glo, ghi) if isinstance(k, Kern) and len(k.outs) == 1 else None
                if scale is not None:
                    op.scale = scale
                    ops[j] = None
                    break
                if self._touches(k, g.buf, glo, ghi):
                    break
        return [op for op in ops if op is not None]

    def _scale_of(self, k: Kern, g: TV, glo, ghi):
        """The one value c where k is g = g * c over exactly g's elements, else None."""
        o = k.outs[0]
        e = o.expr
        if o.buf != g.buf or extent(o.off, k.shape, o.strides) != (glo, ghi) or o.mode != "store" or o.index \
                or e[0] != "mul" or (int(np.prod(k.shape)) if k.shape else 1) != g.numel:
            return None
        mine = [x for x in e[1:] if x[0] == "ld" and x[1].buf == g.buf]
        other = [x for x in e[1:] if not (x[0] == "ld" and x[1].buf == g.buf)]
        if len(mine) != 1 or len(other) != 1 or other[0][0] != "ld" or any(other[0][1].strides) \
                or other[0][1].index or (mine[0][1].off, mine[0][1].strides) != (o.off, o.strides):
            return None
        c = other[0][1]
        return TV(c.buf, c.off, (), (), c.dtype)

    def _readers(self, ops):
        """buf -> [(op index, Ld or MM operand)] of every read."""
        out: dict[int, list] = {}
        for i, op in enumerate(ops):
            if isinstance(op, MM):
                for tv in (op.a, op.b) + ((op.out,) if op.beta else ()):
                    out.setdefault(tv.buf, []).append((i, tv))
            elif isinstance(op, Adam):
                for tv in _adam_tvs(op):
                    out.setdefault(tv.buf, []).append((i, tv))
            else:
                for o in op.outs:
                    for ld in loads_of(o.expr, []) + [l for ie, _ in o.index for l in loads_of(ie, [])]:
                        out.setdefault(ld.buf, []).append((i, ld))
        return out

    def _writers(self, ops):
        out: dict[int, list] = {}
        for i, op in enumerate(ops):
            if isinstance(op, MM):
                out.setdefault(op.out.buf, []).append((i, op.out))
            elif isinstance(op, Adam):
                for tv in _adam_tvs(op, writes=True):
                    out.setdefault(tv.buf, []).append((i, tv))
            else:
                for o in op.outs:
                    out.setdefault(o.buf, []).append((i, o))
        return out

    def _fold_mm_accumulate(self, ops):
        """MM(T) then X = X + T (T read nowhere else) -> MM(X, beta=1): a gradient's product accumulates into the
        gradient buffer in the GEMM."""
        readers, writers = self._readers(ops), self._writers(ops)
        drop = set()
        for i, op in enumerate(ops):
            if not isinstance(op, Kern) or len(op.outs) != 1:
                continue
            o = op.outs[0]
            e = o.expr
            if o.mode != "store" or o.index or e[0] != "add" or o.dtype != torch.float32:
                continue
            for mine, other in ((e[1], e[2]), (e[2], e[1])):
                if mine[0] != "ld" or other[0] != "ld":
                    continue
                lx, lt = mine[1], other[1]
                if (lx.buf, lx.off, lx.strides) != (o.buf, o.off, o.strides) or lt.index or lx.index:
                    continue
                w = writers.get(lt.buf, [])
                if len(w) != 1 or not isinstance(ops[w[0][0]], MM) or len(readers.get(lt.buf, [])) != 1:
                    continue
                j, tvm = w[0]
                mm_ = ops[j]
                if mm_ is None or mm_.beta != 0 or j in drop:
                    continue
                shape = op.shape
                xlo, xhi = extent(o.off, shape, o.strides)
                if any(self._touches(ops[k], o.buf, xlo, xhi) for k in range(j + 1, i)):
                    continue
                if tuple(mm_.out.shape) != tuple(shape) or mm_.out.ndim != 2:
                    continue
                x = TV(o.buf, o.off, tuple(shape), tuple(o.strides), o.dtype)
                if tuple(lt.strides) == tuple(bstrides(mm_.out, shape)) and lt.off == mm_.out.off:
                    new = MM(x, mm_.a, mm_.b, mm_.alpha, 1.0, seq=mm_.seq, what=mm_.what)
                else:
                    continue
                if not _row_major(new.out):
                    if _row_major(_t(new.out)):
                        new = MM(_t(new.out), _t(new.b), _t(new.a), new.alpha, 1.0, seq=new.seq, what=new.what)
                    else:
                        continue
                ops[j] = None
                ops[i] = new
                drop.add(j)
                break
        return [op for op in ops if op is not None]

    def _touches(self, op, buf, lo=None, hi=None) -> bool:
        """Whether op reads or writes buf (in [lo, hi) where given)."""
        if op is None:
            return False

        def hit(b, rng):
            return b == buf and (lo is None or (rng[0] < hi and lo < rng[1]))
        if isinstance(op, MM):
            return any(hit(tv.buf, extent(tv.off, tv.shape, tv.strides)) for tv in (op.a, op.b, op.out))
        if isinstance(op, Adam):
            return any(hit(tv.buf, extent(tv.off, tv.shape, tv.strides)) for tv in _adam_tvs(op))
        for o in op.outs:
            if hit(o.buf, (0, 1 << 62) if o.index else extent(o.off, op.shape, o.strides)):
                return True
            for ld in loads_of(o.expr, []) + [l for ie, _ in o.index for l in loads_of(ie, [])]:
                if hit(ld.buf, (0, 1 << 62) if ld.index else extent(ld.off, op.shape, ld.strides)):
                    return True
        return False

    def _fold_zero(self, ops):
        """X = 0, then every part of X accumulated into once before any read -> each accumulation a plain write (the
        gradient buffer zeroed before a backward, and the backward's += into it)."""
        i = 0
        while i < len(ops):
            op = ops[i]
            if isinstance(op, Kern) and len(op.outs) == 1 and op.outs[0].expr == ("c", 0.0) \
                    and op.outs[0].mode == "store" and not op.outs[0].index:
                z = op.outs[0]
                lo, hi = extent(z.off, op.shape, z.strides)
                if hi - lo == (int(np.prod(op.shape)) if op.shape else 1):   # dense
                    plan = self._zero_cover(ops, i, z.buf, lo, hi)
                    if plan is not None:
                        for k, kind in plan:
                            if kind == "mm":
                                m = ops[k]
                                ops[k] = MM(m.out, m.a, m.b, m.alpha, 0.0, seq=m.seq, what=m.what)
                            else:
                                o = ops[k].outs[0]
                                e = o.expr
                                o.expr = e[2] if e[1][0] == "ld" and e[1][1].buf == z.buf else e[1]
                        del ops[i]
                        continue
            i += 1
        return ops

    def _zero_cover(self, ops, i, buf, lo, hi):
        covered, plan = [], []
        for k in range(i + 1, len(ops)):
            op = ops[k]
            if not self._touches(op, buf):
                continue
            if isinstance(op, MM) and op.out.buf == buf and op.beta == 1.0 and op.a.buf != buf and op.b.buf != buf:
                a, b = extent(op.out.off, op.out.shape, op.out.strides)
                if (hi - lo) and a >= lo and b <= hi and op.out.numel == b - a and \
                        all(b <= c0 or d0 <= a for c0, d0 in covered):
                    covered.append((a, b))
                    plan.append((k, "mm"))
                else:
                    return None
            elif isinstance(op, Kern) and len(op.outs) == 1 and op.outs[0].buf == buf:
                o = op.outs[0]
                e = o.expr
                a, b = extent(o.off, op.shape, o.strides)
                n = int(np.prod(op.shape)) if op.shape else 1
                ok = (o.mode == "store" and not o.index and e[0] == "add" and a >= lo and b <= hi and b - a == n
                      and all(b <= c0 or d0 <= a for c0, d0 in covered))
                if ok:
                    mine = [x for x in e[1:] if x[0] == "ld" and x[1].buf == buf]
                    other = [x for x in e[1:] if not (x[0] == "ld" and x[1].buf == buf)]
                    ok = len(mine) == 1 and len(other) == 1 and not mine[0][1].index and \
                        (mine[0][1].off, mine[0][1].strides) == (o.off, o.strides) and \
                        not any(ld.buf == buf for ld in loads_of(other[0], []))
                if not ok:
                    return None
                covered.append((a, b))
                plan.append((k, "kern"))
            else:
                return None
            if sum(d0 - c0 for c0, d0 in covered) == hi - lo:
                return plan
        return None

    def _forward_copies(self, ops):
        """X = S (a plain copy, same element at every point) where S is a temporary written by one output and read
        only here -> that output writes X (a reduction's combine into the gradient it sums, a cat's part)."""
        readers, writers = self._readers(ops), self._writers(ops)
        for i, op in enumerate(ops):
            if not isinstance(op, Kern) or len(op.outs) != 1:
                continue
            o = op.outs[0]
            if o.mode != "store" or o.index or o.expr[0] != "ld" or o.expr[1].index:
                continue
            ld = o.expr[1]
            sb = self.bufs[ld.buf]
            if sb.kind != "temp" or ld.buf in self.keep or sb.dtype != o.dtype:
                continue
            w, r = writers.get(ld.buf, []), readers.get(ld.buf, [])
            if len(w) != 1 or len(r) != 1 or not isinstance(ops[w[0][0]], Kern):
                continue
            j, src = w[0]
            if j >= i or src.index or ops[j] is None:
                continue
            pop = ops[j]
            # the copy maps S to X by a shift (the same strides over the copy's space): the producer writes X there
            if tuple(ld.strides) != tuple(o.strides):
                continue
            slo, shi = extent(src.off, pop.shape, src.strides)
            clo, chi = extent(ld.off, op.shape, ld.strides)
            n_copy = int(np.prod(op.shape)) if op.shape else 1
            if (slo, shi) != (clo, chi) or chi - clo != n_copy:
                continue
            xlo, xhi = extent(o.off, op.shape, o.strides)
            if any(self._touches(ops[k], o.buf, xlo, xhi) for k in range(j + 1, i)):
                continue
            if self._touches(pop, o.buf, xlo, xhi):
                continue
            src.buf, src.off, src.dtype = o.buf, src.off - ld.off + o.off, o.dtype
            ops[i] = None
        return [op for op in ops if op is not None]

    # ---- 2. rows -----------------------------------------------------------------------------------------------------
    def _mark(self, buf, strides, shape) -> list[int]:
        lay = self.layout.get(buf)
        if lay is None:
            return []
        rs, R = lay
        return [d for d, (n, s) in enumerate(zip(shape, strides)) if n > 1 and s == rs and n <= R]

    def rows_of(self, op) -> tuple[int, int]:
        """(row dim, rows) of an op, or (-1, 0)."""
        if isinstance(op, Adam):
            return -1, 0
        if isinstance(op, MM):
            if op.out.ndim != 2:
                return -1, 0
            M, N = op.out.shape
            am = self._mark(op.a.buf, op.a.strides, op.a.shape)
            bm = self._mark(op.b.buf, op.b.strides, op.b.shape)
            om = self._mark(op.out.buf, op.out.strides, op.out.shape)
            if 1 in am and 0 in bm:
                return -1, 0     # sums over the rows
            if (0 in am or 0 in om) and not (1 in bm or 1 in om):
                return 0, M
            if (1 in bm or 1 in om) and not (0 in am or 0 in om):
                return 1, N
            return -1, 0
        marks = set()
        for o in op.outs:
            marks.update(self._mark(o.buf, o.strides, op.shape))
            for ld in loads_of(o.expr, []):
                marks.update(self._mark(ld.buf, ld.strides, op.shape))
            for ie, _ in o.index:
                for ld in loads_of(ie, []):
                    marks.update(self._mark(ld.buf, ld.strides, op.shape))
        if len(marks) != 1:
            return -1, 0
        d = marks.pop()
        for o in op.outs:   # a store every block would make: not row-blocked
            if o.strides[d] == 0 and o.mode == "store":
                return -1, 0
            if o.strides[d] == 0 and o.mode in ("argmax", "argmin"):
                return -1, 0
            if o.index and o.strides[d] == 0:
                return -1, 0
        return d, op.shape[d]

    def set_layouts(self, op, d):
        """Mark the temporaries (and draws) op reads or writes along its row dim d: a buffer read along the rows of an
        op has those rows too (its writer, a fill or a draw without rows of its own, follows on the next pass)."""
        if isinstance(op, MM):
            for tv, dd in ((op.a, 0), (op.out, 0)) if d == 0 else ((op.b, 1), (op.out, 1)):
                self._layout_temp(tv.buf, tv.strides[dd])
            return
        for o in op.outs:
            if o.strides[d] != 0:
                self._layout_temp(o.buf, o.strides[d])
            for ld in loads_of(o.expr, []) + [l for ie, _ in o.index for l in loads_of(ie, [])]:
                if ld.strides[d] != 0:
                    self._layout_temp(ld.buf, ld.strides[d])

    def _layout_temp(self, buf, s):
        b = self.bufs[buf]
        if buf in self.layout or b.kind not in ("temp", "draw") or s <= 0:
            return
        if b.kind == "draw":
            shape, strides = b.info.out.shape, b.info.out.strides
        else:
            shape, strides = self.alloc.get(buf, ((), ()))
        R = [n for n, st in zip(shape, strides) if st == s and n > 1]
        if R and R[0] == self.B or R and R[0] % self.B == 0:
            self.layout[buf] = (s, R[0])

    # ---- 3. fusion -----------------------------------------------------------------------------------------------------
    def analyze_rows(self, ops: list) -> None:
        """Every op's row dim, to a fixpoint: a temporary first written without rows (a fill) takes the rows of a
        later writer, and its readers and writer follow on the next pass."""
        self.rows: dict[int, tuple[int, int]] = {}
        for _ in range(4):
            before = dict(self.layout)
            for op in ops:
                d, N = self.rows_of(op)
                self.rows[id(op)] = (d, N)
                if d >= 0:
                    self.set_layouts(op, d)
            if self.layout == before:
                break

    def fuse(self, ops: list) -> list:
        self.analyze_rows(ops)
        placed: list = []            # Items in order
        for op in ops:
            d, N = self.rows[id(op)]
            it = Item(op, op.seq, d, N)
            it.accesses = self.accesses(op, d)
            if isinstance(op, Kern):
                host = self._fusion_host(placed, it)
                if host is not None:
                    self._merge(host, it)
                    continue
            placed.append(it)
        return placed

    def _fusion_host(self, placed, it: Item):
        op = it.op
        if any(o.mode in ("argmax", "argmin") for o in op.outs):
            return None
        window = 16
        for k in range(len(placed) - 1, max(-1, len(placed) - 1 - window), -1):
            g = placed[k]
            if not isinstance(g.op, Kern) or g.op.shape != op.shape or g.rowdim != it.rowdim:
                continue
            if any(o.mode in ("argmax", "argmin") for o in g.op.outs):
                continue
            if self._can_join(g, it, placed[k + 1:]):
                return g
            # a conflict with this group: an earlier group is farther away still
            if self._conflicts(g.accesses, it.accesses):
                return None
        return None

    def _can_join(self, g: Item, it: Item, between: list) -> bool:
        for x in between:
            if self._conflicts(x.accesses, it.accesses):
                return False
        for a in it.accesses:
            for b in g.accesses:
                if a.buf != b.buf or a.hi <= b.lo or b.hi <= a.lo or not (a.write or b.write):
                    continue
                if not self._same_elements(g, it, a.buf):
                    return False
        # a read of the group's output must be an elementwise read of a plain store (forwarded)
        for o in it.op.outs:
            for ld in loads_of(o.expr, []) + [l for ie, _ in o.index for l in loads_of(ie, [])]:
                for w in g.op.outs:
                    if w.buf == ld.buf and _overlap(extent(w.off, g.op.shape, w.strides),
                                                    extent(ld.off, it.op.shape, ld.strides)):
                        if w.mode != "store" or w.index or ld.index or (w.off, w.strides) != (ld.off, ld.strides):
                            return False
        return True

    def _same_elements(self, g: Item, it: Item, buf) -> bool:
        """Every access of buf in g and it touches the same element at each iteration point (one layout)."""
        pats = set()
        for op in (g.op, it.op):
            for o in op.outs:
                if o.buf == buf:
                    if o.index or o.mode not in ("store",):
                        return False
                    pats.add((o.off, o.strides))
                for ld in loads_of(o.expr, []) + [l for ie, _ in o.index for l in loads_of(ie, [])]:
                    if ld.buf == buf:
                        if ld.index:
                            return False
                        pats.add((ld.off, ld.strides))
        return len(pats) == 1

    def _merge(self, g: Item, it: Item) -> None:
        """it joins g: its loads of g's stores become g's expressions."""
        stores = {(o.buf, o.off, o.strides): o.expr for o in g.op.outs if o.mode == "store" and not o.index}
        memo: dict = {}

        def sub(e):
            k = id(e)
            if k in memo:
                return memo[k]
            if e[0] == "ld":
                ld = e[1]
                if not ld.index and (ld.buf, ld.off, ld.strides) in stores:
                    r = stores[(ld.buf, ld.off, ld.strides)]
                    r = _cast_expr(r, self.bufs[ld.buf].dtype, ld.dtype)
                else:
                    r = ("ld", Ld(ld.buf, ld.off, ld.strides, ld.dtype, tuple((sub(ie), s) for ie, s in ld.index))) \
                        if ld.index else e
            elif e[0] in ("c", "rc", "iota"):
                r = e
            else:
                r = (e[0], *[sub(a) for a in e[1:]])
            memo[k] = r
            return r
        for o in it.op.outs:
            o.expr = sub(o.expr)
            o.index = tuple((sub(ie), s) for ie, s in o.index)
            # a later store of the same location replaces the earlier one
            for w in list(g.op.outs):
                if (w.buf, w.off, w.strides) == (o.buf, o.off, o.strides) and w.mode == "store" and o.mode == "store" \
                        and not w.index and not o.index:
                    g.op.outs.remove(w)
            g.op.outs.append(o)
        g.accesses = self.accesses(g.op, g.rowdim)

    def accesses(self, op, d) -> list[Access]:
        out = []
        if isinstance(op, Adam):
            writes = {id(t) for t in _adam_tvs(op, writes=True)}
            for tv in _adam_tvs(op):
                out.append(Access(tv.buf, *extent(tv.off, tv.shape, tv.strides), False))
            for tv in _adam_tvs(op, writes=True):
                out.append(Access(tv.buf, *extent(tv.off, tv.shape, tv.strides), True))
            del writes
            return out
        if isinstance(op, MM):
            rowdims = {0: {"a": 0, "out": 0}, 1: {"b": 1, "out": 1}}.get(d, {})
            for name, tv, w in (("a", op.a, False), ("b", op.b, False), ("out", op.out, True)):
                lo, hi = extent(tv.off, tv.shape, tv.strides)
                row = _row_info(tv.off, tv.shape, tv.strides, rowdims[name]) if name in rowdims else None
                out.append(Access(tv.buf, lo, hi, w, row))
            if op.beta:
                out.append(Access(op.out.buf, *extent(op.out.off, op.out.shape, op.out.strides), False,
                                  out[-1].row))
            return out
        for o in op.outs:
            for ld in loads_of(o.expr, []) + [l for ie, _ in o.index for l in loads_of(ie, [])]:
                if ld.index:
                    lo, hi = 0, self.bufs[ld.buf].numel
                    row = _row_info(ld.off, op.shape, ld.strides, d) if d >= 0 and ld.strides[d] else None
                    if row is not None:   # a gather inside each row: the row's whole extent
                        row = (row[0], ld.off, ld.off + row[0])
                else:
                    lo, hi = extent(ld.off, op.shape, ld.strides)
                    row = _row_info(ld.off, op.shape, ld.strides, d) if d >= 0 else None
                out.append(Access(ld.buf, lo, hi, False, row))
            if o.index:
                lo, hi = 0, self.bufs[o.buf].numel
                row = _row_info(o.off, op.shape, o.strides, d) if d >= 0 and o.strides[d] else None
                if row is not None:
                    row = (row[0], o.off, o.off + row[0])
            else:
                lo, hi = extent(o.off, op.shape, o.strides)
                row = _row_info(o.off, op.shape, o.strides, d) if d >= 0 else None
            out.append(Access(o.buf, lo, hi, True, row))
            if o.mode == "add":
                out.append(Access(o.buf, lo, hi, False, row))
        return out

    @staticmethod
    def _conflicts(xs, ys) -> bool:
        for a in xs:
            for b in ys:
                if a.buf == b.buf and (a.write or b.write) and a.lo < b.hi and b.lo < a.hi:
                    return True
        return False

    # ---- 4. dead stores ---------------------------------------------------------------------------------------------------
    def drop_dead(self, items: list) -> list:
        """Drop stores of temporaries that no later pass or product reads (a pass's own loads read the memory as it
        was before the pass; the graph's outputs are kept)."""
        while True:
            last_read: dict[int, list] = {}
            for k, it in enumerate(items):
                for a in it.accesses:
                    if not a.write:
                        last_read.setdefault(a.buf, []).append((k, a.lo, a.hi))
            changed = False
            for k, it in enumerate(items):
                if not isinstance(it.op, Kern):
                    continue
                keep = []
                for o in it.op.outs:
                    b = o.buf
                    if b in self.keep or self.bufs[b].kind != "temp":
                        keep.append(o)
                        continue
                    lo, hi = extent(o.off, it.op.shape, o.strides) if not o.index else (0, self.bufs[b].numel)
                    if any(j > k and lo < h and l < hi for j, l, h in last_read.get(b, [])):
                        keep.append(o)
                    elif any(x.pair is o for x in it.op.outs):
                        keep.append(o)
                    elif o.mode in REDUCE + ("add",) and any(j == k and lo < h and l < hi
                                                             for j, l, h in last_read.get(b, [])):
                        keep.append(o)
                    else:
                        changed = True
                it.op.outs = keep
                it.accesses = self.accesses(it.op, it.rowdim)
            items = [it for it in items if not isinstance(it.op, Kern) or it.op.outs]
            if not changed:
                return items

    # ---- 5. kinds, partials ----------------------------------------------------------------------------------------------
    def classify(self, items: list) -> list:
        out = []
        for it in items:
            op = it.op
            if it.rowdim >= 0:
                it.kind = "rows"
                nb = blocks(it.N)
                if isinstance(op, Kern):
                    out.extend(self._partials(it, nb))
                    continue
                if COLUMN_HALVES and nb == 1 and isinstance(op, MM) and it.rowdim == 0 and op.out.ndim == 2 \
                        and op.out.shape[1] >= 2 * COLUMN_HALF:
                    # a batch of one row block: a wide product in two halves of its columns, a task each
                    it.kind, it.rowdim, it.N, it.most = "big", 1, op.out.shape[1], 2
                    it.accesses = self.accesses(op, 1)
                out.append(it)
                continue
            if isinstance(op, Adam):
                if op.p.numel >= BIG:
                    it.kind, it.rowdim, it.N = "big", 0, op.p.numel
                out.append(it)
                continue
            if isinstance(op, MM):
                M, N = op.out.shape[-2:]
                if M >= 2 * GEMM_CHUNK or N >= 4 * GEMM_CHUNK:
                    it.kind = "big"
                    it.rowdim = 0 if M >= 2 * GEMM_CHUNK else 1
                    it.N = M if it.rowdim == 0 else N
                out.append(it)
                continue
            n = int(np.prod(op.shape)) if op.shape else 1
            d = _span_dim(op)
            if n >= BIG and d >= 0:
                it.kind, it.rowdim, it.N = "big", d, op.shape[d]
                out.extend(self._partials(it, spans_of(it)))
                continue
            out.append(it)
        return out

    def _partials(self, it: Item, nb: int) -> list:
        """A pass reducing over its split dim writes one partial per block; a serial pass after it combines them in
        block order."""
        op, d = it.op, it.rowdim
        red = [o for o in op.outs if o.strides[d] == 0 and o.mode in REDUCE + ("add",) and not o.index]
        if not red:
            return [it]
        if nb == 1:
            return [it]
        combines = []
        for o in red:
            lo, hi = extent(o.off, op.shape, o.strides)
            size = hi - lo
            pdt = torch.float64 if o.dtype == torch.float64 else torch.float32 if o.dtype in (torch.float32,) \
                else o.dtype
            pb = self.cv.buf("temp", pdt, size * nb)
            self.alloc[pb] = ((nb, size), (size, 1))
            mode = "sum" if o.mode == "add" else o.mode
            part = Out(pb, o.off - lo, o.strides, pdt, o.expr, mode)
            part.bstride = size
            cstr = tuple(o.strides)
            # the combine's space: blocks x the output's region (reduced dims of op collapse to size 1)
            cshape = (nb,) + tuple(1 if s == 0 else n for n, s in zip(op.shape, o.strides))
            ld = Ld(pb, o.off - lo, (size,) + cstr, pdt)
            cout = Out(o.buf, o.off, (0,) + cstr, o.dtype, ("ld", ld), "sum" if o.mode in ("sum", "add") else o.mode)
            if o.mode == "add":   # accumulate into what is there: the blocks' sum, then added
                acc = self.cv.buf("temp", pdt, size)
                self.alloc[acc] = ((size,), (1,))
                cout = Out(acc, -lo + o.off, (0,) + cstr, pdt, ("ld", ld), "sum")
                k1 = Kern(cshape, [cout], seq=op.seq, what="combine")
                shape2 = tuple(1 if s == 0 else n for n, s in zip(op.shape, o.strides))
                e2 = mk("add", ("ld", Ld(o.buf, o.off, cstr, o.dtype)), ("ld", Ld(acc, o.off - lo, cstr, pdt)))
                k2 = Kern(shape2, [Out(o.buf, o.off, cstr, o.dtype, e2, "store")], seq=op.seq, what="combine add")
                combines += [k1, k2]
            else:
                combines.append(Kern(cshape, [cout], seq=op.seq, what="combine"))
            op.outs[op.outs.index(o)] = part
        it.partial = True
        it.accesses = self.accesses(op, d)
        out = [it]
        for k in combines:
            ci = Item(k, k.seq)
            ci.accesses = self.accesses(k, -1)
            n = int(np.prod(k.shape))
            if n >= BIG and _span_dim(k) > 0:
                ci.kind, ci.rowdim, ci.N = "big", _span_dim(k), k.shape[_span_dim(k)]
            out.append(ci)
        return out

    # ---- 6. segments ---------------------------------------------------------------------------------------------------
    def schedule(self, items: list):
        segs: list[list[list[Item]]] = []       # segment -> jobs -> items
        jobkind: list[list[tuple]] = []
        by_buf: dict[int, list[Item]] = {}
        byid = {id(it): it for it in items}
        for it in items:
            bound, share = 0, None
            deps = set()
            for a in it.accesses:
                for j in by_buf.get(a.buf, ()):
                    if j is it or id(j) in deps:
                        continue
                    if any(x.buf == a.buf and (x.write or a.write) and x.lo < a.hi and a.lo < x.hi
                           for x in j.accesses):
                        deps.add(id(j))
            dep_items = [byid[k] for k in deps]
            for j in dep_items:
                if self._shareable(it, j):
                    bound = max(bound, j.seg)
                else:
                    bound = max(bound, j.seg + 1)
            s = bound
            while True:
                if s == len(segs):
                    segs.append([])
                    jobkind.append([])
                conflicting = {j.job for j in dep_items if j.seg == s}
                if any(not self._shareable(it, j) for j in dep_items if j.seg == s):
                    s += 1
                    continue
                key = self._job_key(it)
                if len(conflicting) > 1:
                    s += 1
                    continue
                if conflicting:
                    jb = conflicting.pop()
                    if jobkind[s][jb] != key:
                        s += 1
                        continue
                else:
                    jb = next((k for k, kk in enumerate(jobkind[s]) if kk == key and key[0] != "big"), None)
                    if jb is None:
                        segs[s].append([])
                        jobkind[s].append(key)
                        jb = len(segs[s]) - 1
                segs[s][jb].append(it)
                it.seg, it.job = s, jb
                break
            for a in it.accesses:
                by_buf.setdefault(a.buf, []).append(it)
        return segs, jobkind

    def _job_key(self, it: Item):
        if it.kind == "rows":
            return ("rows", it.N)
        if it.kind == "big":
            return ("big", id(it))
        return ("serial",)

    def _shareable(self, it: Item, j: Item) -> bool:
        if it.kind == "serial" and j.kind == "serial":
            return True
        if it.kind != "rows" or j.kind != "rows" or it.N != j.N:
            return False
        for a in it.accesses:
            for b in j.accesses:
                if a.buf != b.buf or not (a.write or b.write) or a.hi <= b.lo or b.hi <= a.lo:
                    continue
                if a.row is None or b.row is None or a.row[0] != b.row[0] or a.row[0] <= 0:
                    return False
                # row i of one and row i of the other lie in one window of a row stride: block-local
                if max(a.row[2], b.row[2]) - min(a.row[1], b.row[1]) > a.row[0]:
                    return False
        return True


def _squeezed(op: Kern) -> Kern:
    """The pass over its space without size-1 dims (which step nowhere): one shape for the same elements, so that
    a view's added or dropped unit dims do not keep passes apart."""
    keep = [d for d, n in enumerate(op.shape) if n != 1]
    if len(keep) == len(op.shape):
        return op
    new = {d: k for k, d in enumerate(keep)}
    memo: dict = {}

    def st(strides):
        return tuple(strides[d] for d in keep)

    def sub(e):
        k = id(e)
        if k in memo:
            return memo[k]
        if e[0] == "ld":
            ld = e[1]
            r = ("ld", Ld(ld.buf, ld.off, st(ld.strides), ld.dtype, tuple((sub(ie), s) for ie, s in ld.index)))
        elif e[0] == "iota":
            r = ("iota", new[e[1]]) if e[1] in new else ("c", 0.0)
        elif e[0] in ("c", "rc"):
            r = e
        else:
            r = (e[0], *[sub(a) for a in e[1:]])
        memo[k] = r
        return r
    outs = []
    remap = {}
    for o in op.outs:
        n = Out(o.buf, o.off, st(o.strides), o.dtype, sub(o.expr), o.mode, tuple((sub(ie), s) for ie, s in o.index),
                new.get(o.dim, -1) if o.dim >= 0 else -1, None)
        if hasattr(o, "bstride"):
            n.bstride = o.bstride
        remap[id(o)] = n
        outs.append(n)
    for o, n in zip(op.outs, outs):
        if o.pair is not None:
            n.pair = remap[id(o.pair)]
    return Kern(tuple(op.shape[d] for d in keep), outs, seq=op.seq, what=op.what)


def _flops(op: MM) -> int:
    M, N = op.out.shape[-2:]
    return int(M) * int(N) * int(op.a.shape[-1]) * (op.out.shape[0] if op.out.ndim == 3 else 1)


def gemm_chunks(it: Item, products: list) -> int:
    """Tasks a global product is split into: one of more than a quarter of its segment's products' work is split in
    up to 4 (by its output rows or columns, at least GEMM_CHUNK each), so that two lanes share a segment evenly, and
    the others stay whole (a product split finer runs slower per FLOP); a fixed function of the program."""
    total = sum(_flops(p.op) for p in products) or 1
    want = -(-4 * _flops(it.op) // total)
    return max(1, min(4, want, it.N // GEMM_CHUNK))


def spans_of(it: Item) -> int:
    op = it.op
    n = int(np.prod(op.shape)) if op.shape else 1
    per = n // max(op.shape[it.rowdim], 1)
    return max(1, min(op.shape[it.rowdim], -(-n // SPAN))) if per else 1


def _span_dim(op) -> int:
    """The dim a large pass is split along: its first dim of size > 1."""
    for d, n in enumerate(op.shape):
        if n > 1:
            return d
    return -1


def _row_info(off, shape, strides, d):
    """(row stride, [lo, hi) of the elements of row 0) for an access along row dim d: row i is that window
    shifted by i row strides."""
    if d < 0 or d >= len(shape):
        return None
    rs = strides[d]
    lo = hi = off
    for k, (n, s) in enumerate(zip(shape, strides)):
        if k == d or n <= 1:
            continue
        if s > 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return (rs, lo, hi + 1)


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _contig(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _blas_ok(tv: TV) -> bool:
    """A 2-D (or batched 3-D) operand a BLAS reads in place: row-major or transposed (unit stride one way)."""
    if tv.ndim not in (2, 3):
        return False
    r, c = tv.shape[-2:]
    s0, s1 = tv.strides[-2:]
    if (c == 1 or s1 == 1) and (r == 1 or s0 >= c):
        return True
    if (r == 1 or s0 == 1) and (c == 1 or s1 >= r):
        return True
    return False


def _row_major(tv: TV) -> bool:
    r, c = tv.shape[-2:]
    s0, s1 = tv.strides[-2:]
    return (c == 1 or s1 == 1) and (r == 1 or s0 >= c)


def _t(tv: TV) -> TV:
    sh, st = list(tv.shape), list(tv.strides)
    sh[-2], sh[-1] = sh[-1], sh[-2]
    st[-2], st[-1] = st[-1], st[-2]
    return TV(tv.buf, tv.off, tuple(sh), tuple(st), tv.dtype)


def _cast_expr(e, src, dst):
    """A forwarded store read back as another dtype (a bool or integer store rounds)."""
    if src == dst:
        return e
    if src == torch.bool:
        return mk("ne", e, ("c", 0.0))
    if not src.is_floating_point:
        return mk("trunc", e)
    if src == torch.float32 and dst == torch.float64:
        return mk("f32", e)
    return e


# ---- the program -------------------------------------------------------------------------------------------------------
@dataclass
class Slot:
    """A storage the program addresses: kind state (info: path, nbytes), input (batch key), draw (Draw), literal
    (array), arena, out (output index; per unit or the last unit's)."""
    kind: str
    dtype: torch.dtype
    numel: int                     # elements (per unit for inputs, draws and per-unit outputs)
    info: object = None
    per_unit: bool = False


@dataclass
class Program:
    INS: np.ndarray
    OPD: np.ndarray
    CODE: np.ndarray
    CST: np.ndarray
    F: np.ndarray
    TASKS: np.ndarray
    SEGSTART: np.ndarray
    slots: list
    arena_bytes: int
    nregs: int
    rconst: list                    # the runtime constants' sources (graph.Converter.rconst)
    draws: list                     # [(Draw, slot)] in graph order
    outputs: list                   # [(slot, TV view of it as the graph returns it)] (0: learn's return)
    segments: int = 0
    stats: dict = field(default_factory=dict)


def lower(cv: Converter, units: int, batch: int) -> Program:
    """The converted graph of one unit (`units` updates of `batch` rows) as VM tables."""
    lw = Lowering(cv, units, batch)
    lw.setup()
    outputs = lw.mark_outputs()
    ops = lw.simplify(lw.prepare_ops())
    items = lw.fuse(ops)
    items = lw.drop_dead(items)
    items = lw.classify(items)
    segs, kinds = lw.schedule(items)
    return Encoder(lw, segs, kinds, outputs).encode()


def _mark_outputs(self):
    """The graph's outputs in buffers of their own: learn's return (its unit's slice of the phase's result) and the
    tensors learn assigns (the last unit's values); a temp that is exactly the output becomes that buffer."""
    cv = self.cv
    res = []
    for k, v in enumerate(cv.outputs):
        if isinstance(v, Const):
            t = cv.temp_like_shape(v.shape, v.dtype)
            self.alloc[t.buf] = (t.shape, t.strides)
            cv.ops.append(Kern(t.shape, [Out(t.buf, 0, t.strides, t.dtype, ("c", float(v.value)))],
                               seq=10 ** 9, what="output"))
            v = t
        if not isinstance(v, TV):
            raise Declined(f"{cv.who}'s learn returns a {type(v).__name__}, not a tensor")
        b = self.bufs[v.buf]
        whole = b.kind == "temp" and v.off == 0 and v.strides == _contig(v.shape) and v.numel == b.numel
        if whole and all(o[1] != v.buf for o in res):
            b.kind = "out"
            res.append((k, v.buf, v))
        else:
            t = cv.temp_like_shape(v.shape, v.dtype)
            self.bufs[t.buf].kind = "out"
            cv.ops.append(Kern(t.shape, [Out(t.buf, 0, t.strides, t.dtype, ("ld", Ld(v.buf, v.off, v.strides,
                                                                                         v.dtype)))],
                               seq=10 ** 9, what="output"))
            res.append((k, t.buf, t))
        self.keep.add(res[-1][1])
    if res and (len(res[0][2].shape) < 1 or res[0][2].shape[0] != self.units):
        raise Declined(f"{cv.who}'s learn returns a tensor of shape {tuple(res[0][2].shape)}, not one value per "
                       f"update and row ({self.units}, {self.B})")
    return res


Lowering.mark_outputs = _mark_outputs


class Encoder:
    def __init__(self, lw: Lowering, segs, kinds, outputs):
        self.lw, self.segs, self.kinds, self.outputs = lw, segs, kinds, outputs
        self.bufs = lw.bufs
        self.INS, self.OPD, self.CODE, self.CST, self.F = [], [], [], [], []
        self.fidx: dict[float, int] = {}
        self.slot_of: dict[int, int] = {}
        self.base_of: dict[int, int] = {}       # buf -> element offset in its slot
        self.slots: list[Slot] = []
        self.nregs = 0

    # -- storages --
    def storages(self):
        lw = self.lw
        used = set()
        for seg in self.segs:
            for job in seg:
                for it in job:
                    used.update(a.buf for a in it.accesses)
        used.update(b for _, b, _ in self.outputs)
        arena = None
        temps = []
        for b in self.bufs:
            if b.id not in used:
                continue
            if b.kind == "temp":
                temps.append(b)
                continue
            if b.kind == "state":
                slot = Slot("state", b.dtype, b.numel, b.info)
            elif b.kind == "input":
                slot = Slot("input", b.dtype, b.numel, b.info, per_unit=True)
            elif b.kind == "draw":
                slot = Slot("draw", b.dtype, b.numel, b.info, per_unit=True)
            elif b.kind == "literal":
                slot = Slot("literal", b.dtype, b.numel, np.ascontiguousarray(b.info))
            elif b.kind == "out":
                k = next(k for k, bb, _ in self.outputs if bb == b.id)
                slot = Slot("out", b.dtype, b.numel, k, per_unit=(k == 0))
            else:
                raise ValueError(b.kind)
            self.slot_of[b.id] = len(self.slots)
            self.base_of[b.id] = 0
            self.slots.append(slot)
        # the arena: temporaries by lifetime (segments), first fit; those living inside one job share slabs first
        life: dict[int, list[int]] = {}
        for s, seg in enumerate(self.segs):
            for job in seg:
                for it in job:
                    for a in it.accesses:
                        if self.bufs[a.buf].kind == "temp":
                            lf = life.setdefault(a.buf, [s, s])
                            lf[0], lf[1] = min(lf[0], s), max(lf[1], s)
        units = []                      # (nbytes, first seg, last seg, the temporaries at its start)
        slabbed = set()
        for nbytes, s, group in self._job_slabs(temps):
            units.append((nbytes, s, s, group))
            slabbed.update(group)
        units += [(b.numel * _itemsize(b.dtype), *life.get(b.id, (0, 0)), [b.id]) for b in temps
                  if b.id not in slabbed]
        placed: list[tuple[int, int, int, int]] = []   # (start byte, end byte, first seg, last seg)
        offs = {}
        for nbytes, f, l, group in sorted(units, key=lambda u: -u[0]):
            start = 0
            for (s0, e0, f0, l0) in sorted(placed):
                if f0 > l or l0 < f:
                    continue
                if start + nbytes <= s0:
                    continue
                start = max(start, _align(e0))
            placed.append((start, start + nbytes, f, l))
            for b in group:
                offs[b] = start
        size = _align(max((e for _, e, _, _ in placed), default=0)) + ALIGN
        arena = len(self.slots)
        self.slots.append(Slot("arena", torch.uint8, size))
        for b in temps:
            self.slot_of[b.id] = arena
            self.base_of[b.id] = offs[b.id] // _itemsize(b.dtype)
        self.arena_bytes = size

    def _job_slabs(self, temps) -> list:
        """Temporaries that live inside one row job share memory in the order the job's passes run: a block's task
        runs them one after another, so one whose last pass comes before another's first can hold the same bytes.
        Tasks of other blocks run at the same time, so only temporaries whose every access is row-local, with one row
        stride and within a row's own elements, share (a block then touches the same rows of every one of them: its
        own bytes). [(bytes, segment, the temporaries of one slab)]"""
        if not JOB_SLABS:
            return []
        info: dict[int, list] = {}      # buf -> [{(seg, job)}, first pass, last pass, row stride or None]
        for s, seg in enumerate(self.segs):
            for jb, job in enumerate(seg):
                rows = self.kinds[s][jb][0] == "rows"
                for p, it in enumerate(job):
                    for a in it.accesses:
                        if self.bufs[a.buf].kind != "temp":
                            continue
                        rec = info.setdefault(a.buf, [set(), p, p, None if a.row is None else a.row[0]])
                        rec[0].add((s, jb))
                        rec[1], rec[2] = min(rec[1], p), max(rec[2], p)
                        if not rows or a.row is None or a.row[0] <= 0 or a.row[0] != rec[3] or a.row[1] < 0 \
                                or a.row[2] > a.row[0]:
                            rec[3] = None
        outs = {b for _, b, _ in self.outputs}
        groups: dict[tuple, list] = {}
        for b in temps:
            rec = info.get(b.id)
            if rec is None or len(rec[0]) != 1 or rec[3] is None or b.id in outs:
                continue
            (s, jb), rs = next(iter(rec[0])), rec[3]
            if b.numel != self.kinds[s][jb][1] * rs:
                continue
            groups.setdefault((s, jb, rs * _itemsize(b.dtype)), []).append((rec[1], rec[2], b.id))
        out = []
        for (s, jb, row_bytes), bufs in groups.items():
            slabs: list[list] = []      # [last pass, buffers]
            for first, last, b in sorted(bufs):
                slab = next((sl for sl in slabs if sl[0] < first), None)
                if slab is None:
                    slabs.append([last, [b]])
                else:
                    slab[0] = last
                    slab[1].append(b)
            out += [(row_bytes * self.kinds[s][jb][1], s, sl[1]) for sl in slabs if len(sl[1]) > 1]
        return out

    def fconst(self, v: float) -> int:
        got = self.fidx.get(v)
        if got is None:
            got = self.fidx[v] = len(self.F)
            self.F.append(float(v))
        return got

    def opd(self, buf, dtype, off, strides, ustride=0, bstride=0, reg=0, mode=0, index=(), argdim=0, pair=0,
            iota=False) -> int:
        row = [0] * vm.OPD_W
        if iota:
            row[vm.O_ST], row[vm.O_DT] = 0, vm.DT_IOTA
            row[vm.O_OFF] = off
        else:
            slot = self.slot_of[buf]
            row[vm.O_ST], row[vm.O_DT] = slot, DTYPES[dtype]
            row[vm.O_OFF] = self.base_of[buf] + off
            if self.slots[slot].per_unit:
                ustride = self.slots[slot].numel
        for k in range(4):
            row[vm.O_S0 + k] = strides[k]
        row[vm.O_USTR], row[vm.O_BSTR], row[vm.O_REG], row[vm.O_MODE] = ustride, bstride, reg, mode
        row[vm.O_NIDX] = len(index)
        for k, (r, s) in enumerate(index[:2]):
            row[vm.O_IREG + k], row[vm.O_ISTR + k] = r, s
        row[vm.O_ARGDIM], row[vm.O_PAIR] = argdim, pair
        self.OPD.append(row)
        return len(self.OPD) - 1

    # -- EXPR --
    def expr(self, it: Item, split_nb: int):
        op: Kern = it.op
        shape = list(op.shape) or [1]
        # every access's strides over the space (iota: its dim's index)
        accs = []

        def collect(e):
            if e[0] == "ld":
                accs.append(e[1].strides if op.shape else (0,))
                for ie, _ in e[1].index:
                    collect(ie)
            elif e[0] == "iota":
                accs.append(tuple(1 if d == e[1] else 0 for d in range(len(op.shape))) if op.shape else (0,))
            elif e[0] not in ("c", "rc"):
                for a in e[1:]:
                    collect(a)
        for o in op.outs:
            collect(o.expr)
            for ie, _ in o.index:
                collect(ie)
            accs.append(o.strides if op.shape else (0,))
        dims, groups = _collapse(shape, accs, it.rowdim if op.shape else -1)
        if len(dims) > 4:
            raise Declined(f"{self.lw.cv.who}'s learn has an operation over {len(dims)} dims that do not collapse to 4, "
                           "which the compiled kernel does not take")
        pad = 4 - len(dims)
        D = [1] * pad + [n for n in dims]
        split = -1
        if it.rowdim >= 0 and op.shape:
            split = pad + next(k for k, g in enumerate(groups) if it.rowdim in g)

        def cstrides(st):
            st = st if op.shape else (0,)
            out = [0] * pad
            for g in groups:
                out.append(st[g[-1]])
            return out
        regdt = 0
        for o in op.outs:
            if o.dtype not in (torch.float32, torch.bool, torch.uint8):
                regdt = 1
            for ld in loads_of(o.expr, []):
                if ld.dtype not in (torch.float32, torch.bool, torch.uint8):
                    regdt = 1
        # register code: a DAG of the outputs' expressions, constants in fixed registers
        nodes: dict = {}
        order: list = []
        consts: list = []

        def visit(e) -> int:
            key = _key(e)
            got = nodes.get(key)
            if got is not None:
                return got
            kind = e[0]
            if kind == "c" or kind == "rc" or (kind == "ld" and not e[1].index and not any(e[1].strides)
                                                and op.shape and not _written(op, e[1])):
                nid = len(order)
                order.append(("const", e))
                consts.append(nid)
            elif kind == "ld":
                kids = [visit(ie) for ie, _ in e[1].index]
                nid = len(order)
                order.append(("load", e, kids))
            elif kind == "iota":
                nid = len(order)
                order.append(("iota", e, []))
            else:
                kids = [visit(a) for a in e[1:]]
                nid = len(order)
                order.append(("op", e, kids))
            nodes[key] = nid
            return nid
        out_nodes = []
        for o in op.outs:
            r = visit(o.expr)
            ix = [visit(ie) for ie, _ in o.index]
            out_nodes.append((r, ix))
        last = {}
        for nid, n in enumerate(order):
            for k in (n[2] if len(n) > 2 else []):
                last[k] = nid
        end = len(order)
        for r, ix in out_nodes:
            last[r] = end
            for k in ix:
                last[k] = end
        reg = {}
        nreg = 0
        for nid in consts:
            reg[nid] = nreg
            nreg += 1
        free: list[int] = []
        code_start = len(self.CODE)
        const_start = len(self.CST)
        for nid in consts:
            e = order[nid][1]
            if e[0] == "c":
                self.CST.append([reg[nid], vm.C_LIT, self.fconst(e[1])])
            elif e[0] == "rc":
                self.CST.append([reg[nid], vm.C_RC, e[1]])
            else:
                ld = e[1]
                o_ = self.opd(ld.buf, ld.dtype, ld.off, [0, 0, 0, 0])
                self.CST.append([reg[nid], vm.C_UNIFORM, o_])
        for nid, n in enumerate(order):
            if n[0] == "const":
                continue
            kids = n[2]
            if free:
                r = free.pop()
            else:
                r = nreg
                nreg += 1
            reg[nid] = r
            if n[0] == "load":
                ld = n[1][1]
                idx = [(reg[k], s) for k, (_, s) in zip(kids, ld.index)]
                if len(idx) > 2:
                    raise Declined("a gather over more than two index tensors is not taken by the compiled kernel")
                o_ = self.opd(ld.buf, ld.dtype, ld.off, cstrides(ld.strides), index=idx)
                self.CODE.append([vm.OP_LOAD, r, o_, 0, 0])
            elif n[0] == "iota":
                st = cstrides(tuple(1 if d == n[1][1] else 0 for d in range(len(op.shape))))
                o_ = self.opd(0, None, 0, st, iota=True)
                self.CODE.append([vm.OP_LOAD, r, o_, 0, 0])
            else:
                opname = n[1][0]
                code = vm.OPCODES[opname]
                args = [reg[k] for k in kids] + [0] * (3 - len(kids))
                self.CODE.append([code, r, *args])
            for k in set(kids):
                if last.get(k) == nid and order[k][0] != "const":
                    free.append(reg[k])
        out_start = len(self.OPD)
        pairs = {}
        for o, (r, ix) in zip(op.outs, out_nodes):
            if o.mode in ("argmax", "argmin"):
                continue
            paired = any(x.pair is o for x in op.outs)
            pairs[id(o)] = self.opd(o.buf, o.dtype, o.off, cstrides(o.strides), bstride=getattr(o, "bstride", 0),
                                    reg=reg[r], mode=vm.M_ARGVAL if paired else MODES[o.mode], index=[(reg[k], s) for k, (_, s) in
                                                                            zip(ix, o.index)])
        for o, (r, ix) in zip(op.outs, out_nodes):
            if o.mode not in ("argmax", "argmin"):
                continue
            dcoll = pad + next(k for k, g in enumerate(groups) if o.dim in g) if op.shape else 3
            if D[dcoll] != shape[o.dim] if op.shape else False:
                raise Declined("an argmax over a dim merged with another is not taken by the compiled kernel")
            self.opd(o.buf, o.dtype, o.off, cstrides(o.strides), bstride=getattr(o, "bstride", 0), reg=reg[r],
                     mode=MODES[o.mode], argdim=dcoll if dcoll < 3 else 3, pair=pairs[id(o.pair)])
        nout = len(self.OPD) - out_start
        # the outputs of a pass must be contiguous in OPD: loads and constants were added before them
        self.nregs = max(self.nregs, nreg)
        row = [0] * vm.INS_W
        row[vm.I_KIND], row[vm.I_REGDT] = vm.K_EXPR, regdt
        for k in range(4):
            row[vm.I_D0 + k] = D[k]
        row[vm.I_SPLIT] = split
        row[vm.I_EXT] = D[split] if split >= 0 else 0
        row[vm.I_NB] = split_nb if split >= 0 else 1
        row[vm.I_CODE], row[vm.I_NCODE] = code_start, len(self.CODE) - code_start
        row[vm.I_CONST], row[vm.I_NCONST] = const_start, len(self.CST) - const_start
        row[vm.I_NREGS] = nreg
        row[vm.I_OUT], row[vm.I_NOUT] = out_start, nout
        self.INS.append(row)

    def adam(self, it: Item, nb: int):
        op: Adam = it.op
        row = [0] * vm.INS_W
        row[vm.I_KIND] = vm.K_ADAM
        z = [0, 0, 0, 0]
        row[vm.I_P] = self.opd(op.p.buf, op.p.dtype, op.p.off, z)
        row[vm.I_G] = self.opd(op.g.buf, op.g.dtype, op.g.off, z)
        row[vm.I_M1] = self.opd(op.m.buf, op.m.dtype, op.m.off, z)
        row[vm.I_M2] = self.opd(op.v.buf, op.v.dtype, op.v.off, z)
        row[vm.I_VMAX] = self.opd(op.vmax.buf, op.vmax.dtype, op.vmax.off, z) if op.vmax is not None else -1
        row[vm.I_SC] = self.opd(op.sc.buf, op.sc.dtype, op.sc.off, z)
        row[vm.I_SCALE] = self.opd(op.scale.buf, op.scale.dtype, op.scale.off, z) if op.scale is not None else -1
        row[vm.I_RC] = op.rc
        row[vm.I_FLAGS] = ((vm.F_ADAMW if op.adamw else 0) | (vm.F_AMSGRAD if op.amsgrad else 0)
                           | (vm.F_MAXIMIZE if op.maximize else 0) | (vm.F_SCALE_BACK if op.scale is not None else 0))
        row[vm.I_NUMEL] = op.p.numel
        row[vm.I_SPLIT] = 0 if nb > 1 else -1
        row[vm.I_NB] = nb
        self.INS.append(row)

    def gemm(self, it: Item, split_nb: int):
        op: MM = it.op

        def operand(tv: TV) -> int:
            if tv.ndim == 3:
                st = (tv.strides[1], tv.strides[2], tv.strides[0], 0)
            else:
                st = (tv.strides[0], tv.strides[1], 0, 0)
            r, c = tv.shape[-2:]
            st = (st[0] if r > 1 else c, st[1] if c > 1 else 1, st[2], 0)
            return self.opd(tv.buf, tv.dtype, tv.off, st)
        row = [0] * vm.INS_W
        row[vm.I_KIND] = vm.K_GEMM
        row[vm.I_A], row[vm.I_B], row[vm.I_C] = operand(op.a), operand(op.b), operand(op.out)
        M, N = op.out.shape[-2:]
        K = op.a.shape[-1]
        row[vm.I_M], row[vm.I_N], row[vm.I_K] = M, N, K
        row[vm.I_ALPHA], row[vm.I_BETA] = self.fconst(op.alpha), self.fconst(op.beta)
        row[vm.I_BATCH] = op.out.shape[0] if op.out.ndim == 3 else 1
        if it.rowdim >= 0:
            row[vm.I_SPLIT], row[vm.I_EXT], row[vm.I_NB] = it.rowdim, it.N, split_nb
        else:
            row[vm.I_SPLIT], row[vm.I_EXT], row[vm.I_NB] = -1, 0, 1
        self.INS.append(row)

    def encode(self) -> Program:
        self.storages()
        tasks, segstart = [], []
        for s, seg in enumerate(self.segs):
            segstart.append(len(tasks))
            for jb, job in enumerate(seg):
                key = self.kinds[s][jb]
                if key[0] == "rows":
                    nb = blocks(key[1])
                elif key[0] == "big":
                    it = job[0]
                    if isinstance(it.op, MM):
                        nb = it.most or gemm_chunks(it, [j[0] for j in seg if isinstance(j[0].op, MM)])
                    else:
                        nb = spans(it.N) if isinstance(it.op, Adam) else spans_of(it)
                else:
                    nb = 1
                i0 = len(self.INS)
                for it in job:
                    if isinstance(it.op, MM):
                        self.gemm(it, nb if it.rowdim >= 0 else 1)
                    elif isinstance(it.op, Adam):
                        self.adam(it, nb)
                    else:
                        self.expr(it, nb)
                for c in range(nb):
                    tasks.append([s, i0, len(self.INS), c])
        segstart.append(len(tasks))
        draws = [(d, self.slot_of[d.out.buf]) for d in self.lw.draws if d.out.buf in self.slot_of]
        outs = [(self.slot_of[b], tv) for _, b, tv in self.outputs]
        arr = lambda x, w, dt=np.int64: np.array(x, dt).reshape(-1, w) if x else np.zeros((0, w), dt)  # noqa: E731
        prog = Program(arr(self.INS, vm.INS_W), arr(self.OPD, vm.OPD_W), arr(self.CODE, 5), arr(self.CST, 3),
                       np.array(self.F or [0.0], np.float64), arr(tasks, 4), np.array(segstart, np.int64),
                       self.slots, self.arena_bytes, max(self.nregs, 1), list(self.lw.cv.rconst), draws, outs,
                       segments=len(self.segs))
        prog.stats = {"instructions": len(self.INS), "segments": len(self.segs), "tasks": len(tasks),
                      "arena_kb": self.arena_bytes // 1024, "registers": self.nregs}
        return prog


def _adam_tvs(op: Adam, writes: bool = False) -> list:
    """The views an Adam step reads (or writes)."""
    if writes:
        out = [op.p, op.m, op.v] + ([op.vmax] if op.vmax is not None else [])
        return out + ([op.g] if op.scale is not None else [])
    out = [op.p, op.g, op.m, op.v, op.sc] + ([op.vmax] if op.vmax is not None else [])
    return out + ([op.scale] if op.scale is not None else [])


def _written(op: Kern, ld: Ld) -> bool:
    """Whether the pass writes the buffer a uniform load reads (then it is read per tile, not once up front)."""
    return any(o.buf == ld.buf for o in op.outs)


def _key(e):
    """A structural key of an expression (its common subexpressions computed once)."""
    if e[0] == "ld":
        ld = e[1]
        return ("ld", ld.buf, ld.off, ld.strides, ld.dtype, tuple((_key(ie), s) for ie, s in ld.index))
    if e[0] in ("c", "rc", "iota"):
        return e
    return (e[0], *[_key(a) for a in e[1:]])


def _collapse(shape, accs, rowdim):
    """Dims of the iteration space after dropping size-1 dims and merging neighbours every access steps through
    alike (never the row dim: its blocks stay rows); (sizes, groups of original dims)."""
    kept = [d for d in range(len(shape)) if shape[d] > 1 or d == rowdim]
    if not kept:
        return [1], [[len(shape) - 1 if shape else 0]]
    groups = [[kept[0]]]
    for d in kept[1:]:
        prev = groups[-1][-1]
        if d != rowdim and prev != rowdim and all(st[prev] == st[d] * shape[d] for st in accs):
            groups[-1].append(d)
        else:
            groups.append([d])
    sizes = [int(np.prod([shape[d] for d in g])) for g in groups]
    return sizes, groups


def _itemsize(dt) -> int:
    return torch.empty(0, dtype=dt).element_size()


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def describe_schedule(lw_segs, kinds) -> str:
    """The segments, their jobs and passes, one line each (for debugging a lowering)."""
    lines = []
    for s, seg in enumerate(lw_segs):
        for j, job in enumerate(seg):
            what = ", ".join(f"{getattr(it.op, 'what', '?')}{'*' if it.partial else ''}"
                             f"{list(getattr(it.op, 'shape', getattr(getattr(it.op, 'out', None), 'shape', ())))}"
                             f"@{it.rowdim}" for it in job)
            lines.append(f"seg {s} job {j} {kinds[s][j][:2] if kinds[s][j][0] != 'big' else ('big',)}: {what}")
    return "\n".join(lines)
