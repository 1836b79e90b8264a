"""SB3's callback protocol on hetrl's Runs (hetrl/sb3/callbacks.py, also imported as `hetrl.callbacks`): exact
counts, stopping, checkpoints and evaluations under inline and local, a callback that raises, and SB3's own
callbacks unchanged."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from hetrl import DQN, SAC
from hetrl.sb3 import callbacks as hc
from hetrl.errors import UsageError

try:
    import stable_baselines3.common.callbacks as sb3c
except ImportError:
    sb3c = None
needs_sb3 = pytest.mark.skipif(sb3c is None, reason="stable-baselines3 not installed")

FAST = dict(learning_starts=100, train_freq=50, gradient_steps=5, batch_size=32, buffer_size=5000,
            policy_kwargs=dict(net_arch=[32, 32]), seed=0, plan="none", device="cpu", learner_kernel="public")
SCHEDULES = [dict(threads=1), dict(schedule="local", actors=1, threads=0)]


class Counting(hc.BaseCallback):
    def __init__(self, stop_at: int | None = None):
        super().__init__()
        self.stop_at, self.events, self.seen, self.episodes = stop_at, [], [], 0

    def _on_training_start(self):
        self.events.append("start")
        assert {"total_timesteps", "callback", "log_interval", "reset_num_timesteps"} <= set(self.locals)

    def _on_rollout_start(self):
        self.events.append("rollout_start")

    def _on_step(self):
        self.seen.append(self.num_timesteps)
        self.episodes += int(self.locals["dones"].sum())
        for d, info in zip(self.locals["dones"], self.locals["infos"]):
            assert d == ("episode" in info)
        return self.stop_at is None or self.num_timesteps < self.stop_at

    def _on_rollout_end(self):
        self.events.append("rollout_end")

    def _on_training_end(self):
        self.events.append("end")


def test_the_documented_import_path_gives_the_same_callbacks():
    import hetrl.callbacks

    assert all(getattr(hetrl.callbacks, name) is getattr(hc, name) for name in hc.__all__)
    assert hetrl.callbacks.EvalCallback is hc.EvalCallback


@pytest.mark.parametrize("sched", SCHEDULES, ids=["inline", "local"])
def test_on_step_counts_are_exact_and_a_false_stops(sched):
    m = DQN("MlpPolicy", "CartPole-v1", **FAST, **sched)
    cb = Counting()
    m.learn(600, callback=cb)
    assert cb.n_calls == 600 and cb.seen == list(range(1, 601)) and m.num_timesteps == 600
    assert cb.events[0] == "start" and cb.events[-1] == "end"
    assert cb.events.count("rollout_start") == cb.events.count("rollout_end") >= 1
    assert cb.episodes == m._episode_num > 0
    stop = Counting(stop_at=850)
    m.learn(2000, callback=stop, reset_num_timesteps=False)
    assert stop.seen[-1] == 850 and 850 <= m.num_timesteps < 2600   # stopped at the phase's boundary
    m.run.close()


def test_vector_envs_count_calls_per_vector_step():
    import gymnasium as gym

    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    m = DQN("MlpPolicy", venv, **{**FAST, "train_freq": 10}, threads=1)
    cb = Counting()
    m.learn(400, callback=cb)
    assert cb.n_calls == 100 and cb.seen[:2] == [4, 8] and cb.seen[-1] == 400


@pytest.mark.parametrize("sched", SCHEDULES, ids=["inline", "local"])
def test_checkpoint_callback_saves_models_and_replays(tmp_path, sched):
    m = DQN("MlpPolicy", "CartPole-v1", **FAST, **sched)
    m.learn(400, callback=hc.CheckpointCallback(save_freq=150, save_path=str(tmp_path), save_replay_buffer=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rl_model_150_steps.zip", "rl_model_300_steps.zip",
        "rl_model_replay_buffer_150_steps.pkl", "rl_model_replay_buffer_300_steps.pkl"]
    back = DQN.load(tmp_path / "rl_model_300_steps.zip")
    back.load_replay_buffer(tmp_path / "rl_model_replay_buffer_300_steps.pkl")
    assert back.num_timesteps >= 300 and back.replay_buffer.size() >= 300
    if m.run is not None:
        m.run.close()


def test_eval_callback_keeps_the_best_and_stops_on_a_threshold(tmp_path):
    m = SAC("MlpPolicy", "Pendulum-v1", **FAST, threads=1)
    stop = hc.StopTrainingOnRewardThreshold(reward_threshold=-1e9)
    ev = hc.EvalCallback("Pendulum-v1", callback_on_new_best=stop, n_eval_episodes=2, eval_freq=200,
                         best_model_save_path=str(tmp_path / "best"), log_path=str(tmp_path / "logs"), verbose=0)
    m.learn(1000, callback=ev)
    assert m.num_timesteps == 200 and ev.best_mean_reward > -1e9   # stopped at the first evaluation
    assert (tmp_path / "best" / "best_model.zip").is_file()
    logged = np.load(tmp_path / "logs" / "evaluations.npz")
    assert list(logged["timesteps"]) == [200] and logged["results"].shape == (1, 2)
    assert SAC.load(tmp_path / "best" / "best_model").num_timesteps == 200


def test_no_model_improvement_and_lists_and_functions():
    m = DQN("MlpPolicy", "CartPole-v1", **FAST, threads=1)
    no_gain = hc.StopTrainingOnNoModelImprovement(max_no_improvement_evals=0, min_evals=0)
    ev = hc.EvalCallback("CartPole-v1", callback_after_eval=no_gain, n_eval_episodes=2, eval_freq=100, verbose=0)
    calls = []
    m.learn(3000, callback=[ev, lambda locals_, globals_: calls.append(locals_["num_collected_steps"]) or True])
    assert m.num_timesteps < 3000 and len(ev.evaluations_results) == 0   # no log_path: not kept
    assert ev.n_calls == len(calls) >= 200
    with pytest.raises(UsageError, match="is not a callback"):
        m.learn(10, callback=42)


@pytest.mark.parametrize("sched", SCHEDULES, ids=["inline", "local"])
def test_a_callback_that_raises_stops_the_run_and_keeps_the_checkpoint(tmp_path, sched):
    class Boom(hc.BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= 300:
                raise RuntimeError("boom")
            return True

    m = DQN("MlpPolicy", "CartPole-v1", **FAST, **sched, out=str(tmp_path / "run"))
    with pytest.raises(RuntimeError, match="boom"):
        m.learn(1000, callback=Boom())
    assert (tmp_path / "run" / "checkpoint.pt").is_file() and m.run is None
    assert DQN.load(tmp_path / "run").num_timesteps >= 300
    m.learn(200, reset_num_timesteps=False)   # the model goes on from what it had
    assert m.num_timesteps >= 500
    m.run.close()


# ---- SB3's own callbacks, unchanged -------------------------------------------------------------------------------------
@needs_sb3
@pytest.mark.parametrize("sched", SCHEDULES, ids=["inline", "local"])
def test_sb3_callbacks_work_unchanged(tmp_path, sched):
    from stable_baselines3.common.env_util import make_vec_env

    m = DQN("MlpPolicy", "CartPole-v1", **FAST, **sched)
    stop = sb3c.StopTrainingOnRewardThreshold(reward_threshold=1e9)   # never reached
    no_gain = sb3c.StopTrainingOnNoModelImprovement(max_no_improvement_evals=100)
    ev = sb3c.EvalCallback(make_vec_env("CartPole-v1", n_envs=2), callback_on_new_best=stop,
                           callback_after_eval=no_gain, n_eval_episodes=2, eval_freq=200,
                           best_model_save_path=str(tmp_path / "best"), log_path=str(tmp_path / "logs"), verbose=0)
    ck = sb3c.CheckpointCallback(save_freq=250, save_path=str(tmp_path / "ck"), save_replay_buffer=True)
    m.learn(600, callback=sb3c.CallbackList([ev, ck]))
    assert m.num_timesteps == 600 and len(ev.evaluations_timesteps) == 3
    assert (tmp_path / "best" / "best_model.zip").is_file()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "rl_model_250_steps.zip", "rl_model_500_steps.zip",
        "rl_model_replay_buffer_250_steps.pkl", "rl_model_replay_buffer_500_steps.pkl"]
    assert DQN.load(tmp_path / "ck" / "rl_model_500_steps").num_timesteps >= 500
    if m.run is not None:
        m.run.close()


@needs_sb3
def test_sb3_stop_on_threshold_and_progress_bar():
    m = SAC("MlpPolicy", "Pendulum-v1", **FAST, threads=1)
    stop = sb3c.StopTrainingOnRewardThreshold(reward_threshold=-1e9, verbose=1)
    ev = sb3c.EvalCallback(gym.make("Pendulum-v1"), callback_on_new_best=stop,
                           n_eval_episodes=1, eval_freq=150, verbose=0, warn=False)
    m.learn(1000, callback=[ev, sb3c.ProgressBarCallback()])
    assert m.num_timesteps == 150
