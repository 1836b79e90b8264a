"""Tests of hetrl.replay.buffer.ReplayBuffer: uniform and prioritized sampling, IS weights, checkpoints."""

import io

import numpy as np
import pytest
import torch

from hetrl.replay import ReplayBuffer

SPEC = {"obs": ((2,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}


def batch(start: int, n: int) -> dict[str, np.ndarray]:
    k = np.arange(start, start + n)
    return {"obs": np.stack([k, -k], 1).astype(np.float32), "action": k, "reward": k.astype(np.float32)}


def test_uniform_sample_rows_and_weights():
    rb = ReplayBuffer(100, SPEC, seed=0)
    rb.insert(batch(0, 40))
    data, keys, w = rb.sample(32)
    assert keys.dtype == np.int64 and keys.shape == (32,) and keys.max() < 40
    assert data["action"].tolist() == keys.tolist()  # row content matches the key (slot i holds item i)
    assert data["obs"].dtype == torch.float32 and data["obs"].shape == (32, 2)
    assert w.dtype == torch.float32 and torch.equal(w, torch.ones(32))
    rb.update_priorities(keys, np.ones(32))  # no-op when uniform
    assert rb.tree is None


def test_sample_empty_and_bad_args():
    rb = ReplayBuffer(10, SPEC, seed=0)
    with pytest.raises(ValueError, match="learning_starts"):
        rb.sample(4)
    rb.insert(batch(0, 3))
    _, keys, _ = rb.sample(8)  # with replacement: more than stored is fine
    assert len(keys) == 8 and keys.max() < 3
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0, SPEC)
    prb = ReplayBuffer(10, SPEC, prioritized=True, seed=0)
    prb.insert(batch(0, 5))
    _, keys, _ = prb.sample(4)
    with pytest.raises(ValueError, match="one TD error per"):
        prb.update_priorities(keys, np.array([0.5]))  # PEARL's scalar loss as every priority
    with pytest.raises(ValueError, match="NaN"):
        prb.update_priorities(keys, np.array([0.5, np.nan, 1.0, 1.0]))


def test_new_items_get_max_priority():
    rb = ReplayBuffer(16, SPEC, prioritized=True, alpha=0.5, eps=0.0 + 1e-6, seed=0)
    rb.insert(batch(0, 4))
    np.testing.assert_allclose(rb.tree.get(np.arange(4)), 1.0)  # 1.0 ** alpha
    rb.update_priorities(np.array([0, 1]), np.array([3.0, -8.0]))  # |td| -> 8 is the new max
    rb.insert(batch(4, 2))
    np.testing.assert_allclose(rb.tree.get(np.array([4, 5])), (8.0 + 1e-6) ** 0.5)
    np.testing.assert_allclose(rb.tree.get(np.array([0, 1])), [(3.0 + 1e-6) ** 0.5, (8.0 + 1e-6) ** 0.5])


def test_importance_weights_by_hand():
    alpha, beta, eps = 0.6, 0.4, 1e-6
    rb = ReplayBuffer(8, SPEC, prioritized=True, alpha=alpha, beta=beta, eps=eps, seed=1)
    rb.insert(batch(0, 5))
    td = np.array([0.1, 2.0, 0.5, 1.0, 3.0])
    rb.update_priorities(np.arange(5), torch.tensor(td))  # torch input accepted
    data, keys, w = rb.sample(5)
    p = (np.abs(td) + eps) ** alpha
    probs = p / p.sum()
    raw = (5 * probs[keys]) ** -beta
    np.testing.assert_allclose(w.numpy(), raw / raw.max(), rtol=1e-6)
    assert data["action"].tolist() == keys.tolist()
    # beta override and annealing hook
    _, keys, w = rb.sample(5, beta=1.0)
    raw = (5 * probs[keys]) ** -1.0
    np.testing.assert_allclose(w.numpy(), raw / raw.max(), rtol=1e-6)
    rb.set_beta(0.0)
    assert torch.allclose(rb.sample(5)[2], torch.ones(5))


def test_update_priorities_changes_next_sample():
    """The PEARL bug: priorities written to a copy of the tree never reached the sampler."""
    rb = ReplayBuffer(256, SPEC, prioritized=True, alpha=1.0, seed=2)
    rb.insert(batch(0, 256))
    _, keys, _ = rb.sample(64)
    td = np.full(64, 1e-3)
    td[keys == keys[0]] = 1e4  # one sampled item gets a huge TD error
    rb.update_priorities(keys, td)
    _, nxt, _ = rb.sample(64)
    assert (nxt == keys[0]).mean() > 0.9
    rb.update_priorities(np.array([keys[0]]), np.array([0.0]))
    _, nxt, _ = rb.sample(64)
    assert (nxt == keys[0]).mean() < 0.2


@pytest.mark.parametrize("prioritized", [False, True])
def test_determinism_and_checkpoint(prioritized):
    def run(rb, steps):
        out = []
        for i in range(steps):
            rb.insert(batch(10 * i, 10))
            data, keys, w = rb.sample(8)
            rb.update_priorities(keys, np.sin(keys + i))
            out.append((keys.copy(), w.clone(), data["obs"].clone()))
        return out

    a = ReplayBuffer(32, SPEC, prioritized=prioritized, seed=42)
    b = ReplayBuffer(32, SPEC, prioritized=prioritized, seed=42)
    ra, rb_ = run(a, 6), run(b, 6)
    for (ka, wa, oa), (kb, wb, ob) in zip(ra, rb_):
        assert np.array_equal(ka, kb) and torch.equal(wa, wb) and torch.equal(oa, ob)

    # checkpoint mid-run: the restored buffer continues bit for bit
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    c = ReplayBuffer(32, SPEC, prioritized=prioritized, seed=0)
    c.load_state_dict(torch.load(buf, weights_only=True))
    for (ka, wa, oa), (kc, wc, oc) in zip(run(a, 3), run(c, 3)):
        assert np.array_equal(ka, kc) and torch.equal(wa, wc) and torch.equal(oa, oc)
    with pytest.raises(ValueError, match="prioritized"):
        ReplayBuffer(32, SPEC, prioritized=not prioritized).load_state_dict(a.state_dict())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("prioritized", [False, True])
def test_cuda_buffer(prioritized):
    rb = ReplayBuffer(64, SPEC, device="cuda", prioritized=prioritized, seed=0)
    rb.insert(batch(0, 50))
    data, keys, w = rb.sample(16)
    assert data["obs"].device.type == "cuda" and w.device.type == "cuda"
    assert data["action"].cpu().tolist() == keys.tolist()
    rb.update_priorities(keys, torch.rand(16, device="cuda"))  # TD errors straight from the learner
    rb.sample(16)
