"""The rollout storage of on-policy algorithms: one rollout of n_steps x n_envs transitions, and GAE(lambda).

An on-policy algorithm (``storage = "rollout"``: PPO, A2C, a user's REINFORCE) learns from what its current
policy just collected. The learner core holds a :class:`RolloutStorage` in place of the replay: the actors
fill it with the transitions every schedule already moves (obs, action, reward, next_obs, terminated,
truncated), the learner computes the advantages once per rollout (:func:`gae`), learns its epochs of shuffled
minibatches, and the storage is emptied for the next rollout.

Rows arrive in *blocks*, one per actor and rollout: the actor's envs over consecutive vector steps, step-major
(row t*m + j is vector step t of the actor's env j), as the actors emit them. :meth:`RolloutStorage.tensors`
lays a full rollout out as (T, N, ...) arrays, T = n_steps, N = every env of the run, the blocks side by side
in actor order (actor 0's envs first), whatever order they came in: the same rollout under every schedule.

Every row keeps its true next observation (the final one at an episode's end), so a block needs nothing from
outside it: the advantage of its last step bootstraps from V(next_obs), as Stable-Baselines3's
RolloutBuffer does with the value of the observation after the rollout, and a truncated episode (time limit)
bootstraps from V(final obs), as SB3 adds gamma V(terminal obs) to the reward at a timeout.
"""

from __future__ import annotations

import numpy as np
import torch

from hetrl.errors import HetrlError, NonFiniteError
from hetrl.replay.finite import first_non_finite
from hetrl.replay.storage import normalize_spec


@torch.no_grad()
def gae(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor,
        truncated: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over a rollout of shape (T, N):

        delta_t = r_t + gamma * (1 - terminated_t) * V(next_obs_t) - V(obs_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   A_T = 0,   done = terminated | truncated
        R_t     = A_t + V(obs_t)                                     (the TD(lambda) return, the value target)

    next_obs_t is the observation after step t (the final one where the episode ended), so a time limit
    (truncated) bootstraps from the value of its final observation and a termination from nothing. This is
    SB3's RolloutBuffer.compute_returns_and_advantage with its timeout bootstrap written into delta."""
    # the recursion runs over T small vectors: in NumPy on the host (a torch op costs several times more per call)
    v, nv = value.detach().cpu().numpy(), next_value.detach().cpu().numpy()
    term, trunc = terminated.cpu().numpy(), truncated.cpu().numpy()
    delta = reward.cpu().numpy().astype(v.dtype) + np.float32(gamma) * (~term).astype(v.dtype) * nv - v
    carry = np.float32(gamma * lam) * (~(term | trunc)).astype(v.dtype)
    adv = np.empty_like(delta)
    last = np.zeros_like(delta[0])
    for t in range(len(delta) - 1, -1, -1):
        last = delta[t] + carry[t] * last
        adv[t] = last
    adv_t = torch.from_numpy(adv).to(value.device)
    return adv_t, adv_t + value


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var[target - pred] / Var[target] (SB3's); nan where the target does not vary."""
    var = float(target.var(unbiased=False))
    return float("nan") if var == 0 else 1.0 - float((target - pred).var(unbiased=False)) / var


def minibatches(rows: int, batch_size: int, epochs: int, group: int, generator: torch.Generator,
                device: torch.device):
    """The row indices of a rollout phase's `learn` calls, in order: `epochs` shuffled passes over `rows` rows
    (permutations drawn from `generator`), each cut into minibatches of batch_size (its last one smaller where
    batch_size does not divide `rows`, as SB3's), consecutive minibatches of one size stacked `group` to a call."""
    B = batch_size
    K, rem = divmod(rows, B)
    pending: list[torch.Tensor] = []
    for _ in range(epochs):
        perm = torch.randperm(rows, generator=generator).to(device)
        for i in range(K):
            pending.append(perm[i * B:(i + 1) * B])
            if len(pending) == group:
                yield torch.stack(pending)
                pending = []
        if rem:
            if pending:
                yield torch.stack(pending)
                pending = []
            yield perm[K * B:].view(1, rem)
    if pending:
        yield torch.stack(pending)


class RolloutStorage:
    """One rollout: `capacity` = n_steps x n_envs rows of the fields `spec` ({name: (shape, dtype)}), on the CPU
    (`buffers`: preallocated arrays for the fields, e.g. shared memory), filled by blocks of actors' rows and
    emptied after each learner phase (:meth:`clear`). `actors`: how many blocks a full rollout has (every actor
    collects n_steps vector steps of its envs)."""

    def __init__(self, capacity: int, spec: dict, actors: int = 1, buffers: dict | None = None,
                 check_finite: bool = True):
        self.capacity, self.actors = int(capacity), int(actors)
        self.spec = normalize_spec(spec)
        if self.capacity <= 0 or self.capacity % self.actors:
            raise HetrlError(f"a rollout of {capacity} rows cannot be split among {actors} actors")
        self.arrays = {k: (buffers[k] if buffers and k in buffers else np.empty((self.capacity, *s), d))
                       for k, (s, d) in self.spec.items()}
        self.check_finite = bool(check_finite)
        self.size = 0
        self.blocks: dict[int, tuple[int, int, int]] = {}    # actor -> (first row, rows, envs)

    @staticmethod
    def layout(capacity: int, spec: dict) -> dict:
        """The arrays a storage of `capacity` rows holds: {name: ((capacity, *shape), dtype)}."""
        return {k: ((int(capacity), *s), d) for k, (s, d) in normalize_spec(spec).items()}

    def __len__(self) -> int:
        return self.size

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def insert(self, batch: dict, actor: int = 0, envs: int | None = None) -> None:
        """The rows one actor collected with the current policy: its `envs` envs over consecutive vector steps,
        step-major (as :class:`hetrl.actors.Actor` emits them). An actor's rows of one rollout may come in
        several inserts; they are kept as one block."""
        rows = len(batch["obs"]) if batch else 0
        if not rows:
            return
        if self.check_finite:
            bad = first_non_finite(batch)
            if bad:
                raise NonFiniteError(f"non-finite data inserted into the rollout: {bad}")
        if self.size + rows > self.capacity:
            raise HetrlError(f"a rollout holds {self.capacity} rows: {rows} more do not fit after {self.size} "
                             "(actors collect whole rollouts)")
        start, have, m = self.blocks.get(actor, (self.size, 0, int(envs or rows)))
        if have and start + have != self.size:
            raise HetrlError(f"actor {actor}'s rows of one rollout must arrive one after another")
        for k, arr in self.arrays.items():
            arr[self.size:self.size + rows] = batch[k]
        self.blocks[actor] = (start, have + rows, m)
        self.size += rows

    def wants(self, actor: int) -> bool:
        """Whether `actor`'s share of the rollout (capacity / actors rows) is not in yet."""
        return self.blocks.get(actor, (0, 0, 0))[1] < self.capacity // self.actors

    def tensors(self) -> dict[str, torch.Tensor]:
        """The full rollout as {field: (T, N, ...) tensor}: T vector steps of all N envs, the actors' blocks side by
        side in actor order. Views of the storage where there is one block (one actor), else copies."""
        if not self.full:
            raise HetrlError(f"the rollout holds {self.size} of its {self.capacity} rows")
        order = sorted(self.blocks)
        steps = {rows // m for _, rows, m in self.blocks.values()}
        if len(steps) != 1 or any(rows % m for _, rows, m in self.blocks.values()):
            raise HetrlError("the blocks of a rollout must all hold the same whole number of vector steps")
        T = steps.pop()
        out = {}
        for k, arr in self.arrays.items():
            parts = [arr[s:s + r].reshape(T, m, *arr.shape[1:]) for s, r, m in (self.blocks[a] for a in order)]
            out[k] = torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1))
        return out

    def clear(self) -> None:
        self.size = 0
        self.blocks = {}

    # ---- checkpoints -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What a checkpoint keeps of the storage: nothing but its size. A checkpoint is taken between learner
        phases, where the storage is empty, or when a run stops mid-rollout: a resumed run collects that rollout
        again with the policy it resumes with (its env steps stay counted)."""
        return {"size": self.size}

    def load_state_dict(self, state: dict) -> None:
        self.clear()

    def __repr__(self) -> str:
        return f"RolloutStorage({self.size}/{self.capacity} rows, {len(self.blocks)} of {self.actors} blocks)"

