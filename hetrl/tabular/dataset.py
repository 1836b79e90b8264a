"""Offline experience: transitions (s, a, r, s', a', done) of a behaviour policy, and shards.

A :class:`Dataset` holds structure-of-arrays columns (int32 states and actions, float32
rewards, uint8 done). ``done`` marks termination only; a time-limit truncation ends the
episode in the data stream but keeps bootstrapping. ``a2`` is the action the behaviour
policy takes at ``s'`` (what offline SARSA with data actions needs).

Behaviour policies: ``"random"`` (uniform) or ``"epsilon-greedy"`` on a given Q-table.
Generation runs the compiled model sampler when the env has a transition table
(:func:`hetrl.tabular.envs.tabular_model`: ~20 M transitions/s) and steps the real
Gymnasium env otherwise (~20-40 k transitions/s).

Files: ``.npz`` with the columns above plus ``n_states``, ``n_actions`` and ``env_id``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hetrl.errors import UsageError
from hetrl.tabular.envs import EnvInfo, make_env
from hetrl.tabular.options import BEHAVIOURS

COLUMNS = ("s", "a", "r", "s2", "a2", "done")
DTYPES = {"s": np.int32, "a": np.int32, "r": np.float32, "s2": np.int32, "a2": np.int32, "done": np.uint8}


@dataclass
class Dataset:
    s: np.ndarray
    a: np.ndarray
    r: np.ndarray
    s2: np.ndarray
    a2: np.ndarray
    done: np.ndarray
    n_states: int
    n_actions: int
    env_id: str = ""
    episodes: int = 0

    def __len__(self) -> int:
        return int(self.s.shape[0])

    @property
    def reward_abs_max(self) -> float:
        return float(np.abs(self.r).max()) if len(self) else 0.0

    def slice(self, lo: int, hi: int) -> "Dataset":
        return Dataset(*(getattr(self, c)[lo:hi] for c in COLUMNS), self.n_states, self.n_actions, self.env_id)

    def save(self, path: str | os.PathLike) -> str:
        path = os.fspath(path)
        np.savez(path, **{c: getattr(self, c) for c in COLUMNS}, n_states=self.n_states,
                 n_actions=self.n_actions, env_id=np.array(self.env_id), episodes=self.episodes)
        return path if path.endswith(".npz") else path + ".npz"


def generate(info: EnvInfo, n: int, seed: int = 0, behaviour: str = "random",
             behaviour_q: np.ndarray | None = None, behaviour_epsilon: float = 0.1,
             use_model: bool | None = None) -> Dataset:
    """n transitions of the behaviour policy on info's env (compiled model when available)."""
    n = int(n)
    if n < 1:
        raise UsageError(f"transitions={n} must be >= 1; e.g. --transitions 1000000")
    if behaviour not in BEHAVIOURS:
        raise UsageError(f"unknown behaviour {behaviour!r}; use one of {', '.join(BEHAVIOURS)}")
    bq = np.zeros((0, info.n_actions), np.float64)
    if behaviour == "epsilon-greedy":
        if behaviour_q is None:
            raise UsageError("behaviour epsilon-greedy needs a Q-table; pass --behaviour-q FILE.npy")
        bq = np.ascontiguousarray(behaviour_q, dtype=np.float64)
        if bq.shape != (info.n_states, info.n_actions):
            raise UsageError(
                f"behaviour Q-table has shape {bq.shape}, {info.env_id} needs "
                f"({info.n_states}, {info.n_actions}); pass a table saved for this env"
            )
    if use_model is None:
        use_model = info.model is not None
    if use_model and info.model is None:
        raise UsageError(f"{info.env_id} has no transition table; generate by stepping the env (use_model=False)")
    cols = {c: np.empty(n, DTYPES[c]) for c in COLUMNS}
    if use_model:
        from hetrl.tabular import kernels as K

        m = info.model
        episodes = K.generate_model(m.cum_p, m.n_out, m.next_s, m.reward, m.term, m.isd_cum,
                                    int(info.max_steps), bq, K.eps_threshold(behaviour_epsilon),
                                    K.rng_state(seed), cols["s"], cols["a"], cols["r"], cols["s2"],
                                    cols["a2"], cols["done"])
    else:
        episodes = _generate_env(info, n, seed, bq, behaviour_epsilon, cols)
    return Dataset(**cols, n_states=info.n_states, n_actions=info.n_actions, env_id=info.env_id,
                   episodes=int(episodes))


def _generate_env(info: EnvInfo, n: int, seed: int, bq: np.ndarray, eps: float, cols: dict) -> int:
    """Same stream as the model sampler, by stepping the real Gymnasium env (slow, general)."""
    rng = np.random.default_rng(seed)
    env = make_env(info.env_id, info.env_kwargs)
    nA = info.n_actions

    def behave(state: int) -> int:
        if bq.shape[0] == 0 or rng.random() < eps:
            return int(rng.integers(nA))
        return int(np.argmax(bq[state]))

    episodes = 1
    try:
        s, _ = env.reset(seed=int(seed))
        a = behave(int(s))
        for i in range(n):
            s2, r, term, trunc, _ = env.step(a)
            a2 = behave(int(s2))
            cols["s"][i], cols["a"][i], cols["r"][i] = s, a, r
            cols["s2"][i], cols["a2"][i], cols["done"][i] = s2, a2, bool(term)
            if term or trunc:
                s, _ = env.reset()
                a = behave(int(s))
                episodes += 1
            else:
                s, a = s2, a2
    finally:
        env.close()
    return episodes


def load(path: str | os.PathLike, n_states: int | None = None, n_actions: int | None = None) -> Dataset:
    """Read a .npz dataset; UsageError naming what is wrong with it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise UsageError(f"dataset file {path!r} does not exist; pass an .npz written by --save-data")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as exc:  # corrupt / not npz
        raise UsageError(f"cannot read dataset {path!r} ({exc}); pass an .npz file") from exc
    with z:
        missing = [c for c in COLUMNS if c not in z.files]
        if missing:
            raise UsageError(f"dataset {path!r} lacks column(s) {', '.join(missing)}; it needs {', '.join(COLUMNS)}")
        cols = {c: np.ascontiguousarray(z[c]) for c in COLUMNS}
        fs = z["n_states"] if "n_states" in z.files else None
        fa = z["n_actions"] if "n_actions" in z.files else None
        env_id = str(z["env_id"]) if "env_id" in z.files else ""
        episodes = int(z["episodes"]) if "episodes" in z.files else 0
    n = cols["s"].shape[0]
    if n == 0:
        raise UsageError(f"dataset {path!r} holds no transitions; pass a non-empty .npz")
    for c in COLUMNS:
        if cols[c].ndim != 1 or cols[c].shape[0] != n:
            raise UsageError(f"dataset {path!r}: column {c} has shape {cols[c].shape}, expected ({n},)")
        cols[c] = cols[c].astype(DTYPES[c], copy=False)
    if n_states is None:
        n_states_eff = fs if fs is not None else max(cols["s"].max(), cols["s2"].max()) + 1
    else:
        n_states_eff = n_states
    if n_actions is None:
        n_actions_eff = fa if fa is not None else max(cols["a"].max(), cols["a2"].max()) + 1
    else:
        n_actions_eff = n_actions
    nS, nA = int(n_states_eff), int(n_actions_eff)
    bad_s = fs is not None and n_states is not None and int(fs) != int(n_states)
    bad_a = fa is not None and n_actions is not None and int(fa) != int(n_actions)
    if bad_s or bad_a:
        raise UsageError(
            f"dataset {path!r} was made for {fs if fs is None else int(fs)} states x "
            f"{fa if fa is None else int(fa)} actions, the env has {n_states} x {n_actions}; "
            "pass data generated for this env"
        )
    for c, hi in (("s", nS), ("s2", nS), ("a", nA), ("a2", nA)):
        if n and (cols[c].min() < 0 or cols[c].max() >= hi):
            raise UsageError(f"dataset {path!r}: column {c} has values outside [0, {hi}); it does not fit this env")
    if n and not np.isfinite(cols["r"]).all():
        raise UsageError(f"dataset {path!r}: rewards contain NaN/inf")
    return Dataset(**cols, n_states=nS, n_actions=nA, env_id=env_id, episodes=episodes)


def shard_bounds(n: int, workers: int) -> np.ndarray:
    """Boundaries b (int64, length W+1) of W contiguous shards [b[w], b[w+1]) covering 0..n-1.

    Sizes differ by at most one; every transition belongs to exactly one shard. Contiguous
    shards keep each worker's data in trajectory order (values propagate along episodes
    within one pass) and are zero-copy slices.
    """
    n, workers = int(n), int(workers)
    if workers < 1:
        raise UsageError(f"workers={workers} must be >= 1; e.g. --workers 2")
    if n < workers:
        raise UsageError(f"transitions={n} is fewer than workers={workers}; use more transitions or fewer workers")
    q, rem = divmod(n, workers)
    sizes = np.full(workers, q, np.int64)
    sizes[:rem] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def shard_counts(data: Dataset, bounds: np.ndarray) -> np.ndarray:
    """Visits n_w(s, a) of each shard (int64, (W, S, A)): the weights of the 'weighted' merge."""
    W = len(bounds) - 1
    out = np.zeros((W, data.n_states, data.n_actions), np.int64)
    flat = data.s.astype(np.int64) * data.n_actions + data.a
    for w in range(W):
        out[w] = np.bincount(flat[bounds[w]:bounds[w + 1]], minlength=data.n_states * data.n_actions).reshape(
            data.n_states, data.n_actions)
    return out
