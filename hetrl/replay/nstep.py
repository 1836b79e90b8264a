"""Actor-side n-step transition accumulator for a vector of environments.

``NStepAdder.add`` takes one step of a vector env (arrays with leading dim
``num_envs``) and returns the n-step transitions that this step completed,
as one batch ready for ``ReplayBuffer.insert``::

    obs       o_t                      (dtype of the obs given)
    action    a_t                      (dtype of the action given)
    reward    sum_{i<k} gamma^i r_{t+i}  float32
    next_obs  o_{t+k}                  (the true next obs: the final obs at an episode end)
    terminated, truncated  flags of step t+k-1   bool
    steps     k                        uint8

with ``k = n`` normally and ``k < n`` for the last steps of an episode.  The
learner's target is then ``r + gamma**steps * (1 - terminated) * V(next_obs)``:
a truncated (time-limit) episode keeps ``terminated=False`` so the learner
bootstraps from the final obs, a terminated one does not.

Per env the pending steps live in a ring of ``n`` slots (preallocated on the
first call from the shapes and dtypes given).  Each call writes the new step
into every env's ring, then emits, all vectorised over envs:

* envs whose episode ended (terminated or truncated): all ``k`` pending steps,
  the j-th with the discounted tail ``sum_{i>=j} gamma^(i-j) r_i`` and
  ``steps = k - j``; their ring is then cleared;
* other envs holding ``n`` steps: the oldest one, with ``steps = n``.

Rows come out grouped by env (env 0 first), oldest first.  ``n == 1`` is a
pass-through with no state (it copies the arrays, no
per-env loop).  Like Acme's ``NStepTransitionAdder``, but over a
vector of envs and with the ``steps`` field instead of a per-item discount.
"""

from __future__ import annotations

import numpy as np


class NStepAdder:
    """Accumulate n-step transitions for ``num_envs`` parallel environments.

    Args:
        n: number of steps summed (>= 1; 255 at most since ``steps`` is uint8).
        gamma: discount in [0, 1].
        num_envs: number of envs in each ``add`` call.
    """

    def __init__(self, n: int, gamma: float, num_envs: int) -> None:
        if not 1 <= int(n) <= 255:
            raise ValueError(f"NStepAdder n must be in [1, 255] (steps is stored as uint8), got {n}.")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"NStepAdder gamma must be in [0, 1], got {gamma}.")
        if int(num_envs) <= 0:
            raise ValueError(f"NStepAdder num_envs must be > 0, got {num_envs}.")
        self.n = int(n)
        self.gamma = float(gamma)
        self.num_envs = int(num_envs)
        # tail[j, i] = gamma^(i-j) for i >= j: rewards (E, n) @ tail.T -> discounted tails (E, n)
        powers = np.arange(self.n)
        diff = powers[None, :] - powers[:, None]
        self._tail = np.where(diff >= 0, self.gamma ** np.maximum(diff, 0), 0.0)
        self._ones = np.ones(self.num_envs, dtype=np.uint8)
        self._obs: np.ndarray | None = None
        self._act: np.ndarray | None = None
        self._rew = np.zeros((self.num_envs, self.n), dtype=np.float64)
        self._start = np.zeros(self.num_envs, dtype=np.int64)
        self._count = np.zeros(self.num_envs, dtype=np.int64)
        self._envs = np.arange(self.num_envs)
        self._slots = np.arange(self.n)
        self.last_envs = self._envs  # the env of each row of the last batch add() returned

    def reset(self) -> None:
        """Drop every env's pending steps (e.g. after all envs were reset)."""
        self._count[:] = 0
        self._start[:] = 0

    @property
    def pending(self) -> np.ndarray:
        """Number of pending (not yet emitted) steps per env."""
        return self._count.copy()

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> dict[str, np.ndarray] | None:
        """Record one vector step; return the transitions it completed, or ``None``."""
        obs = np.asarray(obs)
        action = np.asarray(action)
        next_obs = np.asarray(next_obs)
        reward = np.asarray(reward)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        E = self.num_envs
        for name, arr in (("obs", obs), ("action", action), ("reward", reward), ("next_obs", next_obs),
                          ("terminated", terminated), ("truncated", truncated)):
            if arr.ndim == 0 or arr.shape[0] != E:
                raise ValueError(
                    f"NStepAdder.add {name} must have leading dim num_envs={E}, got shape {arr.shape}."
                )
        if self.n == 1:  # pass-through; copies so a caller reusing its arrays cannot alias the batch
            self.last_envs = self._envs
            return {
                "obs": obs.copy(),
                "action": action.copy(),
                "reward": reward.astype(np.float32),
                "next_obs": next_obs.copy(),
                "terminated": terminated.copy(),
                "truncated": truncated.copy(),
                "steps": self._ones.copy(),
            }
        if self._obs is None or self._obs.shape[2:] != obs.shape[1:] or self._act.shape[2:] != action.shape[1:]:
            if self._obs is not None and self._count.any():
                raise ValueError("NStepAdder.add obs/action shape changed while steps are pending; call reset() first.")
            self._obs = np.zeros((E, self.n, *obs.shape[1:]), dtype=obs.dtype)
            self._act = np.zeros((E, self.n, *action.shape[1:]), dtype=action.dtype)

        # 1. write the new step into every env's ring
        n = self.n
        write = (self._start + self._count) % n
        self._obs[self._envs, write] = obs
        self._act[self._envs, write] = action
        self._rew[self._envs, write] = reward
        self._count += 1

        # 2. which (env, j) pending items to emit; j counts from the oldest
        done = terminated | truncated
        count = self._count
        j = self._slots[None, :]
        emit = np.where(done[:, None], j < count[:, None], (j == 0) & (count[:, None] == n))
        env_idx, j_idx = np.nonzero(emit)
        self.last_envs = env_idx
        if env_idx.size == 0:
            return None

        # 3. discounted tails of the rewards in age order (invalid slots are 0)
        age_slot = (self._start[:, None] + j) % n  # (E, n) ring slot of the j-th oldest item
        rew = np.where(j < count[:, None], self._rew[self._envs[:, None], age_slot], 0.0)
        tails = rew @ self._tail.T  # (E, n): tails[e, j] = sum_{i>=j} gamma^(i-j) rew[e, i]
        slot = age_slot[env_idx, j_idx]
        out = {
            "obs": self._obs[env_idx, slot],
            "action": self._act[env_idx, slot],
            "reward": tails[env_idx, j_idx].astype(np.float32),
            "next_obs": next_obs[env_idx],
            "terminated": terminated[env_idx],
            "truncated": truncated[env_idx],
            "steps": (count[env_idx] - j_idx).astype(np.uint8),
        }

        # 4. advance: ended episodes are cleared, full rings drop their oldest item
        full = ~done & (count == n)
        self._start[full] = (self._start[full] + 1) % n
        self._count[full] -= 1
        self._count[done] = 0
        self._start[done] = 0
        return out
