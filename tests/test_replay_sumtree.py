"""Tests of hetrl.replay.sumtree.SumTree (both backends) against NumPy references."""

import io

import numpy as np
import pytest
import torch

from hetrl.replay import SumTree
from hetrl.replay.sumtree import BACKENDS, DEFAULT_FANOUT

# capacities that are not powers of the fanout (and a few edge sizes)
CASES = [(2, 1), (2, 5), (2, 1000), (4, 7), (4, 1000), (16, 17), (16, 1000), (64, 65), (64, 1000), (3, 100)]


def random_tree(backend, fanout, capacity, rng):
    tree = SumTree(capacity, fanout, backend=backend)
    ref = np.zeros(capacity)
    for _ in range(4):
        idx = rng.integers(0, capacity, max(1, capacity // 3))
        val = rng.random(idx.shape[0]) * 10
        val[rng.random(idx.shape[0]) < 0.25] = 0.0  # some zero priorities
        tree.update(idx, val)
        for i, v in zip(idx, val):  # last write wins
            ref[i] = v
    return tree, ref


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fanout,capacity", CASES)
def test_sums_and_find_match_numpy(backend, fanout, capacity):
    rng = np.random.default_rng(fanout * 1000 + capacity)
    tree, ref = random_tree(backend, fanout, capacity, rng)
    np.testing.assert_allclose(tree.total, ref.sum(), rtol=1e-12)
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), ref)
    # every internal node equals the sum of its children (checked through the levels)
    for level in range(tree.depth):
        lo, hi = tree._offsets[level], tree._offsets[level + 1]
        parents = tree._tree[lo:hi]
        end = tree._offsets[level + 2] if level + 2 < len(tree._offsets) else len(tree._tree)
        children = tree._tree[hi:end].reshape(-1, fanout).sum(axis=1)
        np.testing.assert_allclose(parents[: len(children)], children, rtol=1e-12)
    if ref.sum() == 0:
        return
    values = rng.random(2000) * ref.sum()
    expected = np.searchsorted(np.cumsum(ref), values, side="right")
    got = tree.find(values)
    # float round-off can only matter for a value within ~1e-12 of a boundary
    assert (got == expected).mean() > 0.999
    assert np.all(ref[got] > 0) and np.all(got < capacity)


@pytest.mark.parametrize("backend", BACKENDS)
def test_end_of_range_and_zero_leaves_never_returned(backend):
    tree = SumTree(10, 4, backend=backend)
    p = np.array([0, 1.0, 0, 0, 2.0, 0, 0.5, 0, 0, 0])
    tree.update(np.arange(10), p)
    total = tree.total
    got = tree.find(np.array([-1.0, 0.0, 1.0, 3.0 - 1e-12, 3.0, total, np.nextafter(total, 0), total * 1.5]))
    assert list(got) == [1, 1, 4, 4, 6, 6, 6, 6]
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = tree.sample(32, rng)
        assert np.all(p[s] > 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicates_last_write_wins(backend):
    tree = SumTree(5, 2, backend=backend)
    tree.update(np.array([1, 3, 1, 1]), np.array([5.0, 2.0, 7.0, 3.0]))
    np.testing.assert_array_equal(tree.get(np.arange(5)), [0, 3.0, 0, 2.0, 0])
    assert tree.total == 5.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_distribution_chi_square(backend):
    rng = np.random.default_rng(123)
    k = 20
    p = rng.random(k) + 0.1
    p[[3, 11]] = 0.0  # never sampled
    tree = SumTree(k, 4, backend=backend)
    tree.update(np.arange(k), p)
    counts = np.zeros(k)
    for _ in range(200):
        np.add.at(counts, tree.sample(100, rng), 1)
    assert counts[3] == 0 and counts[11] == 0
    nz = p > 0
    expected = counts.sum() * p[nz] / p[nz].sum()
    chi2 = ((counts[nz] - expected) ** 2 / expected).sum()
    # 18 non-zero cells -> 17 degrees of freedom; chi2_{0.999}(17) = 40.79.
    # Stratified sampling gives less variance than multinomial, so this is conservative.
    assert chi2 < 40.79, chi2


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_visible_to_next_sample(backend):
    rng = np.random.default_rng(7)
    tree = SumTree(1000, DEFAULT_FANOUT, backend=backend)
    tree.update(np.arange(1000), np.ones(1000))
    tree.update(np.array([637]), np.array([1e9]))
    s = tree.sample(64, rng)
    assert (s == 637).mean() > 0.95
    tree.update(np.array([637]), np.array([0.0]))
    s = tree.sample(64, rng)
    assert not np.any(s == 637)


def test_backends_agree():
    if len(BACKENDS) < 2:
        pytest.skip("numba not available")
    rng = np.random.default_rng(3)
    a = SumTree(777, 8, backend="numba")
    b = SumTree(777, 8, backend="numpy")
    for _ in range(5):
        idx = rng.integers(0, 777, 100)
        val = rng.random(100)
        a.update(idx, val)
        b.update(idx, val)
    np.testing.assert_allclose(a._tree, b._tree, rtol=1e-12)
    v = rng.random(500) * a.total
    assert (a.find(v) == b.find(v)).mean() > 0.999


def test_state_dict_roundtrip():
    rng = np.random.default_rng(1)
    tree, ref = random_tree(BACKENDS[0], 4, 300, rng)
    buf = io.BytesIO()
    torch.save(tree.state_dict(), buf)
    buf.seek(0)
    other = SumTree(300, 16)  # another fanout is fine
    other.load_state_dict(torch.load(buf, weights_only=True))
    np.testing.assert_array_equal(other.get(np.arange(300)), ref)
    np.testing.assert_allclose(other.total, tree.total, rtol=1e-12)
    with pytest.raises(ValueError, match="capacity"):
        SumTree(301).load_state_dict(tree.state_dict())


def test_errors():
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)
    with pytest.raises(ValueError, match="fanout"):
        SumTree(10, 1)
    tree = SumTree(10)
    with pytest.raises(ValueError, match="empty"):
        tree.sample(4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="out of range"):
        tree.update(np.array([10]), np.array([1.0]))
    with pytest.raises(ValueError, match=">= 0"):
        tree.update(np.array([1]), np.array([-1.0]))
    with pytest.raises(ValueError, match="NaN"):
        tree.update(np.array([1]), np.array([np.nan]))
    with pytest.raises(ValueError, match="2 indices but 3"):
        tree.update(np.array([1, 2]), np.array([1.0, 2.0, 3.0]))
