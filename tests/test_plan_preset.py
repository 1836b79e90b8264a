"""The planner changes where and how fast, never what the agent learns (synthetic profiles, no timing).

The profiles are the planner's real ProfileTable built from a few numbers (synthetic_table), the
search and the model are the real ones; only the timings are made up."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys

import pytest

from hetrl import registry
from hetrl.config import SYSTEM_KEYS, Config, make_config, preset_for
from hetrl.planner import pins_from_settings, plan
from hetrl.planner.profile import cache_path, grid_for, machine_info, machine_id, network_key
from synthetic_profiles import synthetic_table

TABLES = {"fast env": dict(env_step_s=20e-6, learn_s={"cpu": 1e-3}),
          "slow env": dict(env_step_s=3e-3, learn_s={"cpu": 1e-3}),     # a slow env would want many envs
          "slow learner": dict(env_step_s=20e-6, learn_s={"cpu": 20e-3}),
          "gpu learner": dict(gpus=("G",), env_step_s=1e-3, learn_s={"cpu": 5e-3, "cuda:0": 0.2e-3})}
PINS = [{}, {"schedule": "local"}, {"schedule": "inline"}, {"threads": 1}]
# what a user sets by hand: the system's settings become pins, the rest stays in the config
HAND_SETTINGS = [{}, {"schedule": "local"}, {"schedule": "inline", "device": "cpu"}, {"threads": 1},
                 {"schedule": "local", "actors": 2, "num_envs": 4}, {"num_envs": 6},
                 {"envs_per_actor": 3, "num_envs": 6},
                 {"device": "cuda", "schedule": "local"}, {"batch_size": 32, "lr": 1e-3, "gradient_steps": 4}]


def owned(cfg) -> set[str]:
    """The preset's (and the user's) settings of cfg's algorithm: every setting but the system's."""
    return {k for k in cfg.to_dict() if k not in SYSTEM_KEYS}


def presets(algos=None):
    for algo in registry.names():
        for env in registry.presets(algo):
            if env != "default" and (algos is None or algo in algos):
                yield algo, "ALE/Pong-v5" if env == "atari" else env   # `atari`: every Atari id's entry


def check_kept(cfg, result, why):
    new = result.apply(cfg)
    changed = {k for k in owned(cfg) if cfg.get(k) != new.get(k)}
    assert not changed, (why, changed)
    assert new.num_envs == cfg.num_envs == result.plan.num_envs, why
    assert result.learning_changes == {} and not any("learning dynamics" in n for n in result.notes), why
    assert set(result.plan.settings()) <= set(Config().to_dict()), why   # only Config keys
    return new


@pytest.mark.parametrize("algo,env", list(presets()))
def test_the_planner_never_changes_a_preset_owned_key(algo, env):
    cfg = make_config(algo, env, {"num_envs": 4} if algo == "dqn" and env == "CartPole-v1" else {})
    # the preset's env count (rl-zoo's n_envs: set for the on-policy presets, 1 where the zoo sets none)
    assert cfg.num_envs == (4 if algo == "dqn" and env == "CartPole-v1" else preset_for(algo, env).get("num_envs", 1))
    for (name, kw), pins in itertools.product(TABLES.items(), PINS):
        check_kept(cfg, plan(cfg, pins=pins, profile=synthetic_table(algo=algo, **kw)), (name, pins))


@pytest.mark.parametrize("algo,env", list(presets(("dqn", "ddpg"))))
def test_pins_from_hand_settings_never_change_a_preset_owned_key(algo, env):
    """Every dqn/ddpg preset x settings a user sets by hand (system ones are pins, learning ones stay
    in the config) x profiles: the plan sets system keys only, and splits the config's num_envs."""
    for hand, (name, kw) in itertools.product(HAND_SETTINGS, TABLES.items()):
        cfg = make_config(algo, env, {k: v for k, v in hand.items() if k not in SYSTEM_KEYS or k == "schedule"})
        table = synthetic_table(algo=algo, **kw)
        if hand.get("device") == "cuda" and "cuda:0" not in table.devices:
            continue
        result = plan(cfg, pins=pins_from_settings(hand), profile=table)
        new = check_kept(cfg, result, (hand, name))
        for k in ("actors", "envs_per_actor"):
            if k in hand:
                assert getattr(result.plan, k) == hand[k], (hand, name)
        if new.system.schedule == "local":
            assert new.system.actors * new.system.envs_per_actor == cfg.num_envs, (hand, name)


def test_one_env_gets_one_actor_and_local_still_overlaps():
    cfg = make_config("dqn", "CartPole-v1")
    assert cfg.num_envs == 1
    r = plan(cfg, pins={"schedule": "local"}, profile=synthetic_table(env_step_s=3e-3))
    assert (r.plan.actors, r.plan.envs_per_actor) == (1, 1)
    assert r.prediction.env_steps_per_s > 0


def test_more_envs_only_on_request_and_then_said():
    cfg = make_config("dqn", "CartPole-v1", {"num_envs": 1})
    table = synthetic_table(env_step_s=3e-3, learn_s={"cpu": 1e-3})
    kept = plan(cfg, profile=table)
    assert kept.apply(cfg).num_envs == 1
    free = plan(cfg, profile=table, allow_more_envs=True)
    assert free.apply(cfg).num_envs > 1
    assert free.learning_changes == {"num_envs": [1, free.plan.num_envs]}
    assert any("changed num_envs from the preset's 1" in n and "learning dynamics change" in n for n in free.notes)
    assert free.to_json()["learning_changes"] == {"num_envs": [1, free.plan.num_envs]}


def test_a_pin_that_cannot_split_the_preset_envs_is_named():
    from hetrl.errors import UsageError

    cfg = make_config("dqn", "CartPole-v1", {"num_envs": 2})
    with pytest.raises(UsageError, match="num_envs=2"):
        plan(cfg, pins={"actors": 3, "schedule": "local"}, profile=synthetic_table())
    split = plan(cfg, pins={"schedule": "local"}, profile=synthetic_table(env_step_s=3e-3)).plan
    assert split.actors * split.envs_per_actor == 2


# --- auto_plan (what `hetrl train` and hetrl.train(plan="auto") use) on a cached synthetic profile ---
@pytest.fixture
def cached(tmp_path, monkeypatch):
    """Put a synthetic profile where load_or_profile finds it (this machine, this run's grid)."""
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path))

    def put(cfg, prefetch=None, **kw):
        machine = machine_info()
        t = synthetic_table(algo=cfg.algo, env=cfg.env, **kw)
        if prefetch is not None:   # {"prioritized:1": chosen, ...}: the prefetch thread's measured verdicts
            t.data["prefetch"] = {k: {"group": int(k.split(":")[1]), "serial_s": 5e-4, "prefetch_s": 4e-4 if on else 6e-4,
                                      "chosen": on} for k, on in prefetch.items()}
        t.data.update(machine=machine, machine_id=machine_id(machine), grid=grid_for(cfg, False, machine["cores"]))
        t.data["key"]["network"] = network_key(cfg)
        t.save(cache_path(cfg, machine))
    return put


def test_auto_plan_lists_what_it_chose_and_what_the_preset_owns(cached):
    from hetrl.api import auto_plan

    cfg = make_config("dqn", "CartPole-v1")
    cached(cfg, env_step_s=3e-3, learn_s={"cpu": 1e-3})
    new, info = auto_plan(cfg, {}, quiet=True)
    doc = json.loads(json.dumps(info))["plan"]
    assert doc["owned_by_preset"]["num_envs"] == 1 and doc["owned_by_preset"]["batch_size"] == 64
    assert set(doc["owned_by_preset"]) == owned(cfg) - {"algo", "env", "seed"}
    assert set(doc["chosen"]) <= set(SYSTEM_KEYS) and "schedule" in doc["chosen"]
    assert doc["changed_learning_settings"] == {} and not doc["allow_more_envs"]
    assert doc["objective_meaning"].startswith("env steps/s at the preset's settings")
    assert all(new.get(k) == cfg.get(k) for k in owned(cfg))
    # a setting given by hand is the user's, not the planner's choice
    _, info = auto_plan(make_config("dqn", "CartPole-v1", {"schedule": "local"}), {"schedule": "local"}, quiet=True)
    assert "schedule" not in info["plan"]["chosen"]


def test_auto_plan_turns_the_prefetch_thread_off_where_the_profile_measured_it_slower(cached):
    from hetrl.api import auto_plan

    cfg = make_config("dqn", "CartPole-v1", {"prioritized": True, "schedule": "local"})
    cached(cfg, env_step_s=3e-3, learn_s={"cpu": 1e-3}, prefetch={"prioritized:1": False, "uniform:32": True})
    new, info = auto_plan(cfg, {"schedule": "local"}, quiet=True)
    assert new.system.prefetch is False and info["plan"]["chosen"]["prefetch"] is False
    assert info["plan"]["profile"]["prefetch"]["chosen"] is False
    pinned, info = auto_plan(cfg, {"schedule": "local", "prefetch": True}, quiet=True)   # the user's: kept
    assert pinned.system.prefetch is True and "prefetch" not in info["plan"]["chosen"]
    uniform = make_config("dqn", "CartPole-v1", {"schedule": "local"})   # the other loop's figure decides ...
    got, info = auto_plan(uniform, {"schedule": "local"}, quiet=True)
    measured = info["plan"]["profile"]["prefetch"]
    assert measured["chosen"] is True
    assert got.system.prefetch is not measured["no_core"]    # ... and the thread runs where the plan leaves it a core


def test_auto_plan_reports_opting_in(cached, capsys):
    from hetrl.api import auto_plan

    cfg = make_config("dqn", "CartPole-v1")
    cached(cfg, env_step_s=3e-3, learn_s={"cpu": 1e-3})
    new, info = auto_plan(cfg, {}, allow_more_envs=True)
    plan_ = info["plan"]
    assert new.num_envs > 1 and plan_["allow_more_envs"]
    assert plan_["changed_learning_settings"] == {"num_envs": [1, new.num_envs]}
    assert plan_["chosen"]["num_envs"] == new.num_envs
    assert "learning dynamics change" in capsys.readouterr().err
    from hetrl.cli import _plan_line

    line = _plan_line(plan_)
    assert line.startswith("the learning dynamics changed") and "\n" not in line
    # a num_envs set by hand is kept even with the opt-in
    new, info = auto_plan(make_config("dqn", "CartPole-v1", {"num_envs": 2}), {"num_envs": 2}, allow_more_envs=True)
    assert new.num_envs == 2 and info["plan"]["changed_learning_settings"] == {}
    assert "the planner set" in _plan_line(info["plan"]) and "num_envs 2" in _plan_line(info["plan"])


def test_hetrl_plan_says_the_dynamics_change_only_when_opted_in(cached, capsys):
    import argparse

    from hetrl.planner.cli import register

    cfg = make_config("dqn", "CartPole-v1")
    cached(cfg, env_step_s=3e-3, learn_s={"cpu": 1e-3})

    def run(*extra):
        parser = argparse.ArgumentParser(prog="hetrl")
        register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["plan", "dqn", "--env", "CartPole-v1", *extra])
        assert args.func(args) == 0
        return capsys.readouterr().out

    plain = run()
    assert "env steps/s at the preset's settings" in plain and "num_envs 1" in plain
    assert "learning dynamics" not in plain
    opted = run("--allow-more-envs")
    assert sum("learning dynamics change" in line for line in opted.splitlines()) == 1
    doc = json.loads(run("--allow-more-envs", "--json"))
    assert doc["learning_changes"]["num_envs"][0] == 1


def test_settings_shows_the_presets_num_envs():
    out = subprocess.run([sys.executable, "-m", "hetrl.cli", "settings", "dqn", "--env", "CartPole-v1"],
                         capture_output=True, text=True, check=True).stdout
    assert any(line.split() == ["num_envs", "1"] for line in out.splitlines())
    for algo, env in presets(("dqn", "ddpg")):
        assert make_config(algo, env).num_envs == 1, (algo, env)


@pytest.mark.parametrize("num_envs", [1, 2, 3, 6, 8, 16])
@pytest.mark.parametrize("cores", [2, 5, 16, 64])
def test_the_default_layout_never_adds_envs(num_envs, cores):
    """`--plan none --schedule local` on a big machine: the actors split the preset's envs, never add to them."""
    from hetrl.runtime.layout import default_actors, layout

    lay = layout(make_config("dqn", "CartPole-v1", {"num_envs": num_envs}), cores)
    assert lay.actors * lay.envs_per_actor == num_envs
    assert lay.actors <= default_actors(cores)


def test_a_runs_measured_learner_time_calibrates_the_next_prediction(cached, tmp_path):
    """A planned run writes its seconds per gradient step back into the cached profile; the next
    plan predicts with it, and result.json says which figure the prediction used."""
    import hetrl
    from hetrl.api import auto_plan
    from hetrl.planner.profile import ProfileTable, calibrate

    settings = dict(steps=1200, learning_starts=200, train_freq=4, gradient_steps=4, batch_size=32, net_arch=[32],
                    eval_episodes=0, threads=1)
    cfg = make_config("dqn", "CartPole-v1", settings)
    cached(cfg, env_step_s=3e-3, learn_s={"cpu": 1e-6})      # a profile far faster than this machine
    _, before = auto_plan(cfg, {}, quiet=True)
    assert before["plan"]["profile"]["learner_calibration"] is None
    run = hetrl.train("dqn", "CartPole-v1", plan="none", out=tmp_path / "r", progress=False, **settings)
    assert "calibration" not in run.result          # 1e-6 s: a factor beyond any drift is not kept
    path = cache_path(cfg, machine_info())
    cached(cfg, env_step_s=20e-6, learn_s={"cpu": 2e-3})     # a learner-bound profile
    _, before = auto_plan(cfg, {}, quiet=True)
    raw = ProfileTable.load(path).learn_step("cpu", 32, 1, 4)
    entry = calibrate(path, "cpu", 32, 1, 4, learner_s=3 * raw * 1_000_000, gradient_steps=1_000_000, run="synthetic")
    assert entry["factor"] == pytest.approx(3.0)
    t = ProfileTable.load(path)
    assert t.learn_step("cpu", 32, 1, 4) == pytest.approx(3 * t.learn_step("cpu", 32, 1, 4, calibrated=False))
    _, after = auto_plan(cfg, {}, quiet=True)
    assert after["plan"]["profile"]["learner_calibration"]["factor"] == pytest.approx(3.0)
    assert after["predicted_env_steps_per_s"] < 0.5 * before["predicted_env_steps_per_s"]
    assert calibrate(path, "cpu", 32, 1, 4, learner_s=0.1, gradient_steps=50) is None   # too short to say
