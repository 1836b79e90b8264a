"""Performance model: predicted env steps/s, training samples/s, busy fractions and power of a plan.

Start: PEARL's iteration time for one gradient step, T_itr = T_sample + max(T_update + T_insert,
T_learn). What it ignores, and this model adds: the number of actor processes and their envs,
the CPU cores that actors, learner and replay manager share (and what oversubscribing them
costs), transfers between devices, the rate limiter that fixes the replay ratio, the actors'
inference device, grouped gradient steps, and continuous actions (bytes per transition and the
DDPG update come from the profile of the actual spaces).

Symbols (seconds, from the profile table; w = envs per actor, N = actors, B = batch size,
b = bytes per transition, rr = replay ratio = gradient steps per env step, C = cores, t = learner
threads (1 when the learner is on a GPU: its host thread drives it), k = gradient steps per
sample/learn call (inline + uniform replay: a whole phase; local + uniform: up to 32; prioritized:
(priority_lag + 1) // 2, at least 1), n = env steps per insert (inline: train_freq; local: its chunk), p = 1 if prioritized else 0,
x(src->dst, bytes) = latency + bytes / bandwidth, 0 on one device):

    a  = act(w, inference device) / w                        actor time per env step (one core)
    i  = [ds_insert(DS, n) + x(cpu->DS, n b) + p rm_insert(RM, n) (+ ipc message, local)] / n
    s  = [rm_sample(RM, kB) + x(RM->DS, 8kB) + ds_gather(DS, kB) + x(DS->L, kB b) + x(RM->L, 4kB)] / k
    l  = learn(L, B, t, k)  per step, profiled with k steps per call (the grouped figure, k > 1); what a run
                            of this workload measured at t threads under this schedule where one did
                            (measured in a run, follow.py), else for inline the profile's loop at t threads
                            (profile/loop.py: updates as a run makes them), a t > 1 figure measured under
                            load priced as the 1-thread one x the quiet machine's thread scaling
    u  = p [x(L->RM, 4B) + rm_update(RM, B)]
    y  = param_sync(L) / (gradient steps per publish)
    g  = s + l + u + y               main process, wall time per gradient step
       = max(s, l) + u + y           local with prefetch: sampling overlaps learning (PEARL's max),
                                     where the profile measured the prefetch thread faster than the
                                     draw in line for a learner on L and, for a CPU learner, the
                                     actors and its threads leave it a core (else the plan turns it off);
                                     never with exact PER (priority_lag 0): a batch is drawn only
                                     once every earlier batch's priorities are written
    gc = s + t l + u + y             main process, core-seconds per gradient step
    e  = loop excess per env step: what the profile's real inline loop measured (profile/loop.py) beyond
         a + i + rr (s + u + y) at its settings (inline: all of it; local: less its acting's share), else 0
    m  = i + rr g + e,   mc = i + rr gc + e  per env step

    inline:   X = 1 / (a + m)                                 one process alternates
    local:    X = min(N / a,  1 / m,  C_eff / (a + mc))       actors | learner | shared cores
    lockstep: X = min(1 / (a / min(N, C_eff) + m),  C_eff / (a + mc))    (local, overlap=false; on-policy:
              each rollout of train_freq env steps, n = its share per actor, then its gradient_steps, k = its
              minibatches per call, GROUP_MAX at most)
              C_eff = C / (1 + KAPPA max(0, N + t - P) / P)   oversubscription costs context switches
              l x (1 + (SPIN - 1) rho) when t > 1 and N + t > P: a multi-threaded learner whose
              OpenMP threads share cores with actor processes waits at its barriers for a thread
              that a busy actor displaced (about 4x slower next to a process that spins on the
              same core; SPIN = 2 fits runs whose actors block and wake, as hetrl's do);
              rho = min(1, X a), the cores the actors keep busy (from a first pass)
    P = the machine's cores; C may be fewer, a fraction even: the cores that are ours on a machine
    shared with other programs (see load.py); inline then also gets X <= C / (a + mc) when C < t

    env steps/s = X;  training samples/s = X rr B;  gradient steps/s = X rr
    busy(cpu) = X (a + mc) / C;   busy(gpu) = X (seconds of the ops it runs per env step)
    watts     = P_idle(cpu) + P_core busy(cpu) C + sum over GPUs used (P_idle + (P_board - P_idle) busy)
    steps/J   = X / watts

The rate limiter makes the faster side wait (it sleeps, freeing its core), so X is the slower
side: the actors (N / a), the learner process (1 / m = gradient steps/s over rr) or the cores.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from hetrl.planner.profile import ProfileTable
from hetrl.runtime.layout import GROUP_MAX, chunk_size, grads_per_phase, group_size, learns_rollouts, prefetch_fits

SCHEDULES = ("inline", "local")
KAPPA = 0.15                 # slow-down per oversubscribed runnable thread (as a share of C)
SPIN = 2.0                   # slow-down of a multi-threaded learner next to a fully busy actor (fit: bench_planner)
IPC_MESSAGE_BYTES = 256      # a chunk notice (the data itself is staged in shared memory)
KEY_BYTES, WEIGHT_BYTES, TD_BYTES = 8, 4, 4


def runnable_reason(plan: "Plan") -> str | None:
    """Why this runtime cannot run ``plan`` (None: it can). The one rule of what is runnable:
    data storage lives with the learner on the Config's ``device``; the replay manager and the
    actors' inference run on the CPU; the schedule is one the planner prices (inline, local).
    The model also prices other placements (``--all-placements``): modelled, not runnable."""
    if plan.schedule not in SCHEDULES:
        return f"schedule {plan.schedule} is not plannable"
    if plan.storage_device != plan.learner_device:
        return (f"data storage on {plan.storage_device} apart from the learner on {plan.learner_device} "
                "(the runtime keeps both on `device`)")
    if plan.replay_device != "cpu":
        return f"replay manager on {plan.replay_device} (the runtime's replay manager runs on the CPU)"
    if plan.actor_inference_device != "cpu":
        return f"actor inference on {plan.actor_inference_device} (the runtime's actors infer on the CPU)"
    return None


@dataclass(frozen=True)
class Plan:
    """A placement of the protocol's parts. Devices are "cpu" or "cuda:i".

    storage_device, replay_device and actor_inference_device are the model's, not Config keys:
    the runtime runs a plan only where runnable_reason() is None (data storage with the learner
    on `device`, replay manager and inference on the CPU). batch_size is the preset's, priced
    here, never set by a plan."""

    schedule: str = "inline"
    actors: int = 1
    envs_per_actor: int = 8
    learner_device: str = "cpu"
    storage_device: str = "cpu"          # data storage (DS): the transitions (runnable: = learner_device)
    replay_device: str = "cpu"           # replay manager (RM): sum tree / sampling (runnable: cpu)
    actor_inference_device: str = "cpu"  # (runnable: cpu)
    batch_size: int = 64                 # the preset's (priced, not chosen)
    threads: int = 1                     # torch threads of the learner process

    @property
    def runnable(self) -> bool:
        return runnable_reason(self) is None

    @property
    def num_envs(self) -> int:
        """Envs in all: actors x envs each (inline: its one actor's)."""
        return self.envs_per_actor * (self.actors if self.schedule != "inline" else 1)

    def settings(self) -> dict:
        """The Config settings that run this plan: schedule, device, threads, num_envs (the preset's
        unless the planner was allowed more envs) and, for local, actors and envs_per_actor. Every
        key is a Config key; the placement fields are not (see runnable_reason)."""
        out = {"schedule": self.schedule, "device": self.learner_device, "num_envs": self.num_envs,
               "threads": self.threads}
        if self.schedule != "inline":
            out.update(actors=self.actors, envs_per_actor=self.envs_per_actor)
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "runnable": self.runnable}

    def describe(self) -> str:
        act = f"{self.actors} actor{'s' if self.actors > 1 else ''} x {self.envs_per_actor} envs"
        parts = [self.schedule, act, f"learner {self.learner_device} ({self.threads} thr)"]
        if self.storage_device != self.learner_device:
            parts.append(f"DS {self.storage_device}")
        if self.replay_device != "cpu":
            parts.append(f"RM {self.replay_device}")
        if self.actor_inference_device != "cpu":
            parts.append(f"inference {self.actor_inference_device}")
        return ", ".join(parts) + ("" if self.runnable else " (modelled, not runnable)")


@dataclass
class Workload:
    """What the run asks of the system (from its Config)."""

    replay_ratio: float
    batch_size: int
    prioritized: bool = False
    train_freq: int = 256
    grads_per_phase: int = 1
    publish_interval: int = 1
    overlap: bool = True             # local: actors act while the learner learns
    prefetch: bool = True            # local: a thread may sample the next group during the update (where it pays)
    insert_chunk: int = 0            # local: env steps per insert message (0 = auto)
    batched_insert: bool = True
    num_envs: int = 0                # envs in all, owned by the preset (0: the planner may choose them)
    priority_lag: int = 0            # prioritized: batches drawn before earlier ones' priorities are written
    # on-policy: a phase is one rollout (train_freq env steps, every actor its share) learned in groups of
    # train_freq // batch_size minibatches, with the actors waiting (lockstep, no prefetch); the rollout's size
    # is num_envs x n_steps, so the env count stays the preset's
    rollout: bool = False

    @classmethod
    def from_config(cls, cfg, allow_more_envs: bool = False) -> "Workload":
        rollout = learns_rollouts(cfg)
        return cls(float(cfg.replay_ratio), int(cfg.batch_size), bool(cfg.prioritized), int(cfg.train_freq),
                   grads_per_phase(cfg), int(cfg.system.publish_interval), bool(cfg.system.overlap) and not rollout,
                   bool(cfg.system.prefetch) and not rollout, int(cfg.system.insert_chunk),
                   bool(cfg.system.batched_insert), 0 if allow_more_envs and not rollout else int(cfg.num_envs),
                   int(cfg.priority_lag), rollout)


@dataclass
class Prediction:
    plan: Plan
    env_steps_per_s: float
    train_samples_per_s: float
    gradient_steps_per_s: float
    bound: str                       # "actors" | "learner" | "cpu" | "inline-acting" | "inline-learning" ...
    limits: dict[str, float]         # env steps/s each side alone would allow
    busy: dict[str, float]           # per device: fraction busy (cpu: of all its cores)
    roles: dict[str, float]          # fraction busy of each actor process / of the learner process
    times: dict[str, float]          # the model's terms, seconds (a, i, s, l, u, y, g, m)
    watts: float
    steps_per_joule: float
    power_source: str                # "measured" | "estimated" | "partly estimated"
    power_by_device: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        r = lambda v: float(f"{v:.6g}")  # noqa: E731
        return {"env_steps_per_s": r(self.env_steps_per_s), "train_samples_per_s": r(self.train_samples_per_s),
                "gradient_steps_per_s": r(self.gradient_steps_per_s), "bound": self.bound,
                "limits": {k: r(v) for k, v in self.limits.items()},
                "busy": {k: r(v) for k, v in self.busy.items()}, "roles": {k: r(v) for k, v in self.roles.items()},
                "times_s": {k: r(v) for k, v in self.times.items()}, "watts": r(self.watts),
                "watts_by_device": {k: r(v) for k, v in self.power_by_device.items()},
                "steps_per_joule": r(self.steps_per_joule), "power_source": self.power_source}


def _chunk(plan: Plan, work: Workload) -> int:
    """Env steps per insert (as hetrl/runtime/local.py layout() cuts them)."""
    w, N = plan.envs_per_actor, plan.actors
    if plan.schedule == "inline":
        return max(w, w * math.ceil(work.train_freq / w))
    if work.rollout:   # each actor's share of a rollout
        return max(w, work.train_freq // N)
    return chunk_size(work.train_freq, N, w, work.batched_insert, work.insert_chunk)


def learner_group(plan: Plan, work: Workload) -> int:
    """Gradient steps per learner call under the plan (as the schedules group them)."""
    if work.rollout:   # a phase's minibatches, GROUP_MAX a call at most (the learner core's rollout phase)
        return max(1, min(work.grads_per_phase, GROUP_MAX))
    if plan.schedule == "inline" and not work.prioritized:
        return work.grads_per_phase
    return group_size(work.grads_per_phase, work.prioritized, work.priority_lag)


def _per_publish(plan: Plan, work: Workload) -> int:
    return max(1, work.grads_per_phase * work.publish_interval)


def prefetches(plan: Plan, table: ProfileTable, work: Workload, cores: float | None = None) -> bool:
    """Whether the plan's learner loop draws its next group in a prefetch thread: the local schedule,
    allowed by the settings and the priority lag, measured faster than the draw in line (profile) for its
    learner, and, for a CPU learner, with a core the actor processes and the learner's threads leave free
    (`cores`: ours, default the profiled machine's). The profile times the thread beside the learner alone;
    where the actors hold the other cores it takes turns on the learner's core instead (a TD3 run on 2 cores,
    one actor process and a one-thread learner, ran 1.35x slower with the thread than without)."""
    group = learner_group(plan, work)
    free = plan.learner_device != "cpu" or plan.actors + plan.threads < (table.cores if cores is None else cores)
    return plan.schedule != "inline" and work.prefetch and free \
        and prefetch_fits(group, work.prioritized, work.priority_lag) \
        and table.prefetch_pays(plan.learner_device, work.prioritized, group)


def learner_shares_cores(plan: Plan, cores: float) -> bool:
    """A multi-threaded CPU learner whose threads and the actor processes outnumber the cores."""
    return (plan.schedule != "inline" and plan.learner_device == "cpu" and plan.threads > 1
            and plan.actors + plan.threads > cores)


def predict(plan: Plan, table: ProfileTable, work: Workload, cores: float | None = None) -> Prediction:
    """The model's figures for ``plan`` (see the module docstring for the formulas). ``cores``:
    the cores that are ours (default: the profiled machine's; a fraction on a shared machine)."""
    first = _predict(plan, table, work, cores, 1.0)
    if not learner_shares_cores(plan, table.cores):
        return first
    rho = min(1.0, first.env_steps_per_s * first.times["act_per_step"])   # actor cores kept busy
    return _predict(plan, table, work, cores, 1.0 + (SPIN - 1.0) * rho)


@dataclass
class _Parts:
    """The model's terms of a plan apart from the learner's updates (seconds; see the module docstring)."""

    a: float          # acting per env step
    i: float          # inserting per env step
    s: float          # drawing per gradient step
    u: float          # priorities per gradient step
    y: float          # publishing per gradient step
    n: int            # env steps per insert
    kg: int           # gradient steps per learner call
    i_ds: float       # the data storage's share of an insert of n
    keys: float       # the replay manager's draw of kg batches
    gather: float     # the data storage's gather of kg batches
    x_batch: float    # the batches' transfer to the learner


def _parts(plan: Plan, T: ProfileTable, work: Workload) -> _Parts:
    w, B, b = plan.envs_per_actor, plan.batch_size, T.bytes_per_transition
    L, DS, RM, INF = plan.learner_device, plan.storage_device, plan.replay_device, plan.actor_inference_device
    p = 1.0 if work.prioritized else 0.0
    n = _chunk(plan, work)
    i_ds = T.op("ds_insert", DS, n) + T.xfer("cpu", DS, n * b)
    i = (i_ds + p * T.op("rm_insert", RM, n) + (0.0 if plan.schedule == "inline" else T.ipc(IPC_MESSAGE_BYTES))) / n
    kg = learner_group(plan, work)
    keys = T.op("rm_sample" if work.prioritized else "rm_uniform", RM, kg * B)
    gather = T.op("ds_gather", DS, kg * B)
    x_batch = T.xfer(DS, L, kg * B * b) + T.xfer(RM, L, WEIGHT_BYTES * kg * B)
    s = (keys + T.xfer(RM, DS, KEY_BYTES * kg * B) + gather + x_batch) / kg
    u = p * (T.xfer(L, RM, TD_BYTES * B) + T.op("rm_update", RM, B))
    y = T.param_sync(L) / _per_publish(plan, work)
    return _Parts(T.act(w, INF) / w, i, s, u, y, n, kg, i_ds, keys, gather, x_batch)


def loop_excess(plan: Plan, table: ProfileTable, work: Workload) -> float:
    """Seconds per env step that the inline loop measured (profile/loop.py) beyond the model's parts, as this plan
    pays them: an inline plan all of it; a local plan its learner process's share, the loop's excess less its
    acting's (an inline actor acts between two updates, which evict its policy from the caches; a local actor
    acts in a process of its own). 0 where the profile has no loop: a GPU learner, an on-policy workload."""
    if plan.learner_device != "cpu" or work.rollout:
        return 0.0
    got = table.loop("cpu", plan.threads)
    if got is None:
        return 0.0
    ref = Plan("inline", 1, int(got.get("envs", plan.envs_per_actor)), batch_size=plan.batch_size,
               threads=plan.threads)
    q = _parts(ref, table, work)
    side = q.i + work.replay_ratio * (q.s + q.u + q.y)
    if plan.schedule == "inline":
        return max(0.0, float(got["s"]) - q.a - side)
    return max(0.0, float(got["s"]) - float(got.get("act_s", 0.0)) - side)


def _learn(plan: Plan, T: ProfileTable, kg: int, spin: float) -> float:
    """l, seconds per gradient step: what a run of this workload measured under this schedule at these threads
    (in_run), else the profile's inline loop at exactly these threads, moved to the plan's steps per call by the
    learner entries' ratio between the two group sizes, else the learner entries. The loop's updates are the run's
    kernel on real batches between the other work of a phase, as an inline and a local learner both make them; the
    learner entries time synthetic batches back to back, and missed a local run by more than the loop missed an
    inline one (docs/planner.md, "The loop, timed whole"). Scaled by `spin` where a local plan's threads share
    cores with the actors."""
    L, B = plan.learner_device, plan.batch_size
    ran = T.in_run(L, B, plan.threads, kg, plan.schedule)
    if ran is not None:
        return float(ran["s"])
    loop = T.loop(L, plan.threads)
    if loop is not None and loop.get("threads") == plan.threads and loop.get("learn_s"):
        at = T.learn_step(L, B, plan.threads, max(1, round(float(loop.get("group", 1)))), calibrated=False)
        if at > 0:
            return float(loop["learn_s"]) * T.learn_step(L, B, plan.threads, kg, calibrated=False) / at * spin
    return T.learn_step(L, B, plan.threads, kg) * spin


def _predict(plan: Plan, table: ProfileTable, work: Workload, cores: float | None, spin: float) -> Prediction:
    C = float(cores or table.cores)
    T, w, N, B = table, plan.envs_per_actor, plan.actors, plan.batch_size
    L, DS, RM, INF = plan.learner_device, plan.storage_device, plan.replay_device, plan.actor_inference_device
    rr = work.replay_ratio
    inline = plan.schedule == "inline"

    q = _parts(plan, T, work)
    a, i, s, u, y, n, kg = q.a, q.i, q.s, q.u, q.y, q.n, q.kg
    i_ds, keys, gather, x_batch = q.i_ds, q.keys, q.gather, q.x_batch
    l = _learn(plan, T, kg, spin)
    t_learn = plan.threads if L == "cpu" else 1
    prefetch = prefetches(plan, T, work, C)
    g = (max(s, l) if prefetch else s + l) + u + y
    gc = s + t_learn * l + u + y
    e = loop_excess(plan, T, work)                          # what the real loop adds to the parts
    m, mc = i + rr * g + e, i + rr * gc + e
    cpu_per_step = a + mc

    r = t_learn if inline else N + t_learn                       # our runnable threads
    phys = max(float(T.cores), math.ceil(C))                     # the cores they switch on
    c_eff = C / (1.0 + KAPPA * max(0.0, r - phys) / phys) if not inline else C
    if inline:
        limits = {"inline": 1.0 / (a + m)}
        if C < t_learn:                                          # fewer cores than the learner's threads
            limits["cpu"] = C / (a + mc)
        X = min(limits.values())
        shares = {"acting": a, "learning": rr * (l + y), "replay": i + rr * (s + u - x_batch / kg),
                  "transfers": rr * x_batch / kg}
        bound = "inline-" + max(shares, key=shares.get) if X == limits["inline"] else "cpu"
    else:
        if work.overlap:
            limits = {"actors": N / a, "learner": 1.0 / m, "cpu": c_eff / cpu_per_step}
        else:  # lockstep: a collect round (actors in parallel), then the learner
            limits = {"lockstep": 1.0 / (a / min(N, c_eff) + m), "cpu": c_eff / cpu_per_step}
        X = min(limits.values())
        order = ("learner", "lockstep", "cpu", "actors")  # on a tie, name the learner first
        bound = min(limits, key=lambda key: (limits[key], order.index(key)))

    # busy fractions
    busy = {"cpu": min(1.0, X * cpu_per_step / C)}
    gpu_time: dict[str, float] = {}
    for dev, t in ((L, rr * l), (DS, i_ds / n + rr * gather / kg), (INF, T.infer(INF, w) / w)):
        if dev != "cpu":
            gpu_time[dev] = gpu_time.get(dev, 0.0) + t
    if RM != "cpu":
        p = 1.0 if work.prioritized else 0.0
        gpu_time[RM] = gpu_time.get(RM, 0.0) + p * T.op("rm_insert", RM, n) / n + rr * (keys / kg + u)
    for dev, t in gpu_time.items():
        busy[dev] = min(1.0, X * t)
    roles = {"actor": min(1.0, X * a / N) if not inline else min(1.0, X * a),
             "learner": min(1.0, X * m)}

    # power
    watts_by, sources = {}, set()
    pc = T.power("cpu")
    watts_by["cpu"] = pc.idle_w + pc.busy_w * busy["cpu"] * C
    sources.add(pc.source)
    for dev in gpu_time:
        pg = T.power(dev)
        watts_by[dev] = pg.idle_w + (pg.busy_w - pg.idle_w) * busy[dev]
        sources.add(pg.source)
    watts = sum(watts_by.values())
    src = "estimated" if sources == {"estimated"} else ("partly estimated" if "estimated" in sources else "measured")
    times = {"act_per_step": a, "insert_per_step": i, "sample": s, "learn": l, "update_priorities": u,
             "param_sync": y, "transfer_per_grad": x_batch / kg, "main_per_grad": g, "main_per_step": m,
             "main_cpu_per_step": mc, "loop_excess_per_step": e, "insert_chunk": float(n), "group": float(kg),
             "cores_effective": c_eff}
    return Prediction(plan, X, X * rr * B, X * rr, bound, limits, busy, roles, times, watts,
                      X / watts if watts > 0 else 0.0, src, watts_by)


def bottleneck_words(pred: Prediction, cores: float) -> str:
    """The binding limit, in words, with what would (not) help."""
    p, t = pred.plan, pred.times
    main = t["main_per_grad"] or 1.0
    share = lambda key: 100.0 * t[key] / main  # noqa: E731
    parts = f"learn {share('learn'):.0f}%, sample {share('sample'):.0f}%"
    if t["update_priorities"]:
        parts += f", priorities {share('update_priorities'):.0f}%"
    if t["transfer_per_grad"] > 0.2 * main:
        parts += f"; transfers {share('transfer_per_grad'):.0f}% of it: keep the data storage on the learner's device"
    if pred.bound == "learner":
        return (f"learner-bound: the learner process does {pred.gradient_steps_per_s:,.0f} gradient steps/s "
                f"({parts}); more actors would not help, a faster learner (device, threads) would")
    if pred.bound == "actors":
        more = "more actors" if p.actors + (p.threads if p.learner_device == "cpu" else 1) < cores else \
            "more envs per actor (cores are all taken)"
        return (f"actor-bound: {p.actors} actor(s) x {p.envs_per_actor} envs step at most "
                f"{pred.limits['actors']:,.0f} env steps/s; {more} would help")
    if pred.bound == "lockstep":
        return (f"lockstep-bound: actors and learner take turns (overlap=false, or an on-policy algorithm: each "
                f"rollout is learned before the next is collected), {pred.env_steps_per_s:,.0f} env steps/s")
    if pred.bound == "cpu":
        runnable = p.actors + (p.threads if p.learner_device == "cpu" else 1)
        lost = 1 - t["cores_effective"] / cores
        over = f", {runnable} busy threads cost {100 * lost:.0f}% of them in switching" if lost > 0.005 else ""
        return (f"CPU-bound: actors, learner and replay use all {cores:g} cores{over}; more processes would "
                "not help, a faster learner device or cheaper envs would")
    # inline
    tot = t["act_per_step"] + t["main_per_step"]
    acting = 100.0 * t["act_per_step"] / tot
    what = pred.bound.split("-", 1)[1]
    kind = {"acting": "actor-bound", "learning": "learner-bound", "replay": "replay-bound",
            "transfers": "transfer-bound"}[what]
    return (f"{kind} (inline: one process alternates; acting {acting:.0f}% of the time, learner + replay "
            f"{100 - acting:.0f}%); overlapping them (schedule=local) pays only with a spare core")
