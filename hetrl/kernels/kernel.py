"""A learner kernel: what runs an algorithm's updates. It wraps the algorithm from outside.

    kernel = CompiledKernel(algo)            # or PublicKernel(algo), CudaGraphKernel(algo)
    td = kernel.learn(batches, weights)      # the same updates as algo.learn(batches, weights)

A kernel works on the algorithm's own parameters and optimizer state (checkpoints, publishing and a
switch back to the public path see one state) and advances `algo.updates` as `algo.learn` does. The
algorithm's `learn` (public torch) is the reference every other kernel is checked equal to before it is
chosen (hetrl/kernels/select.py); the algorithm never imports a kernel.
"""

from __future__ import annotations

import torch


class Declined(Exception):
    """A kernel cannot run this algorithm's learn (found while compiling it); the message is one line naming the
    operation and the algorithm. The gate (select.py) records it in the Choice's `declined` and keeps public."""


class Kernel:
    name = "?"
    releases_gil = False     # its learn runs without Python's GIL (a population's members then learn side by side)
    # its results are bit-identical whatever the learner's thread count: only then may a run change the count
    # mid-run (the thread governor under load, the planner's run-time correction, hetrl/planner/follow.py); a
    # kernel whose reductions follow the threads (torch's MKL / OpenMP GEMMs) keeps the count it starts with
    threads_exact = False
    # where the kernel found, at its first phases, that it cannot run this algorithm (one line, see Declined) and runs
    # the public learn instead
    declined: str | None = None

    def __init__(self, algo, **options):
        self.algo = algo
        self.compile_s = 0.0     # seconds spent compiling or capturing (reported with the run's figures)

    @classmethod
    def side_by_side(cls) -> bool:
        """Whether phases of several algorithms (a population's members) may run at once in threads of one process:
        the kernel runs without the GIL and whatever it launches may be entered from several threads at once."""
        return cls.releases_gil

    @classmethod
    def check(cls, algo) -> str | None:
        """None where this kernel takes `algo` (its networks, device, dtype); else one line saying why not,
        naming the network or layer it cannot take."""
        return None

    def prepare(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> None:
        """Get ready for phases of this shape (compile, capture) without taking an update."""

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """K gradient steps on batches (each field (K, B, ...)) with weights (K, B); returns |TD| (K, B)."""
        raise NotImplementedError

    def use_threads(self, n: int) -> None:
        """The learner's thread count (the ThreadGovernor lowers it while other work needs the cores)."""
        torch.set_num_threads(max(1, int(n)))

    def wrap_policy(self, policy):
        """An acting policy with its networks' forward run by this kernel where that is faster (the same
        function); the policy itself by default."""
        return policy

    def figures(self) -> dict:
        """What result.json reports of this kernel beside its name."""
        return {}

    def close(self) -> None:
        """Restore every process-wide setting this kernel changed."""
