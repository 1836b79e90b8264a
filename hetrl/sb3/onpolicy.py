"""SB3's on-policy algorithm interface (PPO, A2C, and an on-policy algorithm of one's own) over hetrl's one
training path: the off-policy classes' construction, learn, predict, save and load (hetrl/sb3/model.py), with
what SB3's OnPolicyAlgorithm does differently:

* its constructor's arguments (n_steps, batch_size, n_epochs, gae_lambda, clip_range (a number, rl-zoo's lin_X or
  a constant or linear callable), clip_range_vf, normalize_advantage, ent_coef, vf_coef, target_kl, use_rms_prop,
  ...) and policy_kwargs (net_arch=dict(pi=..., vf=...), activation_fn (tanh by default), ortho_init,
  log_std_init), mapped by hetrl/sb3/args.py;
* `learn(log_interval=1)` logs every log_interval rollouts (SB3's iterations), with the loss scalars SB3 logs
  (train/policy_gradient_loss, value_loss, entropy_loss, approx_kl, clip_fraction, loss, explained_variance,
  clip_range, std; A2C: policy_loss, value_loss, entropy_loss, explained_variance), read from the algorithm's
  `stats` when a table is written;
* callbacks: on_rollout_start, on_step once per vector step of the rollout and on_rollout_end, per rollout (hetrl
  plays them back after the rollout's learner phase);
* an SB3 VecNormalize given as env: hetrl normalises as it does (the algorithm's normalize_obs / normalize_reward,
  clip_obs, clip_reward) and writes the statistics it learned back into the user's VecNormalize after learn(), so
  `env.save(...)`, `VecNormalize.load(...)` with `training=False` and `model.get_vec_normalize_env()` work; `predict`
  then takes observations as that VecNormalize gives them (normalised).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from hetrl.errors import UsageError
from hetrl.sb3 import args as sb3args
from hetrl.sb3 import envs as sb3envs
from hetrl.sb3.model import OffPolicyModel


class OnPolicyModel(OffPolicyModel):
    """SB3's on-policy algorithm interface for the registered algorithm `algo` (see the module's doc)."""

    def _check_env_settings(self, conv: sb3envs.Converted, sb3: dict) -> None:
        super()._check_env_settings(conv, sb3)
        vn = conv.vec_normalize
        if vn is not None and conv.settings.get("normalize_reward") and \
                not math.isclose(float(vn.gamma), float(sb3.get("gamma", 0.99))):
            raise UsageError(f"{type(self).__name__}(): VecNormalize(gamma={vn.gamma}) scales rewards by returns of "
                             f"another discount than the model's gamma={sb3.get('gamma')}; hetrl's reward "
                             "normalisation uses the model's: give VecNormalize the same gamma")

    @property
    def rollout_size(self) -> int:
        """Transitions per rollout: n_steps x n_envs."""
        return int(self.hetrl_settings.get("n_steps", 1)) * int(self.n_envs)

    @property
    def exploration_rate(self) -> float:
        raise AttributeError(f"{type(self).__name__} has no exploration_rate (it explores by its policy's "
                             "distribution)")

    def learn(self, total_timesteps: int, callback=None, log_interval: int | None = None,
              tb_log_name: str | None = None, reset_num_timesteps: bool = True,
              progress_bar: bool = False) -> "OnPolicyModel":
        """Train for total_timesteps env steps, in whole rollouts (SB3's learn: the last one may pass it); a table
        every log_interval rollouts (default SB3's: PPO 1, A2C 100)."""
        if log_interval is None:
            log_interval = sb3args.compat(self.algo).log_interval
        self._iterations_logged = 0 if reset_num_timesteps else self.num_timesteps // max(1, self.rollout_size)
        try:
            super().learn(total_timesteps, callback, log_interval, tb_log_name, reset_num_timesteps, progress_bar)
        finally:
            sb3envs.sync_vec_normalize(self.get_vec_normalize_env(), self._algo())
        return self

    def get_vec_normalize_env(self):
        """The user's VecNormalize (the env given, or under its wrappers), with the statistics hetrl learned."""
        return self._conv.vec_normalize if self._conv is not None else None

    def _predictor(self):
        pol = super()._predictor()
        if self.get_vec_normalize_env() is not None:   # the user's VecNormalize gives normalised observations
            norm = getattr(getattr(pol._p, "net", None), "norm", None)
            if norm is not None and hasattr(norm, "active"):
                norm.active = False
        return pol

    # ---- logging -------------------------------------------------------------------------------------------
    def _episodes(self, episodes: list, log_interval: int | None) -> None:
        t = (time.time_ns() - self.start_time) / 1e9
        if self._monitor:
            self._monitor.write(episodes)
        for r, n in episodes:
            self.ep_info_buffer.append({"r": float(r), "l": int(n), "t": round(t, 6)})
            self._episode_num += 1
        it = self.num_timesteps // max(1, self.rollout_size)
        done = getattr(self, "_iterations_logged", 0)
        if log_interval and it // log_interval > done // log_interval and self._logs():
            self.dump_logs()
        self._iterations_logged = it

    def dump_logs(self) -> None:
        """SB3's on-policy training table: time/iterations, rollout/ep_rew_mean and ep_len_mean, time/fps, and the
        train/ scalars of the last rollout's update."""
        lg = self.logger
        dt = max((time.time_ns() - self.start_time) / 1e9, 1e-9)
        lg.record("time/iterations", self.num_timesteps // max(1, self.rollout_size), exclude="tensorboard")
        if self.ep_info_buffer:
            lg.record("rollout/ep_rew_mean", float(np.mean([e["r"] for e in self.ep_info_buffer])))
            lg.record("rollout/ep_len_mean", float(np.mean([e["l"] for e in self.ep_info_buffer])))
        lg.record("time/fps", int(self.num_timesteps / dt))
        lg.record("time/time_elapsed", int(dt), exclude="tensorboard")
        lg.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        stats: dict[str, Any] = self.run.train_stats() if self.run is not None else {}
        for k, v in stats.items():
            lg.record(f"train/{k}", v)
        algo, s = self._algo(), self.hetrl_settings
        per_epoch = max(1, math.ceil(self.rollout_size / max(1, int(s.get("batch_size") or self.rollout_size))))
        lg.record("train/n_updates", int(algo.updates) // per_epoch, exclude="tensorboard")
        lg.record("train/learning_rate", float(self._lr_fn(self._progress()) if self._lr_fn else s.get("lr", 0.0)))
        lg.dump(step=self.num_timesteps)
