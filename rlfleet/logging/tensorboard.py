"""Optional TensorBoard output: the same rows as the history, as TensorBoard scalars.

TensorBoard is an extra (``pip install 'rlfleet[tensorboard]'``); the parquet history is the
record of a run, and this writer only mirrors it for people who browse runs in TensorBoard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rlfleet.errors import MissingDependencyError
from rlfleet.logging.history import STEP_KEY

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class TensorBoardWriter:
    """Writes each history row as scalars, tagged by metric name, at a given env step."""

    def __init__(self, log_dir: str | Path) -> None:
        """Open an event file in `log_dir`.

        Raises:
            MissingDependencyError: the ``tensorboard`` package is not installed.
        """
        try:
            # torch.utils.tensorboard imports the tensorboard package at import time, so
            # this import is the check that the optional dependency is there.
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise MissingDependencyError(
                "TensorBoard logging needs the 'tensorboard' package: "
                "pip install 'rlfleet[tensorboard]'"
            ) from exc
        self._writer: SummaryWriter = SummaryWriter(log_dir=str(log_dir))

    def write(self, row: Mapping[str, float | int | None], step: int) -> None:
        """Add every finite value of `row` at `step`; ``None``, NaN and inf are skipped."""
        for name, value in row.items():
            # env_step is the x axis already; as a scalar it would only plot y = x.
            if name == STEP_KEY or value is None or not math.isfinite(value):
                continue
            self._writer.add_scalar(name, float(value), global_step=step)

    def close(self) -> None:
        """Flush pending events to disk and close the event file."""
        self._writer.close()
