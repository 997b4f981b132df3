"""``bench/scaling.py --quick`` on a tiny grid: every cell measured, the report, the parquet
rows and the plot written where asked, and README untouched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pyarrow.parquet as pq
import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


@pytest.fixture
def scaling(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    """bench/scaling.py as a module, with bench/ on the path for its sibling imports."""
    return bench_module("scaling")


def test_quick_run_measures_every_cell_and_writes_report_and_plot(
    scaling: ModuleType, tmp_path: Path
) -> None:
    readme = (BENCH.parent / "README.md").read_text()
    scaling.main(
        [
            "--quick",
            *("--envs", "CartPole-v1", "--modes", "sync,native,envpool", "--num-envs", "1,4"),
            *("--cell-s", "0.05", "--actors", ""),
            *("--results", str(tmp_path), "--plot", str(tmp_path / "scaling.png")),
        ]
    )
    rows = pq.read_table(tmp_path / "scaling.parquet").to_pylist()
    cells = {(r["mode"], r["kind"], r["num_envs"]) for r in rows}
    expected = {
        (mode, kind, n)
        for mode in ("sync", "native", "envpool")
        for kind in ("collect", "random")
        for n in (1, 4)
    }
    assert cells == expected
    assert all(r["steps_per_s"] > 0 and r["env_steps"] >= r["num_envs"] for r in rows)
    text = (tmp_path / "scaling.md").read_text()
    assert "| num_envs | sync collect | sync random | native collect" in text
    assert (tmp_path / "scaling.png").stat().st_size > 0
    assert (BENCH.parent / "README.md").read_text() == readme


def test_quick_run_measures_ray_actors(scaling: ModuleType, tmp_path: Path) -> None:
    scaling.main(
        [
            "--quick",
            *("--envs", "CartPole-v1", "--modes", "sync", "--num-envs", "1", "--cell-s", "0.05"),
            *("--actors", "1", "--algos", "impala", "--actor-budget", "512"),
            *("--results", str(tmp_path), "--plot", str(tmp_path / "scaling.png")),
        ]
    )
    rows = pq.read_table(tmp_path / "scaling.parquet").to_pylist()
    actors = [r for r in rows if r["part"] == "actors"]
    assert [(r["mode"], r["num_actors"]) for r in actors] == [("impala", 1)]
    assert actors[0]["env_steps"] >= 512
    assert actors[0]["steps_per_s"] > 0
    assert "Ray rollout actors of 8 envs" in (tmp_path / "scaling.md").read_text()
