"""The actor of the ray schedule (hetrl/runtime/ray_schedule.py): a Ray actor on any node.

It steps `envs` envs with the same :class:`hetrl.actors.Actor` as every schedule and pushes every chunk straight
to its replay-server shard, not through the learner. The learner drives it with `collect` calls (at most two
queued, a double buffer):

    collect(n, explore, params, stage) -> (env steps, acting version, episodes, busy s, server counters)
    state_dict() / load_state_dict(state)      the actor's state (an exact resume, at a phase boundary)

`explore`: the algorithm's exploration value for each vector step (as in the local schedule); `params`: the
learner's RayParameterStore, whose weights are fetched only when newer than the actor's. The call returns once
the server acknowledged the insert (its rate limiter holds the actor there while the learner is behind); with
`stage` (phases) the chunk is staged at the server, which inserts the phase's chunks in actor order at the
boundary. Without a server (on-policy: the learner holds the rollout) the chunk itself is returned.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import ray


class RayActor:
    def __init__(self, spec: Any, server: Any, one_thread: bool = True, index: int = 0):
        """spec: the learner's ActorSpec (env, seeds, the algorithm's acting policy, n-step, backend)."""
        self.server, self.index = server, index
        # a copy: Ray hands numpy arrays over read-only (zero-copy), and an acting policy may keep state of its
        # own in them (DDPG's Ornstein-Uhlenbeck noise, reset in place at episode ends)
        self.actor = copy.deepcopy(spec).start(one_thread)

    def where(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def collect(self, n: int, explore: list, params: Any, stage: bool = False) -> tuple:
        batch, steps, busy = self.actor.take_grant(params, n, explore)
        if self.server is None:   # an on-policy rollout's share: to the learner, which holds the rollout
            return steps, self.actor.params_version, self.actor.drain_episodes(), busy, batch or {}
        counters, ref = None, ray.put(batch or {})  # one copy in the object store, whatever the retries
        if stage:
            ray.get(self.server.stage.remote(self.index, ref, steps))
        while counters is None and not stage:  # the server's rate limiter may hold us; None = its timeout, ask again
            counters = ray.get(self.server.insert.remote(ref, steps, 1.0))
            if counters is None and ray.get(self.server.is_closed.remote()):
                break
        return steps, self.actor.params_version, self.actor.drain_episodes(), busy, counters

    def state_dict(self) -> dict:
        return self.actor.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state)
