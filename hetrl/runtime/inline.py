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
        self.actor = self.core.actor_spec(0, self.cfg.num_envs).build()
        self.actor.load(*self.params.latest(-1))

    def actor_envs(self) -> list[int]:
        return [self.actor.num_envs]

    def actors_state(self) -> dict:
        return self._states([self.actor.state_dict()])

    def _load_actors(self, states: list[dict]) -> None:
        self.actor.load_state_dict(states[0])

    # ---- the protocol, one phase ---------------------------------------------------------
    def _step(self) -> None:
        core, c = self.core, self.c
        self.actor.refresh(self.params)   # the newest policy (a phase's, or one loaded between)
        t0 = time.perf_counter()
        before = self.actor.env_steps
        n, most = core.ratio.to_collect()
        batch = self.actor.collect(n, lambda s: core.algo.exploration(c.env_steps + s - before), limit=most)
        t1 = time.perf_counter()
        if batch is not None:
            core.insert(self.replay, batch)
        steps = self.actor.env_steps - before
        core.inserted(steps, self.actor.params_version, busy_s=t1 - t0)
        c.replay_s += time.perf_counter() - t1
        core.learn_from(self.replay)
        self._episodes.extend(self.actor.drain_episodes())

    def done(self) -> bool:
        return self.core.ratio.finished(len(self.replay))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.actor is not None:
            self.actor.close()
        for core in self.cores:
            core.close()
