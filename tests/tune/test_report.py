"""Study outputs drawn by optuna's matplotlib plots: files written, figures closed."""

from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from rlfleet.tune.report import (  # noqa: E402
    HISTORY_PLOT,
    IMPORTANCE_PLOT,
    plot_optimization_history,
    plot_param_importances,
)


def _study() -> optuna.Study:
    study = optuna.create_study(study_name="toy", direction="maximize")
    for x, value in ((0.1, 1.0), (0.5, 3.0), (0.9, 2.0)):
        study.enqueue_trial({"x": x})
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
        assert trial.params["x"] == x
        study.tell(trial, value)
    pruned = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    pruned.report(0.5, step=128)
    study.tell(pruned, state=optuna.trial.TrialState.PRUNED)
    return study


def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_history_and_importances_are_pngs_and_no_figure_stays_open(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    study = _study()
    open_before = set(plt.get_fignums())
    history = plot_optimization_history(study, tmp_path / HISTORY_PLOT)
    importances = plot_param_importances(study, tmp_path / IMPORTANCE_PLOT)
    assert history == tmp_path / "plots" / "optimization_history.png"
    assert importances == tmp_path / "plots" / "param_importances.png"
    assert _png(history)
    assert _png(importances)
    assert set(plt.get_fignums()) == open_before


def test_no_history_plot_before_any_trial_has_a_value(tmp_path: Path) -> None:
    study = optuna.create_study(study_name="empty")
    study.ask()  # running, no value yet
    assert plot_optimization_history(study, tmp_path / HISTORY_PLOT) is None
    assert not (tmp_path / "plots").exists()


def test_a_study_file_that_cannot_be_written_is_a_run_dir_error(tmp_path: Path) -> None:
    """The best config, the trials table and the plots: a failed write is a one-line
    RunDirError naming the file and the free space, and leaves no temporary file."""
    from rlfleet.errors import RunDirError
    from rlfleet.tune.report import write_trials_table

    study = _study()
    (tmp_path / "plots").write_text("a file where the folder goes")
    with pytest.raises(RunDirError, match=r"trials\.parquet: cannot write \(.*free"):
        write_trials_table(study.trials, tmp_path / "plots" / "trials.parquet")
    with pytest.raises(RunDirError, match=r"optimization_history\.png: cannot write \("):
        plot_optimization_history(study, tmp_path / HISTORY_PLOT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots"]
