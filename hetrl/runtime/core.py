"""The learner core: everything a schedule drives, written once.

A schedule (inline, local, ray) is only a transport: how transitions reach the data storage, how sampled batches
reach the learner, how parameters reach the actors. What the learner does with them exists here, once, for every
schedule (as in Acme: one builder, a single-process or a distributed launcher): process setup, the spaces, the
algorithm and its kernel; the counters and the clock; the replay-ratio policy (ratio.py) and the grants in flight;
PER beta annealing; the actors' seeds and the restart policy of actors that die; the learner step (timed, counted,
checked), publishing; one checkpoint format (a run resumes under any schedule) and one set of figures. An
on-policy algorithm (``storage = "rollout"``) has a rollout storage, the rollout rule (ratio.RolloutRatio) and
the learner phase of a rollout (:meth:`LearnerCore.learn_rollout`) in place of the replay's.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import operator
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch

from hetrl.actors import ActorSpec, probe_spaces
from hetrl.actors.envs import EnvSpec, prepare_env
from hetrl import kernels
from hetrl.algos import learn_spec, make_algorithm, replay_spec
from hetrl.config import Config
from hetrl.algorithm import check_learn_contract
from hetrl.errors import HetrlError, NonFiniteError
from hetrl.machine import peak_memory, resolve_device
from hetrl.replay import FrameStorage, ReplayBuffer, Storage
from hetrl.replay.finite import all_finite
from hetrl.replay.frames import frames_apply
from hetrl.replay.memory import check_replay_memory
from hetrl.replay.rollout import RolloutStorage, explained_variance, gae, minibatches
from hetrl.runtime.layout import GROUP_MAX, Layout, grads_per_phase, group_size
from hetrl.runtime.params import ParameterStore
from hetrl.runtime.ratio import UNBOUNDED, ReplayRatio, RolloutRatio
from hetrl.runtime.threads import ThreadGovernor

MAX_RESTARTS = 5          # per actor, before a run gives up (local and ray)


def choose_kernel(cfg: Config, obs_space, act_space, device, lay: Layout | None = None, algo=None,
                  saved: dict | None = None) -> kernels.Choice:
    """The learner's kernel (hetrl/kernels/: a checkpoint's `saved` choice where it runs here, the machine's cached
    choice, else measured now) for learner calls of the size the run makes: `lay`'s group, None for one process
    (inline, a population's members); an on-policy phase's minibatches per call (learn_rollout)."""
    twin = functools.partial(make_algorithm, cfg, obs_space, act_space, device)
    algo = algo if algo is not None else twin()
    if getattr(algo, "storage", "replay") == "rollout":
        minibatches = max(1, min(cfg.n_epochs * (cfg.train_freq // cfg.batch_size), GROUP_MAX))
        group = max(1, min(algo.phase_group(minibatches), minibatches))
    else:
        group = lay.group if lay is not None else group_size(grads_per_phase(cfg), cfg.prioritized, cfg.priority_lag)
    return kernels.choose(cfg, twin, obs_space, act_space, learn_spec(cfg, obs_space, act_space), device, group,
                          algo=algo, saved=saved)


@dataclass
class Counters:
    env_steps: int = 0
    gradient_steps: int = 0
    phases: int = 0                # learner calls (a group of gradient steps each)
    wall_s: float = 0.0            # training time (evaluations excluded)
    acting_s: float = 0.0          # actors busy (summed over actors)
    learner_s: float = 0.0         # learner busy: gradient computation and optimizer steps
    replay_s: float = 0.0          # replay manager busy: insert, sample, priority update
    learner_wait_s: float = 0.0    # learner blocked waiting for data (local, ray)
    samples: int = 0               # transitions drawn (rate limiter), prefetched and requested ones included
    staleness_sum: float = 0.0     # sum over inserted env steps of (learner - acting) version
    staleness_steps: int = 0
    lag_sum: float = 0.0           # sum over inserted env steps of the policy lag in gradient steps
    lag_max: int = 0               # the largest policy lag (gradient steps) of an inserted chunk
    restarts: int = 0
    params_version: int = 0


class LearnerCore:
    """The learner side of a run: set up once per run by its schedule, in the learner's process.

    `lay`: how a schedule with actors is cut (runtime/layout.py; None: one process that alternates,
    inline); `servers`: replay servers that sample under their own rate limiter (ray)."""

    def __init__(self, cfg: Config, env: EnvSpec, threads: int, lay: Layout | None = None, servers: int = 0):
        self.cfg, self.lay = cfg, lay
        self.env = prepare_env(env, cfg, train=True)   # the wrappers of the settings (Atari, frame_stack)
        self._threads_before = torch.get_num_threads()   # given back by close()
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(max(1, threads))
        # Adam's moments of parameters whose gradients went to zero (dead ReLUs) decay into denormal floats, which
        # the CPU handles in microcode (arithmetic on them is several times slower)
        torch.set_flush_denormal(True)
        # a learner of several threads drops to the cores other work leaves it, during the run, where its kernel's
        # results do not depend on the thread count (_use_kernel)
        self.governor = ThreadGovernor(max(1, threads), exact=False)
        self.device = resolve_device(cfg.system.device)
        self.obs_space, self.act_space = probe_spaces(self.env)
        self.algo = make_algorithm(cfg, self.obs_space, self.act_space, self.device)
        self.spec = replay_spec(cfg, self.obs_space, self.act_space)
        # on-policy: a rollout storage of n_steps x num_envs, learned in phases of epochs over minibatches
        self.rollout = getattr(self.algo, "storage", "replay") == "rollout"
        self.actor_envs = lay.envs_per_actor if lay is not None else cfg.num_envs
        # stacked uint8 frames (Atari): each frame stored once, in host memory (hetrl/replay/frames.py)
        self.frames = not self.rollout and cfg.replay_frames and frames_apply(self.spec, cfg.frame_stack)
        self.storage_arrays = (RolloutStorage if self.rollout else FrameStorage if self.frames else Storage).layout(
            cfg.buffer_size, self.spec)
        # before any storage, staging or GPU buffer is allocated, and before the kernels are measured: refuse a replay
        # the device cannot hold
        self.replay_bytes = check_replay_memory(self.spec, cfg.buffer_size, "cpu" if self.frames else self.device,
                                                arrays=self.storage_arrays)
        self.kernel_choice = choose_kernel(cfg, self.obs_space, self.act_space, self.device, lay, self.algo)
        self._use_kernel(self.kernel_choice)
        self.c = Counters()
        self.params: ParameterStore | None = None
        self._published_at = 0
        self._changes_published: int | None = None       # the algorithm's policy_changes() then (publish)
        self._version_at: dict[int, int] = {}            # published version -> gradient steps then
        self._in_flight: dict[object, tuple[int, int]] = {}   # grant -> (gradient steps of the params then, env steps)
        self.reserved = 0                                # env steps granted, not yet inserted
        # reproducible: one process alternating (inline), or phases (a schedule with actors: local, ray);
        # else the actors and the learner go as timing has them, under the rate limiter and the policy-lag bound.
        # On-policy: every schedule alternates whole rollouts with their learner phases (reproducible, no lag)
        self.reproducible = lay is None or self.rollout or cfg.system.reproducible
        phased = lay is not None and self.reproducible and not self.rollout
        self.max_lag = lay.max_lag if lay is not None and not phased and not self.rollout else 0   # (0: none)
        if self.rollout:
            self.ratio = RolloutRatio(self, lay.chunk if lay is not None else None)
            # the minibatches' shuffle: the run's own generator (checkpointed), whatever else runs in the process
            self.shuffle_rng = torch.Generator().manual_seed(cfg.seed + 0x5F3759DF)
        else:
            self.ratio = ReplayRatio.of(self, lay, phased, servers)
        # gradient steps between publications (phases publish at their boundaries only, a rollout at its end)
        self.publish_every = (UNBOUNDED if phased or self.rollout
                              else max(1, cfg.system.publish_interval * grads_per_phase(cfg)))
        self.restarts: dict[int, int] = {}   # actor -> times it was replaced (ActorsSchedule._replace)
        self.rollout_stats: dict[str, float] = {}   # the last rollout's figures (on-policy)
        self._t0: float | None = None
        # the learning rate as a function of the run's progress remaining (1 -> 0), set before each learner
        # call; None: the optimizers keep theirs. cfg.lr_schedule sets it (linear: lr x progress remaining, rl-zoo's
        # lin_X); a front end may set any function (the SB3-style classes' callable learning_rate)
        self.lr_at: Callable[[float], float] | None = (functools.partial(operator.mul, cfg.lr)
                                                       if cfg.lr_schedule == "linear" else None)
        self._lr: float | None = None
        self.learn_mark: tuple[float, int] | None = None   # (wall_s, env_steps) at this process's first update
        self._contract_checked = False                     # learn()'s contract, checked on the first call

    def _use_kernel(self, choice: kernels.Choice) -> None:
        """Run the learner's updates with the kernel of `choice` (hetrl/kernels/); it takes the learner's threads
        (the compiled kernel: its lanes, with torch on one thread for the small ops around a phase)."""
        if getattr(self, "kernel", None) is not None:
            self.kernel.close()
        self.kernel_choice = choice
        self.kernel = kernels.build(choice, self.algo)
        self.governor.exact = bool(self.kernel.threads_exact)
        self.governor.apply = self.kernel.use_threads
        self.governor.apply(self.governor.threads)

    def load_algo(self, state: dict) -> None:
        """New parameters and optimizer state between phases (the SB3-style classes' set_parameters): the kernel is
        built again on them (it may hold views or a captured graph of the tensors replaced), actors get the policy."""
        self.algo.load_state_dict(state)
        self._use_kernel(self.kernel_choice)
        self._lr = None
        if self.params is not None:
            self.publish()

    def close(self) -> None:
        """Give back what the learner changed in this process: the kernel's settings, torch's thread count."""
        if getattr(self, "kernel", None) is not None:
            self.kernel.close()
        torch.set_num_threads(self._threads_before)

    # ---- parts ------------------------------------------------------------------------------
    def make_replay(self, buffers: dict | None = None) -> ReplayBuffer | RolloutStorage:
        """The run's replay (an on-policy algorithm's: its rollout storage); `buffers`: preallocated host arrays for
        any of `storage_arrays` (shared memory)."""
        cfg = self.cfg
        if self.rollout:
            return RolloutStorage(cfg.train_freq, self.spec, actors=max(1, cfg.num_envs // self.actor_envs),
                                  buffers=buffers, check_finite=cfg.system.check_finite)
        return ReplayBuffer(cfg.buffer_size, self.spec, self.device, prioritized=cfg.prioritized,
                            alpha=cfg.per_alpha, beta=cfg.per_beta, seed=cfg.seed, buffers=buffers,
                            check_finite=cfg.system.check_finite, frames=self.frames)

    def insert(self, replay: ReplayBuffer, batch: dict, actor: int = 0) -> None:
        """Insert an actor's batch; non-finite data stops the run with where it came from."""
        try:
            if self.rollout:
                replay.insert(batch, actor, self.actor_envs)
            else:
                replay.insert(batch)
        except NonFiniteError as e:
            raise NonFiniteError(f"{e} (from actor {actor}, env steps {self.c.env_steps:,} and on); the learner "
                                 "never saw it: check the env, or --set check_finite=false") from None

    def attach(self, params: ParameterStore) -> None:
        """The schedule's parameter store; the current weights are published at once."""
        self.params = params
        self.publish()

    def actor_spec(self, index: int, envs: int) -> ActorSpec:
        """Actor `index`'s settings and policy. Seeds follow the env step count and the actor's restarts, so an
        actor started on resume or after a crash does not replay the episodes of the one before."""
        cfg = self.cfg
        env_seed = cfg.seed + 1000 * index + self.c.env_steps + 7919 * self.restarts.get(index, 0)
        policy = self.kernel.wrap_policy(self.algo.make_policy(seed=env_seed + 1, num_envs=envs))
        return ActorSpec(self.env, envs, env_seed, policy, cfg.n_step, cfg.gamma, cfg.system.env_backend,
                         env_offset=index * envs)

    # ---- acting side ----------------------------------------------------------------------------
    def inserted(self, steps: int, version: int | None = None, busy_s: float = 0.0) -> None:
        """`steps` env steps reached the replay, collected with parameters `version`."""
        c = self.c
        c.env_steps += steps
        self.algo.on_env_steps(c.env_steps - steps, c.env_steps)
        c.acting_s += busy_s
        if version is not None:
            c.staleness_sum += (c.params_version - version) * steps
            c.staleness_steps += steps
            lag = c.gradient_steps - self._version_at.get(version, self._published_at)
            c.lag_sum += lag * steps
            c.lag_max = max(c.lag_max, lag)

    # ---- grants in flight and the policy-lag bound ---------------------------------------------------
    def next_grant(self, envs: int) -> tuple[int, list] | None:
        """What an actor of `envs` envs may collect next: (env steps, the algorithm's exploration value (epsilon,
        noise; None = uniform random) for each of its vector steps), or None while the replay ratio holds the actors
        or the run needs no more."""
        n = self.ratio.grant()
        if not n:
            return None
        base = self.c.env_steps + self.reserved
        return n, [self.algo.exploration(base + k * envs) for k in range(max(1, -(-n // envs)))]

    def granted(self, key, n: int) -> None:
        """Grant `key` of `n` env steps went to an actor: it acts with parameters at least as new as the
        latest publication (actors load the latest before each chunk)."""
        self._in_flight[key] = (self._published_at, n)
        self.reserved += n

    def returned(self, key) -> None:
        """The chunk of grant `key` is in (or was lost with its actor: its env steps are granted again)."""
        self.reserved -= self._in_flight.pop(key, (None, 0))[1]

    def lag_room(self, planned: int) -> int:
        """Gradient steps the learner may still plan (`planned`: gradient steps done or already drawn)
        before it would lead the oldest policy still acting by more than max_lag."""
        if not self._in_flight or not self.max_lag:
            return UNBOUNDED
        return min(at for at, _ in self._in_flight.values()) + self.max_lag - planned

    def beta(self) -> float | None:
        """PER's importance-sampling exponent, annealed linearly from per_beta to 1 over the run."""
        cfg = self.cfg
        if not cfg.prioritized:
            return None
        return cfg.per_beta + min(1.0, self.c.env_steps / cfg.steps) * (1.0 - cfg.per_beta)

    # ---- learning side --------------------------------------------------------------------------
    def learn(self, stack: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """One learner call: weights.shape[0] gradient steps on stacked batches; returns |TD| (K, B)."""
        self.governor.tick()
        # the optimizers' learning rate from `lr_at` at the run's progress remaining (as SB3 computes it before each
        # training call), set only when it changed
        lr = float(self.lr_at(self.progress_remaining())) if self.lr_at is not None else self._lr
        if lr != self._lr:
            self.algo.set_lr(lr)
            self._lr = lr
        t0 = time.perf_counter()
        before = self.algo.updates
        td = self.kernel.learn(stack, weights)
        if not self._contract_checked:
            check_learn_contract(self.cfg.algo, td, weights, self.algo.updates - before)
            self._contract_checked = True
        self.learned(td, weights.shape[0], time.perf_counter() - t0)
        return td

    def learn_from(self, replay) -> None:
        """The gradient steps the replay ratio allows now, from a replay in this process (inline, a population's
        member). Uniform replay: all of them in one gather (the buffer does not change meanwhile, so this is the
        same distribution). Prioritised: sample -> learn -> update priorities, as many batches at a time as the
        priority lag allows (exact PER: one)."""
        if self.rollout:
            self.learn_rollout(replay)
            return
        while k := self.ratio.allowed(len(replay)):
            t0 = time.perf_counter()
            stack, keys, weights = self.draw(replay, k)
            t1 = time.perf_counter()
            td = self.learn(stack, weights)
            t2 = time.perf_counter()
            if self.cfg.prioritized:
                replay.update_priorities(keys, td.view(-1))
            self.ratio.written(k)
            self.c.replay_s += (t1 - t0) + (time.perf_counter() - t2)

    def draw(self, replay: ReplayBuffer, k: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """k batches from a replay in this process, counted as drawn: ({field: (k, B, ...)}, keys, weights (k, B))."""
        B = self.cfg.batch_size
        batch, keys, weights = replay.sample(k * B, beta=self.beta())
        self.ratio.drawn(k)
        return {name: v.view(k, B, *v.shape[1:]) for name, v in batch.items()}, keys, weights.view(k, B)

    def learn_rollout(self, rollout: RolloutStorage) -> bool:
        """The learner phase of a complete rollout (on-policy; False while none is complete), for every schedule:
        the algorithm's values and log-probabilities in one forward (`rollout_values`), GAE(gae_lambda), then
        n_epochs passes of shuffled minibatches of batch_size through `learn` (a pass's last minibatch is smaller
        where batch_size does not divide the rollout, as SB3's), `phase_group` minibatches a call (several passes'
        in one where they fit), until `stop_phase` says stop; then `rollout_done`, the new policy published and the
        rollout emptied."""
        if not self.ratio.ready():
            return False
        cfg, algo, c = self.cfg, self.algo, self.c
        t0 = time.perf_counter()
        self.governor.tick()
        data = rollout.tensors()
        algo.set_progress(self.progress_remaining())
        out = algo.rollout_values(data)
        dev = out["value"].device
        adv, ret = gae(out.get("reward", data["reward"]).to(dev), out["value"], out["next_value"],
                       data["terminated"], data["truncated"], cfg.gamma, cfg.gae_lambda)
        self.rollout_stats = {"explained_variance": explained_variance(out["value"].flatten(), ret.flatten())}
        fields = {"obs": data["obs"], "action": data["action"],
                  **{k: v for k, v in out.items() if k not in ("next_value", "reward")},
                  "advantage": adv, "return": ret}
        R = rollout.capacity
        flat = {k: v.reshape(R, *v.shape[2:]).to(self.device) for k, v in fields.items()}
        c.learner_s += time.perf_counter() - t0
        total = cfg.n_epochs * (R // cfg.batch_size)   # a phase's full minibatches, phase_group (<= GROUP_MAX) a call
        group = max(1, min(algo.phase_group(total), total, GROUP_MAX)) if total else 1
        for idx in minibatches(R, cfg.batch_size, cfg.n_epochs, group, self.shuffle_rng, self.device):
            self.ratio.drawn(idx.shape[0])
            self.learn({k: v[idx] for k, v in flat.items()}, torch.ones(idx.shape, device=self.device))   # uniform
            if algo.stop_phase():
                break
        algo.rollout_done(data)
        rollout.clear()
        self.ratio.phase_done()
        self.publish()
        return True

    def progress_remaining(self) -> float:
        """1 - env_steps / steps, at least 0 (SB3's progress remaining, as schedules read it)."""
        return 1.0 - min(1.0, self.c.env_steps / max(1, self.cfg.steps))

    def train_stats(self) -> dict[str, float]:
        """The algorithm's loss scalars of its last update (its `stats`) and the last rollout's figures, as floats
        (a device sync: read them only when logging)."""
        return {**{k: float(v) for k, v in getattr(self.algo, "stats", {}).items()}, **self.rollout_stats}

    def learned(self, td: torch.Tensor, steps: int, seconds: float) -> None:
        """`steps` gradient steps were taken in `seconds` (by this core's kernel, or together with other learners
        by a population's): check their |TD| errors, count them, publish where due."""
        c = self.c
        if self.learn_mark is None:
            self.learn_mark = (self.elapsed() - seconds, c.env_steps)
        if self.cfg.system.check_finite and not all_finite(td):
            raise NonFiniteError(f"the learner's TD errors became NaN/inf at gradient step {c.gradient_steps:,} "
                                 f"(env step {c.env_steps:,}): the loss diverged; lower lr or check the rewards",
                                 learner_ok=False)
        c.learner_s += seconds
        self.governor.record(seconds, steps)
        c.gradient_steps += steps
        c.phases += 1
        if c.gradient_steps - self._published_at >= self.publish_every:
            self.publish(changed_only=True)

    def publish(self, changed_only: bool = False) -> None:
        """The policy's weights to the parameter store, as the next version. `changed_only`: not when the
        algorithm says its policy has not moved since the last publication (`policy_changes()`: TD3's actor steps
        every policy_delay-th update): the published version is then still the learner's policy, as of now."""
        changes = getattr(self.algo, "policy_changes", None)
        changes = changes() if changes is not None else None
        if not (changed_only and changes is not None and changes == self._changes_published):
            self._changes_published = changes
            self.c.params_version = self.params.publish(self.algo.policy_state())
        self._published_at = self.c.gradient_steps
        self._version_at[self.c.params_version] = self.c.gradient_steps
        if len(self._version_at) > 4096:   # versions older than any chunk in flight
            for v in sorted(self._version_at)[:2048]:
                del self._version_at[v]

    # ---- clock --------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.c.wall_s if self._t0 is None else time.perf_counter() - self._t0

    def start_clock(self) -> None:
        self._t0 = time.perf_counter() - self.c.wall_s   # a resumed run continues its clock

    def tick(self) -> None:
        self.c.wall_s = self.elapsed()

    @contextlib.contextmanager
    def clock_paused(self):
        """Time spent inside (evaluations) is not training time."""
        t = time.perf_counter()
        try:
            yield
        finally:
            if self._t0 is not None:
                self._t0 += time.perf_counter() - t

    # ---- figures and state ----------------------------------------------------------------------
    def figures(self) -> dict:
        c, cfg = self.c, self.cfg
        B, wall = cfg.batch_size, c.wall_s
        out = {"env_steps": c.env_steps, "gradient_steps": c.gradient_steps, "wall_s": wall,
               "env_steps_per_s": c.env_steps / wall if wall else 0.0,
               "train_samples_per_s": B * c.gradient_steps / c.learner_s if c.learner_s else 0.0,
               "train_samples_per_wall_s": B * c.gradient_steps / wall if wall else 0.0,
               "learner_busy_s": c.learner_s, "acting_s": c.acting_s, "replay_busy_s": c.replay_s,
               "replay_ratio_achieved": c.gradient_steps / c.env_steps if c.env_steps else 0.0,
               "replay_ratio_target": cfg.replay_ratio, "params_version": c.params_version,
               "learner_busy_fraction": c.learner_s / wall if wall else 0.0,
               "learner_wait_s": c.learner_wait_s,
               "policy_staleness_mean": c.staleness_sum / c.staleness_steps if c.staleness_steps else 0.0,
               "policy_lag_mean": c.lag_sum / c.staleness_steps if c.staleness_steps else 0.0,
               "policy_lag_max": c.lag_max, "policy_lag_bound": self.max_lag or None,
               "actor_restarts": c.restarts, "reproducible": self.reproducible, "replay_bytes": self.replay_bytes,
               **self.governor.figures(),
               "learner_kernel": self.kernel.name, "learner_kernel_source": self.kernel_choice.source,
               "compile_s": self.kernel.compile_s, **self.kernel.figures(), **self.ratio.figures()}
        out.update(peak_memory(self.device))
        if self.learn_mark is not None and wall > self.learn_mark[0] and c.env_steps > self.learn_mark[1]:
            # the steady state the planner predicts (the warm-up before learning_starts only acts)
            out["env_steps_per_s_learning"] = (c.env_steps - self.learn_mark[1]) / (wall - self.learn_mark[0])
        return out

    def state_dict(self) -> dict:
        out = {"algo": self.algo.state_dict(), "counters": asdict(self.c), "torch_rng": torch.get_rng_state(),
               "kernel": {"name": self.kernel_choice.name, "options": dict(self.kernel_choice.options)}}
        if self.rollout:
            out["shuffle_rng"] = self.shuffle_rng.get_state()
        return out

    def load_state_dict(self, state: dict) -> None:
        if self.c.env_steps or self.c.gradient_steps:
            raise HetrlError("load_state_dict must come before the first phase() of a schedule")
        self.algo.load_state_dict(state["algo"])
        self._in_flight.clear()       # grants made before the load belong to actors that start again
        self.reserved = 0
        saved = state.get("kernel")   # a resumed run keeps the kernel it was started with (where it applies here)
        if saved and self.cfg.system.learner_kernel == "auto" and saved.get("name") != self.kernel_choice.name:
            self._use_kernel(choose_kernel(self.cfg, self.obs_space, self.act_space, self.device, self.lay, self.algo,
                                           saved))
        known = {f.name for f in fields(Counters)}
        self.c = Counters(**{k: v for k, v in state["counters"].items() if k in known})
        self.c.samples = self.c.gradient_steps * self.cfg.batch_size   # a group drawn and not learned is drawn again
        torch.set_rng_state(state["torch_rng"])
        if self.rollout:
            if "shuffle_rng" in state:
                self.shuffle_rng.set_state(state["shuffle_rng"])
            self.ratio.phase_done()   # a rollout begins (one cut short by the checkpoint is collected again)
        if self.params is not None:
            self.publish()


def _actors(envs: list[int] | None) -> str:
    if not envs:
        return "not restored here"
    return (f"{len(envs)} actor{'s' if len(envs) > 1 else ''} of {envs[0]} env{'s' if envs[0] > 1 else ''}"
            if len(set(envs)) == 1 else f"actors of {'/'.join(map(str, envs))} envs")


class Schedule(abc.ABC):
    """A transport of the training protocol around one :class:`LearnerCore`.

    Subclasses move transitions, batches and parameters; they set `core`, `replay` (a replay buffer or a handle with
    ``state_dict/load_state_dict/__len__``) and implement `_step`, `done`, `_close` and `_restart_actors` (after a
    checkpoint is loaded). Use it as a context manager, or call `close()`: it stops every process, Ray actor and
    shared block the schedule started."""

    name = "?"
    core: LearnerCore
    replay: object

    # the learner core's parts, for callers
    @property
    def algo(self):
        return self.core.algo

    @property
    def c(self) -> Counters:
        return self.core.c

    @property
    def device(self) -> torch.device:
        return self.core.device

    PHASE_S = 0.1                  # a phase() returns after about this long (Ctrl-C is seen quickly); 0: one _step
    _said_actors = False           # the line about a resume without the actors' state was printed
    _closed = False
    _episodes: list

    def phase(self) -> list[tuple[float, int]]:
        """Advance the protocol a little (about PHASE_S, at least one _step; on-policy: one rollout, collected and
        learned, so that evaluations and callbacks see the run at the same points under every schedule); returns
        the episodes (return, length) finished meanwhile."""
        if self._closed:
            raise HetrlError(f"this {self.name} schedule was closed; make a new Run")
        t_end = time.perf_counter() + self.PHASE_S
        rollout = self.core.ratio.base if self.core.rollout else None
        while not self.done():
            self._step()
            if (self.core.ratio.base != rollout) if rollout is not None else (time.perf_counter() >= t_end):
                break
        eps, self._episodes = self._episodes, []
        return eps

    @abc.abstractmethod
    def _step(self) -> None:
        """One round of the transport: move data, learn what the replay ratio allows."""

    @abc.abstractmethod
    def done(self) -> bool:
        """Whether the run has collected its env steps and learned what it owes."""

    def close(self) -> None:
        """Stop everything this schedule started (its `_close`, once)."""
        if not self._closed:
            self._closed = True
            self._close()

    @abc.abstractmethod
    def _close(self) -> None:
        """What close() stops: the transport's actors, servers and shared blocks, and its learner cores."""

    def _restart_actors(self) -> None:
        """Actors that started with seeds for step 0 start again with seeds for the step count."""

    keep_actors_state = False      # set where the run saves its replay: a finished run keeps its actors' state

    def actor_envs(self) -> list[int] | None:
        """The envs of each of its actors (an actors_state() restores into actors of the same envs)."""

    def actors_state(self) -> dict:
        """The actors' state for an exact resume (Actor.state_dict of each: envs, RNGs, pending n-step transitions,
        acting policies), saved with the replay: {"actors": [...], "envs": actor_envs()} or {"unsaved": why} where
        they cannot be saved; a resumed run then restarts its episodes (seeded from the step count)."""
        return {"unsaved": f"the {self.name} schedule's actors are not saved"}

    def _states(self, states: list[dict]) -> dict:
        """actors_state() of the Actor.state_dict() of each actor."""
        why = next((s["unsaved"] for s in states if "unsaved" in s), None)
        return {"unsaved": why} if why else {"actors": [s["pickle"] for s in states], "envs": self.actor_envs()}

    def _load_actors(self, states: list[dict]) -> None:
        """Actors as actors_state() saved them ({"pickle": ...} each), in place of new ones, before the first phase."""

    # the run's clock (a population's: every member's)
    def _cores(self) -> list[LearnerCore]:
        return [self.core]

    def start_clock(self) -> None:
        for core in self._cores():
            core.start_clock()

    def tick(self) -> None:
        for core in self._cores():
            core.tick()

    @contextlib.contextmanager
    def clock_paused(self):
        with contextlib.ExitStack() as stack:
            for core in self._cores():
                stack.enter_context(core.clock_paused())
            yield

    def extended(self) -> None:
        """cfg.steps was raised after the schedule finished (Run.extend): the next phase() goes on collecting."""

    def transport_figures(self) -> dict:
        return {}

    def figures(self) -> dict:
        return {**self.core.figures(), "schedule": self.name, **self.transport_figures()}

    def state_dict(self, with_replay: bool) -> dict:
        state = self.core.state_dict()
        if with_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint of any schedule (one format): the learner, its counters, and the replay if saved."""
        self.core.load_state_dict(state)
        actors = None
        if "replay" in state:
            replay = dict(state["replay"])
            actors = replay.pop("actors", None)
            self.replay.load_state_dict(replay)
        if actors is not None and "unsaved" not in actors and actors.get("envs") == self.actor_envs():
            self._load_actors([{"pickle": p} for p in actors["actors"]])
            return
        self._restart_actors()   # new episodes (without a saved replay: a resume that is not exact, as asked)
        if actors is not None and not Schedule._said_actors:
            Schedule._said_actors = True   # once per process (a population's members share the reason)
            why = actors.get("unsaved") or (f"they were {_actors(actors.get('envs'))}, this run's are "
                                            f"{_actors(self.actor_envs())}")
            print(f"hetrl: resuming without the actors' state ({why}): the actors start new episodes, so the "
                  "run leaves the path of one that never stopped", file=sys.stderr, flush=True)

    def __enter__(self) -> "Schedule":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Slot:
    """The learner's view of one actor (a transport adds its handle): its grants in flight (the core's grant key ->
    env steps) and, in phases, its chunk of the phase, waiting for the boundary."""

    ready = True

    def __init__(self, index: int):
        self.index = index
        self.outstanding: dict = {}
        self.chunk: tuple | None = None


class ActorsSchedule(Schedule):
    """A schedule whose actors run apart from the learner (local processes, Ray actors), cut by `lay`, one
    :class:`Slot` each (`slots`).

    Reproducible (the default): phases. A phase's grants go out at once, its chunks wait to go in at its boundary in
    actor order, and phase() returns at the boundary with the actors idle, so that evaluations and callbacks see the run
    at the same points whatever the timing and the actors' state can be saved. Timed (reproducible=false): phase() runs
    about PHASE_S. When the run has its env steps the actors stop (their state kept first where the run saves it).

    A transport provides: `_poll(timeout)` (take what the actors and the replay sent, waiting up to `timeout` for
    the first), `_grant_one(slot)` (the slot's next chunk: True when sent, None when the core grants none now,
    False when the actor cannot take one), `_insert(slot, *chunk)` (a chunk of the phase in), `_draw(g)` (draw or
    ask for g batches), `_drawing()` (a group drawn or asked for is not learned yet), `_receive()` (the drawn group
    as (stack, keys, weights, shard), None while not there), `_learned(shard, keys, |TD|)` (its priorities written),
    `_start_actors()` (seeded for the step count: actor_spec), `_spawn(slot)` (a new actor in the slot),
    `_stop_actors()` (the run's figures and state stay) and `_ask_states()` (actors_state() of the idle actors)."""

    lay: Layout
    slots: list[Slot]
    replay_here = True                   # the replay lies in this process (False: replay servers check its size)
    _open = _finished = False            # _open: a phase's grants are out and its boundary not reached
    _next_actor = 0                      # timed: the actor granted first next time (actors in turn)
    _final: dict | None = None           # the actors' state when the run finished (keep_actors_state)
    startup_s = 0.0

    def phase(self) -> list[tuple[float, int]]:
        if self.core.ratio.phased and not self._closed:
            if not self._open and not self.done():   # every actor granted its chunk of the phase
                self._open = True
                for s in self.slots:
                    self._grant_one(s)
            while self._open and not self.done():
                self._step()
            eps, self._episodes = self._episodes, []
        else:   # timed, or on-policy: one rollout collected and learned
            eps = super().phase()
        # in the order of their envs (actor by actor), not of the chunks' arrival: the same under every timing
        return sorted(eps, key=lambda e: -1 if getattr(e, "env", None) is None else e.env)

    def _step(self) -> None:
        self._poll(0.0)
        if self.core.ratio.phased and self._at_boundary():
            # the learner's policy is published (the next phase acts with it: one phase behind the learner)
            self.core.publish(changed_only=True)
            self._insert_phase()
            self._open = False
            return
        if not self.core.ratio.phased:
            self._grant()
        if not self._learn_step():
            self._poll(self.PHASE_S)

    def done(self) -> bool:
        if self._finished:
            return True
        # every env step is in and the learner learned what the ratio owes, drawn groups too
        if self._drawing() or not self.core.ratio.finished(len(self.replay) if self.replay_here else None):
            return False
        if self.keep_actors_state and self.core.ratio.phased:   # idle: every env step is in
            self._open = False
            self._final = self.actors_state()
        self._finished = True
        self._stop_actors()  # nothing left for them; the run's figures and state stay here
        return True

    def _allowed(self) -> int:
        """Batches the learner may draw now: the core's replay ratio decides."""
        return self.core.ratio.allowed(len(self.replay) if self.replay_here else None)

    def _at_boundary(self) -> bool:
        """Every chunk of the phase arrived and the learner drew and learned what it owes."""
        return all(s.ready and not s.outstanding for s in self.slots) and not self._drawing() and self._allowed() == 0

    def _insert_phase(self) -> None:
        """The phase's chunks in, in actor order."""
        for s in self.slots:
            if s.chunk is not None:
                chunk, s.chunk = s.chunk, None
                self._insert(s, *chunk)

    def _grant(self) -> None:
        """Timed: grants as far as the core's replay ratio allows, actors taken in turn, up to two in flight each
        (its double buffer). One each under lockstep (overlap=false: a collect round only while the learner has
        nothing to do) and on-policy (its share of the rollout)."""
        slots = [s for s in self.slots if s.ready]
        lockstep = not self.cfg.system.overlap
        if not slots or lockstep and (self.core.reserved or self._drawing() or self._allowed()):
            return
        most = 1 if lockstep or self.core.rollout else 2
        start = self._next_actor % len(slots)
        for k in range(len(slots)):
            s = slots[(start + k) % len(slots)]
            # on-policy, only while its share of the rollout is not in (so that every actor steps its own envs, one
            # share of every rollout each, whatever the timing)
            while len(s.outstanding) < most and (not self.core.rollout or self.replay.wants(s.index)):
                sent = self._grant_one(s)
                if sent is None:
                    return
                if not sent:
                    break
                self._next_actor = start + k + 1

    def _learn_step(self) -> bool:
        """One learner call on a group of batches (on-policy: a rollout's phase), its priorities written; False when
        none is ready. With prefetch the next group is drawn while this one is learned (where the ratio allows)."""
        if self.core.rollout:
            return self.core.learn_rollout(self.replay)
        if not self._drawing() and not self._draw_next():
            return False
        got = self._receive()
        if got is None:
            return False
        stack, keys, weights, shard = got
        if self.cfg.system.prefetch:
            self._draw_next()
        td = self.core.learn(stack, weights)
        self._learned(shard, keys, td)
        self.core.ratio.written(weights.shape[0])
        return True

    def _draw_next(self) -> bool:
        """Draw (ask for) the batches the core's replay ratio allows now, counted as drawn; False when it allows
        none."""
        g = self._allowed()
        if g:
            self.core.ratio.drawn(g)
            self._draw(g)
        return g > 0

    def _replace(self, slot: Slot, what: str, starting: bool = False, hint: str = "") -> None:
        """The restart policy. Actor `slot` died (`what`: "actor 1 (pid 42) exited with code 1"): its grants in
        flight are granted again. One that dies while starting ends the run (HetrlError): a new one would die the
        same way. Past MAX_RESTARTS of one actor the run gives up; else a new actor takes its place (actor_spec
        gives it new seeds), granted the dead one's chunk of an open phase where that chunk was lost with it."""
        lost = bool(slot.outstanding)
        for key in slot.outstanding:
            self.core.returned(key)
        slot.outstanding = {}
        if starting:
            self.close()
            raise HetrlError(f"{what} while starting; its error is printed above{hint}")
        n = self.core.restarts[slot.index] = self.core.restarts.get(slot.index, 0) + 1
        self.c.restarts += 1
        if n > MAX_RESTARTS:
            self.close()
            raise HetrlError(f"{what}, restart {n}: giving up")
        print(f"hetrl: {what}; starting a new one (restart {n} of {MAX_RESTARTS})", file=sys.stderr, flush=True)
        self._spawn(slot)
        if lost and self.core.ratio.phased and self._open and slot.chunk is None:
            self._grant_one(slot)

    def _restart_actors(self) -> None:
        self._stop_actors()
        self._start_actors()

    def extended(self) -> None:
        if self._finished:   # its actors were stopped at the end: new ones, with seeds for the step count
            self._finished, self._open, self._final = False, False, None
            self._restart_actors()

    def actor_envs(self) -> list[int]:
        return [self.lay.envs_per_actor] * self.lay.actors

    def actors_state(self) -> dict:
        """At a phase boundary every actor is idle: each is asked for its state (`_ask_states`)."""
        if not self.core.ratio.phased:
            if self.core.rollout:
                return {"unsaved": "an on-policy run's actors are not saved under this schedule"}
            return {"unsaved": "reproducible=false: the actors are stopped inside their chunks"}
        if self._final is not None or self._finished:
            return self._final or {"unsaved": "the actors were stopped when the run finished"}
        if self._open or any(s.chunk is not None for s in self.slots):
            return {"unsaved": "the run stopped inside a phase"}
        return self._ask_states()

    def transport_figures(self) -> dict:
        c, lay, wall = self.c, self.lay, self.c.wall_s
        return {"actors": lay.actors, "envs_per_actor": lay.envs_per_actor, "insert_chunk": lay.chunk,
                "actor_busy_fraction": c.acting_s / (lay.actors * wall) if wall else 0.0, "startup_s": self.startup_s}
