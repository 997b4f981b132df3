"""``bench/precision.py``: a run on another CPU keeps the first CPU's runs, and the report gives
each machine its own section with its own invocation, load and tables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

CASE = "SAC Pendulum-v1, 5k steps"
OTHER = "Other CPU, 2 cores"
HERE = "This CPU, 2 cores"


def run(
    precision: str, seed: int, final_return: float, *, machine: str | None = None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "case": CASE,
        "algo": "sac",
        "precision": precision,
        "seed": seed,
        "steps": 5000,
        "threads": 1,
        "train_s": 30.0,
        "gradient_steps": 4901,
        "process_s": 32.0 if precision == "fp32" else 31.0,
        "final_return": final_return,
        "invocation": f"python bench/precision.py --seeds 2 ({machine or HERE})",
        "load_before": 0.5,
        "load_after": 0.6,
    }
    if machine is not None:
        row["machine"] = machine
    return row


@pytest.fixture
def precision(
    bench_module: Callable[[str], ModuleType], harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> ModuleType:
    """``bench/precision.py`` on this machine (``HERE``), with the harness's results in
    ``tmp_path``."""
    monkeypatch.setattr(harness, "machine", lambda: HERE)
    return bench_module("precision")


def test_each_machine_keeps_its_runs_under_its_own_heading(
    precision: ModuleType, tmp_path: Path
) -> None:
    elsewhere = [
        run(p, seed, r, machine=OTHER)
        for seed, returns in enumerate([(-150.0, -151.0), (-120.0, -119.0)])
        for p, r in zip(("fp32", "bf16"), returns, strict=True)
    ]
    pq.write_table(pa.Table.from_pylist(elsewhere), tmp_path / "precision.parquet")
    new = [run(p, 0, r) for p, r in (("fp32", -140.0), ("bf16", -141.0))]
    rows = precision.with_earlier_runs("precision", new)
    assert [r["machine"] for r in rows] == [OTHER] * 4 + [HERE] * 2
    # Measured again here: this machine's runs are replaced, not doubled.
    assert len(precision.with_earlier_runs("precision", rows[-2:])) == len(rows)
    text = precision.report(rows)
    other, here = text.split("## Other CPU, 1 thread\n")[1].split("## This CPU, 1 thread\n")
    assert f"({OTHER})`, 2 seeds." in other
    assert f"Machine: {OTHER}. Load average (1 min): 0.5 before, 0.6 after." in other
    assert "| fp32 | -150.0, -120.0 | -135.0 |" in other
    assert "| bf16 | -151.0, -119.0 | -135.0 |" in other
    assert f"({HERE})`, 1 seed." in here  # the machine's own count
    assert f"Machine: {HERE}." in here
    assert "| fp32 | -140.0 | -140.0 |" in here
    assert "-150.0" not in here


def test_runs_at_another_thread_count_get_their_own_section(precision: ModuleType) -> None:
    one = [run(p, 0, r) for p, r in (("fp32", -140.0), ("bf16", -141.0))]
    two = [
        {**run(p, 0, r), "threads": 2, "invocation": "python bench/precision.py --threads 2"}
        for p, r in (("fp32", -160.0), ("bf16", -161.0))
    ]
    rows = precision.with_earlier_runs("precision", [*one, *two])
    assert len(rows) == 4  # neither count replaces the other
    text = precision.report(rows)
    at_one, at_two = text.split("## This CPU, 1 thread\n")[1].split("## This CPU, 2 threads\n")
    assert "| fp32 | -140.0 | -140.0 |" in at_one
    assert "-160.0" not in at_one
    assert "`python bench/precision.py --threads 2`, 1 seed." in at_two
    assert "| fp32 | -160.0 | -160.0 |" in at_two
    assert "-140.0" not in at_two
