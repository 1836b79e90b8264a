"""The actor process of the local schedule (hetrl/runtime/local.py).

Each actor process steps `envs_per_actor` envs with batched inference on its policy snapshot and owns a two-half
staging area in shared memory (a double buffer): it fills the half it was granted, answers with one small
message, then works on the other half if it holds a grant for it, or blocks on its control pipe until it gets one.

Messages, actor -> learner (a pipe):
    ("hello", pid)
    ("chunk", half, rows, env_steps, params_version, episodes, busy_s)
    ("state", Actor.state_dict())            the answer to ("state",)
    ("error", exception type name, message, traceback)
learner -> actor (a pipe): (half, env_steps, explore) grants (`explore`: the learner's exploration value for
each vector step, an ExploreTable's), None = stop; ("state",) asks for the actor's state, ("load", state) restores
one (an exact resume, at a phase boundary).

Ctrl-C and SIGTERM sent to the whole process group (a terminal, `timeout`, a cluster scheduler) reach the actors
too: they ignore both and leave the stop to the learner, which saves the run and stops them (so such an exit is
never taken for a crash).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import traceback


if os.environ.get("HETRL_FORKSERVER_TMP"):  # imported by the forkserver (its preload):
    import atexit
    import shutil

    # it outlives a killed learner by a moment: it removes the socket's temp folder
    atexit.register(shutil.rmtree, os.environ["HETRL_FORKSERVER_TMP"], True)
    # SIGTERM to the process group is the learner's to handle (it stops the actors itself); a forkserver
    # killed by it would make every actor look crashed (exit code 255) and be restarted
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _die_with_parent(lifeline) -> None:
    """Exit when the learner process dies, whatever kills it.

    * PR_SET_PDEATHSIG: the kernel sends SIGKILL when our parent dies (the learner under spawn; the forkserver
      under forkserver, which exits once the learner and its actors are gone);
    * the lifeline: a pipe whose other end only the learner holds; a daemon thread blocks on it and sees
      end-of-file the moment the learner dies, even while we are busy stepping envs (the control pipe only tells
      us when we next ask for a grant)."""
    ppid = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):   # no prctl: the lifeline still stops us
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != ppid:  # the parent died before prctl took effect
        os._exit(0)

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(0)

    threading.Thread(target=watch, name="hetrl-lifeline", daemon=True).start()


def actor_main(spec, staging, params, one_thread: bool, ctrl, data, lifeline) -> None:
    """Entry point of an actor process: it acts as `spec` (an ActorSpec) says, into the two halves of `staging`
    (SharedArrays), with the weights of `params` (a SharedParameterStore)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(lifeline)
    try:
        _run(spec.start(one_thread), staging, params, ctrl, data)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the learner went away: nothing to report to
    except BaseException as e:  # report to the learner, which raises it
        with contextlib.suppress(Exception):
            data.send(("error", type(e).__name__, str(e), traceback.format_exc()))
        os._exit(1)


def _run(actor, staging, params, ctrl, data) -> None:
    # the policy comes from the learner's algorithm object (its make_policy), so acting is the
    # algorithm's own code, and no optimizer is built here
    data.send(("hello", os.getpid()))
    try:
        while True:
            grant = ctrl.recv()
            if grant is None:
                return
            if grant[0] == "state":
                data.send(("state", actor.state_dict()))
                continue
            if grant[0] == "load":
                actor.load_state_dict(grant[1])
                continue
            half, n, table = grant
            rows, steps, busy = actor.take_grant(params, n, table, out=staging[half].arrays)
            data.send(("chunk", half, rows, steps, actor.params_version, actor.drain_episodes(), busy))
    finally:
        actor.close()
