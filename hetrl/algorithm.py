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

An on-policy algorithm (PPO, A2C, a REINFORCE of one's own) subclasses :class:`OnPolicyAlgorithm` (settings:
:class:`OnPolicyConfig`): it declares ``storage = "rollout"``, and the learner core keeps a rollout storage in
place of the replay (hetrl/replay/rollout.py): the actors collect n_steps x num_envs transitions with the current
policy, the algorithm's :meth:`OnPolicyAlgorithm.rollout_values` gives the values and log-probabilities of the
rollout in one batched forward, the core computes GAE(lambda) and hands `learn` n_epochs of shuffled minibatches
(the same `learn(batches, weights)` door, with the fields of :meth:`OnPolicyAlgorithm.learn_fields`); between
`learn` calls :meth:`Algorithm.stop_phase` may end the epochs early (PPO's target_kl). docs/onpolicy.md.

Every algorithm may keep detached 0-dim tensors of its last update in ``stats`` (name -> tensor, re-assigned by
`learn`): the learner core reads them, as floats and only when it logs, for the training log (train/<name>).

The learner core (hetrl/runtime/core.py) owns everything else: replay, the replay ratio, counters,
publishing, checkpoints, evaluation, restarts. A learner *kernel* (hetrl/kernels/) may run `learn`'s
updates faster from outside (compiled on a CPU, a CUDA graph on a GPU) and is checked equal to it; the
algorithm never imports one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Protocol

import gymnasium as gym
import numpy as np
import torch

from hetrl.config import Config
from hetrl.errors import LearnContractError, UsageError


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


class MemberPolicies:
    """Acting policies side by side (Algorithm.stacked_policy's default): policy m acts for envs m*n .. m*n+n-1
    with explore[m], its own RNG and its own network."""

    def __init__(self, policies: list[ActingPolicy], envs: int):
        self.policies, self.n = policies, envs

    def rows(self):
        return ((m, p, slice(m * self.n, (m + 1) * self.n)) for m, p in enumerate(self.policies))

    def act(self, obs: np.ndarray, explore: list) -> tuple[np.ndarray, np.ndarray]:
        acts = [p.act(obs[s], explore[m]) for m, p, s in self.rows()]
        return np.concatenate([a[0] for a in acts]), np.concatenate([a[1] for a in acts])

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        return np.concatenate([p.act_deterministic(obs[s]) for _, p, s in self.rows()])

    def load_member(self, m: int, state: dict) -> None:
        self.policies[m].load(state)

    def episode_end(self, done: np.ndarray) -> None:
        for _, p, s in self.rows():
            if done[s].any():
                p.episode_end(done[s])


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
    # what it learns from: "replay" (off-policy: sampled transitions) or "rollout" (on-policy: OnPolicyAlgorithm)
    storage: ClassVar[str] = "replay"
    updates: int = 0                              # gradient steps taken (checkpointed)
    # detached 0-dim tensors of its last update (loss scalars), re-assigned by `learn`; read only when logging
    stats: dict[str, torch.Tensor] = {}

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
                             f"use {_takers(act_space, pixels=is_image(obs_space))} for "
                             f"{_kind(type(act_space)).split(' ')[0]} actions")
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

    def stacked_policy(self, policies: list[ActingPolicy], envs: int) -> ActingPolicy:
        """One acting policy for a population's members side by side: member m's `policies[m]` acts for envs
        m*envs .. m*envs+envs-1, and `act(obs, explore)` takes a list of explore values, one per member. By
        default each member's own policy on its rows (any algorithm); an algorithm may answer with a policy over
        its members' stacked weights (DQN: one Q call for every member), which acts as its members would."""
        return MemberPolicies(policies, envs)

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

    def set_progress(self, progress_remaining: float) -> None:
        """The run's progress remaining (1 at its start, 0 at its end; SB3's), before each learner call: for
        schedules of settings other than the learning rate (PPO's clip range). Kept in tensors that `learn`
        reads, so a kernel that captured `learn` sees the new value."""

    def stop_phase(self) -> bool:
        """Between the `learn` calls of an on-policy phase: whether to end its epochs here (PPO's target_kl). A
        decision on tensor values is made here, never inside `learn` (which a kernel may trace or capture)."""
        return False

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


# ---- on-policy algorithms --------------------------------------------------------------------------------
@dataclass
class OnPolicyConfig(Config):
    """The settings of an on-policy algorithm (SB3's names and defaults): a rollout is n_steps vector steps of
    num_envs envs, learned in n_epochs passes of minibatches of batch_size, advantages by GAE(gae_lambda).

    The replay settings every schedule and the planner price follow from them (set here, whatever was given):
    train_freq = buffer_size = n_steps x num_envs (one rollout per learner phase), learning_starts = 0,
    gradient_steps = n_epochs x ceil(rollout / batch_size); batch_size is at most the rollout (as SB3's
    minibatches are)."""

    n_steps: int = 2048                 # vector steps per rollout: each env collects n_steps transitions
    n_epochs: int = 10                  # passes over a rollout, each in shuffled minibatches of batch_size
    gae_lambda: float = 0.95            # GAE's lambda (1: Monte-Carlo returns bootstrapped at the rollout's end)
    gamma: float = 0.99
    batch_size: int = 64
    lr: float = 3e-4
    max_grad_norm: float = 0.5
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"

    def __post_init__(self) -> None:
        rollout = max(1, self.n_steps) * max(1, self.num_envs)
        self.train_freq = self.buffer_size = rollout
        self.learning_starts = 0
        self.batch_size = max(1, min(self.batch_size, rollout))
        self.gradient_steps = max(1, self.n_epochs) * math.ceil(rollout / self.batch_size)

    @property
    def rollout_size(self) -> int:
        """Transitions per rollout: n_steps x num_envs."""
        return self.n_steps * self.num_envs

    def validate(self) -> None:
        for key in ("n_steps", "n_epochs"):
            if getattr(self, key) <= 0:
                raise UsageError(f"{key} must be positive, got {getattr(self, key)}; e.g. --set {key}=16")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise UsageError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        super().validate()

    SCHEDULE_SETTINGS: ClassVar[tuple[str, ...]] = (*Config.SCHEDULE_SETTINGS, "n_steps", "n_epochs")


class OnPolicyAlgorithm(Algorithm):
    """The base of an on-policy algorithm: it learns from rollouts its current policy collected (storage
    "rollout", hetrl/replay/rollout.py). Subclasses write ``__init__``, ``make_policy``, ``policy_state``,
    :meth:`rollout_values` and ``learn``; docs/extending.md's REINFORCE is one.

    A learner phase, written once in the learner core for every schedule:

    1. the actors collect a rollout (n_steps x num_envs transitions: obs, action, reward, next_obs,
       terminated, truncated) with the current policy, and the learner lays it out as (T, N, ...) tensors;
    2. :meth:`rollout_values` (no gradient) gives, per transition, ``value`` = V(obs), ``next_value`` =
       V(next_obs) and whatever `learn` needs of the acting policy (``log_prob``); it may give ``reward``
       (rewards as learned, e.g. scaled) in place of the env's;
    3. the core computes GAE(gae_lambda): ``advantage`` and ``return``;
    4. n_epochs passes over the rollout in shuffled minibatches of batch_size: `learn(batches, weights)` with
       the fields of :meth:`learn_fields` stacked (K, B, ...), weights ones (a call may span passes); between calls
       :meth:`stop_phase` may end the phase; :meth:`phase_group` says how many minibatches one call takes;
    5. :meth:`rollout_done`, then the new policy is published and the rollout emptied.
    """

    Settings: ClassVar[type[Config]] = OnPolicyConfig
    storage: ClassVar[str] = "rollout"
    schedule_settings: ClassVar[tuple[str, ...]] = ("n_steps", "n_epochs")

    @classmethod
    def learn_fields(cls, obs_space: gym.Space, act_space: gym.Space) -> dict:
        """The fields of one `learn` minibatch row, name -> (shape, dtype): the stored obs and action, the
        outputs of `rollout_values` but next_value and reward, and GAE's advantage and return."""
        stored = cls.replay_fields(obs_space, act_space)
        return {"obs": stored["obs"], "action": stored["action"], "value": ((), "float32"),
                "log_prob": ((), "float32"), "advantage": ((), "float32"), "return": ((), "float32")}

    def rollout_values(self, rollout: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One batched forward over a rollout (fields (T, N, ...)) with the parameters it was collected with:
        {"value": V(obs), "next_value": V(next_obs), "log_prob": log pi(action | obs), ...}, each (T, N)."""
        raise NotImplementedError(f"{type(self).__name__} must implement rollout_values")

    def rollout_done(self, rollout: dict[str, torch.Tensor]) -> None:
        """After a rollout's epochs, before the new policy is published (e.g. observation statistics move)."""

    def phase_group(self, minibatches: int) -> int:
        """How many of a phase's `minibatches` one `learn` call takes (decisions such as stop_phase are made
        between calls): all of them by default (the learner core takes GROUP_MAX a call at most)."""
        return minibatches

    def exploration(self, env_steps: int) -> float | None:
        """On-policy actors always act with the policy (no warm-up of random actions)."""
        return 1.0


def check_learn_contract(algo: str, td, weights: torch.Tensor, advanced: int) -> None:
    """The protocol's promise of `learn(batches, weights)` (docs/extending.md), checked on a run's first learner
    call: |TD| comes back as a non-negative float tensor of shape (K, B) and `updates` moved by K. A breach is a
    LearnContractError (a UsageError: exit 2 from the CLI) of one line naming the algorithm and `learn`. That |TD|
    is finite is checked on every call (check_finite: a NonFiniteError, the loss diverged), so NaN/inf there is
    not a breach of the protocol but of the run."""
    K, B = int(weights.shape[0]), int(weights.shape[1])
    where = f"algorithm {algo!r}: learn(batches, weights) of K={K} batches of B={B}"
    fix = "(docs/extending.md: learn); fix the algorithm's learn"
    if not isinstance(td, torch.Tensor):
        raise LearnContractError(f"{where} returned {type(td).__name__}, not |TD| as a float tensor of shape "
                                 f"({K}, {B}) {fix}")
    if not td.is_floating_point() or tuple(td.shape) != (K, B):
        raise LearnContractError(f"{where} returned a {str(td.dtype).removeprefix('torch.')} tensor of shape "
                                 f"{tuple(td.shape)}, not |TD| as a float tensor of shape ({K}, {B}) {fix}")
    if advanced != K:
        raise LearnContractError(f"{where} advanced self.updates by {advanced}, not by K={K}: add K to "
                                 f"self.updates in learn {fix}")
    if bool((td.detach() < 0).any()):
        raise LearnContractError(f"{where} returned negative |TD|: return the absolute TD errors {fix}")
