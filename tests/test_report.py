"""hetrl report: the statistics of Agarwal et al. (2021) against hand-computed values, reading
hetrl runs, populations and SB3 EvalCallback logs, learning curves, the population's report and
the `hetrl report` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import trim_mean

from hetrl.cli import main
from hetrl.errors import UsageError
from hetrl.report import learning_curve, load_runs, write_population_report
from hetrl.report.stats import aggregate, interval, iqm, optimality_gap, statistic

PNG = b"\x89PNG\r\n\x1a\n"
STEPS = [5000, 10000, 15000, 20000]


# ---- fixtures: the directories hetrl and SB3 write ------------------------------------------
def hetrl_run(d, seed=0, curve=(100.0, 200.0, 300.0, 400.0), final=410.0, best=None, steps=STEPS,
              env="CartPole-v1", evaluations=True):
    d.mkdir(parents=True)
    result = {"algo": "dqn", "env": env, "seed": seed, "env_steps": steps[-1], "config": {"lr": 1e-3}}
    if final is not None:
        result["eval_return_mean"] = final
    if best is not None:
        result["best_select_return_mean"] = best
    if evaluations:
        result["evaluations"] = [[s, r] for s, r in zip(steps, curve)]
    (d / "result.json").write_text(json.dumps(result))
    return d


def population(d, seeds=(0, 1, 2, 3), sweep=None):
    sweep = sweep or {}
    grid = [{}] if not sweep else [{"lr": v} for v in sweep["lr"]]
    members = []
    for settings in grid:
        shift = 0.0 if not settings else (100.0 if settings["lr"] == 1e-3 else 0.0)
        for s in seeds:
            name = f"seed{s}" + (f"-lr{settings['lr']}" if settings else "")
            curve = [100.0 * (i + 1) + 10 * s + shift for i in range(len(STEPS))]
            hetrl_run(d / "members" / name, s, curve, final=curve[-1] + 5, best=max(curve))
            members.append({"name": name, "seed": s, "settings": settings, "dir": f"members/{name}"})
    (d / "result.json").write_text(json.dumps({"algo": "dqn", "env": "CartPole-v1", "population": {
        "seeds": list(seeds), "sweep": sweep, "members": members}}))
    return d


def sb3_log(d, returns, steps=STEPS, env="CartPole-v1"):
    d.mkdir(parents=True)
    results = np.asarray(returns, dtype=float)[:, None] + np.array([-1.0, 0.0, 1.0])  # 3 episodes each
    np.savez(d / "evaluations.npz", timesteps=np.asarray(steps), results=results,
             ep_lengths=np.full(results.shape, 200))
    if env:
        (d / "0.monitor.csv").write_text(json.dumps({"t_start": 0.0, "env_id": env}).join(["#", "\nr,l,t\n"]))
    return d


# ---- statistics --------------------------------------------------------------------------
def test_iqm_mean_median_of_a_known_array():
    x = np.array([100.0, 1, 2, 3, 4, 5, 6, -50])   # sorted: -50 1 | 2 3 4 5 | 6 100
    assert iqm(x) == pytest.approx(3.5)
    a = aggregate([x])
    assert a["iqm"]["value"] == pytest.approx(3.5)
    assert a["mean"]["value"] == pytest.approx(71 / 8)
    assert a["median"]["value"] == pytest.approx(3.5)
    assert "optimality_gap" not in a   # no target, no gap


def test_optimality_gap_counts_only_the_shortfall():
    x = np.array([400.0, 475.0, 500.0, 300.0])
    assert optimality_gap(x, 475.0) == pytest.approx((75 + 0 + 0 + 175) / 4)
    assert aggregate([x], targets=[475.0])["optimality_gap"]["value"] == pytest.approx(62.5)


def test_interval_contains_the_estimate_and_is_reproducible_under_its_seed():
    x = np.random.default_rng(3).normal(200.0, 50.0, size=10)
    a, b = aggregate([x], targets=[475.0]), aggregate([x], targets=[475.0])
    assert a == b
    for name in ("iqm", "mean", "median", "optimality_gap"):
        s = a[name]
        assert s["low"] < s["value"] < s["high"], name
    other = aggregate([x], seed=1)["iqm"]
    assert (other["low"], other["high"]) != (a["iqm"]["low"], a["iqm"]["high"])


def test_stratified_bootstrap_resamples_within_each_task():
    low_task, high_task = np.array([0.0, 1.0, 2.0]), np.array([100.0, 101.0, 102.0])
    value, lo, hi = interval([low_task, high_task], statistic("mean"))
    assert value == pytest.approx(51.0)
    # every resample keeps 3 runs of each task: the mean stays within [50, 52]
    assert 50.0 <= lo <= value <= hi <= 52.0
    _, pooled_lo, pooled_hi = interval([np.concatenate([low_task, high_task])], statistic("mean"))
    assert pooled_lo < 40.0 and pooled_hi > 62.0   # pooled, resamples mix the tasks' shares
    gap = aggregate([low_task, high_task], targets=[2.0, 102.0])["optimality_gap"]
    assert gap["value"] == pytest.approx((2 + 1 + 0 + 2 + 1 + 0) / 6)


def test_one_run_has_no_interval_and_few_runs_work():
    one = aggregate([[250.0]], targets=[475.0])
    assert one["iqm"] == {"value": 250.0, "low": None, "high": None}
    assert one["optimality_gap"]["value"] == pytest.approx(225.0)
    two = aggregate([[100.0, 300.0]])
    assert two["iqm"]["value"] == pytest.approx(200.0)      # too few runs to trim: the mean
    assert 100.0 <= two["iqm"]["low"] <= 200.0 <= two["iqm"]["high"] <= 300.0
    # a task with one run is held fixed while the other is resampled
    value, lo, hi = interval([np.array([10.0]), np.array([0.0, 2.0])], statistic("mean"))
    assert value == pytest.approx(4.0) and 10 / 3 <= lo <= hi <= 14 / 3


# ---- reading runs -------------------------------------------------------------------------
def test_load_a_hetrl_run(tmp_path):
    [g] = load_runs(hetrl_run(tmp_path / "run", best=380.0))
    assert (g.library, g.env_label, len(g.members)) == ("hetrl", "CartPole-v1", 1)
    m = g.members[0]
    assert (m.final, m.best, m.seed) == (410.0, 380.0, 0)
    assert m.steps.tolist() == STEPS and m.returns.tolist() == [100.0, 200.0, 300.0, 400.0]
    # an older run: no best_select_return_mean -> the best periodic evaluation; no evaluations -> none
    assert load_runs(hetrl_run(tmp_path / "plain"))[0].members[0].best == 400.0
    old = load_runs(hetrl_run(tmp_path / "old", evaluations=False))[0].members[0]
    assert (old.final, old.best, old.steps.size) == (410.0, None, 0)


def test_load_a_population_of_seeds_and_a_sweep(tmp_path):
    [g] = load_runs(population(tmp_path / "seeds"))
    assert g.name.endswith("seeds") and [m.name for m in g.members] == ["seed0", "seed1", "seed2", "seed3"]
    rows = load_runs(population(tmp_path / "sweep", seeds=(0, 1, 2), sweep={"lr": [1e-3, 3e-4]}))
    assert [r.settings for r in rows] == [{"lr": 1e-3}, {"lr": 3e-4}]
    assert [r.name.split(" ", 1)[1] for r in rows] == ["lr=0.001", "lr=0.0003"]
    assert [m.name for m in rows[1].members] == ["seed0-lr0.0003", "seed1-lr0.0003", "seed2-lr0.0003"]


def test_load_sb3_logs_one_and_a_glob(tmp_path):
    for s in range(3):
        sb3_log(tmp_path / "sb3" / f"seed{s}", [50.0, 150.0 + s, 120.0, 140.0])
    [one] = load_runs(tmp_path / "sb3" / "seed0")
    m = one.members[0]
    assert (one.library, m.env, m.final, m.best) == ("sb3", "CartPole-v1", 140.0, 150.0)  # last, max of means
    [pooled] = load_runs(str(tmp_path / "sb3" / "seed*"))
    assert len(pooled.members) == 3 and pooled.library == "sb3"
    sb3_log(tmp_path / "bare", [1.0, 2.0, 3.0, 4.0], env=None)
    assert load_runs(tmp_path / "bare")[0].env_label == "?"
    assert load_runs(tmp_path / "bare", env="Pendulum-v1")[0].env_label == "Pendulum-v1"


def test_a_directory_of_runs_is_not_a_run(tmp_path):
    population(tmp_path / "pop")
    with pytest.raises(UsageError, match=r"none of the directories.*quoted glob"):
        load_runs(tmp_path / "pop" / "members")


# ---- curves and the population's report -------------------------------------------------
def test_learning_curve_is_the_iqm_at_each_step(tmp_path):
    [g] = load_runs(population(tmp_path / "pop", seeds=(0, 1, 2, 3, 4)))
    c = learning_curve(g)
    assert c["env_steps"] == STEPS and c["runs"] == 5
    by_hand = trim_mean(np.array([m.returns for m in g.members]), 0.25, axis=0)
    assert np.allclose(c["iqm"], by_hand)
    assert all(lo <= v <= hi for lo, v, hi in zip(c["ci_low"], c["iqm"], c["ci_high"]))


def test_learning_curve_interpolates_runs_evaluated_at_other_steps(tmp_path):
    hetrl_run(tmp_path / "a", 0, curve=[0.0, 100.0, 200.0], steps=[0, 1000, 2000])
    hetrl_run(tmp_path / "b", 1, curve=[50.0, 150.0, 250.0, 350.0], steps=[500, 1500, 2500, 3500])
    [g] = load_runs(str(tmp_path / "[ab]"))
    c = learning_curve(g)
    # the union of the steps, within the span both runs cover
    assert c["env_steps"] == [500, 1000, 1500, 2000]
    a, b = np.interp([500, 1000, 1500, 2000], [0, 1000, 2000], [0, 100, 200]), [50, 100, 150, 200]
    assert np.allclose(c["iqm"], (a + np.array(b)) / 2)


def test_write_population_report(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    pop = population(tmp_path / "pop", seeds=(0, 1, 2), sweep={"lr": [1e-3, 3e-4]})
    agg = write_population_report(pop)
    json.dumps(agg, allow_nan=False)   # stored in result.json: strict JSON
    assert [r["setting"] for r in agg["rows"]] == ["lr=0.001", "lr=0.0003"]
    fast, slow = agg["rows"]
    assert fast["runs"] == 3 and fast["target"] == 475.0 and fast["target_source"] == "reward_threshold"
    # lr=1e-3 members finish at 505, 515, 525 (eval_return_mean); lr=3e-4 at 405, 415, 425
    assert fast["final"]["mean"]["value"] == pytest.approx(515.0)
    assert slow["final"]["optimality_gap"]["value"] == pytest.approx((70 + 60 + 50) / 3)
    assert slow["best"]["median"]["value"] == pytest.approx(410.0)
    assert len(agg["members"]) == 6 and agg["members"][0] == {
        "name": "seed0-lr0.001", "seed": 0, "settings": {"lr": 0.001}, "final": 505.0, "best": 500.0}
    assert (pop / "curves.png").read_bytes()[:8] == PNG
    ea = EventAccumulator(str(pop / "tb" / "population" / "lr=0.001")).Reload()
    iqm_events = ea.Scalars("iqm")
    assert [e.step for e in iqm_events] == STEPS
    assert np.allclose([e.value for e in iqm_events], fast["curve"]["iqm"])
    assert {"ci_low", "ci_high"} <= set(ea.Tags()["scalars"])
    with pytest.raises(UsageError, match="not a population"):
        write_population_report(pop / "members" / "seed0-lr0.001")


# ---- the command --------------------------------------------------------------------------
def test_cli_prints_one_row_per_group_and_draws_the_curves(tmp_path, capsys):
    population(tmp_path / "pop", seeds=(0, 1, 2), sweep={"lr": [1e-3, 3e-4]})
    for s in range(3):
        sb3_log(tmp_path / "sb3" / f"seed{s}", [100.0, 200.0, 300.0, 400.0 + s])
    hetrl_run(tmp_path / "single")
    out = tmp_path / "cmp.png"
    assert main(["report", str(tmp_path / "pop"), str(tmp_path / "sb3" / "seed*"), str(tmp_path / "single"),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == ["name", "library", "env", "runs", "IQM", "[CI]", "mean", "[CI]", "median", "[CI]",
                               "optimality", "gap", "[CI]"]
    rows = {line.split()[1] if line.startswith(str(tmp_path / "pop")) else line.split()[0]: line.split()
            for line in text[1:5]}
    assert rows["lr=0.001"][2:5] == ["hetrl", "CartPole-v1", "3"]
    assert rows["lr=0.001"][5:8] == ["515.0", "[505.0,", "525.0]"]      # IQM of 3 runs: their mean
    assert rows[str(tmp_path / "sb3" / "seed*")][1:4] == ["sb3", "CartPole-v1", "3"]
    assert rows[str(tmp_path / "single")][4:6] == ["410.0", "[-]"]       # one run: no interval
    assert any("475.0 (CartPole-v1's reward_threshold)" in line for line in text)
    assert out.read_bytes()[:8] == PNG
    assert main(["report", str(tmp_path / "single"), "--metric", "best", "--target", "500", "--json",
                 "--no-plot"]) == 0
    [r] = json.loads(capsys.readouterr().out)["rows"]
    assert r["metric"] == "best" and r["target"] == 500.0 and r["stats"]["optimality_gap"]["value"] == 100.0


@pytest.mark.parametrize("case,needle", [
    ("missing", "does not exist"),
    ("members", "none of the directories hetrl report reads"),
    ("nothing", "matches no run directory"),
    ("mixed", "both hetrl runs and SB3 logs"),
    ("old", "no evaluations to draw"),
    ("nan", "not a finite return"),
    ("ext", "matplotlib cannot write"),
])
def test_cli_bad_input_is_one_line(tmp_path, capsys, case, needle):
    population(tmp_path / "pop")
    hetrl_run(tmp_path / "mix" / "a")
    sb3_log(tmp_path / "mix" / "b", [1.0, 2.0, 3.0, 4.0])
    hetrl_run(tmp_path / "old", evaluations=False)
    argv = {"missing": [str(tmp_path / "nope")],
            "members": [str(tmp_path / "pop" / "members")],
            "nothing": [str(tmp_path / "none*")],
            "mixed": [str(tmp_path / "mix" / "*")],
            "old": [str(tmp_path / "old")],
            "nan": [str(tmp_path / "pop"), "--target", "nan"],
            "ext": [str(tmp_path / "pop"), "--out", str(tmp_path / "curves.xyz")]}[case]
    assert main(["report", *argv, "--out", str(tmp_path / "r.png")] if case != "ext" else ["report", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert not (tmp_path / "r.png").exists()


def test_a_negative_target_is_a_return_like_any_other(tmp_path, capsys):
    # MountainCar-v0's and Acrobot-v1's own reward_thresholds are negative (-110, -100)
    hetrl_run(tmp_path / "acro", curve=[-500.0, -300.0, -150.0, -90.0], final=-95.0, env="Acrobot-v1")
    assert main(["report", str(tmp_path / "acro"), "--no-plot", "--json"]) == 0
    [r] = json.loads(capsys.readouterr().out)["rows"]
    assert r["target"] == -100.0 and r["stats"]["optimality_gap"]["value"] == 0.0
    assert main(["report", str(tmp_path / "acro"), "--no-plot", "--json", "--target", "-80"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["stats"]["optimality_gap"]["value"] == 15.0


def test_table_on_a_terminal_is_rich_without_markup(tmp_path, monkeypatch):
    import io

    from hetrl.report.cli import render
    from hetrl.report.summary import row

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    [g] = load_runs(hetrl_run(tmp_path / "[bold]run"))
    monkeypatch.setenv("COLUMNS", "200")   # a wide terminal: no cell wraps
    term = Terminal()
    render([row(g, curve=False)], "final", file=term)
    text = term.getvalue()
    assert "IQM [CI]" in text and "[bold]run" in text and "410.0 [-]" in text
