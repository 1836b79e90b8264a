"""The planner changes where and how fast, never what the agent learns (synthetic profiles, no timing)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from hetrl.config import SYSTEM_KEYS, load_presets, make_config
from hetrl.planner import plan
from hetrl.planner.profile import synthetic_table

TABLES = {"fast env": dict(env_step_s=20e-6, learn_s={"cpu": 1e-3}),
          "slow env": dict(env_step_s=3e-3, learn_s={"cpu": 1e-3}),     # a slow env would want many envs
          "slow learner": dict(env_step_s=20e-6, learn_s={"cpu": 20e-3})}
PINS = [{}, {"schedule": "local"}, {"schedule": "inline"}, {"threads": 1}]


def presets():
    for algo, table in load_presets().items():
        for env in table:
            if env != "default":
                yield algo, env


@pytest.mark.parametrize("algo,env", list(presets()))
def test_the_planner_never_changes_a_preset_owned_key(algo, env):
    cfg = make_config(algo, env, {"num_envs": 4} if algo == "dqn" and env == "CartPole-v1" else {})
    for (name, kw), pins in itertools.product(TABLES.items(), PINS):
        result = plan(cfg, pins=pins, profile=synthetic_table(algo=algo, **kw))
        new = result.apply(cfg)
        changed = {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(new, f.name)}
        assert changed <= set(SYSTEM_KEYS), (name, pins, changed - set(SYSTEM_KEYS))
        assert new.num_envs == cfg.num_envs
        assert not any("learning dynamics" in n for n in result.notes)


def test_more_envs_only_on_request_and_then_said():
    cfg = make_config("dqn", "CartPole-v1", {"num_envs": 1})
    table = synthetic_table(env_step_s=3e-3, learn_s={"cpu": 1e-3})
    kept = plan(cfg, profile=table)
    assert kept.apply(cfg).num_envs == 1
    free = plan(cfg, profile=table, allow_more_envs=True)
    assert free.apply(cfg).num_envs > 1
    assert any("changed num_envs from the preset's 1" in n and "learning dynamics change" in n for n in free.notes)


def test_a_pin_that_cannot_split_the_preset_envs_is_named():
    from hetrl.errors import UsageError

    cfg = make_config("dqn", "CartPole-v1", {"num_envs": 2})
    with pytest.raises(UsageError, match="num_envs=2"):
        plan(cfg, pins={"actors": 3, "schedule": "local"}, profile=synthetic_table())
    split = plan(cfg, pins={"schedule": "local"}, profile=synthetic_table(env_step_s=3e-3)).plan
    assert split.actors * split.envs_per_actor == 2
