"""Tracing an algorithm's own `learn` into one graph of aten operations (the compiler's first step).

`trace_unit(algo, batches, weights)` calls `learn` on a *twin* of the algorithm (a copy whose tensors lie in new
storages laid out exactly as the algorithm's: parameters that are views of one flat buffer stay views of one flat
buffer, a parameter's `.grad` view stays a view of the gradient buffer) under
`torch.fx.experimental.proxy_tensor.make_fx` (real tracing mode). Autograd's backward, the optimizers' steps,
gradient clipping, Polyak averages and every in-place update are recorded as aten operations; composite operations
are decomposed by `torch.export.default_decompositions()`. Both are public torch APIs; nothing else of torch's
internals is used.

What the graph reads and writes that is not an input appears in it as a constant: each is mapped, by its storage,
to a *path* from the algorithm object (attributes, dict keys, list indices, an optimizer's per-parameter state) at
which its storage is reachable, so the compiled program runs on the algorithm's own tensors (found again by the path
at every phase: a checkpoint load that replaces an optimizer's state is followed). A tensor constant that is not
reachable from the algorithm (a `torch.tensor(...)` made inside `learn`) is a literal, copied into the program.

The optimizers of the twin run their fused variant where torch has one on the CPU (Adam and AdamW): its one
`_fused_adam_` operation takes its hyper-parameters as arguments, which the program reads from the algorithm's own
optimizer at every phase (a learning-rate schedule needs no new trace); other optimizers run their single-tensor
variant, whose hyper-parameters are folded into the graph (the program is traced again when one changes).

Python-side state that `learn` changes is replayed, not traced: the non-tensor attributes of the twin are compared
before and after the trace; a number that moved (`self.updates += K`) moves by the same amount per unit of updates,
anything else that changed takes the value it had after the trace of that unit. Tensors that `learn` assigns to
attributes (`self.stats = {"loss": loss.detach()}`, a parameter's new `.grad`) become outputs of the graph, written
back after each phase. `learn` must not read a tensor's value in Python (`.item()`, `float(t)`, `if t > 0:`): such
a read is data-dependent control flow, and the trace declines with the line of the algorithm that did it.
"""

from __future__ import annotations

import copy
import pickle
import random
import sys
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hetrl.kernels.kernel import Declined as KernelDeclined

NUMBER = (int, float)
PLAIN = (int, float, bool, str, type(None))


class Declined(KernelDeclined):
    """What the compiler cannot take; the message is one line naming the operation (or attribute) and why."""


# ---- paths: how a tensor or generator is reached from the algorithm object ---------------------------------------
# A path is a tuple of steps: ("a", name) an attribute, ("k", key) a dict key, ("i", index) a list or tuple index,
# ("s", group, param, key) an optimizer's state of param `param` of param group `group`, ("g",) a tensor's .grad.

def _children(obj):
    """(step, child) for the things reachable from obj in one step (what the walk follows)."""
    if isinstance(obj, torch.Tensor):
        g = obj.grad if obj.is_leaf else None
        if g is not None:
            yield ("g",), g
        return
    if isinstance(obj, (torch.Generator, type, nn.Parameter)) or callable(obj) and not hasattr(obj, "__dict__"):
        return
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            if isinstance(k, PLAIN):
                yield ("k", k), v
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield ("i", i), v
        return
    if isinstance(obj, torch.optim.Optimizer):
        for gi, group in enumerate(obj.param_groups):
            for pi, p in enumerate(group["params"]):
                for key, v in obj.state.get(p, {}).items():
                    yield ("s", gi, pi, key), v
        yield ("a", "param_groups"), obj.param_groups
        return
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict) and not isinstance(obj, type) and type(obj).__module__ not in ("builtins",):
        for k, v in list(d.items()):
            yield ("a", k), v


def walk(root) -> dict[int, tuple[tuple, Any]]:
    """id -> (shortest path, object) for every tensor and generator reachable from root (breadth first)."""
    seen: set[int] = {id(root)}
    out: dict[int, tuple[tuple, Any]] = {}
    todo = deque([((), root)])
    while todo:
        path, obj = todo.popleft()
        for step, child in _children(obj):
            if id(child) in seen or isinstance(child, PLAIN):
                continue
            seen.add(id(child))
            p = path + (step,)
            if isinstance(child, (torch.Tensor, torch.Generator)):
                out[id(child)] = (p, child)
            if isinstance(child, torch.Tensor) and isinstance(child, nn.Parameter):
                g = child.grad
                if g is not None and id(g) not in seen:
                    seen.add(id(g))
                    out[id(g)] = (p + (("g",),), g)
                continue
            if not isinstance(child, torch.Generator) and not (hasattr(child, "__module__") and
                                                               type(child).__module__ == "numpy"):
                todo.append((p, child))
    return out


def resolve(root, path: tuple):
    """The object at `path` from root (raises LookupError/AttributeError where it is not there)."""
    obj = root
    for step in path:
        kind = step[0]
        if kind == "a":
            obj = getattr(obj, step[1])
        elif kind in ("k", "i"):
            obj = obj[step[1]]
        elif kind == "s":
            p = obj.param_groups[step[1]]["params"][step[2]]
            obj = obj.state[p][step[3]]
        elif kind == "g":
            obj = obj.grad
            if obj is None:
                raise LookupError("no .grad")
        else:
            raise LookupError(step)
    return obj


def assign(root, path: tuple, value) -> None:
    """Set the object at `path` from root to value. A container reached through an attribute the object does not
    hold itself (a class-level default such as `Algorithm.stats = {}`) is copied onto the object first: a write
    into it would reach every object of the class."""
    parent = root
    for step in path[:-1]:
        shared = getattr(type(parent), step[1], None) if step[0] == "a" else None
        if isinstance(shared, (dict, list)) and hasattr(parent, "__dict__") and step[1] not in vars(parent):
            own = type(shared)(shared)
            setattr(parent, step[1], own)
            parent = own
        else:
            parent = resolve(parent, (step,))
    step = path[-1]
    if step[0] == "a":
        setattr(parent, step[1], value)
    elif step[0] in ("k", "i"):
        parent[step[1]] = value
    elif step[0] == "g":
        parent.grad = value
    else:
        raise LookupError(step)


def describe(path: tuple) -> str:
    """A path as Python: self.critic_opt.opt.state[...]['exp_avg']."""
    s = "self"
    for step in path:
        if step[0] == "a":
            s += f".{step[1]}"
        elif step[0] in ("k", "i"):
            s += f"[{step[1]!r}]"
        elif step[0] == "s":
            s += f".state[param_groups[{step[1]}]['params'][{step[2]}]][{step[3]!r}]"
        elif step[0] == "g":
            s += ".grad"
    return s


# ---- the twin ----------------------------------------------------------------------------------------------------
def twin(algo):
    """A deep copy of algo whose tensors keep their aliasing: every storage is copied once and every tensor made again
    as the same view of its copy (copy.deepcopy alone makes each nn.Parameter a fresh clone, which would cut a
    parameter off the flat buffer its optimizer steps). Generators are copied with their state."""
    found = walk(algo)
    memo: dict[int, Any] = {}
    storages: dict[int, torch.UntypedStorage] = {}
    tensors = [(obj, path) for path, obj in found.values() if isinstance(obj, torch.Tensor)]

    def copy_of(t: torch.Tensor) -> torch.Tensor:
        got = memo.get(id(t))
        if got is not None:
            return got
        s = t.untyped_storage()
        key = s.data_ptr() if s.nbytes() else -id(t)
        ns = storages.get(key)
        if ns is None:
            ns = storages[key] = s.clone()
        v = torch.empty(0, dtype=t.dtype, device=t.device)
        with torch.no_grad():
            v.set_(ns, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, nn.Parameter):
            v = nn.Parameter(v, requires_grad=t.requires_grad)
        elif t.requires_grad:
            v.requires_grad_(True)
        memo[id(t)] = v
        if t.is_leaf and t.grad is not None:
            v.grad = copy_of(t.grad)
        return v

    for t, _ in tensors:
        if not t.is_leaf:
            raise Declined(f"the algorithm keeps a tensor that is part of an autograd graph in between updates "
                           f"(at {describe(_)}), so it cannot be copied to trace")
        copy_of(t)
    for path, obj in found.values():
        if isinstance(obj, torch.Generator):
            g = torch.Generator(device=obj.device)
            g.set_state(obj.get_state())
            memo[id(obj)] = g
    try:
        return copy.deepcopy(algo, memo)
    except Exception as e:   # an attribute deepcopy cannot copy (a lock, a file)
        raise Declined(f"the algorithm object cannot be copied to trace its learn ({type(e).__name__}: {e})") from None


def fused_variants(algo) -> None:
    """Make the twin's Adam/AdamW optimizers run their fused CPU variant (one traced op whose hyper-parameters are
    arguments) and every other optimizer its single-tensor variant."""
    for opt in optimizers_of(algo):
        fusable = type(opt) in (torch.optim.Adam, torch.optim.AdamW)
        for g in opt.param_groups:
            if "foreach" in g:
                g["foreach"] = False
            if fusable:
                g["fused"] = True
                g["capturable"] = False


def optimizers_of(root) -> list[torch.optim.Optimizer]:
    """Every torch optimizer reachable from root's attributes (in plain containers and objects)."""
    out, seen = [], {id(root)}
    todo = deque([root])
    while todo:
        obj = todo.popleft()
        if isinstance(obj, torch.optim.Optimizer):
            out.append(obj)
            continue
        if isinstance(obj, (torch.Tensor, nn.Module, torch.Generator, type)):
            continue
        items = (obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple))
                 else vars(obj).values() if hasattr(obj, "__dict__") else ())
        for v in items:
            if id(v) not in seen and not isinstance(v, PLAIN):
                seen.add(id(v))
                todo.append(v)
    return out


# ---- Python-side state ----------------------------------------------------------------------------------------------
def plain_state(root) -> dict[tuple, Any]:
    """path -> value of the plain (non-tensor) attributes reachable from root through objects and containers, modules
    and optimizers' hyper-parameters excluded (they do not change in learn; modules' plain attributes are walked)."""
    out: dict[tuple, Any] = {}
    seen = {id(root)}
    todo = deque([((), root)])
    while todo:
        path, obj = todo.popleft()
        if isinstance(obj, (torch.Tensor, torch.Generator, torch.optim.Optimizer, type)) or callable(obj) and \
                not hasattr(obj, "__dict__"):
            continue
        if isinstance(obj, dict):
            items = [(("k", k), v) for k, v in obj.items() if isinstance(k, PLAIN)]
        elif isinstance(obj, (list, tuple)):
            items = [(("i", i), v) for i, v in enumerate(obj)]
        elif hasattr(obj, "__dict__") and type(obj).__module__ not in ("builtins",):
            items = [(("a", k), v) for k, v in vars(obj).items()]
        else:
            continue
        for step, v in items:
            p = path + (step,)
            if isinstance(v, PLAIN):
                out[p] = v
            elif id(v) not in seen:
                seen.add(id(v))
                todo.append((p, v))
    return out


def tensor_slots(root) -> dict[tuple, int]:
    """path -> id of the tensor there, for every tensor reachable (what learn may reassign)."""
    return {path: id(obj) for path, obj in walk(root).values() if isinstance(obj, torch.Tensor)}


@dataclass
class Replay:
    """The Python-side effect of one traced unit: numbers moved by `delta`, other values set to `value`."""

    delta: dict[tuple, Any] = field(default_factory=dict)
    value: dict[tuple, Any] = field(default_factory=dict)


def python_effect(before: dict, after: dict, who: str) -> Replay:
    out = Replay()
    for path, v in after.items():
        if path not in before:
            out.value[path] = v
            continue
        old = before[path]
        if old is v or old == v:
            continue
        if isinstance(v, NUMBER) and isinstance(old, NUMBER) and not isinstance(v, bool) and not isinstance(old, bool):
            out.delta[path] = v - old
        else:
            out.value[path] = v
    for path in before:
        if path not in after:
            raise Declined(f"{who}'s learn deletes {describe(path)}, which the compiled kernel cannot replay")
    return out


# ---- the trace ---------------------------------------------------------------------------------------------------
@dataclass
class Trace:
    """One unit of updates as a graph, and what it needs to run on the algorithm itself."""

    gm: Any                                   # the torch.fx GraphModule (aten ops)
    inputs: list                              # [(batch key or "weights", placeholder name)] in placeholder order
    roots: dict[int, tuple]                   # twin storage data_ptr -> path of its root tensor in the algorithm
    root_meta: dict[int, tuple]               # storage data_ptr -> (nbytes, dtype, root storage_offset, shape)
    generators: dict[int, tuple | None]       # id of a twin generator -> its path (None: torch's default)
    replay: Replay                            # the Python-side effect of the unit
    assigned: list                            # [(path, output index)] tensors learn assigns, written back
    aliased: list                             # [(path, path before)] tensors learn moves to another attribute
    optim_groups: dict[tuple, tuple]          # id-tuple of a fused op's params -> (optimizer path, group index)
    hyper: tuple                              # the folded hyper-parameters (non-fused optimizers): a retrace key
    units: int                                # updates in the unit
    residue: int                              # algo.updates % graph_period() when traced
    who: str = ""


def _algo_line(tb=None) -> str:
    """The last line of the traceback (or, without one, of the stack) outside torch and hetrl's kernels: where
    the algorithm did it."""
    frames = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack()
    for fr in reversed(frames):
        f = fr.filename.replace("\\", "/")
        if "/torch/" in f or "/hetrl/kernels/" in f or "/contextlib" in f or "/copy.py" in f:
            continue
        return f"{f.rsplit('/', 1)[-1]}:{fr.lineno} (`{(fr.line or '').strip()}`)"
    return "learn"


class _Count(int):
    """The twin's update count while its learn is traced: `count % m` is recorded with where it was taken (a
    branch on it repeats every m updates, which graph_period() must be a multiple of), and adding to it keeps one
    of these (learn's `self.updates += K`)."""

    def __new__(cls, value: int, seen: list):
        out = super().__new__(cls, value)
        out.seen = seen
        return out

    def __mod__(self, m):
        if isinstance(m, int) and not isinstance(m, bool):
            self.seen.append((int(m), _algo_line()))
        return int(self) % m

    def __add__(self, other):
        got = int(self) + other
        return _Count(got, self.seen) if isinstance(got, int) else got

    __radd__ = __add__


KEEP = ("lerp", "lerp_")   # ops the lowering takes whole (one register op) rather than decomposed


def decompositions():
    """torch.export's default decompositions (composite and backward ops into core aten ops), but for KEEP."""
    table = dict(torch.export.default_decompositions())
    for op in list(table):
        if getattr(getattr(op, "overloadpacket", None), "__name__", "") in KEEP:
            del table[op]
    return table


_DECOMP = None


def trace_unit(algo, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> Trace:
    """Trace `learn(batches, weights)` (a unit: the leading dimension of the inputs is its updates) on a twin of algo
    (algo itself is not changed). Raises Declined with one line where it cannot."""
    global _DECOMP
    cls = type(algo)
    who = f"{cls.__module__}.{cls.__qualname__}"
    tw = twin(algo)
    fused_variants(tw)
    found = walk(tw)
    roots, root_meta, generators = {}, {}, {}
    for path, obj in sorted(found.values(), key=lambda po: len(po[0])):
        if isinstance(obj, torch.Generator):
            generators[id(obj)] = path
            continue
        s = obj.untyped_storage()
        key = s.data_ptr()
        if not s.nbytes():
            continue
        whole = obj.storage_offset() == 0 and obj.numel() * obj.element_size() == s.nbytes()
        got = roots.get(key)
        if got is None or (whole and not root_meta[key][4]):
            roots[key] = path
            root_meta[key] = (s.nbytes(), obj.dtype, obj.storage_offset(), tuple(obj.shape), whole)
    groups = {}
    hyper = []
    for opt in optimizers_of(tw):
        for gi, g in enumerate(opt.param_groups):
            if g.get("fused"):
                groups[tuple(id(p) for p in g["params"])] = (id(opt), gi)
            else:
                hyper.append(tuple((k, v) for k, v in sorted(g.items()) if k != "params" and isinstance(v, PLAIN)))
    opt_paths = {}
    for path, obj in _objects_with_paths(tw):
        if isinstance(obj, torch.optim.Optimizer):
            opt_paths.setdefault(id(obj), path)
    optim_groups = {k: (opt_paths[o], gi) for k, (o, gi) in groups.items() if o in opt_paths}

    before_plain = plain_state(tw)
    keys = list(batches)
    units = int(weights.shape[0])
    period = max(1, int(tw.graph_period()))
    residue = int(tw.updates) % period
    state = {}

    def unit(*flat):
        b = dict(zip(keys, flat[:-1]))
        before = tensor_slots(tw)
        old = {i: p for p, i in before.items()}
        out = tw.learn(b, flat[-1])
        changed, aliased = [], []
        for path, obj in walk(tw).values():
            if not isinstance(obj, torch.Tensor) or before.get(path) == id(obj):
                continue
            if id(obj) in old:      # a tensor the algorithm held before, now (also) here
                aliased.append((path, old[id(obj)]))
            else:
                changed.append((path, obj))
        state["assigned"], state["aliased"] = [p for p, _ in changed], aliased
        return (out, *[t for _, t in changed])

    if _DECOMP is None:
        _DECOMP = decompositions()
    from torch.fx.experimental.proxy_tensor import make_fx

    validate = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    host = host_generators(tw)
    host_before = [get() for _, get, _ in host]
    moduli: list = []
    tw.updates = _Count(tw.updates, moduli)
    try:
        # tracing runs learn on real tensors: a draw from torch's default generator would advance the run's own, and a
        # learn that writes into its batch would write into the caller's (so it gets copies)
        with torch.random.fork_rng(devices=[]):
            gm = make_fx(unit, decomposition_table=_DECOMP, record_stack_traces=False)(
                *[_copy(batches[k]) for k in keys], _copy(weights))
        off = [(m, at) for m, at in moduli if m > 0 and period % m]
        if off:
            m, at = off[0]
            raise Declined(f"{who}'s learn takes self.updates % {m} at {at}, but its graph_period() is {period}: a "
                           f"compiled phase repeats the control flow of {period} update(s) as traced; make "
                           f"graph_period() a multiple of {m}, or do what runs every {m} updates outside learn "
                           "(on_env_steps)")
        drew = [name for (name, get, _), was in zip(host, host_before) if pickle.dumps(get()) != pickle.dumps(was)]
        if drew:
            raise Declined(f"{who}'s learn draws from {drew[0]}, which a compiled phase would replay as one fixed "
                           "draw; draw from a torch.Generator attribute (torch.rand(..., generator=self.rng)) or "
                           "torch's global one")
    except RuntimeError as e:
        msg = str(e)
        if "_local_scalar_dense" in msg or "data-dependent" in msg or "value out of a tracing tensor" in msg:
            at = _algo_line(sys.exc_info()[2])
            hint = (" (F.one_hot reads its indices to check them: `(x.unsqueeze(-1) == torch.arange(n)).float()` is "
                    "the same one-hot and compiles)" if "one_hot(" in at else "")
            raise Declined(f"{who}'s learn reads a tensor's value in Python (.item(), float(), a branch on a tensor) "
                           f"at {at}, which a compiled phase cannot replay{hint}") from None
        raise Declined(f"{who}'s learn cannot be traced at {_algo_line(sys.exc_info()[2])}: "
                       f"{msg.splitlines()[0][:200]}{generator_hint(msg)}") from None
    except Declined:
        raise
    except Exception as e:
        raise Declined(f"{who}'s learn cannot be traced at {_algo_line(sys.exc_info()[2])}: {type(e).__name__}: "
                       f"{str(e).splitlines()[0][:200] if str(e) else ''}{generator_hint(str(e))}") from None
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)
        for (_, _, put), was in zip(host, host_before):   # the run's own streams, as they were
            put(was)
        tw.updates = int(tw.updates)
    generators = _graph_generators(gm, {path: obj for path, obj in found.values() if isinstance(obj, torch.Generator)},
                                   who)
    after_plain = plain_state(tw)
    replay = python_effect(before_plain, after_plain, who)
    assigned = [(p, i + 1) for i, p in enumerate(state.get("assigned", []))]
    placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = list(zip(keys + ["weights"], placeholders))
    return Trace(gm, inputs, roots, root_meta, generators, replay, assigned, state.get("aliased", []), optim_groups,
                 tuple(hyper), units, residue, who)


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of t with its strides (a clone of a view that is not dense would be made contiguous)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def host_generators(tw) -> list:
    """(name, get state, set state) of the random number generators a learn could draw from outside torch: numpy's
    and Python's global ones, and every numpy or Python generator reachable from the (twin) algorithm. Tracing
    records such a draw as a constant, so a learn that makes one is declined."""
    out = [("numpy's global random numbers (np.random)", np.random.get_state, np.random.set_state),
           ("Python's random module", random.getstate, random.setstate)]
    for path, obj in _objects_with_paths(tw):
        if isinstance(obj, np.random.Generator):
            bg = obj.bit_generator
            out.append((describe(path), lambda bg=bg: bg.state, lambda st, bg=bg: setattr(bg, "state", st)))
        elif isinstance(obj, np.random.RandomState):
            out.append((describe(path), obj.get_state, obj.set_state))
        elif isinstance(obj, random.Random):
            out.append((describe(path), obj.getstate, obj.setstate))
    return out


def generator_hint(msg: str, version: str | None = None) -> str:
    """What to do where tracing failed on a draw from a torch.Generator: torch before 2.13 cannot trace one (its fx
    has no argument type for a generator; 2.13, the version hetrl installs, has)."""
    version = version or torch.__version__
    if "Generator" not in msg or "argument of type" not in msg:
        return ""
    major_minor = tuple(int(x) for x in version.split("+")[0].split(".")[:2] if x.isdigit())
    if major_minor >= (2, 13):
        return ""
    return (f" (torch {version.split('+')[0]} cannot trace a draw from a torch.Generator; torch 2.13, which hetrl's "
            f"set-up installs, can: pip install torch==2.13.0)")


def _graph_generators(gm, twins: dict, who: str) -> dict[int, tuple | None]:
    """id of each generator the graph holds -> the path of the twin's generator it is (None: torch's default). The
    graph holds its own Python handle on a generator, so each is matched by setting the candidates' states in turn
    (and putting them back)."""
    out = {}
    held = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"
            and isinstance(getattr(gm, n.target), torch.Generator)]
    candidates = list(twins.items()) + [(None, torch.default_generator)]
    for g in held:
        for path, t in candidates:
            keep = t.get_state()
            try:
                t.manual_seed(0x5EED_C0DE)
                mark = t.get_state()
                same = torch.equal(g.get_state(), mark)
            finally:
                t.set_state(keep)
            if same:
                out[id(g)] = path
                break
        else:
            raise Declined(f"{who}'s learn draws from a torch.Generator that is not one of its attributes, which a "
                           "compiled phase could not draw from")
    return out


def _objects_with_paths(root):
    """(path, object) for objects reachable from root through attributes and containers (optimizers included)."""
    seen = {id(root)}
    todo = deque([((), root)])
    while todo:
        path, obj = todo.popleft()
        yield path, obj
        if isinstance(obj, (torch.Tensor, torch.Generator, torch.optim.Optimizer, type) + PLAIN):
            continue
        if isinstance(obj, dict):
            items = [(("k", k), v) for k, v in obj.items() if isinstance(k, PLAIN)]
        elif isinstance(obj, (list, tuple)):
            items = [(("i", i), v) for i, v in enumerate(obj)]
        elif hasattr(obj, "__dict__"):
            items = [(("a", k), v) for k, v in vars(obj).items()]
        else:
            continue
        for step, v in items:
            if id(v) not in seen:
                seen.add(id(v))
                todo.append((path + (step,), v))

