"""Preallocated struct-of-arrays ring buffer holding the raw replay data.

One array per field (``obs``, ``action``, ``reward`` ...), each of shape
``(capacity, *item_shape)`` with the field's own dtype, allocated once.  No
Python object is created per transition: ``insert`` writes a whole batch with
at most two slice assignments per field (the batch may straddle the end of
the ring), ``get`` gathers a batch of rows with one indexing call per field.

Placement:

* CPU: NumPy arrays (optionally supplied by the caller through ``buffers``,
  e.g. arrays backed by shared memory so several processes see one replay).
  ``get`` returns CPU torch tensors that own their memory (a gather always
  copies), so the learner may keep them after the ring is overwritten.
* CUDA (any non-CPU torch device): torch tensors on the device.  ``insert``
  copies each field of the batch to the device once, through pinned host
  memory and asynchronously (`PinnedStaging`: two pinned buffers per field in
  turn, each reused only once its last copy has finished, so the caller may
  reuse its arrays at once); ``get`` indexes on the device.

``get`` on CPU gathers with NumPy and wraps the result with
``torch.from_numpy``: ``arr[idx]`` for 1-D fields (fancy indexing of a
scalar column is NumPy's fastest path, about twice as fast as ``np.take``),
``np.take(arr, idx, axis=0)`` for fields with an item shape (it copies whole
rows, up to twice as fast as fancy indexing for small rows).  Large rows (frames) are memory-bound and every NumPy way ties;
indexing a torch tensor (``tensor[idx]``) is several times slower for every
field, about 10x for frames.  ``python benchmarks/bench_storage.py`` times
the four ways.
"""

from __future__ import annotations

from typing import Mapping, Union

import numpy as np
import torch

from hetrl.replay.memory import check_replay_memory

Spec = dict[str, tuple[tuple[int, ...], Union[np.dtype, str]]]
"""field -> (per-item shape, numpy dtype)."""

ArrayLike = Union[np.ndarray, torch.Tensor]


def torch_dtype(dtype: np.dtype | str) -> torch.dtype:
    """The torch dtype matching a numpy dtype (e.g. float32 -> torch.float32)."""
    return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype


def normalize_spec(spec: Mapping[str, tuple]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Validate a spec and return it with tuple shapes and ``np.dtype`` dtypes."""
    if not spec:
        raise ValueError("Storage spec is empty; pass {field: (item_shape, dtype)}, e.g. {'obs': ((4,), 'float32')}.")
    out = {}
    for name, entry in spec.items():
        try:
            shape, dtype = entry
            shape = tuple(int(d) for d in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"Storage spec field {name!r} must be (item_shape, dtype), e.g. ((4,), 'float32'); got {entry!r}."
            ) from err
        if any(d < 0 for d in shape):
            raise ValueError(f"Storage spec field {name!r} has a negative dimension in shape {shape}.")
        if dtype.hasobject:
            raise ValueError(f"Storage spec field {name!r} has object dtype; use a numeric or bool dtype.")
        out[str(name)] = (shape, dtype)
    return out


class Storage:
    """Fixed-capacity ring buffer of typed fields.

    Args:
        capacity: number of items (rows) held, > 0.
        spec: ``{field: (item_shape, dtype)}``.
        device: where the arrays live; ``"cpu"`` -> NumPy arrays, else torch tensors.
        buffers: CPU only, optional preallocated arrays ``{field: array}`` of shape
            ``(capacity, *item_shape)`` and the spec's dtype (e.g. shared memory).
            Fields not given are allocated here, after :func:`check_replay_memory` made sure the
            device has the memory (``UsageError`` naming the largest capacity that fits otherwise).
    """

    dead = 0                                 # rows evicted early (FrameStorage may; never here)
    evicted = np.empty(0, dtype=np.int64)    # rows the last insert evicted early

    def __init__(
        self,
        capacity: int,
        spec: Spec,
        device: str | torch.device = "cpu",
        buffers: dict[str, np.ndarray] | None = None,
    ) -> None:
        if int(capacity) <= 0:
            raise ValueError(f"Storage capacity must be > 0, got {capacity}; pass the number of transitions to keep.")
        self.capacity = int(capacity)
        self.spec = normalize_spec(spec)
        self.device = torch.device(device)
        self.on_cpu = self.device.type == "cpu"
        self.size = 0
        self.pos = 0
        buffers = dict(buffers or {})
        unknown = set(buffers) - set(self.spec)
        if unknown:
            raise ValueError(f"Storage buffers has fields {sorted(unknown)} not in the spec; remove them or add them to the spec.")
        if buffers and not self.on_cpu:
            raise ValueError(f"Storage buffers are only supported on CPU, not on {self.device}; drop buffers or use device='cpu'.")
        # before any allocation: refuse (UsageError, one line) what the device cannot hold, warn above 80%
        own = {k: v for k, v in self.spec.items() if k not in buffers}
        check_replay_memory(own, self.capacity, self.device)
        self._np: dict[str, np.ndarray] = {}
        self._t: dict[str, torch.Tensor] = {}
        for name, (shape, dtype) in self.spec.items():
            full = (self.capacity, *shape)
            if self.on_cpu:
                if name in buffers:
                    arr = buffers[name]
                    if not isinstance(arr, np.ndarray) or arr.shape != full or arr.dtype != dtype:
                        got = (getattr(arr, "shape", None), getattr(arr, "dtype", type(arr).__name__))
                        raise ValueError(
                            f"Storage buffer for field {name!r} must be a numpy array of shape {full} and dtype {dtype}; "
                            f"got shape/dtype {got}."
                        )
                else:
                    arr = np.zeros(full, dtype=dtype)
                self._np[name] = arr
            else:
                self._t[name] = torch.zeros(full, dtype=torch_dtype(dtype), device=self.device)
        self._staging = PinnedStaging(self.spec, self.device) if self.device.type == "cuda" else None

    # ------------------------------------------------------------------ write
    def insert(self, batch: Mapping[str, ArrayLike]) -> np.ndarray:
        """Write the rows of ``batch`` at ``pos`` (wrapping); return their int64 slots.

        Every spec field must be present with shape ``(n, *item_shape)``; values
        are cast to the field's dtype.  A batch longer than the capacity keeps
        its last ``capacity`` rows (as if written one by one).
        """
        n = self._check_batch(batch)
        if n == 0:
            return np.empty(0, dtype=np.int64)
        skip = max(0, n - self.capacity)  # rows that would be overwritten within this batch
        m = n - skip
        start = (self.pos + skip) % self.capacity
        first = min(m, self.capacity - start)  # rows before the wrap
        for name in self.spec:
            src = batch[name]
            if self.on_cpu:
                if isinstance(src, torch.Tensor):
                    src = src.detach().cpu().numpy()
                dst = self._np[name]
                dst[start : start + first] = src[skip : skip + first]
                if first < m:
                    dst[: m - first] = src[skip + first :]
            else:
                dst = self._t[name]
                if self._staging is not None and not (isinstance(src, torch.Tensor) and src.is_cuda):
                    src = self._staging.put(name, src[skip:], m)   # host rows -> pinned -> device, async
                elif isinstance(src, np.ndarray):
                    src = torch.from_numpy(np.ascontiguousarray(src[skip:]))
                else:
                    src = src.detach()[skip:]
                src = src.to(self.device, dst.dtype)  # on the device already, or one synchronous copy
                dst[start : start + first] = src[:first]
                if first < m:
                    dst[: m - first] = src[first:]
        if self._staging is not None:
            self._staging.done()
        slots = (start + np.arange(m, dtype=np.int64)) % self.capacity
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.capacity, self.size + n)
        return slots

    def _check_batch(self, batch: Mapping[str, ArrayLike]) -> int:
        missing = [k for k in self.spec if k not in batch]
        extra = [k for k in batch if k not in self.spec]
        if missing or extra:
            raise ValueError(
                f"Storage.insert batch fields do not match the spec: missing {missing}, extra {extra}; "
                f"expected exactly {list(self.spec)}."
            )
        n = None
        for name, (shape, _) in self.spec.items():
            value = batch[name]
            vshape = tuple(value.shape) if hasattr(value, "shape") else None
            if vshape is None or len(vshape) == 0:
                raise ValueError(
                    f"Storage.insert field {name!r} must be an array with a leading batch dimension, got {type(value).__name__} "
                    f"of shape {vshape}."
                )
            if vshape[1:] != shape:
                raise ValueError(
                    f"Storage.insert field {name!r} has item shape {vshape[1:]} but the spec says {shape}; "
                    f"pass an array of shape (batch, {', '.join(map(str, shape))})."
                )
            if n is None:
                n = vshape[0]
            elif vshape[0] != n:
                raise ValueError(
                    f"Storage.insert field {name!r} has {vshape[0]} rows but other fields have {n}; all fields need the same batch size."
                )
        return int(n)

    # ------------------------------------------------------------------ read
    def get(self, idx: np.ndarray | torch.Tensor, out: dict[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
        """Gather rows ``idx`` of every field into tensors on ``self.device``.

        ``idx`` are slot indices in ``[0, len(self))``.  On CPU the result
        owns its memory (a copy), on CUDA it is a fresh device tensor.
        ``out`` (CPU): preallocated arrays ``{field: (>= len(idx), *item_shape)}`` to gather into;
        the result's tensors are views of their first ``len(idx)`` rows.
        """
        if self.on_cpu:
            if isinstance(idx, torch.Tensor):
                idx = idx.cpu().numpy()
            idx = np.asarray(idx)
            if idx.dtype != np.int64:
                idx = idx.astype(np.int64)
            self._check_idx(idx)
            if out is not None:
                n = len(idx)
                for name, arr in self._np.items():  # mode="clip": indices were checked, no second pass
                    np.take(arr, idx, axis=0, out=out[name][:n], mode="clip")
                return {name: torch.from_numpy(out[name][:n]) for name in self._np}
            return {
                name: torch.from_numpy(arr[idx] if arr.ndim == 1 else np.take(arr, idx, axis=0))
                for name, arr in self._np.items()
            }
        if not isinstance(idx, torch.Tensor):
            idx = np.asarray(idx, dtype=np.int64)
            self._check_idx(idx)
            idx = torch.from_numpy(idx)
        idx = idx.to(self.device, torch.int64, non_blocking=True)
        return {name: t.index_select(0, idx) for name, t in self._t.items()}

    def _check_idx(self, idx: np.ndarray) -> None:
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise ValueError(
                f"Storage.get index out of range: min {idx.min()}, max {idx.max()}, but only slots [0, {self.size}) are filled."
            )

    def __len__(self) -> int:
        return self.size

    def alive(self, keys: np.ndarray) -> np.ndarray:
        """Which slots hold a transition."""
        keys = np.asarray(keys, np.int64)
        return (keys >= 0) & (keys < self.size)

    def slots_of(self, ordinals: np.ndarray) -> np.ndarray:
        """The slots of held transitions' ordinals in [0, len(self)): the same numbers here."""
        return np.asarray(ordinals, np.int64)

    @staticmethod
    def layout(capacity: int, spec: Spec) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The arrays this storage allocates: {field: ((capacity, *item_shape), dtype)}."""
        return {k: ((int(capacity), *s), d) for k, (s, d) in normalize_spec(spec).items()}

    @property
    def nbytes(self) -> int:
        """Bytes held by the field arrays (the whole capacity, filled or not)."""
        if self.on_cpu:
            return int(sum(a.nbytes for a in self._np.values()))
        return int(sum(t.numel() * t.element_size() for t in self._t.values()))

    @property
    def arrays(self) -> dict[str, np.ndarray | torch.Tensor]:
        """The underlying per-field arrays (NumPy on CPU, torch on device); do not resize."""
        return dict(self._np) if self.on_cpu else dict(self._t)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """``{capacity, pos, size, spec, data}``; ``data`` holds the filled rows.

        Safe for ``torch.save`` / ``torch.load(weights_only=True)`` (tensors,
        ints, strings only).  On CPU the tensors share memory with the ring
        (like ``nn.Module.state_dict``): save them before inserting more.
        """
        if self.on_cpu:
            data = {name: torch.from_numpy(arr[: self.size]) for name, arr in self._np.items()}
        else:
            data = {name: t[: self.size] for name, t in self._t.items()}
        return {
            "capacity": self.capacity,
            "pos": self.pos,
            "size": self.size,
            "spec": {name: (list(shape), dtype.str) for name, (shape, dtype) in self.spec.items()},
            "data": data,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` taken from a storage with the same capacity and spec."""
        if state.get("kind") == "frames":
            raise ValueError("this replay state was saved by the frame storage (each frame once), not the plain "
                             "Storage; load it with replay_frames=true (ReplayBuffer(frames=True))")
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"Storage state has capacity {state['capacity']} but this storage has {self.capacity}; "
                "build the storage with the saved capacity."
            )
        saved = {name: (tuple(shape), np.dtype(dt)) for name, (shape, dt) in state["spec"].items()}
        if saved != self.spec:
            raise ValueError(f"Storage state spec {saved} does not match this storage's spec {self.spec}.")
        size, pos = int(state["size"]), int(state["pos"])
        if not (0 <= size <= self.capacity and 0 <= pos < self.capacity):
            raise ValueError(f"Storage state has size {size} / pos {pos} outside [0, {self.capacity}]; the checkpoint is corrupt.")
        for name, value in state["data"].items():
            if value.shape[0] != size:
                raise ValueError(f"Storage state field {name!r} has {value.shape[0]} rows but size is {size}.")
            if self.on_cpu:
                self._np[name][:size] = value.cpu().numpy()
            else:
                self._t[name][:size] = value.to(self.device)
        self.size, self.pos = size, pos

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}:{d.name}{list(s)}" for k, (s, d) in self.spec.items())
        return f"Storage(size={self.size}/{self.capacity}, pos={self.pos}, device={self.device}, fields=[{fields}])"


class PinnedStaging:
    """Host -> GPU copies of inserted batches through pinned (page-locked) memory, asynchronous.

    Two pinned buffers per field, used in turn: a batch is written into one (cast to the field's dtype
    on the host), its copy to the device is enqueued on the current stream with non_blocking=True and
    an event recorded; the buffer is written again only after that event, so the caller's arrays are
    free at once and the next batch's host-side write overlaps the previous copy. Kernels that read
    the storage later on the same stream (the learner's gathers) see the rows."""

    def __init__(self, spec: dict[str, tuple[tuple[int, ...], np.dtype]], device: torch.device, turns: int = 2):
        self.spec, self.device = spec, device
        self.turns = turns
        self.turn = 0
        self.host: list[dict[str, torch.Tensor]] = [{} for _ in range(turns)]
        self.events: list = [None] * turns

    def put(self, name: str, src: ArrayLike, n: int) -> torch.Tensor:
        """The first n rows of src, on the device (a copy in flight; ordered before later kernels)."""
        if self.events[self.turn] is not None:   # this turn's buffers were last used by a copy: wait for it
            self.events[self.turn].synchronize()
            self.events[self.turn] = None
        shape, dtype = self.spec[name]
        host = self.host[self.turn].get(name)
        if host is None or host.shape[0] < n:   # grown to the largest batch seen (pinned allocation is slow)
            host = torch.empty((max(n, 2 * (0 if host is None else host.shape[0])), *shape),
                               dtype=torch_dtype(dtype)).pin_memory()
            self.host[self.turn][name] = host
        if isinstance(src, torch.Tensor):
            host[:n].copy_(src.detach()[:n])
        else:
            np.copyto(host[:n].numpy(), np.asarray(src)[:n], casting="unsafe")
        return host[:n].to(self.device, non_blocking=True)

    def done(self) -> None:
        """After a batch's fields: mark its buffers in use until its copies finish; the next turn."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        self.events[self.turn] = ev
        self.turn = (self.turn + 1) % self.turns
