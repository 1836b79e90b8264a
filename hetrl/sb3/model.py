"""SB3's off-policy algorithm interface over hetrl's one training path (`api.prepare` -> `Run`).

    from hetrl import SAC                  # was: from stable_baselines3 import SAC
    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=0).learn(20_000, callback=eval_cb)
    model.save("sac_pendulum")             # sac_pendulum.zip
    model = SAC.load("sac_pendulum"); action, _ = model.predict(obs, deterministic=True)

One class per registered algorithm (`model_class(name)`; `hetrl.DQN`, `hetrl.SAC`, ...). The constructor takes
SB3's arguments with SB3's defaults (hetrl/sb3/args.py maps them to settings; `model.hetrl_settings` shows the
result) and hetrl's own keywords: any setting (`schedule`, `actors`, `learner_kernel`, ...) and `plan` ("auto":
the planner chooses the system's settings, as `hetrl.train`; "none"), `objective`, `allow_more_envs`, `out` (a
run directory the Run checkpoints into, also when training stops on an error) and `save_replay`.

A model holds at most one open Run: `learn(reset_num_timesteps=False)` extends it (`Run.extend`);
`learn(reset_num_timesteps=True)` (SB3's default) starts a new Run from the model's state: its networks,
optimizers and replay, with the step count at 0 (SB3 keeps the replay too). Before the first learn(), and after
`load()`, the model's networks live in an algorithm object of its own (predict, get/set_parameters, save).
docs/sb3.md lists every argument and method and where hetrl differs.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import os
import pickle
import tempfile
import time
import weakref
import zipfile
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from hetrl import api
from hetrl.actors.envs import env_name, prepare_env, probe_spaces, raw_observation_space
from hetrl.algos import make_algorithm
from hetrl.checkpoint import FORMAT, read_checkpoint, save_run
from hetrl.config import SYSTEM_KEYS, keys, make_config, settings_class
from hetrl.errors import UsageError
from hetrl.sb3 import args as sb3args
from hetrl.sb3 import envs as sb3envs
from hetrl.sb3.logger import Logger, configure

MODEL_FILE = "hetrl-model.json"
MODEL_FORMAT = "hetrl-sb3-model/1"
OWN = ("plan", "objective", "allow_more_envs", "out", "force", "save_replay")   # hetrl keywords beside settings


class ReplayBufferView:
    """`model.replay_buffer`: the size of the model's replay (SB3's `replay_buffer.size()`)."""

    def __init__(self, model: "OffPolicyModel"):
        self._model = model

    def size(self) -> int:
        m = self._model
        if m.run is not None:
            return m.run.replay_size()
        replay = (m._pending or {}).get("replay")
        return int(replay["storage"]["size"]) if replay else 0

    @property
    def buffer_size(self) -> int:
        return int(self._model.hetrl_settings["buffer_size"])

    @property
    def full(self) -> bool:
        return self.size() >= self.buffer_size

    def __len__(self) -> int:
        return self.size()


class OffPolicyModel:
    """SB3's off-policy algorithm interface for the registered algorithm `algo` (see the module's doc)."""

    algo: ClassVar[str] = ""
    _signature: ClassVar[inspect.Signature]

    def __init__(self, policy: Any, env: Any, *args: Any, **kwargs: Any):
        try:
            bound = self._signature.bind(policy, env, *args, **kwargs)
        except TypeError as e:
            raise UsageError(f"{type(self).__name__}(): {e}") from None
        given = dict(bound.arguments)
        extra = given.pop("hetrl_kwargs", {})
        policy, env = given.pop("policy"), given.pop("env")
        pname = sb3args.policy_name(policy, self.algo)
        conv = sb3envs.convert(env)
        own = {k: extra.pop(k) for k in OWN if k in extra}
        fields = set(keys(settings_class(self.algo)))
        for k, v in extra.items():
            if k not in fields:
                raise UsageError(f"{type(self).__name__}(): unknown argument {k!r}; SB3's arguments are "
                                 f"{', '.join(self._signature.parameters)[:400]}, and hetrl's settings "
                                 f"(`hetrl settings {self.algo}`)")
            sb3name = {v2: k2 for k2, v2 in sb3args.RENAMED.items()}.get(k, k)
            if sb3name in given:
                raise UsageError(f"{type(self).__name__}(): both {sb3name}= and {k}= given; pass one")
        defaults = sb3args.sb3_defaults(self.algo)
        sb3 = {**defaults, **given}
        seed = sb3.get("seed")
        seed = int(np.random.default_rng().integers(2**31 - 1)) if seed is None else int(seed)
        probe = self._probe(conv, extra)
        settings, keep = sb3args.to_settings(self.algo, {k: v for k, v in given.items() if k in defaults},
                                             policy=pname, num_envs=conv.num_envs, act_dim=probe["act_dim"],
                                             env=env_name(conv.spec))
        sb3args.check_policy(pname, self._algo_cls(), probe["raw"], probe["obs"])
        self._check_env_settings(conv, sb3)
        settings.update(num_envs=conv.num_envs, frame_stack=conv.frame_stack, eval_episodes=0, keep_best=False,
                        **conv.settings)
        device = sb3.get("device", "auto")
        if device is not None and str(device) != "auto":
            settings["device"] = str(device)
        elif own.get("plan", "auto") == "none":
            settings["device"] = "auto"   # SB3's default: a GPU where there is one
        settings.update(extra)
        self._setup(policy=pname, conv=conv, settings=settings, own=own, seed=seed, sb3=sb3,
                    lr_fn=keep.get("lr_fn"), spaces=(probe["raw"], probe["obs"], probe["act"]))

    # ---- construction ---------------------------------------------------------------------------
    def _check_env_settings(self, conv: sb3envs.Converted, sb3: dict) -> None:
        """An env that implies settings (SB3's VecNormalize) for an algorithm without them: one line."""
        fields = set(keys(settings_class(self.algo)))
        if conv.vec_normalize is not None and not set(conv.settings) <= fields:
            raise UsageError(f"{type(self).__name__}(): a VecNormalize env, but hetrl's {self.algo.upper()} does not "
                             "normalise observations or rewards (its on-policy algorithms do: PPO, A2C); pass the "
                             "vector env without VecNormalize")

    @classmethod
    def _algo_cls(cls):
        from hetrl import registry

        return registry.get(cls.algo)

    def _probe(self, conv: sb3envs.Converted, extra: dict) -> dict:
        """The env's spaces as the algorithm will see them (frame stacking and Atari preprocessing included)."""
        over = {"frame_stack": conv.frame_stack, **{k: v for k, v in extra.items() if k.startswith("atari_")}}
        cfg = make_config(self.algo, env_name(conv.spec), over)
        obs, act = probe_spaces(prepare_env(conv.spec, cfg))
        return {"raw": raw_observation_space(conv.spec), "obs": obs, "act": act,
                "act_dim": int(np.prod(act.shape)) if act.shape else None}

    def _setup(self, *, policy: str, conv: sb3envs.Converted | None, settings: dict, own: dict, seed: int,
               sb3: dict, lr_fn, spaces: tuple, env_label: str | None = None) -> None:
        self.policy_class = policy
        self._conv = conv
        self._env_label = env_name(conv.spec) if conv is not None else env_label   # the env's name (presets)
        self.hetrl_settings = dict(settings)
        self._own = dict(own)
        self.seed = seed
        self._lr_fn = lr_fn
        self._sb3 = dict(sb3)
        for k, v in sb3.items():   # SB3's attributes: model.gamma, model.batch_size, ...
            if k not in ("policy_kwargs", "seed", "device", "env"):
                setattr(self, k, v)
        self.policy_kwargs = sb3.get("policy_kwargs") or {}
        self.verbose = int(sb3.get("verbose") or 0)
        self.tensorboard_log = sb3.get("tensorboard_log")
        self.observation_space, self._obs_space, self.action_space = spaces
        self.n_envs = conv.num_envs if conv is not None else int(settings.get("num_envs", 1))
        self.num_timesteps = 0
        self._total_timesteps = 0
        self._episode_num = 0
        self.start_time = time.time_ns()
        self.ep_info_buffer: deque = deque(maxlen=int(sb3.get("stats_window_size") or 100))
        self.ep_success_buffer: deque = deque(maxlen=int(sb3.get("stats_window_size") or 100))
        self.run: api.Run | None = None
        self._finalizer = None
        self._pending: dict | None = None          # state for the next Run: counters, torch_rng, kernel, replay
        self._fresh = True                         # the networks are as built at construction
        self._epoch = 0                            # bumped when parameters are set from outside
        self._pred = None
        self._pred_key = None
        self._logger: Any = None
        self._custom_logger = False
        self._user_vec = None
        self._monitor = sb3envs.MonitorFiles(conv.monitors if conv is not None else [])
        self._cfg0 = self._config(steps=1, plan="none", check_out=False)
        torch.manual_seed(seed)   # the networks as the first Run's core builds them (the learner core seeds first)
        self._algo_obj = make_algorithm(self._cfg0, self._obs_space, self.action_space, "cpu")

    def _config(self, steps: int, plan: str, check_out: bool = True):
        """api.prepare with the model's settings: (cfg, out, plan info) or, without checks, the config alone."""
        spec = self._conv.spec if self._conv is not None else self._env_label
        if not check_out:
            return make_config(self.algo, env_name(spec), {**self.hetrl_settings, "steps": steps, "seed": self.seed})
        own = self._own
        pins = dict(self.hetrl_settings)
        if plan == "auto" and "schedule" not in pins and not sb3envs.picklable(spec):
            pins["schedule"] = "inline"   # actor processes need an env they can unpickle
        return api.prepare(self.algo, spec, steps=steps, seed=self.seed, out=own.get("out"),
                           force=bool(own.get("force")) or self.run is not None or self._pending is not None,
                           plan=plan, objective=own.get("objective", "throughput"),
                           allow_more_envs=bool(own.get("allow_more_envs")), progress=self.verbose >= 2, **pins)

    # ---- SB3's attributes ---------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._algo().device

    @property
    def env(self):
        return self.get_env()

    @property
    def replay_buffer(self) -> ReplayBufferView:
        return ReplayBufferView(self)

    @property
    def policy(self):
        from hetrl.sb3.policy import ModelPolicy

        return ModelPolicy(self)

    @property
    def logger(self):
        if self._logger is None:
            self._logger = Logger()
        return self._logger

    def set_logger(self, logger) -> None:
        """Any logger with record() and dump() (SB3's `configure(...)` too); kept for every later learn()."""
        self._logger, self._custom_logger = logger, True

    @property
    def exploration_rate(self) -> float:
        """The exploration value the actors use now (DQN: epsilon; 1.0 in the warm-up before learning_starts)."""
        e = self._algo().exploration(self.num_timesteps)
        return 1.0 if e is None else float(e)

    def get_vec_normalize_env(self):
        return None

    def _algo(self):
        return self.run.algo if self.run is not None else self._algo_obj

    # ---- learning -----------------------------------------------------------------------------------------
    def learn(self, total_timesteps: int, callback=None, log_interval: int = 4, tb_log_name: str | None = None,
              reset_num_timesteps: bool = True, progress_bar: bool = False) -> "OffPolicyModel":
        """Train for total_timesteps env steps (SB3's learn); returns the model."""
        from hetrl.sb3.callbacks import Hook, convert

        if self._conv is None:
            raise UsageError(f"this model has no env (loaded without one); pass env= to {type(self).__name__}.load(), "
                             "or call model.set_env(env)")
        tb_log_name = tb_log_name or type(self).__name__
        total = int(total_timesteps)
        if reset_num_timesteps:
            self.num_timesteps, self._episode_num = 0, 0
            self.ep_info_buffer.clear()
            self.ep_success_buffer.clear()
        target = (0 if reset_num_timesteps else self.num_timesteps) + max(0, total)
        self._total_timesteps = target
        if not self._custom_logger:
            self._logger = configure(self.verbose, self.tensorboard_log, tb_log_name, reset_num_timesteps)
        cb = convert(callback)
        cb.init_callback(self)
        learn_locals = dict(self=self, total_timesteps=target, callback=cb, log_interval=log_interval,
                            tb_log_name=tb_log_name, reset_num_timesteps=reset_num_timesteps, progress_bar=progress_bar)
        hook = Hook(self, cb, learn_locals, log_interval)
        if target <= (0 if reset_num_timesteps else self.num_timesteps):
            hook.training_start(None)
            hook.training_end(None)
            return self
        self._sync_run()
        run = self._open_run(target, reset_num_timesteps)
        self.start_time = time.time_ns()   # after planning and building the Run (SB3's fps: of training)
        try:
            run.learn(progress=False, callback=hook, keep_open=True)   # the bar: the hook's (SB3's)
        except BaseException:
            hook.close_bar()
            self._salvage(keep_counters=True)
            raise
        self.num_timesteps = run.env_steps
        return self

    def _open_run(self, target: int, reset: bool) -> api.Run:
        if self.run is not None and not reset:
            if target > self.run.env_steps:
                self.run.extend(target)
            return self.run
        if self.run is not None:
            self._salvage(keep_counters=False)
        plan = self._own.get("plan", "auto")
        cfg, out, planned = self._config(target, plan)
        if self.verbose == 1:   # the planner's own lines (its profiling, its notes) at verbose >= 2
            print(plan_line(cfg, planned), flush=True)
        cfg = self._kernel_for_lr(cfg)
        run = api.Run(cfg, self._conv.spec, out, bool(self._own.get("save_replay")), plan_info=planned)
        try:
            state = self._state_for_run(run, zero_counters=reset)
            if state is not None:
                run.load_state_dict(state)
            if self._lr_fn is not None:
                run.set_lr_schedule(self._lr_fn)
        except BaseException:
            run.close()
            raise
        self.run, self._pending, self._fresh = run, None, False
        self._finalizer = weakref.finalize(self, run.close)
        return run

    def _kernel_for_lr(self, cfg):
        """A callable learning_rate changes lr between learner calls, which a captured CUDA graph would not see."""
        if self._lr_fn is None or cfg.system.learner_kernel not in ("auto", "cuda_graph"):
            return cfg
        from hetrl.runtime.core import resolve_device

        if resolve_device(cfg.system.device).type != "cuda":
            return cfg
        if cfg.system.learner_kernel == "cuda_graph":
            raise UsageError("learning_rate as a callable with learner_kernel=cuda_graph: a captured graph keeps lr "
                             "fixed; pass a float (or 'lin_X'), or learner_kernel='public'")
        return cfg.replace(learner_kernel="public")

    def _state_for_run(self, run: api.Run, zero_counters: bool) -> dict | None:
        """What a new Run loads: the model's networks (unless as built), its counters (zero with
        reset_num_timesteps) and replay; None for a fresh model (the Run builds the same networks)."""
        pending = dict(self._pending or {})
        if self._fresh and not pending:
            return None
        state = {"algo": self._algo_obj.state_dict(),
                 "counters": {} if zero_counters else dict(pending.get("counters") or {}),
                 "torch_rng": pending.get("torch_rng", torch.get_rng_state())}
        if pending.get("kernel"):
            state["kernel"] = pending["kernel"]
        if pending.get("replay") is not None:
            state["replay"] = pending["replay"]
        return state

    def _salvage(self, keep_counters: bool) -> None:
        """Close the open Run, keeping its networks, optimizers, replay (and counters) for the next one."""
        self._sync_run()   # parameters written through model.policy reach the Run's state first
        run, self.run = self.run, None
        if run is None:
            return
        try:
            state = run.state_dict(with_replay=True)
            self._algo_obj = run.algo
            self._pending = {"counters": state["counters"] if keep_counters else {}, "torch_rng": state["torch_rng"],
                             "kernel": state.get("kernel"), "replay": state.get("replay")}
            self._fresh = False
            self.num_timesteps = run.env_steps if keep_counters else self.num_timesteps
        finally:
            run.close()
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None

    # ---- acting ---------------------------------------------------------------------------------------------
    def predict(self, observation: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = False) -> tuple[np.ndarray, Any]:
        """(action(s), state) for one observation or a batch. deterministic: the greedy / mean action; else the
        algorithm's acting policy at the model's step count (DQN: epsilon-greedy; SAC: a sample; DDPG/TD3: mu(s)
        plus the exploration noise, where SB3 returns mu(s))."""
        pol = self._predictor()
        if deterministic:
            return np.asarray(pol.act(observation)), state
        algo = self._algo()
        explore = algo.exploration(self.num_timesteps)
        if explore is None:   # the warm-up's uniform random actions are training's, not the policy's
            explore = algo.exploration(max(self.num_timesteps, algo.cfg.learning_starts))
        return np.asarray(pol.sample(observation, explore)), state

    def _predictor(self) -> api.Policy:
        algo = self._algo()
        key = (id(algo), algo.updates, self._epoch)
        if self._pred is None or self._pred.algo is not algo:
            cfg = self.run.cfg if self.run is not None else self._cfg0
            self._pred = api.Policy(algo, cfg, self._conv.spec if self._conv is not None else cfg.env)
            self._pred._raw_space = self.observation_space   # flatten as the env gives them (no env to build)
        elif key != self._pred_key:
            self._pred.load(algo.policy_state())
        self._pred_key = key
        return self._pred

    # ---- envs -------------------------------------------------------------------------------------------------
    def get_env(self):
        """The env as a vector env with SB3's API: the user's own VecEnv, else one over the env given (SB3's
        DummyVecEnv where SB3 is installed). hetrl trains on envs of its own (its actors'), not on this one."""
        if self._conv is None:
            return None
        if self._user_vec is None:
            conv = self._conv
            if sb3envs.is_sb3_vec_env(conv.user_env):
                self._user_vec = conv.user_env
            else:
                factory = self._eval_factory()
                fns = [factory] * conv.num_envs
                if conv.user_env is not None:
                    fns[0] = lambda e=conv.user_env: e
                self._user_vec = sb3envs.vec_env(fns)
        return self._user_vec

    def _eval_factory(self):
        from hetrl.actors.envs import make_env

        prepared = prepare_env(self._conv.spec, self._cfg0, train=False)
        return lambda: make_env(prepared, flatten=False)

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """Train on `env` from the next learn() (same spaces and number of envs); the Run open so far is closed,
        its networks, optimizers, replay and step count kept."""
        conv = sb3envs.convert(env)
        if conv.num_envs != self.n_envs:
            raise UsageError(f"set_env: the env has {conv.num_envs} envs, the model {self.n_envs}; load the model "
                             f"with {type(self).__name__}.load(path, env=env) to change the number")
        probe = self._probe(conv, {k: v for k, v in self.hetrl_settings.items() if k.startswith("atari_")})
        if probe["obs"] != self._obs_space or probe["act"] != self.action_space:
            raise UsageError(f"set_env: the env's spaces {probe['obs']}, {probe['act']} differ from the model's "
                             f"{self._obs_space}, {self.action_space}")
        self._salvage(keep_counters=True)
        self._conv, self._user_vec, self._pred = conv, None, None
        self._monitor = sb3envs.MonitorFiles(conv.monitors)

    # ---- parameters --------------------------------------------------------------------------------------------
    def get_parameters(self) -> dict:
        """SB3's layout where the algorithm has SB3's names: {"policy": model.policy.state_dict() (SB3's names),
        "policy.optimizer" (DQN, PPO, A2C) or "actor.optimizer", "critic.optimizer" (DDPG, TD3, SAC) and
        "ent_coef_optimizer" (SAC with a learned ent_coef): the optimizers' torch state dicts}. Otherwise (CrossQ, an
        algorithm of one's own) the algorithm's state dict by hetrl's names (actor, critics, actor_opt, ...)."""
        sig = sb3args.compat(self.algo)
        algo = self._algo()
        if not sig.optimizers:
            return algo.state_dict()
        state = algo.state_dict()
        out = {"policy": self.policy.state_dict()}
        for name, key in sig.optimizers:
            if state.get(key):
                out[name] = state[key]
        return out

    def set_parameters(self, load_path_or_dict: Any, exact_match: bool = True, device: Any = "auto") -> None:
        """Load get_parameters()'s dict (exact_match=False: only the entries given; in SB3's layout the policy's
        entries too), a dict of the algorithm's own names, or a saved model's parameters (a path)."""
        params = load_path_or_dict
        if not isinstance(params, dict):
            params = _read_saved(load_path_or_dict)[1]["algo"]
        sig = sb3args.compat(self.algo)
        algo = self._algo()
        have = self.get_parameters() if sig.optimizers else {}
        if sig.optimizers and set(params) <= set(have) | {n for n, _ in sig.optimizers} and \
                isinstance(params.get("policy"), dict) and set(params["policy"]) <= set(have["policy"]):
            # SB3's layout (a "policy" of SB3's names; hetrl's own PPO state has a "policy" of its own names)
            if exact_match and set(params) != set(have):
                raise UsageError(f"set_parameters: the names differ from the model's: expected {sorted(have)}, got "
                                 f"{sorted(params)}; pass exact_match=False to set some of them")
            unknown = set(params) - set(have)
            if unknown:
                raise UsageError(f"set_parameters: {sorted(unknown)} are not the model's ({sorted(have)})")
            keys_of, names_of = dict(sig.optimizers), {v: k for k, v in sig.optimizers}
            opts = {keys_of[k]: v for k, v in params.items() if k != "policy"}
            state = algo.state_dict()
            for key, opt in opts.items():   # checked before anything is written
                if [len(g["params"]) for g in opt.get("param_groups", [])] != \
                        [len(g["params"]) for g in state[key].get("param_groups", [])]:
                    raise UsageError(f"set_parameters: the optimizer state {names_of[key]!r} is laid out for other "
                                     "parameter tensors (an SB3 model's optimizer?); pass {'policy': ...} alone with "
                                     "exact_match=False")
            try:
                torch.nn.Module.load_state_dict(self.policy, params["policy"], strict=exact_match)
            except RuntimeError as e:
                raise UsageError(f"set_parameters: the policy's entries do not fit this model: {e}") from None
            params = opts
            merged = {**algo.state_dict(), **params}
        else:
            have = algo.state_dict()
            if exact_match and set(params) != set(have):
                raise UsageError(f"set_parameters: the names differ from the model's: expected {sorted(have)}, got "
                                 f"{sorted(params)}; pass exact_match=False to set some of them")
            unknown = set(params) - set(have)
            if unknown:
                raise UsageError(f"set_parameters: {sorted(unknown)} are not the model's ({sorted(have)})")
            merged = {**have, **params}
        if self.run is not None:
            self.run.load_parameters(merged)
            self._run_stale = False
        else:
            algo.load_state_dict(merged)
            self._fresh = False
        self._epoch += 1

    def _parameters_changed(self) -> None:
        """The networks were written from outside (model.policy.load_state_dict): acting uses them at once; an open
        Run's learner and actors get them before its next phase (`_sync_run`)."""
        self._epoch += 1
        if self.run is not None:
            self._run_stale = True
        else:
            self._fresh = False

    def _sync_run(self) -> None:
        if self.run is not None and getattr(self, "_run_stale", False):
            self.run.load_parameters(self._algo().state_dict())
        self._run_stale = False

    # ---- saving -------------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, exclude: Any = None, include: Any = None) -> None:
        """A zip file (SB3's convention: '.zip' added to a path without a suffix) holding hetrl's run directory
        (checkpoint.pt, result.json) and hetrl-model.json; a path that is a directory (or ends with '/') gets those
        files instead, which `hetrl.load`, `hetrl eval` and `hetrl train --resume` read too."""
        p = Path(path)
        as_dir = str(path).endswith(("/", os.sep)) or p.is_dir()
        if as_dir:
            self._write_dir(p)
            return
        if p.suffix == "":
            p = p.with_suffix(".zip")
        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            self._write_dir(Path(tmp))
            part = p.with_name(p.name + ".tmp")
            with zipfile.ZipFile(part, "w", zipfile.ZIP_STORED) as z:
                for f in sorted(Path(tmp).iterdir()):
                    z.write(f, f.name)
            os.replace(part, p)

    def _write_dir(self, d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        self._sync_run()
        if self.run is not None:
            self.run.save(d, replay=False)
        else:
            from hetrl.runtime.core import Counters

            counters = dataclasses.asdict(Counters(**{k: v for k, v in ((self._pending or {}).get("counters") or
                                                                        {"env_steps": self.num_timesteps}).items()
                                                      if k in Counters.__dataclass_fields__}))
            cfg = self._cfg0.replace(steps=max(1, self.num_timesteps))
            state = {"algo": self._algo_obj.state_dict(), "counters": counters, "torch_rng": torch.get_rng_state()}
            save_run(d, config=cfg.to_dict(), env=cfg.env, state=state, result={"algo": self.algo, "env": cfg.env})
        meta = {"format": MODEL_FORMAT, "class": type(self).__name__, "algo": self.algo, "policy": self.policy_class,
                "settings": self.hetrl_settings, "hetrl": {k: v for k, v in self._own.items() if k not in ("out", "force")},
                "num_timesteps": int(self.num_timesteps), "episode_num": int(self._episode_num), "seed": self.seed,
                "env": self._conv.spec if self._conv is not None and isinstance(self._conv.spec, str) else None,
                "num_envs": self.n_envs, "sb3": {k: v for k, v in self._sb3.items() if _jsonable(v)},
                "learning_rate": "learning_rate.pkl" if self._lr_fn is not None else None}
        (d / MODEL_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        with open(d / "spaces.pkl", "wb") as f:
            pickle.dump((self.observation_space, self._obs_space, self.action_space), f)
        if self._lr_fn is not None:
            import cloudpickle

            (d / "learning_rate.pkl").write_bytes(cloudpickle.dumps(self._lr_fn))

    @classmethod
    def load(cls, path: str | os.PathLike, env: Any = None, device: Any = "auto", custom_objects: dict | None = None,
             print_system_info: bool = False, force_reset: bool = True, **kwargs: Any) -> "OffPolicyModel":
        """A model saved by save() (a zip or a directory), or a run directory of `hetrl train`; training goes on
        with learn() (its step count kept with reset_num_timesteps=False). kwargs change settings (SB3 or hetrl
        names, e.g. learning_rate=1e-4, schedule='local')."""
        meta, ckpt, extras = _read_saved(path)
        algo = (meta or {}).get("algo") or ckpt["config"]["algo"]
        if cls.algo and algo != cls.algo:
            raise UsageError(f"{path} holds a {algo.upper()} model; load it with {model_class(algo).__name__}.load")
        klass = cls if cls.algo else model_class(algo)
        if meta is not None:
            settings, own, policy = dict(meta["settings"]), dict(meta.get("hetrl") or {}), meta["policy"]
            seed, sb3 = int(meta["seed"]), {**sb3args.sb3_defaults(algo), **meta.get("sb3", {})}
        else:   # a run directory of `hetrl train`: its learning settings (the system's are planned again)
            cfgd = ckpt["config"]
            settings = {k: v for k, v in cfgd.items() if k not in (*SYSTEM_KEYS, "algo", "env", "steps", "seed")}
            own, policy, seed = {}, "MlpPolicy", int(cfgd["seed"])
            sb3 = sb3args.sb3_defaults(algo)
        lr_fn = extras.get("lr_fn")
        fields = set(keys(settings_class(algo)))
        for k, v in kwargs.items():
            if k == "learning_rate":
                settings["lr"], lr_fn, settings["lr_schedule"] = sb3args.learning_rate(v)
            elif k in OWN:
                own[k] = v
            elif k in fields or sb3args.RENAMED.get(k, k) in fields:
                settings[k if k in fields else sb3args.RENAMED[k]] = v
            elif k in ("verbose", "tensorboard_log", "stats_window_size"):
                sb3[k] = v
            else:
                raise UsageError(f"{klass.__name__}.load: {k}= cannot change on load (only settings, learning_rate, "
                                 "verbose, tensorboard_log)")
        if device is not None and str(device) != "auto":
            settings["device"] = str(device)
        saved_env = (meta or {}).get("env") if meta is not None else ckpt.get("env")
        conv = sb3envs.convert(env) if env is not None else (sb3envs.Converted(saved_env, int(settings.get("num_envs", 1)))
                                                              if _is_id(saved_env) else None)
        if conv is not None and env is not None:
            settings["num_envs"], settings["frame_stack"] = conv.num_envs, conv.frame_stack
        model = klass.__new__(klass)
        spaces = extras.get("spaces")
        if spaces is None:
            if conv is None:
                raise UsageError(f"{path} has no record of its spaces and no env id; pass env= to load()")
            probe = model._probe(conv, {k: v for k, v in settings.items() if k.startswith("atari_")})
            spaces = (probe["raw"], probe["obs"], probe["act"])
        model._setup(policy=policy, conv=conv, settings=settings, own=own, seed=seed, sb3=sb3, lr_fn=lr_fn,
                     spaces=spaces, env_label=str(ckpt.get("env") or ckpt["config"]["env"]))
        if conv is not None:
            probe_obs, probe_act = model._probe_spaces()
            if probe_obs != model._obs_space or probe_act != model.action_space:
                raise UsageError(f"load: the env's spaces {probe_obs}, {probe_act} differ from the saved model's "
                                 f"{model._obs_space}, {model.action_space}")
        model._algo_obj.load_state_dict(ckpt["algo"])
        model._fresh = False
        model._pending = {"counters": ckpt["counters"], "torch_rng": ckpt["torch_rng"], "kernel": ckpt.get("kernel")}
        model.num_timesteps = int(ckpt["counters"]["env_steps"])
        model._episode_num = int((meta or {}).get("episode_num", 0))
        return model

    def _probe_spaces(self):
        return probe_spaces(prepare_env(self._conv.spec, self._cfg0))

    # ---- replay --------------------------------------------------------------------------------------------------
    def save_replay_buffer(self, path: str | os.PathLike) -> None:
        """The replay (torch.save; '.pkl' added to a path without a suffix, as SB3 does)."""
        p = Path(path)
        if p.suffix == "":
            p = p.with_suffix(".pkl")
        p.parent.mkdir(parents=True, exist_ok=True)
        replay = self.run.replay_state_dict() if self.run is not None else (self._pending or {}).get("replay")
        torch.save({"format": "hetrl-replay/1", "replay": replay}, p)

    def load_replay_buffer(self, path: str | os.PathLike, truncate_last_traj: bool = True) -> None:
        """Load a replay saved by save_replay_buffer() (the same buffer_size and observation / action shapes)."""
        p = Path(path)
        if not p.exists() and p.suffix == "":
            p = p.with_suffix(".pkl")
        if not p.is_file():
            raise UsageError(f"replay buffer file {p} does not exist")
        try:
            data = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:
            raise UsageError(f"{p} is not a replay saved by hetrl ({type(e).__name__})") from None
        if not isinstance(data, dict) or data.get("format") != "hetrl-replay/1":
            raise UsageError(f"{p} is not a replay saved by hetrl's save_replay_buffer")
        replay = data["replay"]
        if replay is None:
            return
        try:
            if self.run is not None:
                self.run.load_replay_state_dict(replay)
            else:
                self._pending = {**(self._pending or {}), "replay": replay}
        except (ValueError, RuntimeError, KeyError) as e:
            raise UsageError(f"{p} does not fit this model's replay ({e}); it must come from a model with the same "
                             "buffer_size and spaces") from None

    # ---- logging -------------------------------------------------------------------------------------------------
    def _episodes(self, episodes: list, log_interval: int | None) -> None:
        t = (time.time_ns() - self.start_time) / 1e9
        if self._monitor:
            self._monitor.write(episodes)
        before = self._episode_num
        for r, n in episodes:
            self.ep_info_buffer.append({"r": float(r), "l": int(n), "t": round(t, 6)})
            self._episode_num += 1
        # SB3 writes a table every log_interval episodes; a phase's episodes arrive together: one table for them
        if log_interval and self._episode_num // log_interval > before // log_interval and self._logs():
            self.dump_logs()

    def _logs(self) -> bool:
        return self._custom_logger or bool(getattr(self._logger, "output_formats", None))

    def dump_logs(self) -> None:
        """SB3's training table: time/*, rollout/ep_rew_mean and ep_len_mean, train/n_updates and learning_rate."""
        lg = self.logger
        dt = max((time.time_ns() - self.start_time) / 1e9, 1e-9)
        lg.record("time/episodes", self._episode_num, exclude="tensorboard")
        if self.ep_info_buffer:
            lg.record("rollout/ep_rew_mean", float(np.mean([e["r"] for e in self.ep_info_buffer])))
            lg.record("rollout/ep_len_mean", float(np.mean([e["l"] for e in self.ep_info_buffer])))
        if sb3args.compat(self.algo).logs_exploration_rate:
            lg.record("rollout/exploration_rate", self.exploration_rate)
        lg.record("time/fps", int(self.num_timesteps / dt))
        lg.record("time/time_elapsed", int(dt), exclude="tensorboard")
        lg.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        algo = self._algo()
        for k, v in (self.run.train_stats() if self.run is not None else {}).items():   # the algorithm's `stats`
            lg.record(f"train/{k}", v)
        lg.record("train/n_updates", int(algo.updates))
        lg.record("train/learning_rate", float(self._lr_fn(self._progress()) if self._lr_fn else
                                               self.hetrl_settings.get("lr", 0.0)))
        lg.dump(step=self.num_timesteps)

    def _progress(self) -> float:
        return 1.0 - min(1.0, self.num_timesteps / max(1, self._total_timesteps))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.policy_class!r}, {self.hetrl_settings.get('num_envs')} envs, " \
               f"num_timesteps={self.num_timesteps})"


def plan_line(cfg, planned: dict | None) -> str:
    """One line saying the system a learn() runs on (SB3 says its device at verbose=1)."""
    p = (planned or {}).get("plan", {}).get("plan") or {}
    s = cfg.system
    sched, dev = p.get("schedule", s.schedule), p.get("learner_device", s.device)
    if sched == "inline":
        where = f"inline, {cfg.num_envs} env(s)"
    elif p:
        where = f"{sched}, {p['actors']} actor process(es) x {p['envs_per_actor']} env(s)"
    else:
        where = f"{sched}, {s.actors or 'auto'} actor process(es), {cfg.num_envs} env(s)"
    line = f"hetrl: {where}, learner on {dev}"
    if planned:
        line += f"; planned for {planned['predicted_env_steps_per_s']:,.0f} env steps/s (`hetrl plan` explains it)"
    return line


def _is_id(env: Any) -> bool:
    return isinstance(env, str) and env != ""


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _read_saved(path: str | os.PathLike) -> tuple[dict | None, dict, dict]:
    """(hetrl-model.json or None, checkpoint, extras: spaces, lr_fn) of a saved model: a zip, a directory, or a
    path that needs '.zip' (SB3's convention)."""
    p = Path(path)
    if not p.exists() and p.with_name(p.name + ".zip").is_file():
        p = p.with_name(p.name + ".zip")
    if p.is_dir():
        ckpt = read_checkpoint(p)
        files = {f.name: f.read_bytes() for f in p.iterdir() if f.name in (MODEL_FILE, "spaces.pkl", "learning_rate.pkl")}
    elif p.is_file():
        try:
            with zipfile.ZipFile(p) as z:
                files = {n: z.read(n) for n in z.namelist()}
        except zipfile.BadZipFile:
            raise UsageError(f"{p} is not a model saved by hetrl (not a zip file); pass the file model.save() wrote "
                             "(SB3's own zips cannot be loaded)") from None
        if "checkpoint.pt" not in files:
            raise UsageError(f"{p} is not a model saved by hetrl (no checkpoint.pt inside); SB3's own zips cannot "
                             "be loaded")
        ckpt = torch.load(io.BytesIO(files["checkpoint.pt"]), map_location="cpu", weights_only=True)
        if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
            raise UsageError(f"{p} holds no hetrl checkpoint")
    else:
        raise UsageError(f"{path} does not exist (nor {path}.zip); pass the path model.save() wrote")
    meta = json.loads(files[MODEL_FILE]) if MODEL_FILE in files else None
    extras: dict = {}
    if "spaces.pkl" in files:
        extras["spaces"] = pickle.loads(files["spaces.pkl"])
    if "learning_rate.pkl" in files:
        extras["lr_fn"] = pickle.loads(files["learning_rate.pkl"])
    return meta, ckpt, extras


# ---- one class per registered algorithm ----------------------------------------------------------------------
_CLASSES: dict[str, type[OffPolicyModel]] = {}


def class_name(algo: str) -> str:
    """The class name of a registered algorithm: SB3's spelling of its name where it declares one (its
    `sb3.class_name`: DQN, SAC, TD3, DDPG, CrossQ), else its name upper-cased."""
    from hetrl import registry
    from hetrl.sb3 import compat as sb3compat

    return sb3compat.class_name(algo, registry.get(algo))


def model_class(name: str) -> type[OffPolicyModel]:
    """The SB3-style class of the registered algorithm `name` (made once, with SB3's signature)."""
    from hetrl import registry

    key = name.lower()
    algo_cls = registry.get(key)   # a clear error for an unknown name
    if key not in _CLASSES:
        base = OffPolicyModel
        if getattr(algo_cls, "storage", "replay") == "rollout":   # SB3's on-policy interface (PPO, A2C)
            from hetrl.sb3.onpolicy import OnPolicyModel

            base = OnPolicyModel
        cls = type(class_name(key), (base,), {
            "algo": key, "__module__": "hetrl.sb3",
            "__doc__": f"{key.upper()} with Stable-Baselines3's interface, trained by hetrl (hetrl/sb3/model.py)."})
        P = inspect.Parameter
        params = [P("policy", P.POSITIONAL_OR_KEYWORD), P("env", P.POSITIONAL_OR_KEYWORD)]
        params += [P(k, P.POSITIONAL_OR_KEYWORD, default=v) for k, v in sb3args.sb3_defaults(key).items()]
        params.append(P("hetrl_kwargs", P.VAR_KEYWORD))
        cls._signature = inspect.Signature(params)
        cls.__signature__ = cls._signature
        _CLASSES[key] = cls
    return _CLASSES[key]
