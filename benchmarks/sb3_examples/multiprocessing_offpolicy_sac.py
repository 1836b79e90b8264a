# Stable-Baselines3's documentation, docs/guide/examples.md, Multiprocessing with off-policy algorithms, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: total_timesteps=10_000 -> total_timesteps=2_000; "Pendulum-v0" -> "Pendulum-v1": gymnasium has v1 only, SB3 fails on v0 too)
import gymnasium as gym

from hetrl import SAC
from stable_baselines3.common.env_util import make_vec_env

vec_env = make_vec_env("Pendulum-v1", n_envs=4, seed=0)

# We collect 4 transitions per call to `env.step()`
# and performs 2 gradient steps per call to `env.step()`
# if gradient_steps=-1, then we would do 4 gradients steps per call to `env.step()`
model = SAC("MlpPolicy", vec_env, train_freq=1, gradient_steps=2, verbose=1)
model.learn(total_timesteps=2_000)
