"""The algorithm protocol: what an algorithm gives hetrl, and what hetrl gives it for free.

An algorithm is a class with the methods of :class:`Algorithm` (subclass it to get the defaults),
registered under a name (hetrl/registry.py)::

    import hetrl
    hetrl.register_algorithm("myalgo", MyAlgo, presets={"default": {"lr": 1e-3}, "Pendulum-v1": {"steps": 20_000}})

From then on `hetrl train myalgo --env ...`, `hetrl.train("myalgo", ...)`, `hetrl plan myalgo`, every
schedule (inline, local processes, Ray), checkpoints and `--resume`, evaluation, `hetrl.load(...).act`
and the planner's profile take it, with no line of hetrl changed. DQN, DDPG, TD3, SAC and CrossQ are
registered through the same door (hetrl/algos/__init__.py). docs/extending.md walks through one.

What an algorithm declares:

* ``Settings``: a dataclass subclass of :class:`hetrl.config.Config` with its own settings and their
  defaults (the common ones: net_arch, activation, layer_norm, lr, gamma, batch_size, buffer_size,
  learning_starts, train_freq, gradient_steps, tau, max_grad_norm, n_step, prioritized, ... are Config's);
* ``action_spaces`` (the gymnasium space classes it acts in) and ``pixels`` (whether it takes image
  observations); :meth:`check_spaces` refuses anything else with one line;
* its networks, built from the spaces and settings in ``__init__(cfg, obs_space, act_space, device)``;
* an acting policy (:meth:`make_policy`): exploring and deterministic actions on a snapshot of
  :meth:`policy_state`, sent to actor processes (so it must pickle);
* :meth:`learn`: K gradient steps on K stacked batches, returning |TD| for the priorities;
* its state (:meth:`state_dict` / :meth:`load_state_dict`: by default the modules named in ``nets``
  and the optimizers in ``optims``), and its replay fields (:meth:`replay_fields`);
* optionally ``sb3``, a :class:`hetrl.sb3.SB3Compat`, read by the SB3 front end alone (hetrl/sb3/compat.py):
  what its Stable-Baselines3-style class (``hetrl.sb3.model_class(name)``) takes from SB3; without it the class
  is the generic one (the built-ins' are in the front end's own table).

The learner core (hetrl/runtime/core.py) owns everything else: replay, the replay ratio, counters,
publishing, checkpoints, evaluation, restarts. A learner *kernel* (hetrl/kernels/) may run `learn`'s
updates faster from outside (compiled on a CPU, a CUDA graph on a GPU) and is checked equal to it; the
algorithm never imports one.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional, Protocol

import gymnasium as gym
import numpy as np
import torch

from hetrl.config import Config
from hetrl.errors import UsageError


class ActingPolicy(Protocol):
    """What an algorithm gives its actors (`Algorithm.make_policy`); it must pickle."""

    def act(self, obs: np.ndarray, explore: Optional[float]) -> tuple[np.ndarray, np.ndarray]:
        """(actions for the env, actions to store in the replay) for a batch of observations;
        explore is the algorithm's `exploration(env_steps)`: None means uniform random actions."""

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """The policy's deterministic (greedy / mean) env actions, for evaluation."""

    def load(self, state: dict) -> None:
        """Take new parameters (a `policy_state()`) from the parameter store."""

    def episode_end(self, done: np.ndarray) -> None:
        """Reset per-env exploration state (e.g. Ornstein-Uhlenbeck noise) where `done`."""


def is_image(space: gym.Space) -> bool:
    """Pixel observations: a 3-D uint8 Box (channels first, e.g. 4 stacked 84x84 frames, or last)."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def transition_fields(obs_space: gym.Space, act_space: gym.Space) -> dict:
    """The data-storage fields of one (n-step) transition: name -> (shape, dtype). Pixel observations stay
    uint8 (the network scales them); discrete actions are int64, continuous ones float32."""
    obs = (tuple(obs_space.shape), "uint8" if is_image(obs_space) else "float32")
    if isinstance(act_space, gym.spaces.Discrete):
        action = ((), "int64")
    else:
        action = (tuple(act_space.shape), "float32")
    return {"obs": obs, "action": action, "reward": ((), "float32"), "next_obs": obs,
            "terminated": ((), "bool"), "truncated": ((), "bool"), "steps": ((), "uint8")}


def _kind(space_cls: type) -> str:
    return {gym.spaces.Discrete: "discrete", gym.spaces.Box: "continuous (Box)"}.get(space_cls, space_cls.__name__)


def _takers(act_space: gym.Space | None = None, pixels: bool = False) -> str:
    """The registered algorithms that act in spaces like `act_space` (or that take pixels), for an error message."""
    from hetrl import registry

    names = []
    for n in registry.names():
        try:
            cls = registry.get(n)
        except UsageError:   # a broken entry point of another package: not this message's business
            continue
        if (isinstance(act_space, cls.action_spaces) if act_space is not None else True) and (cls.pixels or not pixels):
            names.append(n)
    return ", ".join(names) if names else "an algorithm of your own (docs/extending.md)"


def optimizers(algo) -> list[torch.optim.Optimizer]:
    """The torch optimizers an algorithm object holds as attributes (a FlatAdam wraps one as `.opt`)."""
    out = []
    for v in vars(algo).values():
        if isinstance(v, torch.optim.Optimizer):
            out.append(v)
        elif isinstance(getattr(v, "opt", None), torch.optim.Optimizer):
            out.append(v.opt)
    return out


class Algorithm:
    """The base of an off-policy algorithm on hetrl's protocol; subclasses set the class attributes and
    write ``__init__``, ``make_policy``, ``policy_state`` and ``learn``."""

    name: ClassVar[str] = ""                      # set by register_algorithm
    Settings: ClassVar[type[Config]] = Config     # its settings (a Config subclass) and their defaults
    action_spaces: ClassVar[tuple[type[gym.Space], ...]] = (gym.spaces.Discrete, gym.spaces.Box)
    pixels: ClassVar[bool] = False                # takes image observations (the Nature CNN)
    nets: ClassVar[tuple[str, ...]] = ()          # attributes holding nn.Modules a checkpoint saves
    optims: ClassVar[tuple[str, ...]] = ()        # attributes holding optimizers a checkpoint saves
    # settings that change the shapes of its networks or the program its learner runs: the members of a
    # population share them (a sweep over one is refused); Config.SHAPE_SETTINGS are added
    shape_settings: ClassVar[tuple[str, ...]] = ()
    # settings that change when it learns or acts: also shared by a population's members
    schedule_settings: ClassVar[tuple[str, ...]] = ()
    # an SB3Compat for its Stable-Baselines3-style class (hetrl/sb3/compat.py reads it); None: the generic class
    sb3: ClassVar[Any] = None
    updates: int = 0                              # gradient steps taken (checkpointed)

    def __init__(self, cfg: Config, obs_space: gym.Space, act_space: gym.Space,
                 device: str | torch.device = "cpu"):
        self.cfg, self.obs_space, self.act_space = cfg, obs_space, act_space
        self.obs_shape = tuple(obs_space.shape)
        self.device = torch.device(device)
        self.updates = 0
        # the learner's own random numbers (TD3's smoothing noise, SAC's actions): drawn from this generator, so
        # a run's draws do not depend on what else runs in the process (a population's members learn side by
        # side) and a kernel draws exactly what `learn` draws; on a GPU torch's default generator (None), which
        # a CUDA graph captures
        self.rng = torch.Generator().manual_seed(int(cfg.seed)) if self.device.type == "cpu" else None

    # ---- what it takes --------------------------------------------------------------------------
    @classmethod
    def check_spaces(cls, obs_space: gym.Space, act_space: gym.Space) -> None:
        """Raise a UsageError (one line: the problem and the fix) for spaces this algorithm cannot take."""
        name = cls.name.upper() or cls.__name__
        if not isinstance(obs_space, gym.spaces.Box):
            raise UsageError(f"observation space {obs_space} is not a Box and cannot be flattened into one (hetrl "
                             "flattens Discrete, MultiDiscrete, MultiBinary, Tuple and Dict); wrap the env so that "
                             "its observations are an array")
        if not isinstance(act_space, cls.action_spaces):
            kinds = " or ".join(_kind(k) for k in cls.action_spaces)
            raise UsageError(f"{name} needs a {kinds} action space, this env has {act_space}; "
                             f"use {_takers(act_space)} for {_kind(type(act_space)).split(' ')[0]} actions")
        if isinstance(act_space, gym.spaces.Discrete) and act_space.start != 0:
            raise UsageError(f"action space {act_space} does not start at 0; wrap the env to shift actions")
        if isinstance(act_space, gym.spaces.Box) and not act_space.is_bounded("both"):
            raise UsageError(f"{name} needs bounded actions, this env has {act_space}; "
                             "wrap it with gymnasium.wrappers.ClipAction/RescaleAction")
        if is_image(obs_space) and not cls.pixels:
            raise UsageError(f"{name} takes vector observations; this env's are images {obs_space.shape}: choose "
                             f"an algorithm that takes pixels ({_takers(act_space, pixels=True)}), or flatten them "
                             "with a wrapper")

    @classmethod
    def replay_fields(cls, obs_space: gym.Space, act_space: gym.Space) -> dict:
        """The fields of one stored transition, name -> (shape, dtype); `learn` gets them stacked."""
        return transition_fields(obs_space, act_space)

    # ---- acting side ----------------------------------------------------------------------------
    def make_policy(self, seed: int, device: str = "cpu", num_envs: int | None = None) -> ActingPolicy:
        """A new acting policy (its own RNG from `seed`) on a copy of the current policy network."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_policy")

    def policy_state(self) -> dict:
        """The parameters actors need (a state_dict of the policy network), published to them."""
        raise NotImplementedError(f"{type(self).__name__} must implement policy_state")

    def exploration(self, env_steps: int) -> float | None:
        """What actors explore with at global env step `env_steps` (epsilon, a noise scale...); None: uniform
        random actions (the warm-up before learning_starts, as SB3)."""
        return None if env_steps < self.cfg.learning_starts else 1.0

    def on_env_steps(self, before: int, after: int) -> None:
        """The env step count moved from `before` to `after` (e.g. DQN's target copies go by env steps)."""

    def policy_changes(self) -> int | None:
        """How many times the policy network has moved, where it moves less often than every update (TD3's
        delayed actor); the learner core publishes only a moved policy. None: it may move every update."""
        return None

    # ---- learning side --------------------------------------------------------------------------
    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """K gradient steps, one per leading index of `batches` (each field (K, B, ...)), with importance weights
        (K, B) (1 under uniform replay); returns |TD| (K, B) for the priorities. Counts them in `updates`."""
        raise NotImplementedError(f"{type(self).__name__} must implement learn")

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every optimizer it holds (a learning-rate schedule, config.lr_schedule or
        the SB3-style classes' callable learning_rate, calls it between learner calls). By default: every
        torch optimizer among its attributes, and the one inside each FlatAdam-like wrapper (`.opt`)."""
        for opt in optimizers(self):
            for group in opt.param_groups:
                group["lr"] = lr

    def graph_period(self) -> int:
        """Gradient steps after which `learn`'s Python-side control flow repeats (TD3: policy_delay): a CUDA
        graph captures phases of a multiple of it only."""
        return 1

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain tensors and numbers only (checkpoints load with torch.load(weights_only=True))."""
        out = {**{k: getattr(self, k).state_dict() for k in self.nets + self.optims}, "updates": self.updates}
        if getattr(self, "rng", None) is not None:
            out["rng"] = self.rng.get_state()
        return out

    def load_state_dict(self, state: dict) -> None:
        for k in self.nets + self.optims:
            getattr(self, k).load_state_dict(state[k])
        self.updates = int(state["updates"])
        if getattr(self, "rng", None) is not None and "rng" in state:
            self.rng.set_state(state["rng"])
