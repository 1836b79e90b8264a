"""The CUDA-graph kernel (hetrl/kernels/cuda_graph.py): what is not CUDA-specific runs here on the CPU
(the state a capture must put back, which phases replay as captured, the settings); the capture
and its equality to eager on a GPU: `-m gpu` below and benchmarks/gpu_check.py."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from hetrl.algos import make_algorithm, replay_spec
from hetrl.config import make_config
from hetrl.errors import UsageError
from hetrl.kernels import check_equal, cuda_graph as graphed, synthetic_batch

ENVS = {"dqn": "CartPole-v1", "ddpg": "Pendulum-v1", "td3": "Pendulum-v1", "sac": "Pendulum-v1"}


def build(algo: str, device: str = "cpu", **settings):
    env = gym.make(ENVS[algo])
    delay = {"policy_delay": 2} if algo == "td3" else {}
    cfg = make_config(algo, ENVS[algo], {"net_arch": [32, 32], "batch_size": 16, **delay, **settings})
    torch.manual_seed(0)
    a = make_algorithm(cfg, env.observation_space, env.action_space, device)
    return a, replay_spec(cfg, env.observation_space, env.action_space), env.action_space


def params(algo) -> list[torch.Tensor]:
    return [t.detach().clone() for t in graphed.owned_tensors(algo)]


@pytest.mark.parametrize("name", ["dqn", "ddpg", "td3", "sac"])
@pytest.mark.parametrize("fresh", [True, False])
def test_restore_undoes_every_update_the_capture_takes(name, fresh):
    """A capture runs learn a few times (warm-up, the capture's Python): snapshot/restore must leave the
    learner as if they never ran, Adam's state made meanwhile included (fresh: no step taken before)."""
    a, spec, space = build(name)
    b_ref, _, _ = build(name)
    torch.manual_seed(1)
    batch, w = synthetic_batch(spec, space, 16, 2, "cpu")
    if not fresh:   # a learner some steps into its run
        for x in (a, b_ref):
            torch.manual_seed(2)
            x.learn(batch, w)
    saved = graphed.snapshot(a)
    for _ in range(3):
        a.learn(batch, w)
    graphed.restore(a, saved)
    assert a.updates == b_ref.updates
    for x in (a, b_ref):   # the next phase from the same random state: the same learner afterwards
        torch.manual_seed(3)
        td = x.learn(batch, w)
        x.td = td
    assert torch.equal(a.td, b_ref.td)
    for p, q in zip(params(a), params(b_ref)):
        assert torch.equal(p, q)


def test_owned_tensors_are_what_a_learn_call_writes():
    """Every tensor SAC's learn changes (critics, actor, targets, Adam moments and steps, log_alpha) is in
    owned_tensors, so a capture's restore cannot miss one."""
    a, spec, space = build("sac")
    batch, w = synthetic_batch(spec, space, 16, 1, "cpu")
    a.learn(batch, w)   # Adam's state exists
    owned = {id(t) for t in graphed.owned_tensors(a)}
    assert id(a.log_alpha) in owned and id(a.critic_target_flat) in owned
    for opt in graphed.optimizers(a):
        for state in opt.state.values():
            assert all(id(t) in owned for t in state.values() if isinstance(t, torch.Tensor))


def test_which_phases_replay_as_captured():
    """Whole multiples of the algorithm's graph_period() (TD3: policy_delay, decided in Python), on a GPU only."""
    td3, _, _ = build("td3", policy_delay=3)
    assert td3.graph_period() == 3
    assert graphed.fits(td3, 3) and graphed.fits(td3, 6) and not graphed.fits(td3, 4)
    dqn, _, _ = build("dqn")
    assert graphed.fits(dqn, 1) and graphed.fits(dqn, 7)
    assert not graphed.applies(dqn, 1)   # a CPU learner is never captured


def test_the_kernel_declines_a_cpu_learner_and_runs_it_eager():
    """Off a GPU the kernel says why it does not apply (so it is never chosen there), and if built anyway it
    captures nothing and returns exactly what the algorithm's learn returns."""
    a, spec, space = build("ddpg")
    b, _, _ = build("ddpg")
    assert "GPU learner" in graphed.CudaGraphKernel.check(a)
    g = graphed.CudaGraphKernel(a)
    batch, w = synthetic_batch(spec, space, 16, 2, "cpu")
    assert torch.equal(g.learn(batch, w), b.learn(batch, w)) and not g.graphs and g.compile_s == 0.0


def test_cuda_graph_on_a_cpu_learner_is_one_line():
    with pytest.raises(UsageError, match="learner_kernel=cuda_graph .* device=cpu; set --set device=cuda"):
        make_config("dqn", "CartPole-v1", {"learner_kernel": "cuda_graph", "device": "cpu"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["dqn", "ddpg", "td3", "sac"])
def test_replayed_phases_equal_eager_on_the_gpu(name):
    """Phases replayed from a CUDA graph give the |TD|, parameters and optimizer state the eager phases give,
    random draws included (TD3's smoothing noise, SAC's actions): a replay from the generator's state draws
    what an eager call from that state draws. This is the check kernels.select runs before choosing it."""
    env = gym.make(ENVS[name])
    cfg = make_config(name, ENVS[name], {"net_arch": [32, 32], "batch_size": 16,
                                         **({"policy_delay": 2} if name == "td3" else {})})
    spec = replay_spec(cfg, env.observation_space, env.action_space)
    g = torch.Generator().manual_seed(0)
    phases = [synthetic_batch(spec, env.action_space, 16, 2, "cuda", g)[0] for _ in range(3)]
    ok, detail = check_equal(lambda: make_algorithm(cfg, env.observation_space, env.action_space, "cuda"),
                             graphed.CudaGraphKernel, phases, torch.ones(2, 16, device="cuda"))
    assert ok, detail
