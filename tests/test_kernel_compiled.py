"""The compiled kernel (hetrl/kernels/compiled/) equals each algorithm's public learn: TD errors, parameters,
targets, Adam moments and step, SAC's log_alpha, for several network shapes, activations and LayerNorm, on one
and two threads; one optimizer state across kernels; acting; what it declines; its GEMM and thread settings."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels.compiled import CompiledKernel, available, sgemm
from hetrl.kernels.compiled.kernel import head_class

pytestmark = pytest.mark.skipif(available() is not None, reason="numba/scipy not installed")

DQN_SPACES = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
AC_SPACES = (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,)))
ENV = {"dqn": "CartPole-v1", "ddpg": "Pendulum-v1", "td3": "Pendulum-v1", "sac": "Pendulum-v1", "crossq": "Pendulum-v1"}


def _batches(name, K, B, seed, obs_shape=None):
    g = torch.Generator().manual_seed(seed)
    obs_shape = obs_shape or ((4,) if name == "dqn" else (3,))
    b = {"obs": torch.randn(K, B, *obs_shape, generator=g), "reward": torch.randn(K, B, generator=g) * 3,
         "next_obs": torch.randn(K, B, *obs_shape, generator=g), "terminated": torch.rand(K, B, generator=g) < 0.3,
         "truncated": torch.zeros(K, B, dtype=torch.bool),
         "steps": torch.randint(1, 3, (K, B), generator=g).to(torch.uint8)}
    b["action"] = (torch.randint(0, 3, (K, B), generator=g) if name == "dqn"
                   else torch.rand(K, B, 2, generator=g) * 2 - 1)
    return b


_OPEN: list = []


@pytest.fixture(autouse=True)
def _close_kernels():
    """Every kernel a test made is closed after it (torch's thread count given back)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def _pair(name, threads=1, spaces=None, critic_lanes=True, **settings):
    """(the compiled kernel on one algorithm, its algorithm, a twin with the same state for the public learn)."""
    spaces = spaces or (DQN_SPACES if name == "dqn" else AC_SPACES)
    small = {"qf_arch": [32, 16]} if name == "crossq" else {}   # (CrossQ's critics are 1024 wide by default)
    cfg = make_config(name, ENV[name], {"net_arch": [24, 16], "max_grad_norm": 0.5, **small, **settings})
    torch.manual_seed(0)
    fast, ref = make_algorithm(cfg, *spaces), make_algorithm(cfg, *spaces)
    ref.load_state_dict(fast.state_dict())
    kernel = CompiledKernel(fast, critic_lanes=critic_lanes, lane_guard=False)   # (the lanes asked for)
    _OPEN.append(kernel)
    kernel.use_threads(threads)
    return kernel, fast, ref


def _learn_both(kernel, ref, K, seed, B=16, tol=1e-5, obs_shape=None):
    """One phase on each, with the same torch RNG state (TD3's smoothing noise, SAC's Gaussian noise)."""
    name = ref.name
    b, w = _batches(name, K, B, seed, obs_shape), torch.rand(K, B, generator=torch.Generator().manual_seed(50 + seed))
    torch.manual_seed(100 + seed)
    got = kernel.learn(b, w)
    torch.manual_seed(100 + seed)
    want = ref.learn(b, w)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    if name == "dqn":   # the target network moves between phases
        kernel.algo.on_env_steps(0, 10_000)
        ref.on_env_steps(0, 10_000)


def _same_state(a, b, rtol=1e-4):
    """Parameters, targets, Adam moments and step, the update count (and SAC's log_alpha and its Adam). The
    parameters' tolerance is a twentieth of one Adam step (lr): where a weight's gradient nearly cancels (~1e-8
    against a scale of ~0.3), the two kernels' different order of float additions leaves it a different relative
    rounding error of a few percent, and Adam's normalised step g / (|g| + eps) carries that into the weight.
    Batch normalisation makes such weights structural (a bias before it, over a batch where its unit is linear,
    is taken out by it): one in a thousand elements of the whole state may be off, within Adam's bound."""
    atol = 0.05 * a.cfg.lr
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["updates"] == sb["updates"] == a.updates
    off = total = 0
    for key in sa:
        if isinstance(sa[key], torch.Tensor):   # SAC's log_alpha
            torch.testing.assert_close(sa[key], sb[key], rtol=rtol, atol=atol)
        elif isinstance(sa[key], dict) and "state" in sa[key]:   # an optimizer's state
            for (ka, oa), (kb, ob) in zip(sa[key]["state"].items(), sb[key]["state"].items()):
                assert float(oa["step"]) == float(ob["step"])
                for n in _close_but_for_cancelled(oa["exp_avg"], ob["exp_avg"], 10 * rtol, 1e-7, 1e-5), \
                        _close_but_for_cancelled(oa["exp_avg_sq"], ob["exp_avg_sq"], 10 * rtol, 1e-9, 1e-7):
                    off, total = off + n[0], total + n[1]
        elif isinstance(sa[key], dict):   # a network's state dict
            for k in sa[key]:
                n = _close_but_for_cancelled(sa[key][k], sb[key][k], rtol, atol, 3 * a.updates * a.cfg.lr)
                off, total = off + n[0], total + n[1]
    assert off <= 1e-3 * total, f"{off} of {total} elements beyond tolerance"


def _close_but_for_cancelled(got, want, rtol, atol, bound):
    """(elements beyond tolerance, elements): those beyond it must be within `bound` (for a weight: Adam moves it
    ~lr per update at most, so 3 x updates x lr); _same_state bounds how many there are."""
    diff, tight = (got - want).abs(), atol + rtol * want.abs()
    off = diff > tight
    assert bool((diff[off] <= bound).all()), f"an element differs by {diff.max().item():.3g} > {bound:.3g}"
    return int(off.sum()), off.numel()


# net_arch x activation x layer_norm x threads, parametrised so the file stays fast: every small case on several
# phases (a policy delay and target updates across them), the large widths on one phase of three updates
SMALL = [([64, 64], "relu", False, 1), ([64, 64], "relu", False, 2), ([64, 64], "tanh", False, 1),
         ([64, 64], "tanh", True, 2), ([64, 64], "relu", True, 1), ([64, 64], "elu", False, 2)]
LARGE = [([256, 256], "relu", False, 2), ([256, 256], "tanh", True, 1), ([400, 300], "relu", False, 1),
         ([400, 300], "tanh", False, 2), ([256, 256, 256], "relu", True, 2), ([256, 256, 256], "relu", False, 1)]
ALGOS = [("dqn", {}), ("dqn", {"double": True}), ("ddpg", {}), ("td3", {"policy_delay": 3}), ("sac", {})]


def _id(case):
    arch, act, ln, threads = case
    return f"{'x'.join(map(str, arch))}-{act}{'-ln' if ln else ''}-{threads}t"


@pytest.mark.parametrize("case", SMALL + LARGE, ids=_id)
@pytest.mark.parametrize("name,settings", ALGOS, ids=["dqn", "double", "ddpg", "td3", "sac"])
def test_the_phase_equals_the_public_learn(name, settings, case):
    """The same |TD| per phase, then the same parameters, targets, Adam states, step count (and SAC's entropy
    coefficient) as the algorithm's public learn: importance weights, an active gradient clip, terminations and
    n-step discounts; on one learner thread, or two (the lanes taking the row blocks; TD3's critics a task
    each)."""
    arch, act, ln, threads = case
    kernel, fast, ref = _pair(name, threads, net_arch=arch, activation=act, layer_norm=ln, **settings)
    small = case in SMALL
    for seed, K in enumerate((7, 1, 5) if small else (3,)):
        _learn_both(kernel, ref, K, seed, tol=1e-5 if small else 1e-4)
    _same_state(fast, ref)
    if name == "td3":
        assert kernel.figures()["lane_split"] == "critics"
    if name == "sac":
        assert abs(float(fast.log_alpha.detach())) > 1e-4   # learned, from alpha = 1
    kernel.close()


@pytest.mark.parametrize("name,settings", [("td3", {"max_grad_norm": 0.0}), ("td3", {"policy_delay": 2}),
                                           ("sac", {"ent_coef": "0.1"}), ("sac", {"max_grad_norm": 0.0})])
@pytest.mark.parametrize("split", ["critics", "rows"])
def test_the_lane_splits_and_optional_parts_equal_the_public_learn(name, settings, split):
    """TD3 without a clip (each critic's Adam step in its lane) and with the rows split instead of a lane per
    critic; SAC with a fixed entropy coefficient (it never moves) and without a clip."""
    kernel, fast, ref = _pair(name, 2, critic_lanes=split == "critics", **settings)
    for seed, K in enumerate((4, 1, 3)):
        _learn_both(kernel, ref, K, seed)
    _same_state(fast, ref)
    if name == "td3":
        assert kernel.figures()["lane_split"] == split
    if settings.get("ent_coef"):
        assert float(fast.log_alpha.detach()) == pytest.approx(math.log(0.1))
    kernel.close()


BITS = [("dqn", {}), ("dqn", {"double": True}), ("ddpg", {}), ("td3", {"policy_delay": 2}),
        ("td3", {"policy_delay": 2, "critic_lanes": False}), ("td3", {"max_grad_norm": 0.0}), ("sac", {}),
        ("crossq", {"policy_delay": 2})]


def _phases(kernels, name, phases=((3, 0), (2, 1)), B=64):
    """The same phases, from the same torch RNG state, on each kernel (or, for None, the public learn of `ref`)."""
    outs = []
    for K, seed in phases:
        b = _batches(name, K, B, seed)
        w = torch.rand(K, B, generator=torch.Generator().manual_seed(50 + seed))
        got = []
        for k in kernels:
            torch.manual_seed(100 + seed)
            got.append(k.learn(b, w))
        outs.append(got)
    return outs


@pytest.mark.parametrize("name,settings", BITS, ids=["dqn", "double", "ddpg", "td3", "td3-rows", "td3-noclip", "sac",
                                                      "crossq"])
def test_one_and_two_lanes_give_the_same_bits(name, settings):
    """A head splits a batch into fixed row blocks (and TD3's and CrossQ's critics into a task each) that the lanes
    take as they come, each block's partial gradient summed in block order: one lane and two give bit-identical
    |TD|, parameters, targets, optimizer states (so a run may change its threads mid-run); and the result is the
    public learn's within float tolerance. B = 64 rows: four blocks."""
    critic_lanes = settings.pop("critic_lanes", True)
    k1, f1, ref = _pair(name, 1, critic_lanes=critic_lanes, **settings)
    k2, f2, _ = _pair(name, 2, critic_lanes=critic_lanes, **settings)
    path = "head" if head_class(f1) is not None else "derived"   # (DQN's phase is derived: its head was removed)
    assert k1.path == k2.path == path and k1.threads_exact and k2.threads_exact
    for one, two, want in _phases([k1, k2, ref], name):
        assert torch.equal(one, two)
        torch.testing.assert_close(one, want, rtol=1e-5, atol=1e-5)
    assert k2.figures()["lanes"] == 2

    def same(a, b, where):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), where
        elif isinstance(a, dict):
            assert a.keys() == b.keys(), where
            for key in a:
                same(a[key], b[key], f"{where}.{key}")
        else:
            assert a == b, where
    same(f1.state_dict(), f2.state_dict(), name)
    _same_state(f1, ref)


@pytest.mark.parametrize("name,settings", [("dqn", {}), ("ddpg", {}), ("td3", {"policy_delay": 2}), ("sac", {}),
                                           ("sac", {"ent_coef": "0.1"}), ("crossq", {"policy_delay": 2})],
                         ids=["dqn", "ddpg", "td3", "sac", "sac-fixed-alpha", "crossq"])
def test_the_heads_write_the_losses_the_public_learn_writes(name, settings):
    """The algorithm's `stats` after a head's phase (SB3's train/ scalars: DQN's loss, the actor's and critics'
    losses, SAC's and CrossQ's ent_coef and, where alpha is learned, ent_coef_loss) are the public learn's, within
    float tolerance: the same keys, the last step's values (a delayed actor's from its last delayed step)."""
    kernel, fast, ref = _pair(name, 2, **settings)
    for phases in (((3, 0),), ((1, 1),)):   # (TD3, CrossQ: the second phase has no delayed step)
        _phases([kernel, ref], name, phases)
        assert fast.stats.keys() == ref.stats.keys()
        for key, want in ref.stats.items():
            got = fast.stats[key]
            assert got.shape == want.shape and got.dtype == want.dtype, key
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert ("ent_coef_loss" in fast.stats) == (name in ("sac", "crossq") and "ent_coef" not in settings)


def test_the_lane_guard_drops_to_one_lane_while_two_are_slower_and_tries_again_later():
    """LaneGuard, fed phase times: a one-lane probe first; two lanes while they are faster than the one-lane
    estimate; SLOW phases in a row on two lanes slower than it (one is lanes waking up) run the next ones on one
    lane for a hold that doubles with each stall in a row (up to a bound), then two again; a probe on one lane
    every PROBE_S seconds."""
    from hetrl.kernels.compiled.kernel import LaneGuard

    g, key = LaneGuard(), (2, 256)
    assert g.lanes(1, key, 0.0) == 1 and g.lanes(2, key, 0.0) == 1   # the probe
    g.record(1, key, 0.010, 0.0)
    assert g.lanes(2, key, 0.1) == 2
    g.record(2, key, 0.050, 0.1)   # the first phase on two lanes makes their buffers: not judged
    assert g.lanes(2, key, 0.1) == 2 and g.fallbacks == 0
    g.record(2, key, 0.006, 0.1)   # faster: two lanes go on
    g.record(2, key, 0.030, 0.1)   # one slow phase (lanes waking): two lanes go on
    g.record(2, key, 0.006, 0.1)
    assert g.lanes(2, key, 0.2) == 2 and g.fallbacks == 0

    def stall(t):
        for _ in range(g.SLOW):
            g.record(2, key, 0.030, t)

    stall(0.2)                     # a partner lane descheduled: one lane for HOLD_MIN
    assert g.fallbacks == 1 and g.lanes(2, key, 0.2 + 0.5 * g.HOLD_MIN) == 1
    assert g.lanes(2, key, 0.2 + 1.01 * g.HOLD_MIN) == 2
    t = 0.2 + 1.01 * g.HOLD_MIN
    stall(t)                       # still slower: a hold twice as long
    assert g.lanes(2, key, t + 1.5 * g.HOLD_MIN) == 1 and g.lanes(2, key, t + 2.01 * g.HOLD_MIN) == 2
    for _ in range(10):
        stall(t)
    assert g.hold == g.HOLD_MAX
    g.record(2, key, 0.005, t)     # quiet again: the hold starts over
    assert g.hold == g.HOLD_MIN
    assert g.lanes(2, key, g.solo_until + g.PROBE_S + 1.0) == 1   # the estimate is stale: a probe
    assert g.lanes(2, (2, 64), g.solo_until + 0.01) == 1          # another shape has no estimate yet


CROSSQ = [({}, 1), ({"activation": "tanh", "layer_norm": True, "renorm_warmup_steps": 4}, 2),
          ({"batch_norm_actor": False, "ent_coef": "0.1", "max_grad_norm": 0.0, "net_arch": [32, 24, 16],
            "qf_arch": [24, 24, 8], "policy_delay": 3}, 2),
          ({"activation": "elu", "renorm_warmup_steps": 2, "net_arch": [256, 256], "qf_arch": [256, 256]}, 2)]


@pytest.mark.parametrize("settings,threads", CROSSQ, ids=["relu-1t", "tanh-ln-renorm-2t", "no-actor-bn-fixed-alpha-2t",
                                                         "256x256-elu-renorm-2t"])
def test_the_crossq_phase_equals_the_public_learn(settings, threads):
    """CrossQ's head: the joint critic pass with batch renormalisation (its warm-up and its r/d corrections), the
    delayed actor and alpha: the same |TD| per phase, then the same parameters, running statistics and pass
    counts, Adam states (beta1 0.5) and log_alpha as CrossQ's public learn, on one thread or two (a critic per
    lane)."""
    kernel, fast, ref = _pair("crossq", threads, **{"policy_delay": 2, **settings})
    large = settings.get("net_arch") == [256, 256]
    for seed, K in enumerate((3,) if large else (5, 1, 4)):
        _learn_both(kernel, ref, K, seed, tol=1e-4 if large else 1e-5)
    _same_state(fast, ref)
    steps = [int(m.steps) for m in fast.critics[0].body.norms]
    assert steps == [int(m.steps) for m in ref.critics[0].body.norms] == [fast.updates] * len(steps)
    if fast.cfg.batch_norm_actor:
        assert int(fast.actor.body.norms[0].steps) == fast.updates // fast.cfg.policy_delay
    kernel.close()


def test_observations_of_more_than_one_axis_are_flattened_as_the_networks_do():
    spaces = (gym.spaces.Box(-1, 1, (2, 3)), AC_SPACES[1])
    kernel, fast, ref = _pair("td3", 1, spaces=spaces, policy_delay=1)
    for seed in range(2):
        _learn_both(kernel, ref, 3, seed, obs_shape=(2, 3))
    _same_state(fast, ref)


@pytest.mark.parametrize("name", ["dqn", "td3", "sac", "crossq"])
def test_checkpoints_switch_between_kernels(name):
    """compiled -> public -> compiled through checkpoints equals a run that stayed on the public learn: one
    optimizer state, torch.optim.Adam's."""
    kernel, fast, ref = _pair(name)
    _learn_both(kernel, ref, 4, 0)
    public = make_algorithm(ref.cfg, *(DQN_SPACES if name == "dqn" else AC_SPACES))
    public.load_state_dict(fast.state_dict())
    _learn_both(_Public(public), ref, 3, 1)
    back = make_algorithm(ref.cfg, *(DQN_SPACES if name == "dqn" else AC_SPACES))
    back.load_state_dict(public.state_dict())
    k2 = CompiledKernel(back)
    k2.use_threads(1)
    _learn_both(k2, ref, 3, 2)
    _same_state(back, ref)
    kernel.close()
    k2.close()


class _Public:
    def __init__(self, algo):
        self.algo = algo

    def learn(self, b, w):
        return self.algo.learn(b, w)


@pytest.mark.parametrize("name", ["td3", "sac"])   # (a head; the derived phase)
def test_a_loaded_checkpoint_replaces_the_optimizer_state_the_kernel_reads(name):
    """The kernel keeps its addresses of torch's tensors only while they are the same objects: a state loaded into
    the algorithm between phases is the one the next phase steps."""
    kernel, fast, ref = _pair(name)
    for seed in range(3):   # (the derived phase: its first phase is the public learn's, the next two its own)
        _learn_both(kernel, ref, 2, seed)
    saved = copy.deepcopy(ref.state_dict())   # (a state dict's tensors are the live ones)
    _learn_both(kernel, ref, 2, 3)
    fast.load_state_dict(copy.deepcopy(saved))   # (an optimizer loads the tensors it is given, not copies)
    ref.load_state_dict(copy.deepcopy(saved))
    _learn_both(kernel, ref, 2, 4)
    _same_state(fast, ref)


def test_a_first_derived_phase_writes_its_losses_on_the_algorithm_not_its_class():
    """An algorithm loaded from a checkpoint runs the derived phase from its first phase, before `learn` ever set
    its own `stats`: the losses are written on it, not into the class-level default every algorithm reads."""
    from hetrl.algorithm import Algorithm

    kernel, fast, ref = _pair("dqn")
    for seed in range(2):
        _learn_both(kernel, ref, 2, seed)
    loaded = make_algorithm(ref.cfg, *DQN_SPACES)
    loaded.load_state_dict(copy.deepcopy(ref.state_dict()))
    k2 = CompiledKernel(loaded)
    _OPEN.append(k2)
    k2.use_threads(1)
    assert "stats" not in vars(loaded)
    _learn_both(k2, ref, 2, 2)
    assert k2.derived.lanes_run and set(loaded.stats) == {"loss"} and Algorithm.stats == {}


def test_a_per_parameter_adam_checkpoint_loads_into_the_flat_optimizer():
    """TD3/SAC checkpoints written with one torch Adam state per parameter resume with the same moments: the flat
    optimizer's state is their concatenation."""
    kernel, fast, ref = _pair("td3", policy_delay=1)
    _learn_both(kernel, ref, 3, 0)
    per = torch.optim.Adam(ref.critics.parameters(), lr=ref.cfg.lr)
    flat_state = ref.critic_opt.state_dict()["state"][0]
    sizes = [p.numel() for p in ref.critics.parameters()]
    for p, m, v in zip(ref.critics.parameters(), flat_state["exp_avg"].split(sizes), flat_state["exp_avg_sq"].split(sizes)):
        per.state[p] = {"step": flat_state["step"].clone(), "exp_avg": m.view_as(p).clone(),
                        "exp_avg_sq": v.view_as(p).clone()}
    state = ref.state_dict()
    state["critic_opt"] = per.state_dict()
    old = make_algorithm(ref.cfg, *AC_SPACES)
    old.load_state_dict(state)
    _same_state(old, ref)


# ---- what it declines -----------------------------------------------------------------------------------
def test_check_takes_the_built_in_algorithms_and_names_what_it_declines():
    for name in ("dqn", "ddpg", "td3", "sac", "crossq"):
        for settings in ({}, {"activation": "tanh", "layer_norm": True}, {"net_arch": [7, 5, 3], "activation": "elu"}):
            cfg = make_config(name, ENV[name], {"net_arch": [8], **settings})
            assert CompiledKernel.check(make_algorithm(cfg, *(DQN_SPACES if name == "dqn" else AC_SPACES))) is None
    # DQN and SAC have no head: their phases (DQN's dueling or not) are derived from their learn
    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [8], "dueling": True})
    dueling = make_algorithm(cfg, *DQN_SPACES)
    assert CompiledKernel.check_path(dueling, "head") == (
        "DQN has no hand-derived head (its phase is derived from its learn)")
    assert CompiledKernel.check(dueling) is None and CompiledKernel.path_for(dueling) == "derived"
    sac = make_algorithm(make_config("sac", "Pendulum-v1", {"net_arch": [8]}), *AC_SPACES)
    assert CompiledKernel.check_path(sac, "head") == "SAC has no hand-derived head (its phase is derived from its learn)"
    assert CompiledKernel.path_for(sac) == "derived"
    pong = make_config("dqn", "ALE/Pong-v5", {"net_arch": []})
    pixels = make_algorithm(pong, gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))
    assert "pixels" in CompiledKernel.check(pixels)
    ddpg = make_algorithm(make_config("ddpg", "Pendulum-v1", {"net_arch": [8, 8]}), *AC_SPACES)
    ddpg.critic.q[1] = nn.Dropout(0.1)   # no parameters: the flat buffer is unchanged
    assert CompiledKernel.check_path(ddpg, "head") == (
        "the critic's layer 1 is a Dropout, which the compiled kernel has no piece for")
    td3 = make_algorithm(make_config("td3", "Pendulum-v1", {"net_arch": [8]}), *AC_SPACES)
    td3.critics[1].q[1] = nn.GELU()
    assert CompiledKernel.check_path(td3, "head") == (
        "critic 2's layer 1 is a GELU, which the compiled kernel has no piece for")
    assert CompiledKernel.check(td3) is None and CompiledKernel.path_for(td3) == "derived"
    with pytest.raises(ValueError, match="critic 2's layer 1 is a GELU"):
        CompiledKernel(td3, path="head")


def test_check_declines_float64_and_a_subclass_gets_the_derived_phase():
    from hetrl.algos.dqn import DQN
    from hetrl.algos.nets import FlatAdam

    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [8]})
    algo = make_algorithm(cfg, *DQN_SPACES)
    algo.q.double()
    algo.opt = FlatAdam(algo.q, 1e-3)
    assert "float64" in CompiledKernel.check(algo) and "float32 on the CPU" in CompiledKernel.check(algo)

    class MyDQN(DQN):   # may change the loss: its head is not used, its own learn is compiled
        pass

    mine = MyDQN(cfg, *DQN_SPACES)
    assert CompiledKernel.check(mine) is None and CompiledKernel.path_for(mine) == "derived"


# ---- acting ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dqn", "ddpg", "td3", "sac"])
@pytest.mark.parametrize("net", ["relu", "tanh-ln"])
def test_acting_equals_the_torch_forward_and_pickles(name, net):
    """wrap_policy swaps the policy's MLPs for CompiledMLPs: the same actions (greedy/mean and exploring, same
    noise), after new weights are loaded, and after the policy is pickled to another process; with autograd on,
    the plain forward runs."""
    from hetrl.kernels.compiled.acting import CompiledMLP

    spaces = DQN_SPACES if name == "dqn" else AC_SPACES
    settings = {"activation": "tanh", "layer_norm": True} if net == "tanh-ln" else {}
    algo = make_algorithm(make_config(name, ENV[name], {"net_arch": [24, 16], **settings}), *spaces)
    kernel = CompiledKernel(algo)
    fast, ref = kernel.wrap_policy(algo.make_policy(seed=3, num_envs=5)), algo.make_policy(seed=3, num_envs=5)
    assert any(isinstance(m, CompiledMLP) for m in fast.net.modules())
    assert fast.net.state_dict().keys() == ref.net.state_dict().keys()
    obs = np.random.default_rng(0).standard_normal((5, spaces[0].shape[0])).astype(np.float32)

    def same(p, q):
        for rows in (obs[:1], obs[:3], obs):   # a few rows multiply in the program's loops, more on the GEMM
            np.testing.assert_allclose(p.act_deterministic(rows), q.act_deterministic(rows), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(p.act(obs, 0.3)[1], q.act(obs, 0.3)[1], rtol=1e-5, atol=1e-6)

    same(fast, ref)
    with torch.no_grad():   # new weights, as the learner publishes them
        for p in (algo.q if name == "dqn" else algo.actor).parameters():
            p.add_(torch.randn_like(p) * 0.3)
    state = {k: v.clone() for k, v in algo.policy_state().items()}
    moved = pickle.loads(pickle.dumps(fast))
    for p in (fast, ref, moved):
        p.load(state)
    same(fast, ref)
    moved.rng, ref.rng = np.random.default_rng(9), np.random.default_rng(9)
    same(moved, ref)
    mlp = next(m for m in moved.net.modules() if isinstance(m, CompiledMLP))
    assert mlp._flat is not None and mlp.gemm == kernel.figures()["gemm"]
    x = torch.from_numpy(obs[:, :mlp.program.n_in]).requires_grad_()
    with torch.no_grad():   # an input that requires grad (no numpy view): the plain forward, the same values
        np.testing.assert_allclose(mlp(x).numpy(), torch.nn.Sequential.forward(mlp, x).numpy(), rtol=1e-5,
                                   atol=1e-6)
        one, rows = mlp(x.detach()[0]), mlp(x.detach())   # one row without its batch dim: an output without one
        assert one.shape == rows.shape[1:]
        np.testing.assert_allclose(one.numpy(), rows[0].numpy(), rtol=1e-5, atol=1e-6)
    mlp(x).sum().backward()   # autograd on: the plain Sequential's forward
    assert x.grad is not None
    kernel.close()


ACT_THERE = r"""
import pickle, sys
import numpy as np
policy = pickle.loads(sys.stdin.buffer.read())
policy.act_deterministic(np.zeros((2, 3), np.float32))
print(sorted(m for m in ("hetrl.kernels.compiled.kernel", "hetrl.kernels.compiled.acting") if m in sys.modules))
"""


def test_an_actor_process_acts_through_the_compiled_pieces_without_the_learner_kernel():
    """A process that unpickles a compiled acting policy (a local or Ray actor) loads the acting pieces, not the
    learner kernel (its VM, heads and tracer: hetrl.kernels.compiled imports it on first use)."""
    algo = make_algorithm(make_config("td3", ENV["td3"], {"net_arch": [24, 16]}), *AC_SPACES)
    kernel = CompiledKernel(algo)
    policy = kernel.wrap_policy(algo.make_policy(seed=3))
    p = subprocess.run([sys.executable, "-c", ACT_THERE], input=pickle.dumps(policy), capture_output=True,
                       timeout=300)
    kernel.close()
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stdout.decode().split("\n")[-2] == "['hetrl.kernels.compiled.acting']"


def test_a_compiled_mlp_follows_parameters_replaced_after_its_first_call():
    """A policy's load may set a parameter anew or swap its data; the next compiled call reads the new values."""
    from hetrl.kernels.compiled.acting import wrap

    net = wrap(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)))
    x = torch.randn(3, 4)

    def check():
        with torch.no_grad():
            np.testing.assert_allclose(net(x), nn.Sequential.forward(net, x), rtol=1e-5, atol=1e-6)

    check()   # the parameters are now views of one flat buffer
    net[0].weight = nn.Parameter(torch.randn(16, 4))
    check()
    net[2].bias.data = torch.randn(2)
    check()
    with torch.no_grad():
        net.load_state_dict({k: v + 1 for k, v in net.state_dict().items()})   # in place: the same buffer
    check()


def test_a_pickled_compiled_mlp_carries_only_its_own_parameters():
    from hetrl.kernels.compiled.acting import wrap

    net = wrap(nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2)))
    with torch.no_grad():
        net(torch.zeros(1, 4))   # parameters become views of one flat buffer
    plain = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2))
    assert len(pickle.dumps(net)) < 1.5 * len(pickle.dumps(plain))


def test_load_weights_copies_a_twin_state_and_refuses_another():
    from hetrl.algos.nets import load_weights, mlp

    a, b = mlp([3, 4, 2]), mlp([3, 4, 2])
    load_weights(b, a.state_dict())
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y) and x.data_ptr() != y.data_ptr()
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_weights(b, mlp([3, 5, 2]).state_dict())


def test_heads_share_their_scratch_per_thread_and_each_still_equals_its_public_learn():
    """Two members with the same shapes, learning in turn on one thread (a population's lane), share one set of
    lane workspaces and each still equals its own public learn; another thread has its own set; the sets go with
    the last head."""
    import gc
    import threading

    from hetrl.kernels.compiled.head import _Scratch

    gc.collect()
    before = _Scratch.heads
    (k1, _, r1), (k2, _, r2) = _pair("ddpg", threads=2), _pair("ddpg", threads=2)
    for seed in range(3):
        _learn_both(k1, r1, 2, seed)
        _learn_both(k2, r2, 2, 10 + seed)
    _same_state(k1.algo, r1)
    _same_state(k2.algo, r2)

    def make():
        return (np.zeros(4, np.float32),)

    mine = k1.head.buffers(("probe",), make)
    assert k2.head.buffers(("probe",), make) is mine
    other = []
    t = threading.Thread(target=lambda h=k2.head: other.append(h.buffers(("probe",), make)))
    t.start()
    t.join()
    assert other[0] is not mine
    assert k2.head.buffers(("probe", 2), make) is not mine   # new shapes: made again
    while _OPEN:
        _OPEN.pop().close()
    del k1, k2, t, _
    gc.collect()
    assert _Scratch.heads == before and (before or not _Scratch.sets)


def test_training_with_the_compiled_kernel(tmp_path):
    """A short inline run on the compiled kernel trains (every gradient step taken), acts through it, and
    records the kernel and its GEMM."""
    import hetrl

    run = hetrl.train("dqn", "CartPole-v1", plan="none", steps=3000, seed=0, out=tmp_path, progress=False,
                      learner_kernel="compiled", learning_starts=1000, eval_episodes=2, threads=1)
    assert run.result["gradient_steps"] >= 1000 and (tmp_path / "checkpoint.pt").exists()
    assert run.result["learner_kernel"] == "compiled" and run.result["gemm"] in ("openblas", "mkl")


# ---- the GEMM and the process's settings ------------------------------------------------------------------
CHECK = r"""
import ctypes, json, os, sys
import numpy as np
from hetrl.kernels.compiled import sgemm
env_before = dict(os.environ)
name = sgemm.bind(None if sys.argv[1] == "-" else sys.argv[1])
rng = np.random.default_rng(0)
worst = 0.0
for m, k, n in [(64, 256, 256), (256, 4, 400), (1, 3, 400), (256, 300, 1), (5, 1, 7), (3, 0, 2)]:
    A, B = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    want = A.astype(np.float64) @ B.astype(np.float64)
    # row-major operands and transposed views (the pieces' W.T and g.T), out whole or a column block of a wider array
    for a in (A, np.ascontiguousarray(A.T).T):
        for b in (B, np.ascontiguousarray(B.T).T):
            wide = np.full((m, n + 3), 7.0, np.float32)
            for out in (np.full((m, n), 7.0, np.float32), wide[:, 1:n + 1]):
                sgemm.dot(a, b, out)
                worst = max(worst, float(np.abs(out - want).max()) if out.size else 0.0)
            assert (wide[:, 0] == 7).all() and (wide[:, n + 1:] == 7).all()
            acc = np.ones((m, n), np.float32)
            sgemm.gemm(a, b, acc, np.float32(1.0))   # out += a @ b
            worst = max(worst, float(np.abs(acc - want - 1).max()) if acc.size else 0.0)
local = None
if name == "mkl":   # the per-call one-thread limit is lifted again: torch's own MKL calls keep torch's count
    local = sgemm._fn(sgemm.candidates()["mkl"][1], ctypes.c_int, ctypes.c_int)(0)
try:
    sgemm.bind("openblas" if name == "mkl" else "mkl")
    again = "rebound"
except Exception as e:
    again = str(e)
print(json.dumps({"name": name, "worst": worst, "local": local, "env_same": dict(os.environ) == env_before,
                  "again": again, "report": sgemm.report()}))
"""


def _run(code, *args, env_value=None, cache_dir=None):
    env = {k: v for k, v in os.environ.items() if k != sgemm.ENV}
    if env_value:
        env[sgemm.ENV] = env_value
    if cache_dir is not None:
        env["HETRL_CACHE_DIR"] = str(cache_dir)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", sgemm.candidates())
def test_dot_equals_numpy_on_each_gemm_chosen_explicitly(name):
    """dot gives A @ B (and gemm A @ B + C) for row-major and transposed operands and a strided out, on each
    GEMM (a fresh process each: the choice is bound once per process, and another cannot be bound after); the
    choice is the argument, and nothing is written into os.environ."""
    p = _run(CHECK, name)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["name"] == name and got["worst"] < 1e-3 and got["local"] in (None, 0) and got["env_same"]
    assert "already multiply on" in got["again"] or "mkl" not in sgemm.candidates()


RECORDED_OTHER = r"""
import json, sys
import gymnasium as gym
from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels.compiled import CompiledKernel, sgemm
first = sgemm.bind(sys.argv[1])
other = "openblas" if first == "mkl" else "mkl"
e = gym.make("CartPole-v1")
k = CompiledKernel(make_algorithm(make_config("dqn", "CartPole-v1", {"net_arch": [8]}), e.observation_space,
                                  e.action_space), gemm=other)
print(json.dumps({"first": first, **k.figures()}))
k.close()
"""


@pytest.mark.skipif("mkl" not in sgemm.candidates(), reason="one GEMM only in this torch build")
def test_a_recorded_gemm_other_than_the_bound_one_runs_on_the_bound_one_and_says_so():
    """A run whose recorded choice (machine cache, checkpoint) names the GEMM another kernel of this process did not
    bind runs on the bound one, with a warning line and the reason in its figures (result.json's gemm_note)."""
    p = _run(RECORDED_OTHER, "mkl")
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["gemm"] == got["first"] == "mkl" and "not the recorded openblas" in got["gemm_note"]
    assert "warning: the compiled kernel multiplies on mkl, not the recorded openblas" in p.stderr


@pytest.mark.skipif("mkl" not in sgemm.candidates(), reason="one GEMM only in this torch build")
def test_the_gemm_is_probed_once_per_machine_and_later_processes_bind_that_one(tmp_path):
    """bind(None) in a machine's first process probes both GEMMs, on wide products and on thin ones (sgemm.THIN),
    and records the faster of each in the machine's kernel cache; a later process binds the recorded ones without a
    probe, so every learner shape whose kernel is measured later runs on the same GEMMs; HETRL_SGEMM pins both."""
    def bound(pin=None):
        p = _run(CHECK, "-", env_value=pin, cache_dir=tmp_path)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    first = bound()
    assert first["report"]["by"] == "probe" and {"mkl_s", "openblas_s"} <= set(first["report"])
    assert {"thin_mkl_s", "thin_openblas_s"} <= set(first["report"]) and first["report"]["thin"] in ("mkl", "openblas")
    cache = next(tmp_path.glob("kernels-*.json"))
    data = json.loads(cache.read_text())
    assert data["gemm"]["name"] == first["name"] and data["gemm"]["thin_name"] == first["report"]["thin"]
    other = "openblas" if first["name"] == "mkl" else "mkl"
    thin_other = "openblas" if first["report"]["thin"] == "mkl" else "mkl"
    data["gemm"]["name"], data["gemm"]["thin_name"] = other, thin_other   # the record decides, not a probe
    cache.write_text(json.dumps(data))
    second = bound()
    assert second["name"] == other and second["report"]["by"] == "machine" and "mkl_s" not in second["report"]
    assert second["report"]["thin"] == thin_other and "thin_mkl_s" not in second["report"]
    pinned = bound(pin=first["name"])
    assert pinned["name"] == pinned["report"]["thin"] == first["name"] and pinned["worst"] < 1e-3


def test_hetrl_sgemm_pins_the_choice_and_an_unknown_name_is_one_line(monkeypatch):
    """HETRL_SGEMM is read, never written: it wins over the choice asked for (no error for another name while it
    pins the bound one); an unknown name there or asked for is one line."""
    from hetrl.errors import UsageError

    bound = sgemm.bind()
    monkeypatch.setenv(sgemm.ENV, bound)
    assert sgemm.pinned() == bound and sgemm.bind("openblas" if bound == "mkl" else "mkl") == bound
    monkeypatch.setenv(sgemm.ENV, "nosuchblas")
    with pytest.raises(UsageError, match="HETRL_SGEMM=nosuchblas: not a GEMM hetrl knows"):
        sgemm.pinned()
    monkeypatch.delenv(sgemm.ENV)
    with pytest.raises(UsageError, match="gemm='fast': not a GEMM hetrl knows"):
        sgemm.bind("fast")


def test_dot_refuses_what_blas_cannot_read_and_mismatched_shapes():
    sgemm.bind()
    a, b = np.ones((4, 6), np.float32), np.ones((6, 5), np.float32)
    with pytest.raises(ValueError, match="shapes"):
        sgemm.dot(a, b, np.empty((4, 4), np.float32))
    with pytest.raises(ValueError, match="in place"):
        sgemm.dot(a[:, ::2], b[:3], np.empty((4, 5), np.float32))   # a column stride BLAS has no argument for


def test_time_gemm_runs_each_candidate():
    """time_gemm runs each candidate's products (what bind() compares) and returns their time."""
    for g, loc in sgemm.candidates().values():
        assert sgemm.time_gemm(g, loc, shapes=((8, 16, 8),), reps=2, rounds=1) > 0


SETTINGS = r"""
import json, sys, torch, numba, gymnasium as gym
from threadpoolctl import threadpool_info
torch.set_num_threads(1)
from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels.compiled import CompiledKernel, sgemm

def blas():
    return sorted((i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")

algo = make_algorithm(make_config("dqn", "CartPole-v1", {"net_arch": [8]}), gym.spaces.Box(-1, 1, (4,)),
                      gym.spaces.Discrete(2))
sgemm.bind(sys.argv[1])
blas_before = blas()
k = CompiledKernel(algo, gemm=sys.argv[1], lane_guard=False)   # compiles: numba's first parallel launch
compiled = torch.get_num_threads()
torch.set_num_threads(2)
before = (2, numba.get_num_threads(), blas_before)
k.use_threads(2)
g = torch.Generator().manual_seed(0)
b = {"obs": torch.randn(2, 8, 4, generator=g), "action": torch.randint(0, 2, (2, 8), generator=g),
     "reward": torch.randn(2, 8), "next_obs": torch.randn(2, 8, 4), "terminated": torch.zeros(2, 8, dtype=torch.bool),
     "truncated": torch.zeros(2, 8, dtype=torch.bool), "steps": torch.ones(2, 8, dtype=torch.uint8)}
k.learn(b, torch.ones(2, 8))
during = (torch.get_num_threads(), numba.get_num_threads(), blas())
k.close()
after = (torch.get_num_threads(), numba.get_num_threads(), blas())
print(json.dumps({"compiled": compiled, "before": before, "during": during, "after": after, "figures": k.figures()}))
"""


def test_close_restores_the_thread_settings_it_changed():
    """Compiling keeps torch's thread count (numba's parallel regions share torch's OpenMP runtime, and their first
    launch in a process set the count torch reads to numba's). During a run torch keeps one thread (the lanes are
    the kernel's threads) and OpenBLAS, as the GEMM, one (its calls come from the lanes); close() gives back
    torch's count and OpenBLAS's, and numba's is never left changed."""
    env = {k: v for k, v in os.environ.items() if k != "HETRL_SGEMM"}   # (a pin would name the GEMM over the argument)
    p = subprocess.run([sys.executable, "-c", SETTINGS, "openblas"], capture_output=True, text=True, timeout=300,
                       env={**env, "NUMBA_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["compiled"] == 1
    assert got["before"] == got["after"] and got["during"][0] == 1 and got["during"][1] == got["before"][1]
    assert got["figures"].pop("gemm_thin") in ("openblas", "mkl")   # (the machine's choice for thin products)
    assert got["figures"] == {"gemm": "openblas", "lanes": 2, "path": "derived"}
    assert any(n == 1 for _, n in got["during"][2]) and got["during"][2] != got["before"][2]


def test_use_threads_and_close_in_this_process():
    threads = torch.get_num_threads()
    kernel, fast, ref = _pair("dqn", 2)
    assert torch.get_num_threads() == 1
    _learn_both(kernel, ref, 2, 0)
    kernel.close()
    assert torch.get_num_threads() == threads
    kernel.close()   # (twice: nothing more)
    assert torch.get_num_threads() == threads


def test_kernels_closed_in_the_order_they_were_opened_give_torch_its_threads_back():
    """Two kernels in one process (a population's members, a kernel timed beside another), each running at the
    learner's threads, closed first-opened first: torch has the count it had before the first, not the one the
    second found (one thread, held by the first)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (k1, _, r1), (k2, _, r2) = _pair("dqn", 2), _pair("dqn", 2)
        _learn_both(k1, r1, 2, 0)
        _learn_both(k2, r2, 2, 1)
        assert torch.get_num_threads() == 1
        k1.close()
        assert torch.get_num_threads() == 1   # (k2 still runs phases)
        k2.close()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
