# Stable-Baselines3's documentation, docs/guide/tensorboard.md, Logging More Values, as written there with the algorithm imported from hetrl
# (small budget / headless / installed env: model.learn(50000, -> model.learn(2000,)
import numpy as np

from hetrl import SAC
from stable_baselines3.common.callbacks import BaseCallback

model = SAC("MlpPolicy", "Pendulum-v1", tensorboard_log="/tmp/sac/", verbose=1)


class TensorboardCallback(BaseCallback):
    """
    Custom callback for plotting additional values in tensorboard.
    """

    def __init__(self, verbose=0):
        super().__init__(verbose)

    def _on_step(self) -> bool:
        # Log scalar value (here a random variable)
        value = np.random.random()
        self.logger.record("random_value", value)
        return True


model.learn(2000, callback=TensorboardCallback())
