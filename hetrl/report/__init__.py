"""Reporting many runs: the statistics of Agarwal et al. (2021) over seeds and settings, learning
curves with confidence bands, `hetrl report` (docs/population.md).

    from hetrl.report import load_runs, write_population_report
    aggregate = write_population_report("runs/pop")    # rows per setting; curves.png; tb/population
    groups = load_runs("runs/pop")                     # also a hetrl run, an SB3 log, or a glob of them

Submodules: stats (IQM, mean, median, optimality gap, stratified bootstrap), runs (reading the
directories), curves (IQM curves, matplotlib, TensorBoard), summary (rows, the population's
report), cli (`hetrl report`).
"""

_EXPORTS = {"load_runs": "runs", "load_population": "runs", "Group": "runs", "Member": "runs",
            "write_population_report": "summary", "row": "summary", "aggregate": "stats",
            "learning_curve": "curves"}


def __getattr__(name):  # lazy: `hetrl --help` registers the subcommand without importing scipy
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"hetrl.report.{_EXPORTS[name]}"), name)
    raise AttributeError(name)


__all__ = list(_EXPORTS)
