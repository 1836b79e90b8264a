"""Parallel tabular Q-learning and SARSA (SwiftRL on CPU cores).

    from hetrl.tabular import train_tabular
    res = train_tabular("qlearning", "Taxi-v3", workers=2, transitions=1_000_000, dtype="int32")
    res.result["eval_return_mean"], res.result["updates_per_s"]
    res.evaluate(episodes=100)          # greedy policy on the real env
    res.save("runs/taxi")               # q_table.npy + result.json

Offline mode (default): a behaviour policy's dataset of N transitions (generated, or an .npz
file) is split into W contiguous shards; each round every worker runs a compiled nogil
kernel over its shard from the merged table, then the W tables are merged. Online mode:
W workers each drive their own env copy epsilon-greedily and are merged every K steps.
See docs/tabular.md for the design and measured figures.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from numbers import Integral
from typing import TYPE_CHECKING

from hetrl.errors import UsageError
from hetrl.tabular.options import ALGOS, BACKENDS, DTYPES, MERGES, MODES, SARSA_NEXT

if TYPE_CHECKING:  # numpy is imported lazily: `hetrl --help` must stay cheap
    import numpy as np

# Defaults measured to learn from 1M random transitions on every toy-text env
# tried (docs/tabular.md, "Learning results"); per-env entries override them.
DEFAULTS = {
    "offline": dict(rounds=10, alpha=0.5, alpha_final=0.05, gamma=0.99, epsilon=0.3, epsilon_final=0.0),
    "online": dict(rounds=50, alpha=0.5, alpha_final=0.05, gamma=0.99, epsilon=1.0, epsilon_final=0.0),
}
ENV_DEFAULTS = {"FrozenLake": dict(eval_episodes=1000)}  # stochastic: 100 episodes are too noisy
DEFAULT_EVAL_EPISODES = 100

__all__ = ["train_tabular", "TabularResult", "load_result", "ALGOS", "DTYPES", "MODES"]


@dataclass
class TabularResult:
    """A trained table and what was measured. q_table has the trained dtype (int32: fixed point)."""

    q_table: np.ndarray
    result: dict
    info: object = field(repr=False, default=None)  # hetrl.tabular.envs.EnvInfo
    frac_bits: int | None = None

    @property
    def q_float(self) -> np.ndarray:
        """The table as float32 Q-values (int32 tables divided by 2**frac_bits)."""
        import numpy as np

        if self.frac_bits is None:
            return np.asarray(self.q_table, np.float32)
        from hetrl.tabular.fixedpoint import from_fixed

        return from_fixed(self.q_table, self.frac_bits)

    @property
    def policy(self) -> np.ndarray:
        """Greedy action per state (first maximum)."""
        import numpy as np

        return np.argmax(self.q_table, axis=1)

    def evaluate(self, episodes: int = 100, seed: int | None = None) -> dict:
        """Greedy-policy return/success on the real env (same episodes for the same seed)."""
        from hetrl.tabular.evaluate import DEFAULT_EVAL_SEED, evaluate

        info = self.info
        if info is None:
            from hetrl.tabular.envs import env_info

            info = self.info = env_info(self.result["env_id"], self.result.get("env_kwargs"), with_model=False)
        return evaluate(info, self.q_table, episodes, DEFAULT_EVAL_SEED if seed is None else seed)

    def save(self, out: str | os.PathLike, force: bool = False) -> str:
        """Write DIR/q_table.npy and DIR/result.json; UsageError if result.json exists and not force."""
        import numpy as np

        out = os.fspath(out)
        path = os.path.join(out, "result.json")
        if os.path.exists(path) and not force:
            raise UsageError(f"{path} already exists; pass --force (force=True) to overwrite or choose another --out")
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--out {out} is a file; pass a directory path")
        os.makedirs(out, exist_ok=True)
        np.save(os.path.join(out, "q_table.npy"), self.q_table)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self.result, fh, indent=2, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
        return out


def load_result(out: str | os.PathLike) -> TabularResult:
    """Read back a directory written by TabularResult.save."""
    import numpy as np

    out = os.fspath(out)
    try:
        with open(os.path.join(out, "result.json")) as fh:
            result = json.load(fh)
        q = np.load(os.path.join(out, "q_table.npy"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{out} is not a tabular run directory ({exc}); pass the --out of `hetrl tabular`") from exc
    return TabularResult(q, result, None, result.get("frac_bits"))


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise UsageError(f"unknown {name} {value!r}; use one of {', '.join(choices)}")


def _positive_int(name: str, value, flag: str) -> int:
    ok = isinstance(value, Integral) and not isinstance(value, bool)
    ok = ok or (isinstance(value, float) and value.is_integer())
    if not ok:
        raise UsageError(f"{name}={value!r} is not an integer; e.g. {flag} 2")
    v = int(value)
    if v < 1:
        raise UsageError(f"{name}={v} must be >= 1; e.g. {flag} 2")
    return v


def train_tabular(algo: str, env: str, workers: int = 1, transitions: int = 1_000_000,
                  rounds: int | None = None, dtype: str = "float32", mode: str = "offline",
                  out: str | os.PathLike | None = None, seed: int = 0, *,
                  alpha: float | None = None, alpha_final: float | None = None,
                  gamma: float | None = None, epsilon: float | None = None,
                  epsilon_final: float | None = None, merge: str = "mean", backend: str = "threads",
                  sarsa_next: str = "policy", data: str | os.PathLike | object | None = None,
                  save_data: str | os.PathLike | None = None, behaviour: str = "random",
                  behaviour_q: np.ndarray | str | None = None, behaviour_epsilon: float = 0.1,
                  env_kwargs: dict | None = None, eval_episodes: int | None = None,
                  frac_bits: int | None = None, sync_every: int | None = None,
                  measure_scaling: bool = True, force: bool = False) -> TabularResult:
    """Train a tabular agent with W parallel workers and evaluate its greedy policy.

    algo: "qlearning" | "sarsa"; env: a Gymnasium id with Discrete spaces; transitions: N
    offline transitions (or total env steps online); rounds: merges (offline: passes over
    the data). dtype "int32" trains in fixed point (frac_bits chosen from the reward range).
    alpha decays geometrically alpha -> alpha_final over the rounds; epsilon (learner-side
    SARSA offline, the behaviour online) decays linearly epsilon -> epsilon_final.
    sarsa_next: "policy" (a' epsilon-greedy from the learner's table) or "data" (a' of the
    behaviour policy, i.e. evaluate the behaviour policy). data: Dataset or .npz path
    instead of generating. Writes out/q_table.npy and out/result.json when out is given.
    """
    import numpy as np

    from hetrl.tabular import dataset as ds
    from hetrl.tabular.envs import env_info
    from hetrl.tabular.evaluate import evaluate
    from hetrl.tabular.fixedpoint import check_frac_bits, choose_frac_bits
    from hetrl.tabular.parallel import schedule, train_offline, train_online

    t_total = time.perf_counter()
    _check_choice("algo", algo, ALGOS)
    _check_choice("dtype", dtype, DTYPES)
    _check_choice("mode", mode, MODES)
    _check_choice("merge strategy", merge, MERGES)
    _check_choice("backend", backend, BACKENDS)
    _check_choice("sarsa_next", sarsa_next, SARSA_NEXT)
    workers = _positive_int("workers", workers, "--workers")
    transitions = _positive_int("transitions", transitions, "--transitions") if data is None else None
    if out is not None and os.path.exists(os.path.join(os.fspath(out), "result.json")) and not force:
        raise UsageError(f"{os.path.join(os.fspath(out), 'result.json')} already exists; "
                         "pass --force to overwrite or choose another --out")

    d = dict(DEFAULTS[mode])
    info = env_info(env, env_kwargs)
    d.update({k: v for k, v in ENV_DEFAULTS.get(info.name, {}).items()})
    rounds = _positive_int("rounds", rounds if rounds is not None else d["rounds"], "--rounds")
    alpha = float(d["alpha"] if alpha is None else alpha)
    # default decay: alpha_final = alpha / 10 (0.5 -> 0.05)
    alpha_final = float(alpha * d["alpha_final"] / d["alpha"] if alpha_final is None else alpha_final)
    gamma = float(d["gamma"] if gamma is None else gamma)
    epsilon = float(d["epsilon"] if epsilon is None else epsilon)
    epsilon_final = float(d["epsilon_final"] if epsilon_final is None else epsilon_final)
    eval_episodes = int(d.get("eval_episodes", DEFAULT_EVAL_EPISODES) if eval_episodes is None else eval_episodes)
    for name, v in (("alpha", alpha), ("alpha_final", alpha_final)):
        if not 0.0 < v <= 1.0:
            raise UsageError(f"{name}={v} is outside (0, 1]; e.g. --alpha 0.5")
    if not 0.0 <= gamma < 1.0:
        raise UsageError(f"gamma={gamma} is outside [0, 1); e.g. --gamma 0.99")
    for name, v in (("epsilon", epsilon), ("epsilon_final", epsilon_final)):
        if not 0.0 <= v <= 1.0:
            raise UsageError(f"{name}={v} is outside [0, 1]; e.g. --epsilon 0.3")
    if eval_episodes < 0:
        raise UsageError(f"eval_episodes={eval_episodes} must be >= 0")
    if merge == "sum" and workers > 1 and alpha * workers > 1.0:
        raise UsageError(f"merge sum with alpha*workers = {alpha * workers:g} > 1 diverges; "
                         f"use --merge mean/weighted or --alpha {1.0 / workers:g} or less")
    alphas = schedule(alpha, alpha_final, rounds, "geometric")
    epsilons = schedule(epsilon, epsilon_final, rounds, "linear")

    result: dict = {"algo": algo, "env": env, "env_id": info.env_id, "mode": mode, "workers": workers,
                    "dtype": dtype}
    t_data = time.perf_counter()
    dataset = None
    if mode == "offline":
        if data is not None:
            if isinstance(data, ds.Dataset):
                dataset, source = data, "memory"
            else:
                dataset, source = ds.load(data, info.n_states, info.n_actions), os.fspath(data)
            made_for = dataset.env_id.split("/")[-1].split("-v")[0]
            if made_for and made_for != info.name:
                raise UsageError(f"the dataset was generated on {dataset.env_id}, not {info.env_id}; "
                                 f"pass --env {dataset.env_id} or data generated for {info.env_id}")
        else:
            bq = behaviour_q
            if isinstance(bq, (str, os.PathLike)):
                try:
                    bq = np.load(bq)
                except (OSError, ValueError) as exc:
                    raise UsageError(f"cannot read behaviour Q-table {bq!r} ({exc}); pass a .npy file") from exc
            dataset = ds.generate(info, transitions, seed=seed, behaviour=behaviour, behaviour_q=bq,
                                  behaviour_epsilon=behaviour_epsilon)
            source = f"generated:{behaviour}:{'model' if info.model is not None else 'env'}"
        transitions = len(dataset)
        if transitions < workers:
            raise UsageError(f"transitions={transitions} is fewer than workers={workers}; "
                             "use more transitions or fewer workers")
        if save_data is not None:
            ds_path = dataset.save(save_data)
            result["data_saved"] = ds_path
        r_abs = dataset.reward_abs_max
    else:
        if data is not None:
            raise UsageError("online mode generates its own experience; drop --data or use --mode offline")
        if merge == "weighted":
            raise UsageError("merge weighted needs the visit counts of an offline dataset; "
                             "use --merge mean in online mode")
        if transitions < workers:
            raise UsageError(f"transitions={transitions} is fewer than workers={workers}; "
                             "use more transitions or fewer workers")
        if sync_every is not None:
            k = _positive_int("sync_every", sync_every, "--sync-every")
            rounds = max(1, math.ceil(transitions / (workers * k)))
            alphas = schedule(alpha, alpha_final, rounds, "geometric")
            epsilons = schedule(epsilon, epsilon_final, rounds, "linear")
        else:
            k = transitions // (workers * rounds)
            if k < 1:
                raise UsageError(f"transitions={transitions} cannot give {rounds} rounds to {workers} workers; "
                                 "use more transitions or fewer rounds")
        source = "online:" + ("model" if info.model is not None else "env")
        r_abs = info.model.reward_abs_max if info.model is not None else None
    data_s = time.perf_counter() - t_data

    if dtype == "int32":
        if r_abs is None:  # online on an env without a table: reward range unknown up front
            frac_bits = 16 if frac_bits is None else int(frac_bits)
        elif frac_bits is None:
            frac_bits = choose_frac_bits(r_abs, gamma)
        else:
            check_frac_bits(frac_bits, r_abs, gamma)
    else:
        frac_bits = None

    if mode == "offline":
        q, st = train_offline(dataset, algo, dtype, workers, rounds, alphas, gamma, merge, backend,
                              epsilons, sarsa_next, seed, frac_bits, measure_single=measure_scaling)
    else:
        q, st = train_online(info, algo, dtype, workers, k, rounds, alphas, gamma, epsilons, merge,
                             seed, frac_bits)
        transitions = workers * k * rounds

    ups = st.updates / st.wall_s if st.wall_s > 0 else float("nan")
    single = st.single_worker_updates_per_s
    result.update({
        "transitions": int(transitions), "rounds": int(rounds), "updates": int(st.updates),
        "wall_s": round(st.wall_s, 6), "updates_per_s": ups, "updates_per_s_per_worker": ups / workers,
        "worker_kernel_updates_per_s": [u / t if t > 0 else None for u, t in zip(st.worker_updates, st.worker_kernel_s)],
        "worker_cpu_updates_per_s": [u / c if c > 0 else None for u, c in zip(st.worker_updates, st.worker_cpu_s)],
        "kernel_overlap": (st.overlap_s / st.kernel_s) if workers > 1 and st.kernel_s > 0 else None,
        "single_worker_updates_per_s": single,
        "scaling_efficiency": (ups / (workers * single)) if single else None,
        "kernel_s": round(st.kernel_s, 6), "merge_s": round(st.merge_s, 6), "setup_s": round(st.setup_s, 6),
        "merge": merge, "backend": backend if mode == "offline" else "threads",
        "alpha": alpha, "alpha_final": alpha_final, "gamma": gamma,
        "epsilon": epsilon, "epsilon_final": epsilon_final,
        "sarsa_next": sarsa_next if algo == "sarsa" and mode == "offline" else None,
        "frac_bits": frac_bits, "q_scale": (1 << frac_bits) if frac_bits is not None else None,
        "seed": seed, "data_source": source, "data_s": round(data_s, 6),
        "n_states": info.n_states, "n_actions": info.n_actions, "env_kwargs": info.env_kwargs,
    })
    if mode == "offline":
        result["data_episodes"] = int(dataset.episodes)
        if algo == "sarsa" and sarsa_next == "data":
            result["note"] = "sarsa with data actions evaluates the behaviour policy (greedy of its Q)"
    else:
        result["sync_every"] = int(k)
        result["online_episodes"] = st.online_episodes
        result["online_return_mean"] = st.online_return_mean

    res = TabularResult(q, result, info, frac_bits)
    t_eval = time.perf_counter()
    if eval_episodes > 0:
        ev = evaluate(info, q, eval_episodes)
        result.update(ev)
        result["eval_episodes"] = result.pop("episodes")
    else:
        result.update({"eval_return_mean": None, "success_rate": None, "eval_episodes": 0})
    result["eval_s"] = round(time.perf_counter() - t_eval, 6)
    result["total_s"] = round(time.perf_counter() - t_total, 6)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "numpy": np.__version__, "numba": _numba_version()}
    if out is not None:
        result["out"] = os.fspath(out)
        res.save(out, force=force)
    return res


def _numba_version() -> str:
    import numba

    return numba.__version__
