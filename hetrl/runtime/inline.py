"""The inline schedule: every part in one process, alternating, deterministic under a seed.

It is the reference realisation of the training protocol:
    actor --collect--> insert --> replay --sample--> learner --|TD|--> priorities --> replay
    learner --publish--> parameter store --latest--> actor
One *phase* = `train_freq` env steps of acting (on-policy: one rollout), then the gradient steps the learner
core's replay ratio allows (on-policy: the rollout's learner phase).
"""

from __future__ import annotations

import os
import time

from hetrl.actors.envs import EnvSpec
from hetrl.config import Config
from hetrl.runtime.core import LearnerCore, Schedule
from hetrl.runtime.params import InProcessParameterStore


class InlineSchedule(Schedule):
    name = "inline"
    PHASE_S = 0.0                  # one phase() = one _step: collect train_freq env steps, then learn
    stacked = False                # the actor's policy acts for several members (a population's stacked policy)

    def __init__(self, cfg: Config, env: EnvSpec):
        self.cfg, self.env = cfg, env
        self._setup([LearnerCore(cfg, env, threads=cfg.system.threads or os.cpu_count() or 1)])

    def _setup(self, cores: list[LearnerCore]) -> None:
        """The learner cores (a population's: one per member), a replay and a parameter store each, and the actor."""
        self.cores, self.core = cores, cores[0]
        self.replays = [core.make_replay() for core in cores]
        self.stores = [InProcessParameterStore() for _ in cores]
        for core, store in zip(cores, self.stores):
            core.attach(store)
        self.replay, self.params = self.replays[0], self.stores[0]
        self.actor = None
        self._episodes: list[tuple[float, int]] = []
        self._restart_actors()

    def _cores(self) -> list[LearnerCore]:
        return self.cores

    def _restart_actors(self) -> None:
        if self.actor is not None:
            self.actor.close()
        self.actor = self.core.actor_spec(0, self.cfg.num_envs).build()   # (its policy loaded by _step's _refresh)

    def actor_envs(self) -> list[int]:
        return [self.actor.num_envs]

    def actors_state(self) -> dict:
        return self._states([self.actor.state_dict()])

    def _load_actors(self, states: list[dict]) -> None:
        self.actor.load_state_dict(states[0])

    def _refresh(self) -> list[int]:
        """The newest policy into the actor, where newer than its own; the versions its members act with."""
        self.actor.refresh(self.params)
        return [self.actor.params_version]

    # ---- the protocol, one phase ---------------------------------------------------------
    def _step(self) -> None:
        """Collect train_freq env steps of every member (a population's; inline: the one) in one vector env, insert
        each member's into its replay, learn what each member's replay ratio allows."""
        versions, cores, actor, M = self._refresh(), self.cores, self.actor, len(self.cores)
        t0 = time.perf_counter()
        base, start = [core.c.env_steps for core in cores], actor.env_steps
        n, most = self.core.ratio.to_collect()   # every member's run collects what member 0's does

        def explore(steps: int):   # each member's value at its own run's env step (a stacked policy takes them all)
            values = [core.algo.exploration(b + (steps - start) // M) for core, b in zip(cores, base)]
            return values if self.stacked else values[0]

        batch = actor.collect(M * n, explore, limit=M * most)
        t1 = time.perf_counter()
        steps = (actor.env_steps - start) // M
        member = batch.pop("env") // self.core.cfg.num_envs if batch is not None and "env" in batch else None
        for m, core in enumerate(cores):
            t = time.perf_counter()
            part = batch if member is None else {k: v[member == m] for k, v in batch.items()}
            if part is not None and len(part["obs"]):
                core.insert(self.replays[m], part, actor=m)
            core.inserted(steps, versions[m], busy_s=(t1 - t0) / M)
            core.c.replay_s += time.perf_counter() - t
        self._learn()
        self._episodes.extend(actor.drain_episodes())

    def _learn(self) -> None:
        self.core.learn_from(self.replay)

    def done(self) -> bool:
        return self.core.ratio.finished(len(self.replay))

    def _close(self) -> None:
        if self.actor is not None:
            self.actor.close()
        for core in self.cores:
            core.close()
