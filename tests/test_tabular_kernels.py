"""Update kernels against the plain-Python reference (bit-exact in int32), RNG, fixed point."""

import numpy as np
import pytest

from hetrl.errors import UsageError
from hetrl.tabular import kernels as K
from hetrl.tabular import reference as ref
from hetrl.tabular.fixedpoint import (
    CONST_BITS,
    check_frac_bits,
    choose_frac_bits,
    const_to_fixed,
    from_fixed,
    quantized_gamma,
    to_fixed,
)

NS, NA = 7, 3


def random_data(n, seed, r_scale=1.0):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, NS, n).astype(np.int32)
    a = rng.integers(0, NA, n).astype(np.int32)
    r = (rng.integers(-10, 21, n) * r_scale).astype(np.float32)
    s2 = rng.integers(0, NS, n).astype(np.int32)
    a2 = rng.integers(0, NA, n).astype(np.int32)
    done = (rng.random(n) < 0.1).astype(np.uint8)
    return s, a, r, s2, a2, done


def rows(s, a, r, s2, a2, done):
    return list(zip(s.tolist(), a.tolist(), r.tolist(), s2.tolist(), a2.tolist(), done.tolist()))


def test_xorshift_matches_reference():
    st = K.rng_state(42)
    py = ref.XorShift64Star(int(st[0]))
    from numba import njit

    @njit
    def draw(state, n):
        out = np.empty(n, np.uint64)
        for i in range(n):
            out[i] = K.xorshift64s(state)
        return out

    got = draw(st, 1000)
    assert [int(x) for x in got] == [py.next() for _ in range(1000)]
    assert int(st[0]) == py.state


@pytest.mark.parametrize("algo", ["qlearning", "sarsa", "sarsa_pol"])
@pytest.mark.parametrize("alpha,gamma", [(0.5, 0.99), (0.1, 0.9), (1.0, 0.0), (0.013, 0.999)])
def test_int32_kernel_bit_exact(algo, alpha, gamma):
    s, a, r, s2, a2, done = random_data(3000, seed=hash((algo, alpha)) % 1000)
    bits = 16
    r_fp = to_fixed(r, bits)
    al, ga = const_to_fixed(alpha), const_to_fixed(gamma)
    rng0 = np.random.default_rng(5)
    q0 = rng0.integers(-(2**20), 2**20, (NS, NA)).astype(np.int32)  # non-trivial start, ties unlikely
    q = q0.copy()
    expect = [list(map(int, row)) for row in q0]
    if algo == "qlearning":
        K.qlearning_i32(q, s, a, r_fp, s2, done, np.int64(al), np.int64(ga))
        ref.update_int(expect, rows(s, a, r_fp, s2, a2, done), "qlearning", al, ga)
    elif algo == "sarsa":
        K.sarsa_i32(q, s, a, r_fp, s2, a2, done, np.int64(al), np.int64(ga))
        ref.update_int(expect, rows(s, a, r_fp, s2, a2, done), "sarsa", al, ga)
    else:
        st = K.rng_state(9)
        py = ref.XorShift64Star(int(st[0]))
        thr = K.eps_threshold(0.3)
        K.sarsa_pol_i32(q, s, a, r_fp, s2, done, np.int64(al), np.int64(ga), thr, st)
        ref.update_int(expect, rows(s, a, r_fp, s2, a2, done), "sarsa_pol", al, ga, int(thr), py)
        assert int(st[0]) == py.state  # same number of draws
    assert q.tolist() == expect


def test_int32_update_rounding_by_hand():
    # one update: q=0, r=1.0 (65536), done -> q += round(0.5 * 65536) = 32768
    q = np.zeros((1, 2), np.int32)
    one = np.array([0], np.int32)
    K.qlearning_i32(q, one, one, np.array([65536], np.int32), one, np.array([1], np.uint8),
                    np.int64(const_to_fixed(0.5)), np.int64(const_to_fixed(0.99)))
    assert q[0, 0] == 32768
    # negative values round half up too: (-3 * 32768 + 32768) >> 16 = -1 (floor of -1.0)
    exp = ref.update_int([[0, 0]], [(0, 0, -3, 0, 0, 1)], "qlearning", 1 << (CONST_BITS - 1), 0)
    q = np.zeros((1, 2), np.int32)
    K.qlearning_i32(q, one, one, np.array([-3], np.int32), one, np.array([1], np.uint8), np.int64(32768), np.int64(0))
    assert q[0, 0] == exp[0][0] == -1


@pytest.mark.parametrize("algo", ["qlearning", "sarsa", "sarsa_pol"])
def test_float32_kernel_matches_reference(algo):
    s, a, r, s2, a2, done = random_data(2000, seed=3)
    q = np.zeros((NS, NA), np.float32)
    expect = q.copy()
    al, ga = np.float32(0.3), np.float32(0.95)
    if algo == "qlearning":
        K.qlearning_f32(q, s, a, r, s2, done, al, ga)
        ref.update_float32(expect, rows(s, a, r, s2, a2, done), "qlearning", al, ga)
    elif algo == "sarsa":
        K.sarsa_f32(q, s, a, r, s2, a2, done, al, ga)
        ref.update_float32(expect, rows(s, a, r, s2, a2, done), "sarsa", al, ga)
    else:
        st = K.rng_state(4)
        py = ref.XorShift64Star(int(st[0]))
        K.sarsa_pol_f32(q, s, a, r, s2, done, al, ga, K.eps_threshold(0.2), st)
        ref.update_float32(expect, rows(s, a, r, s2, a2, done), "sarsa_pol", al, ga,
                           int(K.eps_threshold(0.2)), py)
    np.testing.assert_allclose(q, expect, rtol=1e-6, atol=1e-6)


def test_prange_kernel_equals_per_worker_kernels():
    s, a, r, s2, a2, done = random_data(4001, seed=8)
    bounds = np.array([0, 1000, 2500, 4001], np.int64)
    qs = np.zeros((3, NS, NA), np.float32)
    K.qlearning_f32_prange(qs, bounds, s, a, r, s2, done, np.float32(0.5), np.float32(0.9))
    for w in range(3):
        q = np.zeros((NS, NA), np.float32)
        lo, hi = bounds[w], bounds[w + 1]
        K.qlearning_f32(q, s[lo:hi], a[lo:hi], r[lo:hi], s2[lo:hi], done[lo:hi], np.float32(0.5), np.float32(0.9))
        np.testing.assert_array_equal(qs[w], q)


def test_fixed_point_scale_choice_and_overflow_guard():
    assert choose_frac_bits(1.0, 0.99) == 16  # FrozenLake
    assert choose_frac_bits(20.0, 0.99) == 16  # Taxi
    assert choose_frac_bits(100.0, 0.99) == 16  # CliffWalking: 2 * 10001 * 65536 < 2**31
    assert choose_frac_bits(100.0, 0.999) == 13  # fewer bits when |Q| can reach 1e5
    with pytest.raises(UsageError, match="overflow"):
        choose_frac_bits(1e6, 0.9999)
    with pytest.raises(UsageError, match="overflow"):
        check_frac_bits(20, 100.0, 0.99)
    check_frac_bits(16, 20.0, 0.99)
    x = np.array([0.5, -1.25, 20.0], np.float32)
    assert from_fixed(to_fixed(x, 16), 16).tolist() == x.tolist()


def test_parallel_reward_conversion_equals_to_fixed(monkeypatch):
    from hetrl.tabular import parallel as P
    from hetrl.tabular.dataset import shard_bounds

    monkeypatch.setattr(P, "REWARD_CHUNK", 1000)  # several chunks per shard, a partial last one
    rng = np.random.default_rng(3)
    n = 10_007
    # halves of the 2**-16 grid: the ties that round half to even must match to_fixed exactly
    r = ((rng.integers(-2**21, 2**21, n) + 0.5) / 2**16).astype(np.float32)
    want = to_fixed(r, 16)
    for W in (1, 2, 3, 7):
        got = P.prepare_rewards(r, "int32", 16, shard_bounds(n, W))
        assert got.dtype == np.int32 and np.array_equal(got, want)
    assert np.array_equal(P.prepare_rewards(r, "int32", 16), want)
    assert P.prepare_rewards(r, "float32", None) is r
    r[-1] = 1e6  # does not fit 2**31 / 2**16 in the last shard: the worker's error reaches the caller
    with pytest.raises(UsageError, match="int32 fixed-point"):
        P.prepare_rewards(r, "int32", 16, shard_bounds(n, 2))


def test_worker_memory_is_a_page_apart():
    from hetrl.tabular.parallel import PAGE, worker_rows, worker_tables

    for dtype in (np.float32, np.int32):
        qs = worker_tables(3, 16, 4, dtype)  # FrozenLake-sized: 256 B per table
        assert qs.shape == (3, 16, 4) and not qs.any() and all(qs[w].flags.c_contiguous for w in range(3))
        ends = [(qs[w].ctypes.data, qs[w].ctypes.data + qs[w].nbytes) for w in range(3)]
        assert all(ends[w + 1][0] - ends[w][1] >= PAGE for w in range(2))
    rngs = worker_rows([K.rng_state(w) for w in range(3)])
    assert [int(x[0]) for x in rngs] == [int(K.rng_state(w)[0]) for w in range(3)]
    assert all(x.shape == (1,) and x.dtype == np.uint64 for x in rngs)
    assert all(rngs[w + 1].ctypes.data - rngs[w].ctypes.data >= PAGE for w in range(2))


def test_int32_stays_within_bound_on_worst_case_rewards():
    # all rewards at -R, never done: Q -> -R/(1-gamma); the chosen scale must not wrap
    n, R, gamma = 200_000, 100.0, 0.99
    bits = choose_frac_bits(R, gamma)
    s = np.zeros(n, np.int32)
    r = to_fixed(np.full(n, -R, np.float32), bits)
    q = np.zeros((1, 1), np.int32)
    K.qlearning_i32(q, s, s, r, s, np.zeros(n, np.uint8), np.int64(const_to_fixed(1.0)), np.int64(const_to_fixed(gamma)))
    val = q[0, 0] / 2**bits
    g = quantized_gamma(gamma)  # 64881 / 65536
    assert -R / (1 - g) - 1 < val < -0.99 * R / (1 - g)
    assert 2 * abs(int(q[0, 0])) < 2**31  # the factor-2 headroom choose_frac_bits promises


def test_model_generator_follows_env_table():
    import warnings

    from hetrl.tabular.dataset import generate
    from hetrl.tabular.envs import env_info

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        info = env_info("FrozenLake-v1")
    data = generate(info, 20_000, seed=1)
    m = info.model
    # every transition is an outcome of P[s][a] with its reward and termination flag
    for i in range(0, len(data), 7):
        s, a, s2 = data.s[i], data.a[i], data.s2[i]
        k = [j for j in range(m.n_out[s, a]) if m.next_s[s, a, j] == s2]
        assert k, (s, a, s2)
        assert any(m.reward[s, a, j] == data.r[i] and m.term[s, a, j] == data.done[i] for j in k)
    # trajectory continuity: the next transition starts at s' with a' unless the episode ended
    cont = data.done[:-1] == 0
    same = (data.s[1:] == data.s2[:-1]) & (data.a[1:] == data.a2[:-1])
    assert same[cont].mean() > 0.97  # the rest are time-limit truncations (100 steps)
    # slippery: the intended direction happens about 1/3 of the time, like the env
    assert 0.2 < (data.a == 0).mean() < 0.3
