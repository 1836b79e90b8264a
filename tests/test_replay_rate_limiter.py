"""Tests of hetrl.replay.rate_limiter: Reverb's SampleToInsertRatio rule and blocking waits."""

import threading
import warnings

import pytest

from hetrl.replay import RateLimiter, RatioRule


def test_counting_rule_scalar_error_buffer():
    # SPI 2, min size 10, error buffer 4 -> offset 20, window [16, 24]
    rl = RateLimiter(2.0, 10, 4.0)
    assert (rl.rule.min_diff, rl.rule.max_diff) == (16.0, 24.0)
    assert not rl.can_sample()
    for _ in range(10):  # filling phase: inserts are free, samples blocked
        assert rl.can_insert() and not rl.can_sample()
        rl.insert()
    assert rl.can_sample()  # diff = 20 - 0 - 1 = 19 >= 16
    assert rl.can_sample(4) and not rl.can_sample(5)  # 20 - 4 = 16 ok, 20 - 5 = 15 < 16
    assert rl.can_insert(2) and not rl.can_insert(3)  # (12)*2 - 0 = 24 <= 24, 26 > 24
    rl.insert(2)  # diff 24
    assert not rl.can_insert()
    rl.sample(3)  # diff 21
    assert rl.can_insert() and not rl.can_insert(2)  # 23 ok, 25 > 24
    assert rl.can_sample(5) and not rl.can_sample(6)
    # insert(n) during filling: allowed while inserts + n <= min size
    r2 = RateLimiter(1.0, 5, 2.0)
    assert r2.can_insert(5)
    assert r2.can_insert(7)  # past min size: (7) * 1 - 0 = 7 <= 5 + 2
    assert not r2.can_insert(8)


def test_counting_rule_pair_and_plain_function():
    rule = RatioRule.from_error_buffer(0.5, 4, (-3.0, 3.0))
    assert (rule.min_diff, rule.max_diff) == (-3.0, 3.0)
    assert not rule.can_sample(inserts=3, samples=0)
    assert rule.can_sample(inserts=4, samples=0, n=5)  # 2 - 5 = -3 >= -3
    assert not rule.can_sample(inserts=4, samples=0, n=6)
    assert rule.can_insert(inserts=4, samples=0, n=2)  # 3 <= 3
    assert not rule.can_insert(inserts=4, samples=0, n=3)
    assert rule == RatioRule(0.5, 4, -3.0, 3.0)  # plain value object (picklable, no lock)


def test_validation():
    with pytest.raises(ValueError, match="samples_per_insert"):
        RateLimiter(0.0, 1, 5.0)
    with pytest.raises(ValueError, match="min_size_to_sample"):
        RateLimiter(1.0, 0, 5.0)
    with pytest.raises(ValueError, match="narrower"):
        RateLimiter(4.0, 10, 3.0)  # window 6 < 2 * 4
    with pytest.raises(ValueError, match="never be allowed"):
        RateLimiter(1.0, 10, (11.0, 20.0))
    with pytest.warns(UserWarning, match="deadlock"):
        RateLimiter(1.0, 10, (0.0, 5.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RateLimiter(1.0, 10, 5.0)


def test_timeout_and_close():
    rl = RateLimiter(1.0, 3, 2.0)
    assert rl.await_can_insert(timeout=0.0)
    assert not rl.await_can_sample(timeout=0.01)  # nothing inserted: times out
    result = []
    waiter = threading.Thread(target=lambda: result.append(rl.await_can_sample()))
    waiter.start()
    rl.close()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and result == [False]
    assert not rl.await_can_insert()  # closed: returns at once


def test_threads_keep_ratio_within_error_buffer():
    """A fast inserter and a slow sampler: the inserter is held back so the ratio holds."""
    spi, min_size, buffer = 2.0, 20, 8.0
    rl = RateLimiter(spi, min_size, buffer)
    lo, hi = rl.rule.min_diff, rl.rule.max_diff
    total_samples = 400
    violations = []
    lock = threading.Lock()

    def check():
        with lock:
            if rl.inserts > min_size:
                diff = rl.inserts * spi - rl.samples
                if not lo - 1e-9 <= diff <= hi + 1e-9:
                    violations.append((rl.inserts, rl.samples))

    def inserter():
        while True:
            if not rl.await_can_insert(1, timeout=10):
                return
            with lock:
                rl.insert(1)
            check()

    def sampler():
        x = 0
        for _ in range(total_samples):
            assert rl.await_can_sample(1, timeout=10)
            for i in range(2000):  # "slow" learner step: some work, no sleeping
                x += i
            with lock:
                rl.sample(1)
            check()

    t_ins = threading.Thread(target=inserter)
    t_smp = threading.Thread(target=sampler)
    t_ins.start()
    t_smp.start()
    t_smp.join(timeout=60)
    rl.close()
    t_ins.join(timeout=10)
    assert not t_smp.is_alive() and not t_ins.is_alive()
    assert rl.samples == total_samples
    assert violations == []
    # the inserter ran ahead only as far as the buffer lets it: inserts ~= samples / spi + min size
    assert abs(rl.inserts * spi - rl.samples - spi * min_size) <= buffer + spi
