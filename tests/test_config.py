import pytest

from hetrl.config import make_config, parse_sets, preset_for
from hetrl.errors import UsageError


def test_presets_are_rl_zoo_equivalents():
    c = make_config("dqn", "CartPole-v1")
    assert (c.net_arch, c.lr, c.batch_size, c.buffer_size, c.learning_starts) == ([256, 256], 2.3e-3, 64, 100_000, 1000)
    assert (c.gamma, c.target_update_interval, c.train_freq, c.gradient_steps) == (0.99, 10, 256, 128)
    assert (c.exploration_fraction, c.exploration_final_eps, c.steps) == (0.16, 0.04, 50_000)
    d = make_config("ddpg", "Pendulum-v1")
    assert (d.net_arch, d.batch_size, d.lr, d.buffer_size, d.gamma) == ([400, 300], 256, 1e-3, 200_000, 0.98)
    assert (d.learning_starts, d.noise_type, d.noise_std, d.gradient_steps, d.train_freq) == (10_000, "normal", 0.1, 1, 1)
    assert d.tau == 0.005 and c.tau == 1.0


def test_module_prefixed_id_uses_the_env_preset():
    assert preset_for("dqn", "gymnasium.envs.classic_control:CartPole-v1")["train_freq"] == 256


def test_set_values_are_typed():
    c = make_config("dqn", "CartPole-v1", parse_sets(["lr=0.01", "net_arch=[64,64]", "double=true", "steps=1e3"]))
    assert c.lr == 0.01 and c.net_arch == [64, 64] and c.double is True and c.steps == 1000
    for text in ("64,64", "64, 64", "[64, 64]"):   # SB3 users write net_arch without brackets too
        assert make_config("dqn", "CartPole-v1", parse_sets([f"net_arch={text}"])).net_arch == [64, 64]
    assert make_config("dqn", "CartPole-v1", parse_sets(["net_arch=128"])).net_arch == [128]


@pytest.mark.parametrize("over,words", [
    ({"lr": "fast"}, "lr"), ({"lrr": 1}, "did you mean 'lr'"), ({"double": "maybe"}, "double"),
    ({"batch_size": 10**6}, "larger than buffer_size"), ({"buffer_size": 0}, "positive"),
    ({"num_envs": -1}, "positive"), ({"gamma": 1.5}, "gamma"), ({"net_arch": "[0]"}, "net_arch"),
    ({"net_arch": "64,x"}, "net_arch"),
    ({"device": "tpu"}, "device"), ({"steps": "1.5"}, "steps"),
])
def test_bad_settings_name_the_problem(over, words):
    with pytest.raises(UsageError, match=words):
        make_config("dqn", "CartPole-v1", over)


def test_unknown_algo_suggests():
    with pytest.raises(UsageError, match="did you mean 'dqn'"):
        make_config("dqnn", "CartPole-v1")


def test_set_needs_key_value():
    with pytest.raises(UsageError, match="key=value"):
        parse_sets(["lr"])


def test_settings_are_three_groups_read_by_their_place_and_set_by_flat_keys(capsys):
    import dataclasses

    from hetrl.actors.atari import AtariOptions
    from hetrl.config import SYSTEM_KEYS, Config, SystemSettings, build, keys, migrate

    assert len(dataclasses.fields(Config)) <= 40   # the learning settings; the groups are two of them
    assert set(SYSTEM_KEYS) == {f.name for f in dataclasses.fields(SystemSettings)}
    c = make_config("dqn", "ALE/Pong-v5", {"threads": 2, "atari_noop_max": 0, "lr": 1e-3})
    assert (c.system.threads, c.atari.noop_max, c.lr) == (2, 0, 1e-3)
    assert isinstance(c.system, SystemSettings) and isinstance(c.atari, AtariOptions)
    with pytest.raises(AttributeError, match=r"cfg\.system\.threads"):   # the old place names the new one
        c.threads  # noqa: B018
    with pytest.raises(AttributeError, match=r"cfg\.atari\.noop_max"):
        c.atari_noop_max  # noqa: B018
    flat = c.to_dict()   # what result.json and checkpoints hold: one flat mapping, as --set takes keys
    assert flat["threads"] == 2 and flat["atari_noop_max"] == 0 and "system" not in flat and set(flat) == set(keys(type(c)))
    assert build(type(c), flat) == c and c.get("threads") == 2 and c.get("atari_screen_size") == 84
    d = c.replace(threads=1, atari_frame_skip=2, lr=0.5)
    assert (d.system.threads, d.atari.frame_skip, d.lr, c.system.threads, c.atari.frame_skip) == (1, 2, 0.5, 2, 4)
    # a config file may write a group as a mapping, --set a dotted key; both give the flat keys
    assert migrate({"system": {"threads": 3}, "atari.frame_skip": 2, "lr": 1}) == \
        {"threads": 3, "atari_frame_skip": 2, "lr": 1}
    e = make_config("dqn", "CartPole-v1", parse_sets(["system.actors=2", "atari.noop_max=1"]))
    assert (e.system.actors, e.atari.noop_max) == (2, 1)
    # checkpoints of an earlier hetrl: old keys migrated, with one line that says so
    capsys.readouterr()
    f = make_config("dqn", "CartPole-v1", {"compiled": True, "fastpath": True})
    err = capsys.readouterr().err.strip().splitlines()
    assert f.system.learner_kernel == "compiled" and len(err) == 1 and "compiled=True is now learner_kernel=compiled" in err[0]
    assert make_config("dqn", "CartPole-v1", parse_sets(["cuda_graph=false"])).system.learner_kernel == "auto"
    # the flat keys' checks name the key as the user writes it
    with pytest.raises(UsageError, match="atari_frame_skip must be positive"):
        make_config("dqn", "ALE/Pong-v5", {"atari_frame_skip": 0})
    with pytest.raises(UsageError, match="unknown setting 'thread'.*'threads'"):
        make_config("dqn", "CartPole-v1", {"thread": 1})
    with pytest.raises(UsageError, match="threads=.*not an integer"):
        make_config("dqn", "CartPole-v1", {"threads": "two"})
    import pickle   # a Config pickles with its groups: local actors and Ray workers get it

    assert pickle.loads(pickle.dumps(c)) == c


def test_hetrl_config_imports_no_torch():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, hetrl.config; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
