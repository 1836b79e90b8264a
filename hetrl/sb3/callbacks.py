"""Callbacks with Stable-Baselines3's protocol, for the SB3-style classes (hetrl/sb3/): SB3's own callbacks
(EvalCallback, CheckpointCallback, StopTrainingOnRewardThreshold, ...) work unchanged where SB3 is installed,
and this module has its own of the same names and meaning where it is not.

    from hetrl import SAC
    from hetrl.callbacks import EvalCallback, StopTrainingOnRewardThreshold     # or stable_baselines3's
    stop = StopTrainingOnRewardThreshold(reward_threshold=-200, verbose=1)
    model = SAC("MlpPolicy", "Pendulum-v1").learn(20_000, callback=EvalCallback("Pendulum-v1", stop, eval_freq=1000))

When they are called. hetrl's actors and learner do not stop at every env step, so the callbacks run in the
learner's process at the boundaries of the Run's phases (inline: after each collect-and-learn phase of
train_freq env steps; local and ray: about every 0.1 s), where `Hook` plays back the phase just finished:

    on_rollout_start(); then on_step() once per vector env step of the phase (n_envs env steps each), with
    model.num_timesteps advancing by n_envs per call, so n_calls and num_timesteps are SB3's exact counts;
    then on_rollout_end().

An on_step() that returns False stops training at once (the rest of that phase's calls are not made); the
model keeps its Run, and a later learn(reset_num_timesteps=False) goes on from there. Evaluations and
checkpoints made in a call see the parameters at the end of the phase. A callback that raises stops the run
like any error: with `out=` given, the Run saves its checkpoint first; the exception reaches the caller.

What `self.locals` holds. On on_training_start: learn()'s arguments (`self` the model, `total_timesteps` the
target count, `callback`, `log_interval`, `tb_log_name`, `reset_num_timesteps`, `progress_bar`). In each on_step:
also `num_collected_steps` (vector steps into the phase), `num_collected_episodes`, `dones` (bool, one per env)
and `infos` (one dict per env; `infos[i]["episode"] = {"r": return, "l": length}` where an episode ended).
hetrl's actors report the episodes of a phase, not the step each ended at: they are marked at the phase's last
vector steps (one per env and step). `rewards`, `new_obs` and `actions` of single steps are not available.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from hetrl.errors import UsageError


__all__ = ["BaseCallback", "EventCallback", "CallbackList", "ConvertCallback", "CheckpointCallback", "EvalCallback",
           "evaluate_policy", "StopTrainingOnRewardThreshold", "StopTrainingOnNoModelImprovement",
           "StopTrainingOnMaxEpisodes", "EveryNTimesteps", "ProgressBarCallback"]


class BaseCallback:
    """SB3's callback protocol: subclass it and write `_on_step` (and any `_on_*`)."""

    def __init__(self, verbose: int = 0):
        self.n_calls = 0
        self.num_timesteps = 0
        self.verbose = verbose
        self.locals: dict[str, Any] = {}
        self.globals: dict[str, Any] = {}
        self.parent = None

    @property
    def training_env(self):
        env = self.model.get_env()
        if env is None:
            raise UsageError("model.get_env() is None: callbacks need a model with an env")
        return env

    @property
    def logger(self):
        return self.model.logger

    def init_callback(self, model) -> None:
        self.model = model
        self._init_callback()

    def _init_callback(self) -> None:
        pass

    def on_training_start(self, locals_: dict, globals_: dict) -> None:
        self.locals, self.globals = locals_, globals_
        self.num_timesteps = self.model.num_timesteps
        self._on_training_start()

    def _on_training_start(self) -> None:
        pass

    def on_rollout_start(self) -> None:
        self._on_rollout_start()

    def _on_rollout_start(self) -> None:
        pass

    def _on_step(self) -> bool:
        return True

    def on_step(self) -> bool:
        self.n_calls += 1
        self.num_timesteps = self.model.num_timesteps
        return self._on_step()

    def on_training_end(self) -> None:
        self._on_training_end()

    def _on_training_end(self) -> None:
        pass

    def on_rollout_end(self) -> None:
        self._on_rollout_end()

    def _on_rollout_end(self) -> None:
        pass

    def update_locals(self, locals_: dict) -> None:
        self.locals.update(locals_)
        self.update_child_locals(locals_)

    def update_child_locals(self, locals_: dict) -> None:
        pass


class EventCallback(BaseCallback):
    """Triggers `callback` on an event (e.g. after an evaluation)."""

    def __init__(self, callback: BaseCallback | None = None, verbose: int = 0):
        super().__init__(verbose)
        self.callback = callback
        if callback is not None:
            callback.parent = self

    def init_callback(self, model) -> None:
        super().init_callback(model)
        if self.callback is not None:
            self.callback.init_callback(self.model)

    def _on_training_start(self) -> None:
        if self.callback is not None:
            self.callback.on_training_start(self.locals, self.globals)

    def _on_event(self) -> bool:
        return self.callback.on_step() if self.callback is not None else True

    def update_child_locals(self, locals_: dict) -> None:
        if self.callback is not None:
            self.callback.update_locals(locals_)


class CallbackList(BaseCallback):
    def __init__(self, callbacks: list):
        super().__init__()
        self.callbacks = list(callbacks)

    def _init_callback(self) -> None:
        for c in self.callbacks:
            c.init_callback(self.model)
            c.parent = self.parent

    def _on_training_start(self) -> None:
        for c in self.callbacks:
            c.on_training_start(self.locals, self.globals)

    def _on_rollout_start(self) -> None:
        for c in self.callbacks:
            c.on_rollout_start()

    def _on_step(self) -> bool:
        go = True
        for c in self.callbacks:
            go = c.on_step() and go   # every callback is called, as SB3 does
        return go

    def _on_rollout_end(self) -> None:
        for c in self.callbacks:
            c.on_rollout_end()

    def _on_training_end(self) -> None:
        for c in self.callbacks:
            c.on_training_end()

    def update_child_locals(self, locals_: dict) -> None:
        for c in self.callbacks:
            c.update_locals(locals_)


class ConvertCallback(BaseCallback):
    """A function f(locals, globals) -> bool as a callback (SB3 accepts one as `callback`)."""

    def __init__(self, callback: Callable[[dict, dict], bool] | None, verbose: int = 0):
        super().__init__(verbose)
        self.callback = callback

    def _on_step(self) -> bool:
        return bool(self.callback(self.locals, self.globals)) if self.callback is not None else True


class CheckpointCallback(BaseCallback):
    """model.save(save_path/<name_prefix>_<num_timesteps>_steps) every save_freq calls (and the replay:
    <name_prefix>_replay_buffer_<num_timesteps>_steps.pkl with save_replay_buffer=True)."""

    def __init__(self, save_freq: int, save_path: str, name_prefix: str = "rl_model", save_replay_buffer: bool = False,
                 save_vecnormalize: bool = False, verbose: int = 0):
        super().__init__(verbose)
        self.save_freq, self.save_path, self.name_prefix = save_freq, save_path, name_prefix
        self.save_replay_buffer, self.save_vecnormalize = save_replay_buffer, save_vecnormalize

    def _init_callback(self) -> None:
        if self.save_path is not None:
            os.makedirs(self.save_path, exist_ok=True)

    def _checkpoint_path(self, checkpoint_type: str = "", extension: str = "") -> str:
        return os.path.join(self.save_path, f"{self.name_prefix}_{checkpoint_type}{self.num_timesteps}_steps.{extension}")

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            path = self._checkpoint_path(extension="zip")
            self.model.save(path)
            if self.verbose >= 2:
                print(f"Saving model checkpoint to {path}")
            if self.save_replay_buffer and getattr(self.model, "replay_buffer", None) is not None:
                path = self._checkpoint_path("replay_buffer_", extension="pkl")
                self.model.save_replay_buffer(path)
                if self.verbose > 1:
                    print(f"Saving model replay buffer checkpoint to {path}")
        return True


class EvalCallback(EventCallback):
    """Evaluate the model every eval_freq calls on eval_env (an id, a gymnasium.Env or a vector env) for
    n_eval_episodes episodes (hetrl/evaluate.py: side by side, each env its first episode); keeps
    best_mean_reward, saves best_model to best_model_save_path, writes log_path/evaluations.npz, and calls
    callback_on_new_best / callback_after_eval as SB3's does."""

    def __init__(self, eval_env: Any, callback_on_new_best: BaseCallback | None = None,
                 callback_after_eval: BaseCallback | None = None, n_eval_episodes: int = 5, eval_freq: int = 10000,
                 log_path: str | None = None, best_model_save_path: str | None = None, deterministic: bool = True,
                 render: bool = False, verbose: int = 1, warn: bool = True):
        super().__init__(callback_after_eval, verbose=verbose)
        from hetrl.sb3.envs import convert

        self.callback_on_new_best = callback_on_new_best
        if callback_on_new_best is not None:
            callback_on_new_best.parent = self
        self.eval_env = eval_env
        self._spec = convert(eval_env).spec
        self.n_eval_episodes, self.eval_freq = n_eval_episodes, eval_freq
        self.best_mean_reward = self.last_mean_reward = -np.inf
        self.deterministic, self.render, self.warn = deterministic, render, warn
        self.best_model_save_path = best_model_save_path
        self.log_path = os.path.join(log_path, "evaluations") if log_path is not None else None
        self.evaluations_results: list = []
        self.evaluations_timesteps: list = []
        self.evaluations_length: list = []
        self._evals = 0

    def _init_callback(self) -> None:
        if self.best_model_save_path is not None:
            os.makedirs(self.best_model_save_path, exist_ok=True)
        if self.log_path is not None:
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        if self.callback_on_new_best is not None:
            self.callback_on_new_best.init_callback(self.model)

    def _on_step(self) -> bool:
        go = True
        if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
            rewards, lengths = evaluate_policy(self.model, self._spec, self.n_eval_episodes, self.deterministic,
                                               seed=self.model.seed + 10_000 + 1000 * self._evals)
            self._evals += 1
            if self.log_path is not None:
                self.evaluations_timesteps.append(self.num_timesteps)
                self.evaluations_results.append(rewards)
                self.evaluations_length.append(lengths)
                np.savez(self.log_path, timesteps=self.evaluations_timesteps, results=self.evaluations_results,
                         ep_lengths=self.evaluations_length)
            mean, std = float(np.mean(rewards)), float(np.std(rewards))
            self.last_mean_reward = mean
            if self.verbose >= 1:
                print(f"Eval num_timesteps={self.num_timesteps}, episode_reward={mean:.2f} +/- {std:.2f}")
                print(f"Episode length: {np.mean(lengths):.2f} +/- {np.std(lengths):.2f}")
            self.logger.record("eval/mean_reward", mean)
            self.logger.record("eval/mean_ep_length", float(np.mean(lengths)))
            self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
            self.logger.dump(self.num_timesteps)
            if mean > self.best_mean_reward:
                if self.verbose >= 1:
                    print("New best mean reward!")
                if self.best_model_save_path is not None:
                    self.model.save(os.path.join(self.best_model_save_path, "best_model"))
                self.best_mean_reward = mean
                if self.callback_on_new_best is not None:
                    go = self.callback_on_new_best.on_step()
            if self.callback is not None:
                go = go and self._on_event()
        return go


def evaluate_policy(model, env: Any, n_eval_episodes: int = 10, deterministic: bool = True, seed: int = 0
                    ) -> tuple[list[float], list[int]]:
    """(returns, lengths) of n_eval_episodes episodes of `model.predict` on `env` (an EnvSpec: an id or a factory;
    hetrl/evaluate.py plays them side by side)."""
    from hetrl.evaluate import evaluate

    ev = evaluate(lambda obs: model.predict(obs, deterministic=deterministic)[0], env, n_eval_episodes, seed)
    return ev["eval_returns"], ev["eval_lengths"]


class StopTrainingOnRewardThreshold(BaseCallback):
    """Stop when the parent EvalCallback's best mean reward reaches reward_threshold (use as callback_on_new_best)."""

    def __init__(self, reward_threshold: float, verbose: int = 0):
        super().__init__(verbose)
        self.reward_threshold = reward_threshold

    def _on_step(self) -> bool:
        if self.parent is None:
            raise UsageError("StopTrainingOnRewardThreshold must be an EvalCallback's callback_on_new_best")
        go = bool(self.parent.best_mean_reward < self.reward_threshold)
        if self.verbose >= 1 and not go:
            print(f"Stopping training because the mean reward {self.parent.best_mean_reward:.2f} is above the "
                  f"threshold {self.reward_threshold}")
        return go


class StopTrainingOnNoModelImprovement(BaseCallback):
    """Stop after max_no_improvement_evals evaluations without a new best (after min_evals); an EvalCallback's
    callback_after_eval."""

    def __init__(self, max_no_improvement_evals: int, min_evals: int = 0, verbose: int = 0):
        super().__init__(verbose)
        self.max_no_improvement_evals, self.min_evals = max_no_improvement_evals, min_evals
        self.last_best_mean_reward = -np.inf
        self.no_improvement_evals = 0

    def _on_step(self) -> bool:
        if self.parent is None:
            raise UsageError("StopTrainingOnNoModelImprovement must be an EvalCallback's callback_after_eval")
        go = True
        if self.n_calls > self.min_evals:
            if self.parent.best_mean_reward > self.last_best_mean_reward:
                self.no_improvement_evals = 0
            else:
                self.no_improvement_evals += 1
                if self.no_improvement_evals > self.max_no_improvement_evals:
                    go = False
        self.last_best_mean_reward = self.parent.best_mean_reward
        if self.verbose >= 1 and not go:
            print(f"Stopping training because there was no new best model in the last {self.no_improvement_evals:d} "
                  "evaluations")
        return go


class StopTrainingOnMaxEpisodes(BaseCallback):
    """Stop after max_episodes episodes per env (counted from locals['dones'])."""

    def __init__(self, max_episodes: int, verbose: int = 0):
        super().__init__(verbose)
        self.max_episodes, self.n_episodes = max_episodes, 0

    def _init_callback(self) -> None:
        self._total_max_episodes = self.max_episodes * self.model.n_envs

    def _on_step(self) -> bool:
        self.n_episodes += int(np.sum(self.locals["dones"]))
        return self.n_episodes < self._total_max_episodes


class EveryNTimesteps(EventCallback):
    """Trigger `callback` every n_steps env steps."""

    def __init__(self, n_steps: int, callback: BaseCallback):
        super().__init__(callback)
        self.n_steps, self.last_time_trigger = n_steps, 0

    def _on_step(self) -> bool:
        if (self.num_timesteps - self.last_time_trigger) >= self.n_steps:
            self.last_time_trigger = self.num_timesteps
            return self._on_event()
        return True


class ProgressBarCallback(BaseCallback):
    """A progress bar of the env steps (rich)."""

    def _on_training_start(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("{task.completed:,}/{task.total:,} steps"), BarColumn(), TimeRemainingColumn())
        self._task = self._bar.add_task("learn", total=self.locals["total_timesteps"] - self.model.num_timesteps)
        self._bar.start()
        self._start = self.model.num_timesteps

    def _on_step(self) -> bool:
        self._bar.update(self._task, completed=self.num_timesteps - self._start)
        return True

    def _on_training_end(self) -> None:
        self._bar.stop()


def convert(callback: Any):
    """SB3's `MaybeCallback`: None, a callback (hetrl's or SB3's), a list of them, or a function f(locals, globals)."""
    if callback is None:
        return CallbackList([])
    if isinstance(callback, (list, tuple)):
        return CallbackList([convert(c) for c in callback])
    if hasattr(callback, "init_callback") and hasattr(callback, "on_step"):
        return callback
    if callable(callback):
        return ConvertCallback(callback)
    raise UsageError(f"callback of type {type(callback).__name__} is not a callback; pass a BaseCallback, a list of "
                     "them, or a function f(locals, globals) -> bool")


def progress_bar(total: int):
    """SB3's progress bar (its ProgressBarCallback's: tqdm.rich) over `total` env steps."""
    try:
        import warnings

        from tqdm import TqdmExperimentalWarning
        from tqdm.rich import tqdm
    except ImportError:
        raise UsageError("learn(progress_bar=True) draws SB3's bar with tqdm and rich; pip install tqdm rich (SB3's "
                         "extra has them), or leave progress_bar=False") from None
    warnings.filterwarnings("ignore", category=TqdmExperimentalWarning)
    return tqdm(total=max(0, int(total)))


class Hook:
    """The Run's hook (`Run.learn(callback=...)`: training_start / phase / training_end) driving SB3's protocol
    for the SB3-style model (see the module's doc)."""

    def __init__(self, model, callback, learn_locals: dict, log_interval: int | None = None):
        self.model, self.cb, self.log_interval = model, callback, log_interval
        self.learn_locals = learn_locals
        self.n = max(1, int(model.n_envs))
        # no callback of the user's: the phases only count (no per-step playback)
        self.empty = isinstance(callback, CallbackList) and not callback.callbacks
        self.shown = 0
        self.carried: list = []
        self.bar, self.bar_at = None, 0   # learn(progress_bar=True): SB3's bar (tqdm.rich), moved per phase

    def training_start(self, run) -> None:
        m = self.model
        self.shown = m.num_timesteps = run.env_steps if run is not None else m.num_timesteps
        if self.learn_locals.get("progress_bar") and run is not None:
            self.bar = progress_bar(self.learn_locals["total_timesteps"] - m.num_timesteps)
            self.bar_at = m.num_timesteps
        self.cb.on_training_start(self.learn_locals, globals())

    def phase(self, run, episodes: list) -> bool:
        m = self.model
        steps = run.env_steps
        go = True
        if self.empty:
            self.shown = m.num_timesteps = steps
        else:
            go = self._play((steps - self.shown) // self.n, episodes, steps)
        m._episodes(episodes, self.log_interval)
        self._advance(steps)
        return go

    def _advance(self, steps: int) -> None:
        if self.bar is not None and steps > self.bar_at:
            self.bar.update(steps - self.bar_at)
            self.bar_at = steps

    def _play(self, calls: int, episodes: list, steps: int) -> bool:
        m, n = self.model, self.n
        eps = self.carried + list(episodes)
        if calls <= 0:
            self.carried = eps
            return True
        self.carried = []
        # the episodes at the phase's last vector steps, n per step at most (latest last)
        marks: dict[int, list] = {}
        k = calls
        while eps and k >= 1:
            marks[k], eps = eps[-n:], eps[:-n]
            k -= 1
        self.carried = eps   # more than the phase's steps can hold (a phase's episodes came in a later phase)
        cb, go, done_eps = self.cb, True, 0
        cb.on_rollout_start()
        for i in range(1, calls + 1):
            self.shown += n
            m.num_timesteps = self.shown
            ended = marks.get(i, ())
            done_eps += len(ended)
            dones = np.zeros(n, dtype=bool)
            infos: list[dict] = [{} for _ in range(n)]
            for j, (r, length) in enumerate(ended):
                dones[n - len(ended) + j] = True
                infos[n - len(ended) + j]["episode"] = {"r": float(r), "l": int(length)}
            cb.update_locals({"num_collected_steps": i, "num_collected_episodes": done_eps, "dones": dones,
                              "infos": infos, "continue_training": go})
            if cb.on_step() is False:
                go = False
                break
        m.num_timesteps = steps
        cb.on_rollout_end()
        return go

    def training_end(self, run) -> None:
        m = self.model
        if run is not None:
            steps = run.env_steps
            if not self.empty and steps > self.shown and run.interrupted != "callback":
                self._play(1, [], steps)   # the run's last vector step, where it kept fewer envs
            self.shown = m.num_timesteps = steps
            self._advance(steps)
        self.close_bar()
        self.cb.on_training_end()

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.refresh()
            self.bar.close()
            self.bar = None

