# Stable-Baselines3's documentation, docs/guide/callbacks.md, CallbackList, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: model.learn(5000, -> model.learn(2000,)
import gymnasium as gym

from hetrl import SAC
from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback, EvalCallback

checkpoint_callback = CheckpointCallback(save_freq=1000, save_path="./logs/")
# Separate evaluation env
eval_env = gym.make("Pendulum-v1")
eval_callback = EvalCallback(eval_env, best_model_save_path="./logs/best_model",
                             log_path="./logs/results", eval_freq=500)
# Create the callback list
callback = CallbackList([checkpoint_callback, eval_callback])

model = SAC("MlpPolicy", "Pendulum-v1")
# Equivalent to:
# model.learn(2000, callback=[checkpoint_callback, eval_callback])
model.learn(2000, callback=callback)
