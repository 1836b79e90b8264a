# Stable-Baselines3's documentation, docs/guide/callbacks.md, EveryNTimesteps, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: model.learn(20_000, -> model.learn(4_000,)
import gymnasium as gym

from hetrl import PPO
from stable_baselines3.common.callbacks import CheckpointCallback, EveryNTimesteps

# this is equivalent to defining CheckpointCallback(save_freq=500)
# checkpoint_callback will be triggered every 500 steps
checkpoint_on_event = CheckpointCallback(save_freq=1, save_path="./logs/")
event_callback = EveryNTimesteps(n_steps=500, callback=checkpoint_on_event)

model = PPO("MlpPolicy", "Pendulum-v1", verbose=1)

model.learn(4_000, callback=event_callback)
