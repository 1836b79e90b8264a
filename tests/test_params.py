"""One contract for the three parameter stores (in-process, shared-memory seqlock, Ray object store)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest
import torch

from hetrl.runtime.params import InProcessParameterStore, RayParameterStore
from hetrl.runtime.shm import SharedParameterStore

EXAMPLE = {"w": torch.zeros(3), "b": torch.zeros(2, dtype=torch.float64)}


@pytest.fixture
def ray_session(local_ray):   # conftest.py's: one Ray per test process
    return local_ray


@pytest.fixture(params=["in-process", "shared-memory", pytest.param("ray", marks=pytest.mark.ray)])
def store(request):
    if request.param == "in-process":
        return InProcessParameterStore()
    if request.param == "shared-memory":
        return SharedParameterStore(EXAMPLE)
    request.getfixturevalue("ray_session")
    return RayParameterStore()


def state(x: float) -> dict:
    return {"w": torch.full((3,), x), "b": torch.full((2,), 2 * x, dtype=torch.float64)}


def test_parameter_store_contract(store):
    assert store.latest(-1) is None                      # nothing published yet
    assert store.publish(state(1.0)) == 0                # versions count from 0
    got, v = store.latest(-1)
    assert v == 0 and torch.equal(got["w"], torch.ones(3)) and got["b"].dtype == torch.float64
    assert store.latest(0) is None                       # nothing newer than what the reader has
    src = state(2.0)
    assert store.publish(src) == 1
    src["w"].add_(100)                                   # the learner changes its weights after publishing
    got, v = store.latest(0)
    assert v == 1 and torch.equal(got["w"], torch.full((3,), 2.0))   # the store kept its own copy
    assert store.latest(5) is None


def _read(store, q):
    q.put(store.latest(-1)[0]["w"].tolist())


def test_shared_store_is_read_by_another_process_and_waits_out_a_publication_in_progress():
    store = SharedParameterStore(EXAMPLE)
    store.publish(state(3.0))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_read, args=(store, q))
    p.start()
    assert q.get(timeout=60) == [3.0, 3.0, 3.0]
    p.join()
    # a writer mid-way (odd sequence number): the reader neither returns the torn weights nor gives up
    # (an actor acting on older weights than the last publication would break the policy-lag bound)
    h = store.block["header"]
    h[0] += 1
    store._shared["w"].fill_(7.0)

    def finish():
        time.sleep(0.05)
        h[1] += 1
        h[0] += 1
    writer = threading.Thread(target=finish)
    writer.start()
    got, version = store.latest(0)
    writer.join()
    assert version == 1 and got["w"].tolist() == [7.0, 7.0, 7.0]


@pytest.mark.ray
def test_ray_store_travels_to_an_actor_by_reference(ray_session):
    ray = ray_session
    store = RayParameterStore()
    store.publish(state(4.0))

    @ray.remote(num_cpus=0)
    def read(s):
        got = s.latest(-1)
        return got[1], got[0]["w"].tolist()

    assert ray.get(read.remote(store)) == (0, [4.0, 4.0, 4.0])


def test_in_process_store_copies_into_its_last_buffers_when_they_fit():
    """A publish of the same names and shapes copies into the buffers of the last one (no allocation per
    publish); another layout gets new buffers. Either way the learner's later writes never show."""
    store = InProcessParameterStore()
    live = state(1.0)
    store.publish(live)
    first, v1 = store.latest(-1)
    live["w"].fill_(5.0)            # the learner changes its weights in place: the store's copy does not
    assert float(first["w"][0]) == 1.0
    store.publish(live)
    second, v2 = store.latest(v1)
    assert v2 == v1 + 1 and second["w"] is first["w"] and float(second["w"][0]) == 5.0
    store.publish({"w": torch.ones(4)})   # another layout
    third, _ = store.latest(v2)
    assert third["w"].shape == (4,) and list(third) == ["w"]


def test_the_finite_check_reads_cpu_and_autograd_tensors():
    from hetrl.replay.finite import all_finite

    assert all_finite(torch.zeros(2, 3)) and not all_finite(torch.tensor([0.0, float("nan")]))
    assert not all_finite(torch.tensor([float("inf")], requires_grad=True))
    assert all_finite(torch.ones(3, dtype=torch.bfloat16)) and not all_finite(torch.tensor([float("nan")]).bfloat16())


def test_a_flat_policy_is_published_and_loaded_as_one_copy_and_stays_a_snapshot():
    """A module whose parameters are views of one buffer (FlatAdam's) gives live_state() a span over them: the
    in-process store keeps its own buffer and copies it as one, an actor's flattened network loads it as one;
    each copy is a snapshot, live_state follows the module and is walked again when a parameter is replaced."""
    from torch import nn

    from hetrl.algos.nets import FlatState, flatten, live_state, load_weights

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))

    learner, actor = net(), net()
    flatten(learner)
    st = live_state(learner)
    assert isinstance(st, FlatState) and st.flat is not None and st.flat.numel() == 3 * 4 + 4 + 4 * 2 + 2
    assert list(st) == list(learner.state_dict())
    st.pop("0.weight")                                    # the caller's dict: the next call is whole again
    assert list(live_state(learner)) == list(learner.state_dict())
    store = InProcessParameterStore()
    store.publish(live_state(learner))
    published, v = store.latest(-1)
    assert published.flat is not None and published.flat.data_ptr() != st.flat.data_ptr()
    with torch.no_grad():
        learner[0].weight.add_(1.0)                        # the learner moves: live_state follows it ...
    assert torch.equal(live_state(learner)["0.weight"], learner[0].weight)
    assert not torch.equal(published["0.weight"], learner[0].weight)    # ... the published copy does not
    store.publish(live_state(learner))
    again, _ = store.latest(v)
    assert again.flat is published.flat and torch.equal(again["0.weight"], learner[0].weight)
    for flat_actor in (False, True):
        if flat_actor:
            flatten(actor)                                 # (the compiled acting flattens its network)
        load_weights(actor, again)
        assert live_state(actor).flat is not None if flat_actor else live_state(actor).flat is None
        assert all(torch.equal(a, b) for a, b in zip(actor.state_dict().values(), learner.state_dict().values()))
        with torch.no_grad():
            actor[2].bias.zero_()
    learner[2].bias = nn.Parameter(torch.full((2,), 7.0))  # a parameter replaced: walked again, not one span
    st = live_state(learner)
    assert torch.equal(st["2.bias"], torch.full((2,), 7.0)) and st.flat is None
    load_weights(actor, st)
    assert torch.equal(actor[2].bias, torch.full((2,), 7.0))
