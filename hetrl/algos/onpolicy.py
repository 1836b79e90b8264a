"""What PPO and A2C share: Stable-Baselines3's ActorCriticPolicy on hetrl's on-policy protocol.

    obs -> [RunningNorm] -> policy body (net_arch, tanh) -> action_net -> logits (Discrete) | mean (Box)
    obs -> [RunningNorm] -> value body (vf_arch)          -> value_net  -> V(obs)
    Box actions: a Gaussian of a state-independent log std (a parameter, log_std_init), sampled unbounded and
    clipped to the env's bounds when stepped (the unclipped action is stored and learned, as SB3 does)

Orthogonal initialisation as SB3's (ortho_init: gain sqrt(2) for the bodies, 0.01 for action_net, 1 for
value_net, zero biases); one optimizer over every parameter (Adam with eps 1e-5, SB3's policy default, or
RMSprop for A2C) with the gradient norm clipped to max_grad_norm.

Normalisation as SB3's VecNormalize (normalize_obs, normalize_reward; clip_obs, clip_reward 10):

* observations: (obs - mean) / sqrt(var + 1e-8) clipped to +-clip_obs, by a layer in front of both networks
  (:class:`RunningNorm`). Its statistics are part of the networks' state: published to the actors with the
  policy, checkpointed, and applied at evaluation. They move once per rollout, with the rollout's observations
  (`rollout_done`), so every actor and the learner normalise a rollout with the same statistics under every
  schedule (VecNormalize moves them at every vector step of its one process: hetrl's lag by up to a rollout).
* rewards: divided by the standard deviation of the discounted return (gamma) and clipped to +-clip_reward, the
  return statistics moved at every vector step in each env's order, exactly as VecNormalize does
  (`rollout_values`); the running returns and their statistics are checkpointed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from hetrl.algorithm import OnPolicyAlgorithm, OnPolicyConfig
from hetrl.algos.nets import FlatAdam, live_state, load_weights, mlp
from hetrl.errors import UsageError

LOG_2PI = math.log(2.0 * math.pi)


@dataclass
class ActorCriticConfig(OnPolicyConfig):
    """The settings PPO and A2C share beside the on-policy ones (SB3's names and defaults)."""

    ent_coef: float = 0.0               # entropy bonus coefficient in the loss
    vf_coef: float = 0.5                # value loss coefficient in the loss
    normalize_advantage: bool = True    # advantages standardised per minibatch
    vf_arch: list[int] = field(default_factory=list)   # the value network's hidden layers ([]: net_arch;
                                                        # SB3's net_arch=dict(pi=..., vf=...))
    ortho_init: bool = True             # SB3's orthogonal initialisation (else torch's default)
    log_std_init: float = 0.0           # Box actions: the initial log standard deviation
    normalize_obs: bool = False         # VecNormalize's observation normalisation (running mean / std)
    normalize_reward: bool = False      # VecNormalize's reward scaling (std of the discounted return)
    clip_obs: float = 10.0              # normalised observations clipped to +-clip_obs
    clip_reward: float = 10.0           # scaled rewards clipped to +-clip_reward
    use_sde: bool = False               # gSDE (generalised state-dependent exploration): not supported
    sde_sample_freq: int = -1           # gSDE's noise resampling (with use_sde only)

    def validate(self) -> None:
        super().validate()
        if self.use_sde:
            raise UsageError("use_sde=true: gSDE (state-dependent exploration) is not supported; drop use_sde "
                             "(a state-independent log std explores instead: log_std_init)")
        for key in ("ent_coef", "vf_coef"):
            if getattr(self, key) < 0:
                raise UsageError(f"{key} must be >= 0, got {getattr(self, key)}")
        for key in ("clip_obs", "clip_reward"):
            if not getattr(self, key) > 0:
                raise UsageError(f"{key} must be positive, got {getattr(self, key)}")

    SHAPE_SETTINGS = (*OnPolicyConfig.SHAPE_SETTINGS, "vf_arch", "normalize_obs")


class RunningNorm(nn.Module):
    """SB3's VecNormalize observation side as a layer: (x - mean) / sqrt(var + eps), clipped to +-clip.
    The statistics (float64, as SB3's RunningMeanStd; count starts at 1e-4) are buffers; `update` merges a
    batch's moments into them (Chan et al.'s parallel algorithm)."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = float(clip), float(eps)
        self.active = True   # False: observations pass unchanged (normalised outside, e.g. by the user's VecNormalize)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        # the float32 shift and scale the forward applies, derived from the statistics
        self.register_buffer("shift", torch.zeros(shape))
        self.register_buffer("scale", torch.full(shape, 1.0 / math.sqrt(1.0 + eps)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return x
        return ((x - self.shift) * self.scale).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the rows of x (n, *shape) into the statistics."""
        x = x.detach().to(torch.float64)
        n = x.shape[0]
        mean, var = x.mean(0), x.var(0, unbiased=False)
        delta, total = mean - self.mean, self.count + n
        m2 = self.var * self.count + var * n + delta.pow(2) * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)
        self.shift.copy_(self.mean)
        self.scale.copy_((self.var + self.eps).rsqrt())


class PolicyNet(nn.Module):
    """The acting network: logits of a Discrete action, or the mean of a Box action's Gaussian (then `log_std`,
    a parameter, gives its state-independent log standard deviation)."""

    def __init__(self, obs_shape: tuple[int, ...], n_out: int, arch: list[int], activation: str,
                 norm: RunningNorm | None, continuous: bool, log_std_init: float = 0.0):
        super().__init__()
        self.obs_ndim = len(obs_shape)
        obs_dim = int(np.prod(obs_shape))
        self.norm = norm if norm is not None else nn.Identity()
        self.body = mlp([obs_dim, *arch], activation, last_act=True)
        self.action_net = nn.Linear(arch[-1] if arch else obs_dim, n_out)
        self.log_std = nn.Parameter(torch.full((n_out,), float(log_std_init))) if continuous else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.flatten(start_dim=-self.obs_ndim) if self.obs_ndim > 1 else obs
        return self.action_net(self.body(self.norm(x)))


class ValueNet(nn.Module):
    """V(obs): its own body (vf_arch) after the same observation normalisation."""

    def __init__(self, obs_shape: tuple[int, ...], arch: list[int], activation: str, norm: RunningNorm | None):
        super().__init__()
        self.obs_ndim = len(obs_shape)
        obs_dim = int(np.prod(obs_shape))
        self.norm = norm if norm is not None else nn.Identity()
        self.body = mlp([obs_dim, *arch], activation, last_act=True)
        self.value_net = nn.Linear(arch[-1] if arch else obs_dim, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.flatten(start_dim=-self.obs_ndim) if self.obs_ndim > 1 else obs
        return self.value_net(self.body(self.norm(x))).squeeze(-1)


def ortho_init(module: nn.Module, gain: float) -> None:
    """SB3's ActorCriticPolicy.init_weights: orthogonal weights of `gain`, zero biases, for every Linear."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.orthogonal_(m.weight, gain=gain)
            nn.init.zeros_(m.bias)


def log_prob_entropy(out: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi(action | obs), entropy of pi(. | obs)) from the policy network's output: a Categorical over the
    logits `out`, or a diagonal Gaussian of mean `out` and std exp(log_std) (both summed over action dims)."""
    if log_std is None:
        logp_all = torch.log_softmax(out, dim=-1)
        logp = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return logp, -(logp_all.exp() * logp_all).sum(-1)
    z = (action - out) * torch.exp(-log_std)
    logp = (-0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI).sum(-1)
    entropy = (0.5 + 0.5 * LOG_2PI + log_std).sum(-1).expand(logp.shape)
    return logp, entropy


class SamplingPolicy:
    """The acting policy actors run (on a copy of the PolicyNet, noise from its own NumPy generator): samples of
    the Categorical (inverse CDF of a uniform draw) or of the Gaussian (unbounded: stored as sampled, clipped to
    the env's bounds for the env); the mode for evaluation (argmax, or the mean clipped).

    One forward per vector step, over all the actor's envs. On a CPU the network's forward runs in NumPy on views
    of its parameters (:class:`NumpyForward`): a step of a few envs through a small MLP spends most of torch's time
    in the ops' dispatch (~10 ops, ~4x NumPy's time here). The same function of the same float32 parameters; the
    outputs may differ from torch's in the last bits of float32 rounding, which changes a sampled action only where
    its uniform draw falls within that rounding of a boundary between actions. A body that a learner kernel made a
    subclass of nn.Sequential over the same layers (the compiled acting's) runs in NumPy too: at a few envs the
    NumPy forward is faster than the compiled body behind torch's dispatch (benchmarks/bench_acting.py); a
    network with other layers keeps its own forward."""

    def __init__(self, net: PolicyNet, act_space: gym.Space, seed: int, device: str = "cpu"):
        self.net, self.device = net.to(device).eval(), device
        self.rng = np.random.default_rng(seed)
        self.continuous = isinstance(act_space, gym.spaces.Box)
        if self.continuous:
            self.low = np.asarray(act_space.low, np.float32)
            self.high = np.asarray(act_space.high, np.float32)
            self.shape = tuple(act_space.shape)
        else:
            self.n = int(act_space.n)
        self._np: NumpyForward | None | bool = None   # made on first use (False: torch's forward)

    def __getstate__(self) -> dict:
        # the NumPy views belong to this process's tensors: made again where the policy is unpickled
        return {**self.__dict__, "_np": None}

    def _out(self, obs: np.ndarray) -> np.ndarray:
        fwd = self._np
        if fwd is None:
            fwd = self._np = NumpyForward.of(self.net) if torch.device(self.device).type == "cpu" else False
        if fwd:
            return fwd(obs)
        with torch.no_grad():
            return self.net(torch.as_tensor(obs, dtype=torch.float32, device=self.device)).cpu().numpy()

    def act(self, obs: np.ndarray, explore) -> tuple[np.ndarray, np.ndarray]:
        n = len(obs)
        if self.continuous:
            if explore is None:
                a = self.rng.uniform(self.low, self.high, (n, *self.shape)).astype(np.float32)
                return a, a
            std = np.exp(self.net.log_std.detach().cpu().numpy())
            a = (self._out(obs) + std * self.rng.standard_normal((n, *self.shape), dtype=np.float32)).astype(np.float32)
            return np.clip(a, self.low, self.high), a
        if explore is None:
            a = self.rng.integers(0, self.n, n)
            return a, a
        logits = self._out(obs)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        cdf = np.cumsum(p, -1)
        a = (cdf < self.rng.random((n, 1)) * cdf[:, -1:]).sum(-1).clip(max=self.n - 1)
        return a, a

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        out = self._out(obs)
        return np.clip(out, self.low, self.high) if self.continuous else out.argmax(-1)

    def load(self, state: dict) -> None:
        load_weights(self.net, state)

    def episode_end(self, done: np.ndarray) -> None:
        pass


class NumpyForward:
    """A PolicyNet's forward (observation normalisation, Linear layers, tanh / ReLU) in NumPy float32, reading its
    parameters and statistics through views of the tensors (a load into the network is seen at once; a tensor
    replaced or moved makes the views again)."""

    ACTS = {nn.Tanh: np.tanh, nn.ReLU: lambda x: np.maximum(x, 0, out=x)}

    def __init__(self, net: PolicyNet):
        self.net = net
        self._views()

    @classmethod
    def of(cls, net: PolicyNet) -> "NumpyForward | bool":
        """The NumPy forward of `net`, or False where it has a layer this does not know (a kernel's, LayerNorm)."""
        if not isinstance(net, PolicyNet) or not isinstance(net.body, nn.Sequential) or type(net.action_net) is not nn.Linear:
            return False
        if not isinstance(net.norm, (nn.Identity, RunningNorm)):
            return False
        if not all(type(m) is nn.Linear or type(m) in cls.ACTS for m in net.body):
            return False
        return cls(net)

    def _views(self) -> None:
        net = self.net
        norm = net.norm if isinstance(net.norm, RunningNorm) else None
        owners = [m for m in (*net.body, net.action_net) if type(m) is nn.Linear] + ([norm] if norm is not None else [])
        self.slots = tuple((d, k, t, t.data_ptr()) for m in owners for d in (m._parameters, m._buffers)
                           for k, t in d.items() if t is not None)
        layers = []
        for m in (*net.body, net.action_net):
            if type(m) is nn.Linear:
                layers.append((m.weight.detach().numpy().T, m.bias.detach().numpy()))
            else:
                layers.append(self.ACTS[type(m)])
        self.layers = layers
        self.norm = (norm, norm.shift.numpy(), norm.scale.numpy()) if norm is not None else None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if not all(d[k] is t and t.data_ptr() == ptr for d, k, t, ptr in self.slots):
            self._views()
        x = np.asarray(obs, np.float32)
        if self.net.obs_ndim > 1:
            x = x.reshape(*x.shape[:-self.net.obs_ndim], -1)
        if self.norm is not None and self.norm[0].active:
            norm, shift, scale = self.norm
            x = np.clip((x - shift) * scale, -norm.clip, norm.clip)
        for layer in self.layers:
            if isinstance(layer, tuple):
                x = x @ layer[0]
                x += layer[1]
            else:
                x = layer(x)
        return x


class FlatRMSprop(FlatAdam):
    """RMSprop (torch's: SB3's A2C default, alpha 0.99, eps 1e-5) over a module's parameters in one flat buffer,
    with FlatAdam's gradient clip."""

    def __init__(self, module: nn.Module, lr: float, max_grad_norm: float = 0.0, alpha: float = 0.99,
                 eps: float = 1e-5):
        super().__init__(module, lr, max_grad_norm)
        self.opt = torch.optim.RMSprop([self.param], lr=lr, alpha=alpha, eps=eps)


class ActorCritic(OnPolicyAlgorithm):
    """PPO's and A2C's networks, acting policy, values and normalisation; their `learn` is their own file's."""

    Settings = ActorCriticConfig
    action_spaces = (gym.spaces.Discrete, gym.spaces.Box)
    nets, optims = ("policy", "value"), ("opt",)
    shape_settings = ("vf_arch", "normalize_obs")

    @classmethod
    def check_spaces(cls, obs_space: gym.Space, act_space: gym.Space) -> None:
        """As every algorithm's, but Box actions may be unbounded (the Gaussian is clipped only where bounded), and
        frames of any rank are refused (an Atari id's 84x84 grayscale too: no CNN here)."""
        if isinstance(act_space, gym.spaces.Box) and not act_space.is_bounded("both"):
            act_space = gym.spaces.Box(-1.0, 1.0, act_space.shape, np.float32)
        if isinstance(obs_space, gym.spaces.Box) and obs_space.dtype == np.uint8 and len(obs_space.shape) >= 2:
            raise UsageError(f"{cls.name.upper() or cls.__name__} takes vector observations; this env's are images "
                             f"{obs_space.shape} (uint8): image observations are not supported by hetrl's on-policy "
                             "algorithms; use dqn for pixels, or flatten them with a wrapper")
        super().check_spaces(obs_space, act_space)

    def __init__(self, cfg: ActorCriticConfig, obs_space: gym.Space, act_space: gym.Space, device="cpu"):
        super().__init__(cfg, obs_space, act_space, device)
        self.continuous = isinstance(act_space, gym.spaces.Box)
        self.n_out = int(np.prod(act_space.shape)) if self.continuous else int(act_space.n)
        self.policy = self._policy_net(self._norm()).to(self.device)
        self.value = ValueNet(self.obs_shape, cfg.vf_arch or cfg.net_arch, cfg.activation,
                              self.policy.norm if cfg.normalize_obs else None).to(self.device)
        if cfg.ortho_init:
            ortho_init(self.policy.body, math.sqrt(2))
            ortho_init(self.value.body, math.sqrt(2))
            ortho_init(self.policy.action_net, 0.01)
            ortho_init(self.value.value_net, 1.0)
        self.opt = self._optimizer(nn.ModuleList([self.policy, self.value]))
        # reward normalisation: each env's discounted return, and the running statistics of the returns
        self.ret_mean = torch.zeros((), dtype=torch.float64)
        self.ret_var = torch.ones((), dtype=torch.float64)
        self.ret_count = torch.tensor(1e-4, dtype=torch.float64)
        self.returns = torch.zeros(cfg.num_envs, dtype=torch.float64)

    def _norm(self) -> RunningNorm | None:
        return RunningNorm((int(np.prod(self.obs_shape)),), self.cfg.clip_obs) if self.cfg.normalize_obs else None

    def _policy_net(self, norm: RunningNorm | None) -> PolicyNet:
        cfg = self.cfg
        return PolicyNet(self.obs_shape, self.n_out, cfg.net_arch, cfg.activation, norm, self.continuous,
                         cfg.log_std_init)

    def _optimizer(self, module: nn.Module):
        """Adam with eps 1e-5 (SB3's ActorCriticPolicy default); A2C overrides it with RMSprop."""
        return FlatAdam(module, self.cfg.lr, self.cfg.max_grad_norm, eps=1e-5)

    # ---- acting side ---------------------------------------------------------------------------
    def make_policy(self, seed: int, device: str = "cpu", num_envs: int | None = None) -> SamplingPolicy:
        net = self._policy_net(self._norm())
        net.load_state_dict(self.policy_state())
        return SamplingPolicy(net, self.act_space, seed, device)

    def policy_state(self) -> dict:
        return live_state(self.policy)

    # ---- learning side ---------------------------------------------------------------------------
    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log pi(action | obs), entropy, V(obs)) under the current parameters (SB3's evaluate_actions)."""
        logp, entropy = log_prob_entropy(self.policy(obs), action, self.policy.log_std)
        return logp, entropy, self.value(obs)

    @torch.no_grad()
    def rollout_values(self, rollout: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        obs, next_obs = rollout["obs"].to(self.device), rollout["next_obs"].to(self.device)
        T, N = obs.shape[:2]
        both = self.value(torch.cat([obs, next_obs]).reshape(2 * T * N, *obs.shape[2:])).view(2, T, N)
        logp, _ = log_prob_entropy(self.policy(obs), rollout["action"].to(self.device), self.policy.log_std)
        out = {"value": both[0], "next_value": both[1], "log_prob": logp}
        if self.cfg.normalize_reward:
            out["reward"] = self.scale_rewards(rollout["reward"], rollout["terminated"] | rollout["truncated"])
        return out

    @torch.no_grad()
    def scale_rewards(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """VecNormalize's reward scaling over a rollout (T, N), step by step in each env's order: the discounted
        return moves, its statistics take it, the reward is divided by their std and clipped; a finished
        episode's return starts again at 0."""
        cfg = self.cfg
        if self.returns.shape[0] != reward.shape[1]:
            raise UsageError(f"reward normalisation keeps one return per env: this rollout has {reward.shape[1]} "
                             f"envs, the run {self.returns.shape[0]}")
        r, d = reward.to(torch.float64), done
        out = torch.empty_like(r)
        for t in range(r.shape[0]):
            self.returns.mul_(cfg.gamma).add_(r[t])
            x = self.returns
            n = x.shape[0]
            mean, var = x.mean(), x.var(unbiased=False)
            delta, total = mean - self.ret_mean, self.ret_count + n
            m2 = self.ret_var * self.ret_count + var * n + delta.pow(2) * self.ret_count * n / total
            self.ret_mean += delta * n / total
            self.ret_var.copy_(m2 / total)
            self.ret_count.copy_(total)
            out[t] = (r[t] / torch.sqrt(self.ret_var + 1e-8)).clamp(-cfg.clip_reward, cfg.clip_reward)
            self.returns[d[t]] = 0.0
        return out.to(torch.float32)

    def rollout_done(self, rollout: dict[str, torch.Tensor]) -> None:
        """The observation statistics take the rollout's observations (the next rollout is normalised with them)."""
        if self.cfg.normalize_obs:
            obs = rollout["obs"]
            self.policy.norm.update(obs.reshape(-1, int(np.prod(obs.shape[2:]))).to(self.device))

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "ret_mean": self.ret_mean.clone(), "ret_var": self.ret_var.clone(),
                "ret_count": self.ret_count.clone(), "returns": self.returns.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for k in ("ret_mean", "ret_var", "ret_count"):
            if k in state:
                getattr(self, k).copy_(state[k])
        if "returns" in state and state["returns"].shape == self.returns.shape:
            self.returns.copy_(state["returns"])

    def normalization_state(self) -> dict:
        """The normalisation statistics as NumPy / floats (SB3's VecNormalize holds the same): {"obs": (mean, var,
        count) or None, "ret": (mean, var, count) or None}."""
        cfg, norm = self.cfg, self.policy.norm
        obs = (norm.mean.cpu().numpy(), norm.var.cpu().numpy(), float(norm.count)) if cfg.normalize_obs else None
        ret = (float(self.ret_mean), float(self.ret_var), float(self.ret_count)) if cfg.normalize_reward else None
        return {"obs": obs, "ret": ret}

    def _std_stat(self) -> dict[str, torch.Tensor]:
        return {"std": self.policy.log_std.detach().exp().mean()} if self.continuous else {}
