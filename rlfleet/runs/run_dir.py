"""The run directory: its default name, the checks before a run writes into it, and what is
left of it when a run is interrupted (layout: :mod:`rlfleet.runs.run`)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType

from rlfleet.checkpoint import CheckpointManager
from rlfleet.errors import RunDirError, option
from rlfleet.runs.config import (
    CONFIG_FILE,
    RunConfig,
)


def default_run_dir(cfg: RunConfig) -> Path:
    env = cfg.env.id.replace("/", "-").replace(":", "-")
    return Path("runs") / f"{cfg.algo}-{env}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_run_dir(run_dir: str | Path, *, resume: bool, force: bool) -> None:
    """Refuse a run directory that cannot be used as asked, touching nothing: an existing one
    needs ``resume`` (continue) or ``force`` (replace, and only a run directory)."""
    run_dir = Path(run_dir)
    if resume:
        if not (run_dir / CONFIG_FILE).is_file():
            raise RunDirError(f"cannot resume {run_dir}: no {CONFIG_FILE} there")
        return
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} is a file; expected a directory path")
    if run_dir.exists() and any(run_dir.iterdir()):
        if not force:
            raise RunDirError(
                f"run directory {run_dir} already exists; pass {option('resume')} to continue "
                f"it or {option('force')} to overwrite it"
            )
        if not (run_dir / CONFIG_FILE).is_file() and not (run_dir / "checkpoints").is_dir():
            raise RunDirError(
                f"refusing to overwrite {run_dir} ({option('force')}): it does not look like a "
                "run directory"
            )


class RunDirAttempt:
    """One attempt to start a run in ``run_dir``, undone if it fails to start.

    Use as ``with RunDirAttempt(run_dir, resume=..., force=...) as attempt:`` around building
    the run, and call :meth:`started` once it is built and its files are written. The
    constructor checks the directory (:func:`check_run_dir`); entering creates it, and moves a
    run that ``force`` replaces aside instead of deleting it. :meth:`started` deletes the
    replaced run.

    If the block raises (an error or Ctrl-C) before :meth:`started`, what this attempt
    created is removed, never anything that was there before, and the replaced run is put
    back: a failed start leaves no directory that would make the same command ask for
    ``--force``. Resuming creates and removes nothing.
    """

    def __init__(self, run_dir: str | Path, *, resume: bool, force: bool) -> None:
        check_run_dir(run_dir, resume=resume, force=force)
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.force = force
        self._created: Path | None = None
        """The outermost directory this attempt created (None: ``run_dir`` existed)."""
        self._replaced: Path | None = None
        """The temporary directory holding the run that ``force`` replaces."""
        self._started = False

    def __enter__(self) -> RunDirAttempt:
        if self.resume:
            return self
        run_dir = self.run_dir
        if self.force and run_dir.is_dir() and any(run_dir.iterdir()):
            # Aside, next to it (same file system, so a rename), until the new run has started.
            self._replaced = Path(
                tempfile.mkdtemp(prefix=f".{run_dir.name}.replaced-", dir=run_dir.parent)
            )
            run_dir.rename(self._replaced / run_dir.name)
        missing = [path for path in (run_dir, *run_dir.parents) if not path.exists()]
        self._created = missing[-1] if missing else None
        run_dir.mkdir(parents=True, exist_ok=True)
        return self

    def started(self) -> None:
        """The run is built and its files written: the replaced run goes for good."""
        self._started = True
        if self._replaced is not None:
            shutil.rmtree(self._replaced)
            self._replaced = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None or self._started or self.resume:
            if self._replaced is not None:  # left the block without calling started()
                shutil.rmtree(self._replaced)
            return
        if self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)
        elif self.run_dir.is_dir():
            for child in self.run_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        if self._replaced is not None:
            (self._replaced / self.run_dir.name).rename(self.run_dir)
            self._replaced.rmdir()
            self._replaced = None


def interrupted_message(run_dir: str | Path, resume_command: str) -> str:
    """What to tell the user after Ctrl-C stopped the run in ``run_dir``: the command that
    continues it, or that it has no checkpoint to continue from yet."""
    run_dir = Path(run_dir)
    if CheckpointManager(run_dir / "checkpoints", readonly=True).latest() is not None:
        return f"interrupted; the latest checkpoint is intact — continue with `{resume_command}`"
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return (
            "interrupted before the first checkpoint; nothing was kept — run the same command "
            "to start again"
        )
    return (
        f"interrupted before the first checkpoint, so {run_dir} has nothing to resume from — "
        f"start again with --force (it replaces {run_dir})"
    )
