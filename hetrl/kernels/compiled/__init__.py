"""The compiled CPU learner kernel (numba): per-layer pieces composed into each network's program, one loss head
per built-in algorithm, Adam once; see docs/compiled.md.

The kernel module (the learner's VM, its heads, the tracer and scipy) is imported on first use of
`CompiledKernel` or `available`: an actor process that only acts through the compiled pieces (acting.py, a
policy unpickled there) does not load the learner."""

from hetrl.kernels.compiled import cache  # noqa: F401  (first: numba's cache keyed to all of the package's sources)

__all__ = ["CompiledKernel", "available"]


def __getattr__(name: str):
    if name in __all__:
        from hetrl.kernels.compiled import kernel

        return getattr(kernel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
