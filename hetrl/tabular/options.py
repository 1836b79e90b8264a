"""Names of the tabular settings (no heavy imports: the CLI parser reads them for --help)."""

ALGOS = ("qlearning", "sarsa")
DTYPES = ("float32", "int32")
MODES = ("offline", "online")
BACKENDS = ("threads", "prange")  # worker parallelism, see parallel.py
SARSA_NEXT = ("policy", "data")  # offline SARSA's a': learner's epsilon-greedy, or the data's
MERGES = ("mean", "weighted", "sum")  # see merge.py
BEHAVIOURS = ("random", "epsilon-greedy")  # dataset behaviour policies, see dataset.py
