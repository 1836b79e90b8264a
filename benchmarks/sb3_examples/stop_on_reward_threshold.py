# Stable-Baselines3's documentation, docs/guide/callbacks.md, StopTrainingOnRewardThreshold, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: model.learn(int(1e10), -> model.learn(10_000,)
import gymnasium as gym

from hetrl import SAC
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold

# Separate evaluation env
eval_env = gym.make("Pendulum-v1")
# Stop training when the model reaches the reward threshold
callback_on_best = StopTrainingOnRewardThreshold(reward_threshold=-200, verbose=1)
eval_callback = EvalCallback(eval_env, callback_on_new_best=callback_on_best, verbose=1)

model = SAC("MlpPolicy", "Pendulum-v1", verbose=1)
# Almost infinite number of timesteps, but the training will stop
# early as soon as the reward threshold is reached
model.learn(10_000, callback=eval_callback)
