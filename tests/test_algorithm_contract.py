"""The algorithm protocol's contract (hetrl/algorithm.py, docs/extending.md), checked on every registered
algorithm: the built-ins, CrossQ, any later one, and docs/extending.md's example ("twinq", registered by
tests/extending_example.py from the doc's own code) — each on a small env it takes and a tiny network:
learn, act, pickle, the state round trip, checkpoint/resume inline and local, acting in a Ray worker, loading. Then what a user's
algorithm gets with no line of hetrl changed (evaluation, the planner, an entry point found by `hetrl train`),
and that hetrl outside an algorithm's own file names no built-in algorithm."""

from __future__ import annotations

import ast
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import extending_example  # noqa: F401  (docs/extending.md's example: registers "twinq")
import hetrl
from hetrl import registry
from hetrl.algos import learn_spec, make_algorithm
from hetrl.cli import main
from hetrl.config import make_config
from hetrl.kernels import synthetic_batch

ALGOS = registry.names()
TINY = dict(net_arch=[16], qf_arch=[16], batch_size=16, buffer_size=2000, learning_starts=100, train_freq=50,
            gradient_steps=10, eval_episodes=0, threads=1, num_envs=2, learner_kernel="public")
ROOT = Path(__file__).resolve().parents[1]


def env_for(name: str) -> str:
    """A small env the algorithm takes: CartPole-v1 for discrete actions, Pendulum-v1 for continuous ones."""
    return "CartPole-v1" if gym.spaces.Discrete in registry.get(name).action_spaces else "Pendulum-v1"


def tiny(name: str) -> dict:
    """TINY, and for an on-policy algorithm rollouts of 25 vector steps of its 2 envs (50 env steps, a phase of
    TINY's train_freq)."""
    return {**TINY, "n_steps": 25} if registry.get(name).storage == "rollout" else TINY


def build(name: str, seed: int = 0):
    env = gym.make(env_for(name))
    cfg = make_config(name, env_for(name), tiny(name))
    torch.manual_seed(seed)
    return make_algorithm(cfg, env.observation_space, env.action_space), cfg, env


def batches(algo, cfg, env, K: int, seed: int):
    spec = learn_spec(cfg, env.observation_space, env.action_space)
    return synthetic_batch(spec, env.action_space, 16, K, "cpu", torch.Generator().manual_seed(seed))


def observations(env, n: int = 4) -> np.ndarray:
    env.observation_space.seed(0)
    return np.stack([env.observation_space.sample() for _ in range(n)]).astype(np.float32)


def in_space(space: gym.Space, actions) -> bool:
    return len(actions) > 0 and all(space.contains(np.asarray(a, dtype=space.dtype)) for a in actions)


def test_the_built_ins_and_the_docs_example_are_registered():
    assert {"dqn", "ddpg", "td3", "sac", "crossq", "twinq"} <= set(ALGOS)


@pytest.mark.parametrize("name", ALGOS)
def test_learn_returns_td_and_counts_updates_and_the_state_round_trips(name):
    algo, cfg, env = build(name)
    b, w = batches(algo, cfg, env, K=3, seed=1)
    td = algo.learn(b, w)
    assert td.shape == (3, 16) and torch.isfinite(td).all() and (td >= 0).all()
    assert algo.updates == 3
    # a checkpoint is plain tensors and numbers (torch.load(weights_only=True))
    buf = io.BytesIO()
    torch.save(algo.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    twin, _, _ = build(name, seed=99)               # other initial weights: all of them must come from the state
    twin.load_state_dict(state)
    assert twin.updates == 3
    nb, nw = batches(algo, cfg, env, K=4, seed=2)
    torch.manual_seed(7)
    td_a = algo.learn(nb, nw)
    torch.manual_seed(7)
    td_b = twin.learn(nb, nw)
    assert torch.equal(td_a, td_b) and algo.updates == twin.updates == 7
    for key, value in algo.policy_state().items():
        assert torch.equal(value, twin.policy_state()[key]), key


@pytest.mark.parametrize("name", ALGOS)
def test_the_acting_policy_acts_in_the_space_pickles_and_loads_a_policy_state(name):
    algo, cfg, env = build(name)
    algo.learn(*batches(algo, cfg, env, K=2, seed=3))
    policy = algo.make_policy(seed=1, num_envs=4)
    obs = observations(env)
    for explore in (None, algo.exploration(10**7)):      # uniform random (warm-up), then the algorithm's value
        env_actions, stored = policy.act(obs, explore)
        assert len(env_actions) == len(stored) == 4 and in_space(env.action_space, env_actions)
    det = policy.act_deterministic(obs)
    assert in_space(env.action_space, det)
    policy.episode_end(np.array([True, False, False, True]))
    copy = pickle.loads(pickle.dumps(policy))             # sent to actor processes
    np.testing.assert_array_equal(copy.act_deterministic(obs), det)
    fresh, _, _ = build(name, seed=5)
    other = fresh.make_policy(seed=2)
    other.load(algo.policy_state())                       # what the parameter store publishes
    np.testing.assert_array_equal(other.act_deterministic(obs), det)


@pytest.mark.parametrize("name", ALGOS)
def test_checkpoint_resume_under_another_schedule_and_load(name, tmp_path):
    """Trained inline, saved, resumed under the local schedule (actor processes unpickle its policy), loaded."""
    out = tmp_path / "run"
    run = hetrl.train(name, env_for(name), steps=300, seed=0, out=out, plan="none", progress=False, **tiny(name))
    assert run.result["env_steps"] == 300 and run.algo.updates == run.result["gradient_steps"] > 0
    run = hetrl.resume(out, steps=500, progress=False, evaluate_episodes=0, schedule="local", actors=1,
                       envs_per_actor=2)
    assert run.result["env_steps"] == 500 and run.result["schedule"] == "local"
    assert run.algo.updates == run.result["gradient_steps"] > 0
    policy = hetrl.load(out)
    env = gym.make(env_for(name))
    obs, _ = env.reset(seed=0)
    assert env.action_space.contains(np.asarray(policy.act(obs), dtype=env.action_space.dtype))


# local_ray: conftest.py's (one Ray per test process; its workers import the docs example's module by name)
@pytest.mark.ray
def test_every_algorithms_policy_acts_in_a_ray_worker(local_ray):
    """What a Ray actor gets of each algorithm: its acting policy, through Ray's serialization, acts in a Ray
    worker as it acts here (one worker for every algorithm: the run itself is the same core under every
    algorithm, and runs under Ray below and in tests/test_ray.py and test_onpolicy_runs.py)."""
    policies, obs, want = {}, {}, {}
    for name in ALGOS:
        algo, cfg, env = build(name)
        algo.learn(*batches(algo, cfg, env, K=2, seed=3))
        policies[name], obs[name] = algo.make_policy(seed=1, num_envs=4), observations(env)
        want[name] = policies[name].act_deterministic(obs[name])

    @local_ray.remote
    def act_there(policies, obs):
        return {name: (p.act_deterministic(obs[name]), len(p.act(obs[name], None)[0])) for name, p in policies.items()}

    got = local_ray.get(act_there.remote(policies, obs), timeout=300)
    assert set(got) == set(ALGOS)
    for name, (det, n) in got.items():
        np.testing.assert_array_equal(det, want[name], err_msg=name)
        assert n == 4, name


@pytest.mark.ray
@pytest.mark.parametrize("name", ["twinq", "reinforce"])
def test_a_users_algorithm_trains_under_ray(name, local_ray, tmp_path):
    """docs/extending.md's off- and on-policy examples, registered from a module of the user's, in a tiny run on a
    Ray instance on loopback: the Ray actor imports the module to unpickle the policy."""
    run = hetrl.train(name, env_for(name), steps=300, seed=0, out=tmp_path / "r", plan="none", progress=False,
                      schedule="ray", actors=1, **{**tiny(name), "num_envs": 1})
    assert run.result["env_steps"] >= 300 and run.algo.updates == run.result["gradient_steps"] > 0
    assert hetrl.load(tmp_path / "r").act(observations(gym.make(env_for(name)), 2)).shape[0] == 2


# ---- a user's algorithm: docs/extending.md's example -----------------------------------------------------
def test_the_docs_example_trains_inline_and_local_is_evaluated_and_resumes(tmp_path):
    out = tmp_path / "twinq"
    run = hetrl.train("twinq", "CartPole-v1", steps=400, seed=1, out=out, plan="none", progress=False,
                      schedule="local", actors=1, **{**TINY, "eval_episodes": 2})
    assert run.result["schedule"] == "local" and "eval_return_mean" in run.result
    assert json.loads((out / "result.json").read_text())["algo"] == "twinq"
    run = hetrl.resume(out, steps=600, progress=False, evaluate_episodes=2, schedule="inline")
    assert run.result["env_steps"] == 600 and run.result["schedule"] == "inline"
    assert run.evaluate(episodes=2)["eval_return_mean"] > 0
    assert hetrl.load(out).act(np.zeros(4, np.float32)) in (0, 1)


def test_an_algorithm_defined_in_a_script_runs_under_the_local_schedule(tmp_path):
    """Actor processes import the user's script (as for an env factory defined there) to unpickle its policy."""
    script = tmp_path / "train_twinq.py"
    script.write_text(extending_example.example_source() + textwrap.dedent('''

        if __name__ == "__main__":
            run = hetrl.train("twinq", "CartPole-v1", steps=300, plan="none", progress=False, schedule="local",
                              actors=1, learning_starts=100, train_freq=50, gradient_steps=5, eval_episodes=0,
                              threads=1, learner_kernel="public")
            print("trained", run.result["env_steps"], run.result["schedule"])
    '''))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and "trained 300 local" in p.stdout, p.stderr[-2000:]


def test_the_planner_profiles_and_plans_a_users_algorithm(tmp_path, monkeypatch):
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path))
    from hetrl.planner import plan
    from hetrl.planner.profile import run_profile

    cfg = make_config("twinq", "CartPole-v1", TINY)
    table = run_profile(cfg, devices=["cpu"], quick=True, measure_power=False, ipc=False)
    assert table.data["key"]["algo"] == "twinq"
    assert table.data["learner_kernel"]["cpu"]["name"] == "public"       # no compiled head for it: the public one
    result = plan(cfg, profile=table)
    assert result.plan.schedule in ("inline", "local") and result.predicted_env_steps_per_s > 0
    new = result.apply(cfg)
    assert new.algo == "twinq" and new.net_arch == cfg.net_arch


def test_an_entry_point_is_found_by_hetrl_train(tmp_path):
    """A package declaring a `hetrl.algorithms` entry point (a dist-info on sys.path, as pip leaves one) is listed
    by `hetrl algorithms` and trained by `hetrl train NAME`, with no import by the user."""
    site = tmp_path / "site"
    (site / "tinyalgo-0.1.dist-info").mkdir(parents=True)
    (site / "tinyalgo-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyalgo\nVersion: 0.1\n")
    (site / "tinyalgo-0.1.dist-info" / "entry_points.txt").write_text("[hetrl.algorithms]\ntinyq = tinyalgo:TinyQ\n")
    (site / "tinyalgo.py").write_text(textwrap.dedent('''
        from extending_example import TwinQ

        class TinyQ(TwinQ):
            """A user's package's algorithm (docs/extending.md's example, renamed)."""
            presets = {"default": {"net_arch": [16], "learning_starts": 100, "train_freq": 50, "gradient_steps": 5}}
    '''))
    code = ("import sys; from hetrl.cli import main; main(['algorithms']); "
            "sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).parent), str(ROOT)])}
    p = subprocess.run([sys.executable, "-c", code, "train", "tinyq", "--env", "CartPole-v1", "--steps", "300",
                        "--plan", "none", "--no-progress", "--out", str(tmp_path / "t"),
                        "--set", "eval_episodes=0", "--set", "threads=1"],
                       capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("tinyq"))
    assert "discrete" in line and "entry point of tinyalgo" in line and "A user's package's algorithm" in line
    result = json.loads((tmp_path / "t" / "result.json").read_text())
    assert result["algo"] == "tinyq" and result["env_steps"] == 300 and result["config"]["net_arch"] == [16]


def test_hetrl_algorithms_lists_crossq_and_the_users(capsys):
    assert main(["algorithms"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert "continuous" in lines["crossq"] and "hetrl" in lines["crossq"] and "CrossQ" in lines["crossq"]
    assert "discrete" in lines["twinq"] and "register_algorithm" in lines["twinq"]


# ---- nothing outside an algorithm's own file names a built-in ----------------------------------------------
BUILT_INS = {"dqn", "ddpg", "td3", "sac", "crossq"}
# (file, value): known uses, each with its reason
ALLOWED = {("hetrl/planner/cli.py", "dqn"): "`hetrl profile` without arguments profiles DQN on CartPole-v1"}


def names_in(path: Path) -> list[tuple[int, str]]:
    """String literals equal to a built-in's name and identifiers / attribute names spelling one (docstrings and
    comments are not code)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            value = node.value.strip().lower()
        elif isinstance(node, ast.Attribute):
            value = node.attr.lower()
        elif isinstance(node, ast.Name):
            value = node.id.lower()
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.arg, ast.keyword)):
            value = (getattr(node, "name", None) or getattr(node, "arg", None) or "").lower()
        else:
            continue
        if value in BUILT_INS:
            found.append((node.lineno, value))
    return found


def test_no_file_outside_the_algorithms_and_kernels_names_a_built_in():
    offenders = []
    for path in sorted((ROOT / "hetrl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("hetrl/algos/", "hetrl/kernels/")) or rel == "hetrl/sb3/compat.py":
            continue   # (the SB3 front end's table of the built-ins' SB3 facts names them: SB3 ships them)
        offenders += [f"{rel}:{line}: {value}" for line, value in names_in(path) if (rel, value) not in ALLOWED]
    assert not offenders, "\n".join(offenders)


def test_the_name_check_finds_what_it_looks_for(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('"""About dqn."""\nimport x\nif cfg.algo == "sac":\n    x.td3()\n# crossq\nmsg = "use ddpg here"\n')
    assert sorted(names_in(f)) == [(3, "sac"), (4, "td3")]


class _ReturnsNone(extending_example.TwinQ):
    def learn(self, batches, weights):
        super().learn(batches, weights)


class _FlatTD(extending_example.TwinQ):
    def learn(self, batches, weights):
        return super().learn(batches, weights).reshape(-1)   # (K*B,), not (K, B)


class _NoUpdates(extending_example.TwinQ):
    def learn(self, batches, weights):
        td = super().learn(batches, weights)
        self.updates -= weights.shape[0]
        return td


@pytest.mark.parametrize("cls,settings,words", [
    (_ReturnsNone, {}, r"returned NoneType, not \|TD\| as a float tensor of shape \(\d+, 16\)"),
    (_FlatTD, {"prioritized": True}, r"returned a float32 tensor of shape \(\d+,\), not \|TD\|"),
    (_NoUpdates, {}, r"advanced self.updates by 0, not by K=\d+"),
], ids=["returns-none", "flat-td-under-per", "updates-not-advanced"])
def test_a_learn_that_breaks_the_protocol_is_one_line_naming_it(cls, settings, words, capsys, tmp_path):
    """The learner core checks learn()'s contract on a run's first call: the API raises a UsageError subclass, the
    CLI exits 2 with one line naming the algorithm and learn."""
    hetrl.register_algorithm("brokenq", cls, replace=True)
    try:
        run = dict(steps=400, seed=0, plan="none", progress=False, net_arch=[16], batch_size=16, buffer_size=2000,
                   learning_starts=100, train_freq=40, gradient_steps=4, eval_episodes=0, threads=1,
                   learner_kernel="public", **settings)
        with pytest.raises(hetrl.LearnContractError, match=words) as err:
            hetrl.train("brokenq", "CartPole-v1", **run)
        assert isinstance(err.value, hetrl.UsageError) and "algorithm 'brokenq': learn(" in str(err.value)
        capsys.readouterr()
        sets = [f"--set={k}={v}" for k, v in run.items() if k not in ("steps", "seed", "plan", "progress")]
        code = main(["train", "brokenq", "--env", "CartPole-v1", "--steps", "400", "--plan", "none",
                     "--out", str(tmp_path / "run"), *[s.replace("[16]", "16") for s in sets]])
        err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
        assert code == 2 and len(err_lines) == 1 and "brokenq" in err_lines[0] and "learn(" in err_lines[0]
    finally:
        registry._REGISTRY.pop("brokenq", None)
