# Stable-Baselines3's documentation, docs/guide/tensorboard.md, Basic Usage, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: total_timesteps=10_000 -> total_timesteps=2_000)
from hetrl import A2C

model = A2C("MlpPolicy", "CartPole-v1", verbose=1, tensorboard_log="./a2c_cartpole_tensorboard/")
model.learn(total_timesteps=2_000, tb_log_name="first_run")
# Pass reset_num_timesteps=False to continue the training curve in tensorboard
# By default, it will create a new curve
# Keep tb_log_name constant to have continuous curve (see note below)
model.learn(total_timesteps=2_000, tb_log_name="second_run", reset_num_timesteps=False)
model.learn(total_timesteps=2_000, tb_log_name="third_run", reset_num_timesteps=False)
