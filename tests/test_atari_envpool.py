"""EnvPool's C++ Atari under hetrl's preprocessing (hetrl/actors/envs.py `EnvPoolAtari`): the same
observations, episode ends, rewards and game log as the Gymnasium path, the backend switch (auto,
gymnasium, envpool) under every schedule, and the planner's measured choice."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetrl.actors.envs import EnvPoolAtari, make_vector_env, prepare_env
from hetrl.config import make_config
from hetrl.errors import UsageError

pytest.importorskip("ale_py")
envpool = pytest.importorskip("envpool")


def prepared(game="ALE/Breakout-v5", train=True, **settings):
    return prepare_env(game, make_config("dqn", game, settings), train=train)


def test_auto_takes_envpool_for_a_game_it_has_and_gymnasium_otherwise():
    # TicTacToe3D: the one ALE v5 game EnvPool 1.2 lacks
    assert isinstance(make_vector_env(prepared(), 2, 0, "auto"), EnvPoolAtari)
    assert not isinstance(make_vector_env(prepared(), 2, 0, "gymnasium"), EnvPoolAtari)
    assert not isinstance(make_vector_env(prepared("ALE/TicTacToe3D-v5"), 1, 0, "auto"), EnvPoolAtari)
    with pytest.raises(UsageError, match="does not know 'ALE/TicTacToe3D-v5'"):
        make_vector_env(prepared("ALE/TicTacToe3D-v5"), 1, 0, "envpool")
    with pytest.raises(UsageError, match="atari_noop_max >= 1"):   # EnvPool aborts the process on 0
        make_vector_env(prepared(atari_noop_max=0), 1, 0, "envpool")
    assert not isinstance(make_vector_env(prepared(atari_noop_max=0), 1, 0, "auto"), EnvPoolAtari)


@pytest.mark.parametrize("stack", [4, 1])
def test_spaces_and_pixels_are_the_gymnasium_paths(stack):
    """Same shapes and dtypes, and the same picture: EnvPool's 84x84 grayscale frames equal
    AtariPreprocessing's but for the moving objects (the ball and the paddle: ALE's RNG is seeded
    differently, so the games are not the same game), <= 2% of the pixels step after step."""
    env = prepared(atari_sticky_actions="0", atari_noop_max=1, frame_stack=stack)
    g, e = make_vector_env(env, 1, 0, "gymnasium"), make_vector_env(env, 1, 0, "envpool")
    assert e.single_observation_space == g.single_observation_space
    assert e.single_action_space == g.single_action_space
    og, _ = g.reset(seed=[0])
    oe, _ = e.reset()
    assert oe.shape == og.shape == (1, *g.single_observation_space.shape) and oe.dtype == np.uint8
    for t in range(40):
        og = g.step(np.array([t % 4]))[0]
        oe = e.step(np.array([t % 4]))[0]
        if stack > 1:   # the newest frame (a game's first stacks: zeros there, its first frame here)
            og, oe = og[:, -1], oe[:, -1]
        diff = np.abs(og.astype(int) - oe.astype(int))
        assert (diff > 0).mean() < 0.02, t
    g.close()
    e.close()


def test_lives_end_training_episodes_rewards_are_clipped_and_whole_games_are_logged_raw():
    """Each lost life ends a training episode (terminated, no reset: the game goes on), rewards are signs, and each game over reports the raw
    score and agent steps of the whole game, as RecordEpisodeStatistics under the Gymnasium path."""
    venv = make_vector_env(prepared(), 2, 0, "envpool")
    ev = make_vector_env(prepared(train=False), 2, 0, "envpool")   # the same seed: the same games
    venv.reset()
    ev.reset()
    rng = np.random.default_rng(0)
    ends, games, raw = np.zeros(2, int), [], np.zeros(2)
    for _ in range(3000):
        a = rng.integers(0, 4, 2)
        obs, r, term, trunc, info = venv.step(a)
        obs_e, r_e, term_e, trunc_e, info_e = ev.step(a)
        assert np.array_equal(obs, obs_e) and np.array_equal(r, np.sign(r_e))
        raw += r_e
        ends += term
        assert not (term_e & ~term).any()   # evaluation ends only at a game over, training there too
        if (term | trunc).any():
            assert np.array_equal(info["final_obs"][term | trunc], obs[term | trunc]) or (term_e | trunc_e).any()
        if "final_info" in info:
            over = info["final_info"]["_episode"]
            assert np.array_equal(over, term_e | trunc_e)
            for i in np.flatnonzero(over):
                games.append(info["final_info"]["episode"]["r"][i])
                assert games[-1] == raw[i] and info["final_info"]["episode"]["l"][i] > 50
                assert ends[i] == 5   # five lives, five training episodes, one game
                ends[i], raw[i] = 0, 0
        if len(games) >= 4:
            break
    assert len(games) >= 4 and max(games) > 0
    venv.close()
    ev.close()


TINY = dict(steps=600, learning_starts=200, buffer_size=1000, train_freq=4, gradient_steps=1, threads=1,
            progress=False, eval_episodes=0, keep_best=False)


@pytest.mark.parametrize("schedule", ["inline", "local"])
def test_a_run_with_envpool_actors_logs_games_and_stores_frames_once(schedule, tmp_path):
    import hetrl
    from hetrl.replay import FrameStorage

    run = hetrl.train("dqn", "ALE/Breakout-v5", plan="none", schedule=schedule, out=tmp_path, env_backend="envpool",
                      atari_episodic_life=False, **TINY)
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["env_steps"] == 600 and r["config"]["env_backend"] == "envpool"
    storage = run.schedule.replay.storage
    assert isinstance(storage, FrameStorage) and len(storage) == 600
    assert storage.frames_used <= 601   # one frame per env step (a game's first stack repeats its frame)
    log = (tmp_path / "progress.csv").read_text().splitlines()
    assert log[0].endswith("episode_return,episodes") and int(log[-1].split(",")[-1]) >= 1   # whole games


def test_the_planner_times_both_backends_and_the_run_takes_the_faster(tmp_path, monkeypatch):
    from hetrl.api import auto_plan
    from hetrl.planner import plan
    from hetrl.planner.profile import cache_path, grid_for, machine_id, machine_info, network_key, run_profile
    from synthetic_profiles import synthetic_table

    cfg = make_config("dqn", "CartPole-v1", {})   # a plain id EnvPool has: the cheapest profile
    table = run_profile(cfg, devices=["cpu"], quick=True, measure_power=False)
    b = table.data["env_backend"]
    assert b["gymnasium_s"] > 0 and b["envpool_s"] > 0
    assert b["chosen"] == min(("gymnasium", "envpool"), key=lambda n: b[f"{n}_s"])
    # both timed at every width; the actors of a width were measured with the faster one there, and a plan
    # with that many envs per actor runs it
    assert set(b["widths"]) == set(table.data["env"])
    for w in b["widths"].values():
        assert w["chosen"] == min(("gymnasium", "envpool"), key=lambda n: w[f"{n}_s"])
    p = plan(cfg, profile=table)
    assert p.env_backend == b["widths"][str(p.plan.envs_per_actor)]["chosen"]
    pinned = run_profile(make_config("dqn", "CartPole-v1", {"env_backend": "gymnasium"}), devices=["cpu"],
                         quick=True, measure_power=False)
    assert pinned.data["env_backend"] == {"chosen": "gymnasium"}   # a backend set by hand is the one timed
    # auto_plan applies the profile's choice (here a cached profile that measured EnvPool faster)
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path))
    machine = machine_info()
    t = synthetic_table(algo=cfg.algo, env=cfg.env, env_step_s=3e-3, learn_s={"cpu": 1e-3})
    t.data.update(machine=machine, machine_id=machine_id(machine), grid=grid_for(cfg, False, machine["cores"]),
                  env_backend={"chosen": "envpool", "gymnasium_s": 2e-5, "envpool_s": 1e-5})
    t.data["key"]["network"] = network_key(cfg)
    t.save(cache_path(cfg, machine))
    new, info = auto_plan(cfg, {}, quiet=True)
    assert new.system.env_backend == info["plan"]["chosen"]["env_backend"] == "envpool"
    mine = make_config("dqn", "CartPole-v1", {"env_backend": "gymnasium"})
    t.data["env_backend"] = {"chosen": "gymnasium"}
    t.save(cache_path(mine, machine))   # its own profile (the backend is in the cache key)
    new, info = auto_plan(mine, {"env_backend": "gymnasium"}, quiet=True)   # the user's: kept, not "chosen"
    assert new.system.env_backend == "gymnasium" and "env_backend" not in info["plan"]["chosen"]
