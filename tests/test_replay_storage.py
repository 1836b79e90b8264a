"""Tests of hetrl.replay.storage.Storage: ring wrap-around, dtypes, get, checkpoints, errors."""

import io

import numpy as np
import pytest
import torch

from hetrl.replay import Storage

SPEC = {
    "obs": ((3,), "float32"),
    "action": ((), "int64"),
    "reward": ((), np.float32),
    "terminated": ((), "bool"),
    "steps": ((), "uint8"),
    "img": ((2, 2), "uint8"),
}


def make_batch(start: int, n: int) -> dict[str, np.ndarray]:
    """Rows whose content encodes their global insertion number start..start+n-1."""
    k = np.arange(start, start + n)
    return {
        "obs": np.stack([k, k + 0.5, -k], axis=1).astype(np.float64),  # cast to float32 on insert
        "action": k.astype(np.int64),
        "reward": (k * 0.25).astype(np.float32),
        "terminated": (k % 3 == 0),
        "steps": (k % 7).astype(np.uint8),
        "img": np.broadcast_to((k % 256).astype(np.uint8)[:, None, None], (n, 2, 2)).copy(),
    }


def expected_rows(numbers: np.ndarray) -> dict[str, np.ndarray]:
    b = make_batch(0, int(numbers.max()) + 1)
    return {k: v[numbers] for k, v in b.items()}


def check_rows(storage: Storage, slots: np.ndarray, numbers: np.ndarray) -> None:
    got = storage.get(slots)
    exp = expected_rows(numbers)
    for name, (shape, dtype) in storage.spec.items():
        assert got[name].dtype == torch.from_numpy(np.empty(0, dtype)).dtype, name
        assert tuple(got[name].shape) == (len(slots), *shape), name
        np.testing.assert_array_equal(got[name].numpy(), exp[name].astype(dtype), err_msg=name)


def test_wraparound_and_dtypes():
    s = Storage(10, SPEC)
    assert len(s) == 0 and s.pos == 0
    slots = s.insert(make_batch(0, 7))
    np.testing.assert_array_equal(slots, np.arange(7))
    assert slots.dtype == np.int64 and len(s) == 7 and s.pos == 7
    # straddles the end: 5 rows go to slots 7, 8, 9, 0, 1
    slots = s.insert(make_batch(7, 5))
    np.testing.assert_array_equal(slots, [7, 8, 9, 0, 1])
    assert len(s) == 10 and s.pos == 2
    # slot -> global number now: slots 0,1 hold 10,11; 2..9 hold 2..9
    all_slots = np.arange(10)
    numbers = np.where(all_slots < 2, all_slots + 10, all_slots)
    check_rows(s, all_slots, numbers)
    for name, (_, dtype) in s.spec.items():
        assert s.arrays[name].dtype == dtype


def test_batch_larger_than_capacity_keeps_last_rows():
    s = Storage(4, SPEC)
    s.insert(make_batch(0, 3))  # pos 3
    slots = s.insert(make_batch(3, 9))  # numbers 3..11; as if one by one: last 4 are 8..11
    assert len(slots) == 4
    assert len(s) == 4 and s.pos == (3 + 9) % 4
    check_rows(s, slots, np.arange(8, 12))
    # the next write goes where a row-by-row writer would put it
    nxt = s.insert(make_batch(12, 1))
    assert nxt[0] == (3 + 9) % 4


def test_get_random_rows_and_torch_index():
    rng = np.random.default_rng(0)
    s = Storage(50, SPEC)
    number_at = np.full(50, -1)
    total = 0
    for n in [13, 20, 31, 7, 50, 3]:
        slots = s.insert(make_batch(total, n))
        number_at[slots] = np.arange(total + n - len(slots), total + n)
        total += n
    idx = rng.integers(0, len(s), 64)
    check_rows(s, idx, number_at[idx])
    check_rows(s, torch.from_numpy(idx), number_at[idx])
    # get copies: the batch must survive later overwrites
    got = s.get(idx)
    before = got["obs"].clone()
    s.insert(make_batch(total, 50))
    assert torch.equal(got["obs"], before)


def test_torch_batch_insert():
    s = Storage(5, {"x": ((2,), "float32"), "a": ((), "int64")})
    s.insert({"x": torch.arange(6, dtype=torch.float32).reshape(3, 2), "a": torch.tensor([1, 2, 3])})
    out = s.get(np.array([0, 2]))
    assert out["x"].tolist() == [[0.0, 1.0], [4.0, 5.0]]
    assert out["a"].tolist() == [1, 3]


def test_state_dict_roundtrip_weights_only():
    s = Storage(8, SPEC)
    s.insert(make_batch(0, 11))
    buf = io.BytesIO()
    torch.save(s.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    t = Storage(8, SPEC)
    t.load_state_dict(state)
    assert (t.pos, t.size) == (s.pos, s.size)
    idx = np.arange(8)
    a, b = s.get(idx), t.get(idx)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
    # partially filled storage saves only the filled rows
    p = Storage(8, SPEC)
    p.insert(make_batch(0, 3))
    assert p.state_dict()["data"]["obs"].shape[0] == 3
    with pytest.raises(ValueError, match="capacity"):
        Storage(9, SPEC).load_state_dict(state)


def test_external_buffers_are_used():
    bufs = {"x": np.zeros((4, 2), np.float32)}
    s = Storage(4, {"x": ((2,), "float32"), "a": ((), "int64")}, buffers=bufs)
    s.insert({"x": np.ones((2, 2), np.float32), "a": np.zeros(2, np.int64)})
    assert bufs["x"][:2].sum() == 4.0  # wrote into the caller's array
    with pytest.raises(ValueError, match="'x'"):
        Storage(4, {"x": ((2,), "float32")}, buffers={"x": np.zeros((4, 3), np.float32)})


def test_errors_and_nbytes():
    with pytest.raises(ValueError, match="capacity"):
        Storage(0, SPEC)
    s = Storage(4, {"x": ((2,), "float32"), "a": ((), "int64")})
    assert s.nbytes == 4 * 2 * 4 + 4 * 8
    with pytest.raises(ValueError, match="missing \\['a'\\]"):
        s.insert({"x": np.zeros((1, 2), np.float32)})
    with pytest.raises(ValueError, match="extra \\['b'\\]"):
        s.insert({"x": np.zeros((1, 2)), "a": np.zeros(1), "b": np.zeros(1)})
    with pytest.raises(ValueError, match="'x'.*item shape \\(3,\\)"):
        s.insert({"x": np.zeros((1, 3)), "a": np.zeros(1)})
    with pytest.raises(ValueError, match="'a'.*rows"):
        s.insert({"x": np.zeros((2, 2)), "a": np.zeros(3)})
    s.insert({"x": np.zeros((2, 2)), "a": np.zeros(2)})
    with pytest.raises(ValueError, match="out of range"):
        s.get(np.array([0, 2]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_storage():
    s = Storage(10, SPEC, device="cuda")
    s.insert(make_batch(0, 7))
    s.insert({k: torch.from_numpy(v) for k, v in make_batch(7, 5).items()})
    idx = np.array([0, 1, 5, 9])
    got = s.get(idx)
    assert all(t.device.type == "cuda" for t in got.values())
    exp = expected_rows(np.where(idx < 2, idx + 10, idx))
    for name, (_, dtype) in s.spec.items():
        np.testing.assert_array_equal(got[name].cpu().numpy(), exp[name].astype(dtype))
    got_t = s.get(torch.from_numpy(idx).cuda())
    assert torch.equal(got_t["obs"], got["obs"])
    state = s.state_dict()
    t = Storage(10, SPEC, device="cuda")
    t.load_state_dict(state)
    assert torch.equal(t.get(idx)["img"], got["img"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_inserts_through_pinned_memory_equal_a_cpu_storage():
    """Many inserts in a row (the pinned buffers reused in turn, batches of varying size, wrapping),
    the caller's arrays overwritten right after each insert: the device rows equal a CPU storage's."""
    gpu, cpu = Storage(50, SPEC, device="cuda"), Storage(50, SPEC)
    rng = np.random.default_rng(0)
    start = 0
    for _ in range(40):
        n = int(rng.integers(1, 13))
        batch = make_batch(start, n)
        gpu.insert(batch)
        cpu.insert(batch)
        for v in batch.values():   # the caller reuses its arrays at once
            v[...] = 0
        start += n
    idx = np.arange(50)
    got, want = gpu.get(idx), cpu.get(idx)
    for name in SPEC:
        np.testing.assert_array_equal(got[name].cpu().numpy(), want[name].numpy())
