"""The Python API, the one path every front end takes (the `hetrl` command, the SB3-style classes):

    run = hetrl.train("dqn", env="CartPole-v1", steps=50_000, seed=0)
    run.evaluate(episodes=10); run.save("runs/cartpole")
    policy = hetrl.load("runs/cartpole"); policy.act(obs)

`train` makes the config (the algorithm's defaults < its preset < the user's settings), checks the env
against the algorithm, plans the system (plan="auto": the planner sets config.SYSTEM_KEYS only), builds a
`Run` and drives it; `resume` continues a saved run under any schedule; `load` gives its policy.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import hetrl
from hetrl.actors.envs import FLATTENED, EnvSpec, env_name, prepare_env, probe_spaces, raw_observation_space
from hetrl.algos import make_algorithm
from hetrl.checkpoint import check_out_dir, read_checkpoint, read_replay, save_run, write_json
from hetrl.config import Config, make_config, migrate, read_config_file
from hetrl.errors import UsageError
from hetrl.evaluate import REPORT_SEED, Evaluations, evaluate
from hetrl.logger import Logger
from hetrl.runtime.launch import run_groups, stop_signals
from hetrl.runtime.population import (PopulationSchedule, is_population, make_members, parse_seeds, parse_sweep,
                                      read_population, write_members, write_population)


def _is_one(space: gym.Space, obs: Any) -> bool:
    """Whether `obs` is one observation of `space` (else a batch: a sequence of them, or a vector env's
    batched Tuple / Dict observation)."""
    if isinstance(space, gym.spaces.Discrete):
        return np.ndim(obs) == 0
    if isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return np.shape(obs) == space.shape
    return space.contains(obs)


def _observations(space: gym.Space, obs: Any) -> list:
    if _is_one(space, obs):
        return [obs]
    if isinstance(space, gym.spaces.Dict) and isinstance(obs, dict):    # a vector env's: key -> batch
        return [dict(zip(obs, parts)) for parts in zip(*obs.values())]
    if isinstance(space, gym.spaces.Tuple) and isinstance(obs, tuple):  # a vector env's: part -> batch
        return list(zip(*obs))
    return list(obs)


class Policy:
    """A trained policy: `act(obs)` gives the deterministic (greedy) env action(s)."""

    def __init__(self, algo, cfg: Config, env: EnvSpec, state: dict | None = None):
        self.algo, self.cfg, self.env = algo, cfg, env
        self._p = algo.make_policy(seed=cfg.seed)
        self._raw_space: gym.Space | None = None   # the env's own observation space, when act() needs it
        if state is not None:
            self._p.load(state)

    def act(self, obs: Any) -> np.ndarray:
        """obs: one observation or a batch, as the env gives them (Discrete, Tuple, Dict... observations
        are flattened as in training) or already as the flat float vectors the networks take."""
        obs = self._flat(obs)
        single = obs.shape == tuple(self.algo.obs_shape)
        a = self._p.act_deterministic(obs[None] if single else obs)
        return a[0] if single else a

    def sample(self, obs: Any, explore: float | None) -> np.ndarray:
        """The acting policy's env action(s), as in training: `explore` is the algorithm's exploration value
        (`algo.exploration(env_steps)`: epsilon, a noise scale; None: uniform random actions)."""
        obs = self._flat(obs)
        single = obs.shape == tuple(self.algo.obs_shape)
        a, _ = self._p.act(obs[None] if single else obs, explore)
        return a[0] if single else a

    def load(self, state: dict) -> None:
        """New parameters (the algorithm's `policy_state()`)."""
        self._p.load(state)

    def _flat(self, obs: Any) -> np.ndarray:
        shape = tuple(self.algo.obs_shape)
        if isinstance(obs, np.ndarray) and obs.dtype == np.float32 and obs.shape[obs.ndim - len(shape):] == shape:
            return obs   # the networks' own input
        if self._raw_space is None:
            self._raw_space = raw_observation_space(self.env)
        space = self._raw_space
        if not isinstance(space, FLATTENED):
            return np.asarray(obs, dtype=np.float32)
        return np.stack([gym.spaces.flatten(space, o) for o in _observations(space, obs)]).astype(np.float32) \
            .reshape((-1, *shape) if not _is_one(space, obs) else shape)

    def evaluate(self, episodes: int = 10, seed: int | None = None, video_dir: str | None = None) -> dict:
        if episodes <= 0:
            raise UsageError(f"episodes must be positive, got {episodes}")
        seed = self.cfg.seed + REPORT_SEED if seed is None else seed
        return evaluate(self.act, self.eval_env, episodes, seed, video_dir=video_dir,
                        max_steps=self.cfg.eval_max_steps)

    @property
    def eval_env(self) -> EnvSpec:
        """The env evaluations play: the training env's wrappers, unclipped rewards, whole games (Atari)."""
        return prepare_env(self.env, self.cfg, train=False)


class Run:
    """A training run: its config, the schedule that holds every part, its evaluations and figures. Over a
    population's schedule (hetrl/runtime/population.py) it is the population's run: `runs` are its members' runs
    (each a complete run in OUT/members/NAME), evaluated and saved with it, and it writes the population's files.

    `learn()` drives the schedule's phases until the run has its env steps, evaluates on the way (the best
    policy is kept: hetrl/evaluate.py), calls the user's callback at phase boundaries, and saves a checkpoint
    on every way out (finished, Ctrl-C / SIGTERM, an error). It closes the schedule when training ends unless
    `keep_open` (a model that will learn again, the SB3-style classes); so do `close()` and leaving a
    `with Run(...)` block."""

    def __init__(self, cfg: Config, env: EnvSpec, out: Path | None = None, save_replay: bool = False,
                 plan_info: dict | None = None, schedule=None, group: int | None = None):
        from hetrl.runtime import make_schedule

        self.cfg, self.env, self.out, self.save_replay = cfg, env, out, save_replay
        # `schedule`: one made elsewhere (a population's, a member's); else the one cfg.system.schedule names
        self.schedule = schedule if schedule is not None else make_schedule(cfg, env)
        self.members = getattr(self.schedule, "members", [])   # a population's (runtime/population.Member)
        self.runs = [Run(m.cfg, env, out / "members" / m.name if out is not None else None, save_replay, schedule=v)
                     for m, v in zip(self.members, self.schedule.views)] if self.members else [self]
        # group g of a population trained in groups writes its members and its progress (OUT/groups/g) only
        self.group = group
        self._finished = False
        self.schedule.keep_actors_state = save_replay   # a finished run's actors go into replay.pt too
        self.result: dict[str, Any] = {}
        self.interrupted: str | bool = False   # False, or what stopped it: "SIGINT", "SIGTERM", "callback"
        self.plan_info: dict[str, Any] = dict(plan_info or {})  # the planner's plan and predicted figures
        self.evaluations = Evaluations(cfg.eval_episodes, self._eval_interval(), cfg.seed, cfg.eval_max_steps)
        self._replay_saved = False
        from hetrl.planner.follow import follower   # the plan held against the measured rate (docs/planner.md)

        self.follow = follower(self.schedule, cfg, None if self.members else self.plan_info)

    def _eval_interval(self) -> int:
        return self.cfg.eval_interval or max(1, self.cfg.steps // 10)

    def close(self) -> None:
        self.schedule.close()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def algo(self):
        return self.schedule.algo

    @property
    def env_steps(self) -> int:
        return self.schedule.c.env_steps

    @property
    def best(self) -> dict:
        """The best evaluated policy: state, env_steps, eval_return_mean (empty before an evaluation)."""
        return self.evaluations.best

    @property
    def policy(self) -> Policy:
        """The run's policy: the best evaluated one when keep_best, else the latest."""
        if self.cfg.keep_best and self.best:
            return Policy(self.algo, self.cfg, self.env, self.best["state"])
        return self.last_policy

    @property
    def last_policy(self) -> Policy:
        return Policy(self.algo, self.cfg, self.env)

    # ---- state between phases (front ends: the SB3-style classes) ---------------------------------------
    def state_dict(self, with_replay: bool = False) -> dict:
        """The run's checkpoint state (the learner, its counters and RNG, the actors'; `with_replay`: the replay)."""
        return self.schedule.state_dict(with_replay=with_replay)

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint state of any schedule, before the first phase (the replay too if it holds one)."""
        self.schedule.load_state_dict(state)

    def replay_size(self) -> int:
        """Transitions in the replay."""
        return len(self.schedule.replay)

    def replay_state_dict(self) -> dict:
        return self.schedule.replay.state_dict()

    def load_replay_state_dict(self, state: dict) -> None:
        """A replay saved by replay_state_dict() (the same buffer_size and spaces), between phases."""
        self.schedule.replay.load_state_dict(state)

    def train_stats(self) -> dict[str, float]:
        """The algorithm's loss scalars of its last update (and an on-policy run's last rollout's figures), as
        floats (LearnerCore.train_stats): what a training log records as train/<name>."""
        return self.schedule.core.train_stats()

    def load_parameters(self, state: dict) -> None:
        """New parameters and optimizer state (the algorithm's state_dict()) between phases; actors get the policy."""
        self.schedule.core.load_algo(state)

    def set_lr_schedule(self, fn) -> None:
        """The learning rate as a function of the progress remaining (1 -> 0), set before each learner call
        (SB3's callable learning_rate); None: the optimizers keep theirs."""
        self.schedule.core.lr_at = fn

    def extend(self, steps: int) -> None:
        """Train to `steps` env steps in all (a later `learn()` goes on from where this run is)."""
        if steps <= self.env_steps:
            raise UsageError(f"steps={steps:,} is not beyond the {self.env_steps:,} env steps already done")
        self.cfg.steps = int(steps)   # the config object every part reads (exploration schedules, the ratio)
        self.evaluations.interval = self._eval_interval()
        self.evaluations.start(self.env_steps)
        self.schedule.extended()

    # ---- training ----------------------------------------------------------------------
    def learn(self, progress: bool = True, callback=None, keep_open: bool = False, stopped=None) -> "Run":
        """Train to cfg.steps. `callback`: an object with any of `training_start(run)`, `phase(run, episodes)`
        (returns False to stop the run) and `training_end(run)`, called in this process at phase boundaries.
        Ctrl-C or SIGTERM stops at the end of the current phase and saves; so does `stopped(env_steps)` turning
        true before a phase (a population group's driver asking)."""
        s = self.schedule
        if self.members and self.group is None and self.out is not None:   # what --resume needs, before training
            write_members(self.out, self.members, s.spec)
        log_dir = self.out / "groups" / str(self.group) if self.group is not None else self.out
        logger = Logger(log_dir, self.cfg.steps, self.cfg.system.log_interval, progress, start_step=s.c.env_steps)
        for r in self.runs:
            r.evaluations.start(s.c.env_steps)
        self.interrupted = False
        s.start_clock()
        try:
            with stop_signals() as stop:
                _hook(callback, "training_start", self)
                while not s.done() and not stop:
                    if stopped is not None and stopped(s.c.env_steps):
                        stop.signal = "stopped by the population's driver"
                        break
                    eps = s.phase()
                    s.tick()
                    self.follow.phase()
                    # (a phased schedule has every env step in a phase before it is done: the last evaluation is
                    # the finished run's)
                    done = s.done()
                    for r in self.runs:
                        if r.evaluations.due(s.c.env_steps, done) and (done or s.c.env_steps < self.cfg.steps):
                            with s.clock_paused():
                                r.evaluate_now(logger if r is self else None)
                    logger.episodes(eps)
                    if logger.due(s.c.env_steps):
                        f = s.figures()
                        logger.update(f["env_steps"], f["wall_s"], f["env_steps_per_s"], f["train_samples_per_s"],
                                      len(logger.returns))
                    if _hook(callback, "phase", self, eps) is False:
                        self.interrupted = "callback"
                        break
            self.interrupted = stop.signal or self.interrupted
            _hook(callback, "training_end", self)
            self.follow.finish(str(self.out or ""))
            self._finished = True
            self.result = self._result()
            self._calibrate()
            if self.out is not None:
                self.save(self.out, replay=self.save_replay)
        except BaseException as e:  # the env's error, a second Ctrl-C, ...: keep what was learned, then re-raise
            self.interrupted = "SIGINT" if isinstance(e, KeyboardInterrupt) else f"error: {type(e).__name__}: {e}"
            if self.out is not None and s.c.env_steps:
                with contextlib.suppress(Exception):
                    self.result = self._result()
                    if getattr(e, "learner_ok", True):  # never checkpoint a learner that went non-finite
                        self.save(self.out, replay=self.save_replay)
                        print(f"hetrl: stopped by {self.interrupted.split(':')[0]} at {s.c.env_steps:,} env steps; "
                              f"checkpoint saved in {self.out} (continue with `hetrl train --resume {self.out}`)",
                              file=sys.stderr)
                    else:
                        self.out.mkdir(parents=True, exist_ok=True)
                        write_json(self.result, self.out / "result.json")
            self.schedule.close()
            raise
        finally:
            logger.close()
        if not keep_open:
            self.schedule.close()
        return self

    def evaluate_now(self, logger: Logger | None = None) -> dict:
        """One of the evaluations during training: the latest policy, kept if it is the best so far."""
        last = self.last_policy
        ev = self.evaluations.run(last.act, last.eval_env, self.env_steps, self.algo.policy_state)
        if logger is not None:
            logger.scalar("eval/return_mean", ev["eval_return_mean"], self.env_steps)
        return ev

    def _calibrate(self) -> None:
        """A planned run feeds its measured learner time back into the profile the plan came from,
        so the next plan on this machine predicts with the learner's speed as last measured (result.json: `calibration`)."""
        plan = self.plan_info.get("plan") or {}
        path = (plan.get("profile") or {}).get("path")
        c = self.schedule.c
        if not path or not c.phases or self.interrupted or self.members:
            return
        from hetrl.planner.profile import calibrate

        # against the profile at the threads the learner mostly ran with: the governor gives up threads to
        # other processes' load (an actor process, a neighbour's job), which is not this machine's speed
        threads, learner_s, steps = self.schedule.core.governor.mostly()
        entry = calibrate(path, plan["plan"]["learner_device"], self.cfg.batch_size, threads,
                          c.gradient_steps / c.phases, learner_s, steps, run=str(self.out or ""),
                          provisional=self.follow.loaded(), kernel=self.schedule.core.kernel.name)
        if entry is not None:
            self.result["calibration"] = entry
            self.plan_info["calibration"] = entry

    def evaluate(self, episodes: int | None = None, video_dir: str | None = None) -> dict:
        """Evaluate the run's policy (the best one when keep_best) on fresh seeds; also the latest
        policy, as final_eval_return_mean, when they differ."""
        if self.members:   # every member's, as its own run evaluates
            return [r.evaluate(episodes) for r in self.runs]
        n = episodes or self.cfg.eval_episodes or 10
        ev = self.policy.evaluate(n, video_dir=video_dir)
        self.result.update(ev)
        if self.cfg.keep_best and self.best:
            last = self.last_policy.evaluate(n)
            self.result.update(final_eval_return_mean=last["eval_return_mean"],
                               final_eval_return_std=last["eval_return_std"])
        return ev

    def _result(self) -> dict:
        if self.members:
            return {**self.schedule.figures(), "interrupted": self.interrupted, **self.plan_info}
        best = self.best
        return {"algo": self.cfg.algo, "env": env_name(self.env), "seed": self.cfg.seed,
                "schedule": self.cfg.system.schedule, **self.schedule.figures(),
                "batch_size": self.cfg.batch_size, "num_envs": self.cfg.num_envs,
                "device": str(self.schedule.device), "interrupted": self.interrupted,
                "eval_s": self.evaluations.seconds, "policy": "best" if self.cfg.keep_best and best else "last",
                **({"best_env_steps": best["env_steps"], "best_select_return_mean": best["eval_return_mean"]}
                   if best else {}),
                "evaluations": self.evaluations.history,
                "hetrl_version": hetrl.__version__, "torch_version": torch.__version__,
                **self.plan_info, **self.follow.figures(), "config": self.cfg.to_dict(), **_evals(self.result)}

    # ---- persistence ---------------------------------------------------------------------
    def save(self, path: str | Path, replay: bool | None = None) -> Path:
        """checkpoint.pt (+ replay.pt) and result.json in `path` (hetrl/checkpoint.py); a population's: every
        member's run directory, then OUT/result.json with the report and OUT/curves.png."""
        if self.members:
            for r in self.runs:
                r.save(r.out, replay)
            if self._finished:   # the replays are saved: let them go before the report loads its libraries
                self.schedule.drop_replays()
            if self.group is None:
                self.result = write_population(Path(path), self.members, self.schedule.spec, self.schedule.figures(),
                                               {"interrupted": self.interrupted, **self.plan_info})
            return Path(path)
        replay = (self.save_replay and not self._replay_saved) if replay is None else replay
        state = self.state_dict(with_replay=False)
        evals = self.evaluations.state_dict()
        state["best"], state["evaluations"] = evals["best"], evals["history"]
        self.result = {**self._result(), **_evals(self.result)}
        d = save_run(Path(path), config=self.cfg.to_dict(), env=env_name(self.env), state=state, result=self.result,
                     replay={**self.replay_state_dict(), "actors": self.schedule.actors_state()} if replay else None)
        self._replay_saved = self._replay_saved or bool(replay)
        return d


def _hook(callback, name: str, *args):
    """callback.<name>(*args) if the callback has it."""
    fn = getattr(callback, name, None) if callback is not None else None
    return fn(*args) if fn is not None else None


def _evals(result: dict) -> dict:
    return {k: v for k, v in result.items() if k.startswith(("eval_", "final_eval_"))}


def auto_plan(cfg: Config, settings: dict[str, Any], objective: str = "throughput",
              quiet: bool = False, allow_more_envs: bool = False, env: EnvSpec | None = None
              ) -> tuple[Config, dict[str, Any]]:
    """The planner's best plan around the settings the user gave by hand (they are pins):
    (cfg with the plan applied, the plan and its predicted figures for result.json).

    The planner chooses only the system's settings (config.SYSTEM_KEYS: schedule, device, threads,
    actors x envs_per_actor = num_envs, the env backend, prefetch; `PlanResult.system_settings` is where
    they are set); what changes learning is the preset's (and the user's), num_envs included.
    allow_more_envs lets it raise the env count for throughput (not where the user set num_envs by hand);
    then a line says that the learning dynamics change. result.json's `plan` lists `owned_by_preset`
    (every preset-owned setting and its value), `chosen` (what the planner set) and
    `changed_learning_settings` (empty unless opted in)."""
    import dataclasses

    from hetrl.config import SYSTEM_KEYS
    from hetrl.planner import plan
    from hetrl.planner.search import pins_from_settings

    def note(msg: str) -> None:
        if not quiet:
            print(f"hetrl: {msg}", file=sys.stderr, flush=True)

    if allow_more_envs and "num_envs" in settings:
        note(f"num_envs={cfg.num_envs} was set by hand: the planner keeps it (--allow-more-envs ignored)")
        allow_more_envs = False
    pins = pins_from_settings({k: v for k, v in settings.items() if k != "schedule"} if cfg.system.schedule == "ray"
                              else settings)
    cores = None
    if cfg.system.schedule == "ray":  # plan the cluster's CPUs as one pool of actors around the learner
        from hetrl.runtime.ray_schedule import cluster_cpus, connect

        connect(cfg)
        pins["schedule"], cores = "local", cluster_cpus()
    result = plan(cfg, objective=objective, pins=pins, progress=note, cores=cores, allow_more_envs=allow_more_envs,
                  env=env if env is not None and not isinstance(env, str) else None)
    p = result.plan
    shape = f"{p.actors} actors x {p.envs_per_actor} envs" if p.schedule != "inline" else f"{p.envs_per_actor} envs"
    sched = p.schedule if cfg.system.schedule != "ray" else f"ray (planned as local over the cluster's {cores} CPUs)"
    at = "with more envs than the preset's" if result.learning_changes else "at the preset's settings"
    note(f"plan ({objective}): {sched}, {shape}, learner on {p.learner_device}; predicted "
         f"{result.predicted_env_steps_per_s:,.0f} env steps/s {at} ({result.bottleneck}); "
         "`hetrl plan` explains it")
    for line in result.notes:
        if "learning dynamics" in line or "provisional" in line or "busy now" in line:   # (docs/planner.md)
            note(line)
    chosen = result.system_settings(cfg, pinned=settings)
    new = result.apply(cfg, pinned=settings)
    if cfg.system.schedule == "ray":
        from hetrl.runtime.ray_schedule import cluster_env_backend

        backend, why = cluster_env_backend(new.system.env_backend)   # measured here; the actors may run on any node
        new = new.replace(schedule="ray", env_backend=backend)
        if why:
            note(why)
    before, after = cfg.to_dict(), new.to_dict()
    chosen_keys = [k for k in chosen if k in SYSTEM_KEYS and k not in settings]
    changed = {k: [before[k], after[k]] for k in after if after[k] != before[k] and k not in SYSTEM_KEYS}
    owned = {k: v for k, v in before.items() if k not in SYSTEM_KEYS and k not in ("algo", "env", "seed")}
    info = {**result.to_json(), "objective_meaning": result.objective_meaning, "allow_more_envs": allow_more_envs,
            "owned_by_preset": owned,
            "chosen": {**{k: after[k] for k in chosen_keys}, **{k: v[1] for k, v in changed.items()}},
            "changed_learning_settings": changed}
    return new, {"plan": info, "predicted_env_steps_per_s": result.predicted_env_steps_per_s,
                 "predicted_train_samples_per_s": result.predicted_train_samples_per_s}


def _overrides(config: str | Path | dict | None, settings: dict[str, Any], hyperparams=None, algo: str = "",
               env: EnvSpec = "") -> dict[str, Any]:
    """The user's settings: `settings` over `config` (a file or a dict) over an rl-baselines3-zoo file's entry
    (`hyperparams`, hetrl/sb3/zoo.py), old keys migrated."""
    base = read_config_file(config) if isinstance(config, (str, Path)) else dict(config or {})
    over = migrate({**base, **{k: v for k, v in settings.items() if v is not None}})
    if hyperparams is not None:
        from hetrl.sb3 import zoo

        over = {**zoo.settings(hyperparams, algo.lower(), env_name(env) if not isinstance(env, str) else env), **over}
    return over


def default_out(cfg: Config, members: int = 0) -> Path:
    """Where `hetrl train` saves a run it is not told where to: runs/ALGO-ENV-sSEED (a population: -popN)."""
    return Path(f"runs/{cfg.algo}-{cfg.env.replace(':', '_').replace('/', '_')}-"
                + (f"pop{members}" if members else f"s{cfg.seed}"))


def prepare(algo: str, env: EnvSpec = "CartPole-v1", steps: int | None = None, seed: int | None = None,
            out: str | Path | bool | None = None, force: bool = False, config: str | Path | dict | None = None,
            plan: str = "auto", objective: str = "throughput", allow_more_envs: bool = False, progress: bool = True,
            hyperparams: str | Path | None = None, members: int = 0, **settings: Any
            ) -> tuple[Config, Path | None, dict[str, Any]]:
    """What `train` does before it trains: the checked config, the run directory (checked writable) and the
    plan: (cfg with the plan's system settings, out, the plan's figures for result.json). `hyperparams`: an
    rl-baselines3-zoo file (hetrl/sb3/zoo.py), under `config` and `settings`; `members`: a population's count."""
    if plan not in ("auto", "none"):
        raise UsageError(f"plan={plan!r} is not supported; use 'auto' or 'none'")
    over = _overrides(config, {"steps": steps, "seed": seed, **settings}, hyperparams, algo, env)
    cfg = make_config(algo, env_name(env) if not isinstance(env, str) else env, over)
    from hetrl import registry

    registry.get(cfg.algo).check_spaces(*probe_spaces(prepare_env(env, cfg)))   # one clear line, before planning
    out_path = default_out(cfg, members) if out is True else Path(out) if out not in (None, False) else None
    if out_path is not None:  # before any profiling or training
        check_out_dir(out_path, force)
    planned: dict[str, Any] = {}
    if plan == "auto":
        cfg, planned = auto_plan(cfg, over, objective, quiet=not progress, allow_more_envs=allow_more_envs, env=env)
    return cfg, out_path, planned


def train(algo: str, env: EnvSpec = "CartPole-v1", steps: int | None = None, seed: int | None = None,
          out: str | Path | bool | None = None, force: bool = False, config: str | Path | dict | None = None,
          save_replay: bool = False, progress: bool = True, evaluate_episodes: int | None = None,
          plan: str = "auto", objective: str = "throughput", allow_more_envs: bool = False, callback=None,
          seeds: Any = None, sweep: Any = None, hyperparams: str | Path | None = None, lanes: int = 0,
          **settings: Any) -> Run:
    """Train `algo` (a registered algorithm's name: `hetrl algorithms`) on `env` (an id, 'module:EnvId', or a
    zero-argument env factory).

    Settings not given come from the algorithm's preset for the env; any setting of the algorithm can be
    passed as a keyword (e.g. lr=1e-3, prioritized=True; `hetrl settings ALGO` lists them). plan="auto" (the
    default) lets the planner choose the schedule, actor count, devices and learner kernel around the settings
    given here (`hetrl plan` shows why; the machine is profiled once and the profile cached); it keeps every
    learning setting, num_envs included, unless allow_more_envs=True lets it raise the env count (the learning
    dynamics change; a num_envs given here is kept); plan="none" runs the settings as given. `out`: a directory
    to save the run in (True: runs/ALGO-ENV-sSEED). `callback`: see Run.learn. `hyperparams`: an
    rl-baselines3-zoo hyperparameter file (its entry for the env, SB3's defaults for what it leaves out, instead
    of hetrl's presets; `config` and the keywords win over it; hetrl/sb3/zoo.py). Returns the finished Run,
    evaluated over `eval_episodes` episodes (0 to skip) and saved to `out` if given.

    `seeds` (a count or a list) and/or `sweep` ({setting: [values]}) train a population, one member per seed x
    swept value, as one run (docs/population.md): the Run's `runs` are the members' (`lanes`: member phases
    learned at once), saved in `out` (default runs/ALGO-ENV-popN), its report (IQM and intervals) in
    out/result.json. Under the local and ray schedules the members are trained in groups, a process or a Ray
    task each (hetrl/planner/population.py).
    """
    members = None
    if seeds is not None or sweep:
        if seed is not None or settings.get("seed") is not None:
            raise UsageError("seed and seeds both given: a population takes its seeds from --seeds (seeds=); "
                             "drop --seed (seed=)")
        seeds, sweep = parse_seeds(1 if seeds is None else seeds), parse_sweep(sweep)
        members, seed = len(seeds) * int(np.prod([len(v) for v in sweep.values()])), seeds[0]
        out = True if out is None else out   # every member is a complete run: saved (runs/ALGO-ENV-popN)
    cfg, out_path, planned = prepare(algo, env, steps, seed, out, force, config, plan, objective, allow_more_envs,
                                     progress, hyperparams, members or 0, **settings)
    if members:
        from hetrl.config import SYSTEM_KEYS
        from hetrl.planner.population import kernel_of, plan_population

        over = _overrides(config, {"steps": steps, **settings}, hyperparams, algo, env)
        pop = make_members(cfg.algo, cfg.env, {**over, **{k: cfg.get(k) for k in SYSTEM_KEYS}}, seeds, sweep)
        pinned = settings.get("schedule") or (None if plan == "auto" else cfg.system.schedule)
        pp = plan_population(len(pop), _cores(), *kernel_of(pop[0].cfg, env), schedule=pinned,
                             device=cfg.system.device)
        pp.lanes = int(lanes) or pp.lanes
        spec = {"seeds": seeds, "sweep": {k: [str(v) for v in vs] for k, vs in sweep.items()},
                "groups": [[pop[i].name for i in g] for g in pp.groups], "plan": pp.to_json()}
        planned = {**planned, "population_plan": pp.to_json()}
        if progress:
            print(f"hetrl: training a population of {len(pop)} {cfg.algo} agents on {cfg.env} for {cfg.steps:,} env "
                  f"steps each: {pp.describe()} -> {out_path}", file=sys.stderr)
        if pp.schedule != "inline":
            return _train_groups(pop, env, out_path, pp, spec, planned, save_replay, evaluate_episodes)
        for m in pop:
            m.cfg.system.schedule = "inline"
        cfg, schedule = pop[0].cfg, PopulationSchedule(pop, env, pp.lanes, spec)
    elif progress:
        print(f"hetrl: training {cfg.algo} on {cfg.env} for {cfg.steps:,} env steps (schedule {cfg.system.schedule}, "
              f"device {cfg.system.device}, {cfg.num_envs} envs)" + (f" -> {out_path}" if out_path else ""),
              file=sys.stderr)
    run = Run(cfg, env, out_path, save_replay, plan_info=planned, schedule=schedule if members else None)
    return _finish(run, progress, callback, evaluate_episodes)


def _cores() -> int:
    import os

    return os.cpu_count() or 1


def _finish(run: Run, progress: bool, callback, evaluate_episodes: int | None, stopped=None) -> Run:
    """Train `run`, then evaluate it (every member of a population) and save it where it has a directory."""
    run.learn(progress=progress, callback=callback, stopped=stopped)
    n = run.cfg.eval_episodes if evaluate_episodes is None else evaluate_episodes
    if n and run.interrupted in (False, "callback"):
        run.evaluate(n)
        if run.out is not None:
            run.save(run.out)
    return run


class GroupedRun:
    """A population trained in groups (local processes, Ray tasks): its members' directories and figures."""

    def __init__(self, members: list, out: Path, result: dict, interrupted):
        self.members, self.out, self.result, self.interrupted = members, out, result, interrupted


def _group_main(group: int, members: list, env, out: str, lanes: int, save_replay: bool,
                evaluate_episodes: int | None, ship: bool, stopped=None) -> dict:
    """Group `group` of a population, in its own process or Ray task: its members trained as a population of one
    process, saved in OUT/members/NAME, its progress in OUT/groups/GROUP; returns its figures and (`ship`: a Ray
    task on another node) its files."""
    for m in members:
        m.cfg.system.schedule = "inline"
    run = Run(members[0].cfg, env, Path(out), save_replay, schedule=PopulationSchedule(members, env, lanes),
              group=group)
    _finish(run, False, None, evaluate_episodes, stopped)
    files = {}
    if ship:
        for d in [Path(out) / "members" / m.name for m in members] + [Path(out) / "groups" / str(group)]:
            files.update({str(p.relative_to(out)): p.read_bytes() for p in d.rglob("*") if p.is_file()})
    return {"figures": run.schedule.figures(), "files": files, "interrupted": run.interrupted}


def _train_groups(members: list, env, out: Path, pp, spec: dict, planned: dict, save_replay: bool,
                  evaluate_episodes: int | None) -> GroupedRun:
    """The groups of `pp` as processes (local) or Ray tasks (ray), each a population of its members."""
    import resource
    import time

    t0 = time.perf_counter()
    write_members(out, members, spec)
    jobs = [(n, [members[i] for i in g], env, str(out), pp.lanes, save_replay, evaluate_episodes, pp.schedule == "ray")
            for n, g in enumerate(pp.groups)]
    results = run_groups(_group_main, jobs, pp.schedule, members[0].cfg, pp.lanes, out)
    wall, steps = time.perf_counter() - t0, members[0].cfg.steps
    figures = {"members": len(members), "env_steps": steps, "wall_s": wall,
               "env_steps_per_s": len(members) * steps / wall if wall else 0.0, "groups": len(pp.groups),
               "lanes": pp.lanes, "learner_kernel": results[0]["figures"].get("learner_kernel") if results else None}
    if pp.schedule == "local":   # every process's peak: the groups' and this one's (their sum bounds the run's)
        rss = [r["figures"].get("peak_rss_mb") or 0.0 for r in results]
        figures.update(group_peak_rss_mb=rss,
                       peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 + sum(rss))
    interrupted = next((r["interrupted"] for r in results if r["interrupted"]), False)
    result = write_population(out, members, spec, figures, {"interrupted": interrupted, **planned})
    return GroupedRun(members, out, result, interrupted)


def _saved_config(ckpt: dict, **changes: Any) -> Config:
    cfgd = migrate(dict(ckpt["config"]))
    cfgd.update(changes)
    algo, env_id = cfgd.pop("algo"), cfgd.pop("env")
    return make_config(algo, env_id, cfgd)


def resume(run_dir: str | Path, steps: int | None = None, env: EnvSpec | None = None,
           progress: bool = True, evaluate_episodes: int | None = None, plan: str = "none",
           objective: str = "throughput", callback=None, lanes: int = 0, **system: Any) -> Run:
    """Continue the run saved in `run_dir` (to `steps` total env steps if given), under any schedule; a
    population's directory: every member, together in this process (`lanes`: member phases learned at once).

    The algorithm's settings stay those saved; `system` may change where and how the run goes on
    (config.SYSTEM_KEYS: schedule, device, threads, actors, envs_per_actor, ray_address, ...), so a
    run started inline on a laptop can continue on a cluster. plan="auto" plans around them."""
    from hetrl.config import SYSTEM_KEYS
    from hetrl.runtime.population import Member

    run_dir = Path(run_dir)
    system = {k: v for k, v in system.items() if v is not None}
    fixed = sorted(k for k in system if k not in SYSTEM_KEYS)
    if fixed:
        raise UsageError(f"--resume keeps the algorithm's settings saved in the run, so {', '.join(fixed)} cannot "
                         f"change; only the system's may ({', '.join(SYSTEM_KEYS)})")
    data = read_population(run_dir)["population"] if is_population(run_dir) else None
    dirs = [run_dir / m["dir"] for m in data["members"]] if data else [run_dir]
    ckpts = [read_checkpoint(d) for d in dirs]
    for d, ckpt in zip(dirs, ckpts):
        done = ckpt["counters"]["env_steps"]
        if steps is not None and steps <= done:
            raise UsageError(f"--steps {steps} is not beyond the {done} env steps {d} has done; pass a larger total")
    cfgs = [_saved_config(c, **system, **({"steps": steps} if steps is not None else {})) for c in ckpts]
    planned: dict[str, Any] = {}
    if data:
        for c in cfgs:
            c.system.schedule = "inline"
        members = [Member(m["name"], int(m["seed"]), m.get("settings") or {}, c) for m, c in zip(data["members"], cfgs)]
        spec = {"seeds": data["seeds"], "sweep": data.get("sweep", {}), "groups": data.get("groups")}
        schedule = PopulationSchedule(members, env or cfgs[0].env, lanes, spec)
    elif plan == "auto":
        cfgs[0], planned = auto_plan(cfgs[0], system, objective, quiet=not progress)
    replays = [read_replay(d) for d in dirs]
    run = Run(cfgs[0], env or cfgs[0].env, run_dir, save_replay=any(r is not None for r in replays),
              plan_info=planned, schedule=schedule if data else None)
    try:
        for r, ckpt, replay in zip(run.runs, ckpts, replays):
            r.load_state_dict({**ckpt, **({"replay": replay} if replay is not None else {})})
            r.evaluations.load_state_dict({"best": ckpt.get("best"), "history": ckpt.get("evaluations", [])})
    except BaseException:
        run.close()
        raise
    return _finish(run, progress, callback, evaluate_episodes)


def load(run_dir: str | Path, env: EnvSpec | None = None) -> Policy:
    """The trained policy saved in `run_dir` (by `hetrl train --out` or Run.save); for a population's directory,
    {member name: Policy} of every member (a member's own directory, OUT/members/NAME, loads as a run)."""
    if is_population(run_dir):
        return {m["name"]: load(Path(run_dir) / m["dir"], env) for m in read_population(run_dir)["population"]["members"]}
    ckpt = read_checkpoint(run_dir)
    cfg = _saved_config(ckpt)
    env = env or cfg.env
    obs_space, act_space = probe_spaces(prepare_env(env, cfg))
    learner = make_algorithm(cfg, obs_space, act_space, "cpu")
    learner.load_state_dict(ckpt["algo"])
    best = ckpt.get("best")
    return Policy(learner, cfg, env, best["state"] if best and cfg.keep_best else None)
