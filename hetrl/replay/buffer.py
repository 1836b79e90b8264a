"""The replay manager: a :class:`Storage` ring plus uniform or prioritized sampling.

``ReplayBuffer`` is what DQN/DDPG-style learners talk to:

* ``insert(batch)`` writes transitions into the ring and, when prioritized,
  gives each new item priority ``max_priority ** alpha`` (``max_priority``
  is the largest ``|td| + eps`` seen so far, 1.0 initially), so every new
  item is sampled at least once with high probability.
* ``sample(n)`` returns ``(batch, keys, weights)``: the tensors on the
  storage device, the int64 slot indices, and the importance-sampling
  weights ``w_i = (N * P(i)) ** -beta / max_j w_j`` (all ones when uniform).
* ``update_priorities(keys, td_errors)`` sets ``p_i = (|td_i| + eps) ** alpha``
  for each sampled item, in the one tree that ``sample`` reads.

Two bugs of PEARL's public code are ruled out by construction: the priority
update writes into ``self.tree`` itself (no copy of the tree exists), and it
takes one TD error per key (a scalar loss raises ``ValueError``).

A key is a slot index: if the slot was overwritten between ``sample`` and
``update_priorities`` the new occupant gets the priority (as in Dopamine and
most PER implementations); with a replay much larger than the learner's
lag this is rare and harmless.

Determinism: all randomness comes from ``self.rng`` (``np.random.default_rng
(seed)``), and its state is part of ``state_dict``, so the same seed and the
same calls give the same samples bit for bit, also across a checkpoint.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from hetrl.replay.frames import FrameStorage
from hetrl.replay.storage import ArrayLike, Spec, Storage
from hetrl.errors import NonFiniteError
from hetrl.replay.finite import first_non_finite
from hetrl.replay.sampler import PrioritizedSampler, UniformSampler
from hetrl.replay.sumtree import SumTree


class ReplayBuffer:
    """Ring-buffer replay with optional proportional prioritization (Schaul et al. 2016).

    Args:
        capacity: number of transitions kept, > 0.
        spec: ``{field: (item_shape, dtype)}`` (see :class:`Storage`).
        device: where the data lives and batches are returned.
        prioritized: proportional PER if True, uniform otherwise.
        alpha: priority exponent (0 = uniform, 1 = fully proportional).
        beta: importance-sampling exponent (annealed via :meth:`set_beta`).
        eps: added to ``|td|`` so no item gets zero priority.
        fanout: sum-tree fanout (default :data:`DEFAULT_FANOUT`).
        seed: seed of ``self.rng``; ``None`` draws fresh entropy.
        buffers: preallocated CPU arrays for the storage (e.g. shared memory).
        check_finite: refuse (NonFiniteError) a batch with NaN or inf in obs, next_obs, reward or action.
        frames: obs/next_obs are stacks of frames: keep each frame once (:class:`FrameStorage`).
    """

    def __init__(
        self,
        capacity: int,
        spec: Spec,
        device: str | torch.device = "cpu",
        *,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        fanout: int | None = None,
        seed: int | None = None,
        buffers: dict[str, np.ndarray] | None = None,
        check_finite: bool = True,
        frames: bool = False,
    ) -> None:
        if int(capacity) <= 0:
            raise ValueError(f"ReplayBuffer capacity must be > 0, got {capacity}; set replay.capacity to a positive size.")
        if alpha < 0:
            raise ValueError(f"ReplayBuffer alpha must be >= 0, got {alpha}.")
        if eps <= 0:
            raise ValueError(f"ReplayBuffer eps must be > 0 (it keeps every priority positive), got {eps}.")
        self.rng = np.random.default_rng(seed)
        self.check_finite = bool(check_finite)
        # the sampler first: a bad alpha/eps is refused before the storage is allocated
        self.sampler: UniformSampler | PrioritizedSampler = (
            PrioritizedSampler(int(capacity), self.rng, alpha, beta, eps, fanout) if prioritized
            else UniformSampler(self.rng))
        self.storage: Storage | FrameStorage = (FrameStorage if frames else Storage)(capacity, spec, device, buffers)
        self.capacity = self.storage.capacity
        self.device = self.storage.device
        self.prioritized = bool(prioritized)
        self.alpha, self.eps = float(alpha), float(eps)
        self.beta = 0.0
        self.set_beta(beta)

    @property
    def tree(self) -> SumTree | None:
        return self.sampler.tree

    @property
    def max_priority(self) -> float:
        return getattr(self.sampler, "max_priority", 1.0)

    def __len__(self) -> int:
        return len(self.storage)

    def set_beta(self, beta: float) -> None:
        """Set the importance-sampling exponent (annealing hook), 0 <= beta <= 1."""
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"ReplayBuffer beta must be in [0, 1], got {beta}.")
        self.beta = float(beta)
        if self.sampler.prioritized:
            self.sampler.set_beta(beta)

    # ------------------------------------------------------------------ write
    def insert(self, batch: Mapping[str, ArrayLike]) -> np.ndarray:
        """Store a batch of transitions; returns their int64 slot keys."""
        if self.check_finite:
            bad = first_non_finite(batch)
            if bad:
                raise NonFiniteError(f"non-finite data inserted into the replay: {bad}")
        keys = self.storage.insert(batch)
        self.sampler.on_insert(keys)
        if self.storage.evicted.size:   # rows the frame storage evicted early: never sampled again
            self.sampler.on_evict(self.storage.evicted)
        return keys

    # ------------------------------------------------------------------- read
    def sample(self, n: int, beta: float | None = None, out: dict[str, np.ndarray] | None = None
               ) -> tuple[dict[str, torch.Tensor], np.ndarray, torch.Tensor]:
        """Sample ``n`` transitions: ``(batch, keys, weights)``.

        ``weights`` is a float32 tensor on the storage device:
        ``(N * P(i)) ** -beta`` normalised by its max over the batch, or all
        ones for uniform sampling.  ``beta`` overrides ``self.beta`` for this call.
        ``out`` (CPU): preallocated arrays of at least ``n`` rows per field that the batch
        is gathered into (the returned tensors are views of them): no allocation per batch.
        """
        size = len(self.storage)
        if n <= 0:
            raise ValueError(f"ReplayBuffer.sample needs a batch size > 0, got {n}.")
        if size == 0:  # sampling is with replacement, so any n works once something is stored
            raise ValueError(
                f"ReplayBuffer.sample asked for {n} transitions but the replay is empty; "
                "raise learning_starts (so the replay fills first)."
            )
        if beta is not None:
            self.set_beta(beta)
        keys, w = self.sampler.sample(n, size)
        if self.storage.dead and not self.prioritized:   # uniform ordinals -> the slots of held transitions
            keys = self.storage.slots_of(keys)
        if w is None:
            weights = torch.ones(n, dtype=torch.float32, device=self.device)
        else:
            weights = torch.from_numpy(w)
            if weights.device != self.device:
                weights = weights.to(self.device, non_blocking=True)
        return self.storage.get(keys, out=out), keys, weights

    def update_priorities(self, keys: np.ndarray | torch.Tensor, td_errors: np.ndarray | torch.Tensor) -> None:
        """Set ``p = (|td| + eps) ** alpha`` for ``keys`` in this buffer's tree.

        One TD error per key; ``td_errors`` may be a torch tensor on any
        device (copied to the CPU once).  No-op for a uniform replay.
        """
        if self.tree is None:
            return
        if isinstance(keys, torch.Tensor):
            keys = keys.cpu().numpy()
        if isinstance(td_errors, torch.Tensor):
            td_errors = td_errors.detach().cpu().numpy()
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        td = np.asarray(td_errors, dtype=np.float64).reshape(-1)
        if td.shape[0] != keys.shape[0]:
            raise ValueError(
                f"update_priorities got {keys.shape[0]} keys but {td.shape[0]} TD errors; pass one TD error per "
                "sampled transition (per-sample |target - q|, not the scalar loss)."
            )
        if not np.all(np.isfinite(td)):
            raise ValueError("update_priorities got NaN or inf TD errors; check the learner's loss for divergence.")
        if keys.size and (keys.min() < 0 or keys.max() >= self.storage.size):
            raise ValueError(
                f"update_priorities keys must be slots in [0, {self.storage.size}) as returned by sample(); "
                f"got min {keys.min()}, max {keys.max()}."
            )
        if self.storage.dead:   # a row evicted early since it was sampled keeps priority 0
            held = self.storage.alive(keys)
            keys, td = keys[held], td[held]
        self.sampler.update(keys, td)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """Storage, tree, max priority, hyper-parameters and RNG state.

        Loadable with ``torch.load(weights_only=True)`` (tensors, python
        numbers, strings, dicts only).
        """
        return {
            "storage": self.storage.state_dict(),
            "tree": None if self.tree is None else self.tree.state_dict(),
            "max_priority": self.max_priority,
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` from a buffer with the same capacity, spec and prioritization."""
        if (state["tree"] is None) == self.prioritized:
            kind = "prioritized" if state["tree"] is not None else "uniform"
            raise ValueError(
                f"ReplayBuffer state is from a {kind} replay but this one is "
                f"{'prioritized' if self.prioritized else 'uniform'}; set prioritized to match the checkpoint."
            )
        self.storage.load_state_dict(state["storage"])
        if self.tree is not None:
            self.tree.load_state_dict(state["tree"])
        self.sampler.max_priority = float(state["max_priority"])
        self.alpha = self.sampler.alpha = float(state["alpha"])
        self.set_beta(float(state["beta"]))
        self.eps = self.sampler.eps = float(state["eps"])
        self.rng.bit_generator.state = state["rng"]

    def __repr__(self) -> str:
        kind = f"prioritized(alpha={self.alpha}, beta={self.beta})" if self.prioritized else "uniform"
        return f"ReplayBuffer({len(self)}/{self.capacity}, {kind}, device={self.device})"


class BatchGroups:
    """Draws a group of g batches for one `learn` call: ({field: (g, B, ...)}, keys, weights (g, B)),
    through the replay buffer's sampler (the local schedule's draws; the planner times them too). With
    `preallocate`, rows are gathered into two fixed buffers used in turn (one is being learned on while
    the other is filled): no allocation per group."""

    def __init__(self, replay: ReplayBuffer, spec: dict, batch_size: int, group: int, preallocate: bool):
        self.replay, self.B = replay, batch_size
        n = group * batch_size
        self.bufs = [{k: np.empty((n, *s), np.dtype(d)) for k, (s, d) in spec.items()} for _ in range(2)] \
            if preallocate else [None, None]
        self.flip = 0

    def draw(self, g: int):
        B = self.B
        out, self.flip = self.bufs[self.flip], self.flip ^ 1
        batch, keys, weights = self.replay.sample(g * B, out=out)
        return {k: v.view(g, B, *v.shape[1:]) for k, v in batch.items()}, keys, weights.view(g, B)
