"""Parameter store: versioned weights from the learner to the actors.

`publish` never waits for readers; `latest(have)` returns the newest weights only when they
are newer than the version a reader already has, so neither side blocks the other.
"""

from __future__ import annotations

import torch


class ParameterStore:
    def __init__(self) -> None:
        self.version = -1
        self._state: dict[str, torch.Tensor] | None = None

    def publish(self, state: dict[str, torch.Tensor]) -> int:
        """Store a host copy of `state` (actors act on the CPU) under the next version."""
        self._state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        self.version += 1
        return self.version

    def latest(self, have: int) -> tuple[dict[str, torch.Tensor], int] | None:
        if self._state is None or self.version <= have:
            return None
        return self._state, self.version
