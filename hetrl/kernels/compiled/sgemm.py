"""The float32 matrix product (GEMM) under the compiled kernel: `dot(a, b, out)`, callable from numba.

Every hetrl install has two single-precision GEMMs: scipy's OpenBLAS and, in torch's x86 CPU library, Intel
MKL's `sgemm_` (exported there with `MKL_Set_Num_Threads_Local`). Which is faster depends on the CPU (MKL may
not take its fast paths on AMD's), so the choice is made once per process, before the first kernel that
multiplies is linked, by `bind(name)`:

* `bind("mkl")` / `bind("openblas")`: that one (the caller passes the choice it recorded: a run's profile and
  checkpoint, a learner's choice handed to its actor processes);
* `bind(None)`: the machine's choice, recorded in its kernel cache (`select.machine_gemm()`) by the first probe
  on the machine: a probe times both on a small MLP update's products (one thread each, ~20 ms,
  alternating) and takes the faster. Probing once per machine keeps every process, and every learner shape
  whose kernel choice is measured later, on the same GEMM, and so on the same floating-point path;
* `HETRL_SGEMM=mkl|openblas` in the environment pins it over either (read only: nothing here writes the
  environment).

*Thin products* (an output of at most THIN columns and more rows than that: a first layer's weight gradient
on a few observation features, the gradient into a critic's few action inputs) get a GEMM of their own, bound
beside the main one: the faster of the two on such products, by a probe of its own recorded in the same place
(`select.machine_gemm("thin")`), and the pinned one where HETRL_SGEMM is set. Libraries differ most there: on an
AMD EPYC whose faster GEMM on wide products is MKL, MKL took 122 us for a 256 x 4 output over 400 (6.7 GFLOP/s)
and OpenBLAS 15. Which one runs is a function of the product's shape only, so a phase's bits still do not depend
on its lanes.

MKL's symbols are looked up by name in torch's shared library; builds without them (other platforms, a torch
that keeps them local) leave OpenBLAS, and `note()` says why. The chosen function is bound to a symbol that
`dot` calls and numba resolves by name when it links a kernel, so numba's cache of the kernels stays valid
whichever GEMM is bound; for that reason the choice cannot change later in the process.

Each call runs on one thread (the kernel's lanes are the parallelism): MKL through its thread-local limit, set
to 1 around each call and restored (torch's own MKL calls on that thread keep torch's count); OpenBLAS through
threadpoolctl, on the one library `dot` calls (`limit_openblas`, undone by `restore_openblas`).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from pathlib import Path

import numpy as np

ENV = "HETRL_SGEMM"
NAMES = ("mkl", "openblas")
THIN = 8          # a row-major product whose output has at most THIN columns and more rows is thin
THIN_SHAPES = ((256, 400, 4), (400, 256, 3))   # (m, k, n) of its probe: a critic's input gradient, a weight's
_bound: dict[str, object] = {}
_lock = threading.Lock()   # a learner thread and an acting thread may both ask first

try:  # numba is a dependency; the kernel's check() reports its absence
    import numba
    from llvmlite import binding as _llvm
    from numba import types as _nt

    # void sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc): Fortran's, every argument a pointer
    SGEMM = _nt.ExternalFunction("hetrl_kernels_sgemm", _nt.void(*([_nt.intp] * 13)))
    # int set_local_threads(int n): MKL's thread-local limit (returns the previous one; 0: none), else a no-op
    BLAS_LOCAL = _nt.ExternalFunction("hetrl_kernels_blas_local", _nt.int32(_nt.int32))
    # the same two for thin products (THIN)
    SGEMM_THIN = _nt.ExternalFunction("hetrl_kernels_sgemm_thin", _nt.void(*([_nt.intp] * 13)))
    BLAS_LOCAL_THIN = _nt.ExternalFunction("hetrl_kernels_blas_local_thin", _nt.int32(_nt.int32))

    @numba.cfunc("int32(int32)", cache=True)
    def _no_local_limit(n):  # pragma: no cover - compiled
        return 0
except ImportError:  # pragma: no cover
    numba = None


def _fn(addr: int, restype, *argtypes):
    return ctypes.CFUNCTYPE(restype, *argtypes)(addr)


def _mkl() -> tuple[tuple[int, int] | None, str]:
    """(address of MKL's sgemm_, of MKL_Set_Num_Threads_Local) in torch's CPU library, or None and why not."""
    import torch

    libs = sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*"))
    if not libs:
        return None, "this torch has no libtorch_cpu library to take MKL's sgemm_ from"
    try:
        so = ctypes.CDLL(str(libs[0]))
        return (ctypes.cast(so.sgemm_, ctypes.c_void_p).value,
                ctypes.cast(so.MKL_Set_Num_Threads_Local, ctypes.c_void_p).value), ""
    except (OSError, AttributeError):
        return None, f"MKL's sgemm_ is not exported by this torch ({libs[0].name})"


def candidates() -> dict[str, tuple[int, int]]:
    """name -> (address of its Fortran sgemm, address of its thread-local limit), for the GEMMs available here."""
    from numba.core.extending import get_cython_function_address

    out = {"openblas": (get_cython_function_address("scipy.linalg.cython_blas", "sgemm"), _no_local_limit.address)}
    mkl, _ = _mkl()
    if mkl is not None:
        out["mkl"] = mkl
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


def _usage(msg: str):
    from hetrl.errors import UsageError

    return UsageError(msg)


def pinned() -> str | None:
    """The GEMM HETRL_SGEMM names (None: unset); an unknown name is one line naming it."""
    want = os.environ.get(ENV, "").strip().lower()
    if want and want not in NAMES:
        raise _usage(f"{ENV}={want}: not a GEMM hetrl knows; unset it to let hetrl time them, or name one of "
                     f"{', '.join(NAMES)}")
    return want or None


def bind(name: str | None = None) -> str:
    """Bind the GEMM `dot` calls, once per process, and return its name: HETRL_SGEMM's if set, else `name`
    ("mkl" or "openblas"; MKL where this torch has no MKL symbols falls back to OpenBLAS, see note()), else the
    faster of the two by a probe. Asking again for the one bound returns it; asking for another is an error (the
    kernels already linked call the bound one)."""
    if name is not None and name not in NAMES:
        raise _usage(f"gemm={name!r}: not a GEMM hetrl knows; use one of {', '.join(NAMES)}, or None to time them")
    with _lock:
        if "name" not in _bound:
            _bind_once(name)
    got = _bound["name"]
    if name is not None and name != got and not pinned() and not (name == "mkl" and _bound.get("note")):
        raise _usage(f"gemm={name!r}: this process's compiled kernels already multiply on {got} (the GEMM is "
                     f"bound once per process); start a new process to use {name}")
    return got


def _bind_once(name: str | None) -> None:
    have = candidates()
    _, why_no_mkl = _mkl()
    want = pinned() or name
    note = ""
    if want == "mkl" and "mkl" not in have:
        note, want = f"OpenBLAS, since {why_no_mkl}", "openblas"
    times: dict[str, float] = {}
    if not want:
        if len(have) == 1:
            want, note = "openblas", f"OpenBLAS, since {why_no_mkl}"
        else:
            from hetrl.kernels.select import machine_gemm, remember_gemm

            want = machine_gemm()
            if want not in have:
                for _ in range(2):   # alternating
                    for n, (g, loc) in have.items():
                        times[n] = min(times.get(n, float("inf")), time_gemm(g, loc))
                want = min(times, key=times.get)
                remember_gemm(want, times)
    thin, thin_times = _thin_choice(have, want)
    g, loc = have[want]
    _llvm.add_symbol("hetrl_kernels_sgemm", g)
    _llvm.add_symbol("hetrl_kernels_blas_local", loc)
    _llvm.add_symbol("hetrl_kernels_sgemm_thin", have[thin][0])
    _llvm.add_symbol("hetrl_kernels_blas_local_thin", have[thin][1])
    _bound.update(name=want, seconds=times, note=note, address=g, thin=thin, thin_seconds=thin_times,
                  thin_address=have[thin][0],
                  by="pinned" if pinned() else "asked" if name else "probe" if times else "machine")


def _thin_choice(have: dict, want: str) -> tuple[str, dict]:
    """The GEMM for thin products: the pinned one (HETRL_SGEMM), else the machine's recorded choice, else the
    faster of the two on THIN_SHAPES (timed alternating, recorded for every later process)."""
    if pinned() or len(have) == 1:
        return want, {}
    from hetrl.kernels.select import machine_gemm, remember_gemm

    got = machine_gemm("thin")
    if got in have:
        return got, {}
    times: dict[str, float] = {}
    for _ in range(2):   # alternating
        for n, (g, loc) in have.items():
            times[n] = min(times.get(n, float("inf")), time_gemm(g, loc, THIN_SHAPES))
    thin = min(times, key=times.get)
    remember_gemm(thin, times, "thin")
    return thin, times


def chosen() -> str | None:
    """The bound GEMM's name (None before bind())."""
    return _bound.get("name")


def chosen_thin() -> str | None:
    """The GEMM bound for thin products (None before bind())."""
    return _bound.get("thin")


def note() -> str:
    """Why the bound GEMM is not the one asked for or the faster one ('' when it is)."""
    return str(_bound.get("note", ""))


def report() -> dict:
    """For the profile and `hetrl plan`: the bound GEMM, where bind() timed them each one's seconds, and the note."""
    out = {"chosen": _bound.get("name"), "by": _bound.get("by"),
           **{f"{n}_s": t for n, t in _bound.get("seconds", {}).items()}, "thin": _bound.get("thin"),
           **{f"thin_{n}_s": t for n, t in _bound.get("thin_seconds", {}).items()}}
    if _bound.get("note"):
        out["note"] = _bound["note"]
    return out


# ---- OpenBLAS's own thread pool: one thread while the kernels call it ---------------------------------
_openblas: dict[str, object] = {"users": 0, "limiter": None}


def _library_of(addr: int) -> str | None:
    """The path of the shared library that holds the function at `addr` (dladdr), or None where unknown."""
    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
    try:
        libc = ctypes.CDLL(None)
        info = DlInfo()
        if libc.dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (OSError, AttributeError):
        pass
    return None


def limit_openblas() -> None:
    """Hold the OpenBLAS library `dot` calls to one thread (nothing for MKL, limited per call); counted, so that
    each kernel's restore_openblas() undoes it only when no other kernel in the process still needs it."""
    if "openblas" not in (_bound.get("name"), _bound.get("thin")):
        return
    with _lock:
        _openblas["users"] = int(_openblas["users"]) + 1
        if _openblas["limiter"] is None:
            from threadpoolctl import ThreadpoolController

            ctl = ThreadpoolController()
            path = _library_of(int(_bound["address" if _bound.get("name") == "openblas" else "thin_address"]))
            picked = ctl.select(filepath=path) if path else ctl.select(internal_api="openblas")
            if not picked.lib_controllers:   # (the library not found by its path: every OpenBLAS)
                picked = ctl.select(internal_api="openblas")
            _openblas["limiter"] = picked.limit(limits=1)


def restore_openblas() -> None:
    """Undo one limit_openblas(): the library's own thread count again once no kernel holds it."""
    with _lock:
        if _openblas["limiter"] is None:
            return
        _openblas["users"] = int(_openblas["users"]) - 1
        if _openblas["users"] <= 0:
            _openblas["limiter"].restore_original_limits()
            _openblas.update(users=0, limiter=None)


if numba is not None:
    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def _major(x):  # pragma: no cover - compiled
        """How BLAS can read the float32 matrix x: (0, ld) row-major with leading dimension ld, (1, ld)
        column-major (a transposed view), (-1, 0) neither."""
        r, c = x.shape
        s0, s1 = x.strides[0] // 4, x.strides[1] // 4
        if (c == 1 or s1 == 1) and (r == 1 or s0 >= c):
            return 0, max(s0 if r > 1 else c, 1)
        if (r == 1 or s0 == 1) and (c == 1 or s1 >= r):
            return 1, max(s1 if c > 1 else r, 1)
        return -1, 0

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def gemm(a, b, out, beta):  # pragma: no cover - compiled
        """out = a @ b + beta * out (float32, 2-D; a and b row-major or transposed views, out row-major) on the
        bound GEMM, on one thread. Row-major C = A B is BLAS's column-major C^T = B^T A^T."""
        m, k = a.shape
        n = b.shape[1]
        if b.shape[0] != k or out.shape[0] != m or out.shape[1] != n:
            raise ValueError("dot: shapes do not match")
        if m == 0 or n == 0:
            return
        if k == 0:
            if beta == 0:
                out[:] = 0
            return
        ma, lda = _major(a)
        mb, ldb = _major(b)
        mc, ldc = _major(out)
        if ma < 0 or mb < 0 or mc != 0:
            raise ValueError("dot: an operand BLAS cannot read in place (out must be row-major)")
        ii = np.empty(6, np.int32)
        ii[0], ii[1], ii[2], ii[3], ii[4], ii[5] = n, m, k, ldb, lda, ldc
        ff = np.empty(2, np.float32)
        ff[0], ff[1] = 1.0, beta
        tt = np.empty(2, np.uint8)
        tt[0] = 78 if mb == 0 else 84   # 'N' / 'T'
        tt[1] = 78 if ma == 0 else 84
        call(m, n, tt, ii, ff, a.ctypes.data, b.ctypes.data, out.ctypes.data)

    @numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
    def call(m, n, tt, ii, ff, pa, pb, pc):  # pragma: no cover - compiled
        """Fortran's sgemm for a row-major (m x n) C at pc from A at pa and B at pb (tt: the transposes, ii: the
        column-major n, m, k, ldb, lda, ldc, ff: alpha, beta) on one thread: on the thin products' GEMM where the
        output is thin (THIN), else on the bound one."""
        if n <= THIN and m > THIN:
            prev = BLAS_LOCAL_THIN(1)
            SGEMM_THIN(tt[0:].ctypes.data, tt[1:].ctypes.data, ii[0:].ctypes.data, ii[1:].ctypes.data,
                       ii[2:].ctypes.data, ff[0:].ctypes.data, pb, ii[3:].ctypes.data, pa, ii[4:].ctypes.data,
                       ff[1:].ctypes.data, pc, ii[5:].ctypes.data)
            BLAS_LOCAL_THIN(prev)
            return
        prev = BLAS_LOCAL(1)
        SGEMM(tt[0:].ctypes.data, tt[1:].ctypes.data, ii[0:].ctypes.data, ii[1:].ctypes.data,
              ii[2:].ctypes.data, ff[0:].ctypes.data, pb, ii[3:].ctypes.data, pa, ii[4:].ctypes.data,
              ff[1:].ctypes.data, pc, ii[5:].ctypes.data)
        BLAS_LOCAL(prev)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def dot(a, b, out):  # pragma: no cover - compiled
        """out = a @ b (np.dot(a, b, out)) on the bound GEMM, on one thread (see gemm)."""
        gemm(a, b, out, np.float32(0.0))
