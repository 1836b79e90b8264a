"""K-ary sum tree for proportional prioritized replay.

The tree holds one non-negative value (the priority, already raised to alpha)
per replay slot and keeps the sum of every block of ``fanout`` children in
its parent, so that

* ``update`` of a batch of leaves costs O(batch * depth * fanout),
* ``find`` (prefix-sum search) of a batch of values costs the same,
* ``total`` is O(1),

with depth = ceil(log_fanout(capacity)).

Layout: one flat float64 array, levels stored root first.  Level ``l`` holds
``ceil(nodes_below / fanout)`` parents, padded with zeros to a multiple of
the fanout so that every node's children are one contiguous block of
``fanout`` entries (``children(p) = level[l+1][p*K:(p+1)*K]``).  Leaves past
``capacity`` are padding and stay zero forever; the root level is one full
block too (root at index 0), so every level starts at a multiple of the
fanout.

Parent sums are *recomputed* from their children on every update (never
incremented by a delta), so float round-off cannot accumulate over millions
of updates.  The search guards against the remaining round-off (a value at
or just past the end of the range, or a parent sum that differs in the last
bit from the sum of its children): it never descends into a zero child, so it
never returns a zero-priority leaf or a padding leaf.

Two implementations of the batch kernels live in this module: numba ``@njit`` loops and
vectorised NumPy (``python benchmarks/bench_sumtree.py`` times both at every fanout).  The
numba loops walk one key down the tree at a time in compiled code; NumPy must materialise
every level for the whole batch, so it is several times slower at every fanout (most at
fanout 2, whose tree is deepest).  numba is therefore the default backend; the NumPy kernels
stay as the fallback (used when numba cannot be imported) and as an independent reference
in the tests.  ``DEFAULT_FANOUT = 8``: fanouts 4-16 tie within the noise for numba (a
shallower tree against more children read per level); 8 children of float64 fill exactly
one 64-byte cache line (levels are padded and the array is 64-byte aligned), so one block
read is one line.
"""

from __future__ import annotations

import numpy as np

try:  # numba is a dependency, but keep the module importable without it.
    from numba import njit

    _HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only without numba
    _HAVE_NUMBA = False

DEFAULT_FANOUT = 8
BACKENDS = ("numba", "numpy") if _HAVE_NUMBA else ("numpy",)
DEFAULT_BACKEND = BACKENDS[0]


def _layout(capacity: int, fanout: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (offsets, sizes) of the levels, root first, leaves last."""
    sizes = []
    n = _round_up(capacity, fanout)  # padded leaf level
    sizes.append(n)
    while n > fanout:
        n = _round_up(n // fanout, fanout)
        sizes.append(n)
    # root level: the root at index 0, padded to a full block so that every
    # level starts at a multiple of the fanout (child blocks stay aligned).
    sizes.append(fanout)
    sizes.reverse()  # root first
    offsets = np.zeros(len(sizes), dtype=np.int64)
    offsets[1:] = np.cumsum(sizes[:-1])
    return offsets, np.asarray(sizes, dtype=np.int64)


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def _aligned_zeros(n: int, align: int = 64) -> np.ndarray:
    """float64 zeros whose first element sits on a cache-line boundary."""
    raw = np.zeros(n + align // 8, dtype=np.float64)
    skip = (-raw.ctypes.data % align) // 8
    return raw[skip : skip + n]


# --------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------
if _HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _nb_update(tree, offsets, fanout, idx, value):  # pragma: no cover - compiled
        depth = offsets.shape[0] - 1
        leaf0 = offsets[depth]
        for b in range(idx.shape[0]):
            node = idx[b]
            tree[leaf0 + node] = value[b]
            for level in range(depth - 1, -1, -1):
                node = node // fanout
                child0 = offsets[level + 1] + node * fanout
                s = 0.0
                for c in range(fanout):
                    s += tree[child0 + c]
                tree[offsets[level] + node] = s

    @njit(cache=True, nogil=True)
    def _nb_find(tree, offsets, fanout, values, out):  # pragma: no cover - compiled
        depth = offsets.shape[0] - 1
        for b in range(values.shape[0]):
            v = values[b]
            if v < 0.0:
                v = 0.0
            node = 0
            for level in range(1, depth + 1):
                child0 = offsets[level] + node * fanout
                chosen = -1
                last_nonzero = -1
                for c in range(fanout):
                    w = tree[child0 + c]
                    if w > 0.0:
                        last_nonzero = c
                        if v < w:
                            chosen = c
                            break
                        v -= w
                if chosen < 0:  # round-off past the end: take the last non-zero child
                    chosen = last_nonzero
                    v = tree[child0 + chosen]
                    # place v inside the chosen child's range
                    v = v * (1.0 - 1e-12)
                node = node * fanout + chosen
            out[b] = node


# --------------------------------------------------------------------------
# NumPy kernels
# --------------------------------------------------------------------------
def _np_update(tree, offsets, fanout, idx, value) -> None:
    depth = offsets.shape[0] - 1
    # duplicates: keep the last write (fancy assignment does not promise an order)
    if idx.shape[0] > 1:
        rev_unique, rev_first = np.unique(idx[::-1], return_index=True)
        value = value[::-1][rev_first]
        idx = rev_unique
    tree[offsets[depth] + idx] = value
    nodes = idx
    for level in range(depth - 1, -1, -1):
        nodes = np.unique(nodes // fanout)
        children = _level(tree, offsets, level + 1).reshape(-1, fanout)
        tree[offsets[level] + nodes] = children[nodes].sum(axis=1)


def _level(tree: np.ndarray, offsets: np.ndarray, level: int) -> np.ndarray:
    """View of one level of the flat tree."""
    end = offsets[level + 1] if level + 1 < offsets.shape[0] else tree.shape[0]
    return tree[offsets[level] : end]


def _np_find(tree, offsets, fanout, values, out) -> None:
    depth = offsets.shape[0] - 1
    v = np.maximum(values, 0.0)
    node = np.zeros(values.shape[0], dtype=np.int64)
    rows = np.arange(values.shape[0])
    cols = np.arange(fanout)
    for level in range(1, depth + 1):
        block = _level(tree, offsets, level).reshape(-1, fanout)[node]
        csum = np.cumsum(block, axis=1)
        chosen = (csum <= v[:, None]).sum(axis=1)
        # never a zero child: past the end (round-off) -> last non-zero child
        last_nonzero = np.where(block > 0.0, cols, -1).max(axis=1)
        over = chosen > last_nonzero
        chosen = np.where(over, last_nonzero, chosen)
        v = v - np.where(chosen > 0, csum[rows, np.maximum(chosen - 1, 0)], 0.0)
        # past the end: put v just inside the chosen child's range
        v = np.where(over, block[rows, chosen] * (1.0 - 1e-12), v)
        node = node * fanout + chosen
    out[:] = node


class SumTree:
    """K-ary sum tree over ``capacity`` leaves (float64 values >= 0).

    Args:
        capacity: number of leaves (replay slots), > 0.
        fanout: children per node, >= 2.
        backend: ``"numba"`` (default when available) or ``"numpy"``.
    """

    def __init__(self, capacity: int, fanout: int = DEFAULT_FANOUT, *, backend: str | None = None) -> None:
        if int(capacity) <= 0:
            raise ValueError(f"SumTree capacity must be > 0, got {capacity}; pass the replay capacity.")
        if int(fanout) < 2:
            raise ValueError(f"SumTree fanout must be >= 2, got {fanout}; use e.g. {DEFAULT_FANOUT}.")
        backend = DEFAULT_BACKEND if backend is None else backend
        if backend not in BACKENDS:
            raise ValueError(f"SumTree backend {backend!r} is not available; choose one of {BACKENDS}.")
        self.capacity = int(capacity)
        self.fanout = int(fanout)
        self.backend = backend
        self._offsets, sizes = _layout(self.capacity, self.fanout)
        self._tree = _aligned_zeros(int(sizes.sum()))
        self._leaf0 = int(self._offsets[-1])
        self._update_kernel = _nb_update if backend == "numba" else _np_update
        self._find_kernel = _nb_find if backend == "numba" else _np_find

    @property
    def depth(self) -> int:
        """Number of levels below the root."""
        return len(self._offsets) - 1

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._tree[0])

    @property
    def leaves(self) -> np.ndarray:
        """Read-only view of the ``capacity`` leaf values."""
        view = self._tree[self._leaf0 : self._leaf0 + self.capacity]
        view.flags.writeable = False
        return view

    def update(self, idx: np.ndarray, priority: np.ndarray) -> None:
        """Set leaves ``idx`` to ``priority`` (>= 0, finite); later duplicates win."""
        idx = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
        priority = np.ascontiguousarray(priority, dtype=np.float64).reshape(-1)
        if priority.shape[0] == 1 and idx.shape[0] != 1:
            priority = np.full(idx.shape[0], priority[0])
        if idx.shape[0] != priority.shape[0]:
            raise ValueError(
                f"SumTree.update got {idx.shape[0]} indices but {priority.shape[0]} priorities; pass one per index."
            )
        if idx.shape[0] == 0:
            return
        if idx.min() < 0 or idx.max() >= self.capacity:
            raise ValueError(
                f"SumTree.update index out of range [0, {self.capacity}): min {idx.min()}, max {idx.max()}."
            )
        if not np.all(np.isfinite(priority)) or priority.min() < 0.0:
            raise ValueError("SumTree.update priorities must be finite and >= 0 (got NaN, inf or a negative value).")
        self._update_kernel(self._tree, self._offsets, self.fanout, idx, priority)

    def get(self, idx) -> np.ndarray:
        """Leaf values at ``idx`` (float64 copy)."""
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise ValueError(f"SumTree.get index out of range [0, {self.capacity}).")
        return self._tree[self._leaf0 + idx]

    def find(self, values: np.ndarray) -> np.ndarray:
        """Prefix-sum search: for each v, the leaf i with cumsum[i-1] <= v < cumsum[i].

        Values below 0 are treated as 0; values >= total (round-off) map to
        the last non-zero leaf.  Never returns a zero-valued or padding leaf.
        """
        if self._tree[0] <= 0.0:
            raise ValueError("SumTree.find on an empty tree (total priority is 0); insert items first.")
        values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        out = np.empty(values.shape[0], dtype=np.int64)
        self._find_kernel(self._tree, self._offsets, self.fanout, values, out)
        return out

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Stratified sample of ``n`` leaves proportional to their values.

        [0, total) is split into n equal segments and one uniform value is
        drawn in each, so the batch covers the whole range (lower variance
        than n independent draws; same marginal probability per leaf).
        """
        if n <= 0:
            raise ValueError(f"SumTree.sample needs n > 0, got {n}.")
        seg = self.total / n
        values = (np.arange(n, dtype=np.float64) + rng.random(n)) * seg
        return self.find(values)

    def state_dict(self) -> dict:
        """Leaves as a float64 tensor (sums are rebuilt on load)."""
        import torch

        return {
            "capacity": self.capacity,
            "fanout": self.fanout,
            "leaves": torch.from_numpy(self._tree[self._leaf0 : self._leaf0 + self.capacity].copy()),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore leaves saved by :meth:`state_dict` (fanout may differ)."""
        leaves = np.asarray(state["leaves"].cpu().numpy() if hasattr(state["leaves"], "cpu") else state["leaves"])
        if int(state["capacity"]) != self.capacity or leaves.shape != (self.capacity,):
            raise ValueError(
                f"SumTree state has capacity {state['capacity']} but this tree has {self.capacity}; "
                "build the tree with the saved capacity."
            )
        if not np.all(np.isfinite(leaves)) or (leaves.size and leaves.min() < 0.0):
            raise ValueError("SumTree state has NaN, inf or negative leaves; the checkpoint is corrupt.")
        self._tree[:] = 0.0
        self._tree[self._leaf0 : self._leaf0 + self.capacity] = leaves
        self._rebuild()

    def _rebuild(self) -> None:
        """Recompute every parent sum from the leaves (bottom-up, vectorised)."""
        for level in range(self.depth - 1, -1, -1):
            children = _level(self._tree, self._offsets, level + 1).reshape(-1, self.fanout)
            sums = children.sum(axis=1)
            parent = _level(self._tree, self._offsets, level)
            parent[:] = 0.0
            parent[: sums.shape[0]] = sums

    def __repr__(self) -> str:
        return (
            f"SumTree(capacity={self.capacity}, fanout={self.fanout}, depth={self.depth}, "
            f"total={self.total:.6g}, backend={self.backend!r})"
        )
