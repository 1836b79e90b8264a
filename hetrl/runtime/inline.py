"""The inline schedule: every part in one process, alternating, deterministic under a seed.

It is the reference realisation of the training protocol:
    actor --collect--> insert --> replay --sample--> learner --|TD|--> priorities --> replay
    learner --publish--> parameter store --latest--> actor
One *phase* = `train_freq` env steps of acting, then replay_ratio x that many gradient steps.
The learner, counters, checkpoint and figures are the learner core's (hetrl/runtime/core.py).
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
        self.core = LearnerCore(cfg, env, threads=cfg.threads or os.cpu_count() or 1)
        self.replay = self.core.make_replay()
        self.params = InProcessParameterStore()
        self.core.attach(self.params)
        self.actor = None
        self._episodes: list[tuple[float, int]] = []
        self._restart_actors()

    def _restart_actors(self) -> None:
        if self.actor is not None:
            self.actor.close()
        self.actor = self.core.actor_spec(0, self.cfg.num_envs).build()
        self.actor.load(*self.params.latest(-1))

    # ---- the protocol, one phase ---------------------------------------------------------
    def _step(self) -> None:
        cfg, core, c = self.cfg, self.core, self.c
        t0 = time.perf_counter()
        before = self.actor.env_steps
        left = cfg.steps - c.env_steps
        batch = self.actor.collect(min(cfg.train_freq, left), lambda s: core.algo.exploration(c.env_steps + s - before),
                                   limit=left)
        t1 = time.perf_counter()
        if batch is not None:
            core.insert(self.replay, batch)
        steps = self.actor.env_steps - before
        core.inserted(steps, self.actor.params_version, busy_s=t1 - t0)
        c.replay_s += time.perf_counter() - t1
        if c.env_steps >= cfg.learning_starts and len(self.replay) >= cfg.batch_size:
            c.grad_debt += steps * (cfg.replay_ratio if cfg.gradient_steps > 0 else 1.0)
            n = int(c.grad_debt)
            c.grad_debt -= n
            if n:
                self.learn(n)
        new = self.params.latest(self.actor.params_version)
        if new is not None:
            self.actor.load(*new)
        self._episodes.extend(self.actor.drain_episodes())

    def learn(self, n: int) -> None:
        """n gradient steps. Uniform replay: all n batches in one gather (the buffer does not change
        during a phase, so this is the same distribution). Prioritised: sample -> learn -> update
        priorities one batch at a time, so every sample sees the newest priorities."""
        cfg, core, c, B = self.cfg, self.core, self.c, self.cfg.batch_size
        for k in ([n] if not cfg.prioritized else [1] * n):
            t0 = time.perf_counter()
            batch, keys, weights = self.replay.sample(k * B, beta=core.beta())
            stack = {name: v.view(k, B, *v.shape[1:]) for name, v in batch.items()}
            t1 = time.perf_counter()
            td = core.learn(stack, weights.view(k, B))
            t2 = time.perf_counter()
            if cfg.prioritized:
                self.replay.update_priorities(keys, td.view(-1))
            c.replay_s += (t1 - t0) + (time.perf_counter() - t2)

    def done(self) -> bool:
        return self.c.env_steps >= self.cfg.steps

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.actor is not None:
            self.actor.close()
        self.core.close()
