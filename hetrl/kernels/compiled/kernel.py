"""CompiledKernel: an algorithm's learn as one native call per phase, on its own parameters and optimizer state.

It wraps any algorithm on the protocol from outside. Its phase is *derived* from the algorithm's own `learn`
(derived.py: traced with make_fx, lowered onto the bound GEMM and the VM's fused passes over fixed row blocks; see
docs/compiled.md); a built-in whose hand-derived loss head is still measured faster (HEADS: actor_critic.py and
crossq.py over layers.py and optim.py) runs that head. `check(algo)` says in one line why it does not take
an algorithm (pixels, a GPU, float64); what is found only by tracing (an operation without a lowering, a read of a
tensor's value in Python) is one line in `declined` after the first phases, which then run the public learn.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import torch

from hetrl.kernels.compiled import sgemm, vm
from hetrl.kernels.compiled.derived import Derived
from hetrl.kernels.kernel import Declined, Kernel

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None

def available() -> str | None:
    """None where numba and scipy (OpenBLAS, one of the two GEMMs) import; else why not."""
    if numba is None:
        return "numba is not installed"
    try:
        import scipy.linalg.cython_blas  # noqa: F401
    except ImportError:
        return "scipy is not installed"
    return None


def threadsafe_layer() -> str | None:
    """None where numba's threading layer lets several threads launch parallel regions at once (OpenMP, TBB);
    else why not. numba's workqueue layer (the fall-back where neither is installed) aborts the process when two
    threads launch at once, so a population's members then learn one after another."""
    if numba is None:
        return "numba is not installed"
    try:
        layer = numba.threading_layer()
    except ValueError:   # no parallel region has run in this process yet: run one, so numba picks its layer
        vm.touch(np.zeros(2))
        layer = numba.threading_layer()
    return None if layer in ("omp", "tbb") else (
        f"numba's threading layer is {layer}, which one thread at a time may enter (install TBB, `pip install tbb`, "
        "or use a numba built with OpenMP for members side by side)")


# the built-in algorithms whose hand-derived loss head still runs their phases (where it takes them): a head is kept
# only while it is measured faster than the derived phase (docs/compiled.md); every other algorithm, and a built-in
# its head does not take, runs the phase derived from its own learn (derived.py)
HEADS = {"DDPG": ("actor_critic", "ActorCriticHead"),
         "TD3": ("actor_critic", "ActorCriticHead"), "CrossQ": ("crossq", "CrossQHead")}


def head_class(algo):
    """The hand-derived head for `algo`'s class, or None: a head is the loss of one built-in algorithm, so a
    subclass (which may change the loss) gets the derived phase."""
    import importlib

    cls = type(algo)
    spec = HEADS.get(cls.__name__)
    if spec is None or not cls.__module__.startswith("hetrl."):
        return None
    module = importlib.import_module(f"hetrl.kernels.compiled.{spec[0]}")
    return getattr(module, spec[1])


def derived_check(algo) -> str | None:
    """None where the derived phase may take `algo` (what is found only by tracing its learn, an operation without a
    lowering, is declined at its first phase, Kernel.declined); else one line why not."""
    who = f"{type(algo).__module__}.{type(algo).__qualname__}"
    if not callable(getattr(algo, "learn", None)):
        return f"{who} has no learn"
    modules = [m for m in vars(algo).values() if isinstance(m, torch.nn.Module)]
    for m in modules:
        for sub in m.modules():
            if isinstance(sub, (torch.nn.modules.conv._ConvNd, torch.nn.modules.pooling._MaxPoolNd)):
                return (f"{who}'s {type(sub).__name__} layers (pixels) stay on the public kernel: the compiled kernel "
                        "lowers matrix products and elementwise passes, not convolutions")
        for p in m.parameters():
            if p.device.type != "cpu":
                return (f"{who}'s networks are on {p.device.type}; the compiled kernel runs on the CPU (the CUDA-graph "
                        "kernel is the GPU path)")
            if p.dtype != torch.float32:
                return (f"{who}'s parameters are {p.dtype}; the compiled kernel runs float32 on the CPU "
                        "(make the networks float32, or use learner_kernel=public)")
    return None


# torch held to one thread while any compiled kernel of the process runs phases: the count it had before the first
# kernel held it comes back when the last one lets go, in whatever order they close (a population's members, a
# kernel timed beside another); each kernel keeping the count it found would leave one thread where the first
# closed before the second
_torch_hold: dict = {"users": 0, "threads": None}
_torch_lock = threading.Lock()


def _hold_torch() -> None:
    with _torch_lock:
        if _torch_hold["users"] == 0:
            _torch_hold["threads"] = torch.get_num_threads()
        _torch_hold["users"] += 1


def _release_torch() -> None:
    with _torch_lock:
        _torch_hold["users"] -= 1
        if _torch_hold["users"] <= 0:
            _torch_hold["users"] = 0
            torch.set_num_threads(int(_torch_hold["threads"]))


class LaneGuard:
    """A stall detector for a phase's lanes. A lane whose core another process holds makes the others wait for the
    task it is in; where that makes a phase on n lanes slower than the last estimate of the same phase on one lane,
    the phases run on one lane for a while (`hold` seconds, doubled at each stall in a row up to HOLD_MAX) and then
    try n lanes again. A stall is SLOW phases in a row slower than that estimate: one slow phase is the lanes waking
    after other work held the cores (another kernel timed beside this one, a thread count switched), and the first
    phase on n lanes of a shape, which makes their buffers, is not judged. A phase on one lane at least every PROBE_S
    seconds keeps the estimate fresh. Safe because a phase's results do not depend on its lanes (fixed tasks, summed
    in a fixed order)."""

    PROBE_S = 2.0
    HOLD_MIN, HOLD_MAX = 0.25, 8.0
    KEEP = 5          # one-lane times kept per shape (their median is the estimate)
    SLOW = 2          # n-lane phases in a row slower than the estimate that make a stall

    def __init__(self):
        self.one: dict[tuple, list[float]] = {}
        self.probed: dict[tuple, float] = {}
        self.solo_until = 0.0
        self.hold = self.HOLD_MIN
        self.fallbacks = 0
        self.made: set = set()   # the (lanes, shape)s whose first phase ran: it makes the lanes' buffers
        self.slow = 0            # n-lane phases in a row slower than the one-lane estimate

    def lanes(self, n: int, key: tuple, now: float) -> int:
        """The lanes the next phase of shape `key` runs on, of the n asked for."""
        if n <= 1 or now < self.solo_until:
            return 1 if n > 1 else n
        if key not in self.one or now - self.probed.get(key, 0.0) > self.PROBE_S:
            return 1   # (a probe: the one-lane estimate)
        return n

    def estimate(self, key: tuple) -> float | None:
        got = self.one.get(key)
        return sorted(got)[len(got) // 2] if got else None

    def record(self, n: int, key: tuple, seconds: float, now: float) -> None:
        if n <= 1:
            kept = self.one.setdefault(key, [])
            kept.append(seconds)
            del kept[:-self.KEEP]
            self.probed[key] = now
            return
        if (n, key) not in self.made:   # a first phase on n lanes makes their buffers: not a stall
            self.made.add((n, key))
            return
        one = self.estimate(key)
        if one is None or seconds <= one:
            self.slow, self.hold = 0, self.HOLD_MIN
            return
        self.slow += 1
        if self.slow >= self.SLOW:
            self.slow = 0
            self.solo_until = now + self.hold
            self.hold = min(2 * self.hold, self.HOLD_MAX)
            self.fallbacks += 1


class CompiledKernel(Kernel):
    """algo.learn(batches, weights) as one compiled call per phase (see the module's docstring).

    gemm: "mkl" | "openblas" | None (time both now, once per process; HETRL_SGEMM pins over either).
    critic_lanes: TD3's critics run a task each on the whole batch (False: row blocks through both, as the others).
    lane_guard: drop to one lane while several are slower (LaneGuard; False: always the learner's threads)."""

    name = "compiled"
    releases_gil = True      # a phase is numba code compiled with nogil: a population's members learn side by side
    # both paths run fixed tasks (row blocks, critics, parameter spans) summed in a fixed order: the same bits on any
    # number of lanes (an algorithm the derived phase declines runs the public learn: False on that kernel)
    threads_exact = True

    @classmethod
    def side_by_side(cls) -> bool:
        return threadsafe_layer() is None

    def __init__(self, algo, gemm: str | None = None, critic_lanes: bool = True, path: str | None = None,
                 lane_guard: bool = True, **options):
        why = self.check(algo) if path is None else self.check_path(algo, path)
        if why:
            raise ValueError(f"the compiled kernel does not take this algorithm: {why}")
        super().__init__(algo)
        t0 = time.perf_counter()
        self._gemm_note = ""
        bound = sgemm.chosen()
        if gemm is not None and bound is not None and gemm != bound and not sgemm.pinned():
            # a recorded choice (the machine's cache, a checkpoint) names a GEMM other than the one an earlier kernel
            # bound in this process: the products run on the bound one, and the figures and result.json say so
            self._gemm_note = (f"{bound}, not the recorded {gemm}: this process bound {bound} first (the GEMM is "
                               "bound once per process)")
            print(f"warning: the compiled kernel multiplies on {self._gemm_note}; results may differ from a run "
                  f"on {gemm} in the last bits", file=sys.stderr)
            gemm = bound
        self.gemm = sgemm.bind(gemm)
        self.path = path or self.path_for(algo)
        self.head = head_class(algo)(algo, critic_lanes=critic_lanes, **options) if self.path == "head" else None
        self.derived = Derived(algo) if self.path == "derived" else None
        self.guard = LaneGuard() if lane_guard else None
        self.declined = None
        self.threads = 0                # the learner's threads (use_threads); 0: torch's count
        self._holds_torch = False      # whether use_threads holds torch to one thread (_hold_torch)
        self._lanes = 0
        self._numba: dict[int, list[int]] = {}   # thread id -> [its count before, the count set]
        sgemm.limit_openblas()
        self._closed = False
        torch_threads = torch.get_num_threads()
        # numba's parallel regions share torch's OpenMP runtime, and their first launch in a process sets the count
        # torch reads to numba's: put it back
        if self.head is not None:
            self.head.warm(self.lanes(2))
        else:   # numba's parallel layer started here, so that torch's thread count is put back below
            vm.touch(np.zeros(2))
        torch.set_num_threads(torch_threads)
        self.compile_s = time.perf_counter() - t0

    @classmethod
    def path_for(cls, algo) -> str:
        """"head" where a hand-derived head is kept for algo's class and takes it, else "derived"."""
        head = head_class(algo)
        return "head" if head is not None and head.check(algo) is None else "derived"

    @classmethod
    def check(cls, algo) -> str | None:
        return cls.check_path(algo, cls.path_for(algo)) if available() is None else available()

    @classmethod
    def check_path(cls, algo, path: str) -> str | None:
        why = available()
        if why:
            return why
        if path == "head":
            head = head_class(algo)
            return (head.check(algo) if head is not None else
                    f"{type(algo).__qualname__} has no hand-derived head (its phase is derived from its learn)")
        if path != "derived":
            raise ValueError(f"path={path!r}: head or derived")
        return derived_check(algo)

    def lanes(self, B: int) -> int:
        """The lanes a phase splits its batch rows over: the learner's threads, at most numba's threads and B."""
        n = self.threads or torch.get_num_threads()
        return max(1, min(int(n), int(B), numba.config.NUMBA_NUM_THREADS))

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        nl = self.lanes(weights.shape[1])
        if self.head is not None and self.guard is not None:
            key, now = tuple(weights.shape), time.perf_counter()
            nl = self._lanes = self.guard.lanes(nl, key, now)
            self._numba_threads(nl)
            td = self.head.learn(batches, weights, nl)
            end = time.perf_counter()
            self.guard.record(nl, key, end - now, end)
            return td
        self._lanes = nl
        self._numba_threads(nl)
        if self.head is not None:
            return self.head.learn(batches, weights, nl)
        if self.declined is None:
            try:
                got = self.derived.learn(batches, weights, nl)
            except Declined as e:
                self.decline(str(e))
            else:
                if got is not None:
                    return got
        # the first phase (an optimizer's state is made by its first step), or an algorithm the compiler declined
        return self.algo.learn(batches, weights)

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling: the heads' (or the VM's) load or compile, and the derived phase's trace and
        lowering (made at its first traced phase)."""
        return self._compile_s + (self.derived.compile_s if getattr(self, "derived", None) is not None else 0.0)

    @compile_s.setter
    def compile_s(self, value: float) -> None:
        self._compile_s = value

    def decline(self, why: str) -> None:
        """Run the public learn from now on, and say why once (one line naming the operation and the algorithm)."""
        who = type(self.algo).__qualname__
        self.declined = why if who in why else f"{type(self.algo).__module__}.{who}: {why}"
        self.threads_exact = False
        print(f"warning: the compiled kernel runs the public learn: {self.declined}", file=sys.stderr)

    def _numba_threads(self, n: int) -> None:
        """numba's thread count for the calling thread (its own setting, per thread): n, changed only when it is not
        n already, the thread's own count remembered for close(). (Setting and restoring it around each phase cost
        ~40 us a call; where other code changes it in between, a phase runs its lanes on the threads it finds:
        the same result.)"""
        tid = threading.get_ident()
        got = self._numba.get(tid)
        if got is None:
            got = self._numba[tid] = [numba.get_num_threads(), -1]
        if got[1] != n:
            numba.set_num_threads(n)
            got[1] = n

    def use_threads(self, n: int) -> None:
        """Run the phases on n lanes (numba's threads, one GEMM thread each) and torch (the small ops around a
        phase: sampling, acting, publishing) on one: two thread pools on the same cores fight for them (a 2-thread
        SAC update took 12 ms with torch on two threads against 6 ms with torch on one)."""
        self.threads = max(1, int(n))
        if not self._holds_torch:
            self._holds_torch = True
            _hold_torch()
        torch.set_num_threads(1)

    def wrap_policy(self, policy):
        """The policy with the MLPs of its network (`policy.net`, where it has one: the built-ins' policies) run by the
        compiled pieces; any other policy as it is."""
        from hetrl.kernels.compiled.acting import wrap

        net = getattr(policy, "net", None)
        if isinstance(net, torch.nn.Module):
            wrap(net, self.gemm)
        return policy

    def prepare(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> None:
        """(Compiled in __init__; the lanes' buffers are made by the first phase of a shape.)"""

    def figures(self) -> dict:
        """{"gemm": the GEMM its products run on (the option that makes it again), "gemm_thin": the one its thin
        products run on (sgemm.THIN), "gemm_note": why not the one asked for (where so), "lanes": the last phase's,
        "lane_split": TD3's "critics" or "rows", "lane_fallbacks": the times a phase on several lanes was slower
        than on one and the next ran on one (where any),
        "learner_kernel_declined": why its phases run the public learn (where they do)}."""
        out = {"gemm": self.gemm, "gemm_thin": sgemm.chosen_thin(), "lanes": self._lanes}
        if sgemm.note() or self._gemm_note:
            out["gemm_note"] = self._gemm_note or sgemm.note()
        out["path"] = self.path
        if self.declined:   # (found at a phase: the public learn runs from then on; result.json says why)
            out["learner_kernel_declined"] = self.declined
        if self.head is not None and self.head.lane_split:
            out["lane_split"] = self.head.lane_split
        if self.guard is not None and self.guard.fallbacks:
            out["lane_fallbacks"] = self.guard.fallbacks
        if self.declined:
            out["declined"] = self.declined
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._holds_torch:
            self._holds_torch = False
            _release_torch()
        got = self._numba.pop(threading.get_ident(), None)   # (a thread's own: given back where close() runs)
        if got is not None:
            numba.set_num_threads(got[0])
        sgemm.restore_openblas()
