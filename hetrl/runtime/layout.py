"""How a schedule with actor processes is cut: actors, envs, insert chunks, learner groups.

One module for the runtime and the planner (hetrl/planner/model.py prices the same cuts), so
the planner can never predict a layout the runtime does not run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from hetrl import registry
from hetrl.config import Config
from hetrl.errors import UsageError

GROUP_MAX = 32           # gradient steps per algo.learn call at most (uniform replay, local/ray)
MIN_CHUNK_STEPS = 8      # vector steps per insert message at least (auto chunk)


def chunk_size(train_freq: int, actors: int, envs_per_actor: int, batched_insert: bool = True,
               insert_chunk: int = 0) -> int:
    """Env steps per insert message: the actors together insert about `train_freq` env steps per
    round, MIN_CHUNK_STEPS vector steps at least; a multiple of the actor's vector width."""
    m = envs_per_actor
    if not batched_insert:
        return m
    if insert_chunk:
        return -(-insert_chunk // m) * m
    return max(MIN_CHUNK_STEPS, -(-train_freq // (actors * m))) * m


def group_size(grads_per_phase: int, prioritized: bool, priority_lag: int = 0) -> int:
    """Gradient steps per algo.learn call: uniform replay groups up to GROUP_MAX. Prioritised replay draws a batch only
    once the priorities of all but `priority_lag` earlier batches are written (hetrl/runtime/ratio.py):
    (priority_lag + 1) // 2 batches per call (exact PER: one), so that the group being learned and the next one, drawn
    meanwhile by a prefetch thread, both fit the lag; the same under every schedule."""
    if not prioritized:
        return max(1, min(GROUP_MAX, grads_per_phase))
    return max(1, min(GROUP_MAX, grads_per_phase, (priority_lag + 1) // 2))


def prefetch_fits(group: int, prioritized: bool, priority_lag: int) -> bool:
    """Whether a learner loop may draw its next group while this one is learned: always with uniform
    replay; with prioritised replay only where the lag leaves room for a batch beyond the group whose
    priorities are not written yet (never with exact PER)."""
    return not prioritized or priority_lag >= group


def grads_per_phase(cfg: Config) -> int:
    return cfg.gradient_steps if cfg.gradient_steps > 0 else cfg.train_freq


def learns_rollouts(cfg: Config) -> bool:
    """Whether cfg.algo is on-policy: it learns from rollouts (a rollout storage in place of the replay)."""
    return getattr(registry.get(cfg.algo), "storage", "replay") == "rollout"


@dataclass(frozen=True)
class Layout:
    """The numbers derived from a Config for a schedule with actor processes."""

    actors: int
    envs_per_actor: int
    chunk: int                     # env steps per grant / insert message
    group: int                     # gradient steps per algo.learn call at most
    spi: float                     # samples (transitions) per insert (env step)
    min_size: int                  # env steps inserted before the first sample
    error_buffer: float            # Reverb error_buffer in samples (tolerance x SPI)
    learner_threads: int
    publish_every: int             # gradient steps between parameter publications
    max_lag: int = 0               # gradient steps the learner may lead the oldest policy acting (0: no bound)


def default_actors(cores: int) -> int:
    return max(1, min(4, cores - 1))


def layout(cfg: Config, cores: int | None = None, group: int | None = None) -> Layout:
    """`cores`: the CPUs actors and learner share (default: this machine's; the ray schedule
    passes its cluster's). `group`: gradient steps per learn call if not group_size()'s."""
    cores = cores or os.cpu_count() or 1
    # never more envs than the preset's: by default the largest actor count that splits num_envs evenly
    n = cfg.system.actors or max(d for d in range(1, min(default_actors(cores), cfg.num_envs) + 1)
                                 if cfg.num_envs % d == 0)
    m = cfg.system.envs_per_actor or max(1, cfg.num_envs // n)
    threads = cfg.system.threads or max(1, cores - n)
    per_phase = grads_per_phase(cfg)
    if learns_rollouts(cfg):   # on-policy: each actor collects its envs' share of every rollout, then waits
        if n * m != cfg.num_envs:
            raise UsageError(f"an on-policy rollout is n_steps x num_envs transitions, and every actor collects its "
                             f"share: actors x envs_per_actor ({n} x {m}) must equal num_envs ({cfg.num_envs}); "
                             "choose actors that divide num_envs")
        group = group or max(1, min(per_phase, GROUP_MAX))
        return Layout(n, m, cfg.train_freq // n, group, cfg.replay_ratio * cfg.batch_size, 0,
                      float(cfg.train_freq), threads, per_phase, 0)
    chunk = chunk_size(cfg.train_freq, n, m, cfg.system.batched_insert, cfg.system.insert_chunk)
    group = group or group_size(per_phase, cfg.prioritized, cfg.priority_lag)
    spi = cfg.replay_ratio * cfg.batch_size
    min_size = max(cfg.learning_starts, cfg.batch_size)
    need = cfg.batch_size + chunk * spi  # the window must hold one batch plus one chunk, or both sides block
    if cfg.system.rate_tolerance:
        b = cfg.system.rate_tolerance * spi
        if 2 * b < need:
            raise UsageError(f"rate_tolerance={cfg.system.rate_tolerance} env steps is too small for chunks of {chunk} "
                             f"env steps and batches of {cfg.batch_size}: both sides could block; use at least "
                             f"{math.ceil(need / (2 * spi))}")
    else:  # every actor may hold one chunk in flight while the learner draws a full group
        b = spi * n * chunk + group * cfg.batch_size
    b = max(b, 1.0, spi, cfg.batch_size)
    publish_every = max(1, cfg.system.publish_interval * per_phase)
    return Layout(n, m, chunk, group, spi, min_size, b, threads, publish_every,
                  max_policy_lag(cfg, chunk, group, publish_every))


def max_policy_lag(cfg: Config, chunk: int, group: int, publish_every: int) -> int:
    """The bound on policy lag, in gradient steps: how far the learner may run ahead of the parameters the oldest chunk
    still being collected was granted with. The learner must be able to reach the next publication with one group in
    hand (publish_every + group), or it would wait for every chunk in turn. Auto: that, plus the gradient steps two
    chunks of one actor earn under the replay ratio (one actor's double buffer, the lag of the smallest overlapped
    layout): more actors, or a larger cluster, are throttled to the lag one actor would give instead of adding to it."""
    least = publish_every + group
    if cfg.system.max_policy_lag:
        if cfg.system.max_policy_lag < least:
            raise UsageError(f"max_policy_lag={cfg.system.max_policy_lag} gradient steps is below one publication and "
                             f"one learner group ({publish_every} + {group}): the learner would wait for every "
                             f"chunk; use at least {least}, or 0 (auto)")
        return cfg.system.max_policy_lag
    return least + 2 * math.ceil(chunk * cfg.replay_ratio)

