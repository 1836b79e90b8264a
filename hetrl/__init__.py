"""hetrl: parallel deep-RL training systems on heterogeneous machines (PEARL).

    import hetrl
    run = hetrl.train("dqn", env="CartPole-v1", steps=50_000, seed=0)
    run.evaluate(episodes=10)
    run.save("runs/cartpole")
    policy = hetrl.load("runs/cartpole"); action = policy.act(obs)
"""

import os as _os

__version__ = "0.1.0"

# OpenMP threads that spin while waiting fight any other busy process for the cores, and a
# 2-thread learner then runs ~5x slower than a 1-thread one (measured here). Passive waiting
# keeps the 2-thread speed-up under contention. Only effective before torch is imported.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from hetrl.errors import HetrlError, UsageError  # noqa: E402


def __getattr__(name):  # lazy: `import hetrl` stays cheap (no torch import) for the CLI's --help
    if name in ("train", "resume", "load", "Run", "Policy"):
        from hetrl import api

        return getattr(api, name)
    raise AttributeError(name)


__all__ = ["train", "resume", "load", "Run", "Policy", "HetrlError", "UsageError", "__version__"]
