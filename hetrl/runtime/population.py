"""A population's transport: every member's parts in one process, the members side by side.

    members' envs  --one vector env (member m: envs m*n .. m*n+n-1)-->  one collect, policies stacked
    each member    --its own replay (sampler, priorities), learner core (algorithm, kernel, counters)-->
    one learner call: every member's phase, members as lanes over the cores (kernels that release the GIL)

Each member runs exactly what its own inline run would: its envs are seeded as that run's, its acting
policy draws from its own RNG, its replay samples with its own seed and its learner draws from its own
generator, so member i equals the inline run of seed i (tests/test_population.py). The members share one
clock: a member's wall time is the population's.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from hetrl.actors import Actor
from hetrl.actors.envs import EnvSpec
from hetrl.config import Config
from hetrl.errors import HetrlError
from hetrl.runtime.core import Counters, LearnerCore, Schedule, give_back_freed_memory
from hetrl.runtime.params import InProcessParameterStore


class StackedForward:
    """One call of the members' policy networks for all their envs, their weights stacked (torch.func: the
    network's own forward, vmapped over the members); None where the network does not vmap (it is then called
    member by member)."""

    def __init__(self, nets: list[torch.nn.Module]):
        from torch.func import functional_call, stack_module_state, vmap

        self.nets = nets
        self.params, self.buffers = stack_module_state(nets)
        base = copy.deepcopy(nets[0]).to("meta")
        self.call = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)))

    @classmethod
    def of(cls, nets: list) -> "StackedForward | None":
        if len(nets) < 2 or not all(isinstance(n, torch.nn.Module) and type(n) is type(nets[0]) for n in nets):
            return None
        try:
            return cls(nets)
        except Exception:   # a network torch.func cannot stack: member by member
            return None

    @torch.no_grad()
    def refresh(self, m: int) -> None:
        """Member m's network changed (new weights from the parameter store)."""
        for name, t in self.nets[m].named_parameters():
            self.params[name][m].copy_(t)
        for name, t in self.nets[m].named_buffers():
            self.buffers[name][m].copy_(t)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor):
        return self.call(self.params, self.buffers, x)


@contextlib.contextmanager
def _precomputed(net: torch.nn.Module, obs: np.ndarray, out):
    """`net`'s forward answers with `out`, the outputs the stacked call computed for the rows of `obs` (a policy
    may ask for some of them only: DQN's greedy envs)."""
    rows = {obs[i].tobytes(): i for i in range(len(obs))}

    def forward(x):
        x = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        if len(x) == len(obs) and np.array_equal(x, obs):
            return out
        idx = torch.as_tensor([rows[r.astype(obs.dtype).tobytes()] for r in x], dtype=torch.long)
        return tuple(o[idx] for o in out) if isinstance(out, tuple) else out[idx]

    net.forward = forward
    try:
        yield
    finally:
        del net.forward


class StackedPolicy:
    """The acting policies of a population's members side by side: member m acts for envs m*n .. m*n+n-1, with
    its own exploration value (`explore` is a list, one per member) and its own RNG; their networks answer in one
    stacked call (StackedForward) where that applies, each member's policy logic then taking its rows."""

    def __init__(self, policies: list, envs: int):
        self.policies, self.n = policies, envs
        nets = [getattr(p, "net", None) for p in policies]
        self.stacked = StackedForward.of(nets) if all(nets) else None

    def _slices(self):
        return ((m, p, slice(m * self.n, (m + 1) * self.n)) for m, p in enumerate(self.policies))

    def _outputs(self, obs: np.ndarray):
        if self.stacked is None:
            return None
        x = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        try:
            return self.stacked(x.reshape(len(self.policies), self.n, *x.shape[1:]))
        except Exception:   # the network's forward does not vmap (e.g. a layout change): member by member
            self.stacked = None
            return None

    def act(self, obs: np.ndarray, explore: list) -> tuple[np.ndarray, np.ndarray]:
        out = self._outputs(obs) if any(e is not None for e in explore) else None   # warm-up: random actions
        acts = []
        for m, p, s in self._slices():
            if out is None:
                acts.append(p.act(obs[s], explore[m]))
                continue
            with _precomputed(p.net, np.asarray(obs[s], dtype=np.float32),
                              tuple(o[m] for o in out) if isinstance(out, tuple) else out[m]):
                acts.append(p.act(obs[s], explore[m]))
        return np.concatenate([a[0] for a in acts]), np.concatenate([a[1] for a in acts])

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        return np.concatenate([p.act_deterministic(obs[s]) for _, p, s in self._slices()])

    def load_member(self, m: int, state: dict) -> None:
        self.policies[m].load(state)
        if self.stacked is not None:
            self.stacked.refresh(m)

    def episode_end(self, done: np.ndarray) -> None:
        for _, p, s in self._slices():
            if done[s].any():
                p.episode_end(done[s])


class MemberSchedule(Schedule):
    """One member of a population seen as a schedule of its own (its core and replay): what a Run saves,
    evaluates and reports of it. The population's transport drives it; it never steps by itself."""

    name = "inline"

    def __init__(self, population: "PopulationSchedule", index: int):
        self.population, self.index = population, index
        self.core, self.replay = population.cores[index], population.replays[index]
        self._episodes: list = []

    def _step(self) -> None:
        raise HetrlError("a population member is stepped by its population")

    def done(self) -> bool:
        return self.c.env_steps >= self.core.cfg.steps

    def close(self) -> None:
        self.population.close()

    def _restart_actors(self) -> None:
        self.population.stale = True   # every member loaded: one new actor at the next phase


class PopulationSchedule:
    """The members of a population (their configs differ only in seed and swept settings that keep shapes and
    step schedules) trained side by side in this process; `lanes`: member phases learned at once."""

    name = "inline"
    PHASE_S = 0.0

    def __init__(self, cfgs: list[Config], env: EnvSpec, lanes: int = 0):
        if not cfgs:
            raise HetrlError("a population needs at least one member")
        self.cfgs, self.env = cfgs, env
        self.cores: list[LearnerCore] = []
        self._closed = False
        try:
            for cfg in cfgs:   # one thread each: the members are the lanes
                self.cores.append(LearnerCore(cfg, env, threads=1))
        except BaseException:
            for core in self.cores:
                core.close()
            raise
        self.replays = [core.make_replay() for core in self.cores]
        self.params = [InProcessParameterStore() for _ in self.cores]
        for core, store in zip(self.cores, self.params):
            core.attach(store)
        self.members = [MemberSchedule(self, i) for i in range(len(cfgs))]
        self.versions = [-1] * len(cfgs)
        self.lanes = max(1, min(lanes or os.cpu_count() or 1, len(cfgs)))
        # phases of members in threads only where the kernel runs without the GIL (the compiled one): torch's
        # eager ops on small networks hold it most of the time, and a loop is then faster
        self.parallel = self.lanes > 1 and all(core.kernel.side_by_side() for core in self.cores)
        self._pool = ThreadPoolExecutor(self.lanes, thread_name_prefix="hetrl-member") if self.parallel else None
        # on a GPU with the CUDA-graph kernel: every member's phase replayed from one graph, the members as parallel
        # branches (the GPU runs their small kernels side by side)
        self.graph = None
        if len(cfgs) > 1 and all(core.kernel.name == "cuda_graph" for core in self.cores):
            from hetrl.kernels.cuda_graph import MembersGraph

            self.graph = MembersGraph([core.algo for core in self.cores])
        self.actor: Actor | None = None
        self.stale = False
        self._episodes: list[list] = [[] for _ in cfgs]
        self._restart_actors()

    # ---- the parts ---------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.cores)

    @property
    def c(self) -> Counters:
        return self.cores[0].c

    def _restart_actors(self) -> None:
        """One actor over every member's envs, each env seeded as its member's own inline run seeds it."""
        if self.actor is not None:
            self.actor.close()
        n = self.cfgs[0].num_envs
        specs = [core.actor_spec(0, n) for core in self.cores]
        seeds = [s.env_seed + j for s in specs for j in range(n)]
        s0 = specs[0]
        self.actor = Actor(s0.env, n * self.size, s0.env_seed, StackedPolicy([s.policy for s in specs], n),
                           s0.n_step, s0.gamma, s0.backend, groups=self.size, seeds=seeds)
        for m in range(self.size):
            self._load(m, *self.params[m].latest(-1))

    def _load(self, m: int, state: dict, version: int) -> None:
        self.actor.policy.load_member(m, state)
        self.versions[m] = version

    # ---- the protocol, one phase of every member ------------------------------------------------------
    def phase(self) -> list[list[tuple[float, int]]]:
        """Collect train_freq env steps of every member, insert each member's into its replay, learn what each
        member's replay ratio allows (members as lanes); the episodes each member finished meanwhile."""
        if self._closed:
            raise HetrlError("this population was closed; make a new run")
        if self.stale:   # members loaded from checkpoints: actors seeded for their step counts
            self.stale = False
            self._restart_actors()
        if not self.done():
            self._step()
        eps, self._episodes = self._episodes, [[] for _ in self.cores]
        return eps

    def _step(self) -> None:
        cfg, M, actor = self.cfgs[0], self.size, self.actor
        n = cfg.num_envs
        t0 = time.perf_counter()
        base = [core.c.env_steps for core in self.cores]
        start = actor.env_steps
        n_collect, most = self.cores[0].ratio.to_collect()   # every member's run collects what member 0's does

        def explore(steps: int) -> list:
            done = (steps - start) // M
            return [core.algo.exploration(b + done) for core, b in zip(self.cores, base)]

        batch = actor.collect(M * n_collect, explore, limit=M * most)
        t1 = time.perf_counter()
        steps = (actor.env_steps - start) // M
        member = batch.pop("env", None) if batch is not None else None   # (a population of one has no groups)
        member = member // n if member is not None else np.zeros(len(batch["obs"]) if batch else 0, np.int64)
        for m, core in enumerate(self.cores):
            if batch is not None:
                rows = member == m
                if rows.any():
                    core.insert(self.replays[m], {k: v[rows] for k, v in batch.items()}, actor=m)
            core.inserted(steps, self.versions[m], busy_s=(t1 - t0) / M)
        # what each member's learner core allows now (its inline run's replay ratio)
        owed = [core.ratio.allowed(len(replay)) for core, replay in zip(self.cores, self.replays)]
        if self.graph is not None and owed[0] and len(set(owed)) == 1 and not cfg.prioritized \
                and not self.cores[0].rollout:   # (an on-policy phase is each core's own: learn_rollout)
            self._learn_together(owed[0])
        elif self._pool is not None and sum(1 for k in owed if k) > 1:
            list(self._pool.map(self._learn, [m for m, k in enumerate(owed) if k]))
        else:
            for m, k in enumerate(owed):
                if k:
                    self._learn(m)
        for m in range(M):
            new = self.params[m].latest(self.versions[m])
            if new is not None:
                self._load(m, *new)
        envs = np.asarray(actor.episode_envs, dtype=np.int64) // n
        for (ret, length), m in zip(actor.drain_episodes(), envs):
            self._episodes[m].append((ret, length))

    def _learn(self, m: int) -> None:
        """The gradient steps member m's learner core allows, as its inline run takes them."""
        self.cores[m].learn_from(self.replays[m])

    def _learn_together(self, n: int) -> None:
        """n gradient steps of every member, replayed from one CUDA graph with a branch per member."""
        B, M = self.cfgs[0].batch_size, self.size
        t0 = time.perf_counter()
        stacks, weights = [], []
        for core, replay in zip(self.cores, self.replays):
            batch, _, w = replay.sample(n * B, beta=core.beta())
            core.ratio.drawn(n)
            stacks.append({name: v.view(n, B, *v.shape[1:]) for name, v in batch.items()})
            weights.append(w.view(n, B))
        t1 = time.perf_counter()
        tds = self.graph.learn(stacks, weights)
        dt = (time.perf_counter() - t1) / M
        for core, td in zip(self.cores, tds):
            core.learned(td, n, dt)
            core.c.replay_s += (t1 - t0) / M

    def done(self) -> bool:
        return self.c.env_steps >= self.cfgs[0].steps

    # ---- the clock of every member -------------------------------------------------------------------
    def start_clock(self) -> None:
        for core in self.cores:
            core.start_clock()

    def tick(self) -> None:
        for core in self.cores:
            core.tick()

    def drop_replays(self) -> None:
        """Let go of the members' replays (training is over and they are saved; a replay saved with its member is
        in the member's run directory, replay.pt). Their memory is freed for what follows (the report), and the
        C allocator asked to return it to the system (malloc_trim)."""
        self.replays = [None] * len(self.replays)
        for m in self.members:
            m.replay = None
        give_back_freed_memory()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.actor is not None:
            self.actor.close()
        for core in self.cores:
            core.close()

    def __enter__(self) -> "PopulationSchedule":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
