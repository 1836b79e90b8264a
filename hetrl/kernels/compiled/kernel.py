"""CompiledKernel: an algorithm's learn as one numba call per phase, on its own parameters and optimizer state.

It wraps a built-in algorithm from outside: the loss head for its class (dqn.py, actor_critic.py, sac.py, crossq.py)
compiles each of its networks into a program over the per-layer pieces (layers.py) and steps its optimizers
with the one Adam (optim.py), on the GEMM bound for the process (sgemm.py). `check(algo)` says in one line why
it does not take an algorithm (a layer without a piece, dueling heads, pixels, a GPU, float64, ...).
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import torch

from hetrl.kernels.compiled import sgemm
from hetrl.kernels.kernel import Kernel

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None

# the built-in algorithms' classes, by name, and their heads' modules
HEADS = {"DQN": ("dqn", "DQNHead"), "DDPG": ("actor_critic", "ActorCriticHead"),
         "TD3": ("actor_critic", "ActorCriticHead"), "SAC": ("sac", "SACHead"), "CrossQ": ("crossq", "CrossQHead")}


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
        _touch(np.zeros(2))
        layer = numba.threading_layer()
    return None if layer in ("omp", "tbb") else (
        f"numba's threading layer is {layer}, which one thread at a time may enter (install TBB, `pip install tbb`, "
        "or use a numba built with OpenMP for members side by side)")


if numba is not None:
    @numba.njit(cache=True, parallel=True)
    def _touch(x):
        for i in numba.prange(x.shape[0]):
            x[i] += 1.0


def head_class(algo):
    """The head for `algo`'s class, or a line saying why none: a head is the loss of one built-in algorithm, so
    a subclass (which may change the loss) is not taken."""
    import importlib

    cls = type(algo)
    spec = HEADS.get(cls.__name__)
    if spec is None or not cls.__module__.startswith("hetrl."):
        return (f"the algorithm is {cls.__module__}.{cls.__name__}; the compiled kernel has loss heads for hetrl's "
                f"{', '.join(HEADS)} only")
    module = importlib.import_module(f"hetrl.kernels.compiled.{spec[0]}")
    return getattr(module, spec[1])


class CompiledKernel(Kernel):
    """algo.learn(batches, weights) as one compiled call per phase (see the module's docstring).

    gemm: "mkl" | "openblas" | None (time both now, once per process; HETRL_SGEMM pins over either).
    critic_lanes: TD3 on two threads runs a critic per lane (False: the batch's rows split, as the others)."""

    name = "compiled"
    releases_gil = True      # a phase is numba code compiled with nogil: a population's members learn side by side

    @classmethod
    def side_by_side(cls) -> bool:
        return threadsafe_layer() is None

    def __init__(self, algo, gemm: str | None = None, critic_lanes: bool = True, **options):
        why = self.check(algo)
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
        self.head = head_class(algo)(algo, critic_lanes=critic_lanes, **options)
        self.threads = 0                # the learner's threads (use_threads); 0: torch's count
        self._torch_threads: int | None = None   # torch's count before use_threads set it to one
        self._lanes = 0
        self._numba: dict[int, list[int]] = {}   # thread id -> [its count before, the count set]
        sgemm.limit_openblas()
        self._closed = False
        torch_threads = torch.get_num_threads()
        # numba's parallel regions share torch's OpenMP runtime, and their first launch in a process sets the count
        # torch reads to numba's: put it back
        self.head.warm(self.lanes(2))
        torch.set_num_threads(torch_threads)
        self.compile_s = time.perf_counter() - t0

    @classmethod
    def check(cls, algo) -> str | None:
        why = available()
        if why:
            return why
        head = head_class(algo)
        return head if isinstance(head, str) else head.check(algo)

    def lanes(self, B: int) -> int:
        """The lanes a phase splits its batch rows over: the learner's threads, at most numba's threads and B."""
        n = self.threads or torch.get_num_threads()
        return max(1, min(int(n), int(B), numba.config.NUMBA_NUM_THREADS))

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        nl = self._lanes = self.lanes(weights.shape[1])
        self._numba_threads(nl)
        return self.head.learn(batches, weights, nl)

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
        if self._torch_threads is None:
            self._torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def wrap_policy(self, policy):
        from hetrl.kernels.compiled.acting import wrap

        wrap(policy.net, self.gemm)
        return policy

    def prepare(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> None:
        """(Compiled in __init__; the lanes' buffers are made by the first phase of a shape.)"""

    def figures(self) -> dict:
        """{"gemm": the GEMM its products run on (the option that makes it again), "gemm_note": why not the one
        asked for (where so), "lanes": the last phase's, "lane_split": TD3's "critics" or "rows"}."""
        out = {"gemm": self.gemm, "lanes": self._lanes}
        if sgemm.note() or self._gemm_note:
            out["gemm_note"] = self._gemm_note or sgemm.note()
        if self.head.lane_split:
            out["lane_split"] = self.head.lane_split
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._torch_threads is not None:
            torch.set_num_threads(self._torch_threads)
            self._torch_threads = None
        got = self._numba.pop(threading.get_ident(), None)   # (a thread's own: given back where close() runs)
        if got is not None:
            numba.set_num_threads(got[0])
        sgemm.restore_openblas()
