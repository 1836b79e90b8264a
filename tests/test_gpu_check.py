"""benchmarks/gpu_check.py: its plumbing (any machine), and a learner update captured whole in a
CUDA graph, which must equal the eager one (GPU; the check's stage c times it)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_stages_by_letter_or_name_run_in_order():
    assert gpu_check.parse_stages("f,a,planner") == ["env", "planner", "sweep"]
    with pytest.raises(SystemExit, match="unknown stage"):
        gpu_check.parse_stages("a,z")


def test_the_summary_survives_partial_records():
    doc = {"schema": gpu_check.SCHEMA, "stages": {
        "env": {"status": "ok", "info": {"cpu_count": 16}, "packages": {"torch": {"ok": True, "version": "2"}}},
        "learner": {"status": "timeout", "reason": "over its wall budget", "cases": {"dqn CartPole-v1": {
            "variants": {"cpu_1t": {"updates_per_s": 500.0}, "cuda_eager": {"skipped": "no CUDA"},
                         "cuda_graph": {"error": "RuntimeError: x"}}}}},
        "planner": {"status": "failed", "cases": {"dqn CartPole-v1": {"plans": {"default": {"error": "e"}},
                                                                       "train": {"rc": 1}}}},
        "sweep": {"status": "ok", "sweep": {"no_rate_limit": {"1": {"env_steps_per_s": 10.0}}}}}}
    text = gpu_check.summary(doc)
    assert "learner    timeout" in text and "cpu_1t 500" in text and "cuda_graph ERROR" in text
    assert "tests      not run" in text and "1: 10" in text


def test_merge_keeps_the_later_call_per_stage(tmp_path):
    a = {"schema": gpu_check.SCHEMA, "stages": {"env": {"status": "ok", "n": 1}, "learner": {"status": "ok"}}}
    b = {"schema": gpu_check.SCHEMA, "stages": {"env": {"status": "ok", "n": 2}, "sweep": {"status": "ok"}}}
    for name, doc in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(doc))
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--merge", str(tmp_path / "a.json"),
                    str(tmp_path / "b.json"), "--out", str(tmp_path / "m")], check=True, capture_output=True)
    merged = json.loads((tmp_path / "m" / "gpu_check.json").read_text())
    assert set(merged["stages"]) == {"env", "learner", "sweep"} and merged["stages"]["env"]["n"] == 2
    assert (tmp_path / "m" / "gpu_check.txt").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("algo,env", [("dqn", "CartPole-v1"), ("ddpg", "Pendulum-v1")])
def test_a_learner_call_captured_in_a_cuda_graph_equals_the_eager_one(algo, env):
    """No host sync inside learn (it would break the capture), and the replayed graph does the same math."""
    from hetrl.actors import probe_spaces
    from hetrl.algos import make_algorithm, replay_spec
    from hetrl.config import make_config
    from hetrl.planner.profile import synthetic_batch

    cfg = make_config(algo, env, {"fastpath": False, "batch_size": 32, "net_arch": [64, 64]})
    obs_space, act_space = probe_spaces(env)
    torch.manual_seed(1)
    batch, wts = synthetic_batch(replay_spec(obs_space, act_space), act_space, 32, 4, "cuda")
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(make_algorithm(cfg, obs_space, act_space, "cuda"))
    eager, captured = models
    graphed = gpu_check.GraphedLearn(captured, batch, wts, warmup=3)
    for _ in range(3):
        eager.learn(batch, wts)
    want = eager.learn(batch, wts)
    got = graphed.learn(batch, wts).clone()
    torch.cuda.synchronize()
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    for p, q in zip(gpu_check._params(eager), gpu_check._params(captured)):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)
