# Stable-Baselines3's documentation, docs/guide/quickstart.md, Getting Started (one-liner), as written there with the algorithm imported from hetrl
from hetrl import A2C

model = A2C("MlpPolicy", "CartPole-v1").learn(10_000)
