"""Training history: one row of metrics per logged step, kept as a parquet file in the run dir.

A row is keyed by ``env_step`` (environment steps collected so far, summed over all envs)
and holds namespaced metrics (``train/…``, ``test/…``, ``loss/…``, ``time/…``) plus the
counters ``epoch``, ``gradient_step`` and ``episode``. Rows may carry different keys; the
file's columns are the union of all keys, with nulls where a row lacks one. A ``None``
value counts as a missing key.

Two kinds of row share the file. Interval rows hold the metrics logged every
``log_interval_steps`` and at test steps. Episode rows, one per finished training episode (as
xagents' history checkpoint has them), hold the ``episode/…`` columns and the counters only:
:data:`EPISODE_RETURN` (set on every episode row and on no other, so it tells the kinds
apart: :func:`is_episode_row`), :data:`EPISODE_LENGTH`, :data:`EPISODE_RETURN_MEAN` (the mean
return of the last ``reward_buffer_size`` training episodes, this one included) and
:data:`EPISODE_TIME` (seconds of training so far). Their ``env_step`` is the step count at
the end of the collection step the episode ended in, and their ``episode`` its number. The
episodes that ended in one collection step share its ``env_step``: a plot of an episode
column against it (``rlfleet plot --metric episode/return_mean``) draws the last of them. A
reader of a metric column sees interval rows only, since episode rows never carry one.

Offline runs take no env steps: there ``env_step`` counts gradient steps. The file says what
its step column counts (:attr:`History.step_unit`, ``"env steps"`` or ``"gradient steps"``)
and, once training has stopped, why (:attr:`History.stop_reason`, e.g. ``"stop_fn"`` when the
test score reached the target, ``"max_steps"``), in the parquet schema's key-value metadata
(``rlfleet.step_unit``, ``rlfleet.stop_reason``), so ``rlfleet plot`` can label its axes and
tell a run that solved its task from one that was cut short.

The file is rewritten whole on every :meth:`History.flush`, through a temporary file and
``os.replace``, so a crash mid-write leaves the previous version intact — the history is
read back on resume and by ``rlfleet plot``. A write that fails is a
:class:`~rlfleet.errors.RunDirError` naming the file and the free space.
"""

from __future__ import annotations

import contextlib
import glob
import numbers
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlfleet.errors import CheckpointError, RunDirError, write_boundary, write_error

HistoryRow = dict[str, float | int | None]
"""One logged step: column name -> value, ``None`` where the row has no value."""

STEP_KEY = "env_step"
ENV_STEPS = "env steps"
"""What ``env_step`` counts, unless the history says otherwise."""
GRADIENT_STEPS = "gradient steps"
"""What ``env_step`` counts in an offline run's history, which takes no env steps."""
INT_COLUMNS = ("env_step", "epoch", "gradient_step", "episode")
"""Counter columns, stored as int64 and placed first; every other column is float64."""

EPISODE_RETURN = "episode/return"
"""The return of a finished training episode: set on episode rows, and only there."""
EPISODE_LENGTH = "episode/length"
"""Its length in steps."""
EPISODE_RETURN_MEAN = "episode/return_mean"
"""The mean return of the last ``reward_buffer_size`` training episodes, this one included."""
EPISODE_TIME = "episode/time_s"
"""Seconds of training when the episode was recorded."""

_STEP_UNIT_KEY = b"rlfleet.step_unit"
_STOP_REASON_KEY = b"rlfleet.stop_reason"


class History:
    """Training history: one row per logged step, stored as parquet at `path`."""

    def __init__(self, path: str | Path, *, step_unit: str | None = None) -> None:
        """Open the history at `path`, loading its rows if the file exists (resume).

        `step_unit` is what ``env_step`` counts (default: what the file says, else
        ``"env steps"``).

        Raises:
            CheckpointError: the file exists but is not a readable rlfleet history.
        """
        self.path = Path(path)
        # Rows are kept sparse, nulls dropped, so that the columns are exactly the keys some
        # row has a value for: the same before a flush and after a reload.
        loaded, metadata = _read(self.path) if self.path.exists() else ([], {})
        self._rows: list[HistoryRow] = [_without_nulls(row) for row in loaded]
        self._columns: set[str] = {key for row in self._rows for key in row}
        self.step_unit: str = step_unit or _decode(metadata.get(_STEP_UNIT_KEY)) or ENV_STEPS
        """What ``env_step`` counts: ``"env steps"``, or ``"gradient steps"`` offline."""
        self.stop_reason: str | None = _decode(metadata.get(_STOP_REASON_KEY))
        """Why training stopped (the trainer's stop reason); ``None`` while it runs, and for
        a run that was interrupted or crashed."""

    def append(self, row: Mapping[str, float | int | None]) -> None:
        """Add one row; it must hold an int ``env_step``. Call :meth:`flush` to persist it.

        Raises:
            TypeError: ``env_step`` is missing or not an int, a counter column holds a
                non-integer, or a metric is not a real number (a tensor, a string, ...).
        """
        clean = _without_nulls({key: _coerce(key, value) for key, value in row.items()})
        if STEP_KEY not in clean:
            raise TypeError(
                f"history row needs an int {STEP_KEY!r}; got {row.get(STEP_KEY)!r} "
                f"in a row with keys {sorted(row)}"
            )
        self._rows.append(clean)
        self._columns.update(clean)

    def truncate_after(self, env_step: int) -> int:
        """Drop rows logged after `env_step`, when resuming from an older checkpoint.

        The rows dropped describe training that the resumed run will redo, and keeping
        them would leave two curves interleaved in the file. Returns the number dropped;
        call :meth:`flush` to persist.
        """
        kept = [row for row in self._rows if _step(row) <= env_step]
        dropped = len(self._rows) - len(kept)
        self._rows = kept
        self._columns = {key for row in kept for key in row}
        return dropped

    def flush(self) -> None:
        """Write every row to `path` atomically: readers see the old file or the new one.

        Raises:
            RunDirError: the file cannot be written (a full disk, a read-only directory); the
                message names the path and the free space, and the previous file is intact.
        """
        metadata = {_STEP_UNIT_KEY: self.step_unit.encode()}
        if self.stop_reason is not None:
            metadata[_STOP_REASON_KEY] = self.stop_reason.encode()
        table = _to_table(self._rows, self.columns).replace_schema_metadata(metadata)
        tmp: Path | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(
                dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
            )
            tmp = Path(tmp_name)
            with os.fdopen(fd, "wb") as f:
                pq.write_table(table, f)
                f.flush()
                os.fsync(f.fileno())
            write_boundary("history.tmp_written", tmp)
            os.replace(tmp, self.path)
        except BaseException as error:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            if isinstance(error, OSError | pa.ArrowException):
                raise write_error(RunDirError, self.path, error) from error
            raise
        _fsync_dir(self.path.parent)
        write_boundary("history.renamed", self.path)
        # What a crash in the middle of an earlier flush left behind (one writer per run).
        for leftover in self.path.parent.glob(f".{glob.escape(self.path.name)}.*.tmp"):
            with contextlib.suppress(OSError):
                leftover.unlink()

    @property
    def columns(self) -> list[str]:
        """Column names in file order: the counters first, then the metrics sorted."""
        return _order_columns(self._columns | {STEP_KEY})

    @property
    def rows(self) -> list[HistoryRow]:
        """A copy of every row, each holding every column (``None`` where absent)."""
        columns = self.columns
        return [{key: row.get(key) for key in columns} for row in self._rows]

    def series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(env_step, values)`` over the rows where `name` is present and not null."""
        pairs = [(_step(row), value) for row in self._rows if (value := row.get(name)) is not None]
        steps = np.array([step for step, _ in pairs], dtype=np.int64)
        values = np.array([value for _, value in pairs], dtype=np.float64)
        return steps, values


def episode_row(
    *,
    env_step: int,
    epoch: int,
    gradient_step: int,
    episode: int,
    episode_return: float,
    length: int | None,
    return_mean: float,
    time_s: float,
) -> HistoryRow:
    """The history row of one finished training episode (see the module docstring)."""
    return {
        STEP_KEY: env_step,
        "epoch": epoch,
        "gradient_step": gradient_step,
        "episode": episode,
        EPISODE_RETURN: float(episode_return),
        EPISODE_LENGTH: None if length is None else float(length),
        EPISODE_RETURN_MEAN: return_mean,
        EPISODE_TIME: time_s,
    }


def is_episode_row(row: Mapping[str, float | int | None]) -> bool:
    """Whether ``row`` is an episode row (rather than an interval row)."""
    return row.get(EPISODE_RETURN) is not None


def read_history(path: str | Path) -> list[HistoryRow]:
    """Read the rows of a history file written by :class:`History`.

    Raises:
        CheckpointError: the file is missing, is not parquet, or has no ``env_step`` column.
    """
    return _read(Path(path))[0]


def _read(path: Path) -> tuple[list[HistoryRow], dict[bytes, bytes]]:
    """The rows of a history file and its schema's key-value metadata."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no training history file")
    try:
        # One file's reader: ``pq.read_table`` goes through the dataset API, whose import
        # costs 0.4 s of every run that plots or resumes.
        with pq.ParquetFile(path) as reader:
            table = reader.read()
    except (pa.ArrowException, OSError) as exc:
        raise CheckpointError(
            f"{path}: training history is unreadable ({exc}); expected a parquet file "
            "written by rlfleet — it may be truncated; delete it to start a fresh history"
        ) from exc
    if STEP_KEY not in table.column_names:
        raise CheckpointError(
            f"{path}: training history has no {STEP_KEY!r} column; "
            f"found columns {table.column_names}"
        )
    steps = table.column(STEP_KEY)
    if not pa.types.is_integer(steps.type) or steps.null_count:
        raise CheckpointError(
            f"{path}: training history column {STEP_KEY!r} must be non-null integers; "
            f"found type {steps.type} with {steps.null_count} nulls"
        )
    rows: list[HistoryRow] = table.to_pylist()
    return rows, dict(table.schema.metadata or {})


def _decode(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _step(row: HistoryRow) -> int:
    step = row[STEP_KEY]
    assert isinstance(step, int), "append() and read_history() guarantee an int env_step"
    return step


def _coerce(key: str, value: object) -> float | int | None:
    """Check one value against its column's type and convert numpy scalars to Python ones."""
    if value is None:
        return None
    if key in INT_COLUMNS:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(
                f"history column {key!r} holds integers; got {value!r} ({type(value).__name__})"
            )
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"history metric {key!r} must be a real number; got {type(value).__name__} "
            "(convert tensors with .item())"
        )
    return float(value)


def _without_nulls(row: Mapping[str, float | int | None]) -> HistoryRow:
    return {key: value for key, value in row.items() if value is not None}


def _order_columns(columns: set[str]) -> list[str]:
    counters = [name for name in INT_COLUMNS if name in columns]
    return counters + sorted(columns - set(INT_COLUMNS))


def _to_table(rows: list[HistoryRow], columns: list[str]) -> pa.Table:
    arrays = [_column([row.get(name) for row in rows], name in INT_COLUMNS) for name in columns]
    return pa.Table.from_arrays(arrays, names=columns)


def _column(values: list[float | int | None], integer: bool) -> pa.Array:
    """An int64 or float64 arrow column of ``values``, null where a value is None.

    Built from its buffers: ``pa.array`` first asks whether its input is a pandas object, and
    that question imports pandas where it is installed (0.4 s of a run's start on a 2-core
    CPU, for a library rlfleet never uses otherwise)."""
    dtype = np.int64 if integer else np.float64
    valid = np.fromiter((value is not None for value in values), bool, len(values))
    data = np.fromiter((0 if value is None else value for value in values), dtype, len(values))
    nulls = len(values) - int(valid.sum())
    mask = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    kind = pa.int64() if integer else pa.float64()
    return pa.Array.from_buffers(kind, len(values), [mask, pa.py_buffer(data)], null_count=nulls)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable; not every platform can open a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
