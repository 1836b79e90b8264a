"""Nameless shared memory for the local schedule, and the seqlock parameter store.

:class:`SharedArrays` is a group of NumPy arrays in one block of shared memory that has *no name in any file system*: it
is a ``memfd_create`` file (Linux), or, where that call is missing, a file in /dev/shm (or the temp dir) that is
unlinked right after it is opened.  The block lives as long as some process holds its file descriptor or a mapping of
it, so nothing can be left behind in /dev/shm whatever happens to the processes (SIGKILL included), and no resource
tracker is involved.  Children get the block as a ``Process`` argument: pickling passes the descriptor itself
(``multiprocessing.reduction.DupFd``: ``pass_fds`` under spawn, SCM_RIGHTS to the forkserver, multiprocessing's resource
sharer over a Connection).

:class:`SharedParameterStore` keeps versioned weights in a :class:`SharedArrays` with a seqlock: the writer makes the
sequence counter odd, writes, stores the version and makes the counter even again; a reader copies the weights and keeps
them only if the counter was even and unchanged across the copy.  Neither side ever waits: a torn read is dropped and
retried at the reader's next look (x86-64 keeps stores in order and loads in order, which is all this needs).
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from multiprocessing.reduction import DupFd
from typing import Mapping

import numpy as np
import torch

_ALIGN = 64  # every array starts on a cache line


def _anonymous_fd(nbytes: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("hetrl-local", getattr(os, "MFD_CLOEXEC", 0))
    else:  # pragma: no cover - non-Linux fallback: unlink at once, keep only the descriptor
        d = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="hetrl-", dir=d)
        os.unlink(path)
    os.ftruncate(fd, max(nbytes, 1))
    return fd


def _layout(fields: Mapping[str, tuple[tuple[int, ...], object]]) -> tuple[dict, int]:
    offsets, pos = {}, 0
    for name, (shape, dtype) in fields.items():
        dt = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        offsets[name] = (pos, shape, dt.str)
        pos += -(-int(np.prod(shape, dtype=np.int64)) * dt.itemsize // _ALIGN) * _ALIGN
    return offsets, pos


def _unpickle_shared(dupfd, layout: dict, nbytes: int) -> "SharedArrays":
    block = SharedArrays.__new__(SharedArrays)
    block._setup(dupfd.detach(), layout, nbytes)
    return block


class SharedArrays:
    """Named NumPy arrays in one nameless shared block (``block["obs"]``: an ndarray view), allocated zeroed from
    ``{name: (shape, dtype)}``; sent to a child ``Process``, it gives the child views of the same memory."""

    def __init__(self, fields: Mapping[str, tuple[tuple[int, ...], object]]):
        layout, nbytes = _layout(fields)
        self._setup(_anonymous_fd(nbytes), layout, nbytes)

    def _setup(self, fd: int, layout: dict, nbytes: int) -> None:
        self._fd, self._layout, self.nbytes = fd, layout, nbytes
        self._mm = mmap.mmap(fd, max(nbytes, 1))
        buf = np.frombuffer(self._mm, dtype=np.uint8)
        self.arrays: dict[str, np.ndarray] = {}
        for name, (off, shape, dt) in layout.items():
            dt = np.dtype(dt)
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            self.arrays[name] = buf[off:off + n].view(dt).reshape(shape)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __reduce__(self):
        if self._fd < 0:
            raise RuntimeError("SharedArrays was closed; it cannot be sent to a new process")
        return _unpickle_shared, (DupFd(self._fd), self._layout, self.nbytes)

    def close(self) -> None:
        """Drop this process's descriptor (views stay valid while referenced)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SharedParameterStore:
    """The seqlock parameter store (hetrl/runtime/params.py's interface), built from an example state dict (names,
    shapes, dtypes): ``publish`` by the one writer, ``latest`` by any number of readers (actor processes)."""

    def __init__(self, example: Mapping[str, torch.Tensor]):
        fields = {"header": ((2,), "int64")}
        for k, v in example.items():
            fields["p:" + k] = (tuple(v.shape), np.dtype(str(v.dtype).replace("torch.", "")).str)
        self.__setstate__({"names": list(example), "block": SharedArrays(fields)})
        self.block["header"][:] = (0, -1)

    def __getstate__(self):
        return {"names": self.names, "block": self.block}

    def __setstate__(self, state):
        """The store over `block` (a new one, or one sent to this process): views of its weights, a local copy."""
        self.names, self.block = state["names"], state["block"]
        self._shared = {k: torch.from_numpy(self.block["p:" + k]) for k in self.names}
        self._local = {k: v.clone() for k, v in self._shared.items()}

    def publish(self, state: Mapping[str, torch.Tensor]) -> int:
        h = self.block["header"]
        version = int(h[1]) + 1
        h[0] += 1                                   # odd: writing
        with torch.no_grad():
            for k in self.names:
                self._shared[k].copy_(state[k].detach())
        h[1] = version
        h[0] += 1                                   # even: consistent
        return version

    def latest(self, have: int) -> tuple[dict[str, torch.Tensor], int] | None:
        """The newest weights if newer than `have` (None when not), read without tearing: a read the
        writer came by is dropped and read again, so the caller never acts on weights older than the
        last publication before the call (the policy-lag bound counts on it). The returned tensors are
        this reader's buffer: load them before the next read."""
        h = self.block["header"]
        tries = 0
        while True:
            s1 = int(h[0])
            version = int(h[1])
            if s1 & 1:                              # the writer is in the middle of a publication (a copy of
                tries += 1                          # the weights: microseconds); a stopped writer costs no CPU
                time.sleep(0 if tries < 1000 else 1e-3)
                continue
            if version <= have:
                return None
            for k in self.names:
                self._local[k].copy_(self._shared[k])
            if int(h[0]) == s1:
                return self._local, version
