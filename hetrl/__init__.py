"""hetrl: parallel deep-RL training systems on heterogeneous machines (PEARL).

    import hetrl
    run = hetrl.train("dqn", env="CartPole-v1", steps=50_000, seed=0)
    run.evaluate(episodes=10)
    run.save("runs/cartpole")
    policy = hetrl.load("runs/cartpole"); action = policy.act(obs)
"""

__version__ = "0.1.0"

from hetrl.errors import HetrlError, UsageError  # noqa: E402


def __getattr__(name):  # lazy: `import hetrl` stays cheap (no torch import) for the CLI's --help
    if name in ("train", "load", "Run", "Policy"):
        from hetrl import api

        return getattr(api, name)
    raise AttributeError(name)


__all__ = ["train", "load", "Run", "Policy", "HetrlError", "UsageError", "__version__"]
