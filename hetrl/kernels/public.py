"""The public kernel: the algorithm's own `learn` (autograd and torch.optim), the reference."""

from __future__ import annotations

from hetrl.kernels.kernel import Kernel


class PublicKernel(Kernel):
    name = "public"

    def learn(self, batches, weights):
        return self.algo.learn(batches, weights)
