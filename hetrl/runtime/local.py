"""The local schedule: actor processes, data in shared memory, a rate-limited learner.

    hetrl train dqn --env CartPole-v1 --schedule local [--actors N] [--envs-per-actor M]

The same parts and the same algorithm code as the inline schedule, in several OS processes:

* N actor processes (hetrl/runtime/local_actor.py), each stepping M envs with batched
  inference on its policy snapshot.  Each owns a two-half staging area in shared memory and
  fills one half per grant: a chunk of env steps, handed over with one small message.
* The main process is the learner *and* the replay manager: it owns the algorithm, the sum
  tree and the data storage (a preallocated ring in shared memory, `Storage(buffers=...)`).
  It copies each staged chunk into the ring with one batched insert (new items get the max
  priority), samples, learns and writes the learner's priorities straight into the one tree
  the sampler reads: no priority ever crosses a process boundary, and the learner, which is
  the bottleneck at the presets' replay ratios, never waits on another process for data.
* Parameters go learner -> actors through a seqlock in shared memory (hetrl/runtime/shm.py):
  published every `publish_interval` x `gradient_steps` updates, picked up by the actor at its
  next chunk, without either side blocking; staleness = learner version - acting version.
* A Reverb rate limiter (hetrl/replay/rate_limiter.RatioRule) keeps samples per insert at the
  preset's ratio: SPI = batch_size x gradient_steps / train_freq transitions per env step.
  Actors get a grant only when its env steps may be inserted (grants count as inserts in
  flight), so they block on their control pipe when the learner is behind; the learner samples
  only what the rule allows and blocks in `connection.wait` on the actors' pipes when it is
  ahead.  Nobody spins.
* Prefetch: a learner thread draws the next group of batches (numba sum tree, NumPy gathers
  into fixed double buffers: both release the GIL) while the main thread runs `algo.learn`.

Life cycle: processes come from a forkserver (spawn where missing) that preloads torch, so an
actor starts in ~10 ms; an actor that dies is reported and replaced; an error inside an actor
is raised here with the actor's message and traceback; SIGTERM is turned into the SIGINT that
`Run.learn` already handles (stop at the end of the phase, save a checkpoint).  If this
process is killed outright, the actors exit on their own (lifeline pipe, PR_SET_PDEATHSIG) and
the shared memory, which has no name in /dev/shm (memfd), is freed with the last mapping.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch

from hetrl.actors import probe_spaces
from hetrl.actors.envs import EnvSpec, env_name
from hetrl.algos import make_algorithm, replay_spec
from hetrl.config import Config
from hetrl.errors import HetrlError, UsageError
from hetrl.replay import ReplayBuffer, RatioRule
from hetrl.runtime.inline import Counters, resolve_device
from hetrl.runtime.layout import Layout, layout
from hetrl.runtime.local_actor import ActorArgs, actor_main
from hetrl.runtime.shm import ParamStore, SharedArrays

PHASE_S = 0.1            # a phase() returns after about this long, so Ctrl-C is seen quickly
MAX_RESTARTS = 5         # per actor, before the run gives up
START_TIMEOUT_S = 120.0  # for all actors to report ready (a cold forkserver imports torch)
# what every actor imports; actors get their policy pickled from the learner and build no
# optimizer (torch.optim's first optimizer imports torch._dynamo: 1-3 s of CPU per process)
PRELOAD = ["hetrl.runtime.local_actor", "hetrl.algos.dqn", "hetrl.algos.ddpg", "hetrl.actors", "gymnasium"]


@dataclass
class LocalCounters(Counters):
    samples: int = 0               # transitions drawn (rate limiter), prefetched ones included
    staleness_sum: float = 0.0     # sum over inserted env steps of (learner - acting) version
    staleness_steps: int = 0
    learner_wait_s: float = 0.0    # learner blocked waiting for data
    restarts: int = 0
    insert_messages: int = 0
    params_version: int = 0


def _context(warm: bool = False):
    """The multiprocessing context for actors: forkserver (preloaded, ~10 ms per actor) where
    available, else spawn.  `warm` starts the forkserver now, so its imports run while this
    process builds the learner."""
    method = os.environ.get("HETRL_START_METHOD", "forkserver")
    if method not in mp.get_all_start_methods():
        method = "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
        if warm:
            from multiprocessing import forkserver

            forkserver.ensure_running()
    return ctx


class _Handle:
    """The learner's view of one actor process."""

    def __init__(self, index: int):
        self.index = index
        self.proc = None
        self.ctrl = self.data = self.lifeline = None
        self.ready = False
        self.outstanding: dict[int, int] = {}   # half -> granted env steps
        self.stopping = False
        self.restarts = 0

    def close_pipes(self) -> None:
        for conn in (self.ctrl, self.data, self.lifeline):
            if conn is not None:
                try:
                    conn.close()
                except OSError:
                    pass
        self.ctrl = self.data = self.lifeline = None


class _Fleet:
    """The actor processes; shut down by close(), by the garbage collector or at exit."""

    def __init__(self):
        self.handles: list[_Handle] = []

    def shutdown(self, timeout: float = 2.0) -> None:
        """Ask every actor to stop, then kill what is still alive after `timeout` seconds."""
        for h in self.handles:
            h.stopping = True
            if h.ctrl is not None:
                try:
                    h.ctrl.send(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + timeout
        for h in self.handles:
            if h.proc is not None:
                h.proc.join(max(0.0, deadline - time.monotonic()))
                if h.proc.is_alive():
                    h.proc.kill()
                    h.proc.join(1.0)
                h.proc = None
            h.close_pipes()


class LocalSchedule:
    name = "local"

    def __init__(self, cfg: Config, env: EnvSpec):
        self.cfg, self.env = cfg, env
        if callable(env) and not isinstance(env, str):
            try:
                pickle.dumps(env)
            except Exception:
                raise UsageError(f"env factory {env_name(env)} cannot be sent to actor processes (it is a lambda "
                                 "or a local function); --schedule local needs an env id or a module-level "
                                 "function") from None
        if not cfg.overlap and not cfg.rate_limit:
            raise UsageError("overlap=false (lockstep) learns what the rate limiter allows between collect rounds; "
                             "keep rate_limit=true")
        self.lay = lay = layout(cfg)
        _context(warm=True)
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(lay.learner_threads)
        # denormal Adam moments make CPU arithmetic ~5x slower: flush them (every torch process)
        torch.set_flush_denormal(True)
        self.device = resolve_device(cfg.device)
        self.obs_space, self.act_space = probe_spaces(env)
        self.algo = make_algorithm(cfg, self.obs_space, self.act_space, self.device)
        self.spec = replay_spec(self.obs_space, self.act_space)
        on_cpu = self.device.type == "cpu"
        self._ring = SharedArrays({k: ((cfg.buffer_size, *s), d) for k, (s, d) in self.spec.items()}) if on_cpu else None
        self.replay = ReplayBuffer(cfg.buffer_size, self.spec, self.device, prioritized=cfg.prioritized,
                                   alpha=cfg.per_alpha, beta=cfg.per_beta, seed=cfg.seed,
                                   buffers=None if self._ring is None else self._ring.arrays)
        self.rule = RatioRule.from_error_buffer(lay.spi, lay.min_size, lay.error_buffer)
        self.params = ParamStore(self.algo.policy_state())
        self.c = LocalCounters()
        self.params.publish(self.algo.policy_state(), self.c.params_version)
        self._published_at = 0
        rows = lay.chunk + cfg.n_step * lay.envs_per_actor
        self._staging = [SharedArrays({f"{h}:{k}": ((rows, *s), d) for h in (0, 1) for k, (s, d) in self.spec.items()})
                         for _ in range(lay.actors)]
        self._views = [[{k: st[f"{h}:{k}"] for k in self.spec} for h in (0, 1)] for st in self._staging]
        self._batches = _BatchSource(self.replay, self.spec, cfg.batch_size, lay.group,
                                     preallocate=cfg.preallocate and on_cpu)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hetrl-prefetch") if cfg.prefetch else None
        self._pending = None       # a prefetch in flight (Future)
        self._ready = None         # a drawn group not yet learned
        self._reserved = 0         # env steps granted, not yet inserted
        self._episodes: list[tuple[float, int]] = []
        self._next_actor = 0
        self._finished = False
        self._closed = False
        self.trace: list[tuple[int, int]] | None = None  # (inserts, samples) after each change, when a list
        self.startup_s = 0.0
        self._fleet = _Fleet()
        self._finalizer = weakref.finalize(self, self._fleet.shutdown)
        self._old_sigterm = sigterm_as_sigint()
        self._start_actors()

    # ---- actors ------------------------------------------------------------------------------
    def _start_actors(self) -> None:
        t0, waited = time.perf_counter(), self.c.learner_wait_s
        self._fleet.handles = [_Handle(i) for i in range(self.lay.actors)]
        for h in self._fleet.handles:
            self._spawn(h)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(h.ready for h in self._fleet.handles):
            if time.monotonic() > deadline:
                self.close()
                raise HetrlError(f"actor processes did not start within {START_TIMEOUT_S:.0f} s")
            self._pump(timeout=1.0)
        self.startup_s = time.perf_counter() - t0
        self.c.learner_wait_s = waited

    def _spawn(self, h: _Handle) -> None:
        cfg, lay, ctx = self.cfg, self.lay, _context()
        offset = self.c.env_steps  # restarted / resumed actors do not replay the same episodes
        policy_seed = cfg.seed + 1000 * h.index + 1 + offset
        args = ActorArgs(index=h.index, cfg=cfg, env=self.env, obs_space=self.obs_space, act_space=self.act_space,
                         envs=lay.envs_per_actor, env_seed=cfg.seed + 1000 * h.index + offset,
                         policy_seed=policy_seed, policy=self.algo.make_policy(seed=policy_seed),
                         staging=self._staging[h.index],
                         params=self.params, one_thread=cfg.actor_one_thread,
                         preallocate=cfg.preallocate)
        ctrl_r, ctrl_w = ctx.Pipe(duplex=False)
        data_r, data_w = ctx.Pipe(duplex=False)
        life_r, life_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=actor_main, args=(args, ctrl_r, data_w, life_r), daemon=True,
                           name=f"hetrl-actor-{h.index}")
        try:
            with _main_not_reimported(self.env):
                proc.start()
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            for c in (ctrl_r, ctrl_w, data_r, data_w, life_r, life_w):
                c.close()
            self.close()
            raise UsageError(f"cannot start an actor process: {e}; --schedule local needs a picklable env "
                             "(an id or a module-level factory)") from None
        for c in (ctrl_r, data_w, life_r):  # the child's ends: only the child may hold them
            c.close()
        h.proc, h.ctrl, h.data, h.lifeline = proc, ctrl_w, data_r, life_w
        h.ready, h.outstanding, h.stopping = False, {}, False

    def actor_pids(self) -> list[int]:
        return [h.proc.pid for h in self._fleet.handles if h.proc is not None and h.proc.is_alive()]

    # ---- the learner's loop ---------------------------------------------------------------------
    def phase(self) -> list[tuple[float, int]]:
        if self._closed:
            raise HetrlError("this local schedule was closed; make a new Run")
        t_end = time.perf_counter() + PHASE_S
        while not self._check_finished():
            self._pump(timeout=0.0)
            self._grant()
            if not self._learn_step():
                self._pump(timeout=PHASE_S)
            if time.perf_counter() >= t_end:
                break
        eps, self._episodes = self._episodes, []
        return eps

    def done(self) -> bool:
        return self._check_finished()

    def _check_finished(self) -> bool:
        if self._finished:
            return True
        c, cfg = self.c, self.cfg
        if c.env_steps < cfg.steps:
            return False
        if not cfg.rate_limit:  # no ratio to honour: stop with the data; a drawn group is dropped
            self._join_prefetch()
            self._ready = None
        elif self._ready is not None or self._pending is not None:
            return False
        if cfg.rate_limit and c.env_steps >= self.lay.min_size:
            owed = c.env_steps * self.lay.spi - c.samples - self._offset
            if owed >= cfg.batch_size and len(self.replay) >= cfg.batch_size:
                return False
        self._finished = True
        self._stop_actors()  # nothing left for them; the run's figures and state stay here
        return True

    @property
    def _offset(self) -> float:
        return self.lay.spi * self.lay.min_size

    # rate limiter -----------------------------------------------------------------------------------
    def _grant_size(self) -> int:
        m = self.lay.envs_per_actor
        left = self.cfg.steps - self.c.env_steps - self._reserved
        return 0 if left <= 0 else -(-min(self.lay.chunk, left) // m) * m

    def _may_insert(self, n: int) -> bool:
        if not self.cfg.rate_limit:
            return True
        return self.rule.can_insert(self.c.env_steps + self._reserved, self.c.samples, n)

    def _allowed_group(self) -> int:
        """How many gradient steps (batches) may be drawn now."""
        c, B = self.c, self.cfg.batch_size
        if len(self.replay) < B or c.env_steps < self.lay.min_size:
            return 0
        if not self.cfg.rate_limit:
            return self.lay.group
        if not self.cfg.overlap and self._reserved:
            return 0
        # Reverb lets the sampler lead by the error buffer; in lockstep, and once every env step
        # is in, the learner only catches up (no lead), as inline does
        floor = self.rule.min_diff if self.cfg.overlap and c.env_steps < self.cfg.steps else self._offset
        avail = int((c.env_steps * self.lay.spi - c.samples - floor) // B)
        # ... but never beyond what the whole run owes, so the final ratio is the preset's
        total = max(self.cfg.steps, c.env_steps) * self.lay.spi - self._offset
        avail = min(avail, int((total - c.samples) // B))
        return max(0, min(self.lay.group, avail))

    def _grant(self) -> None:
        """Give free staging halves env steps to collect, as far as the rate limiter allows.
        Overlap: up to two grants per actor (its double buffer), actors taken in turn.
        Lockstep: a collect round (one chunk per actor) only when the learner has nothing to do."""
        handles = [h for h in self._fleet.handles if h.ready and not h.stopping and h.ctrl is not None]
        if not handles:
            return
        lockstep = not self.cfg.overlap
        if lockstep and (self._reserved or self._ready is not None or self._allowed_group()):
            return
        start = self._next_actor % len(handles)
        for k in range(len(handles)):
            h = handles[(start + k) % len(handles)]
            for half in (0, 1):
                if half in h.outstanding or (lockstep and h.outstanding):
                    continue
                n = self._grant_size()
                if n == 0 or not self._may_insert(n):
                    return
                # the algorithm's exploration at the global step count of each vector step
                base, m = self.c.env_steps + self._reserved, self.lay.envs_per_actor
                table = [self.algo.exploration(base + k * m) for k in range(n // m)]
                try:
                    h.ctrl.send((half, n, table))
                except OSError:
                    break  # it died: its sentinel tells _pump
                h.outstanding[half] = n
                self._reserved += n
                self._next_actor = start + k + 1

    # learning -----------------------------------------------------------------------------------------
    def _draw(self, g: int):
        t0 = time.perf_counter()
        item = self._batches.draw(g)
        return item, time.perf_counter() - t0

    def _take(self, g: int) -> None:
        """Count g batches as sampled (rate limiter) and draw them, in the background if prefetching."""
        self.c.samples += g * self.cfg.batch_size
        self._record()
        if self.cfg.prioritized:
            frac = min(1.0, self.c.env_steps / self.cfg.steps)
            self.replay.set_beta(self.cfg.per_beta + frac * (1.0 - self.cfg.per_beta))
        if self._pool is not None:
            self._pending = self._pool.submit(self._draw, g)
        else:
            self._ready, dt = self._draw(g)
            self.c.replay_s += dt

    def _join_prefetch(self) -> None:
        if self._pending is not None:
            self._ready, dt = self._pending.result()
            self._pending = None
            self.c.replay_s += dt

    def _learn_step(self) -> bool:
        """One algo.learn call on a group of batches; False when the rule allows none."""
        self._join_prefetch()
        if self._ready is None:
            g = self._allowed_group()
            if g == 0:
                return False
            self._take(g)
            self._join_prefetch()
        item, self._ready = self._ready, None
        if self._pool is not None:  # draw the next group while this one is learned
            g2 = self._allowed_group()
            if g2:
                self._take(g2)
        g, stack, keys, weights = item
        t0 = time.perf_counter()
        td = self.algo.learn(stack, weights)
        t1 = time.perf_counter()
        self.c.learner_s += t1 - t0
        self.c.gradient_steps += g
        self.c.phases += 1
        self._join_prefetch()  # the replay changes only after the prefetch is done with it
        if self.cfg.prioritized:
            t2 = time.perf_counter()
            self.replay.update_priorities(keys, td.reshape(-1))
            self.c.replay_s += time.perf_counter() - t2
        if self.c.gradient_steps - self._published_at >= self.lay.publish_every:
            self.c.params_version += 1
            self.params.publish(self.algo.policy_state(), self.c.params_version)
            self._published_at = self.c.gradient_steps
        return True

    # messages -----------------------------------------------------------------------------------------
    def _pump(self, timeout: float) -> None:
        """Handle every message and exit that is ready; wait up to `timeout` for the first."""
        handles = [h for h in self._fleet.handles if h.proc is not None]
        waitables = {}
        for h in handles:
            waitables[h.data] = h
            waitables[h.proc.sentinel] = h
        if not waitables:
            return
        t0 = time.perf_counter()
        ready = mpc.wait(list(waitables), timeout)
        if timeout:
            self.c.learner_wait_s += time.perf_counter() - t0
        for obj in ready:
            h = waitables[obj]
            if h.proc is None:
                continue  # handled through its other waitable
            if obj is h.data:
                self._read(h)
            elif not h.proc.is_alive():
                self._on_exit(h)

    def _read(self, h: _Handle) -> None:
        try:
            while h.data.poll():
                self._handle(h, h.data.recv())
        except (EOFError, OSError):
            pass  # it exited: its sentinel follows

    def _handle(self, h: _Handle, msg) -> None:
        kind = msg[0]
        if kind == "chunk":
            _, half, rows, steps, version, episodes, busy = msg
            self._insert(h, half, rows, steps, version, busy)
            self._episodes.extend(episodes)
        elif kind == "hello":
            h.ready = True
        elif kind == "error":
            _, typ, text, tb = msg
            self.close()
            if typ == "UsageError":
                raise UsageError(text)
            raise HetrlError(f"actor {h.index} failed: {typ}: {text}\n--- the actor's traceback ---\n{tb.rstrip()}")

    def _insert(self, h: _Handle, half: int, rows: int, steps: int, version: int, busy: float) -> None:
        c = self.c
        t0 = time.perf_counter()
        if rows:
            view = self._views[h.index][half]
            self.replay.insert({k: v[:rows] for k, v in view.items()})
        before = c.env_steps
        c.env_steps += steps
        self._reserved -= h.outstanding.pop(half, 0)
        self.algo.on_env_steps(before, c.env_steps)
        c.replay_s += time.perf_counter() - t0
        c.acting_s += busy
        c.insert_messages += 1
        c.staleness_sum += (c.params_version - version) * steps
        c.staleness_steps += steps
        self._record()

    def _on_exit(self, h: _Handle) -> None:
        self._read(h)  # chunks it finished before it died are good data
        proc = h.proc
        proc.join(0.1)
        code = proc.exitcode
        h.proc = None
        h.close_pipes()
        self._reserved -= sum(h.outstanding.values())
        h.outstanding = {}
        if h.stopping or self._closed:
            return
        what = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        if not h.ready:
            self.close()
            hint = (" (an env factory from your script makes actors import the script: keep the training code "
                    "under `if __name__ == '__main__':`)" if _main_needed(self.env) else "")
            raise HetrlError(f"actor {h.index} (pid {proc.pid}) {what} while starting; its error is printed "
                             f"above{hint}")
        h.restarts += 1
        self.c.restarts += 1
        if h.restarts > MAX_RESTARTS:
            self.close()
            raise HetrlError(f"actor {h.index} (pid {proc.pid}) {what}, restart {h.restarts}: giving up")
        print(f"hetrl: actor {h.index} (pid {proc.pid}) {what}; starting a new one "
              f"(restart {h.restarts} of {MAX_RESTARTS})", file=sys.stderr, flush=True)
        self._spawn(h)

    def _record(self) -> None:
        if self.trace is not None:
            self.trace.append((self.c.env_steps, self.c.samples))

    def _stop_actors(self) -> None:
        self._fleet.shutdown()
        self._restore_sigterm()

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    # ---- figures and state ----------------------------------------------------------------------
    def figures(self) -> dict:
        return {**actor_learner_figures(self.c, self.cfg, self.lay, self.startup_s), "schedule": "local",
                "rate_limit": self.cfg.rate_limit, "samples_per_insert": self.lay.spi,
                "rate_error_buffer": self.lay.error_buffer,
                "optimisations": {k: getattr(self.cfg, k) for k in
                                  ("overlap", "batched_insert", "prefetch", "actor_one_thread", "preallocate")}}

    def state_dict(self, with_replay: bool) -> dict:
        counters = asdict(self.c)
        # every learned batch is one gradient step; a drawn group not yet learned is left out
        counters["samples"] = self.c.gradient_steps * self.cfg.batch_size
        state = {"algo": self.algo.state_dict(), "counters": counters, "torch_rng": torch.get_rng_state()}
        if with_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.c.env_steps or self.c.gradient_steps:
            raise HetrlError("load_state_dict must come before the first phase() of a local schedule")
        self.algo.load_state_dict(state["algo"])
        known = {f.name for f in fields(LocalCounters)}
        saved = {k: v for k, v in state["counters"].items() if k in known}
        self.c = LocalCounters(**saved)
        if "samples" not in saved:  # a checkpoint of another schedule: it learned what it owed
            self.c.samples = self.c.gradient_steps * self.cfg.batch_size
        torch.set_rng_state(state["torch_rng"])
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])
        self.c.params_version += 1
        self.params.publish(self.algo.policy_state(), self.c.params_version)
        self._published_at = self.c.gradient_steps
        # actors were started with seeds for step 0: restart them with seeds for this step count
        self._fleet.shutdown()
        self._reserved = 0
        self._start_actors()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fleet.shutdown()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._restore_sigterm()
        for block in (*self._staging, self.params.block, self._ring):
            if block is not None:
                block.close()  # our descriptors; the mappings (and the replay) stay valid
        self._finalizer.detach()


def actor_learner_figures(c: LocalCounters, cfg: Config, lay: Layout, startup_s: float) -> dict:
    """The result.json figures of a schedule with separate actors and a learner (local, ray)."""
    B, wall = cfg.batch_size, c.wall_s
    return {"env_steps": c.env_steps, "gradient_steps": c.gradient_steps, "wall_s": wall,
            "env_steps_per_s": c.env_steps / wall if wall else 0.0,
            "train_samples_per_s": B * c.gradient_steps / c.learner_s if c.learner_s else 0.0,
            "train_samples_per_wall_s": B * c.gradient_steps / wall if wall else 0.0,
            "learner_busy_s": c.learner_s, "acting_s": c.acting_s, "replay_busy_s": c.replay_s,
            "replay_ratio_achieved": c.gradient_steps / c.env_steps if c.env_steps else 0.0,
            "replay_ratio_target": cfg.replay_ratio, "params_version": c.params_version,
            "actors": lay.actors, "envs_per_actor": lay.envs_per_actor, "insert_chunk": lay.chunk,
            "actor_busy_fraction": c.acting_s / (lay.actors * wall) if wall else 0.0,
            "learner_busy_fraction": c.learner_s / wall if wall else 0.0,
            "learner_wait_s": c.learner_wait_s,
            "policy_staleness_mean": c.staleness_sum / c.staleness_steps if c.staleness_steps else 0.0,
            "actor_restarts": c.restarts, "startup_s": startup_s}


def _main_needed(env) -> bool:
    return callable(env) and not isinstance(env, str) and getattr(env, "__module__", None) == "__main__"


@contextlib.contextmanager
def _main_not_reimported(env):
    """Start a child without making it run the parent's script again.

    spawn and forkserver children import the parent's __main__ file so that objects pickled by
    reference to it resolve; a script that trains at import time (no `if __name__ ==
    "__main__":` guard) would then train again in every actor.  Actors need nothing from
    __main__ unless the env factory lives there, so the file is hidden while they start."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or _main_needed(env) or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _sigterm_to_sigint(signum, frame) -> None:
    """SIGTERM stops a run like Ctrl-C: Run.learn's SIGINT handler stops at the end of the phase
    and saves a checkpoint (outside Run.learn, the default SIGINT handler raises KeyboardInterrupt).
    Where SIGINT is ignored (a background job of a shell script), SIGTERM keeps its default
    meaning: terminate."""
    if callable(signal.getsignal(signal.SIGINT)):
        signal.raise_signal(signal.SIGINT)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


def sigterm_as_sigint():
    """Install _sigterm_to_sigint (main thread only); returns the old handler, or None."""
    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, _sigterm_to_sigint)
    return None


class _BatchSource:
    """Draws a group of g batches: (g, {field: (g, B, ...)}, keys, weights (g, B)).

    With `preallocate`, rows are gathered with `np.take(..., out=)` into two fixed buffers used in
    turn (one is being learned on while the other is filled), and the keys and importance
    weights are drawn exactly as ReplayBuffer.sample draws them (same RNG calls, same values).
    Otherwise ReplayBuffer.sample (fresh tensors, any device).
    """

    def __init__(self, replay: ReplayBuffer, spec: dict, batch_size: int, group: int, preallocate: bool):
        self.replay, self.B, self.G = replay, batch_size, group
        self.spec = spec
        self.bufs = None
        if preallocate:
            n = group * batch_size
            self.bufs = [{k: np.empty((n, *s), np.dtype(d)) for k, (s, d) in spec.items()} for _ in range(2)]
            self.tensors = [{k: torch.from_numpy(a) for k, a in buf.items()} for buf in self.bufs]
            self.ones = torch.ones(group, batch_size)
            self.flip = 0

    def draw(self, g: int):
        r, B = self.replay, self.B
        n = g * B
        if self.bufs is None:
            batch, keys, weights = r.sample(n)
            stack = {k: v.view(g, B, *v.shape[1:]) for k, v in batch.items()}
            return g, stack, keys, weights.view(g, B)
        size = len(r)
        if r.tree is None:
            keys = r.rng.integers(0, size, size=n, dtype=np.int64)
            weights = self.ones[:g]
        else:
            keys = r.tree.sample(n, r.rng)
            probs = r.tree.get(keys) / r.tree.total
            w = (size * probs) ** (-r.beta)
            w /= w.max()
            weights = torch.from_numpy(w.astype(np.float32)).view(g, B)
        i = self.flip
        self.flip ^= 1
        buf, ten = self.bufs[i], self.tensors[i]
        for k, arr in r.storage.arrays.items():
            np.take(arr, keys, axis=0, out=buf[k][:n], mode="clip")  # clip: no bounds pass, no temp copy
        stack = {k: t[:n].view(g, B, *t.shape[1:]) for k, t in ten.items()}
        return g, stack, keys, weights
