# Stable-Baselines3's documentation, docs/guide/callbacks.md, LogEveryNTimesteps, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: model.learn(10_000, -> model.learn(3_000,)
import gymnasium as gym

from hetrl import PPO
from stable_baselines3.common.callbacks import LogEveryNTimesteps

event_callback = LogEveryNTimesteps(n_steps=1_000)

model = PPO("MlpPolicy", "Pendulum-v1", verbose=1)

# Disable auto-logging by passing `log_interval=None`
model.learn(3_000, callback=event_callback, log_interval=None)
