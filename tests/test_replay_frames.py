"""The frame storage (hetrl/replay/frames.py) against the plain storage: the same stacks, each frame once.

Transitions come from simulated vector envs with frame-stacked observations (zero- or first-frame
padding at an episode's start, terminations and truncations, n-step rows from the NStepAdder),
grouped into inserts of random sizes (several envs and actors interleaved, batches larger than the
ring), over a small alphabet of frame contents so that frames repeat across envs and episodes.
"""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import torch

from hetrl.replay import FrameStorage, NStepAdder, ReplayBuffer, Storage
from hetrl.replay.frames import frame_layout, frames_apply
from hetrl.replay.memory import arrays_bytes, storage_bytes


def spec_of(K: int, frame: tuple[int, ...]) -> dict:
    return {"obs": ((K, *frame), "uint8"), "next_obs": ((K, *frame), "uint8"), "action": ((), "int64"),
            "reward": ((), "float32"), "terminated": ((), "bool"), "truncated": ((), "bool"), "steps": ((), "uint8")}


def transitions(rng, envs: int, K: int, frame: tuple, steps: int, n: int, values: int = 256, p_end: float = 0.05,
                padding: str = "zero"):
    """Batches of n-step transitions of `envs` envs whose observations stack their last K frames."""
    adder = NStepAdder(n, 0.99, envs)

    def new() -> np.ndarray:
        return rng.integers(0, values, frame, dtype=np.uint8)

    def first(f: np.ndarray) -> np.ndarray:
        stack = np.zeros((K, *frame), np.uint8) if padding == "zero" else np.repeat(f[None], K, axis=0)
        stack[-1] = f
        return stack

    stacks = np.stack([first(new()) for _ in range(envs)])
    for _ in range(steps):
        nxt = np.concatenate([stacks[:, 1:], np.stack([new() for _ in range(envs)])[:, None]], axis=1)
        term = rng.random(envs) < p_end
        trunc = (rng.random(envs) < p_end / 2) & ~term
        batch = adder.add(stacks, rng.integers(0, 6, envs), rng.standard_normal(envs), nxt, term, trunc)
        stacks = nxt.copy()
        for e in np.flatnonzero(term | trunc):   # SAME_STEP autoreset: the next episode's first stack
            stacks[e] = first(new())
        if batch is not None:
            yield batch


def interleaved(rng, sources: list, max_group: int):
    """Inserts made of a random number of batches from random sources (actors), concatenated."""
    its = [iter(s) for s in sources]
    while its:
        parts = []
        for _ in range(int(rng.integers(1, max_group + 1))):
            it = its[int(rng.integers(0, len(its)))]
            b = next(it, None)
            if b is None:
                its.remove(it)
                break
            parts.append(b)
        if parts:
            yield {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def assert_same(fs: FrameStorage, ref: Storage) -> None:
    """Every held row of `fs` equals `ref`'s row in the same slot; the rows evicted early are the oldest."""
    keys = np.arange(ref.size)
    alive = fs.alive(keys)
    age = (keys - (ref.pos if ref.size == ref.capacity else 0)) % ref.capacity
    assert np.array_equal(alive, age >= fs.dead) and alive.sum() == len(fs) == ref.size - fs.dead
    got, want = fs.get(keys[alive]), ref.get(keys[alive])
    for name in ref.spec:
        assert torch.equal(got[name], want[name]), name
    used = fs.refcount[1:] > 0
    assert fs.frames_used == int(used.sum()) and (fs.refcount >= 0).all()


@pytest.mark.parametrize("seed,K,frame,n,envs,actors,capacity,padding", [
    (0, 4, (6, 8), 1, 2, 1, 97, "zero"),
    (1, 4, (6, 8), 3, 3, 2, 64, "zero"),
    (2, 2, (5, 3), 2, 1, 3, 50, "reset"),     # odd frame bytes; the first frame repeated as padding
    (3, 4, (8, 8), 1, 4, 2, 33, "reset"),
    (4, 3, (4, 4), 5, 2, 2, 128, "zero"),
])
def test_frame_storage_returns_exactly_the_inserted_stacks(seed, K, frame, n, envs, actors, capacity, padding):
    rng = np.random.default_rng(seed)
    spec = spec_of(K, frame)
    fs, ref = FrameStorage(capacity, spec), Storage(capacity, spec)
    sources = [transitions(rng, envs, K, frame, 150, n, values=int(rng.choice([3, 256])), p_end=0.08,
                           padding=padding) for _ in range(actors)]
    inserted = 0
    for batch in interleaved(rng, sources, max_group=capacity // 8):
        assert np.array_equal(fs.insert(batch), ref.insert(batch))
        inserted += len(batch["obs"])
        assert_same(fs, ref)
    assert inserted > 2 * capacity and fs.dead == 0   # wrapped around; the default pool never ran short
    # each frame once: the pool holds about one frame per row (one per step, one per episode start)
    assert fs.frames_used < 1.5 * capacity + 2 * envs * actors * (K + n)


def test_a_batch_larger_than_the_ring_keeps_its_last_rows():
    rng = np.random.default_rng(5)
    spec = spec_of(4, (6, 8))
    fs, ref = FrameStorage(20, spec), Storage(20, spec)
    batch = next(interleaved(rng, [transitions(rng, 2, 4, (6, 8), 40, 1)], max_group=40))
    assert len(batch["obs"]) > 20
    assert np.array_equal(fs.insert(batch), ref.insert(batch))
    assert_same(fs, ref)


@pytest.mark.parametrize("frames,values,p_end", [(40, 256, 0.05), (20, 256, 0.3), (16, 2, 0.5)])
def test_a_short_pool_evicts_the_oldest_rows_which_are_never_sampled(frames, values, p_end):
    """Episodes of a step or two need ~2 frames per row; a pool this short evicts the oldest rows early
    (FIFO): they are never returned, uniform or prioritised, and their priorities stay 0."""
    rng = np.random.default_rng(7)
    spec = spec_of(4, (6, 8))
    ref = Storage(48, spec)
    replays = [ReplayBuffer(48, spec, prioritized=p, seed=0, frames=True) for p in (False, True)]
    for rb in replays:   # a short pool, same layout otherwise
        rb.storage = FrameStorage(48, spec, frames=frames)
    most_dead = 0
    for batch in transitions(rng, 3, 4, (6, 8), 200, 2, values=values, p_end=p_end):
        ref.insert(batch)
        for rb in replays:
            rb.insert(batch)
        fs = replays[0].storage
        assert_same(fs, ref)
        most_dead = max(most_dead, fs.dead)
        for rb in replays:
            batch_out, keys, _ = rb.sample(64)
            assert rb.storage.alive(keys).all()
            want = ref.get(keys)
            assert all(torch.equal(batch_out[k], want[k]) for k in spec)
            if rb.prioritized:
                rb.update_priorities(keys, np.ones(len(keys)))
                dead = np.flatnonzero(~rb.storage.alive(np.arange(48)) & (np.arange(48) < rb.storage.size))
                assert not rb.tree.get(dead).any() if dead.size else True
    assert most_dead > 0


def test_state_dict_holds_each_frame_once_and_resumes_exactly():
    rng = np.random.default_rng(11)
    spec = spec_of(4, (24, 24))
    fs, ref = FrameStorage(60, spec), Storage(60, spec)
    source = interleaved(rng, [transitions(rng, 3, 4, (24, 24), 200, 3, values=4)], max_group=5)
    for _, batch in zip(range(30), source):
        fs.insert(batch)
        ref.insert(batch)
    buf = io.BytesIO()
    torch.save(fs.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["kind"] == "frames" and len(state["frames"]) == fs.frames_used      # frames once
    assert buf.getbuffer().nbytes < 0.3 * storage_bytes(spec, ref.size)               # vs both stacks in full
    back = FrameStorage(60, spec)
    back.load_state_dict(state)
    assert (back.pos, back.size, back.dead, back.frames_used) == (fs.pos, fs.size, fs.dead, fs.frames_used)
    assert_same(back, ref)
    for batch in source:   # inserting goes on as before the save
        back.insert(batch)
        ref.insert(batch)
        assert_same(back, ref)
    with pytest.raises(ValueError, match="plain Storage"):
        FrameStorage(60, spec).load_state_dict(ref.state_dict())
    with pytest.raises(ValueError, match="frame storage"):
        Storage(60, spec).load_state_dict(state)


def test_replay_buffer_with_frames_samples_like_the_plain_one():
    rng = np.random.default_rng(3)
    spec = spec_of(4, (6, 8))
    plain = ReplayBuffer(100, spec, seed=1, prioritized=True)
    frames = ReplayBuffer(100, spec, seed=1, prioritized=True, frames=True)
    for batch in transitions(rng, 2, 4, (6, 8), 120, 1):
        plain.insert(batch)
        frames.insert(batch)
    for _ in range(3):   # same seed, same tree: the same keys, weights and rows
        (a, ka, wa), (b, kb, wb) = plain.sample(32), frames.sample(32)
        assert np.array_equal(ka, kb) and torch.equal(wa, wb)
        assert all(torch.equal(a[k], b[k]) for k in spec)
        td = rng.random(32)
        plain.update_priorities(ka, td)
        frames.update_priorities(kb, td)
    out = {k: np.empty((40, *s), np.dtype(d)) for k, (s, d) in spec.items()}   # the local schedule's buffers
    got, keys, _ = frames.sample(40, out=out)
    assert got["obs"].data_ptr() == torch.from_numpy(out["obs"]).data_ptr()
    assert torch.equal(got["next_obs"], plain.storage.get(keys)["next_obs"])


def test_frame_storage_in_shared_memory_buffers():
    from hetrl.runtime.shm import SharedArrays

    rng = np.random.default_rng(4)
    spec = spec_of(4, (6, 8))
    block = SharedArrays(FrameStorage.layout(30, spec))
    fs, ref = FrameStorage(30, spec, buffers=block.arrays), Storage(30, spec)
    for batch in transitions(rng, 2, 4, (6, 8), 40, 1):
        fs.insert(batch)
        ref.insert(batch)
    assert_same(fs, ref)
    assert np.shares_memory(fs.frames, block["frames"])
    block.close()


def test_atari_bytes_per_transition_and_the_memory_check():
    atari = spec_of(4, (84, 84))
    assert frames_apply(atari, 4) and not frames_apply(atari, 1) and not frames_apply(spec_of(4, (6,)), 2)
    per_frames = arrays_bytes(frame_layout(1_000_000, atari)) / 1_000_000
    per_plain = storage_bytes(atari, 1)
    assert per_plain == 2 * 4 * 84 * 84 + 15 and 7900 < per_frames < 8100    # 56.5 KB vs ~8.0 KB
    assert FrameStorage(100, atari).nbytes == arrays_bytes(frame_layout(100, atari))


def test_an_impossible_atari_replay_is_refused_before_anything_is_allocated():
    pytest.importorskip("ale_py")
    import hetrl
    from hetrl.errors import UsageError

    tracemalloc.start()
    with pytest.raises(UsageError, match=r"buffer_size=1,000,000,000 x (79|80)\d\d bytes.*lower buffer_size"):
        hetrl.train("dqn", "ALE/Pong-v5", plan="none", steps=1000, buffer_size=10**9, eval_episodes=0, progress=False,
                    threads=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200e6, peak   # the 8 TB replay (or any of it) was never allocated
