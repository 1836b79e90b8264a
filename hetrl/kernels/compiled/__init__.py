"""The compiled CPU kernel: every gradient step of a phase in one numba call (hetrl/algos/compiled.py)."""

from __future__ import annotations

from hetrl.algos import compiled as _phases
from hetrl.kernels.kernel import Kernel


class CompiledKernel(Kernel):
    name = "compiled"
    releases_gil = True      # its phase is one numba call compiled with nogil

    def __init__(self, algo, gemm: str | None = None, **options):
        super().__init__(algo)
        self.compile_s = _phases.warm_up(algo.name)

    @classmethod
    def check(cls, algo) -> str | None:
        if not _phases.available():
            return "the compiled kernel needs numba and scipy, which do not import here"
        if algo.device.type != "cpu":
            return f"the compiled kernel runs a CPU learner; this one is on {algo.device}"
        if algo.name not in ("dqn", "ddpg", "td3", "sac"):
            return f"the compiled kernel has no loss head for {algo.name}"
        if getattr(algo, "pixels", False):
            return "the compiled kernel takes vector observations; this learner's are pixels (the Nature CNN)"
        if not _phases.applies(algo):
            return "the compiled kernel takes plain Linear-ReLU MLPs on vector observations in float32"
        return None

    def learn(self, batches, weights):
        return _phases.phase(self.algo, batches, weights)

    def use_threads(self, n: int) -> None:
        _phases.use_threads(self.algo, n)

    def figures(self) -> dict:
        from hetrl.algos import sgemm

        return {"sgemm": sgemm.chosen()}
