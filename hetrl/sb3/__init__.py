"""Stable-Baselines3's interface over hetrl: one class per registered algorithm, SB3's constructor arguments and
defaults, learn / predict / save / load / callbacks (docs/sb3.md).

    from hetrl import SAC                  # or hetrl.sb3.model_class("myalgo") for an algorithm of your own
    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3).learn(20_000)

Parts: args.py (SB3's arguments -> settings), envs.py (the env given -> what hetrl trains on), model.py (the
classes), policy.py (model.policy), logger.py (model.logger), noise.py, callbacks.py (SB3's callback protocol; also
`hetrl.callbacks`), zoo.py (rl-baselines3-zoo hyperparameter files), compat.py (each algorithm's SB3 facts).
"""

from __future__ import annotations

from hetrl.sb3.compat import SB3Compat
from hetrl.sb3.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise


def model_class(name: str):
    """The SB3-style class of the registered algorithm `name`."""
    from hetrl.sb3.model import model_class as make

    return make(name)


def class_for(attr: str):
    """The class named `attr` (DQN, SAC, CrossQ, ...) of a registered algorithm, or None."""
    from hetrl import registry
    from hetrl.sb3.model import class_name

    name = attr.lower()   # a class name spells its algorithm's registered name (hetrl/sb3/compat.py)
    if name not in registry.names():
        return None
    return model_class(name) if class_name(name) == attr else None


def __getattr__(attr: str):
    if attr in ("OffPolicyModel", "ReplayBufferView"):
        from hetrl.sb3 import model

        return getattr(model, attr)
    cls = class_for(attr) if attr[:1].isupper() else None
    if cls is None:
        raise AttributeError(attr)
    return cls


__all__ = ["model_class", "class_for", "SB3Compat", "NormalActionNoise", "OrnsteinUhlenbeckActionNoise"]
