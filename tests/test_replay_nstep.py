"""Tests of hetrl.replay.nstep.NStepAdder against hand-computed n-step transitions."""

import numpy as np
import pytest

from hetrl.replay import NStepAdder

# 2 envs, 6 steps. env 0 terminates at step 2, env 1 is truncated at step 3.
T = 6
REWARD = np.array([[1, 10], [2, 20], [3, 30], [4, 40], [5, 50], [6, 60]], dtype=np.float64)
TERM = np.zeros((T, 2), bool)
TRUNC = np.zeros((T, 2), bool)
TERM[2, 0] = True
TRUNC[3, 1] = True


def obs_at(t):  # obs of env e at step t: [100e + t, e]
    return np.array([[t, 0], [100 + t, 1]], dtype=np.float32)


def next_obs_at(t):  # true next obs (the final obs when the episode ends)
    return obs_at(t) + np.float32(0.5)


def action_at(t):
    return np.array([t, 10 + t], dtype=np.int64)


def run(adder, obs_dtype=np.float32):
    out = []
    for t in range(T):
        o = obs_at(t).astype(obs_dtype)
        res = adder.add(o, action_at(t), REWARD[t], next_obs_at(t).astype(obs_dtype), TERM[t], TRUNC[t])
        o[:] = 0  # the caller reusing its array must not corrupt pending steps
        out.append(res)
    return out


def rows(res):
    """(env, first step, reward, steps, next_obs[0], terminated, truncated) per emitted row."""
    return [
        (
            int(res["obs"][i, 1]),
            int(res["action"][i]) % 10,
            float(res["reward"][i]),
            int(res["steps"][i]),
            float(res["next_obs"][i, 0]),
            bool(res["terminated"][i]),
            bool(res["truncated"][i]),
        )
        for i in range(len(res["reward"]))
    ]


def test_three_step_by_hand():
    out = run(NStepAdder(3, 0.5, 2))
    assert out[0] is None and out[1] is None and out[4] is None
    # step 2: env 0 terminates -> flush its 3 pending steps; env 1 is full -> emits its oldest
    assert rows(out[2]) == [
        (0, 0, 1 + 0.5 * 2 + 0.25 * 3, 3, 2.5, True, False),
        (0, 1, 2 + 0.5 * 3, 2, 2.5, True, False),
        (0, 2, 3.0, 1, 2.5, True, False),
        (1, 0, 10 + 0.5 * 20 + 0.25 * 30, 3, 102.5, False, False),
    ]
    # step 3: env 1 truncated -> flush steps 1..3, terminated stays False so the learner bootstraps
    assert rows(out[3]) == [
        (1, 1, 20 + 0.5 * 30 + 0.25 * 40, 3, 103.5, False, True),
        (1, 2, 30 + 0.5 * 40, 2, 103.5, False, True),
        (1, 3, 40.0, 1, 103.5, False, True),
    ]
    # step 5: env 0's new episode (steps 3, 4, 5) is full
    assert rows(out[5]) == [(0, 3, 4 + 0.5 * 5 + 0.25 * 6, 3, 5.5, False, False)]
    # obs of the emitted rows are the stored obs of their first step
    np.testing.assert_array_equal(out[2]["obs"][:, 0], [0, 1, 2, 100])


def test_dtypes():
    out = run(NStepAdder(3, 0.9, 2), obs_dtype=np.uint8)
    res = out[2]
    assert res["obs"].dtype == np.uint8 and res["next_obs"].dtype == np.uint8
    assert res["action"].dtype == np.int64
    assert res["reward"].dtype == np.float32
    assert res["terminated"].dtype == bool and res["truncated"].dtype == bool
    assert res["steps"].dtype == np.uint8


def test_one_step_pass_through():
    out = run(NStepAdder(1, 0.5, 2))
    for t, res in enumerate(out):
        assert rows(res) == [
            (0, t, REWARD[t, 0], 1, t + 0.5, TERM[t, 0], TRUNC[t, 0]),
            (1, t % 10, REWARD[t, 1], 1, 100 + t + 0.5, TERM[t, 1], TRUNC[t, 1]),
        ]
        assert res["steps"].dtype == np.uint8 and res["reward"].dtype == np.float32


def reference_nstep(n, gamma, rew, nobs, term, trunc):
    """Plain per-env loop: sorted (emit step, env, first step, reward, steps, next_obs, term, trunc)."""
    T, E = rew.shape
    out = []
    for e in range(E):
        pending = []
        for t in range(T):
            pending.append(t)
            done = term[t, e] or trunc[t, e]
            emit = pending[:] if done else (pending[:1] if len(pending) == n else [])
            for s in emit:
                k = t - s + 1
                r = sum(gamma**i * rew[s + i, e] for i in range(k))
                out.append((t, e, s, r, k, float(nobs[t, e]), bool(term[t, e]), bool(trunc[t, e])))
            pending = [] if done else pending[len(emit):]
    return sorted(out)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_random_episodes_match_reference(n):
    rng = np.random.default_rng(n)
    T, E, gamma = 40, 4, 0.9
    obs = np.broadcast_to(np.arange(T)[:, None], (T, E)).astype(np.float32)
    rew = rng.normal(size=(T, E)).astype(np.float32)
    nobs = obs + 0.5
    term = rng.random((T, E)) < 0.1
    trunc = rng.random((T, E)) < 0.1
    adder = NStepAdder(n, gamma, E)
    got = []
    for t in range(T):
        res = adder.add(obs[t], np.arange(E), rew[t], nobs[t], term[t], trunc[t])
        if res is None:
            continue
        for i in range(len(res["reward"])):
            got.append(
                (
                    t,
                    int(res["action"][i]),
                    int(res["obs"][i]),
                    float(res["reward"][i]),
                    int(res["steps"][i]),
                    float(res["next_obs"][i]),
                    bool(res["terminated"][i]),
                    bool(res["truncated"][i]),
                )
            )
    ref = reference_nstep(n, gamma, rew.astype(np.float64), nobs, term, trunc)
    got = sorted(got)
    assert len(got) == len(ref) > 0
    # everything but the reward matches exactly; the reward up to float32 rounding
    assert [g[:3] + g[4:] for g in got] == [r[:3] + r[4:] for r in ref]
    np.testing.assert_allclose([g[3] for g in got], [r[3] for r in ref], rtol=1e-5, atol=1e-5)


def test_reset_and_errors():
    adder = NStepAdder(3, 0.5, 2)
    adder.add(obs_at(0), action_at(0), REWARD[0], next_obs_at(0), TERM[0], TRUNC[0])
    assert adder.pending.tolist() == [1, 1]
    adder.reset()
    assert adder.pending.tolist() == [0, 0]
    with pytest.raises(ValueError, match="num_envs=2"):
        adder.add(obs_at(0)[:1], action_at(0), REWARD[0], next_obs_at(0), TERM[0], TRUNC[0])
    with pytest.raises(ValueError, match="n must be"):
        NStepAdder(0, 0.5, 2)
    with pytest.raises(ValueError, match="gamma"):
        NStepAdder(3, 1.5, 2)
