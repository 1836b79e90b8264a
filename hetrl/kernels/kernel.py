"""The learner kernel's interface: it runs algo.learn(batches, weights)'s updates over the same state, faster."""

from __future__ import annotations

import torch


class Kernel:
    """Runs algo.learn(batches, weights)'s updates over the same parameters and optimizer state, faster."""

    name = "?"

    def __init__(self, algo, **options):
        self.algo = algo
        self.compile_s = 0.0   # seconds spent compiling

    @classmethod
    def check(cls, algo) -> str | None:
        """None: it takes this algorithm (its networks, device, dtype); else one line saying why not."""
        return None

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """batches: (K, B, ...) tensors, weights (K, B); returns |TD| (K, B); advances algo.updates as algo.learn."""
        return self.algo.learn(batches, weights)

    def use_threads(self, n: int) -> None:
        """The learner's thread count (changes during a run)."""

    def wrap_policy(self, policy):
        """Acting: may swap the networks inside an acting policy for equal, faster modules; returns the policy."""
        return policy

    def figures(self) -> dict:
        return {}

    def close(self) -> None:
        """Restore every process-wide setting it changed."""
