"""The ray schedule's transport: actors on any node of a Ray cluster, a replay server they share.

    hetrl train dqn --env CartPole-v1 --schedule ray [--address auto|HOST:PORT] [--actors N]

* N Ray actors (ray_actor.py) step M envs each and push their chunks straight to their replay shard; the
  learner core runs in this (driver) process.
* The replay servers (hetrl/replay/server.py: replay manager + data storage + rate limiter, `replay_shards` of
  them; actor i feeds shard i mod S) sample and gather; the learner gets ready batches, keeps one request in
  flight while it learns (where the priority lag allows) and sends |TD| back to the tree that sampled (a sample
  waits at the server for the priorities sent before it).
* Parameters: one `ray.put` per publication, read by every actor (params.RayParameterStore).
* The learner core's replay ratio decides when actors collect and how many batches the learner asks for.
  Reproducible (the default): phases, as the local schedule's (each actor stages one chunk per phase at its
  server, the servers insert them in actor order at the boundary). Timed (reproducible=false): the servers
  apply the ratio's sample side per shard and take chunks as they come.

A dead actor (node lost, crash, `ray.kill`) is replaced wherever the cluster has CPUs; env steps are counted from
the servers' acknowledgements, so a chunk lost with its actor is collected again. Without `ray_address` a local
Ray is started and stopped; a Ray the caller initialised is used as it is. docs/ray.md has the details.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import time
from dataclasses import replace

from hetrl.actors.envs import EnvSpec
from hetrl.config import Config
from hetrl.errors import HetrlError, NonFiniteError, UsageError
from hetrl.replay.server import ShardedReplay
from hetrl.runtime.core import ActorsSchedule, LearnerCore, Slot
from hetrl.runtime.layout import layout
from hetrl.runtime.params import RayParameterStore

try:
    import ray
except ImportError:   # Ray is optional (hetrl[ray]): import_ray() says how to install it
    ray = None

SAMPLE_WAIT_S = 0.05      # how long the server may hold a sample request (then the learner looks again)
START_S = 300.0           # for the actors to start (or send their state)


def import_ray():
    if ray is None:
        raise UsageError("--schedule ray needs Ray: pip install 'hetrl[ray]' (or pip install ray)")
    return ray


_started = False  # whether hetrl started the Ray it is connected to (then it stops it too)


def connect(cfg: Config):
    """Ray, initialised: the caller's if it called ray.init, else the cluster at cfg.system.ray_address,
    else a local Ray started here (one node, this machine's CPUs)."""
    global _started
    import_ray()
    if ray.is_initialized():
        return ray
    kw = dict(include_dashboard=False, log_to_driver=True, logging_level="warning")
    if cfg.system.ray_address:
        try:
            ray.init(address=cfg.system.ray_address, **kw)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UsageError(f"cannot connect to the Ray cluster at {cfg.system.ray_address!r}: {e}; start one with "
                             "`ray start --head` (docs/ray.md) or drop --address to start a local one") from None
    else:  # a new Ray of its own, even where `ray start` left a cluster on this machine (use --address auto for it)
        ray.init(address="local", num_cpus=os.cpu_count() or 1, **kw)
        _started = True
    return ray


def disconnect() -> None:
    """Stop the Ray that connect() started (a cluster or the caller's Ray is left running)."""
    global _started
    if _started:
        ray.shutdown()
        _started = False


def cluster_cpus() -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def nodes_lacking(module: str) -> list[str]:
    """The addresses of the alive Ray nodes with CPUs (where actors may run) whose Python cannot import
    `module`: the planner's choices (EnvPool) are measured on this machine and must hold on every node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    probe = ray.remote(num_cpus=0, max_retries=0)(_imports)
    found = ray.get([probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                     .remote(module) for n in nodes], timeout=120)
    return [f"{n['NodeManagerAddress']} (node {n['NodeID'][:8]})" for n, ok in zip(nodes, found) if not ok]


def cluster_env_backend(measured: str) -> tuple[str, str | None]:
    """The env backend for a Ray run whose profile (on this machine) measured `measured` faster:
    EnvPool only where every node has it, else Gymnasium and a line saying why."""
    if measured != "envpool" or not (lacking := nodes_lacking("envpool")):
        return measured, None
    return "gymnasium", (f"EnvPool measured faster here, but the Ray node(s) {', '.join(lacking)} do not have it: "
                         "Gymnasium envs on every node")


class _Slot(Slot):
    """The learner's view of one Ray actor; its grants in flight are its collect calls (ObjectRef -> env steps), its
    chunk of a phase is staged at its server; `where` it runs (its process and node)."""

    handle = None
    where: dict = {}


class RaySchedule(ActorsSchedule):
    name = "ray"
    replay_here = False

    def __init__(self, cfg: Config, env: EnvSpec):
        self.cfg, self.env = cfg, env
        self.servers: list = []
        connect(cfg)
        if cfg.system.env_backend == "envpool" and (lacking := nodes_lacking("envpool")):
            self.close()
            raise UsageError(f"env_backend=envpool but EnvPool is not installed on the Ray node(s) "
                             f"{', '.join(lacking)}: pip install 'hetrl[envpool]' there, or use --set "
                             "env_backend=gymnasium")
        lay = layout(cfg, cores=cluster_cpus())
        # the learner's threads: this machine's cores the actors leave free (all of them when
        # the actors fit elsewhere is not known before Ray places them: assume they are here)
        threads = cfg.system.threads or max(1, min((os.cpu_count() or 1) - lay.actors, lay.learner_threads))
        self.lay = lay = replace(lay, learner_threads=threads)
        if cfg.system.replay_shards > lay.actors:
            self.close()
            raise UsageError(f"replay_shards={cfg.system.replay_shards} is more than the {lay.actors} actors: a "
                             "shard no actor feeds would never be sampled; use at most one shard per actor")
        self.core = LearnerCore(cfg, env, lay.learner_threads, lay, servers=cfg.system.replay_shards)
        self.params = RayParameterStore()
        self._episodes: list[tuple[float, int]] = []
        self._pending = None            # (shard, ObjectRef, batches) of a sample request in flight
        cpus, need = ray.cluster_resources().get("CPU", 0), lay.actors * cfg.system.ray_actor_cpus
        if need > cpus + 1e-9:
            self.close()
            raise UsageError(f"{lay.actors} actors x ray_actor_cpus={cfg.system.ray_actor_cpus:g} need {need:g} CPUs "
                             f"but the Ray cluster has {cpus:g}: lower --actors, add nodes, or set ray_actor_cpus "
                             f"(e.g. --set ray_actor_cpus={max(0.1, round(cpus / lay.actors, 2)):g})")
        t0 = time.perf_counter()
        if self.core.rollout:   # on-policy: the actors send their rollout shares here, to the learner's rollout
            self.replay = self.core.make_replay()
        else:
            S = cfg.system.replay_shards
            self.replay = ShardedReplay.start(S, cfg.buffer_size, self.core.spec, lay.actors, cfg.seed,
                                              prioritized=cfg.prioritized, alpha=cfg.per_alpha, beta=cfg.per_beta,
                                              check_finite=cfg.system.check_finite, frames=self.core.frames,
                                              **self.core.ratio.server_rule(S))
            self.servers = self.replay.handles
        self.core.attach(self.params)
        self.slots: list[_Slot] = [_Slot(i) for i in range(lay.actors)]
        self._start_actors()
        self.startup_s = time.perf_counter() - t0

    # ---- actors -------------------------------------------------------------------------------------
    def _spawn(self, s: _Slot) -> None:
        from hetrl.runtime.ray_actor import RayActor

        spec = self.core.actor_spec(s.index, self.lay.envs_per_actor)
        remote = ray.remote(num_cpus=self.cfg.system.ray_actor_cpus, max_restarts=0)(RayActor)
        server = self.servers[s.index % len(self.servers)] if self.servers else None
        s.handle = remote.remote(spec, server, self.cfg.system.actor_one_thread, s.index)
        s.outstanding = {}

    def _start_actors(self) -> None:
        for s in self.slots:
            self._spawn(s)
        try:
            wheres = ray.get([s.handle.where.remote() for s in self.slots], timeout=START_S)
        except Exception as e:
            self.close()
            raise self._error(e, "while starting") from None
        for s, w in zip(self.slots, wheres):
            s.where = w

    # ---- the learner's loop ---------------------------------------------------------------------
    def _grant_one(self, s: _Slot) -> bool | None:
        """Actor s's next chunk (phases: staged at its server); None when the core grants none now."""
        grant = self.core.next_grant(self.lay.envs_per_actor)
        if grant is None:
            return None
        ref = s.handle.collect.remote(grant[0], grant[1], self.params, self.core.ratio.phased)
        s.outstanding[ref] = grant[0]
        self.core.granted(ref, grant[0])
        return True

    def _insert_phase(self) -> None:
        """The servers insert the phase's chunks in actor order, once the priorities sent before are written; the
        env steps are counted in the same order."""
        self.replay.commit()
        super()._insert_phase()

    def _insert(self, s: _Slot, ref, steps: int, version: int, episodes: list, busy: float) -> None:
        self.core.returned(ref)
        self.core.inserted(steps, version, busy)
        self._episodes.extend(episodes)

    def _poll(self, timeout: float) -> None:
        """Wait up to `timeout` for a collect call or the sample request to end, then take the collect calls
        that ended."""
        refs = [r for s in self.slots for r in s.outstanding]
        refs += [self._pending[1]] if self._pending is not None else []
        if timeout and refs:
            t0 = time.perf_counter()
            ray.wait(refs, num_returns=1, timeout=timeout)
            self.c.learner_wait_s += time.perf_counter() - t0
        for s in self.slots:
            if not s.outstanding:
                continue
            ready, _ = ray.wait(list(s.outstanding), num_returns=len(s.outstanding), timeout=0)
            for ref in ready:
                s.outstanding.pop(ref)
                try:
                    steps, version, episodes, busy, counters = ray.get(ref)
                except ray.exceptions.RayActorError as e:   # a new actor (Ray places it wherever there are CPUs)
                    self.core.returned(ref)
                    self._replace(s, f"actor {s.index} died ({e.__class__.__name__})")
                    break
                except Exception as e:  # an error inside the actor: raise it here with its message
                    self.close()
                    raise self._error(e, f"(actor {s.index})") from None
                if self.core.ratio.phased:   # staged at its server: counted at the boundary, in actor order
                    s.chunk = (ref, steps, version, episodes, busy)
                elif self.core.rollout:   # `counters` is the chunk itself (no replay server)
                    self.core.insert(self.replay, counters, s.index)
                    self._insert(s, ref, steps, version, episodes, busy)
                else:
                    self.core.returned(ref)
                    if counters is not None:
                        self._count_inserts(s.index % len(self.servers), counters["inserts"], version)
                    self.c.acting_s += busy
                    self._episodes.extend(episodes)

    def _count_inserts(self, shard: int, inserts: int, version: int | None = None) -> None:
        """Env steps come from the servers' acknowledgements (a chunk lost with its actor is not counted)."""
        if new := self.replay.acknowledged(shard, inserts):
            self.core.inserted(new, version)

    # learning -----------------------------------------------------------------------------------------
    def _draw(self, g: int) -> None:
        """Ask the next shard for g batches (the server waits until its rate limiter allows, and until the
        priorities sent to it before are written)."""
        self._pending = (*self.replay.request(g, self.cfg.batch_size, self.core.beta(), SAMPLE_WAIT_S), g)

    def _drawing(self) -> bool:
        return self._pending is not None

    def _receive(self) -> tuple | None:
        shard, ref, g = self._pending
        if not ray.wait([ref], timeout=0)[0]:
            return None
        t0 = time.perf_counter()
        got, self._pending = self.replay.answer(shard, ref), None
        if got is None:  # the rate limiter held it: the same shard is asked again later
            self.core.ratio.undrawn(g)
            return None
        stack, keys, weights, inserts = got
        self._count_inserts(shard, inserts)
        self.c.replay_s += time.perf_counter() - t0
        return stack, keys, weights, shard

    def _learned(self, shard, keys, td) -> None:
        if self.cfg.prioritized:
            self.replay.update_priorities(shard, keys, td.detach().cpu().numpy().reshape(-1))

    # ---- life cycle -----------------------------------------------------------------------------------
    def _error(self, e: Exception, where: str) -> Exception:
        """A one-line hetrl error where the actor raised one (its traceback's last line: an actor that failed in its
        constructor, a bad setting, dies with the error as text only), else HetrlError."""
        for kind in (UsageError, NonFiniteError):
            said = re.search(rf"hetrl\.errors\.{kind.__name__}: (.+)", str(e))
            if said:
                return kind(said.group(1).strip())
        return HetrlError(f"a Ray actor failed {where}: {e}")

    def _stop_actors(self) -> None:
        for s in getattr(self, "slots", []):
            if s.handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(s.handle, no_restart=True)
                s.handle, s.outstanding = None, {}

    def _close(self) -> None:
        self._stop_actors()
        if getattr(self, "core", None) is not None:
            self.core.close()
        if self.servers:
            self.replay.close()
        disconnect()

    # ---- figures and state ----------------------------------------------------------------------
    def transport_figures(self) -> dict:
        nodes = {s.where.get("node") for s in self.slots}
        return {**super().transport_figures(), "replay_shards": len(self.servers), "ray_nodes": len(nodes)}

    def _ask_states(self) -> dict:
        try:
            return self._states(ray.get([s.handle.state_dict.remote() for s in self.slots], timeout=START_S))
        except Exception as e:   # an actor lost meanwhile
            return {"unsaved": f"an actor did not send its state ({type(e).__name__})"}

    def _load_actors(self, states: list[dict]) -> None:
        self._sync_servers()
        ray.get([s.handle.load_state_dict.remote(state) for s, state in zip(self.slots, states)])

    def _sync_servers(self) -> None:
        """After a checkpoint: the rate limiter continues from the run's counters."""
        if self.servers:
            self.replay.set_counters(self.c.env_steps, self.c.samples)

    def _restart_actors(self) -> None:
        self._sync_servers()
        super()._restart_actors()
