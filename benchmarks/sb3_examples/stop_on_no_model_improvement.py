# Stable-Baselines3's documentation, docs/guide/callbacks.md, StopTrainingOnNoModelImprovement, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: model.learn(int(1e10), -> model.learn(10_000,)
import gymnasium as gym

from hetrl import SAC
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnNoModelImprovement

# Separate evaluation env
eval_env = gym.make("Pendulum-v1")
# Stop training if there is no improvement after more than 3 evaluations
stop_train_callback = StopTrainingOnNoModelImprovement(max_no_improvement_evals=3, min_evals=5, verbose=1)
eval_callback = EvalCallback(eval_env, eval_freq=1000, callback_after_eval=stop_train_callback, verbose=1)

model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, verbose=1)
# Almost infinite number of timesteps, but the training will stop early
# as soon as the number of consecutive evaluations without model
# improvement is greater than 3
model.learn(10_000, callback=eval_callback)
