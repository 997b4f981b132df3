"""History: parquet round trip, column union and types, truncation on resume, atomic flush."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlfleet import errors
from rlfleet.errors import CheckpointError, RunDirError
from rlfleet.logging import History, read_history
from rlfleet.logging.history import ENV_STEPS, GRADIENT_STEPS

KILLED = 77


def test_append_flush_reload_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "history.parquet"
    history = History(path)
    history.append({"env_step": 128, "epoch": 1, "train/return_mean": 10.5})
    history.append({"env_step": 256, "epoch": 2, "train/return_mean": 12.0})
    history.flush()

    reloaded = History(path)
    assert reloaded.rows == history.rows
    assert read_history(path) == history.rows
    steps, values = reloaded.series("train/return_mean")
    np.testing.assert_array_equal(steps, [128, 256])
    np.testing.assert_array_equal(values, [10.5, 12.0])

    reloaded.append({"env_step": 384, "epoch": 3, "train/return_mean": 13.0})
    assert [row["env_step"] for row in reloaded.rows] == [128, 256, 384]


def test_columns_are_union_with_nulls_and_typed(tmp_path: Path) -> None:
    path = tmp_path / "history.parquet"
    history = History(path)
    history.append({"env_step": 100, "train/return_mean": 1.0, "loss/policy": 0.5, "epoch": 1})
    # numpy scalars, as metrics computed with numpy arrive, are stored as Python numbers.
    history.append(
        {"env_step": 200, "test/return_mean": np.float32(2.0), "episode": np.int64(7)}  # type: ignore[dict-item]
    )
    history.flush()

    schema = pq.read_schema(path)
    assert schema.names == [
        "env_step",
        "epoch",
        "episode",
        "loss/policy",
        "test/return_mean",
        "train/return_mean",
    ]
    assert schema.field("env_step").type == pa.int64()
    assert schema.field("episode").type == pa.int64()
    assert schema.field("epoch").type == pa.int64()
    assert schema.field("test/return_mean").type == pa.float64()

    rows = read_history(path)
    assert rows[0]["test/return_mean"] is None
    assert rows[0]["episode"] is None
    assert rows[1]["train/return_mean"] is None
    assert rows[1]["episode"] == 7
    steps, values = History(path).series("test/return_mean")
    np.testing.assert_array_equal(steps, [200])
    np.testing.assert_array_equal(values, [2.0])


def test_a_flush_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow's ``pa.array`` imports pandas wherever it is installed (as in this test
    environment): a training run's start would pay for it at its first flush."""
    code = (
        "import sys; from rlfleet.logging import History; h = History(sys.argv[1]); "
        "h.append({'env_step': 1, 'train/x': 0.5}); h.append({'env_step': 2}); h.flush(); "
        "print('pandas' in sys.modules)"
    )
    path = tmp_path / "history.parquet"
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False"]
    assert read_history(path) == [{"env_step": 1, "train/x": 0.5}, {"env_step": 2, "train/x": None}]


def test_append_rejects_bad_rows(tmp_path: Path) -> None:
    history = History(tmp_path / "history.parquet")
    with pytest.raises(TypeError, match="env_step"):
        history.append({"train/return_mean": 1.0})
    with pytest.raises(TypeError, match="env_step"):
        history.append({"env_step": 1.5})
    with pytest.raises(TypeError, match="loss/policy"):
        history.append({"env_step": 1, "loss/policy": "0.3"})  # type: ignore[dict-item]
    assert history.rows == []


def test_truncate_after_drops_later_rows(tmp_path: Path) -> None:
    path = tmp_path / "history.parquet"
    history = History(path)
    for step in (100, 200, 300, 400):
        history.append({"env_step": step, "train/return_mean": float(step)})
    history.append({"env_step": 400, "test/return_mean": 9.0})
    history.flush()

    resumed = History(path)
    assert resumed.truncate_after(200) == 3
    assert [row["env_step"] for row in resumed.rows] == [100, 200]
    assert "test/return_mean" not in resumed.columns
    assert resumed.truncate_after(200) == 0
    resumed.flush()
    assert [row["env_step"] for row in read_history(path)] == [100, 200]


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        pa.ArrowIOError("IOError: No space left on device"),
    ],
    ids=["OSError", "ArrowIOError"],
)
def test_flush_is_atomic_and_a_failed_write_is_a_run_dir_error(
    failure: Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run" / "history.parquet"
    history = History(path)
    history.append({"env_step": 1, "train/return_mean": 1.0})
    history.flush()
    history.append({"env_step": 2, "train/return_mean": 2.0})
    history.flush()
    assert sorted(p.name for p in path.parent.iterdir()) == ["history.parquet"]

    def fail_midway(*args: object, **kwargs: object) -> None:
        raise failure

    history.append({"env_step": 3, "train/return_mean": 3.0})
    monkeypatch.setattr(pq, "write_table", fail_midway)
    with pytest.raises(RunDirError) as raised:
        history.flush()
    message = str(raised.value)
    assert message.startswith(f"{path}: cannot write (")
    assert "No space left on device" in message
    assert re.search(r"[\d.]+ [KMGT]?i?B free on its file system\)$", message)
    assert sorted(p.name for p in path.parent.iterdir()) == ["history.parquet"]
    assert [row["env_step"] for row in read_history(path)] == [1, 2]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to kill a writer")
@pytest.mark.parametrize("boundary", ["history.tmp_written", "history.renamed"])
def test_a_kill_at_a_write_boundary_leaves_the_old_or_the_new_file(
    boundary: str, tmp_path: Path
) -> None:
    path = tmp_path / "history.parquet"
    history = History(path)
    history.append({"env_step": 1, "train/return_mean": 1.0})
    history.flush()
    history.append({"env_step": 2, "train/return_mean": 2.0})
    pid = os.fork()
    if pid == 0:

        def die(name: str, where: Path) -> None:
            if name == boundary:
                os._exit(KILLED)

        errors.FAULT_HOOK = die
        try:
            history.flush()
        finally:
            os._exit(1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == KILLED
    expected = [1] if boundary == "history.tmp_written" else [1, 2]
    assert [row["env_step"] for row in read_history(path)] == expected
    # The next flush removes what the killed one left behind.
    History(path).flush()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.parquet"]


def test_corrupt_file_raises_checkpoint_error_naming_path(tmp_path: Path) -> None:
    path = tmp_path / "history.parquet"
    path.write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(CheckpointError, match=str(path)):
        History(path)
    with pytest.raises(CheckpointError, match=str(path)):
        read_history(path)


def test_file_without_env_step_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "history.parquet"
    pq.write_table(pa.table({"step": [1, 2]}), path)
    with pytest.raises(CheckpointError, match="env_step"):
        History(path)


def test_missing_file_starts_empty(tmp_path: Path) -> None:
    history = History(tmp_path / "history.parquet")
    assert history.rows == []
    steps, values = history.series("train/return_mean")
    assert steps.shape == values.shape == (0,)
    with pytest.raises(CheckpointError, match="no training history"):
        read_history(tmp_path / "history.parquet")


def test_step_unit_and_stop_reason_travel_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "history.parquet"
    history = History(path, step_unit=GRADIENT_STEPS)
    assert history.stop_reason is None
    history.append({"env_step": 10, "test/return_mean": 1.0})
    history.stop_reason = "stop_fn"
    history.flush()

    metadata = pq.read_schema(path).metadata
    assert metadata[b"rlfleet.step_unit"] == b"gradient steps"
    assert metadata[b"rlfleet.stop_reason"] == b"stop_fn"
    reloaded = History(path)
    assert reloaded.step_unit == GRADIENT_STEPS
    assert reloaded.stop_reason == "stop_fn"

    # A resumed run clears the reason while it runs again; an interrupted one keeps none.
    reloaded.stop_reason = None
    reloaded.flush()
    assert History(path).stop_reason is None
    assert b"rlfleet.stop_reason" not in pq.read_schema(path).metadata


def test_a_file_without_metadata_counts_env_steps(tmp_path: Path) -> None:
    path = tmp_path / "history.parquet"
    pq.write_table(pa.table({"env_step": pa.array([1], pa.int64())}), path)
    history = History(path)
    assert history.step_unit == ENV_STEPS
    assert history.stop_reason is None
