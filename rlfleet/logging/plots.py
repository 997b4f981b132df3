"""PNG plots of training histories: one run's learning curve, or several runs overlaid.

Seeds of one configuration are drawn as a single mean curve with a min..max band, so a
comparison of configurations is not a tangle of per-seed lines. Runs count as seeds of one
configuration when their ``config.yaml`` files are equal once every ``seed``, ``run_dir``
and ``run_id`` key is removed.

Plots are drawn with matplotlib's object-oriented :class:`~matplotlib.figure.Figure`, which
renders with the Agg backend on save and never touches pyplot's global state, so plotting
works on a headless machine and from worker threads. matplotlib is imported inside the
functions to keep ``import rlfleet.logging`` fast for the trainer, which never plots.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from rlfleet.errors import RunDirError
from rlfleet.logging.history import INT_COLUMNS, STEP_KEY, History

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

HISTORY_FILE = "history.parquet"
CONFIG_FILE = "config.yaml"

TRAIN_RETURN = "train/return_mean"
TEST_RETURN = "test/return_mean"
TEST_RETURN_STD = "test/return_std"

_RUN_SPECIFIC_KEYS = frozenset({"seed", "run_dir", "run_id"})
"""Config keys that differ between seeds of one experiment, ignored when grouping runs."""

_SEED_SUFFIX = re.compile(r"(-s\d+|_seed\d+)$")


@dataclass(frozen=True)
class _Curve:
    """One line of a multi-run plot: a single run, or the mean of a group of seeds."""

    label: str
    run_dirs: tuple[Path, ...]
    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray | None
    """Pointwise minimum over the group's runs; ``None`` for a single run."""
    high: np.ndarray | None
    """Pointwise maximum over the group's runs; ``None`` for a single run."""


def plot_learning_curve(
    history_path: str | Path, out: str | Path, title: str | None = None
) -> Path:
    """Plot train and test return against env steps for one run; returns `out`.

    Train return is a thin line; test return is a line with markers, with a ±1 std band
    where ``test/return_std`` was logged. The title defaults to the run directory's name.

    Raises:
        RunDirError: `history_path` does not exist or holds neither return metric.
        CheckpointError: `history_path` is not a readable history file.
    """
    history_path, out = Path(history_path), Path(out)
    if not history_path.is_file():
        raise RunDirError(
            f"{history_path}: no such history file — expected {HISTORY_FILE} written by "
            "`rlfleet train`"
        )
    history = History(history_path)
    train_steps, train_values = history.series(TRAIN_RETURN)
    test_steps, test_values = history.series(TEST_RETURN)
    if train_steps.size == 0 and test_steps.size == 0:
        raise RunDirError(
            f"{history_path}: no {TRAIN_RETURN!r} or {TEST_RETURN!r} values to plot; "
            f"available metric columns: {_metric_columns(history.columns)}"
        )

    fig, ax = _new_figure()
    if train_steps.size:
        ax.plot(train_steps, train_values, linewidth=1.0, alpha=0.8, label="train return")
    if test_steps.size:
        (line,) = ax.plot(test_steps, test_values, marker="o", markersize=3, label="test return")
        # The std is only meaningful next to the mean of the same test step, i.e. same row.
        band = np.array(
            [
                (row[STEP_KEY], row[TEST_RETURN], row[TEST_RETURN_STD])
                for row in history.rows
                if row.get(TEST_RETURN) is not None and row.get(TEST_RETURN_STD) is not None
            ],
            dtype=np.float64,
        )
        if band.size:
            steps, mean, std = band.T
            ax.fill_between(
                steps,
                mean - std,
                mean + std,
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
                label="test return ± std",
            )
    ax.set_title(title if title is not None else _run_name(history_path.parent))
    ax.set_ylabel("episode return")
    return _save(fig, ax, out)


def plot_runs(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    metric: str = "test/return_mean",
    *,
    group_by_config: bool = True,
) -> Path:
    """Overlay `metric` against env steps for several runs; returns `out`.

    With `group_by_config`, runs sharing a configuration (up to seed, run dir and run id)
    are drawn as their mean with a min..max band, labelled ``"<name> (n=<runs>)"``, where
    the name is the first run dir's with a ``-s<N>`` / ``_seed<N>`` suffix removed. The
    mean is taken on the union of the runs' logged env steps, clipped to the range every
    run covers. A run alone in its group is a plain line labelled with its dir name. Runs
    that have not logged `metric` yet are left out.

    Raises:
        RunDirError: a dir has no history.parquet, a config.yaml is not a YAML mapping, or
            no run has logged `metric` (the message lists the metrics that exist).
        CheckpointError: a history.parquet is not readable.
    """
    curves = _group_run_curves(
        [Path(run_dir) for run_dir in run_dirs], metric, group_by_config=group_by_config
    )
    fig, ax = _new_figure()
    for curve in curves:
        (line,) = ax.plot(curve.steps, curve.mean, label=curve.label)
        if curve.low is not None and curve.high is not None:
            ax.fill_between(
                curve.steps, curve.low, curve.high, color=line.get_color(), alpha=0.2, linewidth=0
            )
    ax.set_ylabel(metric)
    return _save(fig, ax, Path(out))


def _group_run_curves(
    run_dirs: Sequence[Path], metric: str, *, group_by_config: bool
) -> list[_Curve]:
    """The curves :func:`plot_runs` draws, one per group of runs, in first-seen order."""
    run_dirs = [Path(run_dir) for run_dir in run_dirs]
    series: dict[Path, tuple[np.ndarray, np.ndarray]] = {}
    columns: set[str] = set()
    for run_dir in run_dirs:
        history_path = run_dir / HISTORY_FILE
        if not history_path.is_file():
            raise RunDirError(
                f"{run_dir}: no {HISTORY_FILE} — expected a run directory written by "
                "`rlfleet train`"
            )
        history = History(history_path)
        columns.update(history.columns)
        steps, values = _clean_series(*history.series(metric))
        if steps.size:
            series[run_dir] = steps, values
    if not series:
        raise RunDirError(
            f"metric {metric!r} not found in any of the {len(run_dirs)} runs "
            f"({', '.join(str(d) for d in run_dirs)}); "
            f"available metric columns: {_metric_columns(columns)}"
        )

    groups: list[tuple[object, list[Path]]] = []
    for run_dir in series:
        config = _comparable_config(run_dir) if group_by_config else None
        group = next((g for g in groups if config is not None and g[0] == config), None)
        if group is None:
            groups.append((config, [run_dir]))
        else:
            group[1].append(run_dir)
    return [_group_curve(members, series, metric) for _, members in groups]


def _group_curve(
    members: list[Path], series: Mapping[Path, tuple[np.ndarray, np.ndarray]], metric: str
) -> _Curve:
    if len(members) == 1:
        steps, values = series[members[0]]
        return _Curve(_run_name(members[0]), (members[0],), steps, values, None, None)
    member_series = [series[run_dir] for run_dir in members]
    start = max(steps[0] for steps, _ in member_series)
    stop = min(steps[-1] for steps, _ in member_series)
    grid = np.unique(np.concatenate([steps for steps, _ in member_series]))
    grid = grid[(grid >= start) & (grid <= stop)]
    if grid.size == 0:
        raise RunDirError(
            f"runs {', '.join(str(d) for d in members)} share a config but their {metric!r} "
            "values cover no common env_step range; pass group_by_config=False to plot "
            "them one by one"
        )
    stacked = np.stack([np.interp(grid, steps, values) for steps, values in member_series])
    base = _SEED_SUFFIX.sub("", _run_name(members[0]))
    return _Curve(
        f"{base} (n={len(members)})",
        tuple(members),
        grid,
        stacked.mean(axis=0),
        stacked.min(axis=0),
        stacked.max(axis=0),
    )


def _clean_series(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted by env_step, finite values only, the last value kept where a step repeats.

    ``np.interp`` needs increasing x, and a NaN would spread to every interpolated point
    next to it.
    """
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    last_of_step = np.ones(steps.size, dtype=bool)
    last_of_step[:-1] = steps[1:] != steps[:-1]
    return steps[last_of_step], values[last_of_step]


def _comparable_config(run_dir: Path) -> object:
    """The run's config without run-specific keys, or ``None`` if it has no config.yaml."""
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        return None
    try:
        config = yaml.safe_load(config_path.read_text())
    except yaml.YAMLError as exc:
        raise RunDirError(f"{config_path}: not valid YAML ({exc})") from exc
    if not isinstance(config, Mapping):
        raise RunDirError(
            f"{config_path}: expected a YAML mapping of config fields, got {type(config).__name__}"
        )
    return _without_run_keys(config)


def _without_run_keys(value: object) -> object:
    if isinstance(value, Mapping):
        return {
            key: _without_run_keys(item)
            for key, item in value.items()
            if key not in _RUN_SPECIFIC_KEYS
        }
    if isinstance(value, list):
        return [_without_run_keys(item) for item in value]
    return value


def _metric_columns(columns: set[str] | list[str]) -> str:
    names = sorted(set(columns) - set(INT_COLUMNS))
    return ", ".join(names) if names else "(none)"


def _run_name(run_dir: Path) -> str:
    # abspath, so that "." or "runs/ppo/" still yield the directory's own name.
    return Path(os.path.abspath(run_dir)).name


def _new_figure() -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    return fig, fig.add_subplot()


def _save(fig: Figure, ax: Axes, out: Path) -> Path:
    ax.set_xlabel("env steps")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
