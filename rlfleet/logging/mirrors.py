"""Optional mirrors of the history: Weights & Biases (:class:`WandbWriter`), and several
mirrors at once (:class:`Mirrors`, with :class:`~rlfleet.logging.tensorboard.TensorBoardWriter`).

W&B is an extra (``pip install 'rlfleet[wandb]'``), as TensorBoard is: the parquet history is
the record of a run, and a mirror only shows its rows where people browse runs. The W&B run
is named as xagents' ``monitor_session`` names it, its files go to the run directory
(``RUN_DIR/wandb``), and W&B's own settings apply: ``WANDB_MODE=offline`` keeps the run on
this machine (``wandb sync`` uploads it later), ``WANDB_PROJECT`` chooses the project.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rlfleet.errors import ConfigError, MissingDependencyError
from rlfleet.logging.history import STEP_KEY


class Mirror(Protocol):
    """Where history rows are mirrored: TensorBoard, W&B."""

    def write(self, row: Mapping[str, float | int | None], step: int) -> None:
        """Add the values of one history row at ``step``."""

    def close(self) -> None:
        """Flush and release."""


class WandbWriter:
    """Logs each history row to a W&B run, at its step."""

    def __init__(
        self, name: str, run_dir: str | Path | None, config: Mapping[str, Any] | None = None
    ) -> None:
        """Start the W&B run ``name``, its files under ``run_dir`` (None: W&B's default),
        with ``config`` as its config.

        Raises:
            MissingDependencyError: the ``wandb`` package is not installed.
            ConfigError: W&B could not start a run (not logged in, no network, ...).
        """
        try:
            import wandb  # the optional dependency: only a run that mirrors to W&B needs it
        except ImportError as exc:
            raise MissingDependencyError(
                "W&B logging needs the 'wandb' package: pip install 'rlfleet[wandb]'"
            ) from exc
        directory = None if run_dir is None else Path(run_dir)
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(
                name=name,
                dir=None if directory is None else str(directory),
                config=dict(config or {}),
            )
        # W&B raises its own errors and plain ones (a failed login, a refused connection);
        # each means the same to the user: the run could not start.
        except Exception as exc:
            raise ConfigError(
                f"monitor_session {name!r}: W&B could not start a run ({exc}); run `wandb "
                "login`, or set WANDB_MODE=offline to keep the run on this machine"
            ) from exc

    @property
    def directory(self) -> Path:
        """Where W&B writes this run's files."""
        return Path(self._run.dir)

    def write(self, row: Mapping[str, float | int | None], step: int) -> None:
        """Log every finite value of ``row`` at ``step``; ``None``, NaN and inf are skipped."""
        values = {
            name: float(value)
            for name, value in row.items()
            if name != STEP_KEY and value is not None and math.isfinite(value)
        }
        if values:
            self._run.log(values, step=step)

    def close(self) -> None:
        """Finish the W&B run."""
        self._run.finish()


class Mirrors:
    """Several mirrors written as one."""

    def __init__(self, mirrors: Sequence[Mirror]) -> None:
        self.mirrors = list(mirrors)

    def write(self, row: Mapping[str, float | int | None], step: int) -> None:
        """Write ``row`` to every mirror."""
        for mirror in self.mirrors:
            mirror.write(row, step)

    def close(self) -> None:
        """Close every mirror, each even if another fails to."""
        errors: list[BaseException] = []
        for mirror in self.mirrors:
            try:
                mirror.close()
            except Exception as exc:  # the others still close; the first failure is raised
                errors.append(exc)
        if errors:
            raise errors[0]
