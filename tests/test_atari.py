"""Atari: the preprocessing (SB3's AtariWrapper + frame stack), the missing-extra message.

The reference arrays (tests/data/atari_sb3_reference.npz) are what Stable-Baselines3's AtariWrapper
returned on fixed seeds and actions (tests/data/make_atari_reference.py writes them); the
comparisons are exact (pixels, clipped rewards, life-loss ends).
"""

from __future__ import annotations

import re

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetrl.actors.envs import make_env, prepare_env
from hetrl.config import make_config
from hetrl.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
needs_ale = pytest.mark.skipif(__import__("importlib").util.find_spec("ale_py") is None,
                               reason="ale-py is not installed (pip install -e '.[atari]')")


def atari_env(game: str, train: bool = True, **settings):
    cfg = make_config("dqn", game, {"frame_stack": 4, **settings})
    return make_env(prepare_env(game, cfg, train=train))


# ---- the preprocessing ------------------------------------------------------------------------------
@needs_ale
def test_preprocessed_observations_are_four_stacked_84x84_uint8_frames_zero_padded():
    env = atari_env("ALE/Pong-v5")
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert not obs[:3].any() and obs[3].any()          # an episode's first stack: zeros, then its frame
    nxt = env.step(0)[0]
    assert np.array_equal(nxt[:3], obs[1:]) and nxt[3].any()   # the stack rolls by one frame
    env.close()


@needs_ale
@pytest.mark.parametrize("game", ["Breakout", "Pong"])
def test_frames_rewards_and_ends_equal_stable_baselines3_atari_wrapper(game):
    """Noop reset (same RNG draw), skip 4 with a max over the last two frames, 84x84 grayscale, episodic
    life, FIRE on reset, clipped rewards: pixel for pixel what SB3's AtariWrapper gave."""
    ref = np.load(ROOT / "tests" / "data" / "atari_sb3_reference.npz")
    frames, rewards = ref[f"{game}-v5:frames"], ref[f"{game}-v5:rewards"]
    terms, truncs, actions = ref[f"{game}-v5:terminated"], ref[f"{game}-v5:truncated"], ref[f"{game}-v5:actions"]
    resets = iter(ref[f"{game}-v5:resets"])
    env = atari_env(f"ALE/{game}-v5", atari_sticky_actions="0")
    obs, _ = env.reset(seed=int(ref["seed"]))
    assert np.array_equal(obs[-1], frames[0])
    for t, a in enumerate(actions):
        obs, r, term, trunc, _ = env.step(int(a))
        assert np.array_equal(obs[-1], frames[t + 1]), f"frame of step {t}"
        assert (r, term, trunc) == (rewards[t], terms[t], truncs[t]), f"step {t}"
        if term or trunc:
            obs, _ = env.reset()
            assert np.array_equal(obs[-1], next(resets)) and not obs[:3].any()
    if game == "Breakout":
        assert terms.sum() >= 3   # the reference covers life losses (and the FIRE after each)
    env.close()


@needs_ale
def test_training_ends_episodes_at_a_lost_life_and_clips_rewards_evaluation_plays_whole_games_raw():
    """Same seed, same actions: the evaluation env plays the game the training env plays (its lost
    lives continue with the steps training's reset takes), with the raw rewards training clips."""
    game = "ALE/SpaceInvaders-v5"   # rewards 5..30 points, 3 lives, FIRE
    train, ev = atari_env(game, train=True), atari_env(game, train=False)
    o_train, _ = train.reset(seed=1)
    o_eval, _ = ev.reset(seed=1)
    assert np.array_equal(o_train, o_eval)
    rng = np.random.default_rng(0)
    raw, lives_lost, game_over = [], 0, False
    for _ in range(5000):
        a = int(rng.integers(0, train.action_space.n))
        o_train, r_train, term_t, trunc_t, _ = train.step(a)
        o_eval, r_eval, term_e, trunc_e, _ = ev.step(a)
        assert r_train == np.sign(r_eval) and r_train in (-1.0, 0.0, 1.0)
        raw.append(r_eval)
        if term_e or trunc_e:        # evaluation: only the whole game ends an episode
            assert term_t and ev.unwrapped.ale.lives() == 0
            game_over = True
            break
        if term_t:                   # training: a lost life ends the episode ...
            lives_lost += 1
            o_train, _ = train.reset()   # ... and the game goes on: the state evaluation continued in
        assert np.array_equal(o_train[-1], o_eval[-1])
    assert game_over and lives_lost == 2 and max(raw) > 1
    train.close()
    ev.close()


@needs_ale
def test_switches_turn_the_parts_off():
    env = atari_env("ALE/Breakout-v5", frame_stack=1, atari_screen_size=64, atari_episodic_life=False,
                    atari_fire_reset=False, atari_clip_reward=False, atari_noop_max=0, atari_sticky_actions="0.1")
    assert env.observation_space.shape == (64, 64)
    names = []
    e = env
    while hasattr(e, "env"):
        names.append(type(e).__name__)
        e = e.env
    assert "AtariLives" not in names and "TransformReward" not in names and "FrameStackObservation" not in names
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.1)
    assert atari_env("ALE/Breakout-v5").unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)  # v5's own
    env.close()


@needs_ale
def test_the_training_log_counts_whole_games_with_their_raw_score():
    """Training episodes end at every lost life with clipped rewards; what an actor logs is the game."""
    from hetrl.actors import Actor

    cfg = make_config("dqn", "ALE/Breakout-v5", {"atari_sticky_actions": "0"})
    env = prepare_env("ALE/Breakout-v5", cfg)
    actor = Actor(env, 2, seed=0, policy=_dqn(_pixels(), n_actions=4).make_policy(seed=0))
    lives_ended = 0
    while not actor.episodes:
        batch = actor.collect(50, lambda steps: None)   # uniform random actions
        lives_ended += int(batch["terminated"].sum())
    (score, length), *_ = actor.episodes
    assert lives_ended >= 5 and length > 50 and score == int(score) >= 0   # 5 lives, one game
    actor.close()


def test_frame_stack_applies_to_any_env_and_vector_stacks_keep_the_plain_storage(tiny):
    import hetrl
    from hetrl.replay import Storage

    env = make_env(prepare_env("CartPole-v1", make_config("dqn", "CartPole-v1", {"frame_stack": 3})))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 4) and not obs[:2].any() and obs[2].any()
    run = hetrl.train("dqn", "CartPole-v1", plan="none", frame_stack=3, progress=False, **tiny)
    assert isinstance(run.schedule.replay.storage, Storage) and run.schedule.core.spec["obs"] == ((3, 4), "float32")
    env.close()


def test_atari_settings_are_checked():
    with pytest.raises(UsageError, match="atari_sticky_actions"):
        make_config("dqn", "ALE/Pong-v5", {"atari_sticky_actions": "1.5"})
    with pytest.raises(UsageError, match="frame_stack must be positive"):
        make_config("dqn", "ALE/Pong-v5", {"frame_stack": 0})


# ---- a missing extra -----------------------------------------------------------------------------------
def test_missing_ale_py_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)   # `import ale_py` raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'hetrl\[atari\]'"):
        make_env("ALE/Pong-v5")


def test_missing_ale_py_in_the_cli_is_one_line_exit_2():
    code = ("import sys; sys.modules['ale_py'] = None\n"
            "from hetrl.cli import main; sys.exit(main(['train', 'dqn', '--env', 'ALE/Pong-v5', '--steps', '100']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "pip install -e '.[atari]'" in p.stderr, p.stderr


# ---- networks from the observation ---------------------------------------------------------------------
def _dqn(obs_space, n_actions=6, **settings):
    import gymnasium as gym

    from hetrl.algos import make_algorithm

    cfg = make_config("dqn", "ALE/Pong-v5", {"net_arch": [], **settings})
    return make_algorithm(cfg, obs_space, gym.spaces.Discrete(n_actions))


def _pixels(shape=(4, 84, 84)):
    import gymnasium as gym

    return gym.spaces.Box(0, 255, shape, np.uint8)


@pytest.mark.parametrize("dueling", [False, True])
def test_pixel_observations_get_the_nature_cnn_scaled_inside(dueling):
    import torch
    from torch import nn

    algo = _dqn(_pixels(), dueling=dueling)
    q = algo.q
    convs = [m for m in q.features.cnn if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == \
        [(4, 32, (8, 8), (4, 4)), (32, 64, (4, 4), (2, 2)), (64, 64, (3, 3), (1, 1))]
    assert q.features.linear[0].in_features == 3136 and q.features.linear[0].out_features == 512
    head = [q.value, q.advantage] if dueling else [q.q[-1]]
    assert [m.out_features for m in head] == ([1, 6] if dueling else [6]) and head[0].in_features == 512
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    out = q(x)
    assert out.shape == (3, 6) and out.dtype == torch.float32
    feats = q.features.linear(q.features.cnn(x.float() / 255.0))   # [0, 1] inputs inside the network
    assert torch.allclose(q.features(x), feats, rtol=1e-4, atol=1e-5)  # (NHWC on a CPU: rounding only)
    assert torch.allclose(q(x.float()), out)                       # float pixels in [0, 255]: the same
    assert q(x[None]).shape == (1, 3, 6)                           # any leading axes (K, B, ...)


@pytest.mark.parametrize("shape", [(4, 84, 84), (96, 96, 3)])
def test_the_cpu_channels_last_layout_computes_the_nchw_math(shape):
    """On a CPU the CNN runs on NHWC activations (faster there); outputs and gradients equal the
    NCHW computation of the same weights (stacked frames channels first, RGB channels last)."""
    import torch

    from hetrl.algos.nets import NatureCNN

    torch.manual_seed(0)
    cnn = NatureCNN(shape)
    x = torch.randint(0, 256, (2, 5, *shape), dtype=torch.uint8)   # leading axes (K, B)
    out, grads = {}, {}
    for name, fmt in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        cnn.cpu_layout = fmt
        cnn.zero_grad()
        y = cnn(x)
        (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
        out[name], grads[name] = y.detach(), [p.grad.clone() for p in cnn.parameters()]
    assert out["nhwc"].shape == (2, 5, 512)
    assert torch.allclose(out["nhwc"], out["nchw"], rtol=1e-4, atol=1e-5)
    for a, b in zip(grads["nhwc"], grads["nchw"]):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)
    assert all(p.is_contiguous() for p in cnn.parameters())   # the weights keep torch's layout


def test_pixel_replay_stays_uint8_and_vector_replay_float32():
    import gymnasium as gym

    from hetrl.algorithm import transition_fields

    assert transition_fields(_pixels(), gym.spaces.Discrete(4))["obs"] == ((4, 84, 84), "uint8")
    assert transition_fields(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))["next_obs"] == ((4,), "float32")
    vec_uint8 = gym.spaces.Box(0, 255, (128,), np.uint8)   # e.g. ALE RAM: an MLP, float32 replay
    assert transition_fields(vec_uint8, gym.spaces.Discrete(2))["obs"] == ((128,), "float32")


def test_cnn_learns_through_the_public_path_and_the_compiled_kernel_declines_it():
    import torch

    from hetrl.kernels import kernel_class

    algo = _dqn(_pixels())
    assert algo.pixels and "pixels" in kernel_class("compiled").check(algo)
    K, B = 2, 5
    batch = {"obs": torch.randint(0, 256, (K, B, 4, 84, 84), dtype=torch.uint8),
             "next_obs": torch.randint(0, 256, (K, B, 4, 84, 84), dtype=torch.uint8),
             "action": torch.randint(0, 6, (K, B)), "reward": torch.randn(K, B),
             "terminated": torch.zeros(K, B, dtype=torch.bool), "steps": torch.ones(K, B, dtype=torch.uint8)}
    before = [p.detach().clone() for p in algo.q.parameters()]
    td = algo.learn(batch, torch.ones(K, B))
    assert td.shape == (K, B) and bool(torch.isfinite(td).all())
    assert any(not torch.equal(a, b) for a, b in zip(before, algo.q.parameters()))
    policy = algo.make_policy(seed=0)
    a, _ = policy.act(np.zeros((3, 4, 84, 84), np.uint8), 0.0)
    assert a.shape == (3,) and policy.act_deterministic(np.zeros((1, 4, 84, 84), np.float32)).shape == (1,)


def test_channels_last_rgb_and_too_small_images():
    assert _dqn(_pixels((96, 96, 3)), n_actions=3).q(
        __import__("torch").zeros(2, 96, 96, 3, dtype=__import__("torch").uint8)).shape == (2, 3)
    with pytest.raises(UsageError, match="too small for the Nature CNN"):
        _dqn(_pixels((4, 32, 32)))


def test_continuous_algorithms_refuse_atari():
    import gymnasium as gym

    from hetrl import registry

    for algo in ("ddpg", "td3", "sac"):
        with pytest.raises(UsageError, match="discrete"):
            registry.get(algo).check_spaces(_pixels(), gym.spaces.Discrete(4))
        with pytest.raises(UsageError, match="images"):
            registry.get(algo).check_spaces(_pixels(), gym.spaces.Box(-1, 1, (2,)))


# ---- the preset ------------------------------------------------------------------------------------------
ZOO_ATARI = {"steps": 10_000_000, "net_arch": [], "lr": 1e-4, "batch_size": 32, "buffer_size": 100_000,
             "learning_starts": 100_000, "target_update_interval": 1000, "train_freq": 4, "gradient_steps": 1,
             "exploration_fraction": 0.1, "exploration_final_eps": 0.01, "frame_stack": 4, "gamma": 0.99}


@pytest.mark.parametrize("env", ["ALE/Breakout-v5", "ALE/Pong-v5", "SpaceInvadersNoFrameskip-v4",
                                 "ale_py:ALE/Qbert-v5"])
def test_every_atari_id_gets_the_zoo_atari_preset(env):
    cfg = make_config("dqn", env)
    assert {k: cfg.get(k) for k in ZOO_ATARI} == ZOO_ATARI
    assert cfg.exploration_initial_eps == 1.0 and cfg.tau == 1.0 and cfg.max_grad_norm == 10.0  # SB3's DQN
    assert make_config("dqn", env, {"lr": 3e-4}).lr == 3e-4                                   # overrides win
    assert make_config("dqn", "ALE/Breakout-ram-v5").frame_stack == 1        # RAM: a vector env, no preset
    assert make_config("dqn", "CartPole-v1").frame_stack == 1


def test_settings_shows_the_atari_preset(capsys):
    from hetrl.cli import main

    assert main(["settings", "dqn", "--env", "ALE/Breakout-v5"]) == 0
    rows = dict((line.split(None, 1) + [""])[:2] for line in capsys.readouterr().out.splitlines())
    assert rows["steps"] == "10000000" and rows["lr"] == "0.0001" and rows["buffer_size"] == "100000"
    assert rows["learning_starts"] == "100000" and rows["frame_stack"] == "4" and rows["net_arch"] == "[]"
    assert rows["exploration_final_eps"] == "0.01" and rows["target_update_interval"] == "1000"


@needs_ale
@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac"])
def test_continuous_algorithms_on_atari_get_the_discrete_action_error(algo, capsys):
    from hetrl.cli import main

    assert main(["train", algo, "--env", "ALE/Pong-v5", "--steps", "100", "--plan", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "continuous (Box) action space" in err and re.search(r"use (.*, )?dqn", err), err


# ---- short runs (not learning tests: Atari does not learn in minutes on a CPU) ---------------------------
TINY_ATARI = dict(steps=600, learning_starts=200, buffer_size=1000, train_freq=4, gradient_steps=1, threads=1,
                  progress=False)


@needs_ale
@pytest.mark.parametrize("schedule", ["inline", "local"])
def test_a_short_atari_run_completes_and_writes_result_json(schedule, tmp_path):
    import json

    import hetrl
    from hetrl.replay import FrameStorage
    from hetrl.replay.memory import arrays_bytes

    run = hetrl.train("dqn", "ALE/Pong-v5", plan="none", schedule=schedule, out=tmp_path, eval_episodes=0,
                      **TINY_ATARI)
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["env_steps"] == 600 and r["gradient_steps"] >= 95 and r["schedule"] == schedule
    storage = run.schedule.replay.storage
    assert isinstance(storage, FrameStorage) and len(storage) == 600 and storage.frames_used <= 601
    spec = run.schedule.core.spec
    assert spec["obs"] == ((4, 84, 84), "uint8")
    assert r["replay_bytes"] == arrays_bytes(FrameStorage.layout(1000, spec)) < 10_000_000   # vs 56.5 MB in full
    if schedule == "inline":   # one whole game of Pong, raw score (-21..21), of the trained policy
        ev = run.evaluate(1)
        assert ev["eval_return_mean"] == int(ev["eval_return_mean"]) and -21 <= ev["eval_return_mean"] <= 21
        assert ev["eval_length_mean"] > 200   # a whole game, not a point


@needs_ale
def test_an_atari_run_with_its_replay_resumes_under_another_schedule(tmp_path):
    import hetrl

    hetrl.train("dqn", "ALE/Pong-v5", plan="none", out=tmp_path, save_replay=True, eval_episodes=0, **{**TINY_ATARI, "steps": 400})
    state = torch_load(tmp_path / "replay.pt")
    # each frame once: 400 steps' frames and the first (EnvPool's actors, where installed, repeat the first frame
    # in a game's first stack and the content finds repeated frames: fewer)
    assert state["storage"]["kind"] == "frames" and len(state["storage"]["frames"]) <= 401
    run = hetrl.resume(tmp_path, steps=600, schedule="local", progress=False, evaluate_episodes=0)
    storage = run.schedule.replay.storage
    assert run.result["env_steps"] == 600 and len(storage) == 600
    saved = state["storage"]   # the saved rows came back into the shared ring, stack for stack
    frames = np.concatenate([np.zeros((1, 84, 84), np.uint8), saved["frames"].numpy()])
    got = storage.get(np.arange(400))
    assert np.array_equal(got["obs"].numpy(), frames[saved["refs"][:, :4].numpy()])
    assert np.array_equal(got["next_obs"].numpy(), frames[saved["refs"][:, 4:].numpy()])
    assert np.array_equal(got["next_obs"][:, :3].numpy(), got["obs"][:, 1:].numpy())   # one game, no reset


def torch_load(path):
    import torch

    return torch.load(path, weights_only=True)


@needs_ale
def test_eval_writes_a_video_of_a_whole_atari_game(tmp_path, capsys):
    """`hetrl eval DIR --render video`: an MP4 of the game's RGB screen per episode (whole games)."""
    pytest.importorskip("moviepy")
    import hetrl
    from hetrl.cli import main

    hetrl.train("dqn", "ALE/Breakout-v5", plan="none", out=tmp_path, eval_episodes=0, keep_best=False,
                **{**TINY_ATARI, "steps": 300})
    assert main(["eval", str(tmp_path), "--episodes", "1", "--render", "video"]) in (0, None)
    videos = list((tmp_path / "videos").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "videos" in out
