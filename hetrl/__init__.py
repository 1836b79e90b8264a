"""hetrl: parallel deep-RL training systems on heterogeneous machines (PEARL).

    import hetrl
    run = hetrl.train("dqn", env="CartPole-v1", steps=50_000, seed=0)
    run.evaluate(episodes=10)
    run.save("runs/cartpole")
    policy = hetrl.load("runs/cartpole"); action = policy.act(obs)

Stable-Baselines3's interface (change one import; docs/sb3.md): every registered algorithm has a class,
    from hetrl import SAC          # DQN, DDPG, TD3, SAC, CrossQ, or hetrl.sb3.model_class("myalgo")
    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3).learn(20_000)

An algorithm of your own: subclass hetrl.Algorithm (on-policy: hetrl.OnPolicyAlgorithm) and
hetrl.register_algorithm("name", cls) (docs/extending.md).
"""

__version__ = "0.1.0"

# OpenMP's wait policy is left at libgomp's default (spin a little, then sleep): with passive
# waiting (OMP_WAIT_POLICY=PASSIVE) a learner's threads sleep at every barrier of its small
# products and gain little over one thread; spinning threads gain when the process has its cores
# to itself. Spinning threads that share cores with other busy processes collapse instead (each
# barrier waits for a thread the OS descheduled: several times slower), so the local and ray
# schedules give the learner only the cores no actor takes, and the planner prices a
# multi-threaded learner on cores that busy actors share (hetrl/planner/model.py, SPIN).

from hetrl.errors import HetrlError, LearnContractError, UsageError  # noqa: E402
from hetrl.registry import register_algorithm  # noqa: E402


def __getattr__(name):  # lazy: `import hetrl` stays cheap (no torch import) for the CLI's --help
    if name in ("train", "resume", "load", "Run", "Policy"):
        from hetrl import api

        return getattr(api, name)
    if name in ("Algorithm", "ActingPolicy", "OnPolicyAlgorithm", "OnPolicyConfig"):
        from hetrl import algorithm

        return getattr(algorithm, name)
    if name == "Config":
        from hetrl.config import Config

        return Config
    if name[:1].isupper():   # DQN, SAC, CrossQ, ...: an SB3-style class of a registered algorithm (docs/sb3.md)
        from hetrl.sb3 import class_for

        cls = class_for(name)
        if cls is not None:
            return cls
    raise AttributeError(name)


__all__ = ["train", "resume", "load", "Run", "Policy", "register_algorithm", "Algorithm", "ActingPolicy", "Config",
           "OnPolicyAlgorithm", "OnPolicyConfig", "HetrlError", "LearnContractError", "UsageError", "__version__"]
