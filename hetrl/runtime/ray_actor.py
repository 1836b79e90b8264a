"""The actor of the ray schedule (hetrl/runtime/ray_schedule.py): a Ray actor on any node.

Each one steps `envs` envs with batched inference on its policy snapshot, as the actors of the
other schedules do (the same :class:`hetrl.actors.Actor`), and pushes every chunk of
transitions straight to its replay-server shard, not through the learner.  The learner drives
it with `collect` calls (at most two queued, a double buffer):

    collect(n, explore, params) -> (env steps, rows, acting version, episodes, busy s, server counters)

`explore` holds the algorithm's exploration value for each vector step (the learner's algorithm
object decides epsilon / the noise, as in the local schedule); `params` is ``(version, [ref])``
where `ref` is one object in Ray's object store that every actor reads (a broadcast, not a copy
per actor); it is fetched only when its version is newer than the one the actor acts with.
The call returns once the server acknowledged the insert: its rate limiter holds the actor
there while the learner is behind.
"""

from __future__ import annotations

import os
import time
from typing import Any

from hetrl.runtime.local_actor import _Explore


class RayActor:
    def __init__(self, index: int, cfg: Any, env: Any, policy: Any, envs: int, env_seed: int,
                 server: Any, one_thread: bool = True):
        """policy: the learner's algo.make_policy(seed), pickled (the algorithm's own acting code)."""
        import torch

        from hetrl.actors import Actor

        if one_thread:
            torch.set_num_threads(1)
        torch.set_flush_denormal(True)
        self.index, self.server, self.envs = index, server, envs
        self.actor = Actor(env, envs, env_seed, policy, cfg.n_step, cfg.gamma, cfg.env_backend)
        self.version = -1

    def where(self) -> dict:
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def collect(self, n: int, explore: list, params: tuple) -> tuple:
        import ray

        t0 = time.perf_counter()
        version, box = params
        if version > self.version:
            self.actor.load(ray.get(box[0]), version)
            self.version = version
        start = self.actor.env_steps
        batch = self.actor.collect(n, _Explore(explore, start, self.envs))
        steps = self.actor.env_steps - start
        busy = time.perf_counter() - t0
        rows = 0 if batch is None else len(batch["obs"])
        counters, ref = None, ray.put(batch or {})  # one copy in the object store, whatever the retries
        while counters is None:  # the server's rate limiter may hold us; None = its timeout, ask again
            counters = ray.get(self.server.insert.remote(ref, steps, 1.0))
            if counters is None and ray.get(self.server.is_closed.remote()):
                break
        return steps, rows, self.version, self.actor.drain_episodes(), busy, counters

    def close(self) -> None:
        self.actor.close()
