"""The actor process of the local schedule (hetrl/runtime/local.py).

Each actor process steps `envs_per_actor` envs with batched inference on its policy snapshot and owns a two-half
staging area in shared memory (a double buffer): it fills the half it was granted, answers with one small
message, then works on the other half if it holds a grant for it, or blocks on its control pipe until it gets one.

Messages, actor -> learner (a pipe):
    ("hello", pid)
    ("chunk", half, rows, env_steps, params_version, episodes, busy_s)
    ("state", Actor.state_dict())            the answer to ("state",)
    ("error", exception type name, message, traceback)
learner -> actor (a pipe): (half, env_steps, explore) grants, None = stop; ("state",) asks for the
actor's state, ("load", state) restores one (an exact resume, at a phase boundary).  `explore` holds the
algorithm's exploration value (algo.exploration at the global env step count) for each vector step of the
chunk, so the learner's algorithm object decides epsilon / the noise, and actors need no copy of it.

The actor dies with the learner (PR_SET_PDEATHSIG, and end-of-file on its pipes). Ctrl-C and SIGTERM sent to the
whole process group (a terminal, `timeout`, a cluster scheduler) reach the actors too: they ignore both and leave
the stop to the learner, which saves the run and stops them (so such an exit is never taken for a crash).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Any


if os.environ.get("HETRL_FORKSERVER_TMP"):  # imported by the forkserver (its preload):
    import atexit
    import shutil

    # it outlives a killed learner by a moment: it removes the socket's temp folder
    atexit.register(shutil.rmtree, os.environ["HETRL_FORKSERVER_TMP"], True)
    # SIGTERM to the process group is the learner's to handle (it stops the actors itself); a forkserver
    # killed by it would make every actor look crashed (exit code 255) and be restarted
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@dataclass
class ActorArgs:
    index: int
    spec: Any                # hetrl.actors.ActorSpec (env, seeds, policy, n-step, backend)
    staging: Any             # SharedArrays with fields "0:<name>", "1:<name>"
    params: Any              # SharedParameterStore
    one_thread: bool


def _die_with_parent(lifeline) -> None:
    """Exit when the learner process dies, whatever kills it.

    * PR_SET_PDEATHSIG: the kernel sends SIGKILL when our parent dies (the learner under
      spawn; the forkserver under forkserver, which exits once the learner and its actors
      are gone);
    * the lifeline: a pipe whose other end only the learner holds; a daemon thread blocks on
      it and sees end-of-file the moment the learner dies, even while we are busy stepping
      envs (the control pipe only tells us when we next ask for a grant).
    """
    ppid = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # pragma: no cover - no prctl: the lifeline still stops us
            pass
    if os.getppid() != ppid:  # the parent died before prctl took effect
        os._exit(0)

    def watch() -> None:
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        os._exit(0)

    import threading

    threading.Thread(target=watch, name="hetrl-lifeline", daemon=True).start()


def actor_main(args: ActorArgs, ctrl, data, lifeline) -> None:
    """Entry point of an actor process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(lifeline)
    try:
        _run(args, ctrl, data)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the learner went away: nothing to report to
    except BaseException as e:  # report to the learner, which raises it
        try:
            data.send(("error", type(e).__name__, str(e), traceback.format_exc()))
        except Exception:
            pass
        os._exit(1)


def _run(args: ActorArgs, ctrl, data) -> None:
    # the policy comes from the learner's algorithm object (its make_policy), so acting is the
    # algorithm's own code, and no optimizer is built here
    actor = args.spec.start(args.one_thread)
    halves = [{k[2:]: v for k, v in args.staging.arrays.items() if k.startswith(f"{h}:")} for h in (0, 1)]
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
            rows, steps, busy = actor.take_grant(args.params, n, table, out=halves[half])
            data.send(("chunk", half, rows, steps, actor.params_version, actor.drain_episodes(), busy))
    finally:
        actor.close()
