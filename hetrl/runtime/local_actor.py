"""The actor process of the local schedule (hetrl/runtime/local.py).

Each actor process steps `envs_per_actor` envs with batched inference on its policy snapshot.
It owns a two-half staging area in shared memory (a double buffer).  The learner grants it one
half at a time with a number of env steps to collect (the rate limiter decides when); the actor
fills that half and answers with one small message (which half, how many rows), then works on
the other half if it holds a grant for it, or blocks on its control pipe until it gets one.

Messages, actor -> learner (a pipe):
    ("hello", pid)
    ("chunk", half, rows, env_steps, params_version, episodes, busy_s)
    ("error", exception type name, message, traceback)
learner -> actor (a pipe): (half, env_steps, explore) grants, None = stop.  `explore` holds the
algorithm's exploration parameter (algo.exploration at the global env step count) for each vector
step of the chunk, so the learner's algorithm object decides epsilon / the noise, and actors need
no copy of it.

The actor dies with the learner: PR_SET_PDEATHSIG (Linux) kills it when its parent process
dies, and an end-of-file on the control pipe (the learner's end closed) makes it exit.
Ctrl-C goes to the whole process group: actors ignore SIGINT and leave the stop to the learner.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class ActorArgs:
    index: int
    cfg: Any                 # hetrl.config.Config
    env: Any                 # EnvSpec (an id or a picklable factory)
    obs_space: Any
    act_space: Any
    envs: int                # envs stepped by this actor
    env_seed: int            # envs get env_seed, env_seed + 1, ...
    policy_seed: int
    policy: Any              # the learner's algo.make_policy(seed=policy_seed), pickled
    staging: Any             # SharedArrays with fields "0:<name>", "1:<name>"
    params: Any              # ParamStore
    one_thread: bool
    preallocate: bool


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


class StagingCollector:
    """Steps the actor's envs and writes transitions straight into a staging half.

    `preallocate=True`: n-step = 1 transitions are written into the shared rows in place (no
    per-step arrays, no concatenation); n-step > 1 goes through the actor's NStepAdder and
    copies its rows.  `preallocate=False`: `Actor.collect` (lists + concatenate) and one copy.
    Both give the same transitions (tests/test_local.py checks it).
    """

    def __init__(self, actor, staging, spec: dict, envs: int, preallocate: bool):
        self.actor, self.envs, self.preallocate = actor, envs, preallocate
        self.halves = [{name: staging[f"{h}:{name}"] for name in spec} for h in (0, 1)]
        self.n_step = actor.adder.n
        self.ep_return = np.zeros(envs)
        self.ep_len = np.zeros(envs, dtype=np.int64)
        self.episodes: list[tuple[float, int]] = []

    def collect(self, half: int, n: int, explore) -> int:
        """Collect at least n env steps into `half`; return the number of rows written."""
        if not self.preallocate:
            batch = self.actor.collect(n, explore)
            self.episodes.extend(self.actor.drain_episodes())
            if batch is None:
                return 0
            rows = len(batch["obs"])
            dst = self.halves[half]
            for name, arr in dst.items():
                arr[:rows] = batch[name]
            return rows
        a, dst, E = self.actor, self.halves[half], self.envs
        obs_d, act_d, rew_d, nxt_d = dst["obs"], dst["action"], dst["reward"], dst["next_obs"]
        term_d, trunc_d, steps_d = dst["terminated"], dst["truncated"], dst["steps"]
        row, target = 0, a.env_steps + n
        while a.env_steps < target:
            env_action, stored = a.policy.act(a.obs, explore(a.env_steps))
            obs, reward, terminated, truncated, info = a.venv.step(env_action)
            done = terminated | truncated
            any_done = done.any()
            if self.n_step == 1:
                r = slice(row, row + E)
                obs_d[r] = a.obs
                act_d[r] = stored
                rew_d[r] = reward
                nxt_d[r] = obs
                if any_done:
                    for i in np.flatnonzero(done):
                        nxt_d[row + i] = info["final_obs"][i]
                term_d[r] = terminated
                trunc_d[r] = truncated
                steps_d[r] = 1
                row += E
            else:
                next_obs = obs
                if any_done:
                    next_obs = obs.copy()
                    for i in np.flatnonzero(done):
                        next_obs[i] = info["final_obs"][i]
                b = a.adder.add(a.obs, stored, reward, next_obs, terminated, truncated)
                if b is not None:
                    k = len(b["obs"])
                    for name, arr in dst.items():
                        arr[row:row + k] = b[name]
                    row += k
            self.ep_return += reward
            self.ep_len += 1
            if any_done:
                for i in np.flatnonzero(done):
                    self.episodes.append((float(self.ep_return[i]), int(self.ep_len[i])))
                self.ep_return[done] = 0.0
                self.ep_len[done] = 0
                a.policy.episode_end(done)
            a.obs = obs
            a.env_steps += E
        return row

    def drain(self) -> list[tuple[float, int]]:
        eps, self.episodes = self.episodes, []
        return eps


def actor_main(args: ActorArgs, ctrl, data, lifeline) -> None:
    """Entry point of an actor process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
    import torch

    from hetrl.actors import Actor
    from hetrl.algos import replay_spec

    cfg = args.cfg
    if args.one_thread:
        torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(args.policy_seed)
    # the policy comes from the learner's algorithm object (its make_policy), so acting is the
    # algorithm's own code, and no optimizer is built here
    actor = Actor(args.env, args.envs, args.env_seed, args.policy, cfg.n_step, cfg.gamma)
    spec = replay_spec(args.obs_space, args.act_space)
    collector = StagingCollector(actor, args.staging, spec, args.envs, args.preallocate)
    version = -1
    data.send(("hello", os.getpid()))
    try:
        while True:
            grant = ctrl.recv()
            if grant is None:
                return
            t0 = time.perf_counter()
            half, n, table = grant
            new = args.params.read(version)
            if new is not None:
                actor.load(*new)
                version = new[1]
            start = actor.env_steps
            rows = collector.collect(half, n, _Explore(table, start, args.envs))
            steps = actor.env_steps - start
            busy = time.perf_counter() - t0
            data.send(("chunk", half, rows, steps, version, collector.drain(), busy))
    finally:
        actor.close()


class _Explore:
    """explore(actor env steps) -> the learner's exploration value for that vector step."""

    __slots__ = ("table", "start", "envs")

    def __init__(self, table: list, start: int, envs: int):
        self.table, self.start, self.envs = table, start, envs

    def __call__(self, actor_steps: int):
        return self.table[min((actor_steps - self.start) // self.envs, len(self.table) - 1)]
