"""The local schedule's transport: actor processes, data in shared memory, a rate-limited learner.

    hetrl train dqn --env CartPole-v1 --schedule local [--actors N] [--envs-per-actor M]

* N actor processes (local_actor.py) step M envs each and fill one half of a two-half staging area in shared
  memory per grant (a chunk of env steps), answered with one small message.
* This process is the learner core and the replay manager: it copies each staged chunk into the shared-memory
  ring with one batched insert, samples (a prefetch thread draws the next group while the learner learns), and
  writes priorities into the one tree the sampler reads.
* Parameters reach the actors through a seqlock in shared memory (shm.SharedParameterStore).
* The learner core's replay ratio decides when an actor gets a grant and how many batches the learner may draw;
  this transport only moves them, and the waiting side blocks on a pipe. Nobody spins.

Life cycle: actors come from a preloaded forkserver (a fork, no imports); a dead actor is replaced (the core's
restart policy); an actor's error is raised here with its traceback; if this process is killed, the actors exit
too (lifeline pipe, PR_SET_PDEATHSIG) and the nameless shared memory is freed. docs/local.md has the details.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import sys
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

from hetrl import registry
from hetrl.actors.envs import EnvSpec, env_name
from hetrl.config import Config
from hetrl.errors import HetrlError, UsageError
from hetrl.replay import BatchGroups
from hetrl.runtime.core import ActorsSchedule, LearnerCore, Slot
from hetrl.runtime.layout import layout
from hetrl.runtime.local_actor import actor_main
from hetrl.runtime.shm import SharedArrays, SharedParameterStore

START_TIMEOUT_S = 120.0  # for all actors to report ready (a cold forkserver imports torch)
# what every actor imports; actors get their policy pickled from the learner and build no
# optimizer (torch.optim's first optimizer imports torch._dynamo: 1-3 s of CPU per process)
PRELOAD = ["hetrl.runtime.local_actor", "hetrl.actors", "gymnasium"]


def _context(warm: bool = False, preload: tuple[str, ...] = ()):
    """The multiprocessing context for actors: forkserver (preloaded: a new actor is a fork, it imports nothing) where
    available, else spawn.  `warm` starts the forkserver now, so its imports run while this process builds the learner;
    `preload`: more modules it imports (the algorithm's, whose acting policy the actors unpickle)."""
    method = os.environ.get("HETRL_START_METHOD", "forkserver")
    if method not in mp.get_all_start_methods():
        method = "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([*PRELOAD, *preload])
        if warm:
            from multiprocessing import forkserver, util

            # the forkserver's socket is in multiprocessing's temp folder (pymp-*), which this process
            # removes at exit; if it is killed outright, the forkserver removes it (local_actor.py)
            os.environ["HETRL_FORKSERVER_TMP"] = util.get_temp_dir()
            try:
                forkserver.ensure_running()
            finally:
                os.environ.pop("HETRL_FORKSERVER_TMP", None)
    return ctx


class _Handle(Slot):
    """The learner's view of one actor process: its grants in flight are its staging halves, (index, half)."""

    ready = stopping = False
    proc = ctrl = data = lifeline = None
    state: dict | None = None          # its answer to ("state",)

    def close_pipes(self) -> None:
        for conn in (self.ctrl, self.data, self.lifeline):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self.ctrl = self.data = self.lifeline = None


def _shutdown(handles: list[_Handle], timeout: float = 2.0) -> None:
    """Ask every actor process to stop, then kill what is still alive after `timeout` seconds (by close(), the
    garbage collector or at exit)."""
    for h in handles:
        h.stopping = True
        if h.ctrl is not None:
            with contextlib.suppress(OSError, ValueError):
                h.ctrl.send(None)
    deadline = time.monotonic() + timeout
    for h in handles:
        if h.proc is not None:
            h.proc.join(max(0.0, deadline - time.monotonic()))
            if h.proc.is_alive():
                h.proc.kill()
                h.proc.join(1.0)
            h.proc = None
        h.close_pipes()


class LocalSchedule(ActorsSchedule):
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
        if not cfg.system.overlap and not cfg.system.rate_limit:
            raise UsageError("overlap=false (lockstep) learns what the rate limiter allows between collect rounds; "
                             "keep rate_limit=true")
        self.lay = lay = layout(cfg)
        _context(warm=True, preload=(registry.get(cfg.algo).__module__,))
        self.core = core = LearnerCore(cfg, env, lay.learner_threads, lay)
        spec, on_cpu = core.spec, core.device.type == "cpu"
        # the storage's arrays (one per field, or the frame storage's frame ring) in shared memory
        self._ring = SharedArrays(core.storage_arrays) if on_cpu or core.frames else None
        self.replay = core.make_replay(buffers=None if self._ring is None else self._ring.arrays)
        self.params = SharedParameterStore(core.algo.policy_state())
        core.attach(self.params)
        rows = lay.chunk + cfg.n_step * lay.envs_per_actor
        self._staging = [[SharedArrays({k: ((rows, *s), d) for k, (s, d) in spec.items()}) for _half in (0, 1)]
                         for _ in range(lay.actors)]
        # sampled groups of batches (an on-policy rollout is learned in the learner core's phase instead)
        self._batches = None if core.rollout else BatchGroups(self.replay, spec, cfg.batch_size, lay.group,
                                                              preallocate=cfg.system.preallocate and on_cpu)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hetrl-prefetch") \
            if cfg.system.prefetch and not core.rollout else None
        self._drawn = None         # a group drawn and not learned yet: (group, seconds), or a Future while prefetched
        self._episodes: list[tuple[float, int]] = []
        self.trace: list[tuple[int, int]] | None = None  # (inserts, samples) after each change, when a list
        self.slots: list[_Handle] = []
        self._finalizer = weakref.finalize(self, _shutdown, self.slots)
        self._start_actors()

    # ---- actors ------------------------------------------------------------------------------
    def _wait_for(self, ready) -> bool:
        """Handle messages until ready() (False after START_TIMEOUT_S); the wait is not the learner's."""
        waited, deadline = self.c.learner_wait_s, time.monotonic() + START_TIMEOUT_S
        while not ready() and time.monotonic() < deadline and not self._closed:
            self._poll(1.0)
        self.c.learner_wait_s = waited
        return ready()

    def _start_actors(self) -> None:
        t0 = time.perf_counter()
        self.slots[:] = [_Handle(i) for i in range(self.lay.actors)]
        for h in self.slots:
            self._spawn(h)
        if not self._wait_for(lambda: all(h.ready for h in self.slots)):
            self.close()
            raise HetrlError(f"actor processes did not start within {START_TIMEOUT_S:.0f} s")
        self.startup_s = time.perf_counter() - t0

    def _ask_states(self) -> dict:
        """A message on each actor's control pipe."""
        for h in self.slots:
            h.state = None
            h.ctrl.send(("state",))
        if not self._wait_for(lambda: all(h.state is not None for h in self.slots)):
            return {"unsaved": "an actor did not send its state"}
        return self._states([h.state for h in self.slots])

    def _load_actors(self, states: list) -> None:
        for h, state in zip(self.slots, states):   # before its next grant, on the same pipe
            h.ctrl.send(("load", state))

    def _spawn(self, h: _Handle) -> None:
        ctx = _context()
        (ctrl_r, ctrl_w), (data_r, data_w), (life_r, life_w) = (ctx.Pipe(duplex=False) for _ in range(3))
        spec = self.core.actor_spec(h.index, self.lay.envs_per_actor)
        proc = ctx.Process(target=actor_main, args=(spec, self._staging[h.index], self.params,
                                                    self.cfg.system.actor_one_thread, ctrl_r, data_w, life_r),
                           daemon=True, name=f"hetrl-actor-{h.index}")
        try:
            with _main_not_reimported(self.env, self.core.algo):
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
        return [h.proc.pid for h in self.slots if h.proc is not None and h.proc.is_alive()]

    # ---- the learner's loop ---------------------------------------------------------------------
    def _grant_one(self, h: _Handle) -> bool | None:
        """Actor h's next chunk, to collect into its free staging half: None when the core grants none now,
        False when h cannot take one (stopping, or it died meanwhile: its sentinel tells _poll)."""
        if h.ctrl is None or h.stopping:
            return False
        grant = self.core.next_grant(self.lay.envs_per_actor)
        if grant is None:
            return None
        half = 1 if (h.index, 0) in h.outstanding else 0
        try:
            h.ctrl.send((half, *grant))
        except OSError:
            return False
        h.outstanding[h.index, half] = grant[0]
        self.core.granted((h.index, half), grant[0])
        return True

    # learning -----------------------------------------------------------------------------------------
    def _gather(self, g: int) -> tuple:
        t0 = time.perf_counter()
        return self._batches.draw(g), time.perf_counter() - t0

    def _draw(self, g: int) -> None:
        """Draw g batches, in the background if prefetching."""
        self._record()
        if self.cfg.prioritized:
            self.replay.set_beta(self.core.beta())
        self._drawn = self._pool.submit(self._gather, g) if self._pool is not None else self._gather(g)

    def _join_prefetch(self) -> None:
        if isinstance(self._drawn, Future):
            self._drawn = self._drawn.result()

    def _drawing(self) -> bool:
        return self._drawn is not None

    def _receive(self) -> tuple:
        self._join_prefetch()
        ((stack, keys, weights), dt), self._drawn = self._drawn, None
        self.c.replay_s += dt
        return stack, keys, weights, None

    def _learned(self, shard, keys, td) -> None:
        self._join_prefetch()  # the replay changes only after the prefetch is done with it
        if self.cfg.prioritized:
            t0 = time.perf_counter()
            self.replay.update_priorities(keys, td.reshape(-1))
            self.c.replay_s += time.perf_counter() - t0

    # messages -----------------------------------------------------------------------------------------
    def _poll(self, timeout: float) -> None:
        """Handle every message and exit that is ready; wait up to `timeout` for the first."""
        waitables = {w: h for h in self.slots if h.proc is not None for w in (h.data, h.proc.sentinel)}
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
        with contextlib.suppress(EOFError, OSError):   # (it exited: its sentinel follows)
            while h.data.poll():
                self._handle(h, h.data.recv())

    def _handle(self, h: _Handle, msg) -> None:
        kind = msg[0]
        if kind == "chunk":
            _, half, rows, steps, version, episodes, busy = msg
            if self.core.ratio.phased:   # in from its staging half at the phase boundary, in actor order
                h.chunk = (half, rows, steps, version, busy)
                h.outstanding.pop((h.index, half), None)
            else:
                self._insert(h, half, rows, steps, version, busy)
            self._episodes.extend(episodes)
        elif kind == "hello":
            h.ready = True
        elif kind == "state":
            h.state = msg[1]
        elif kind == "error":
            _, typ, text, tb = msg
            self.close()
            if typ == "UsageError":
                raise UsageError(text)
            raise HetrlError(f"actor {h.index} failed: {typ}: {text}\n--- the actor's traceback ---\n{tb.rstrip()}")

    def _insert(self, h: _Handle, half: int, rows: int, steps: int, version: int, busy: float) -> None:
        t0 = time.perf_counter()
        if rows:
            view = self._staging[h.index][half].arrays
            self.core.insert(self.replay, {k: v[:rows] for k, v in view.items()}, h.index)
        h.outstanding.pop((h.index, half), None)
        self.core.returned((h.index, half))
        self.core.inserted(steps, version, busy)
        self.c.replay_s += time.perf_counter() - t0
        self._record()

    def _on_exit(self, h: _Handle) -> None:
        self._read(h)  # chunks it finished before it died are good data
        proc, h.proc = h.proc, None
        proc.join(0.1)
        code = proc.exitcode
        h.close_pipes()
        if h.stopping or self._closed:
            for key in h.outstanding:
                self.core.returned(key)
            h.outstanding = {}
            return
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        hint = (" (an env factory or algorithm from your script makes actors import the script: keep the training "
                "code under `if __name__ == '__main__':`)" if not h.ready and _main_needed(self.env, self.core.algo)
                else "")
        self._replace(h, f"actor {h.index} (pid {proc.pid}) {how}", starting=not h.ready, hint=hint)

    def _record(self) -> None:
        if self.trace is not None:
            self.trace.append((self.c.env_steps, self.c.samples))

    def _stop_actors(self) -> None:
        _shutdown(self.slots)

    # ---- figures ----------------------------------------------------------------------------------
    def transport_figures(self) -> dict:
        return {**super().transport_figures(), "optimisations": {k: self.cfg.get(k) for k in
                                  ("overlap", "batched_insert", "prefetch", "actor_one_thread", "preallocate")}}

    def _close(self) -> None:
        _shutdown(self.slots)
        self.core.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for block in (*(b for halves in self._staging for b in halves), self.params.block, self._ring):
            if block is not None:
                block.close()  # our descriptors; the mappings (and the replay) stay valid
        self._finalizer.detach()


def _main_needed(env, algo=None) -> bool:
    """Whether actors must import the parent's __main__: the env factory or the algorithm (its acting policy)
    is defined there."""
    in_main = callable(env) and not isinstance(env, str) and getattr(env, "__module__", None) == "__main__"
    return in_main or type(algo).__module__ == "__main__"


@contextlib.contextmanager
def _main_not_reimported(env, algo=None):
    """Start a child without making it run the parent's script again.

    spawn and forkserver children import the parent's __main__ file so that objects pickled by
    reference to it resolve; a script that trains at import time (no `if __name__ ==
    "__main__":` guard) would then train again in every actor.  Actors need nothing from
    __main__ unless the env factory or the algorithm lives there, so the file is hidden while they start."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or _main_needed(env, algo) or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path
