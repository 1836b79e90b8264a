"""Greedy-policy evaluation on the real Gymnasium env.

Episode i is reset with seed ``seed + i``, so a table is always scored on the same episodes.
The greedy action is the first maximum of Q(s, .). Envs without a time limit (CliffWalking)
get ``max_steps`` (default 1000) so that a looping policy ends; such an episode counts as a
failure. Success per env: FrozenLake = reached the goal (last reward > 0), Taxi = correct
drop-off (terminated), CliffWalking = reached the goal (terminated); other envs: terminated
with a positive last reward.
"""

from __future__ import annotations

import numpy as np

from hetrl.tabular.envs import EnvInfo, make_env

DEFAULT_EVAL_SEED = 1_000_000


def greedy_policy(q: np.ndarray) -> np.ndarray:
    return np.argmax(np.asarray(q), axis=1).astype(np.int64)


def evaluate(info: EnvInfo, q: np.ndarray, episodes: int = 100, seed: int = DEFAULT_EVAL_SEED,
             max_steps: int | None = None) -> dict:
    """Run the greedy policy of q for `episodes` episodes; returns return/success statistics."""
    pol = greedy_policy(q)
    limit = int(max_steps or info.max_steps or 1000)
    env = make_env(info.env_id, info.env_kwargs)
    rets, succ, lengths, timeouts = [], 0, [], 0
    try:
        for i in range(int(episodes)):
            s, _ = env.reset(seed=int(seed) + i)
            total, r, term, trunc = 0.0, 0.0, False, False
            steps = 0
            while steps < limit:
                s, r, term, trunc, _ = env.step(int(pol[int(s)]))
                total += float(r)
                steps += 1
                if term or trunc:
                    break
            if not (term or trunc):
                timeouts += 1
            rets.append(total)
            lengths.append(steps)
            if term and (info.success_rule == "terminated" or float(r) > 0):
                succ += 1
    finally:
        env.close()
    rets = np.asarray(rets, np.float64)
    return {
        "episodes": int(episodes),
        "eval_return_mean": float(rets.mean()) if rets.size else float("nan"),
        "eval_return_std": float(rets.std()) if rets.size else float("nan"),
        "eval_return_min": float(rets.min()) if rets.size else float("nan"),
        "success_rate": float(succ / episodes) if episodes else float("nan"),
        "eval_length_mean": float(np.mean(lengths)) if lengths else float("nan"),
        "eval_timeouts": int(timeouts),
        "eval_seed": int(seed),
    }
