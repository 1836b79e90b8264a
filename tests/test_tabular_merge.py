"""Merge strategies and shard splitting."""

import numpy as np
import pytest

from hetrl.errors import UsageError
from hetrl.tabular import reference as ref
from hetrl.tabular.dataset import Dataset, shard_bounds, shard_counts
from hetrl.tabular.merge import merge


def tables(W, dtype, seed=0):
    rng = np.random.default_rng(seed)
    q0 = rng.integers(-1000, 1000, (5, 3))
    qs = q0 + rng.integers(-300, 300, (W, 5, 3))
    counts = rng.integers(0, 4, (W, 5, 3))
    counts[:, 0, 0] = 0  # nobody saw (0, 0)
    counts[1:, 1, 1] = 0  # only worker 0 saw (1, 1)
    qs[:, 0, 0] = q0[0, 0]  # a worker that never saw a pair leaves it at q0
    qs[1:, 1, 1] = q0[1, 1]
    return q0.astype(dtype), qs.astype(dtype), counts


@pytest.mark.parametrize("strategy", ["mean", "weighted", "sum"])
@pytest.mark.parametrize("W", [1, 2, 3, 8])
def test_int32_merge_matches_reference(strategy, W):
    q0, qs, counts = tables(W, np.int32, seed=W)
    got = merge(q0, qs, strategy, counts)
    assert got.dtype == np.int32
    exp = ref.merge_int(q0.tolist(), qs.tolist(), strategy, counts.tolist())
    assert got.tolist() == exp


def test_float_merge_values():
    q0, qs, counts = tables(3, np.float32)
    np.testing.assert_allclose(merge(q0, qs, "mean"), qs.mean(0), rtol=1e-6)
    w = merge(q0, qs, "weighted", counts)
    assert w[0, 0] == q0[0, 0]  # unseen: unchanged
    assert w[1, 1] == qs[0, 1, 1]  # seen by one worker: its value, not diluted by 1/W
    n = counts.sum(0)
    sel = n > 0
    np.testing.assert_allclose(w[sel], ((counts * qs).sum(0) / np.where(sel, n, 1))[sel], rtol=1e-6)
    np.testing.assert_allclose(merge(q0, qs, "sum"), q0 + (qs - q0).sum(0), rtol=1e-6)
    # mean dilutes the single-worker change by 1/W, weighted does not
    m = merge(q0, qs, "mean")
    assert abs(m[1, 1] - q0[1, 1]) == pytest.approx(abs(qs[0, 1, 1] - q0[1, 1]) / 3, rel=1e-5)


def test_merge_identical_tables_is_identity():
    q = np.arange(12, dtype=np.int32).reshape(4, 3) * 1000 - 5000
    qs = np.stack([q, q, q])
    counts = np.ones((3, 4, 3), np.int64)
    for strategy in ("mean", "weighted"):
        assert (merge(q, qs, strategy, counts) == q).all()


def test_sum_merge_saturates_int32():
    q0 = np.zeros((1, 1), np.int32)
    qs = np.full((4, 1, 1), 2**30, np.int32)
    assert merge(q0, qs, "sum")[0, 0] == 2**31 - 1


def test_merge_errors():
    q0, qs, _ = tables(2, np.float32)
    with pytest.raises(UsageError, match="unknown merge"):
        merge(q0, qs, "median")
    with pytest.raises(UsageError, match="counts"):
        merge(q0, qs, "weighted")


@pytest.mark.parametrize("n", [1, 2, 7, 10, 1000, 1001, 999_983])
@pytest.mark.parametrize("W", [1, 2, 3, 4, 7, 16])
def test_shards_cover_every_transition_once(n, W):
    if n < W:
        with pytest.raises(UsageError, match="fewer than workers"):
            shard_bounds(n, W)
        return
    b = shard_bounds(n, W)
    assert len(b) == W + 1 and b[0] == 0 and b[-1] == n
    sizes = np.diff(b)
    assert (sizes >= 1).all() and sizes.max() - sizes.min() <= 1
    owner = np.full(n, -1)
    for w in range(W):
        assert (owner[b[w]:b[w + 1]] == -1).all()  # no overlap
        owner[b[w]:b[w + 1]] = w
    assert (owner >= 0).all()  # nothing left out
    assert np.bincount(owner, minlength=W).sum() == n


def test_shard_bounds_rejects_bad_workers():
    with pytest.raises(UsageError, match="workers=0"):
        shard_bounds(10, 0)


def test_shard_counts_add_up():
    rng = np.random.default_rng(0)
    n = 1000
    cols = dict(s=rng.integers(0, 6, n).astype(np.int32), a=rng.integers(0, 2, n).astype(np.int32),
                r=np.zeros(n, np.float32), s2=np.zeros(n, np.int32), a2=np.zeros(n, np.int32),
                done=np.zeros(n, np.uint8))
    data = Dataset(**cols, n_states=6, n_actions=2)
    b = shard_bounds(n, 3)
    c = shard_counts(data, b)
    assert c.shape == (3, 6, 2) and c.sum() == n
    for w in range(3):
        assert c[w].sum() == b[w + 1] - b[w]
        assert c[w][cols["s"][b[w]], cols["a"][b[w]]] >= 1
