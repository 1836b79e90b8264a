"""benchmarks/results_md.py: docs/results.md and README's figures are what the result files say, and the
files follow the naming scheme of benchmarks/result_files.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.append(str(BENCH))

import result_files  # noqa: E402
import results_md  # noqa: E402


def test_the_page_and_the_readme_are_what_the_result_files_say(capsys):
    rc = results_md.main(["--check"])
    assert rc == 0, capsys.readouterr().out
    assert results_md.PAGE.read_text().count("\n") <= results_md.MAX_LINES


@pytest.mark.parametrize("name, expected", [
    ("bench_sb3_td3-pendulum+sac-pendulum_2026-11-26_epyc-avx2_bf84f6d.json",
     ("bench_sb3", "td3-pendulum+sac-pendulum", "2026-11-26", "epyc-avx2", "bf84f6d", None)),
    ("bench_sb3_api_dqn-cartpole_2026-11-26_epyc-avx2_44f386e.json",
     ("bench_sb3_api", "dqn-cartpole", "2026-11-26", "epyc-avx2", "44f386e", None)),
    ("gpu_check_2026-11-27_h100_755ff3a.png", ("gpu_check", None, "2026-11-27", "h100", "755ff3a", None)),
    ("gpu_check_2026-11-27_h100_755ff3a-sweep.png", ("gpu_check", None, "2026-11-27", "h100", "755ff3a", "sweep")),
    ("bench_sb3.json", None),
    ("bench_dqn_2026-11-25_xeon-amx_0271fbe.json", None),   # no benchmark called bench_dqn
])
def test_names_under_the_scheme_are_read_back(name, expected):
    got = result_files.parse(name)
    keys = ("benchmark", "case", "date", "machine", "commit", "part")
    assert (tuple(got[k] for k in keys) if got else None) == expected


def test_default_output_paths_follow_the_scheme(monkeypatch, tmp_path):
    monkeypatch.setenv("HETRL_MACHINE", "xeon-amx")
    assert result_files.case_slug("dqn:CartPole-v1:50000,sac:ALE/Breakout-v5:25000:learning_starts=5000") \
        == "dqn-cartpole+sac-breakout"
    assert result_files.case_slug(["ddpg", "td3"]) == "ddpg+td3"
    path = result_files.result_path("bench_sb3", "td3:Pendulum-v1:20000", folder=tmp_path)
    got = result_files.parse(path.name)
    assert (path.parent, got["benchmark"], got["case"], got["machine"]) == (tmp_path, "bench_sb3", "td3-pendulum", "xeon-amx")
    assert result_files.gpu_key("NVIDIA H100 80GB HBM3") == "h100"


def _sb3_result(folder: Path, name: str, when: str, libs: dict) -> None:
    case = {"algo": "td3", "env": "Pendulum-v1", "steps": 20000, "extra": {},
            "runs": {lib: [{"env_steps_per_s": v}] for lib, v in libs.items()},
            "median_env_steps_per_s": libs,
            "ratios": {f"hetrl/{lib}": libs["hetrl"] / v for lib, v in libs.items() if lib != "hetrl"}}
    (folder / name).write_text(json.dumps({"command": "python benchmarks/bench_sb3.py", "cases": [case], "when": when}))


def test_a_newer_result_of_the_same_case_and_machine_supersedes_what_it_measured_too(tmp_path):
    (tmp_path / "machines.json").write_text(json.dumps({"epyc-avx2": {"short": "s", "description": "d"}}))
    _sb3_result(tmp_path, "bench_sb3_td3-pendulum_2026-11-26_epyc-avx2_aaaaaaa.json", "2026-11-26 10:00:00",
                {"hetrl": 200.0, "sb3": 100.0})
    _sb3_result(tmp_path, "bench_sb3_td3-pendulum_2026-11-26_epyc-avx2_bbbbbbb.json", "2026-11-26 12:00:00",
                {"hetrl": 210.0, "sb3": 100.0, "sbx": 150.0})
    _sb3_result(tmp_path, "bench_sb3_td3-pendulum_2026-11-26_epyc-avx2_ccccccc.json", "2026-11-26 14:00:00",
                {"hetrl": 220.0, "sbx": 160.0})
    (tmp_path / "bench_sb3_td3.json").write_text("{}")
    results, problems = results_md.load(tmp_path)
    current, superseded = results_md.latest(results)
    # aaaaaaa (hetrl, sb3) is covered by bbbbbbb (hetrl, sb3, sbx); bbbbbbb measured SB3, which ccccccc did not
    assert [r.name["commit"] for r in superseded] == ["aaaaaaa"]
    assert {r.name["commit"] for r in results if current[id(r)]} == {"bbbbbbb", "ccccccc"}
    assert any("bench_sb3_td3.json: not named" in p for p in problems)


def test_a_result_without_its_command_or_machine_is_reported(tmp_path):
    (tmp_path / "machines.json").write_text(json.dumps({"epyc-avx2": {"short": "s", "description": "d"}}))
    (tmp_path / "notes_shared-cpu_2026-11-22_xeon-vm_dbfe726.json").write_text(
        json.dumps({"topic": "memory", "figures": "0.59 of alone"}))
    _, problems = results_md.load(tmp_path)
    assert any("machine 'xeon-vm' is not in" in p for p in problems)
    assert any("no \"command\"" in p for p in problems)
