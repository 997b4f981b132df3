"""Plots: a learning curve PNG, and runs compared: seeds of one config aggregated into an
IQM or mean with a bootstrap band, solved runs carried forward, one panel per env."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib.figure import Figure
from scipy import stats

from rlfleet.errors import ConfigError, RunDirError
from rlfleet.logging import History, plot_learning_curve, plot_runs
from rlfleet.logging.history import GRADIENT_STEPS
from rlfleet.logging.plots import (
    BOOTSTRAP_RESAMPLES,
    _learning_curve_figure,
    _runs_figure,
    compare_runs,
    rolling_mean,
    run_title,
    save_figure,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(
    run_dir: Path,
    config: dict[str, object],
    points: list[tuple[int, float]],
    metric: str = "test/return_mean",
    *,
    stop_reason: str | None = None,
    step_unit: str | None = None,
) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    history = History(run_dir / "history.parquet", step_unit=step_unit)
    for step, value in points:
        history.append({"env_step": step, metric: value, "train/return_mean": value / 2})
    history.stop_reason = stop_reason
    history.flush()
    return run_dir


def _ppo_config(
    seed: int, lr: float = 3e-4, env: str = "CartPole-v1", target: float | None = None
) -> dict[str, object]:
    return {
        "algo": "ppo",
        "seed": seed,
        "run_dir": f"runs/ppo-s{seed}",
        "env": {"id": env, "num_envs": 8},
        "trainer": {"max_steps": 1000, "target_reward": target},
        "hyperparameters": {"learning_rate": lr, "gamma": 0.99, "seed": seed * 7},
    }


def _line(offset: float) -> Callable[[int], float]:
    return lambda step: offset + step / 10


def _points(steps: range | list[int], f: Callable[[int], float]) -> list[tuple[int, float]]:
    return [(step, f(step)) for step in steps]


def _seeds(tmp_path: Path, stops: list[tuple[int, str]]) -> list[Path]:
    """Seed i of one config logs ``i + step/10`` every 100 steps up to its last step, then
    stops for the reason given."""
    return [
        _write_run(
            tmp_path / f"ppo-s{seed}",
            _ppo_config(seed),
            _points(range(0, last + 1, 100), _line(seed)),
            stop_reason=reason,
        )
        for seed, (last, reason) in enumerate(stops)
    ]


def _bootstrap(column: np.ndarray, statistic: Callable[..., np.ndarray]) -> tuple[float, float]:
    """scipy's percentile bootstrap of one step's values, seeded as the plots seed it."""
    interval = stats.bootstrap(
        (column,),
        statistic,
        n_resamples=BOOTSTRAP_RESAMPLES,
        vectorized=True,
        method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval
    return float(interval.low), float(interval.high)


def _legend_texts(fig: object) -> list[list[str]]:
    return [
        [text.get_text() for text in ax.get_legend().get_texts()]
        for ax in fig.axes  # type: ignore[attr-defined]
        if ax.get_visible()
    ]


def test_plot_learning_curve_writes_png(tmp_path: Path) -> None:
    history = History(tmp_path / "run" / "history.parquet")
    for step in range(0, 1000, 100):
        history.append({"env_step": step, "train/return_mean": step / 10})
        if step % 300 == 0:
            history.append({"env_step": step, "test/return_mean": step / 9, "test/return_std": 5.0})
    history.flush()

    out = tmp_path / "plots" / "curve.png"
    assert plot_learning_curve(history.path, out, title="CartPole PPO") == out
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 1000
    (ax,) = _learning_curve_figure(History(history.path), "t", 1).axes
    assert ax.get_xlabel() == "env steps"


def test_offline_learning_curve_counts_gradient_steps_and_shows_the_dataset(
    tmp_path: Path,
) -> None:
    history = History(tmp_path / "history.parquet", step_unit=GRADIENT_STEPS)
    history.append({"env_step": 0, "dataset/return_mean": 125.0})
    for step, value in [(0, 18.0), (1000, 160.0)]:
        history.append({"env_step": step, "test/return_mean": value, "test/return_std": 20.0})
    history.flush()

    (ax,) = _learning_curve_figure(History(history.path), "bc", smooth=1).axes
    assert ax.get_xlabel() == "gradient steps"
    test_line = next(line for line in ax.get_lines() if line.get_label() == "test return")
    np.testing.assert_array_equal(test_line.get_xdata(), [0, 1000])
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "dataset return (mean of its episodes)" in labels


def test_plot_learning_curve_errors(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="no such history file"):
        plot_learning_curve(tmp_path / "history.parquet", tmp_path / "out.png")
    history = History(tmp_path / "history.parquet")
    history.append({"env_step": 1, "loss/policy": 0.1})
    history.flush()
    with pytest.raises(RunDirError, match="loss/policy"):
        plot_learning_curve(history.path, tmp_path / "out.png")


def test_seeds_of_one_config_form_one_band_and_other_config_stays_apart(tmp_path: Path) -> None:
    seeds = [
        _write_run(tmp_path / "ppo-s1", _ppo_config(1), [(0, 0.0), (100, 10.0), (200, 20.0)]),
        _write_run(tmp_path / "ppo-s2", _ppo_config(2), [(0, 2.0), (150, 17.0), (300, 32.0)]),
        _write_run(tmp_path / "ppo-s3", _ppo_config(3), [(0, 4.0), (100, 14.0), (250, 29.0)]),
    ]
    other = _write_run(tmp_path / "ppo-big-lr", _ppo_config(1, lr=1e-2), [(0, 1.0), (100, 2.0)])

    (panel,) = compare_runs([*seeds, other], "test/return_mean", statistic="mean")
    band, single = panel.curves
    assert band.run_dirs == tuple(seeds)
    # No run solved (no stop reason, no target): union of logged steps, up to where the
    # shortest run stopped (200).
    np.testing.assert_array_equal(band.steps, [0, 100, 150, 200])
    # Runs are lines through their points: y = x/10, 2 + x/10 and 4 + x/10.
    np.testing.assert_allclose(band.center, [2.0, 12.0, 17.0, 22.0])
    assert band.low is not None
    assert band.high is not None
    assert np.all(band.low < band.center)
    assert np.all(band.center < band.high)
    assert single.low is None
    assert single.high is None
    np.testing.assert_array_equal(single.steps, [0, 100])
    assert band.label == (
        "ppo on CartPole-v1, learning_rate=0.0003\n"
        "mean, 95% bootstrap CI, n=3 runs; ends at 200, where ppo-s1 stopped "
        "(no stop reason recorded)"
    )
    assert single.label == "ppo on CartPole-v1, learning_rate=0.01\n1 run (ppo-big-lr)"

    out = tmp_path / "compare" / "runs.png"
    assert plot_runs([*seeds, other], out) == out
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_iqm_and_bootstrap_band_match_scipy_on_the_same_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(100.0, 30.0, size=(8, 4))
    values[0] += 400.0  # one odd seed: the IQM trims it, the mean does not
    runs = [
        _write_run(
            tmp_path / f"ppo-s{seed}",
            _ppo_config(seed),
            list(zip([0, 100, 200, 300], values[seed].tolist(), strict=True)),
            stop_reason="max_steps",
        )
        for seed in range(8)
    ]

    def iqm(sample: np.ndarray, axis: int) -> np.ndarray:
        result: np.ndarray = stats.trim_mean(sample, 0.25, axis=axis)
        return result

    def mean(sample: np.ndarray, axis: int) -> np.ndarray:
        result: np.ndarray = np.mean(sample, axis=axis)
        return result

    for statistic, reference in (("iqm", iqm), ("mean", mean)):
        (panel,) = compare_runs(runs, statistic=statistic)  # type: ignore[arg-type]
        (curve,) = panel.curves
        np.testing.assert_allclose(curve.center, reference(values, axis=0))
        assert curve.low is not None
        assert curve.high is not None
        for step in range(4):
            low, high = _bootstrap(values[:, step], reference)
            assert curve.low[step] == pytest.approx(low)
            assert curve.high[step] == pytest.approx(high)
    # IQM of 8 runs: the mean of the middle 4.
    middle = np.sort(values, axis=0)[2:6].mean(axis=0)
    (iqm_curve,) = compare_runs(runs)[0].curves
    np.testing.assert_allclose(iqm_curve.center, middle)
    assert iqm_curve.summary == "IQM, 95% bootstrap CI, n=8 runs"


def test_runs_that_solved_early_are_carried_forward_to_the_longest_run(tmp_path: Path) -> None:
    runs = _seeds(
        tmp_path, [(200, "stop_fn"), (400, "stop_fn (test in training)"), (600, "max_steps")]
    )
    (panel,) = compare_runs(runs, statistic="mean")
    (curve,) = panel.curves
    np.testing.assert_array_equal(curve.steps, range(0, 601, 100))
    # From step 200, s0 holds 20; from 400, s1 holds 41; s2 goes on along 2 + x/10.
    held = np.array(
        [
            [0, 10, 20, 20, 20, 20, 20],
            [1, 11, 21, 31, 41, 41, 41],
            [2, 12, 22, 32, 42, 52, 62],
        ],
        dtype=float,
    )
    np.testing.assert_allclose(curve.center, held.mean(axis=0))
    assert curve.solved_steps == (200, 400)
    assert "2 solved early, held at last value from ▼" in curve.summary

    fig = _runs_figure(compare_runs(runs), "test/return_mean", smooth=1)
    (legend,) = _legend_texts(fig)
    assert legend[-1] == "a run solved its task and stopped here;\nits last value is held after"
    markers = [line for line in fig.axes[0].get_lines() if line.get_marker() == "v"]
    np.testing.assert_array_equal(markers[0].get_xdata(), [200, 400])


def test_a_run_that_stopped_early_unsolved_ends_the_curve(tmp_path: Path) -> None:
    runs = _seeds(tmp_path, [(600, "stop_fn"), (300, "early_stop_patience"), (200, "stop_fn")])
    (curve,) = compare_runs(runs)[0].curves
    # s2 solved (held at 22), but s1 gave up at 300: the curve stops there.
    np.testing.assert_array_equal(curve.steps, [0, 100, 200, 300])
    np.testing.assert_allclose(curve.center[-1], np.mean([30.0, 31.0, 22.0]))
    assert curve.solved_steps == (200,)
    assert curve.summary.endswith("ends at 300, where ppo-s1 stopped (early_stop_patience)")


def test_without_a_stop_reason_reaching_the_target_reward_counts_as_solved(
    tmp_path: Path,
) -> None:
    def run(seed: int, last: int, score: float) -> Path:
        run_dir = tmp_path / f"ppo-s{seed}"
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(yaml.safe_dump(_ppo_config(seed, target=475.0)))
        history = History(run_dir / "history.parquet")
        for step in range(0, last + 1, 100):
            value = score if step == last else 10.0
            history.append({"env_step": step, "test/return_mean": value, "test/score": value})
        history.flush()
        return run_dir

    solved, longest = run(0, 200, 500.0), run(1, 400, 300.0)
    (curve,) = compare_runs([solved, longest])[0].curves
    np.testing.assert_array_equal(curve.steps, [0, 100, 200, 300, 400])
    assert curve.solved_steps == (200,)
    unsolved = run(2, 200, 400.0)  # stopped below the target: not carried forward
    (curve,) = compare_runs([unsolved, longest])[0].curves
    assert curve.steps[-1] == 200


def test_runs_of_different_envs_and_step_units_get_panels_of_their_own(tmp_path: Path) -> None:
    cart = [
        _write_run(tmp_path / f"ppo-s{seed}", _ppo_config(seed), [(0, 1.0), (100, 2.0)])
        for seed in range(2)
    ]
    pendulum = _write_run(
        tmp_path / "ppo-pendulum", _ppo_config(0, env="Pendulum-v1"), [(0, -1200.0), (50, -900.0)]
    )
    bc_config = {**_ppo_config(0), "algo": "bc", "dataset": "data"}
    offline = _write_run(
        tmp_path / "bc", bc_config, [(0, 20.0), (1000, 500.0)], step_unit=GRADIENT_STEPS
    )

    panels = compare_runs([*cart, pendulum, offline])
    assert [(p.env, p.step_unit) for p in panels] == [
        ("CartPole-v1", "env steps"),
        ("Pendulum-v1", "env steps"),
        ("CartPole-v1", "gradient steps"),
    ]
    fig = _runs_figure(panels, "test/return_mean", smooth=1)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == [
        "CartPole-v1 (env steps)",
        "Pendulum-v1",
        "CartPole-v1 (gradient steps)",
    ]
    assert [ax.get_xlabel() for ax in visible] == ["env steps", "env steps", "gradient steps"]
    assert _legend_texts(fig) == [
        ["ppo on CartPole-v1\nIQM, 95% bootstrap CI, n=2 runs"],
        ["ppo on Pendulum-v1\n1 run (ppo-pendulum)"],
        ["bc on CartPole-v1\n1 run (bc)"],
    ]
    out = plot_runs([*cart, pendulum, offline], tmp_path / "panels.png")
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_legend_names_what_sets_groups_of_one_algorithm_apart(tmp_path: Path) -> None:
    base = _ppo_config(0)
    other_gamma = {**base, "hyperparameters": {**base["hyperparameters"], "gamma": 0.9}}  # type: ignore[dict-item]
    dqn = {**base, "algo": "dqn", "hyperparameters": {"buffer_size": 1000}}
    runs = [
        _write_run(tmp_path / "a", base, [(0, 1.0), (10, 2.0)]),
        _write_run(tmp_path / "b", other_gamma, [(0, 1.0), (10, 2.0)]),
        _write_run(tmp_path / "c", dqn, [(0, 1.0), (10, 2.0)]),
    ]
    names = [curve.name for curve in compare_runs(runs)[0].curves]
    assert names == [
        "ppo on CartPole-v1, gamma=0.99",
        "ppo on CartPole-v1, gamma=0.9",
        "dqn on CartPole-v1",
    ]


def test_group_by_config_off_draws_each_run(tmp_path: Path) -> None:
    runs = [
        _write_run(tmp_path / "sac_seed0", _ppo_config(0), [(0, 1.0), (10, 2.0)]),
        _write_run(tmp_path / "sac_seed1", _ppo_config(1), [(0, 3.0), (10, 4.0)]),
    ]
    (grouped,) = compare_runs(runs)[0].curves
    assert grouped.summary == "IQM, 95% bootstrap CI, n=2 runs"
    separate = compare_runs(runs, group_by_config=False)[0].curves
    assert [curve.summary for curve in separate] == ["1 run (sac_seed0)", "1 run (sac_seed1)"]


def test_smoothing_is_a_trailing_rolling_mean_per_run(tmp_path: Path) -> None:
    np.testing.assert_allclose(
        rolling_mean(np.array([0.0, 3.0, 6.0, 3.0, 0.0]), 3), [0.0, 1.5, 3.0, 4.0, 3.0]
    )
    values = [0.0, 10.0, 0.0, 10.0, 0.0]
    run = _write_run(tmp_path / "ppo-s0", _ppo_config(0), list(enumerate(values)))
    (curve,) = compare_runs([run], smooth=2)[0].curves
    np.testing.assert_allclose(curve.center, [0.0, 5.0, 5.0, 5.0, 5.0])
    fig = _runs_figure(compare_runs([run], smooth=2), "test/return_mean", smooth=2)
    assert fig.axes[0].get_ylabel() == "test/return_mean\n(rolling mean of 2 logged values)"
    with pytest.raises(ConfigError, match="smooth must be a window of >= 1 history rows; got 0"):
        compare_runs([run], smooth=0)

    # A solved run is held first, then smoothed: its smoothed value goes on up to its last
    # value instead of freezing a window that still holds its earlier values.
    solved = _write_run(
        tmp_path / "ppo-s1", _ppo_config(1), [(0, 0.0), (1, 0.0), (2, 10.0)], stop_reason="stop_fn"
    )
    longer = _write_run(tmp_path / "ppo-s2", _ppo_config(2), [(step, 0.0) for step in range(5)])
    (curve,) = compare_runs([solved, longer], statistic="mean", smooth=2)[0].curves
    np.testing.assert_array_equal(curve.steps, range(5))
    np.testing.assert_allclose(curve.center, [0.0, 0.0, 2.5, 5.0, 5.0])


def test_compare_runs_refuses_what_is_not_a_set_of_run_dirs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no run directories to plot"):
        compare_runs([])
    with pytest.raises(RunDirError, match="no such directory"):
        compare_runs([tmp_path / "nope"])
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    with pytest.raises(RunDirError, match=r"not-a-run: no history\.parquet — expected a run"):
        plot_runs([empty], tmp_path / "out.png")
    with pytest.raises(ConfigError, match="statistic must be one of iqm, mean"):
        compare_runs([empty], statistic="median")  # type: ignore[arg-type]


def test_plot_runs_unknown_metric_lists_available(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "ppo-s1", _ppo_config(1), [(0, 1.0), (10, 2.0)])
    with pytest.raises(RunDirError, match=r"'test/nope'.*test/return_mean, train/return_mean"):
        plot_runs([run], tmp_path / "out.png", metric="test/nope")


def test_labels_name_the_runs_and_runs_sharing_one_are_one_group(tmp_path: Path) -> None:
    points = _points(range(0, 301, 100), _line(0))
    runs = [
        _write_run(tmp_path / f"r{seed}", _ppo_config(seed, lr=lr), points)
        for seed, lr in enumerate([1e-3, 1e-4, 1e-3])
    ]
    (panel,) = compare_runs(runs, labels=["mine", "theirs", "mine"])
    assert [curve.name for curve in panel.curves] == ["mine", "theirs"]
    assert [len(curve.run_dirs) for curve in panel.curves] == [2, 1]
    with pytest.raises(ConfigError, match=r"labels: expected one per run directory \(3\), got 1"):
        compare_runs(runs, labels=["mine"])


def test_every_keeps_every_nth_logged_value(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "r", _ppo_config(0), _points(range(0, 1001, 100), _line(0)))
    (panel,) = compare_runs([run], every=3)
    assert panel.curves[0].steps.tolist() == [0, 300, 600, 900]
    with pytest.raises(ConfigError, match="every"):
        compare_runs([run], every=0)
    assert plot_learning_curve(run / "history.parquet", tmp_path / "a.png", every=3).is_file()


def test_run_title_names_the_algorithm_and_env(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "r", _ppo_config(0), _points([0, 100], _line(0)))
    assert run_title(run) == "r: ppo on CartPole-v1"
    assert run_title(run, "mine") == "mine: ppo on CartPole-v1"
    assert run_title(tmp_path) == tmp_path.name


def test_a_plot_that_cannot_be_written_is_a_run_dir_error_and_the_old_one_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = History(tmp_path / "run" / "history.parquet")
    history.append({"env_step": 100, "train/return_mean": 1.0})
    history.flush()
    out = tmp_path / "plots" / "curve.png"
    plot_learning_curve(history.path, out, title="t")
    before = out.read_bytes()

    def no_space(self: Figure, fname: object, **kwargs: object) -> None:
        Path(str(fname)).write_bytes(b"\x89PNG half")  # a partial file, as a full disk leaves
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", no_space)
    with pytest.raises(RunDirError, match=r"curve\.png: cannot write \(No space left on device; "):
        plot_learning_curve(history.path, out, title="t")
    assert out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["curve.png"]


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("", r"plot output: expected a file path such as plot\.png, got '\.'"),
        (
            "-0.5",
            r"plot output '-0\.5': expected a file name ending in one of .*\.png.*, got '\.5'",
        ),
        ("curve.docx", r"ending in one of .*, got '\.docx'"),
    ],
)
def test_an_output_path_matplotlib_cannot_write_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=expected):
        save_figure(Figure(), out)
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left
    assert save_figure(Figure(), "curve.SVG").read_text().startswith("<?xml")
