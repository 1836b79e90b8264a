"""The compiled kernel derived from an algorithm's own learn (hetrl/kernels/compiled/{trace,graph,program,vm,derived}.py)
takes algorithms it has never seen: a user's QR-DQN registered from outside hetrl, a subclass of a built-in,
docs/extending.md's TwinQ; it is equal to their public learn, bit-identical on one and two threads, declines in one
line what it cannot lower, and a later process compiles nothing."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qrdqn_example  # noqa: F401  (registers "qrdqn")
from hetrl.algos import learn_spec, make_algorithm
from hetrl.algos.ppo import PPO
from hetrl.algos.sac import SAC
from hetrl.config import make_config
from hetrl.kernels import check_equal, select, synthetic_batch
from hetrl.kernels.compiled import CompiledKernel, available, vm

pytestmark = pytest.mark.skipif(available() is not None, reason="numba/scipy not installed")

CARTPOLE = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))


def _maker(name, **settings):
    cfg = make_config(name, "CartPole-v1", {"net_arch": [32, 32], **settings})
    return lambda: make_algorithm(cfg, *CARTPOLE)


def _phases(make, K=4, B=64, n=3, seed=0, spaces=CARTPOLE):
    spec = learn_spec(make().cfg, *spaces)
    g = torch.Generator().manual_seed(seed)
    return [synthetic_batch(spec, spaces[1], B, K, "cpu", g)[0] for _ in range(n)], torch.ones(K, B)


def _equal_on_the_derived_path(make, spaces=CARTPOLE, **kw):
    """Checked equal to the public learn, and the phases then run derived (not the public learn in its place)."""
    phases, weights = _phases(make, spaces=spaces, **kw)
    ok, detail = check_equal(make, CompiledKernel, phases, weights)
    assert ok and not detail.get("declined"), detail
    kernel = CompiledKernel(make())
    try:
        assert kernel.path == "derived" and kernel.threads_exact
        for b in phases:
            kernel.learn(b, weights)
        assert kernel.declined is None and kernel.derived.lanes_run, (kernel.declined, kernel.derived.lanes_run)
    finally:
        kernel.close()


def test_a_users_qrdqn_is_taken_checked_equal_and_chosen_by_the_gate():
    make = _maker("qrdqn", n_quantiles=16)
    _equal_on_the_derived_path(make)
    spec = type(make()).replay_fields(*CARTPOLE)
    choice = select(make, spec, CARTPOLE[1], 64, 4, "cpu", candidates=("public", "compiled"))
    assert "compiled" in choice.checked and not choice.declined and not choice.differs, choice
    assert set(choice.s_per_update) == {"public", "compiled"}


def test_a_subclass_of_a_built_in_that_changes_its_loss_is_compiled():
    from hetrl.algos.dqn import DQN
    import torch.nn.functional as F

    class MSEDQN(DQN):   # the same DQN with a squared loss: its head would be wrong, the derived phase is not
        def learn(self, batches, weights):
            td_all = torch.empty_like(weights)
            for k in range(weights.shape[0]):
                b = {key: v[k] for key, v in batches.items()}
                target = self._targets(b)
                q = self.q(b["obs"]).gather(-1, b["action"].long().unsqueeze(-1)).squeeze(-1)
                self.opt.step((weights[k] * F.mse_loss(q, target, reduction="none")).mean())
                td_all[k] = (q - target).detach().abs()
            self.updates += weights.shape[0]
            return td_all

    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [32, 32]})
    _equal_on_the_derived_path(lambda: MSEDQN(cfg, *CARTPOLE))


def test_docs_extending_twinq_is_compiled():
    import extending_example  # noqa: F401  (registers "twinq")

    _equal_on_the_derived_path(_maker("twinq"))


@pytest.mark.parametrize("projection", ["scatter_add_", "index_add_"])
def test_a_users_c51_that_writes_into_a_tensor_of_zeros_is_compiled(projection):
    """Also `torch.arange(B)` as the rows' index, in two row blocks (B=128): the second block counts from row 64."""
    import c51_example  # noqa: F401  (registers "c51")

    _equal_on_the_derived_path(_maker("c51", n_quantiles=11, v_min=-10.0, v_max=10.0, projection=projection), B=128)


class DropoutQRDQN(qrdqn_example.QRDQN):
    """Draws from torch's default generator, as nn.Dropout (DroQ) and CleanRL's SAC (Normal.rsample) do."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for net in (self.q, self.q_target):
            net.body.insert(2, torch.nn.Dropout(0.1))


def test_draws_from_torchs_default_generator_are_replayed_and_tracing_takes_none():
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [32, 32], "n_quantiles": 8})
    make = lambda: DropoutQRDQN(cfg, *CARTPOLE)   # noqa: E731
    _equal_on_the_derived_path(make)
    phases, weights = _phases(make)
    states = []
    for compiled in (False, True):   # no reseeding between phases: the stream after them is the same
        torch.manual_seed(0)
        algo = make()
        kernel = CompiledKernel(algo) if compiled else None
        try:
            for b in phases:
                (kernel or algo).learn(b, weights)
            assert not compiled or kernel.path == "derived" and not kernel.declined
        finally:
            if kernel:
                kernel.close()
        states.append(torch.get_rng_state())
    assert torch.equal(*states)


class SlicedQuantileNet(qrdqn_example.QuantileNet):
    """Outputs taken apart by slices and put back, as a shared trunk's heads are (`out[:, :A]`, `out[:, -1]`): the
    gradient of a slice is a slice_scatter; and an atanh, as a squashed action's log-probability has."""

    def forward(self, obs):
        out = self.body(obs)
        n = out.shape[-1] // 2
        out = torch.cat([out[..., :n] * 2.0, torch.atanh(torch.tanh(out[..., n::2]) * 0.9), out[..., n + 1::2]], -1)
        out = torch.select_scatter(out, out[..., 0] + out[..., -1], -1, 0)
        return out.view(*obs.shape[:-1], self.n_actions, self.n_quantiles)


class SlicedQRDQN(qrdqn_example.QRDQN):
    net_class = SlicedQuantileNet

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.q = self.net_class(self.obs_dim, self.n, self.cfg)
        self.q_target = self.net_class(self.obs_dim, self.n, self.cfg)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.opt = torch.optim.Adam(self.q.parameters(), lr=self.cfg.lr)


def test_slices_of_a_tensor_that_needs_its_gradient_are_compiled():
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [32, 32], "n_quantiles": 8})
    _equal_on_the_derived_path(lambda: SlicedQRDQN(cfg, *CARTPOLE))


class SortedQuantileNet(qrdqn_example.QuantileNet):
    """Quantiles kept in order by sorting them (non-crossing quantiles), and all but each row's top two taken by
    topk, as TQC truncates its critics' sorted mixture (torch.sort and torch.topk, forward and backward; ties in
    the stable indices)."""

    def forward(self, obs):
        z = super().forward(obs)
        ties = torch.sort(torch.round(z.detach()), dim=-1, stable=True).indices.float()
        low = -torch.topk(-z, z.shape[-1] - 2, dim=-1).values   # all but the top two, smallest first
        return torch.sort(z, dim=-1).values + 1e-3 * ties + 0.1 * low.mean(-1, keepdim=True)


class SortedQRDQN(SlicedQRDQN):
    net_class = SortedQuantileNet


def test_sort_and_topk_are_compiled():
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [32, 32], "n_quantiles": 8})
    _equal_on_the_derived_path(lambda: SortedQRDQN(cfg, *CARTPOLE))


def _same_bits(one, two):
    """Two runs' (|TD| per phase, state_dict) of a QR-DQN: the same bits."""
    (td1, s1), (td2, s2) = one, two
    assert all(torch.equal(a, b) for a, b in zip(td1, td2))
    p1, p2 = s1["nets"]["q"] if "nets" in s1 else s1["q"], s2["nets"]["q"] if "nets" in s2 else s2["q"]
    assert all(torch.equal(p1[k], p2[k]) for k in p1)


@pytest.mark.parametrize("B,arch", [(128, [32, 32]), (64, [256, 256])], ids=["row-blocks", "column-halves"])
def test_one_and_two_threads_give_the_same_bits(B, arch):
    """Rows run in fixed blocks whose partial sums are added in a fixed order, whatever the number of lanes; a batch
    of one row block runs its wide products in two fixed halves of their columns (checked equal to the public learn)."""
    make = _maker("qrdqn", n_quantiles=8, net_arch=arch)
    if B == 64:
        _equal_on_the_derived_path(make, K=2, B=B)
    phases, weights = _phases(make, K=2 if B == 64 else 4, B=B)
    results = []
    for threads in (1, 2):
        torch.manual_seed(0)
        algo = make()
        kernel = CompiledKernel(algo)
        try:
            kernel.use_threads(threads)
            tds = [kernel.learn(b, weights) for b in phases]
            assert kernel.figures()["lanes"] == threads and kernel.declined is None
            assert kernel.derived.lanes_run.get(threads), kernel.derived.lanes_run   # (2: the governor's first)
            INS = kernel.derived.unit_for(phases[0], weights)[0].prog.INS
            halves = (INS[:, vm.I_KIND] == vm.K_GEMM) & (INS[:, vm.I_SPLIT] == 1) & (INS[:, vm.I_NB] == 2)
            assert halves.any() == (B == 64)
        finally:
            kernel.close()
        results.append((tds, algo.state_dict()))
    _same_bits(*results)


def test_the_fused_loops_give_the_interpreters_bits(monkeypatch):
    """The large elementwise passes run as generated fused loops (fused.py); the same phases with every pass on the
    interpreter give the same bits."""
    from hetrl.kernels.compiled import derived

    make = _maker("qrdqn", n_quantiles=8, net_arch=[64, 64])
    phases, weights = _phases(make, K=2, B=64)
    results = []
    for on in ("1", "0"):
        monkeypatch.setenv("HETRL_FUSED", on)
        monkeypatch.setattr(derived, "_PROGRAMS", {})
        torch.manual_seed(0)
        algo = make()
        kernel = CompiledKernel(algo)
        try:
            tds = [kernel.learn(b, weights) for b in phases]
            assert kernel.path == "derived" and kernel.declined is None
            fused = sum(u.fused for u in derived._PROGRAMS.values())
            assert (fused > 0) == (on == "1"), fused
        finally:
            kernel.close()
        results.append((tds, algo.state_dict()))
    _same_bits(*results)


def test_temporaries_inside_one_job_share_memory_and_the_bits_stay(monkeypatch):
    """A row job's temporaries that no later segment reads share arena slabs in the job's order (a target network's
    activations): a smaller arena, and the same bits on two lanes, whose tasks run a job's blocks at once."""
    from hetrl.kernels.compiled import derived, program

    make = _maker("qrdqn", n_quantiles=8, net_arch=[64, 64])
    phases, weights = _phases(make, K=4, B=128)
    results, arenas = [], []
    for slabs in (True, False):
        monkeypatch.setattr(program, "JOB_SLABS", slabs)
        monkeypatch.setattr(derived, "_PROGRAMS", {})
        torch.manual_seed(0)
        algo = make()
        kernel = CompiledKernel(algo)
        try:
            kernel.use_threads(2)
            tds = [kernel.learn(b, weights) for b in phases]
            assert kernel.path == "derived" and kernel.declined is None and kernel.derived.lanes_run.get(2)
            arenas.append(sum(u.prog.arena_bytes for u in derived._PROGRAMS.values()))
        finally:
            kernel.close()
        results.append((tds, algo.state_dict()))
    assert arenas[0] < arenas[1], arenas
    _same_bits(*results)


def test_the_lane_governor_drops_to_one_lane_where_it_is_faster_and_tries_again():
    """A phase's bits do not depend on its lanes, so the lanes follow the clock: the first phases alternate n and
    one, then n while n is not slower than one, one lane while it is faster (a small phase, a core another process
    holds); the other count is tried at once where the chosen one's times shift, and at doubling gaps otherwise."""
    from hetrl.kernels.compiled.derived import Lanes

    gov, now = Lanes(2), 0.0

    def phases(count, two, one, step=0.01):
        nonlocal now
        picks = []
        for _ in range(count):
            now += step
            k = gov.pick(now)
            picks.append(k)
            gov.record(k, two if k == 2 else one, now)
        return picks

    assert phases(2 * Lanes.KEEP, 1.0, 2.0) == [2, 1] * Lanes.KEEP
    assert gov.use == 2                     # two lanes twice as fast: kept
    picks = phases(400, 1.0, 2.0)           # one lane tried one phase at a time, at gaps that double
    assert 2 <= picks.count(1) <= 5 and gov.use == 2 and gov.gap == Lanes.GAP_MAX_S
    picks = phases(2 + Lanes.KEEP, 3.0, 2.0)    # a core taken: two lanes slower than one was, tried at once
    assert gov.use == 1 and picks == [2, 2] + [1] * Lanes.KEEP
    picks = phases(40, 3.0, 2.0)            # no n-lane phase but the tries
    assert picks.count(2) <= 2
    picks = phases(400, 1.0, 2.0)           # the core given back: a try sees it, two lanes again
    assert picks[-1] == 2 and gov.use == 2


def test_a_phase_with_nothing_for_a_second_lane_runs_one_lane_from_its_first_phase():
    """A program none of whose segments holds two tasks (a small batch: one row block) gives a second lane nothing
    to do but wait: it runs one lane from its first phase, without timing two."""
    from hetrl.kernels.compiled import derived
    from hetrl.kernels.compiled.derived import lane_share

    make = _maker("qrdqn", n_quantiles=8)
    phases, weights = _phases(make, K=2, B=64, n=4)
    kernel = CompiledKernel(make())
    try:
        kernel.use_threads(2)
        for b in phases:
            kernel.learn(b, weights)
        ((uid, _), gov), = kernel.derived._lanes.items()
        assert gov.fixed and kernel.derived.lanes_run == {1: len(phases) - 1}   # (the first: the public learn)
        (unit,) = [u for u in derived._PROGRAMS.values() if id(u) == uid]
        assert lane_share(unit.prog, 2) == 0.0
    finally:
        kernel.close()
    big = CompiledKernel(make())      # 256 rows: four row blocks, which two lanes share
    try:
        big.use_threads(2)
        b2, w2 = _phases(make, K=2, B=256, n=2)
        for b in b2:
            big.learn(b, w2)
        (gov,) = big.derived._lanes.values()
        assert not gov.fixed and big.derived.lanes_run == {2: 1}
    finally:
        big.close()


class _Reads:   # learn that reads a tensor's value in Python
    def learn(self, batches, weights):
        td = qrdqn_example.QRDQN.learn(self, batches, weights)
        if td.mean().item() > 1e30:
            self.updates += 0
        return td


class ReadsQRDQN(_Reads, qrdqn_example.QRDQN):
    pass


class MedianQRDQN(qrdqn_example.QRDQN):
    def learn(self, batches, weights):
        batches = dict(batches, reward=torch.median(batches["reward"], 1).values.unsqueeze(1) * 0 + batches["reward"])
        return super().learn(batches, weights)


class NumpyDrawQRDQN(qrdqn_example.QRDQN):   # a random choice made in Python each update (as REDQ's critic subset)
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.np_rng = np.random.default_rng(0)

    def learn(self, batches, weights):
        batches = dict(batches, reward=batches["reward"] * float(self.np_rng.uniform(0.9, 1.1)))
        return super().learn(batches, weights)


class EveryThirdQRDQN(qrdqn_example.QRDQN):   # a target copy every 3 updates inside learn, graph_period() left at 1
    def learn(self, batches, weights):
        td = torch.empty_like(weights)
        for k in range(weights.shape[0]):
            td[k:k + 1] = super().learn({x: v[k:k + 1] for x, v in batches.items()}, weights[k:k + 1])
            if self.updates % 3 == 0:
                self.q_target.load_state_dict(self.q.state_dict())
        return td


@pytest.mark.parametrize("cls, says", [(ReadsQRDQN, "reads a tensor's value in Python"),
                                       (EveryThirdQRDQN, "takes self.updates % 3 at test_compiler.py"),
                                       (MedianQRDQN, "aten.median"),
                                       (NumpyDrawQRDQN, "draws from self.np_rng, which a compiled phase would "
                                                        "replay as one fixed draw")])
def test_what_cannot_be_lowered_is_one_line_naming_the_op_and_the_algorithm(cls, says):
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [16], "n_quantiles": 4})
    make = lambda: cls(cfg, *CARTPOLE)   # noqa: E731
    assert CompiledKernel.check(make()) is None   # found only by tracing its learn
    spec = type(make()).replay_fields(*CARTPOLE)
    choice = select(make, spec, CARTPOLE[1], 32, 2, "cpu", candidates=("public", "compiled"))
    line = choice.declined.get("compiled", "")
    assert choice.name == "public" and says in line and cls.__qualname__ in line and "\n" not in line, line
    assert any(line in e for e in choice.explain())


def test_what_a_phase_declines_is_in_the_kernels_figures():
    """What is found only at a phase (here a read of a tensor's value) runs the public learn from then on, and the
    kernel's figures (which the run's result.json holds) say why, in one line."""
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [16], "n_quantiles": 4})
    kernel = CompiledKernel(ReadsQRDQN(cfg, *CARTPOLE))
    try:
        phases, weights = _phases(lambda: ReadsQRDQN(cfg, *CARTPOLE), K=2, B=32)
        assert "learner_kernel_declined" not in kernel.figures()
        for b in phases:
            kernel.learn(b, weights)
        line = kernel.figures()["learner_kernel_declined"]
        assert line == kernel.declined and "ReadsQRDQN" in line and "\n" not in line
    finally:
        kernel.close()


def test_a_generator_draw_torch_cannot_trace_names_the_torch_that_can():
    """torch before 2.13 cannot trace `torch.randn(..., generator=g)` (fx: "argument of type: <class
    'torch._C.Generator'>"); the declined line says which torch can, and says nothing more where the torch is 2.13."""
    from hetrl.kernels.compiled.trace import generator_hint

    msg = "argument of type: <class 'torch._C.Generator'>"
    hint = generator_hint(msg, "2.11.0+cu130")
    assert "torch 2.11.0 cannot trace a draw from a torch.Generator" in hint and "pip install torch==2.13.0" in hint
    assert generator_hint(msg, "2.13.0+cpu") == "" and generator_hint("aten.median has no lowering", "2.11.0") == ""


def test_a_pinned_compiled_kernel_trains_a_users_algorithm(tmp_path):
    import hetrl

    run = hetrl.train("qrdqn", "CartPole-v1", plan="none", steps=1500, seed=0, out=tmp_path, progress=False,
                      learner_kernel="compiled", learning_starts=500, train_freq=100, gradient_steps=20,
                      eval_episodes=0, threads=1, n_quantiles=8, net_arch=[32, 32])
    assert run.result["learner_kernel"] == "compiled" and run.result["gradient_steps"] >= 200
    assert "declined" not in json.dumps(run.result)


def test_a_populations_members_trace_their_first_phases_one_at_a_time(monkeypatch):
    """A population's members learn from threads, and each traces its own first derived phase (its seed is in its
    settings): the traces take turns (make_fx's tracing state is global to the process; two at once failed one of
    them, whose member then ran its public learn)."""
    import threading
    import time

    from hetrl.kernels.compiled import derived

    inside, most, lock = [0], [0], threading.Lock()
    trace = derived.trace_unit

    def counted(*args):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.2)   # (a window in which another member's trace would start)
        try:
            return trace(*args)
        finally:
            with lock:
                inside[0] -= 1
    monkeypatch.setattr(derived, "trace_unit", counted)
    kernels = []
    for seed in (1, 2):
        cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [32], "n_quantiles": 4, "seed": seed})
        kernels.append(CompiledKernel(make_algorithm(cfg, *CARTPOLE)))
    phases, weights = _phases(_maker("qrdqn", n_quantiles=4, net_arch=[32]), K=2, B=32, n=2)
    for k in kernels:
        k.learn(phases[0], weights)   # (the first phase is the public learn: it makes the optimizers' state)
    threads = [threading.Thread(target=k.learn, args=(phases[1], weights)) for k in kernels]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert most[0] == 1 and all(k.declined is None and k.path == "derived" for k in kernels)
        assert len({id(k.derived.unit_for(phases[1], weights)[0]) for k in kernels}) == 2   # a trace each
    finally:
        for k in kernels:
            k.close()


SECOND = r"""
import sys, json, torch
sys.path.insert(0, sys.argv[1])
import qrdqn_example
from hetrl.algos import make_algorithm
from hetrl.config import make_config
from hetrl.kernels import synthetic_batch
from hetrl.kernels.compiled import CompiledKernel, fused, vm
import gymnasium as gym
spaces = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
algo = make_algorithm(make_config("qrdqn", "CartPole-v1", {"net_arch": [64], "n_quantiles": 4}), *spaces)
kernel = CompiledKernel(algo)
spec = type(algo).replay_fields(*spaces)
for _ in range(2):
    kernel.learn(synthetic_batch(spec, spaces[1], 32, 2, "cpu")[0], torch.ones(2, 32))
print(json.dumps({"misses": sum(f.stats.cache_misses.get(s, 0) for f in (vm.run_phase,) for s in f.signatures),
                  "declined": kernel.declined, "path": kernel.path, "loops": len(fused._LOOPS),
                  "compiled": fused.COMPILED[0]}))
"""


def test_a_second_process_compiles_nothing():
    """numba's on-disk cache holds the VM (every program is data for it) and the fused loops (one per signature): a
    process after the first loads them."""
    make = _maker("qrdqn", n_quantiles=4, net_arch=[64])
    phases, weights = _phases(make, K=2, B=32)
    kernel = CompiledKernel(make())     # (this process compiles or loads the VM: its cache is written)
    try:
        for b in phases:
            kernel.learn(b, weights)
    finally:
        kernel.close()
    here = str(Path(__file__).parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(here).parent), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", SECOND, here], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got.pop("loops") > 0, got
    assert got == {"misses": 0, "declined": None, "path": "derived", "compiled": 0}, got


def test_a_network_or_optimizer_changed_after_construction_is_traced_again():
    """Programs are shared by algorithms of one class and settings: a layer or an optimizer replaced on one object
    makes another program (here: RMSprop, and GELU / SiLU / Softplus hidden activations)."""
    from torch import nn

    def rmsprop(a):
        a.opt = torch.optim.RMSprop(a.q.parameters(), lr=1e-3)

    def activations(a):
        a.q.body[1], a.q.body[3] = nn.GELU(), nn.SiLU()
        a.q_target.body[1], a.q_target.body[3] = nn.Softplus(), nn.Sigmoid()

    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [16, 16], "n_quantiles": 4})
    for edit in (None, rmsprop, activations):
        def make(edit=edit):
            a = make_algorithm(cfg, *CARTPOLE)
            if edit is not None:
                edit(a)
            return a
        phases, weights = _phases(make, K=2, B=32)
        ok, detail = check_equal(make, CompiledKernel, phases, weights)
        assert ok and not detail.get("declined"), (edit, detail)


def test_a_phase_follows_state_tensors_replaced_or_given_new_memory_between_phases():
    """A phase keeps the addresses it bound while each state tensor is the same object on the same memory: a
    parameter given new memory (`p.data = ...`), an optimizer's state loaded from a checkpoint, a batch refilled in
    place and new batch tensors are all what the next phase reads and steps."""
    make = _maker("qrdqn", n_quantiles=8)
    phases, weights = _phases(make, K=2, B=32, n=6)
    fast, ref = make(), make()
    ref.load_state_dict(fast.state_dict())
    kernel = CompiledKernel(fast)
    batch = {k: torch.zeros_like(v) for k, v in phases[0].items()}
    try:
        for i, b in enumerate(phases):
            if i == 3:
                for algo in (fast, ref):
                    for p in algo.q.parameters():
                        p.data = p.data.clone()
            if i == 4:
                saved = ref.state_dict()   # (its tensors are the live ones, and an optimizer loads what it is given)
                for algo in (fast, ref):
                    algo.load_state_dict(copy.deepcopy(saved))
            fed = b   # (new tensors, or the one set refilled)
            if i % 2:
                for k, v in b.items():
                    batch[k].copy_(v)
                fed = batch
            torch.testing.assert_close(kernel.learn(fed, weights), ref.learn(b, weights), rtol=1e-5, atol=1e-5)
        assert kernel.derived.lanes_run and kernel.declined is None
        for (k, a), (_, c) in zip(sorted(fast.q.state_dict().items()), sorted(ref.q.state_dict().items())):
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5, msg=k)
    finally:
        kernel.close()


def test_a_policy_without_a_net_attribute_acts_as_it_is():
    import extending_example  # noqa: F401  (registers "twinq")

    algo = _maker("twinq")()
    kernel = CompiledKernel(algo)
    try:
        policy = algo.make_policy(seed=0)
        assert kernel.wrap_policy(policy) is policy
        policy.act(torch.zeros(2, 4).numpy(), 0.0)
    finally:
        kernel.close()


class CleanRLSAC(SAC):
    """SAC's update as CleanRL's sac_continuous_action.py writes it: torch.optim.Adam, Normal(mean, std).rsample()
    from torch's global generator, log(1 - tanh^2 + 1e-6), two actor and alpha steps every other update, and the
    Polyak average through `.data`. (The built-in's own optimizers are replaced, as a user's subclass would.)"""
    optims = ("q_optimizer", "actor_optimizer", "a_optimizer")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        q1, q2 = self.critics
        self.q_optimizer = torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=self.cfg.lr)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=self.cfg.lr)
        self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=self.cfg.lr)
        self.critic_opt = self.actor_opt = self.alpha_opt = None

    def graph_period(self) -> int:
        return 2

    def get_action(self, obs):
        mean, log_std = self.actor(obs)
        normal = torch.distributions.Normal(mean, log_std.exp())
        x = normal.rsample()
        y = torch.tanh(x)
        return y, (normal.log_prob(x) - torch.log(1 - y.pow(2) + 1e-6)).sum(1)

    def learn(self, batches, weights):
        cfg, td_all = self.cfg, torch.empty_like(weights)
        (q1, q2), (t1, t2) = self.critics, self.critics_target
        for k in range(weights.shape[0]):
            b = {key: v[k] for key, v in batches.items()}
            alpha = self.log_alpha.detach().exp()
            with torch.no_grad():
                next_a, next_logp = self.get_action(b["next_obs"])
                min_q = torch.min(t1(b["next_obs"], next_a), t2(b["next_obs"], next_a)) - alpha * next_logp
                next_q = b["reward"] + (~b["terminated"]).float() * cfg.gamma * min_q
            q1v, q2v = q1(b["obs"], b["action"]), q2(b["obs"], b["action"])
            qf_loss = F.mse_loss(q1v, next_q) + F.mse_loss(q2v, next_q)
            self.q_optimizer.zero_grad()
            qf_loss.backward()
            self.q_optimizer.step()
            if self.updates % 2 == 0:
                for _ in range(2):
                    pi, logp = self.get_action(b["obs"])
                    actor_loss = (alpha * logp - torch.min(q1(b["obs"], pi), q2(b["obs"], pi))).mean()
                    self.actor_optimizer.zero_grad()
                    actor_loss.backward()
                    self.actor_optimizer.step()
                    with torch.no_grad():
                        _, logp = self.get_action(b["obs"])
                    alpha_loss = (-self.log_alpha.exp() * (logp + self.target_entropy)).mean()
                    self.a_optimizer.zero_grad()
                    alpha_loss.backward()
                    self.a_optimizer.step()
                    alpha = self.log_alpha.detach().exp()
            for net, target in ((q1, t1), (q2, t2)):
                for p, tp in zip(net.parameters(), target.parameters()):
                    tp.data.copy_(cfg.tau * p.data + (1 - cfg.tau) * tp.data)
            td_all[k] = (q1v - next_q).detach().abs()
            self.updates += 1
        return td_all


def test_cleanrls_sac_update_is_compiled():
    env = gym.make("Pendulum-v1")
    cfg = make_config("sac", "Pendulum-v1", {"net_arch": [32, 32]})
    spaces = (env.observation_space, env.action_space)
    _equal_on_the_derived_path(lambda: CleanRLSAC(cfg, *spaces), spaces, K=2)


def test_an_optimizer_the_learn_never_steps_is_named_and_the_public_learn_runs():
    class Unstepped(CleanRLSAC):   # keeps the built-in's alpha optimizer, which its learn never steps
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=self.cfg.lr)

    from hetrl.kernels.compiled.derived import UNREADY_PHASES
    env = gym.make("Pendulum-v1")
    spaces = (env.observation_space, env.action_space)
    algo = Unstepped(make_config("sac", "Pendulum-v1", {"net_arch": [16]}), *spaces)
    spec = type(algo).replay_fields(*spaces)
    g = torch.Generator().manual_seed(0)
    kernel = CompiledKernel(algo)
    try:
        for _ in range(UNREADY_PHASES):
            kernel.learn(synthetic_batch(spec, spaces[1], 16, 2, "cpu", g)[0], torch.ones(2, 16))
        line = kernel.declined or ""
        assert "Unstepped's optimizer self.alpha_opt has no state after" in line and "\n" not in line, line
    finally:
        kernel.close()


class LiteralQRDQN(qrdqn_example.QRDQN):
    """A tensor made from a literal in learn and then written: each phase starts from the literal again."""

    def learn(self, batches, weights):
        scale = torch.tensor([1.0, 0.5])
        scale[0] = scale[0] + 1.0    # 2.0 in every phase, never 3.0, 4.0, ...
        batches = dict(batches, reward=batches["reward"] * scale[0] * scale[1])
        return super().learn(batches, weights)


def test_a_tensor_made_from_a_literal_and_written_in_learn_starts_from_the_literal_each_phase():
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [16], "n_quantiles": 4})
    _equal_on_the_derived_path(lambda: LiteralQRDQN(cfg, *CARTPOLE), n=4)


class ScalesItsBatchQRDQN(qrdqn_example.QRDQN):
    def learn(self, batches, weights):
        batches["reward"].mul_(0.5)      # in place, into the caller's batch (as the public learn does)
        return super().learn(batches, weights)


def test_a_learn_that_writes_into_its_batch_is_compiled_and_writes_it_once():
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [16], "n_quantiles": 4})
    make = lambda: ScalesItsBatchQRDQN(cfg, *CARTPOLE)   # noqa: E731
    _equal_on_the_derived_path(make)
    phases, weights = _phases(make)
    kernel = CompiledKernel(make())
    try:
        for b in phases:
            reward = b["reward"].clone()
            kernel.learn(b, weights)
            assert torch.equal(b["reward"], reward * 0.5)   # the trace wrote into a copy
        assert kernel.path == "derived" and kernel.derived.lanes_run
    finally:
        kernel.close()


class ClipsValuesQRDQN(qrdqn_example.QRDQN):
    """clip_grad_value_ (a _foreach_clamp_ in place) on gradients one of which is uniform (a constant): the mean of
    the outputs gives the last bias the gradient 1/n everywhere."""

    def learn(self, batches, weights):
        for k in range(weights.shape[0]):
            self.opt.zero_grad()
            (self.q(batches["obs"][k]).mean() * weights[k].mean()).backward()
            nn.utils.clip_grad_value_(self.q.parameters(), 0.001)
            self.opt.step()
        self.updates += weights.shape[0]
        return torch.zeros_like(weights)


def test_clip_grad_value_on_a_constant_gradient_is_compiled():
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [16], "n_quantiles": 4})
    _equal_on_the_derived_path(lambda: ClipsValuesQRDQN(cfg, *CARTPOLE))


class BatchNormQRDQN(qrdqn_example.QRDQN):
    """nn.BatchNorm1d after a hidden layer's activation (CrossQ's place), in training mode: batch statistics, and
    the running mean, variance and batch count updated in place as state."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for net in (self.q, self.q_target):
            net.body.insert(2, torch.nn.BatchNorm1d(16))
        self.q_target.load_state_dict(self.q.state_dict())
        self.opt = torch.optim.Adam(self.q.parameters(), lr=self.cfg.lr)


def test_a_batch_norm_after_an_activation_is_compiled():
    cfg = make_config("qrdqn", "CartPole-v1", {"net_arch": [16], "n_quantiles": 4})
    _equal_on_the_derived_path(lambda: BatchNormQRDQN(cfg, *CARTPOLE), K=2, B=128)


class CleanRLPPO(PPO):
    """PPO's update as CleanRL's ppo.py writes it: torch.optim.Adam, Categorical(logits=...), advantages normalised
    per minibatch, the clipped value loss, clip_grad_norm_, approx_kl kept as a tensor."""
    optims = ("optimizer",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.params = [*self.policy.parameters(), *self.value.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=self.cfg.lr, eps=1e-5)
        self.opt = None

    def learn(self, batches, weights):
        clip, td = 0.2, torch.empty_like(weights)
        for k in range(weights.shape[0]):
            b = {key: v[k] for key, v in batches.items()}
            dist = torch.distributions.Categorical(logits=self.policy(b["obs"]))
            logp, entropy = dist.log_prob(b["action"].long().view(-1)), dist.entropy()
            value = self.value(b["obs"]).view(-1)
            log_ratio = logp - b["log_prob"]
            ratio = log_ratio.exp()
            with torch.no_grad():
                self.last_kl = ((ratio - 1) - log_ratio).mean()
            adv = (b["advantage"] - b["advantage"].mean()) / (b["advantage"].std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
            clipped = b["value"] + torch.clamp(value - b["value"], -clip, clip)
            v_loss = 0.5 * torch.max((value - b["return"]) ** 2, (clipped - b["return"]) ** 2).mean()
            loss = pg_loss - 0.01 * entropy.mean() + 0.5 * v_loss
            self.optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.params, 0.5)
            self.optimizer.step()
            td[k] = (b["return"] - value).detach().abs()
        self.updates += weights.shape[0]
        return td


def test_cleanrls_ppo_update_is_compiled():
    cfg = make_config("ppo", "CartPole-v1", {"net_arch": [32, 32], "batch_size": 64})
    _equal_on_the_derived_path(lambda: CleanRLPPO(cfg, *CARTPOLE), CARTPOLE)
