"""The float32 matrix product (GEMM) that the compiled kernels (compiled.py) call, from the faster BLAS here.

Every hetrl install has two single-precision GEMMs: scipy's OpenBLAS (what numba's np.dot calls) and, in
torch's x86 CPU library, Intel MKL's `sgemm_` (exported with `MKL_Set_Num_Threads_Local`; the lower-case
`mkl_set_num_threads_local` there is the Fortran entry, which takes a pointer). Which is faster depends on
the CPU: on an Intel Xeon with AVX-512 (2026-11-25) MKL ran a 256x400x300 product at 175-195 GFLOP/s on
one thread against OpenBLAS's 166-170, and the compiled DQN CartPole update took 16-21% less time, DDPG's,
TD3's and SAC's 7-20% less; on other CPUs (AMD's among them, where MKL may not take its fast paths) OpenBLAS may
lead. So `bind()` times both once per process on the products of a small MLP update (one thread each, ~20 ms)
and binds the faster under the symbol `hetrl_sgemm`, which compiled._dot calls: a symbol resolved by name when
a kernel is linked, so numba's cache of the kernels stays valid whichever is chosen. It must be bound before
the first kernel that multiplies is compiled or loaded from the cache (compiled.warm_up, the phases and
compiled.Acting call bind() first); it cannot change afterwards in that process. `HETRL_SGEMM=openblas|mkl`
pins the choice; bind() sets it for the processes this one starts (actors choose as the learner did).

Each call of the bound GEMM runs on one thread (the kernels' lanes are the parallelism): OpenBLAS through
threadpoolctl (compiled._limit_blas), MKL through its thread-local limit, set to 1 around each call and
restored (`hetrl_blas_local`, a no-op for OpenBLAS), so torch's own MKL calls on the same thread keep torch's
thread count.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from pathlib import Path

import numpy as np

ENV = "HETRL_SGEMM"
_bound: dict[str, object] = {}
_lock = threading.Lock()   # a learner thread and an acting thread may both ask first

try:  # numba is a dependency; compiled.available() reports its absence
    import numba
    from llvmlite import binding as _llvm
    from numba import types as _nt

    # void sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc): Fortran's, every argument a pointer
    SGEMM = _nt.ExternalFunction("hetrl_sgemm", _nt.void(*([_nt.intp] * 13)))
    # int set_local_threads(int n): MKL's thread-local limit (returns the previous one; 0: none), else a no-op
    BLAS_LOCAL = _nt.ExternalFunction("hetrl_blas_local", _nt.int32(_nt.int32))

    @numba.cfunc("int32(int32)", cache=True)
    def _no_local_limit(n):  # pragma: no cover - compiled
        return 0
except ImportError:  # pragma: no cover
    numba = None


def _fn(addr: int, restype, *argtypes):
    return ctypes.CFUNCTYPE(restype, *argtypes)(addr)


def candidates() -> dict[str, tuple[int, int]]:
    """name -> (address of its Fortran sgemm, address of its thread-local limit), for the GEMMs available here."""
    from numba.core.extending import get_cython_function_address

    out = {"openblas": (get_cython_function_address("scipy.linalg.cython_blas", "sgemm"), _no_local_limit.address)}
    import torch

    for lib in sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*")):
        try:
            so = ctypes.CDLL(str(lib))
            out["mkl"] = (ctypes.cast(so.sgemm_, ctypes.c_void_p).value,
                          ctypes.cast(so.MKL_Set_Num_Threads_Local, ctypes.c_void_p).value)
        except (OSError, AttributeError):  # a torch without MKL (e.g. an ARM build)
            pass
        break
    return out


def time_gemm(gemm: int, local: int, shapes=((64, 256, 256), (256, 256, 256)), reps: int = 10,
              rounds: int = 3) -> float:
    """Seconds for `reps` row-major products of each shape (the best of `rounds`), on one thread."""
    from threadpoolctl import threadpool_limits

    P = ctypes.c_void_p
    f = _fn(gemm, None, *([P] * 13))
    set_local = _fn(local, ctypes.c_int, ctypes.c_int)
    rng = np.random.default_rng(0)
    total = 0.0
    with threadpool_limits(1, user_api="blas"):
        prev = set_local(1)
        try:
            for m, k, n in shapes:
                a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
                c = np.empty((m, n), np.float32)
                # row-major C = A B is column-major C^T = B^T A^T
                ints = [ctypes.c_int(v) for v in (n, m, k, n, k, n)]
                one, zero, N = ctypes.c_float(1.0), ctypes.c_float(0.0), ctypes.c_char(b"N")
                args = [ctypes.addressof(N), ctypes.addressof(N), *(ctypes.addressof(i) for i in ints[:3]),
                        ctypes.addressof(one), b.ctypes.data, ctypes.addressof(ints[3]), a.ctypes.data,
                        ctypes.addressof(ints[4]), ctypes.addressof(zero), c.ctypes.data, ctypes.addressof(ints[5])]
                f(*args)
                best = float("inf")
                for _ in range(rounds):
                    t = time.perf_counter()
                    for _ in range(reps):
                        f(*args)
                    best = min(best, time.perf_counter() - t)
                total += best
        finally:
            set_local(prev)
    return total


def bind() -> str:
    """Bind `hetrl_sgemm` to the faster GEMM here (or the one HETRL_SGEMM names), once per process; its name."""
    if "name" in _bound:
        return _bound["name"]
    with _lock:
        return _bind_once()


def _bind_once() -> str:
    if "name" in _bound:
        return _bound["name"]
    have = candidates()
    want = os.environ.get(ENV, "").strip().lower()
    if want and want not in have:
        from hetrl.errors import UsageError

        raise UsageError(f"{ENV}={want}: not available here (available: {', '.join(have)}); unset it to let hetrl "
                         f"time them, or name one of those")
    times: dict[str, float] = {}
    if not want:
        if len(have) == 1:
            want = next(iter(have))
        else:
            for _ in range(2):   # alternating
                for name, (g, l) in have.items():
                    times[name] = min(times.get(name, float("inf")), time_gemm(g, l))
            want = min(times, key=times.get)
    g, l = have[want]
    _llvm.add_symbol("hetrl_sgemm", g)
    _llvm.add_symbol("hetrl_blas_local", l)
    _bound.update(name=want, seconds=times)
    os.environ.setdefault(ENV, want)
    return want


def chosen() -> str | None:
    """The bound GEMM's name (None before bind())."""
    return _bound.get("name")


def report() -> dict:
    """For the profile and `hetrl plan`: the bound GEMM and, where bind() timed them, each one's seconds."""
    return {"chosen": _bound.get("name"), **{f"{n}_s": t for n, t in _bound.get("seconds", {}).items()}}
