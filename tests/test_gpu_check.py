"""benchmarks/gpu_check.py: its plumbing (any machine). The learner captured in a CUDA graph, which it
times, is hetrl's own (hetrl/algos/graphed.py), tested in tests/test_graphed.py."""

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
