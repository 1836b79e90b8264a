"""The GEMM under the compiled kernels (hetrl/algos/sgemm.py, compiled._dot): numpy's products for every
operand layout the kernels pass, on each GEMM available here (OpenBLAS, MKL), chosen by timing or pinned."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hetrl.algos import compiled, sgemm

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba/scipy not installed")

CHECK = r"""
import ctypes, json, sys
import numpy as np
from hetrl.algos import compiled, sgemm
name = sgemm.bind()
rng = np.random.default_rng(0)
worst = 0.0
for m, k, n in [(64, 256, 256), (256, 4, 400), (1, 3, 400), (256, 300, 1), (5, 1, 7), (3, 0, 2)]:
    A, B = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    want = A.astype(np.float64) @ B.astype(np.float64)
    # row-major operands and transposed views (the kernels' W.T and g.T), out whole or a column block of a wider array
    for a in (A, np.ascontiguousarray(A.T).T):
        for b in (B, np.ascontiguousarray(B.T).T):
            wide = np.full((m, n + 3), 7.0, np.float32)
            for out in (np.full((m, n), 7.0, np.float32), wide[:, 1:n + 1]):
                compiled._dot(a, b, out)
                worst = max(worst, float(np.abs(out - want).max()) if out.size else 0.0)
            assert (wide[:, 0] == 7).all() and (wide[:, n + 1:] == 7).all()
local = None
if name == "mkl":   # the per-call one-thread limit is lifted again: torch's own MKL calls keep torch's count
    local = sgemm._fn(sgemm.candidates()["mkl"][1], ctypes.c_int, ctypes.c_int)(0)
print(json.dumps({"name": name, "worst": worst, "local": local}))
"""


def _run(env_value):
    env = {**os.environ, sgemm.ENV: env_value} if env_value else {k: v for k, v in os.environ.items() if k != sgemm.ENV}
    return subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", ["", *sgemm.candidates()])
def test_dot_equals_numpy_on_each_gemm(name):
    """compiled._dot gives A @ B for row-major and transposed operands and a strided out, on each GEMM (a fresh
    process each: the choice is bound once per process); unpinned, bind() picks one of them by timing."""
    p = _run(name)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["name"] == (name or got["name"]) and got["name"] in sgemm.candidates()
    assert got["worst"] < 1e-3
    assert got["local"] in (None, 0)


def test_an_unknown_gemm_is_one_clear_error():
    p = _run("nosuchblas")
    assert p.returncode != 0 and "HETRL_SGEMM=nosuchblas: not available here" in p.stderr


def test_dot_refuses_what_blas_cannot_read_and_mismatched_shapes():
    sgemm.bind()
    a, b = np.ones((4, 6), np.float32), np.ones((6, 5), np.float32)
    with pytest.raises(ValueError, match="shapes"):
        compiled._dot(a, b, np.empty((4, 4), np.float32))
    with pytest.raises(ValueError, match="in place"):
        compiled._dot(a[:, ::2], b[:3], np.empty((4, 5), np.float32))   # a column stride BLAS has no argument for


def test_time_gemm_runs_each_candidate():
    """time_gemm runs each candidate's products (what bind() compares) and returns their time."""
    for g, loc in sgemm.candidates().values():
        assert sgemm.time_gemm(g, loc, shapes=((8, 16, 8),), reps=2, rounds=1) > 0


def test_hetrl_plan_says_which_gemm_the_compiled_phase_uses():
    from hetrl.planner.explain import _kernel

    k = {"kernel": "compiled", "public_s": 1.2e-3, "compiled_s": 3e-4,
         "sgemm": {"chosen": "mkl", "openblas_s": 2.8e-3, "mkl_s": 2.2e-3}}
    assert _kernel(k) == ("compiled phase (numba) (fastest measured, ms/update: public 1.20, compiled 0.30), its matrix "
                          "products on mkl (faster here, ms per probe: openblas 2.8, mkl 2.2)")
    assert "matrix products" not in _kernel({**k, "kernel": "public"})
