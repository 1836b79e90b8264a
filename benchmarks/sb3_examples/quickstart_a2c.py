# Stable-Baselines3's documentation, docs/guide/quickstart.md, Getting Started, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: vec_env.render("human") -> vec_env.render())
import gymnasium as gym

from hetrl import A2C

env = gym.make("CartPole-v1", render_mode="rgb_array")

model = A2C("MlpPolicy", env, verbose=1)
model.learn(total_timesteps=10_000)

vec_env = model.get_env()
obs = vec_env.reset()
for i in range(1000):
    action, _state = model.predict(obs, deterministic=True)
    obs, reward, done, info = vec_env.step(action)
    vec_env.render()
    # VecEnv resets automatically
    # if done:
    #   obs = vec_env.reset()
