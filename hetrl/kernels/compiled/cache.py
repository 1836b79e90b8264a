"""numba's cache of the compiled kernel, keyed to all of the kernel's numba source files.

numba keys a cached function to its own source file only, but a head's machine code contains the pieces it
calls from the other files (layers.py, optim.py, sgemm.py): after an edit of one of those, the heads would load
stale code from the cache. Here every function of this package is stamped with a hash of all of the package's numba
sources instead, by wrapping numba's cache locators (where they are found; otherwise numba's own keys stay).
Imported by the package before any of its numba functions is defined.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_memo: dict[tuple, bytes] = {}


def _compiled_here(f: Path) -> bool:
    """Whether a source file defines numba functions (the compiler's Python-only stages, tracing and lowering, do
    not: an edit of those keeps the machine code cached)."""
    text = f.read_text()
    return "numba.njit" in text or "numba.cfunc" in text


def package_stamp() -> bytes:
    """A hash of every .py file of this package that defines numba functions (memoised on the package's files'
    sizes and modification times)."""
    files = sorted(PACKAGE.glob("*.py"))
    key = tuple((f.name, st.st_mtime_ns, st.st_size) for f in files for st in [os.stat(f)])
    got = _memo.get(key)
    if got is None:
        h = hashlib.sha256()
        for f in filter(_compiled_here, files):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        got = _memo[key] = h.digest()
    return got


def _install() -> None:
    try:
        from numba.core import caching

        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl   # (named so since numba 0.61)
        classes = list(impl._locator_classes)
    except (ImportError, AttributeError):   # another numba: its own per-file keys stay
        return
    if any(getattr(c, "_hetrl_package_stamp", False) for c in classes):
        return

    def stamped(base):
        class Locator(base):
            _hetrl_package_stamp = True

            @classmethod
            def from_function(cls, py_func, py_file):
                if Path(py_file).resolve().parent != PACKAGE:
                    return None
                return super().from_function(py_func, py_file)

            def get_source_stamp(self):
                return package_stamp()

        Locator.__name__ = f"Package{base.__name__}"
        return Locator

    impl._locator_classes = [stamped(c) for c in classes if hasattr(c, "get_source_stamp")] + classes


_install()
