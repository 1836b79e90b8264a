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
