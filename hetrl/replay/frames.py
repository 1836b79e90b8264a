"""Frame storage: transitions of stacked frames (Atari's 4 x 84 x 84 uint8), each frame stored once.

A transition's ``obs`` and ``next_obs`` are stacks of K frames; consecutive transitions of one env
share K - 1 frames of ``obs`` and ``next_obs`` with each other, so storing both stacks in full
(:class:`~hetrl.replay.storage.Storage`) keeps every frame 2K times. Here a ring of *frames* holds each
frame once and every transition row holds the 2K frame slots its stacks are made of::

    frames   (F + 1, H, W) uint8      slot 0 is the all-zero frame (FrameStackObservation's padding)
    refs     (capacity, 2K) int32     obs = frames[refs[:, :K]], next_obs = frames[refs[:, K:]]
    action, reward, ...               as Storage

Which frames are the same is found by content, not by bookkeeping of envs: a frame's 64-bit hash
(one vectorised pass per insert) looks up a recently stored frame, and a hit is used only if the
bytes are equal. So any insert order works: several envs per actor interleaved, several actors,
n-step rows, restarts, episodes of any length; and a stack read back is exactly the stack inserted,
byte for byte (at an episode's start the zero padding, or a repeated first frame, all the same).
A frame is looked up among the last ``window`` frames stored (65,536; a miss only stores it again).

Frames are reference-counted by the rows that use them and freed when the last such row is
overwritten. The pool has ``frames = capacity + capacity // 8 + 64 K`` slots by default: one new
frame per env step plus one per episode start, so it holds the whole ring while episodes last 8
steps or more (Atari's lives last tens to thousands of steps). Were it ever short, the oldest rows
are evicted early (FIFO as before, a little sooner): ``dead`` counts them; they are never sampled
(the replay buffer maps uniform draws past them and zeroes their priorities, see ``evicted``).

Bytes per transition at 84 x 84, K = 4, the default pool: 1.125 x 7,056 (frames) + 32 (refs) + 9
(refcount, free list) + 15 (DQN's other fields) ~ 8.0 KB, against 2 x 4 x 7,056 + 15 ~ 56.5 KB
with both stacks in full (docs/atari.md).

The arrays live in host memory (a CUDA learner gets its batches copied to the device); ``buffers``
may supply any of them (the local schedule's shared memory).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from hetrl.replay.memory import arrays_bytes, check_replay_memory
from hetrl.replay.storage import ArrayLike, normalize_spec

STACKED = ("obs", "next_obs")
WINDOW = 1 << 16          # frames looked up by content: the most recent this many stored


def frames_apply(spec: Mapping, frame_stack: int) -> bool:
    """Whether a replay spec's observations are stacks of `frame_stack` uint8 images (K, H, W)."""
    if frame_stack <= 1 or "obs" not in spec or "next_obs" not in spec:
        return False
    shape, dtype = spec["obs"]
    return (tuple(shape) == tuple(spec["next_obs"][0]) and len(shape) == 3 and int(shape[0]) == frame_stack
            and np.dtype(dtype) == np.uint8)


def default_frames(capacity: int, stack: int) -> int:
    return int(capacity) + int(capacity) // 8 + 64 * int(stack)


def frame_layout(capacity: int, spec: Mapping, frames: int | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The arrays a FrameStorage allocates: {name: (full shape, dtype)}."""
    spec = normalize_spec(spec)
    (stack, *frame), dtype = spec["obs"]
    F = default_frames(capacity, stack) if frames is None else int(frames)
    W = min(F, WINDOW)
    out = {"frames": ((F + 1, *frame), dtype), "refs": ((capacity, 2 * stack), np.dtype(np.int32)),
           "refcount": ((F + 1,), np.dtype(np.int32)), "free": ((F,), np.dtype(np.int32)),
           "recent_hash": ((W,), np.dtype(np.uint64)), "recent_slot": ((W,), np.dtype(np.int64))}
    for name, (shape, dt) in spec.items():
        if name not in STACKED:
            out[name] = ((capacity, *shape), dt)
    return out


class FrameStorage:
    """A drop-in for :class:`~hetrl.replay.storage.Storage` (insert / get / len / state_dict) for specs
    whose ``obs`` and ``next_obs`` are stacks of frames (K, *frame); each frame is stored once.

    Args:
        capacity: transitions (rows) held, > 0.
        spec: ``{field: (item_shape, dtype)}`` with ``obs`` and ``next_obs`` of one shape (K, ...).
        device: where ``get`` returns its tensors (the arrays stay in host memory).
        buffers: optional preallocated arrays for any of :func:`frame_layout`'s names.
        frames: frame slots in the pool (default ``capacity + capacity // 8 + 64 K``).
    """

    def __init__(self, capacity: int, spec: Mapping, device: str | torch.device = "cpu",
                 buffers: dict[str, np.ndarray] | None = None, frames: int | None = None) -> None:
        if int(capacity) <= 0:
            raise ValueError(f"FrameStorage capacity must be > 0, got {capacity}; pass the number of transitions to keep.")
        self.capacity = C = int(capacity)
        self.spec = normalize_spec(spec)
        if "obs" not in self.spec or self.spec.get("next_obs") != self.spec["obs"] or not self.spec["obs"][0]:
            raise ValueError("FrameStorage needs 'obs' and 'next_obs' fields of one stacked shape (K, ...), "
                             f"got {self.spec.get('obs')} and {self.spec.get('next_obs')}; use Storage otherwise.")
        self.stack = K = self.spec["obs"][0][0]
        self.frame_shape = self.spec["obs"][0][1:]
        layout = frame_layout(C, self.spec, frames)
        self.F = F = layout["frames"][0][0] - 1
        if F < 4 * K:
            raise ValueError(f"FrameStorage needs at least {4 * K} frame slots, got frames={F}.")
        self.device = torch.device(device)
        buffers = dict(buffers or {})
        unknown = set(buffers) - set(layout)
        if unknown:
            raise ValueError(f"FrameStorage buffers has arrays {sorted(unknown)} not in its layout {sorted(layout)}.")
        # before any allocation: refuse (UsageError, one line) what the host cannot hold
        check_replay_memory(self.spec, C, "cpu", arrays={k: v for k, v in layout.items() if k not in buffers})
        self._a: dict[str, np.ndarray] = {}
        for name, (shape, dtype) in layout.items():
            if name in buffers:
                arr = buffers[name]
                if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype != dtype:
                    raise ValueError(f"FrameStorage buffer {name!r} must be a numpy array of shape {shape} and dtype "
                                     f"{dtype}; got {getattr(arr, 'shape', None)} {getattr(arr, 'dtype', None)}.")
            else:
                arr = np.zeros(shape, dtype)
            self._a[name] = arr
        self.frames, self.refs, self.refcount = self._a["frames"], self._a["refs"], self._a["refcount"]
        self.fields = [k for k in self.spec if k not in STACKED]
        words = int(np.prod(self.frame_shape, dtype=np.int64)) * self.spec["obs"][1].itemsize
        self._u64 = words % 8 == 0
        self._mult = np.random.default_rng(0x5EED).integers(1, 2**63, size=words // 8 if self._u64 else words,
                                                             dtype=np.uint64) | np.uint64(1)
        self.evicted = np.empty(0, np.int64)   # rows the last insert evicted early (still dead)
        self._reset()

    def _reset(self) -> None:
        self.pos = self.size = self.dead = 0
        self.frames[0] = 0
        self.refs[:] = 0
        self.refcount[:] = 0
        self._free = self._a["free"]
        self._free[:] = np.arange(self.F, 0, -1, dtype=np.int32)   # pops give 1, 2, 3, ...
        self._top = self.F
        self._index: dict[int, int] = {}     # hash -> frame slot, for the last W frames stored
        self._rh, self._rs = self._a["recent_hash"], self._a["recent_slot"]
        self._rs[:] = -1
        self._stored = 0

    @staticmethod
    def layout(capacity: int, spec: Mapping, frames: int | None = None) -> dict:
        return frame_layout(capacity, spec, frames)

    # ------------------------------------------------------------------ write
    def _hashes(self, stacks: np.ndarray) -> np.ndarray:
        """(m, 2K) 64-bit hashes of the frames of (m, 2K, *frame) stacks; the zero frame hashes to 0."""
        flat = stacks.reshape(stacks.shape[0], stacks.shape[1], -1)
        words = flat.view(np.uint64) if self._u64 else flat.view(np.uint8).astype(np.uint64)
        return np.einsum("ijk,k->ij", words, self._mult)   # sum of word x odd multiplier, mod 2**64

    def _oldest(self) -> int:
        return self.pos if self.size == self.capacity else 0

    def _release(self, row: int) -> None:
        rc, free = self.refcount, self._free
        for s in self.refs[row].tolist():
            if s:
                rc[s] -= 1
                if rc[s] == 0:
                    free[self._top] = s
                    self._top += 1
        self.refs[row] = 0

    def _slot(self, h: int, frame: np.ndarray, row: int, killed: list) -> int:
        """The slot holding `frame` (found, or stored now); its refcount counts one more use."""
        if h == 0 and not frame.any():
            return 0
        s = self._index.get(h)
        if s is not None and self.refcount[s] > 0 and self.frames[s].tobytes() == frame.tobytes():  # the same bytes
            self.refcount[s] += 1
            return s
        while self._top == 0:   # the pool is short: evict the oldest row (FIFO, early)
            old = (self._oldest() + self.dead) % self.capacity
            if old == row:
                raise RuntimeError("FrameStorage: no frame slot is left even with every other row evicted")
            self._release(old)
            self.dead += 1
            killed.append(old)
        self._top -= 1
        s = int(self._free[self._top])
        self.frames[s] = frame
        self.refcount[s] = 1
        w = self._stored % len(self._rh)    # the lookup window: forget the frame stored W frames ago
        if self._rs[w] >= 0 and self._index.get(int(self._rh[w])) == self._rs[w]:
            del self._index[int(self._rh[w])]
        self._rh[w], self._rs[w] = h, s
        self._index[h] = s
        self._stored += 1
        return s

    def insert(self, batch: Mapping[str, ArrayLike]) -> np.ndarray:
        """Write the rows of ``batch`` (every spec field, ``(n, *item_shape)``) at ``pos`` (wrapping);
        return their int64 slots. A batch longer than the capacity keeps its last ``capacity`` rows."""
        n = self._check_batch(batch)
        self.evicted = np.empty(0, np.int64)
        if n == 0:
            return np.empty(0, dtype=np.int64)
        C, K = self.capacity, self.stack
        skip = max(0, n - C)
        m = n - skip
        src = {k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))[skip:]
               for k, v in batch.items()}
        stacks = np.ascontiguousarray(np.concatenate([src["obs"], src["next_obs"]], axis=1), dtype=self.frames.dtype)
        hashes = self._hashes(stacks).tolist()
        if skip:   # every slot is written by this batch, from where its first kept row goes (as Storage)
            for r in range(self.size):
                self._release(r)
            self.size, self.dead, self.pos = C, C, (self.pos + skip) % C   # every old row: overwritten next
        slots = np.empty(m, np.int64)
        killed: list[int] = []
        for i in range(m):
            j = self.pos
            if self.size == C:       # the oldest row goes: it was dead (evicted early) or it is released now
                if self.dead:
                    self.dead -= 1
                else:
                    self._release(j)
            else:
                self.size += 1
            self.pos = (j + 1) % C
            row = stacks[i]
            self.refs[j] = [self._slot(hashes[i][f], row[f], j, killed) for f in range(2 * K)]
            slots[i] = j
        for name in self.fields:
            self._a[name][slots] = src[name]
        if killed:
            ev = np.asarray(killed, np.int64)
            self.evicted = ev[~self.alive(ev)]
        return slots

    def _check_batch(self, batch: Mapping[str, ArrayLike]) -> int:
        missing = [k for k in self.spec if k not in batch]
        extra = [k for k in batch if k not in self.spec]
        if missing or extra:
            raise ValueError(f"FrameStorage.insert batch fields do not match the spec: missing {missing}, extra "
                             f"{extra}; expected exactly {list(self.spec)}.")
        n = None
        for name, (shape, _) in self.spec.items():
            vshape = tuple(getattr(batch[name], "shape", ()))
            if len(vshape) == 0 or vshape[1:] != shape:
                raise ValueError(f"FrameStorage.insert field {name!r} has shape {vshape}; expected (batch, "
                                 f"{', '.join(map(str, shape))}).")
            if n is None:
                n = vshape[0]
            elif vshape[0] != n:
                raise ValueError(f"FrameStorage.insert field {name!r} has {vshape[0]} rows but other fields have {n}.")
        return int(n)

    # ------------------------------------------------------------------ read
    def alive(self, keys: np.ndarray) -> np.ndarray:
        """Which slots hold a transition (filled, not evicted early)."""
        keys = np.asarray(keys, np.int64)
        return (keys >= 0) & (keys < self.size) & ((keys - self._oldest()) % self.capacity >= self.dead)

    def slots_of(self, ordinals: np.ndarray) -> np.ndarray:
        """The slots of the held transitions' ordinals in [0, len(self)) (uniform sampling past the dead)."""
        return (np.asarray(ordinals, np.int64) + self._oldest() + self.dead) % self.capacity

    def get(self, idx: np.ndarray | torch.Tensor, out: dict[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
        """Gather rows ``idx`` of every field (stacks rebuilt from their frames) as tensors on ``device``;
        ``out``: preallocated arrays to gather into (the tensors are views of their first rows)."""
        if isinstance(idx, torch.Tensor):
            idx = idx.cpu().numpy()
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size and not self.alive(idx).all():
            bad = idx[~self.alive(idx)]
            raise ValueError(f"FrameStorage.get: slots {bad[:5].tolist()} hold no transition ({len(self)} held in "
                             f"[0, {self.size}), {self.dead} evicted early).")
        n, K = len(idx), self.stack
        refs = np.take(self.refs, idx, axis=0)
        res = {}
        for name, part in (("obs", refs[:, :K]), ("next_obs", refs[:, K:])):
            if out is not None:
                res[name] = np.take(self.frames, part, axis=0, out=out[name][:n], mode="clip")
            else:
                res[name] = np.take(self.frames, part, axis=0)
        for name in self.fields:
            arr = self._a[name]
            if out is not None:
                res[name] = np.take(arr, idx, axis=0, out=out[name][:n], mode="clip")
            else:
                res[name] = arr[idx] if arr.ndim == 1 else np.take(arr, idx, axis=0)
        tensors = {name: torch.from_numpy(res[name]) for name in self.spec}
        if self.device.type != "cpu":
            tensors = {k: v.to(self.device) for k, v in tensors.items()}
        return tensors

    def __len__(self) -> int:
        return self.size - self.dead

    @property
    def frames_used(self) -> int:
        """Frame slots in use (the zero frame excluded)."""
        return self.F - self._top

    @property
    def nbytes(self) -> int:
        """Bytes of every array (the whole capacity, filled or not)."""
        return arrays_bytes({k: (v.shape, v.dtype) for k, v in self._a.items()})

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return dict(self._a)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """``{kind: "frames", capacity, pos, size, dead, spec, frames, refs, data}``: the frames the held rows
        use, once each, and the rows' frame indices into them (0: the zero frame). Tensors, ints and strings
        only (``torch.load(weights_only=True)``)."""
        refs = self.refs[: self.size]
        used = np.unique(refs)
        used = used[used != 0]
        lut = np.zeros(self.F + 1, np.int32)
        lut[used] = np.arange(1, len(used) + 1, dtype=np.int32)
        return {"kind": "frames", "capacity": self.capacity, "pos": self.pos, "size": self.size, "dead": self.dead,
                "spec": {name: (list(shape), dt.str) for name, (shape, dt) in self.spec.items()},
                "frames": torch.from_numpy(self.frames[used]), "refs": torch.from_numpy(lut[refs]),
                "data": {name: torch.from_numpy(self._a[name][: self.size]) for name in self.fields}}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` of a FrameStorage with the same capacity and spec."""
        if state.get("kind") != "frames":
            raise ValueError("this replay state was saved by the plain Storage (both stacks in full), not the frame "
                             "storage; load it with replay_frames=false (ReplayBuffer(frames=False))")
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"FrameStorage state has capacity {state['capacity']} but this storage has "
                             f"{self.capacity}; build the storage with the saved capacity.")
        saved = {name: (tuple(shape), np.dtype(dt)) for name, (shape, dt) in state["spec"].items()}
        if saved != self.spec:
            raise ValueError(f"FrameStorage state spec {saved} does not match this storage's spec {self.spec}.")
        size, pos, dead = int(state["size"]), int(state["pos"]), int(state["dead"])
        frames, refs = state["frames"].cpu().numpy(), state["refs"].cpu().numpy()
        if not (0 <= size <= self.capacity and 0 <= pos < self.capacity and 0 <= dead <= size) or len(refs) != size:
            raise ValueError(f"FrameStorage state has size {size} / pos {pos} / dead {dead} / {len(refs)} rows; "
                             "the checkpoint is corrupt.")
        if len(frames) > self.F:
            raise ValueError(f"FrameStorage state holds {len(frames)} frames but this storage has {self.F} slots.")
        self._reset()
        U = len(frames)
        self.frames[1:U + 1] = frames
        self.refs[:size] = refs
        for name in self.fields:
            self._a[name][:size] = state["data"][name].cpu().numpy()
        self.refcount[:] = np.bincount(refs.ravel(), minlength=self.F + 1)[: self.F + 1]
        self.refcount[0] = 0
        self._top = self.F - U
        self._free[: self._top] = np.arange(self.F, U, -1, dtype=np.int32)
        self.size, self.pos, self.dead = size, pos, dead

    def __repr__(self) -> str:
        return (f"FrameStorage(size={len(self)}/{self.capacity}, frames={self.frames_used}/{self.F} of "
                f"{list(self.frame_shape)}, stack={self.stack}, dead={self.dead})")
