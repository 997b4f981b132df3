"""Plots: a learning curve PNG, and runs grouped by config with seeds averaged into one band."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from rlfleet.errors import RunDirError
from rlfleet.logging import History, plot_learning_curve, plot_runs
from rlfleet.logging.plots import _group_run_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(
    run_dir: Path,
    config: dict[str, object],
    points: list[tuple[int, float]],
    metric: str = "test/return_mean",
) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    history = History(run_dir / "history.parquet")
    for step, value in points:
        history.append({"env_step": step, metric: value, "train/return_mean": value / 2})
    history.flush()
    return run_dir


def _ppo_config(seed: int, lr: float = 3e-4) -> dict[str, object]:
    return {
        "algo": "ppo",
        "seed": seed,
        "run_dir": f"runs/ppo-s{seed}",
        "optim": {"lr": lr, "seed": seed * 7},
        "envs": [{"id": "CartPole-v1", "run_id": f"r{seed}"}],
    }


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

    curves = _group_run_curves([*seeds, other], "test/return_mean", group_by_config=True)
    assert [curve.label for curve in curves] == ["ppo (n=3)", "ppo-big-lr"]
    band, single = curves
    assert band.run_dirs == tuple(seeds)
    # Union of logged steps, clipped to the shortest run's range (0..200).
    np.testing.assert_array_equal(band.steps, [0, 100, 150, 200])
    # Runs are lines through their points: y = x/10, 2 + x/10 and 4 + x/10.
    np.testing.assert_allclose(band.mean, [2.0, 12.0, 17.0, 22.0])
    assert band.low is not None
    assert band.high is not None
    np.testing.assert_allclose(band.low, [0.0, 10.0, 15.0, 20.0])
    np.testing.assert_allclose(band.high, [4.0, 14.0, 19.0, 24.0])
    assert single.low is None
    assert single.high is None
    np.testing.assert_array_equal(single.steps, [0, 100])

    out = tmp_path / "compare" / "runs.png"
    assert plot_runs([*seeds, other], out) == out
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_group_by_config_off_and_seed_suffix_styles(tmp_path: Path) -> None:
    runs = [
        _write_run(tmp_path / "sac_seed0", _ppo_config(0), [(0, 1.0), (10, 2.0)]),
        _write_run(tmp_path / "sac_seed1", _ppo_config(1), [(0, 3.0), (10, 4.0)]),
    ]
    grouped = _group_run_curves(runs, "test/return_mean", group_by_config=True)
    assert [curve.label for curve in grouped] == ["sac (n=2)"]
    separate = _group_run_curves(runs, "test/return_mean", group_by_config=False)
    assert [curve.label for curve in separate] == ["sac_seed0", "sac_seed1"]


def test_plot_runs_needs_history(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    with pytest.raises(RunDirError, match=r"not-a-run: no history\.parquet — expected a run"):
        plot_runs([empty], tmp_path / "out.png")


def test_plot_runs_unknown_metric_lists_available(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "ppo-s1", _ppo_config(1), [(0, 1.0), (10, 2.0)])
    with pytest.raises(RunDirError, match=r"'test/nope'.*test/return_mean, train/return_mean"):
        plot_runs([run], tmp_path / "out.png", metric="test/nope")
