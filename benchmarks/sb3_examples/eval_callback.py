# Stable-Baselines3's documentation, docs/guide/callbacks.md, EvalCallback, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: model.learn(5000, -> model.learn(2000,)
import gymnasium as gym

from hetrl import SAC
from stable_baselines3.common.callbacks import EvalCallback

# Separate evaluation env
eval_env = gym.make("Pendulum-v1")
# Use deterministic actions for evaluation
eval_callback = EvalCallback(eval_env, best_model_save_path="./logs/",
                             log_path="./logs/", eval_freq=500,
                             deterministic=True, render=False)

model = SAC("MlpPolicy", "Pendulum-v1")
model.learn(2000, callback=eval_callback)
