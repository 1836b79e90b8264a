"""The replay server: replay manager + data storage + rate limiter behind one lock (seeds/004).

Remote actors push batches of transitions with ``insert``; the learner asks for ready batches
with ``sample`` (prioritised sampling, importance weights and the row gather all happen here,
server-side) and sends its TD errors back with ``update_priorities``, which write into the one
sum tree ``sample`` reads. Calls to a threaded actor may run in any order, so a sample names how
many priority updates its caller had sent (``after``) and waits until they are written: the
learner's priority lag (hetrl/runtime/ratio.py) holds at the server too. The rate limiter (Reverb's
``SampleToInsertRatio``, counting env steps inserted and transitions sampled) lives here too: an insert
that would put the actors too far ahead waits, a sample that would put the learner too far ahead waits;
both give up after ``timeout`` seconds and answer ``None`` so the caller can look at its other work.

The class is plain Python and thread-safe (one ``threading.Condition``): the ray schedule
serves it as a threaded Ray actor (``hetrl/runtime/ray_schedule.py``), so several actors'
inserts and the learner's samples may wait at the same time without blocking each other's
progress; it is equally usable in one process (the tests do both).
"""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import torch

from hetrl.errors import UsageError
from hetrl.replay.buffer import ReplayBuffer
from hetrl.replay.rate_limiter import RatioRule
from hetrl.replay.storage import Spec


class ReplayServer:
    """A prioritised (or uniform) replay with a sample-to-insert rate limiter, served to many clients.

    Args:
        capacity, spec, prioritized, alpha, beta, seed, frames: as :class:`ReplayBuffer` (CPU storage).
        samples_per_insert: target transitions sampled per env step inserted (replay ratio x batch).
        min_size: env steps inserted before the first sample.
        error_buffer: how far (in samples) either side may run ahead of the ratio (Reverb's).
        rate_limit: False = no waiting (samples only need ``min_size`` and a non-empty replay).
    """

    def __init__(self, capacity: int, spec: Spec, *, prioritized: bool = False, alpha: float = 0.6,
                 beta: float = 0.4, seed: int | None = None, samples_per_insert: float = 1.0,
                 min_size: int = 1, error_buffer: float | tuple[float, float] = 1.0, rate_limit: bool = True,
                 check_finite: bool = True, frames: bool = False):
        self.replay = ReplayBuffer(capacity, spec, "cpu", prioritized=prioritized, alpha=alpha, beta=beta, seed=seed,
                                   check_finite=check_finite, frames=frames)
        self.rule = RatioRule.from_error_buffer(samples_per_insert, min_size, error_buffer)
        self.rate_limit = bool(rate_limit)
        self.inserts = 0          # env steps inserted (the rate limiter's unit)
        self.samples = 0          # transitions sampled
        self.rows = 0             # transitions stored (differs from env steps under n-step)
        self.insert_calls = 0
        self.sample_calls = 0
        self.priority_updates = 0  # update_priorities calls written
        self.insert_wait_s = 0.0  # time inserts waited for the learner
        self.sample_wait_s = 0.0  # time samples waited for the actors
        self.closed = False
        self._staged: dict[int, tuple[dict, int]] = {}   # actor -> its chunk of this phase (stage / commit)
        self._cond = threading.Condition()

    # ---- the protocol ---------------------------------------------------------------------------
    def insert(self, batch: dict[str, np.ndarray], steps: int | None = None,
               timeout: float | None = None) -> dict | None:
        """Store a batch of transitions that took `steps` env steps (default: its rows).

        Waits while the rate limiter holds actors back; returns the counters after the insert
        (the acknowledgement: the data is in), or None on timeout or after close()."""
        rows = len(batch["obs"]) if batch else 0
        steps = rows if steps is None else int(steps)
        t0 = time.perf_counter()
        with self._cond:
            if self.rate_limit and not self._cond.wait_for(
                    lambda: self.closed or self.rule.can_insert(self.inserts, self.samples, steps), timeout):
                return None
            if self.closed:
                return None
            self.insert_wait_s += time.perf_counter() - t0
            if rows:
                self.replay.insert(batch)
            self.inserts += steps
            self.rows += rows
            self.insert_calls += 1
            self._cond.notify_all()
            return self._counters()

    def stage(self, actor: int, batch: dict[str, np.ndarray], steps: int) -> None:
        """Hold actor `actor`'s chunk of a phase until commit() (a reproducible run: phases)."""
        with self._cond:
            self._staged[int(actor)] = (batch, int(steps))

    def commit(self, after: int = 0) -> dict:
        """A phase boundary: the staged chunks go in, in actor order, once the `after` priority updates sent before
        are written (so the new items get the max priority the phase's |TD| left); returns the counters."""
        with self._cond:
            self._cond.wait_for(lambda: self.closed or self.priority_updates >= after)
            for actor in sorted(self._staged):
                batch, steps = self._staged[actor]
                if batch:
                    self.replay.insert(batch)
                    self.rows += len(batch["obs"])
                self.inserts += steps
                self.insert_calls += 1
            self._staged.clear()
            self._cond.notify_all()
            return self._counters()

    def sample(self, batches: int, batch_size: int, beta: float | None = None, timeout: float | None = None,
               after: int = 0):
        """Draw `batches` batches of `batch_size`: ``(stack, keys, weights, counters)`` with stack
        ``{field: (batches, batch_size, ...)}`` NumPy arrays, keys ``(batches * batch_size,)`` and
        weights ``(batches, batch_size)`` float32; None when the rate limiter does not allow it, or
        fewer than `after` priority updates are written, within `timeout` seconds, or after close()."""
        n = int(batches) * int(batch_size)
        t0 = time.perf_counter()
        with self._cond:
            def allowed() -> bool:
                if len(self.replay) == 0 or self.inserts < self.rule.min_size_to_sample:
                    return False
                if self.priority_updates < after:
                    return False
                return not self.rate_limit or self.rule.can_sample(self.inserts, self.samples, n)

            if not self._cond.wait_for(lambda: self.closed or allowed(), timeout) or self.closed:
                return None
            self.sample_wait_s += time.perf_counter() - t0
            if beta is not None:
                self.replay.set_beta(beta)
            batch, keys, weights = self.replay.sample(n)
            self.samples += n
            self.sample_calls += 1
            self._cond.notify_all()
            stack = {k: v.numpy().reshape(batches, batch_size, *v.shape[1:]) for k, v in batch.items()}
            return stack, keys, weights.numpy().reshape(batches, batch_size), self._counters()

    def update_priorities(self, keys: np.ndarray, td_errors: np.ndarray) -> None:
        """The learner's |TD| for sampled keys, into the tree that samples (one per key)."""
        with self._cond:
            self.replay.update_priorities(keys, td_errors)
            self.priority_updates += 1
            self._cond.notify_all()

    # ---- state ------------------------------------------------------------------------------------
    def _counters(self) -> dict:
        return {"inserts": self.inserts, "samples": self.samples, "size": len(self.replay), "rows": self.rows}

    def stats(self) -> dict:
        with self._cond:
            return {**self._counters(), "insert_calls": self.insert_calls, "sample_calls": self.sample_calls,
                    "priority_updates": self.priority_updates,
                    "insert_wait_s": self.insert_wait_s, "sample_wait_s": self.sample_wait_s,
                    "capacity": self.replay.capacity, "prioritized": self.replay.prioritized}

    def set_counters(self, inserts: int, samples: int) -> None:
        """Restore the rate limiter's counters (after a resume)."""
        with self._cond:
            self.inserts, self.samples = int(inserts), int(samples)
            self._cond.notify_all()

    def state_dict(self) -> dict:
        with self._cond:
            return {"replay": self.replay.state_dict(), "inserts": self.inserts, "samples": self.samples,
                    "rows": self.rows}

    def load_replay(self, replay_state: dict) -> None:
        """A ReplayBuffer's state (replay.pt of any schedule) as this server's contents."""
        with self._cond:
            self.replay.load_state_dict(replay_state)
            self.rows = len(self.replay)
            self._cond.notify_all()

    def load_state_dict(self, state: dict) -> None:
        with self._cond:
            self.replay.load_state_dict(state["replay"])
            self.inserts, self.samples = int(state["inserts"]), int(state["samples"])
            self.rows = int(state.get("rows", len(self.replay)))
            self._cond.notify_all()

    def is_closed(self) -> bool:
        return self.closed

    def close(self) -> None:
        """Wake every waiting call; they and later ones answer None."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class ShardedReplay:
    """A learner's handle on replay shards served as Ray actors (the ray schedule's replay): the
    checkpoint calls of a replay buffer, the shard the next sample comes from, and per shard the env
    steps it acknowledged and the priority updates sent to it (a sample there waits for them)."""

    def __init__(self, handles: list):
        self.handles = handles
        self.next = 0
        self.inserts = [0] * len(handles)
        self.prio_sent = [0] * len(handles)
        self._prio_refs: list = []

    @classmethod
    def start(cls, shards: int, capacity: int, spec: Spec, clients: int, seed: int, **server) -> "ShardedReplay":
        """`shards` ReplayServers of `capacity` / `shards` each (seeds seed, seed + 7, ...; `server`: the rest of
        ReplayServer's arguments) as threaded Ray actors, enough threads for `clients` actors and the learner. They
        sit on the caller's node (soft: elsewhere if it cannot host them), so that sampled batches reach the
        learner through local shared memory."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(num_cpus=0, max_concurrency=clients + 8, max_restarts=0)(ReplayServer)
        where = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
        per = -(-capacity // shards)
        return cls([remote.options(scheduling_strategy=where, name=None).remote(per, spec, seed=seed + 7 * i, **server)
                    for i in range(shards)])

    def acknowledged(self, shard: int, inserts: int) -> int:
        """The env steps shard `shard` inserted since it last said (`inserts`: its count now)."""
        new = max(0, inserts - self.inserts[shard])
        self.inserts[shard] += new
        return new

    def request(self, batches: int, batch_size: int, beta: float | None, timeout: float) -> tuple:
        """Ask the next shard for `batches` batches, after the priorities sent to it: (shard, ObjectRef of
        ReplayServer.sample's answer, read by `answer`)."""
        shard, self.next = self.next, (self.next + 1) % len(self.handles)
        return shard, self.handles[shard].sample.remote(batches, batch_size, beta, timeout, self.prio_sent[shard])

    def answer(self, shard: int, ref) -> tuple | None:
        """The answer to `request` (`ref`, ready): (stack, keys, weights) as tensors over the arrays in Ray's object
        store (read-only memory: the learner only reads them) and the shard's insert count; None where its rate
        limiter held it (the same shard is asked next)."""
        import ray

        got = ray.get(ref)
        if got is None:
            self.next = shard
            return None
        stack, keys, weights, counters = got
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
            stack, weights = {k: torch.from_numpy(v) for k, v in stack.items()}, torch.from_numpy(weights)
        return stack, keys, weights, counters["inserts"]

    def update_priorities(self, shard: int, keys: np.ndarray, td: np.ndarray) -> None:
        import ray

        self._prio_refs.append(self.handles[shard].update_priorities.remote(keys, td))
        self.prio_sent[shard] += 1
        if len(self._prio_refs) > 16:  # surface errors and bound what is in flight
            ray.get(self._prio_refs[:8])
            del self._prio_refs[:8]

    def commit(self) -> None:
        """A phase boundary: every shard inserts its staged chunks (ReplayServer.commit) and says its count."""
        import ray

        counters = ray.get([h.commit.remote(self.prio_sent[i]) for i, h in enumerate(self.handles)])
        self.inserts = [c["inserts"] for c in counters]

    def set_counters(self, inserts: int, samples: int) -> None:
        """After a checkpoint: the rate limiters continue from the run's counters, spread over the shards."""
        import ray

        S = len(self.handles)
        self.inserts = [inserts // S + (i < inserts % S) for i in range(S)]
        ray.get([h.set_counters.remote(self.inserts[i], samples // S) for i, h in enumerate(self.handles)])

    def close(self) -> None:
        import ray

        for h in self.handles:
            try:
                ray.kill(h, no_restart=True)
            except Exception:
                pass

    def state_dict(self) -> dict:
        """One shard: the ReplayBuffer's own state (the same replay.pt as the other schedules write)."""
        import ray

        states = ray.get([h.state_dict.remote() for h in self.handles])
        return states[0]["replay"] if len(states) == 1 else {"shards": states, "next": self.next}

    def load_state_dict(self, state: dict) -> None:
        import ray

        if "shards" in state:
            if len(state["shards"]) != len(self.handles):
                raise UsageError(f"the saved replay has {len(state['shards'])} shards, this run has "
                                 f"{len(self.handles)}: set replay_shards={len(state['shards'])}")
            ray.get([h.load_state_dict.remote(s) for h, s in zip(self.handles, state["shards"])])
            self.next = int(state.get("next", 0))
        elif len(self.handles) == 1:
            ray.get(self.handles[0].load_replay.remote(state))
        else:
            raise UsageError("the saved replay is one buffer; resume it with replay_shards=1")

    def __len__(self) -> int:
        import ray

        return sum(s["size"] for s in ray.get([h.stats.remote() for h in self.handles]))
