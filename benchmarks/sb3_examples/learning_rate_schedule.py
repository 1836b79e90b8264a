# Stable-Baselines3's documentation, docs/guide/examples.md, Learning Rate Schedule, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: total_timesteps=20_000 -> total_timesteps=4_000; total_timesteps=10_000 -> total_timesteps=2_000)
from typing import Callable

from hetrl import PPO


def linear_schedule(initial_value: float) -> Callable[[float], float]:
    """
    Linear learning rate schedule.

    :param initial_value: Initial learning rate.
    :return: schedule that computes
      current learning rate depending on remaining progress
    """
    def func(progress_remaining: float) -> float:
        """
        Progress will decrease from 1 (beginning) to 0.

        :param progress_remaining:
        :return: current learning rate
        """
        return progress_remaining * initial_value

    return func

# Initial learning rate of 0.001
model = PPO("MlpPolicy", "CartPole-v1", learning_rate=linear_schedule(0.001), verbose=1)
model.learn(total_timesteps=4_000)
# By default, `reset_num_timesteps` is True, in which case the learning rate schedule resets.
# progress_remaining = 1.0 - (num_timesteps / total_timesteps)
model.learn(total_timesteps=2_000, reset_num_timesteps=True)
