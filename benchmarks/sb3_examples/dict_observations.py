# Stable-Baselines3's documentation, docs/guide/examples.md, Dict Observations, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: total_timesteps=100_000 -> total_timesteps=2_000)
from hetrl import PPO
from stable_baselines3.common.envs import SimpleMultiObsEnv


# Stable Baselines provides SimpleMultiObsEnv as an example environment with Dict observations
env = SimpleMultiObsEnv(random_start=False)

model = PPO("MultiInputPolicy", env, verbose=1)
model.learn(total_timesteps=2_000)
