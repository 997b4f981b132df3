"""What a study reports: one line per finished trial, and its outputs on disk.

Outputs, written to the study directory when the workers are done (and rewritten by every
later invocation, so they always describe the whole study):

``best.yaml``
    The best completed trial's run config; ``rlfleet train best.yaml``
    trains it as is.
``trials.parquet``
    One row per trial: ``number``, ``state``, ``value``, ``seed_scores``, ``last_step`` and
    ``last_score`` (its last reported test step), ``duration_s``, ``worker``, ``run_dir``,
    ``error``, ``retry_of`` / ``retried_as``, and one ``params/<name>`` column per
    parameter.
``plots/optimization_history.png``
    Every completed trial's value against its number and the best value so far
    (:func:`optuna.visualization.matplotlib.plot_optimization_history`), plus pruned trials
    at their last reported score, which optuna's plot leaves out.
``plots/param_importances.png``
    How much each parameter explains the completed trials' values
    (:func:`optuna.visualization.matplotlib.plot_param_importances` with PED-ANOVA, Watanabe
    et al. 2023); drawn once at least two trials have completed.

optuna draws on pyplot figures; each is closed once saved, so a long-lived process that
tunes several times keeps no figure alive.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from rich.console import Console

from rlfleet.errors import replacing
from rlfleet.logging.plots import save_figure
from rlfleet.tune import attrs

if TYPE_CHECKING:
    import optuna
    from matplotlib.figure import Figure
    from optuna.trial import FrozenTrial

    from rlfleet.tune.setup import StudySetup

BEST_CONFIG_FILE = "best.yaml"
TRIALS_FILE = "trials.parquet"
HISTORY_PLOT = "plots/optimization_history.png"
IMPORTANCE_PLOT = "plots/param_importances.png"
MIN_TRIALS_FOR_IMPORTANCE = 2


@dataclass(frozen=True)
class TuneResult:
    """Where a study stands after :func:`rlfleet.tune.tune` and where its outputs are."""

    study_name: str
    study_dir: Path
    requested: int
    """Trials the study was asked for in total."""
    complete: int
    pruned: int
    failed: int
    unfinished: int
    """Trials still queued or running (after a timeout, or running in another worker)."""
    best_trial: int | None
    best_value: float | None
    best_config: Path | None
    """``best.yaml``; None until a trial has completed."""
    trials_table: Path
    plots: tuple[Path, ...]
    notes: tuple[str, ...]
    """Why an output is missing (e.g. too few completed trials for importances)."""


def counted_trials(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials that count toward the study's total: all but those replaced by a retry."""
    replaced = {t.user_attrs[attrs.RETRY_OF] for t in trials if attrs.RETRY_OF in t.user_attrs}
    return [t for t in trials if t.number not in replaced]


class TrialLog:
    """Console lines of a study: one when it starts, one per finished trial."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False, soft_wrap=True)

    def start(self, setup: StudySetup, storage: str, queued: int) -> None:
        """Say what the study searches, where it is stored, and how many trials it adds."""
        plan = setup.plan
        self.console.print(
            f"study {setup.study_name!r} ({storage}): {plan.base.algo} on {plan.base.env.id}, "
            f"{setup.config.trials} trials of {plan.seeds} seed(s) x "
            f"{plan.base.trainer.max_steps:,} steps, {queued} newly queued\n"
            f"searching {plan.space.describe()}"
        )

    def trial(self, trial: FrozenTrial, counted: list[FrozenTrial], setup: StudySetup) -> None:
        """One line for a finished trial: progress, outcome, time and parameters."""
        done = sum(t.state.is_finished() for t in counted)
        total = max(setup.config.trials, len(counted))
        width = len(str(total))
        self.console.print(
            f"[{done:>{width}}/{total}] trial {trial.number} {_outcome(trial)}"
            f"{_duration(trial)}{_format_params(trial.params)}"
        )


def finish_study(
    study_name: str, storage: optuna.storages.BaseStorage, study_dir: str | Path, requested: int
) -> TuneResult:
    """Write the study's outputs to ``study_dir`` and summarise it."""
    import optuna

    study_dir = Path(study_dir)
    study = optuna.load_study(study_name=study_name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    counted = counted_trials(trials)
    states = [t.state for t in counted]
    state = optuna.trial.TrialState
    complete = [t for t in trials if t.state == state.COMPLETE and t.value is not None]
    best = max(complete, key=lambda t: float(t.value), default=None)  # type: ignore[arg-type]
    notes: list[str] = []
    best_config = None
    if best is not None:
        best_config = write_best_config(best, study, study_dir / BEST_CONFIG_FILE)
    else:
        notes.append("no trial has completed yet, so there is no best.yaml")
    trials_table = write_trials_table(trials, study_dir / TRIALS_FILE)
    plots = []
    history = plot_optimization_history(study, study_dir / HISTORY_PLOT)
    if history is not None:
        plots.append(history)
    if len(complete) >= MIN_TRIALS_FOR_IMPORTANCE:
        plots.append(plot_param_importances(study, study_dir / IMPORTANCE_PLOT))
    else:
        notes.append(
            f"parameter importances need {MIN_TRIALS_FOR_IMPORTANCE} completed trials "
            f"(have {len(complete)}); rerun to add trials"
        )
    return TuneResult(
        study_name=study_name,
        study_dir=study_dir,
        requested=requested,
        complete=states.count(state.COMPLETE),
        pruned=states.count(state.PRUNED),
        failed=states.count(state.FAIL),
        unfinished=states.count(state.WAITING) + states.count(state.RUNNING),
        best_trial=None if best is None else best.number,
        best_value=None if best is None else best.value,
        best_config=best_config,
        trials_table=trials_table,
        plots=tuple(plots),
        notes=tuple(notes),
    )


# --------------------------------------------------------------------- files
def write_best_config(trial: FrozenTrial, study: optuna.Study, path: str | Path) -> Path:
    """Write ``trial``'s run config as YAML that ``rlfleet train --config`` accepts."""
    path = Path(path)
    config = trial.user_attrs[attrs.CONFIG]
    setup = study.user_attrs.get(attrs.SETUP, {})
    seeds = setup.get("seeds", 1)
    header = (
        f"# Best trial of study {study.study_name!r}: trial {trial.number}, value "
        f"{trial.value:.4g} ({setup.get('aggregate', 'mean')} of the {setup.get('score', 'last')} "
        f"test score over {seeds} seed(s)).\n"
        f"# Train it: rlfleet train {config['algo']} --config {path.name}\n"
    )
    _write_atomic(path, (header + yaml.safe_dump(config, sort_keys=False)).encode())
    return path


def write_trials_table(trials: list[FrozenTrial], path: str | Path) -> Path:
    """Write one row per trial as parquet (columns: see the module docstring)."""
    path = Path(path)
    retried_as = {
        t.user_attrs[attrs.RETRY_OF]: t.number for t in trials if attrs.RETRY_OF in t.user_attrs
    }
    rows = [_trial_row(t, retried_as.get(t.number)) for t in trials]
    columns = {
        name: pa.array([row[name] for row in rows], type=kind) for name, kind in _COLUMNS.items()
    }
    for name in sorted({name for t in trials for name in t.params}):
        columns[f"params/{name}"] = _column([t.params.get(name) for t in trials])
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), buffer)
    _write_atomic(path, buffer.getvalue().to_pybytes())
    return path


_COLUMNS: dict[str, pa.DataType] = {
    "number": pa.int64(),
    "state": pa.string(),
    "value": pa.float64(),
    "seed_scores": pa.list_(pa.float64()),
    "last_step": pa.int64(),
    "last_score": pa.float64(),
    "duration_s": pa.float64(),
    "datetime_start": pa.timestamp("us"),
    "worker": pa.string(),
    "run_dir": pa.string(),
    "error": pa.string(),
    "retry_of": pa.int64(),
    "retried_as": pa.int64(),
}
"""The fixed columns of trials.parquet, typed so that an all-empty column keeps its type."""


def _trial_row(trial: FrozenTrial, retried_as: int | None) -> dict[str, Any]:
    steps = trial.intermediate_values
    last_step = max(steps) if steps else None
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "seed_scores": trial.user_attrs.get(attrs.SEED_SCORES),
        "last_step": last_step,
        "last_score": None if last_step is None else steps[last_step],
        "duration_s": None if trial.duration is None else trial.duration.total_seconds(),
        "datetime_start": trial.datetime_start,
        "worker": trial.user_attrs.get(attrs.WORKER),
        "run_dir": trial.user_attrs.get(attrs.RUN_DIR),
        "error": trial.user_attrs.get(attrs.ERROR),
        "retry_of": trial.user_attrs.get(attrs.RETRY_OF),
        "retried_as": retried_as,
    }


def _column(values: list[Any]) -> pa.Array:
    """An arrow column; values of mixed types (a categorical of numbers and strings) become
    strings."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` whole or not at all (:func:`~rlfleet.errors.replacing`)."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


# --------------------------------------------------------------------- plots
def plot_optimization_history(study: optuna.Study, out: str | Path) -> Path | None:
    """Trial values against trial numbers, with the best so far and pruned trials at their
    last score; None when no trial has a value yet."""
    from optuna.visualization.matplotlib import plot_optimization_history as draw_history

    out = Path(out)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    pruned = [t for t in trials if t.state.name == "PRUNED" and t.intermediate_values]
    if not complete and not pruned:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # optuna's notice that its matplotlib plots are experimental
        ax = draw_history(study)
    if pruned:
        last = [t.intermediate_values[max(t.intermediate_values)] for t in pruned]
        ax.plot(
            [t.number for t in pruned], last, "x", color="tab:gray", label="pruned (last score)"
        )
        ax.legend(loc="best")
    ax.set_title(f"{study.study_name}: optimization history")
    return _save(ax.get_figure(root=True), out)


def plot_param_importances(study: optuna.Study, out: str | Path) -> Path:
    """Horizontal bars of each parameter's importance over the completed trials."""
    import optuna
    from optuna.visualization.matplotlib import plot_param_importances as draw_importances

    out = Path(out)
    with warnings.catch_warnings():
        # Experimental-API notices, and PED-ANOVA's note that few trials make importances
        # equal: the plot shows that plainly.
        warnings.simplefilter("ignore")
        ax = draw_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    ax.set_title(f"{study.study_name}: parameter importances (PED-ANOVA)")
    return _save(ax.get_figure(root=True), out)


def _save(figure: Figure | None, out: Path) -> Path:
    """Save the pyplot figure optuna drew on, then close it."""
    import matplotlib.pyplot as plt  # pyplot on demand: importing it picks a backend

    assert figure is not None, "optuna drew on an axes outside any figure"
    try:
        return save_figure(figure, out, tight=True)
    finally:
        plt.close(figure)


# --------------------------------------------------------------------- lines
def _outcome(trial: FrozenTrial) -> str:
    if trial.state.name == "COMPLETE":
        scores = trial.user_attrs.get(attrs.SEED_SCORES) or []
        seeds = f" (seeds {', '.join(f'{s:.1f}' for s in scores)})" if len(scores) > 1 else ""
        return f"COMPLETE value {trial.value:.2f}{seeds}"
    if trial.state.name == "PRUNED":
        steps = trial.intermediate_values
        if not steps:
            return "PRUNED"
        last = max(steps)
        return f"PRUNED at step {last:,} (score {steps[last]:.2f})"
    error = trial.user_attrs.get(attrs.ERROR, "interrupted; queued again")
    return f"FAILED {error}"


def _duration(trial: FrozenTrial) -> str:
    return "" if trial.duration is None else f" in {trial.duration.total_seconds():.1f} s"


def _format_params(params: dict[str, Any]) -> str:
    if not params:
        return ""
    return " | " + " ".join(
        f"{name}={value:.3g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in params.items()
    )
