"""Choosing the learner kernel (hetrl/kernels/select.py): only one that is faster *and* checked equal to the
public kernel here; once per machine (cached), recorded in result.json and the checkpoint, reused on resume;
and a run with the same seed twice gives the same figures and parameters."""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import pytest
import torch

import hetrl
from hetrl.algos import make_algorithm, replay_spec
from hetrl.config import make_config
from hetrl.errors import UsageError
from hetrl.kernels import Choice, choose, select
from hetrl.kernels.public import PublicKernel

SPACES = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path / "cache"))
    # no load readings: the other test processes beside this one would make a choice provisional at random
    monkeypatch.setattr("hetrl.planner.load.sample", lambda: None)


def _setup(**settings):
    cfg = make_config("dqn", "CartPole-v1", {"net_arch": [16], "batch_size": 8, "learner_kernel": "auto", **settings})
    return cfg, (lambda: make_algorithm(cfg, *SPACES)), replay_spec(cfg, *SPACES)


class Skewed(PublicKernel):
    """A candidate that runs the public update, then moves one weight: fast or not, it is not the same learner."""
    name = "skewed"

    def learn(self, batches, weights):
        td = super().learn(batches, weights)
        with torch.no_grad():
            next(self.algo.q.parameters()).view(-1)[0] += 1e-2
        return td


class Same(PublicKernel):
    name = "same"


def test_a_kernel_that_differs_is_dropped_with_the_size_of_the_difference():
    cfg, make, spec = _setup()
    choice = select(make, spec, SPACES[1], 8, 4, "cpu", candidates=("public", Skewed))
    assert choice.name == "public" and "skewed" in choice.differs and "skewed" not in choice.s_per_update
    assert "max |diff|" in choice.differs["skewed"]
    assert any("skewed dropped: it differs" in line for line in choice.explain())


def test_a_few_weights_off_by_a_cancelled_gradients_adam_steps_are_left_out_and_no_more():
    """The check leaves out elements off by at most `bound` where they are at most one in a thousand of all (a
    gradient that cancels to rounding noise, which Adam turns into a step of up to lr either way); more of them,
    or one off by more, is a difference."""
    from hetrl.kernels.select import _largest_difference

    want = {"a": torch.linspace(-1, 1, 6000), "b": torch.ones(4000)}
    got = {k: v.clone() for k, v in want.items()}
    got["a"][:5] += 2e-3
    got["b"][:4] -= 2e-3
    assert _largest_difference(got, want, 3e-3)[::2] == (0.0, 9)
    ratio, where, _ = _largest_difference(got, want, 1e-3)
    assert ratio > 1 and where.startswith("a: max |diff| 0.002")
    got["a"][:20] += 2e-3    # 24 of 10,000 elements: more than rounding can explain
    assert _largest_difference(got, want, 1e-2)[0] > 1


def test_a_kernel_checked_equal_is_timed_and_may_be_chosen():
    cfg, make, spec = _setup()
    choice = select(make, spec, SPACES[1], 8, 4, "cpu", candidates=("public", Same))
    assert "same" in choice.checked and set(choice.s_per_update) == {"public", "same"}
    assert choice.name in ("public", "same") and choice.source == "measured"


def test_the_cuda_graph_kernel_is_never_chosen_for_a_cpu_learner():
    cfg, make, spec = _setup()
    choice = select(make, spec, SPACES[1], 8, 4, "cpu")
    assert choice.name != "cuda_graph" and "GPU learner" in choice.declined["cuda_graph"]


def test_selection_leaves_torchs_random_state_and_threads_as_they_were():
    cfg, make, spec = _setup()
    torch.manual_seed(5)
    before, threads = torch.get_rng_state(), torch.get_num_threads()
    select(make, spec, SPACES[1], 8, 4, "cpu")
    assert torch.equal(torch.get_rng_state(), before) and torch.get_num_threads() == threads


def test_a_choice_cached_by_other_kernel_code_is_measured_again(monkeypatch):
    """The machine's cached choices hold for the kernel code that measured them: another hetrl's kernels (a faster
    derived phase, another lane rule) measure again, and their choice replaces the old ones."""
    sel = sys.modules["hetrl.kernels.select"]   # (hetrl.kernels.select is also the function's name)
    cfg, make, spec = _setup()
    first = choose(cfg, make, *SPACES, spec, "cpu", 4)
    assert choose(cfg, make, *SPACES, spec, "cpu", 4).source == "cache"
    monkeypatch.setattr(sel, "kernels_version", lambda: "other-kernel-code")
    again = choose(cfg, make, *SPACES, spec, "cpu", 4)
    assert again.source == "measured" and first.source == "measured"
    assert choose(cfg, make, *SPACES, spec, "cpu", 4).source == "cache"
    assert json.loads(sel._cache_file().read_text())["kernels"] == "other-kernel-code"


def test_a_choice_timed_under_foreign_load_is_provisional_and_measured_again_once_quiet(monkeypatch):
    """A busy moment does not decide every later run: a choice timed while other processes kept cores busy is
    cached as provisional (`hetrl plan` says so), used while the machine stays busy, and measured again by the
    first run that finds it quiet."""
    from hetrl.planner import load

    busy = load.Load(foreign=1.0, seconds=1.0, core_busy=[1.0, 1.0], loadavg=2.0, cores=2)
    quiet = load.Load(foreign=0.0, seconds=1.0, core_busy=[0.0, 0.0], loadavg=0.1, cores=2)
    readings = iter([load.Sample(t=0.0, busy=[0.0, 0.0], idle=[0.0, 0.0], own=0.0, loadavg=None)] * 2)
    monkeypatch.setattr(load, "sample", lambda: next(readings, None))
    monkeypatch.setattr(load.Load, "between", classmethod(lambda cls, a, b: busy))
    cfg, make, spec = _setup()
    first = choose(cfg, make, *SPACES, spec, "cpu", 4)
    assert first.source == "measured" and "other processes kept 1.00 of 2 cores busy" in first.loaded
    assert any("provisional" in line for line in first.explain())
    sel = sys.modules["hetrl.kernels.select"]
    monkeypatch.setattr(sel, "_settled", {})   # (as another process would find it)
    monkeypatch.setattr(load, "quiet_check", lambda *a, **k: busy)
    assert choose(cfg, make, *SPACES, spec, "cpu", 4).source == "cache"
    monkeypatch.setattr(sel, "_settled", {})
    monkeypatch.setattr(load, "quiet_check", lambda *a, **k: quiet)
    monkeypatch.setattr(load, "sample", lambda: None)
    again = choose(cfg, make, *SPACES, spec, "cpu", 4)
    assert again.source == "measured" and again.loaded == ""
    assert choose(cfg, make, *SPACES, spec, "cpu", 4).source == "cache"


def test_the_choice_is_made_once_per_machine_and_a_pinned_kernel_that_cannot_run_is_one_line():
    cfg, make, spec = _setup()
    first = choose(cfg, make, *SPACES, spec, "cpu", 4)
    again = choose(cfg, make, *SPACES, spec, "cpu", 4)
    assert first.source == "measured" and again.source == "cache" and again.name == first.name
    assert again.s_per_update == first.s_per_update
    saved = choose(cfg, make, *SPACES, spec, "cpu", 4, saved={"name": "public", "options": {}})
    assert saved.name == "public" and saved.source == "checkpoint"
    cnn = make_config("dqn", "ALE/Pong-v5", {"net_arch": [], "learner_kernel": "compiled"})
    pixels = (gym.spaces.Box(0, 255, (4, 84, 84), "uint8"), gym.spaces.Discrete(6))
    with pytest.raises(UsageError, match="learner_kernel=compiled cannot run this learner: .*pixels.*use learner_kernel=auto"):
        choose(cnn, lambda: make_algorithm(cnn, *pixels), *pixels, replay_spec(cnn, *pixels), "cpu", 1)


def test_choice_round_trips_through_json():
    c = Choice(name="compiled", options={"gemm": "mkl"}, source="measured", s_per_update={"public": 1e-3},
               differs={"cuda_graph": "x"}, declined={}, checked={"compiled": {"phases": 2}})
    assert Choice.from_json(c.to_json()) == c


def test_same_seed_twice_gives_the_same_run(tmp_path):
    """Two runs with the same seed and settings on the same machine: identical evaluation figures and final
    parameters; the kernel (chosen by measurement in the first run, from the machine's cache in the second)
    and the GEMM are recorded in result.json and the checkpoint, and a resumed run keeps them."""
    settings = dict(steps=5000, seed=3, eval_episodes=3, eval_interval=2500, progress=False, plan="none",
                    learner_kernel="auto", threads=1)
    threads = torch.get_num_threads()
    a = hetrl.train("dqn", "CartPole-v1", out=tmp_path / "a", **settings)
    assert torch.get_num_threads() == threads            # the caller's thread count, given back
    b = hetrl.train("dqn", "CartPole-v1", out=tmp_path / "b", **settings)
    assert a.result["learner_kernel"] == b.result["learner_kernel"]
    assert a.result["learner_kernel_source"] == "measured" and b.result["learner_kernel_source"] == "cache"
    assert a.result["evaluations"] == b.result["evaluations"] and len(a.result["evaluations"]) == 2
    assert a.result["eval_return_mean"] == b.result["eval_return_mean"]
    for p, q in zip(a.algo.q.parameters(), b.algo.q.parameters()):
        assert torch.equal(p, q)
    ckpt = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    assert ckpt["kernel"]["name"] == a.result["learner_kernel"]
    resumed = hetrl.resume(tmp_path / "a", steps=5500, progress=False, evaluate_episodes=0)
    assert resumed.result["learner_kernel"] == a.result["learner_kernel"]
    assert resumed.result["learner_kernel_source"] in ("checkpoint", "cache")
