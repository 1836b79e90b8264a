"""The replay-ratio policy, written once: when actors may collect, and how many gradient steps the learner may take now.

The learner core owns one (``core.ratio``); every schedule asks it and only moves what it answers. It decides
from the core's counters (env steps inserted, granted and not yet in, transitions drawn) and:

* the preset's replay ratio over the whole run: by env step E the learner owes
  ``(E - min_size) x replay_ratio`` gradient steps, ``min_size = max(learning_starts, batch_size)``,
  so a run has the same number of gradient steps under every schedule, whichever side was faster;
* Reverb's sample-to-insert rule (:class:`~hetrl.replay.rate_limiter.RatioRule`) where acting and learning
  overlap (the ray schedule's replay servers apply its sample side per shard: :meth:`ReplayRatio.server_rule`);
* the policy-lag bound (``max_policy_lag``, :meth:`LearnerCore.lag_room`) and the priority lag (``priority_lag``:
  a batch is drawn only once the priorities of all but that many earlier batches are written; 0: exact PER, each
  batch sampled from a tree that holds every earlier batch's |TD|), under every schedule.

An on-policy algorithm has :class:`RolloutRatio` instead, with the same interface.
"""

from __future__ import annotations

import math

from hetrl.replay.rate_limiter import RatioRule
from hetrl.runtime.layout import grads_per_phase, group_size

UNBOUNDED = 1 << 62


class ReplayRatio:
    """The ratio of one run, over the counters of its learner core (:meth:`of`)."""

    def __init__(self, core, *, spi: float, min_size: int, group: int | None = None, chunk: int = 0,
                 error_buffer: float | None = None, rate_limit: bool = True, overlap: bool = False,
                 servers: int = 0, phased: bool = False):
        cfg = core.cfg
        self.core, self.B = core, cfg.batch_size
        self.spi, self.min_size = float(spi), int(min_size)
        self.group = group or UNBOUNDED          # batches per learner call at most
        self.chunk = chunk                       # env steps per grant
        self.rate_limit, self.overlap, self.servers = rate_limit, overlap, servers
        self.phased = phased                     # grants and inserts at phase boundaries only
        self.error_buffer = error_buffer
        self.rule = None if error_buffer is None else RatioRule.from_error_buffer(spi, min_size, error_buffer)
        self.prioritized, self.priority_lag = bool(cfg.prioritized), int(cfg.priority_lag)
        self.unwritten = 0                       # batches drawn whose priorities are not written yet
        self.lag_max = 0                         # the most such batches any batch was drawn behind

    @property
    def steps(self) -> int:
        """The run's env steps (read live: Run.extend raises them)."""
        return self.core.cfg.steps

    @classmethod
    def of(cls, core, lay=None, phased: bool = False, servers: int = 0) -> "ReplayRatio":
        """The ratio of `core`'s run. Alternating (`lay` None: one process that acts, then learns all it owes, the
        inline schedule): no lead, no window; uniform replay in one group, prioritised in the groups every schedule
        draws (layout.group_size). Phased (a reproducible run cut by layout `lay`; ActorsSchedule): between boundaries
        the learner draws, from the replay as it stood at the boundary, what the ratio owes for the env steps in (as
        inline: no lead), while the actors collect. Else overlapped: actors and learner at the same time, under the
        rule; `servers`: replay servers that sample under their own copy of it (ray), 0 when the learner samples."""
        cfg = core.cfg
        if lay is None:
            group = group_size(grads_per_phase(cfg), True, cfg.priority_lag) if cfg.prioritized else None
            return cls(core, spi=cfg.replay_ratio * cfg.batch_size, min_size=max(cfg.learning_starts, cfg.batch_size),
                       group=group)
        if phased:
            return cls(core, spi=lay.spi, min_size=lay.min_size, group=lay.group, chunk=lay.chunk, phased=True)
        error_buffer = lay.error_buffer
        if servers:   # remote actors: the window must hold every actor's chunk plus one group, or both sides wait
            error_buffer = max(error_buffer, lay.spi * lay.actors * lay.chunk + lay.group * cfg.batch_size)
        return cls(core, spi=lay.spi, min_size=lay.min_size, group=lay.group, chunk=lay.chunk,
                   error_buffer=error_buffer, rate_limit=cfg.system.rate_limit, overlap=cfg.system.overlap,
                   servers=servers)

    # ---- the insert side -------------------------------------------------------------------------
    def to_collect(self) -> tuple[int, int]:
        """(env steps to collect, the most to collect) in the next round of an alternating schedule (inline): a
        phase's train_freq, never past the run's end."""
        left = self.steps - self.core.c.env_steps
        return min(self.core.cfg.train_freq, left), left

    def grant(self) -> int:
        """Env steps an actor may be granted now: a chunk (whole vector steps), or exactly what the run
        still needs; 0 when it needs none or the rate limiter holds the actors. Applied when a chunk is
        granted, so that a granted chunk is never held on its way in: the learner may wait for the oldest
        chunk in flight (max_policy_lag), and were that chunk held until the learner samples, both would."""
        c, reserved = self.core.c, self.core.reserved
        n = max(0, min(self.chunk, self.steps - c.env_steps - reserved))
        if n and self.rate_limit and self.rule is not None \
                and not self.rule.can_insert(c.env_steps + reserved, c.samples, n):
            return 0
        return n

    # ---- the sample side -------------------------------------------------------------------------
    def _batches(self, transitions: float) -> int:
        return math.floor(transitions / self.B + 1e-9)

    def owed(self) -> int:
        """Batches the learner may still draw in this run (the preset's ratio over the whole run)."""
        c = self.core.c
        return self._batches(max(self.steps, c.env_steps) * self.spi - self.spi * self.min_size - c.samples)

    def allowed(self, replay_size: int | None = None) -> int:
        """Batches the learner may draw now (0: none). `replay_size`: transitions in the replay, None
        where the replay servers check it themselves."""
        c, B = self.core.c, self.B
        E = c.env_steps
        if E < self.min_size or (replay_size is not None and replay_size < B):
            return 0
        g = self.group
        if self.prioritized:
            g = min(g, self.priority_lag + 1 - self.unwritten)
        g = min(g, self.core.lag_room(c.samples // B))
        if not self.rate_limit:   # no ratio to honour: learn while env steps come in
            return max(0, g) if E < self.steps else 0
        if not self.overlap and self.core.reserved and not self.phased:
            return 0              # lockstep: the learner learns between collect rounds, as inline does
        g = min(g, self.owed())
        if not self.servers:
            # Reverb lets the sampler lead by the error buffer; alternating, and once every env step is
            # in, the learner only catches up (no lead)
            lead = self.rule.min_diff if self.overlap and E < self.steps else self.spi * self.min_size
            g = min(g, self._batches(E * self.spi - c.samples - lead))
        return max(0, g)

    def drawn(self, g: int) -> None:
        """g batches were drawn (or asked for) and count as sampled."""
        self.core.c.samples += g * self.B
        if self.prioritized:
            self.lag_max = max(self.lag_max, self.unwritten + g - 1)
            self.unwritten += g

    def undrawn(self, g: int) -> None:
        """g batches asked for did not come (a replay server's rate limiter held them)."""
        self.core.c.samples -= g * self.B
        if self.prioritized:
            self.unwritten -= g

    def written(self, g: int) -> None:
        """The priorities of g drawn batches are written: in the tree, or sent ahead of any later draw."""
        if self.prioritized:
            self.unwritten -= g

    def finished(self, replay_size: int | None = None) -> bool:
        """Whether the learner is done: every env step is in and it drew what the run owes (without a
        rate limit: as soon as every env step is in)."""
        c = self.core.c
        if c.env_steps < self.steps:
            return False
        if not self.rate_limit or c.env_steps < self.min_size or (replay_size is not None and replay_size < self.B):
            return True
        return self.owed() < 1

    # ---- replay servers (ray) --------------------------------------------------------------------
    def server_rule(self, shards: int) -> dict:
        """The rate limiter settings of each of `shards` replay servers: the sample side of the rule over
        the shard's share of the inserts and samples. The insert side is applied at the grant (grant()),
        so the servers never hold an insert of this run's actors: their window is open upwards."""
        if self.phased:   # the learner asks for what the ratio owes, of the replay as it stood at the boundary
            return {"samples_per_insert": self.spi, "min_size": 1,
                    "error_buffer": max(1.0, self.spi), "rate_limit": False}
        min_size = max(1, -(-self.min_size // shards))
        eb = max(self.error_buffer / shards, 2 * max(1.0, self.spi))
        return {"samples_per_insert": self.spi, "min_size": min_size,
                "error_buffer": (self.spi * min_size - eb, float("inf")), "rate_limit": self.rate_limit}

    def figures(self) -> dict:
        return {"rate_limit": self.rate_limit, "phased": self.phased, "samples_per_insert": self.spi,
                "rate_error_buffer": self.error_buffer, "priority_lag": self.priority_lag if self.prioritized else None,
                "priority_lag_max": self.lag_max if self.prioritized else None}


class RolloutRatio(ReplayRatio):
    """The on-policy rule, with ReplayRatio's interface: actors collect whole rollouts (cfg.train_freq = n_steps x
    num_envs env steps), a rollout is learned (one learner phase) as soon as it is in, and the actors get the next only
    then, so they always act with the newest policy (no policy lag) under every schedule. A run collects whole rollouts
    until it has its env steps, as SB3's `learn` does: the last one may pass cfg.steps by up to a rollout less one
    vector step. `chunk`: env steps per grant (one actor's share of a rollout: n_steps x its envs)."""

    def __init__(self, core, chunk: int | None = None):
        cfg = core.cfg
        super().__init__(core, spi=cfg.replay_ratio * cfg.batch_size, min_size=0, chunk=int(chunk or cfg.train_freq),
                         rate_limit=False)
        self.prioritized = False
        self.base = core.c.env_steps              # env steps when the current rollout began

    @property
    def rollout(self) -> int:
        return self.core.cfg.train_freq

    def collected(self) -> int:
        """Env steps of the current rollout that are in."""
        return self.core.c.env_steps - self.base

    def _room(self, n: int) -> int:
        if self.base >= self.steps:   # the run's last rollout is in: no other begins
            return 0
        return max(0, min(n, self.rollout - self.collected() - self.core.reserved))

    def to_collect(self) -> tuple[int, int]:
        n = self._room(self.rollout)
        return n, n

    def grant(self) -> int:
        return self._room(self.chunk)

    def ready(self) -> bool:
        """Whether the current rollout is complete (every grant is in) and may be learned."""
        return self.collected() >= self.rollout and not self.core.reserved

    def allowed(self, replay_size: int | None = None) -> int:
        """The gradient steps of a phase while a whole rollout waits to be learned, else 0."""
        return grads_per_phase(self.core.cfg) if self.ready() else 0

    def phase_done(self) -> None:
        """The current rollout was learned (or dropped): the next begins at the current env step count."""
        self.base = self.core.c.env_steps

    def finished(self, replay_size: int | None = None) -> bool:
        """Every rollout of the run is collected and learned."""
        return self.core.c.env_steps >= self.steps and self.collected() == 0

    def figures(self) -> dict:
        return {**super().figures(), "rollout": self.rollout}
