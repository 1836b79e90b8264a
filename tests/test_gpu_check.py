"""benchmarks/gpu_check.py: its plumbing (any machine). The kernels it times and checks are hetrl's own
(hetrl/kernels/), tested in tests/test_kernel_*.py; the whole check is rehearsed with --quick (docs/gpu.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_stages_by_letter_or_name_run_in_order():
    assert gpu_check.parse_stages("f,a,planner") == ["env", "planner", "sweep"]
    assert gpu_check.parse_stages("g,k,a,c") == ["env", "learner", "kernels", "population"]
    assert gpu_check.parse_stages(gpu_check.DEFAULT_STAGES) == ["env", "tests", "learner", "kernels", "population",
                                                                "planner"]
    with pytest.raises(SystemExit, match="unknown stage"):
        gpu_check.parse_stages("a,z")


def test_the_default_call_fits_its_max_s():
    """docs/gpu.md runs the default stages with --max-s 480: the budgets of every stage but the planner (which
    takes what is left) fit in it."""
    budgets = gpu_check.BUDGETS_S
    assert sum(budgets[s] for s in ("env", "tests", "learner", "kernels", "population")) <= 480 - 5
    assert "--max-s 480" in (ROOT / "docs" / "gpu.md").read_text()


def test_the_summary_survives_partial_records():
    doc = {"schema": gpu_check.SCHEMA, "numba_warm_up": {"dqn": {"compile_s": 40.0}, "sac": {"error": "stopped"}},
           "stages": {
        "env": {"status": "ok", "info": {"cpu_count": 16}, "packages": {"torch": {"ok": True, "version": "2"}}},
        "learner": {"status": "timeout", "reason": "over its wall budget", "cases": {
            "dqn CartPole-v1": {"batch_size": 64, "net_arch": [256, 256], "phase_k": 32, "variants": {
                "cpu_public": {"updates_per_s": 500.0}, "cuda_eager": {"skipped": "no CUDA"},
                "cuda_graph": {"error": "RuntimeError: x"},
                "cpu_compiled": {"updates_per_s": 900.0, "check": {"ok": True, "tolerance_used": 0.01, "worst": ""}},
                "cuda_graph_k32": {"updates_per_s": 5000.0, "check": {"ok": False, "tolerance_used": 12.0,
                                                                      "worst": "td: max |diff| 0.1"}}}},
            "dqn ALE/Breakout-v5": {"skipped": "ale-py is not installed", "variants": {}}}},
        "kernels": {"status": "ok", "cases": {
            "td3 Pendulum-v1": {"devices": {
                "cuda": {"steps": 1, "chosen": "cuda_graph", "updates_per_s": {"public": 300.0, "cuda_graph": 310.0},
                         "checked": {"cuda_graph": {}}, "differs": {}, "declined": {}, "chosen_after_check": True,
                         "graph_captures": False},
                "cpu": {"steps": 1, "chosen": "compiled", "updates_per_s": {"public": 100.0, "compiled": 400.0},
                        "differs": {}, "declined": {}},
                "cuda_k2": {"skipped": "no CUDA"}}},
            "crossq Pendulum-v1": {"skipped": "no algorithm named crossq is registered here"}}},
        "population": {"status": "ok", "steps": 10240, "algo": "dqn", "env": "CartPole-v1", "runs": {
            "cuda_graph_n1": {"device": "cuda", "wall_s": 10.0, "process_s": 14.0, "time_split_s": {"learner": 2.0}},
            "cuda_graph_n64": {"device": "cuda", "wall_s": 60.0, "members_graph": True},
            "public_n8": {"skipped": "stage budget spent"}}, "wall_ratio": {"cuda_graph_n64_over_n1": 6.0},
            "target": "cuda_graph_n64_over_n1 <= 3"},
        "planner": {"status": "failed", "cases": {"dqn CartPole-v1": {"plans": {"default": {"error": "e"}, "cuda": {
            "plan": {"learner_device": "cuda:0"}, "learner_line": ["learner kernel: cuda_graph (measured here)"]}},
                                                                       "train": {"rc": 1}}}},
        "sweep": {"status": "ok", "sweep": {"no_rate_limit": {"1": {"env_steps_per_s": 10.0}}}}}}
    text = gpu_check.summary(doc)
    assert "learner    timeout" in text and "cpu_public 500" in text and "cuda_graph ERROR" in text
    assert "cpu_compiled 900 ok" in text and "cuda_graph_k32 5,000 DIFFERS" in text
    assert "td3 Pendulum-v1 on cuda (k=1): cuda_graph (the graph replays nothing at this k)" in text
    assert "cuda_graph_n64_over_n1 6.0" in text and "public_n8       stage budget spent" in text
    assert "learner kernel: cuda_graph (measured here)" in text and "dqn 40 s" in text
    assert "tests      not run" in text and "1: 10" in text


def test_merge_keeps_the_later_call_per_stage(tmp_path):
    a = {"schema": gpu_check.SCHEMA, "stages": {"env": {"status": "ok", "n": 1}, "learner": {"status": "ok"}}}
    b = {"schema": gpu_check.SCHEMA, "stages": {"env": {"status": "ok", "n": 2}, "population": {"status": "ok"}}}
    for name, doc in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(doc))
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--merge", str(tmp_path / "a.json"),
                    str(tmp_path / "b.json"), "--out", str(tmp_path / "m")], check=True, capture_output=True)
    merged = json.loads((tmp_path / "m" / "gpu_check.json").read_text())
    assert set(merged["stages"]) == {"env", "learner", "population"} and merged["stages"]["env"]["n"] == 2
    assert (tmp_path / "m" / "gpu_check.txt").exists()


def test_the_learner_cases_take_the_runs_phase_length_and_graph_period():
    """Stages c and k time each learner at the run's phase length K and capture graphs at multiples of the
    algorithm's period (TD3: policy_delay); an algorithm that is not registered is a skipped case."""
    dqn, td3 = gpu_check.Case("dqn", "CartPole-v1"), gpu_check.Case("td3", "Pendulum-v1")
    assert (dqn.B, dqn.K, dqn.period) == (64, 32, 1)
    assert (td3.K, td3.period) == (1, 2)
    phases, w = dqn.phases("cpu", 3)
    assert len(phases) == 2 and phases[0]["obs"].shape == (3, 64, 4) and tuple(w.shape) == (3, 64)
    with pytest.raises(gpu_check.Skip, match="no algorithm named nosuch"):
        gpu_check.Case("nosuch", "Pendulum-v1")


def test_the_cnn_case_gets_the_preprocessed_spaces_without_opencv():
    """The GPU machine has no OpenCV: the learner stage takes an Atari id's spaces from the config, and
    they are the ones hetrl's preprocessing gives."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from hetrl.actors import probe_spaces
    from hetrl.actors.envs import prepare_env
    from hetrl.config import make_config

    for env, over in (("ALE/Breakout-v5", {}), ("ALE/Pong-v5", {"frame_stack": 2, "atari_screen_size": 64})):
        cfg = make_config("dqn", env, over)
        assert gpu_check.atari_spaces(env, cfg) == probe_spaces(prepare_env(env, cfg))
