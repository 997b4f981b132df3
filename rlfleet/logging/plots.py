"""PNG plots of training histories: one run's learning curve, or several runs compared.

:func:`plot_learning_curve` draws one run's train and test return; :func:`plot_runs`
(``rlfleet plot RUN_DIR...``) compares runs, aggregating the seeds of each configuration
by the rules below; :func:`compare_runs` returns what it draws, as numbers.

Groups
    Runs are seeds of one configuration when their ``config.yaml`` files are equal once
    every ``seed``, ``run_dir`` and ``run_id`` key is removed. A run without a config.yaml
    is a group of its own.
Panels
    One panel per env (config.yaml's ``env.id``), titled with it. Runs whose step counters
    count different things (env steps; an offline run's gradient steps, see
    :attr:`History.step_unit <rlfleet.logging.history.History.step_unit>`) get panels of
    their own too, so that no x axis mixes the two; the axis says which it counts.
Names
    A group is named by its algorithm and env and the config values that set it apart from
    the other groups of the same algorithm in its panel (``ppo on CartPole-v1,
    learning_rate=0.001``), then by what its line and band are: ``IQM, 95% bootstrap CI,
    n=3 runs``, or ``1 run (<dir>)``.
Aggregate
    At each step, the interquartile mean of the group's runs (IQM: the mean of the middle
    50%, as in rliable, Agarwal et al. 2021, "Deep RL at the Edge of the Statistical
    Precipice"; with fewer than 4 runs nothing is trimmed and it is the mean), or their mean
    (``statistic="mean"``). The band is a percentile bootstrap confidence interval of that
    statistic over runs, computed by :func:`scipy.stats.bootstrap`: whole runs are resampled,
    as rliable's interval estimates do, with a fixed seed so that the same runs give the
    same plot. Few runs give a rough interval: 3 runs resample into only 10 distinct sets.
    Runs that log at different steps are interpolated linearly onto the union of the
    steps the group's runs logged.
Steps covered
    A curve covers only the steps that every run of its group reached, so that each point
    aggregates all n runs. A run that stopped early because it solved its task holds its
    last value until the group's longest run ends: the curve goes on, and a ▼ marks each
    step where a run solved and stopped. A run counts as solved when its history's stop
    reason is the stop rule ``stop_fn`` (the test score reached the target); a history
    without a stop reason (older rlfleet, or an interrupted run) counts as solved when its
    best ``test/score`` reached config.yaml's ``trainer.target_reward``. A run that stopped
    early for any other reason (early stopping, a crash or Ctrl-C) is not extended: the
    curve ends at its last step, and the legend names the run that ended it.
Labels
    ``labels`` names the runs, one label per run directory, in place of the names above
    (xagents' plot labels): runs that share a label are one group, seeds aggregated as
    above; each label is its group's name in the legend.
Thinning
    ``every=N`` keeps every N-th value each run logged for the metric, from its first
    (xagents' ``history_interval``), before anything else is done with them.
Smoothing
    ``smooth=N`` replace replaces each logged value by the mean of the last N values the run
    logged for the metric (a trailing rolling window over history rows, shorter over the
    first N - 1 rows), per run, before runs are aggregated. A solved run's held value counts
    as logged at each later step its group logged, so its smoothed line goes on to its last
    value. The y axis says that the values are smoothed.

Libraries, and what is written here. The statistics come from scipy: the IQM is
:func:`scipy.stats.trim_mean` with 25% cut from each end, rliable's own definition
(``rliable.metrics.aggregate_iqm``), and the band is :func:`scipy.stats.bootstrap`,
vectorised over steps. rliable itself is not used: its ``get_interval_estimates`` is a
bootstrap driver for score matrices of runs x tasks, so for a curve it would add only what
scipy already does, at the price of arch, statsmodels, pandas and seaborn as dependencies
of ``rlfleet plot``, and it calls the statistic once per resample (50,000 by default) where
scipy draws resamples in vectorised batches. seaborn's
``lineplot(errorbar=("ci", 95))`` draws a band but returns no numbers, and
:func:`compare_runs` must. What is left is rlfleet's own: grouping run directories by
config, panels by env and step unit, holding solved runs at their last value, and the
common step grid; no library knows run directories or stop reasons.

Plots are drawn with matplotlib's object-oriented :class:`~matplotlib.figure.Figure`, which
renders with the Agg backend on save and never touches pyplot's global state, so plotting
works on a headless machine and from worker threads. matplotlib and scipy are imported
inside the functions to keep ``import rlfleet.logging`` fast for the trainer, which plots
only once, at the end of a run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import yaml

from rlfleet.config.versions import current_version
from rlfleet.errors import ConfigError, RunDirError, replacing
from rlfleet.logging.history import INT_COLUMNS, STEP_KEY, History

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

HISTORY_FILE = "history.parquet"
CONFIG_FILE = "config.yaml"

TRAIN_RETURN = "train/return_mean"
TEST_RETURN = "test/return_mean"
TEST_RETURN_STD = "test/return_std"
TEST_SCORE = "test/score"
DATASET_RETURN = "dataset/return_mean"

Statistic = Literal["iqm", "mean"]
STATISTIC_NAMES: dict[str, str] = {"iqm": "IQM", "mean": "mean"}
"""How each statistic is named in legends."""

BOOTSTRAP_RESAMPLES = 9999
"""scipy's default number of bootstrap resamples."""
_BOOTSTRAP_BATCH = 1000
"""Resamples drawn at once: bounds memory at batch x runs x steps floats."""
_BOOTSTRAP_SEED = 0

SOLVED_STOP_REASON = "stop_fn"
"""The trainer's stop reasons that start with this mean the task was solved: ``stop_fn``
and ``stop_fn (test in training)``."""
SOLVED_MARKER = "v"

_RUN_SPECIFIC_KEYS = frozenset({"seed", "run_dir", "run_id"})
"""Config keys that differ between seeds of one experiment, ignored when grouping runs."""
_NAMED_ELSEWHERE = frozenset({"algo", "env", "env.id"})
"""Config keys a group's name shows anyway, left out of the values that set groups apart."""
_MAX_NAMED_DIFFERENCES = 3
_STEP_FORMAT = "{x:,.0f}"
"""Step ticks with thousands separators, as the progress lines print them."""
_MISSING = object()


@dataclass(frozen=True)
class GroupCurve:
    """One line of a comparison: one run, or the aggregate of a group of seeds."""

    name: str
    """The group: algorithm, env and what sets it apart (``ppo on CartPole-v1, gamma=0.9``)."""
    summary: str
    """What the line and band are (``IQM, 95% bootstrap CI, n=3 runs``), and notes on
    runs held at their last value or a run that ended the curve early."""
    run_dirs: tuple[Path, ...]
    steps: np.ndarray
    center: np.ndarray
    """The run's values, or the statistic over the group's runs at each step."""
    low: np.ndarray | None
    """Lower end of the bootstrap confidence interval; ``None`` for a single run."""
    high: np.ndarray | None
    """Upper end of the bootstrap confidence interval; ``None`` for a single run."""
    solved_steps: tuple[int, ...] = ()
    """Steps where a run solved its task and stopped while others went on; that run's last
    value is held from there."""

    @property
    def label(self) -> str:
        """The legend entry: name, then summary on a second line."""
        return f"{self.name}\n{self.summary}"


@dataclass(frozen=True)
class Panel:
    """The curves of one env whose step counters count the same unit."""

    env: str
    step_unit: str
    curves: tuple[GroupCurve, ...]


@dataclass(frozen=True)
class _Run:
    """One run dir's values of the plotted metric, and what the plot needs to know of it."""

    run_dir: Path
    steps: np.ndarray
    values: np.ndarray
    config: Mapping[str, object] | None
    step_unit: str
    stop_reason: str | None
    solved: bool

    @property
    def env(self) -> str:
        env = self.config.get("env") if self.config is not None else None
        if isinstance(env, Mapping):
            env = env.get("id")
        return str(env) if env is not None else "unknown env (no config.yaml)"

    @property
    def name(self) -> str:
        return _run_name(self.run_dir)


def plot_learning_curve(
    history_path: str | Path,
    out: str | Path,
    title: str | None = None,
    *,
    smooth: int = 1,
    every: int = 1,
) -> Path:
    """Plot train and test return of one run against its steps; returns `out`.

    Train return is a thin line; test return is a line with markers, with a ±1 std band
    where ``test/return_std`` was logged. An offline run's x axis counts gradient steps, and
    its dataset's mean episode return is drawn as a dashed reference line. `smooth` > 1
    applies a trailing rolling mean over that many history rows to each line; `every` > 1
    draws every `every`-th logged value only. The title defaults to :func:`run_title`.

    Raises:
        RunDirError: `history_path` does not exist or holds neither return metric.
        ConfigError: `smooth` or `every` is below 1.
        CheckpointError: `history_path` is not a readable history file.
    """
    history_path, out = Path(history_path), Path(out)
    _check_smooth(smooth)
    _check_every(every)
    if not history_path.is_file():
        raise RunDirError(
            f"{history_path}: no such history file — expected {HISTORY_FILE} written by "
            "`rlfleet train`"
        )
    history = History(history_path)
    if not history.series(TRAIN_RETURN)[0].size and not history.series(TEST_RETURN)[0].size:
        raise RunDirError(
            f"{history_path}: no {TRAIN_RETURN!r} or {TEST_RETURN!r} values to plot; "
            f"available metric columns: {_metric_columns(history.columns)}"
        )
    title = title if title is not None else run_title(history_path.parent)
    return save_figure(_learning_curve_figure(history, title, smooth, every), out)


def run_title(run_dir: str | Path, label: str | None = None) -> str:
    """A run's plot title: ``label`` (default: the directory's name), then the algorithm and
    env its config.yaml names (``ppo-cartpole: ppo on CartPole-v1``)."""
    name = label if label is not None else _run_name(Path(run_dir))
    config = _read_config(Path(run_dir))
    if config is None:
        return name
    env = config.get("env")
    env_id = env.get("id") if isinstance(env, Mapping) else env
    return f"{name}: {config.get('algo', '?')} on {env_id}"


def _learning_curve_figure(history: History, title: str, smooth: int, every: int = 1) -> Figure:
    from matplotlib.ticker import StrMethodFormatter

    train_steps, train_values = (part[::every] for part in history.series(TRAIN_RETURN))
    test_steps, test_values = (part[::every] for part in history.series(TEST_RETURN))
    fig, ax = _new_figure()
    if train_steps.size:
        ax.plot(
            train_steps,
            rolling_mean(train_values, smooth),
            linewidth=1.0,
            alpha=0.8,
            label="train return",
        )
    if test_steps.size:
        (line,) = ax.plot(
            test_steps,
            rolling_mean(test_values, smooth),
            marker="o",
            markersize=3,
            label="test return",
        )
        # The std is only meaningful next to the mean of the same test step, i.e. same row.
        band = np.array(
            [
                (row[STEP_KEY], row[TEST_RETURN], row[TEST_RETURN_STD])
                for row in history.rows
                if row.get(TEST_RETURN) is not None and row.get(TEST_RETURN_STD) is not None
            ],
            dtype=np.float64,
        )[::every]
        if band.size:
            steps, mean, std = band.T
            mean, std = rolling_mean(mean, smooth), rolling_mean(std, smooth)
            ax.fill_between(
                steps,
                mean - std,
                mean + std,
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
                label="test return ± std",
            )
    _, dataset_return = history.series(DATASET_RETURN)
    if dataset_return.size:
        ax.axhline(
            dataset_return[-1],
            color="gray",
            linestyle="--",
            linewidth=1.0,
            label="dataset return (mean of its episodes)",
        )
    ax.set_title(title)
    ax.set_ylabel(_y_label("episode return", smooth))
    ax.set_xlabel(history.step_unit)
    ax.xaxis.set_major_formatter(StrMethodFormatter(_STEP_FORMAT))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    return fig


def plot_runs(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    metric: str = TEST_RETURN,
    *,
    group_by_config: bool = True,
    statistic: Statistic = "iqm",
    smooth: int = 1,
    confidence_level: float = 0.95,
    labels: Sequence[str] | None = None,
    every: int = 1,
) -> Path:
    """Compare `metric` across runs, one panel per env; returns `out`.

    The seeds of each configuration are drawn as their IQM (or mean) with a bootstrap
    confidence band, by the rules of the module docstring; see :func:`compare_runs` for the
    arguments and errors.
    """
    panels = compare_runs(
        run_dirs,
        metric,
        group_by_config=group_by_config,
        statistic=statistic,
        smooth=smooth,
        confidence_level=confidence_level,
        labels=labels,
        every=every,
    )
    return save_figure(_runs_figure(panels, metric, smooth), Path(out))


def compare_runs(
    run_dirs: Sequence[str | Path],
    metric: str = TEST_RETURN,
    *,
    group_by_config: bool = True,
    statistic: Statistic = "iqm",
    smooth: int = 1,
    confidence_level: float = 0.95,
    labels: Sequence[str] | None = None,
    every: int = 1,
) -> list[Panel]:
    """The panels :func:`plot_runs` draws: runs grouped, aggregated and named (module docstring).

    Args:
        run_dirs: run directories written by ``rlfleet train``.
        metric: the history column to compare.
        group_by_config: aggregate runs that differ only by seed; ``False`` draws each run
            on its own.
        statistic: ``"iqm"`` (interquartile mean) or ``"mean"`` across a group's runs.
        smooth: trailing rolling window, in history rows, applied to each run (1: none).
        confidence_level: of the bootstrap confidence band.
        labels: one name per run directory, in place of the automatic names; runs that share
            one are one group.
        every: keep every ``every``-th logged value of each run (1: all).

    Panels come in the order their first run was given, and curves likewise. Runs that have
    not logged `metric` yet are left out.

    Raises:
        ConfigError: no run dirs, an unknown `statistic`, `smooth` or `every` below 1,
            `confidence_level` outside (0, 1), or not one label per run directory.
        RunDirError: a path is not a run directory (no history.parquet), a config.yaml is
            not a YAML mapping, no run has logged `metric` (the message lists the metrics
            that exist), or the runs of a group share no step range.
        CheckpointError: a history.parquet is not readable.
    """
    if not run_dirs:
        raise ConfigError(
            "no run directories to plot: expected one or more directories written by "
            "`rlfleet train`"
        )
    if statistic not in STATISTIC_NAMES:
        raise ConfigError(
            f"statistic must be one of {', '.join(STATISTIC_NAMES)}; got {statistic!r}"
        )
    if not 0 < confidence_level < 1:
        raise ConfigError(f"confidence_level must be in (0, 1); got {confidence_level}")
    _check_smooth(smooth)
    _check_every(every)
    if labels is not None and len(labels) != len(run_dirs):
        raise ConfigError(
            f"labels: expected one per run directory ({len(run_dirs)}), got {len(labels)}"
        )
    runs, columns, label_of = [], set(), {}
    for i, run_dir in enumerate(run_dirs):
        run, history_columns = _load_run(Path(run_dir), metric, every)
        columns.update(history_columns)
        if run is not None:
            runs.append(run)
            if labels is not None:
                label_of[id(run)] = labels[i]
    if not runs:
        raise RunDirError(
            f"metric {metric!r} not found in any of the {len(run_dirs)} runs "
            f"({', '.join(str(d) for d in run_dirs)}); "
            f"available metric columns: {_metric_columns(columns)}"
        )

    groups: list[tuple[object, list[_Run]]] = []
    for run in runs:
        config: object = (
            _without_run_keys(run.config) if group_by_config and run.config is not None else None
        )
        if labels is not None:
            config = ("label", label_of[id(run)], run.env, run.step_unit)
        group = next((g for g in groups if config is not None and g[0] == config), None)
        if group is None:
            groups.append((config, [run]))
        else:
            group[1].append(run)

    panels: dict[tuple[str, str], list[list[_Run]]] = {}
    for _, members in groups:
        panels.setdefault((members[0].env, members[0].step_unit), []).append(members)
    return [
        Panel(
            env,
            unit,
            tuple(
                _group_curve(members, name, statistic, confidence_level, smooth, metric)
                for members, name in zip(
                    panel_groups,
                    [label_of[id(m[0])] for m in panel_groups]
                    if labels is not None
                    else _group_names(panel_groups),
                    strict=True,
                )
            ),
        )
        for (env, unit), panel_groups in panels.items()
    ]


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing rolling mean: each value becomes the mean of it and the ``window - 1`` before
    it (fewer at the start, where fewer exist)."""
    if window <= 1 or values.size == 0:
        return values
    # A window past the series' length averages all of it (and a huge one fits no C long).
    window = min(window, values.size)
    sums = np.cumsum(values)
    sums[window:] = sums[window:] - sums[:-window]
    counts = np.minimum(np.arange(1, values.size + 1), window)
    result: np.ndarray = sums / counts
    return result


def _load_run(run_dir: Path, metric: str, every: int = 1) -> tuple[_Run | None, list[str]]:
    """The run's `metric` values (``None`` when it logged none) and its history's columns."""
    if not run_dir.is_dir():
        raise RunDirError(
            f"{run_dir}: no such directory — expected a run directory written by `rlfleet train`"
        )
    history_path = run_dir / HISTORY_FILE
    if not history_path.is_file():
        raise RunDirError(
            f"{run_dir}: no {HISTORY_FILE} — expected a run directory written by `rlfleet train`"
        )
    history = History(history_path)
    steps, values = (part[::every] for part in _clean_series(*history.series(metric)))
    if steps.size == 0:
        return None, history.columns
    config = _read_config(run_dir)
    return (
        _Run(
            run_dir,
            steps,
            values,
            config,
            history.step_unit,
            history.stop_reason,
            _solved(history, config),
        ),
        history.columns,
    )


def _solved(history: History, config: Mapping[str, object] | None) -> bool:
    """Did the run stop because it solved its task? (module docstring, "Steps covered")."""
    if history.stop_reason is not None:
        return history.stop_reason.startswith(SOLVED_STOP_REASON)
    trainer = config.get("trainer") if config is not None else None
    target = trainer.get("target_reward") if isinstance(trainer, Mapping) else None
    _, scores = history.series(TEST_SCORE)
    return isinstance(target, int | float) and scores.size > 0 and scores.max() >= target


def _group_curve(
    members: list[_Run],
    name: str,
    statistic: Statistic,
    confidence_level: float,
    smooth: int,
    metric: str,
) -> GroupCurve:
    if len(members) == 1:
        run = members[0]
        values = rolling_mean(run.values, smooth)
        return GroupCurve(
            name, f"1 run ({run.name})", (run.run_dir,), run.steps, values, None, None
        )
    logged = np.unique(np.concatenate([run.steps for run in members]))
    longest = int(logged[-1])
    series = [_held(run, logged) for run in members]
    # Smoothed after holding, so that a solved run's smoothed value goes on to its last
    # value, as if it had logged it at the steps the other runs logged.
    series = [(steps, rolling_mean(values, smooth)) for steps, values in series]
    start = max(int(steps[0]) for steps, _ in series)
    stop = min(int(steps[-1]) for steps, _ in series)
    if start > stop:
        raise RunDirError(
            f"runs {', '.join(str(run.run_dir) for run in members)} share a config but their "
            f"{metric!r} values cover no common step range; plot them with "
            "group_by_config=False"
        )
    grid = logged[(logged >= start) & (logged <= stop)]
    stacked = np.stack([np.interp(grid, steps, values) for steps, values in series])
    center, low, high = _statistic_with_ci(stacked, statistic, confidence_level)

    solved_steps = tuple(
        sorted(int(run.steps[-1]) for run in members if run.solved and run.steps[-1] < stop)
    )
    notes = [
        f"{STATISTIC_NAMES[statistic]}, {confidence_level:.0%} bootstrap CI, n={len(members)} runs"
    ]
    if solved_steps:
        notes.append(f"{len(solved_steps)} solved early, held at last value from ▼")
    if stop < longest:
        ender = next(run for run in members if not run.solved and run.steps[-1] == stop)
        notes.append(
            f"ends at {stop:,}, where {ender.name} stopped "
            f"({ender.stop_reason or 'no stop reason recorded'})"
        )
    return GroupCurve(
        name,
        "; ".join(notes),
        tuple(run.run_dir for run in members),
        grid,
        center,
        low,
        high,
        solved_steps,
    )


def _held(run: _Run, logged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The run's steps and values; a solved run's last value repeated at every later step
    in `logged` (the steps its group's runs logged)."""
    if not run.solved:
        return run.steps, run.values
    later = logged[logged > run.steps[-1]]
    return np.append(run.steps, later), np.append(run.values, np.full(later.size, run.values[-1]))


def _statistic_with_ci(
    stacked: np.ndarray, statistic: Statistic, confidence_level: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The statistic over runs (axis 0) at each step, and its bootstrap confidence interval."""
    from scipy import stats

    def compute(sample: np.ndarray, axis: int) -> np.ndarray:
        # rliable's IQM: scipy's mean with 25% trimmed from each end.
        result: np.ndarray = (
            stats.trim_mean(sample, 0.25, axis=axis)
            if statistic == "iqm"
            else np.mean(sample, axis=axis)
        )
        return result

    interval = stats.bootstrap(
        (stacked,),
        compute,
        n_resamples=BOOTSTRAP_RESAMPLES,
        batch=_BOOTSTRAP_BATCH,
        vectorized=True,
        axis=0,
        confidence_level=confidence_level,
        method="percentile",
        rng=np.random.default_rng(_BOOTSTRAP_SEED),
    ).confidence_interval
    return compute(stacked, 0), np.asarray(interval.low), np.asarray(interval.high)


def _group_names(groups: list[list[_Run]]) -> list[str]:
    """``<algo> on <env>`` plus the config values that set a group apart from the other
    groups of the same algorithm in its panel."""
    configs = [
        _flatten(_without_run_keys(members[0].config)) if members[0].config is not None else None
        for members in groups
    ]
    names = []
    for members, config in zip(groups, configs, strict=True):
        run = members[0]
        if config is None:
            names.append(run.name)
            continue
        algo = config.get("algo", "?")
        peers = [c for c in configs if c is not None and c.get("algo") == algo]
        differing = [
            key
            for key in dict.fromkeys(k for c in peers for k in c)
            if key not in _NAMED_ELSEWHERE and len({repr(c.get(key, _MISSING)) for c in peers}) > 1
        ]
        leaves = [key.rsplit(".", 1)[-1] for key in differing]
        parts = [
            f"{leaf if leaves.count(leaf) == 1 else key}={_format_value(config.get(key, _MISSING))}"
            for key, leaf in zip(differing, leaves, strict=True)
        ]
        if len(parts) > _MAX_NAMED_DIFFERENCES:
            more = len(parts) - _MAX_NAMED_DIFFERENCES
            parts = [*parts[:_MAX_NAMED_DIFFERENCES], f"+{more} more"]
        names.append(", ".join([f"{algo} on {run.env}", *parts]))
    return names


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    """Nested mappings as one mapping of dotted keys (``hyperparameters.gamma``)."""
    if not isinstance(value, Mapping):
        return {prefix: value}
    flat: dict[str, object] = {}
    for key, item in value.items():
        flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _format_value(value: object) -> str:
    if value is _MISSING or value is None:
        return "unset"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


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


def _read_config(run_dir: Path) -> Mapping[str, object] | None:
    """The run's current config (config.yaml, or the latest config.N.yaml a resume wrote), or
    ``None`` if it has none."""
    config_path = current_version(run_dir, CONFIG_FILE)
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
    return config


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


def _check_every(every: int) -> None:
    if every < 1:
        raise ConfigError(f"every must keep every N-th logged value with N >= 1; got {every}")


def _check_smooth(smooth: int) -> None:
    if smooth < 1:
        raise ConfigError(f"smooth must be a window of >= 1 history rows; got {smooth}")


def _y_label(what: str, smooth: int) -> str:
    return what if smooth <= 1 else f"{what}\n(rolling mean of {smooth} logged values)"


def _metric_columns(columns: set[str] | list[str]) -> str:
    names = sorted(set(columns) - set(INT_COLUMNS))
    return ", ".join(names) if names else "(none)"


def _run_name(run_dir: Path) -> str:
    # abspath, so that "." or "runs/ppo/" still yield the directory's own name.
    return Path(os.path.abspath(run_dir)).name


def _runs_figure(panels: list[Panel], metric: str, smooth: int) -> Figure:
    """One axes per panel, in rows of up to two, each with its legend below it."""
    from matplotlib.figure import Figure
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.lines import Line2D
    from matplotlib.ticker import StrMethodFormatter

    columns = min(len(panels), 2)
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(8 * columns, 6.5 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    envs = [panel.env for panel in panels]
    for ax, panel in zip(axes, panels, strict=False):
        handles: list[Artist | tuple[Artist, ...]] = []
        labels: list[str] = []
        for curve in panel.curves:
            (line,) = ax.plot(curve.steps, curve.center, linewidth=1.8)
            handle: Artist | tuple[Artist, ...] = line
            if curve.low is not None and curve.high is not None:
                band = ax.fill_between(
                    curve.steps,
                    curve.low,
                    curve.high,
                    color=line.get_color(),
                    alpha=0.2,
                    linewidth=0,
                )
                handle = (band, line)
            if curve.solved_steps:
                solved = np.asarray(curve.solved_steps)
                ax.plot(
                    solved,
                    np.interp(solved, curve.steps, curve.center),
                    linestyle="none",
                    marker=SOLVED_MARKER,
                    markersize=8,
                    color=line.get_color(),
                    markeredgecolor="black",
                    zorder=3,
                )
            handles.append(handle)
            labels.append(curve.label)
        if any(curve.solved_steps for curve in panel.curves):
            handles.append(
                Line2D([], [], linestyle="none", marker=SOLVED_MARKER, color="gray", markersize=8)
            )
            labels.append("a run solved its task and stopped here;\nits last value is held after")
        title = panel.env if envs.count(panel.env) == 1 else f"{panel.env} ({panel.step_unit})"
        ax.set_title(title)
        ax.set_xlabel(panel.step_unit)
        ax.xaxis.set_major_formatter(StrMethodFormatter(_STEP_FORMAT))
        ax.set_ylabel(_y_label(metric, smooth))
        ax.grid(True, alpha=0.3)
        ax.legend(
            handles,
            labels,
            handler_map={tuple: HandlerTuple(ndivide=1)},
            loc="upper center",
            bbox_to_anchor=(0.5, -0.12),
            fontsize="small",
            frameon=False,
        )
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    return fig


def _new_figure() -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    return fig, fig.add_subplot()


def save_figure(fig: Figure, out: str | Path, *, tight: bool = False) -> Path:
    """Write ``fig`` to ``out`` through a sibling temporary file, so that a failed write (a
    full disk) leaves the previous plot, and is a RunDirError naming ``out`` and the free
    space. ``tight`` trims the figure's margins to what it draws. A path with no file name, or
    whose suffix names no format matplotlib writes, is a ConfigError (no suffix: PNG)."""
    out = Path(out)
    formats = sorted(fig.canvas.get_supported_filetypes())
    if not out.name or out.name in (".", ".."):
        raise ConfigError(f"plot output: expected a file path such as plot.png, got {str(out)!r}")
    if out.suffix and out.suffix[1:].lower() not in formats:
        raise ConfigError(
            f"plot output {str(out)!r}: expected a file name ending in one of "
            f"{', '.join('.' + f for f in formats)}, got {out.suffix!r}"
        )
    with replacing(out) as tmp:
        fig.savefig(
            tmp,
            dpi=120,
            format=out.suffix[1:].lower() or "png",
            bbox_inches="tight" if tight else None,
        )
    return out
