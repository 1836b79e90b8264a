"""The compiled CPU learner kernel (numba): per-layer pieces composed into each network's program, one loss head
per built-in algorithm, Adam once; see docs/compiled.md."""

from hetrl.kernels.compiled import cache  # noqa: F401  (first: numba's cache keyed to all of the package's sources)
from hetrl.kernels.compiled.kernel import CompiledKernel, available

__all__ = ["CompiledKernel", "available"]
