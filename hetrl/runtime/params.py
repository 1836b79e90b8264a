"""Parameter stores (:class:`ParameterStore`): versioned weights from the learner to the actors, without blocking
either side. Inline: :class:`InProcessParameterStore` (a host copy); local:
:class:`hetrl.runtime.shm.SharedParameterStore` (a seqlock in shared memory); ray: :class:`RayParameterStore` (one
object in Ray's object store per publication, read by every actor; the store itself travels with each collect call).
"""

from __future__ import annotations

from typing import Protocol

import torch

from hetrl.algos.nets import FlatState


class ParameterStore(Protocol):
    def publish(self, state: dict[str, torch.Tensor]) -> int:
        """Store `state` (tensors on any device) under the next version (0, 1, 2, ...; one writer, the learner);
        never waits for readers."""

    def latest(self, have: int) -> tuple[dict[str, torch.Tensor], int] | None:
        """The newest (host) weights and their version if newer than `have`, else None."""


def host_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def flat_host_copy(state: dict[str, torch.Tensor]) -> FlatState:
    """host_copy as a FlatState; of one whose tensors lie in one buffer, in one buffer of its own."""
    flat = getattr(state, "flat", None)
    if flat is None:
        return FlatState.of(host_copy(state))
    buf, out, o = flat.detach().to("cpu", copy=True), {}, 0
    for k, v in state.items():
        out[k] = buf[o:o + v.numel()].view(v.shape)
        o += v.numel()
    return FlatState.of(out)


class InProcessParameterStore:
    def __init__(self) -> None:
        self.version = -1
        self._state: FlatState | None = None

    def publish(self, state: dict[str, torch.Tensor]) -> int:
        # actors act on the CPU, from weights the learner cannot change: a host copy, into the buffers of the
        # last one when they fit (the in-process reader copies what it reads at once, as policies' load does);
        # a state whose tensors lie in one buffer (a FlatState) is kept as one, and copied as one
        old = self._state
        with torch.no_grad():
            if old is not None and FlatState.signature(state) == old.sig:
                old.copy_from(state)
            else:
                self._state = flat_host_copy(state)
        self.version += 1
        return self.version

    def latest(self, have: int) -> tuple[dict[str, torch.Tensor], int] | None:
        if self._state is None or self.version <= have:
            return None
        return self._state, self.version


class RayParameterStore:
    """Weights in Ray's object store. The learner publishes; the (small) store object is passed
    to actors with each call, and `latest` there fetches the weights only when newer."""

    def __init__(self) -> None:
        self.version = -1
        self._ref: list = []        # [ObjectRef]: a list, so pickling passes the reference, not the value

    def publish(self, state: dict[str, torch.Tensor]) -> int:
        import ray

        self._ref = [ray.put(host_copy(state))]
        self.version += 1
        return self.version

    def latest(self, have: int) -> tuple[dict[str, torch.Tensor], int] | None:
        import ray

        if not self._ref or self.version <= have:
            return None
        return ray.get(self._ref[0]), self.version
