"""Runs to report on, read from the three kinds of directory `hetrl report` takes.

- a hetrl run (`hetrl train --out DIR`): DIR/result.json with `algo`, `env`, `seed`,
  `eval_return_mean` (the evaluation of the run's policy), `best_select_return_mean` and
  `evaluations`, the [env_steps, eval_return_mean] pairs of its periodic evaluations;
- a hetrl population: DIR/result.json with `population: {seeds, sweep, members: [{name, seed,
  settings, dir}]}`, each member's dir a hetrl run; one group per setting (the members that
  share `settings`);
- a Stable-Baselines3 EvalCallback log: a directory with evaluations.npz (`timesteps` (n,),
  `results` (n, episodes)); its env is read from a Monitor file (*monitor.csv) beside it
  when there is one.

A path with a glob pattern (quoted so the shell leaves it, e.g. 'sb3/seed*') makes one group
of every hetrl run or every SB3 log it matches: the seeds of one setting.
"""

from __future__ import annotations

import glob
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hetrl.errors import UsageError

KINDS = ("a hetrl run (result.json), a hetrl population (result.json with `population`) or an SB3 "
         "EvalCallback log (evaluations.npz)")


@dataclass
class Member:
    """One run: its final and best scores and its periodic evaluations."""
    name: str
    library: str                     # "hetrl" or "sb3"
    env: str | None
    final: float | None              # the run's evaluated policy (SB3: the last evaluation)
    best: float | None               # best_select_return_mean, else the best periodic evaluation
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))    # env steps of the evaluations
    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))  # their mean returns
    seed: int | None = None
    settings: dict = field(default_factory=dict)
    path: Path | None = None

    def score(self, metric: str) -> float | None:
        return self.final if metric == "final" else self.best


@dataclass
class Group:
    """Runs reported together: one row of the table, one line of the curves."""
    name: str
    library: str
    members: list[Member]
    settings: dict = field(default_factory=dict)
    source: str = ""

    @property
    def envs(self) -> list[str | None]:
        return sorted({m.env for m in self.members}, key=lambda e: (e is None, e or ""))

    @property
    def env_label(self) -> str:
        return " + ".join(e or "?" for e in self.envs)


def load_runs(path: str | Path, env: str | None = None) -> list[Group]:
    """The groups in `path` (a run, a population, an SB3 log, or a glob of runs or logs).
    `env` names the env of SB3 logs that do not record it."""
    text = str(path)
    p = Path(text)
    if not p.exists() and glob.has_magic(text):
        return [_glob_group(text, env)]
    p = _dir_of(p)
    label = text.rstrip("/") or text   # as the user gave it: two runs named seed0 stay apart
    result = _result_json(p)
    if result is not None and isinstance(result.get("population"), dict):
        return _population(p, result, label)
    if result is not None:
        return [Group(label, "hetrl", [_hetrl_member(p, result)], source=text)]
    return [Group(label, "sb3", [_sb3_member(p, env)], source=text)]


def load_population(pop_dir: str | Path) -> list[Group]:
    """The groups (one per setting) of a population directory; an error for any other directory."""
    d = _dir_of(Path(pop_dir))
    result = _result_json(d)
    if result is None or not isinstance(result.get("population"), dict):
        raise UsageError(f"{d} is not a population directory (no `population` in result.json); give the --out "
                         "directory of a run trained with --seeds or --sweep")
    return _population(d, result, d.name)


def _dir_of(p: Path) -> Path:
    if p.is_file() and p.name in ("result.json", "evaluations.npz"):
        return p.parent
    if not p.exists():
        raise UsageError(f"{p} does not exist; give {KINDS}")
    if not p.is_dir() or not ((p / "result.json").is_file() or (p / "evaluations.npz").is_file()):
        hint = ""
        if p.is_dir() and any(c.is_dir() and ((c / "result.json").is_file() or (c / "evaluations.npz").is_file())
                              for c in p.iterdir()):
            hint = f"; its subdirectories are runs: group them with a quoted glob, e.g. '{p}/*'"
        raise UsageError(f"{p} is none of the directories hetrl report reads; give {KINDS}{hint}")
    return p


def _glob_group(pattern: str, env: str | None) -> Group:
    matches = [Path(m) for m in sorted(glob.glob(pattern)) if Path(m).is_dir()]
    matches = [m for m in matches if (m / "result.json").is_file() or (m / "evaluations.npz").is_file()]
    if not matches:
        raise UsageError(f"{pattern!r} matches no run directory; give a pattern that matches {KINDS}")
    members, libraries = [], set()
    for m in matches:
        result = _result_json(m)
        if result is not None and isinstance(result.get("population"), dict):
            raise UsageError(f"{pattern!r} matches the population {m}; give a population as its own argument")
        member = _hetrl_member(m, result) if result is not None else _sb3_member(m, env)
        libraries.add(member.library)
        members.append(member)
    if len(libraries) > 1:
        raise UsageError(f"{pattern!r} matches both hetrl runs and SB3 logs; give each library's runs as their own "
                         "argument so they are compared, not pooled")
    return Group(pattern, libraries.pop(), members, source=pattern)


def _result_json(d: Path) -> dict | None:
    f = d / "result.json"
    if not f.is_file():
        return None
    try:
        result = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{f} is not readable JSON ({e}); give the directory of a finished run") from None
    if not isinstance(result, dict):
        raise UsageError(f"{f} is not a JSON object; give the directory of a finished hetrl run")
    return result


def _num(v) -> float | None:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _hetrl_member(d: Path, result: dict, name: str | None = None, settings: dict | None = None) -> Member:
    pairs = result.get("evaluations") or []
    if not isinstance(pairs, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise UsageError(f"{d}/result.json: `evaluations` is not a list of [env_steps, return] pairs; "
                         "give the directory of a run hetrl wrote")
    # an evaluation whose return was not finite (written as null or NaN) is left out
    ev = np.asarray([[_num(s), _num(r)] for s, r in pairs], dtype=float).reshape(-1, 2)
    ev = ev[np.isfinite(ev).all(axis=1)]
    ev = ev[np.argsort(ev[:, 0], kind="stable")]
    steps, returns = ev[:, 0], ev[:, 1]
    final = _num(result.get("eval_return_mean"))
    if final is None and returns.size:
        final = float(returns[-1])  # not evaluated at the end: its last periodic evaluation, as SB3's
    best = _num(result.get("best_select_return_mean"))
    if best is None and returns.size:
        best = float(returns.max())
    seed = result.get("seed")
    return Member(name or d.name, "hetrl", result.get("env"), final, best, steps, returns,
                  seed if isinstance(seed, int) else None, dict(settings or {}), d)


def _sb3_member(d: Path, env: str | None) -> Member:
    f = d / "evaluations.npz"
    try:
        with np.load(f) as z:
            steps = np.asarray(z["timesteps"], dtype=float).reshape(-1)
            results = np.asarray(z["results"], dtype=float)
    except KeyError:
        raise UsageError(f"{f} has no `timesteps` and `results` arrays; give the log directory of SB3's "
                         "EvalCallback (its log_path)") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{f} is not a readable .npz file ({e}); give the log directory of SB3's EvalCallback") from None
    returns = results.reshape(len(steps), -1).mean(axis=1) if steps.size else np.zeros(0)
    ok = np.isfinite(steps) & np.isfinite(returns)
    steps, returns = steps[ok], returns[ok]
    final = float(returns[-1]) if returns.size else None
    best = float(returns.max()) if returns.size else None
    return Member(d.name, "sb3", _monitor_env(d) or env, final, best, steps, returns, path=d)


def _monitor_env(d: Path) -> str | None:
    """The env id in the header of an SB3 Monitor file (`#{"t_start": ..., "env_id": ...}`)."""
    for f in sorted(d.glob("*monitor.csv")):
        try:
            with open(f) as fh:
                line = fh.readline()
            env = json.loads(line[1:]).get("env_id") if line.startswith("#") else None
        except (OSError, ValueError, AttributeError):
            continue
        if env:
            return str(env)
    return None


def _population(d: Path, result: dict, label: str) -> list[Group]:
    entries = result["population"].get("members") or []
    if not entries:
        raise UsageError(f"{d}/result.json lists no members; give a population that finished training")
    rows: dict[str, Group] = {}
    sweep = bool(result["population"].get("sweep"))
    for e in entries:
        if not isinstance(e, dict) or "dir" not in e:
            raise UsageError(f"{d}/result.json: a member without `dir`; give a population directory hetrl wrote")
        mdir = d / e["dir"]
        mresult = _result_json(mdir)
        if mresult is None:
            raise UsageError(f"member {e.get('name', mdir.name)} of {d} has no result.json in {mdir}; finish the "
                             f"population first (hetrl train --resume {d})")
        settings = e.get("settings") or {}
        member = _hetrl_member(mdir, mresult, e.get("name"), settings)
        if member.seed is None and isinstance(e.get("seed"), int):
            member.seed = e["seed"]
        member.env = member.env or result.get("env")
        key = json.dumps(settings, sort_keys=True, default=str)
        if key not in rows:
            setting = " ".join(f"{k}={v}" for k, v in settings.items())
            rows[key] = Group(f"{label} {setting}" if sweep and setting else label, "hetrl", [], settings, str(d))
        rows[key].members.append(member)
    return list(rows.values())
