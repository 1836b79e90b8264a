# Stable-Baselines3's documentation, docs/guide/callbacks.md, ProgressBarCallback, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: model.learn(100_000, -> model.learn(3_000,)
from hetrl import PPO
from stable_baselines3.common.callbacks import ProgressBarCallback

model = PPO("MlpPolicy", "Pendulum-v1")
# Display progress bar using the progress bar callback
# this is equivalent to model.learn(3_000, callback=ProgressBarCallback())
model.learn(3_000, progress_bar=True)
