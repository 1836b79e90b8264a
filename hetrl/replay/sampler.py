"""Samplers: which stored transitions a batch takes, and their importance weights.

Replay is split the way TorchRL splits it: a :class:`~hetrl.replay.storage.Storage` holds the
transitions, a sampler picks keys (slot indices) and weights, a writer (the n-step adder)
makes the transitions. The replay buffer, the local schedule's prefetcher, the Ray replay
server and the planner's profiler all sample through these two classes, so the importance
weights are computed in one place.

    sample(n, size) -> (keys int64 (n,), weights float32 (n,) or None when uniform)
    on_insert(keys)          new slots (prioritised: max priority ** alpha)
    on_evict(keys)           slots that no longer hold a transition (prioritised: priority 0)
    update(keys, td_errors)  learner's |TD| -> priorities (no-op when uniform)

Uniform keys are ordinals in [0, size); the replay buffer maps them to slots when the storage
holds rows that were evicted early (the frame storage, rarely), see ReplayBuffer.sample.

Both draw from the numpy Generator they are given (the replay buffer's, whose state is in its
checkpoint), so the same seed and the same calls give the same keys.
"""

from __future__ import annotations

import numpy as np

from hetrl.replay.sumtree import DEFAULT_FANOUT, SumTree


class UniformSampler:
    """Keys uniform over the filled slots, with replacement; no weights."""

    prioritized = False
    tree = None

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def sample(self, n: int, size: int) -> tuple[np.ndarray, None]:
        return self.rng.integers(0, size, size=n, dtype=np.int64), None

    def on_insert(self, keys: np.ndarray) -> None:
        pass

    def on_evict(self, keys: np.ndarray) -> None:
        pass

    def update(self, keys: np.ndarray, td_errors: np.ndarray) -> None:
        pass


class PrioritizedSampler:
    """Proportional prioritisation (Schaul et al. 2016) over a K-ary sum tree.

    P(i) = p_i / sum_j p_j with p_i = (|td_i| + eps) ** alpha; new slots get max_priority ** alpha
    (the largest |td| + eps seen, 1.0 at first), so each is likely sampled at least once.
    Importance weights w_i = (size * P(i)) ** -beta / max_j w_j, over the batch.
    """

    prioritized = True

    def __init__(self, capacity: int, rng: np.random.Generator, alpha: float = 0.6, beta: float = 0.4,
                 eps: float = 1e-6, fanout: int | None = None):
        self.rng, self.alpha, self.eps = rng, float(alpha), float(eps)
        self.tree = SumTree(capacity, DEFAULT_FANOUT if fanout is None else fanout)
        self.max_priority = 1.0
        self.beta = 0.0
        self.set_beta(beta)

    def set_beta(self, beta: float) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"ReplayBuffer beta must be in [0, 1], got {beta}.")
        self.beta = float(beta)

    def sample(self, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        keys = self.tree.sample(n, self.rng)
        probs = self.tree.get(keys) / self.tree.total
        w = (size * probs) ** (-self.beta)
        w /= w.max()
        return keys, w.astype(np.float32)

    def on_insert(self, keys: np.ndarray) -> None:
        if keys.size:
            self.tree.update(keys, np.full(keys.shape[0], self.max_priority ** self.alpha))

    def on_evict(self, keys: np.ndarray) -> None:
        if keys.size:   # the tree never returns a zero-priority leaf
            self.tree.update(keys, np.zeros(keys.shape[0]))

    def update(self, keys: np.ndarray, td_errors: np.ndarray) -> None:
        p = np.abs(td_errors) + self.eps
        if p.size:
            self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.update(keys, p ** self.alpha)
