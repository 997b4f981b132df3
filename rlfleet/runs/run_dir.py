"""The run directory: its default name, the checks before a run writes into it, the lock that
keeps a second writer out, the versioned config a resume writes, and what is left of it when
a run is interrupted (layout: :mod:`rlfleet.runs.run`).

The lock is an ``fcntl.flock`` on ``RUN_DIR/.lock``, a few lines written here rather than
taken from a lock library (``filelock``, ``portalocker``): those lock without recording who
holds the lock, and the error must name the holder (the file holds its pid, host and start
time) and a takeover from a dead owner must name that owner. The kernel drops a flock when
its holder's process ends however it ends (SIGKILL included), so a lock file left behind by a
killed run holds no lock and is taken over; one whose flock is held is in use, whatever its
content says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import yaml

from rlfleet.checkpoint import CheckpointManager
from rlfleet.config.loader import dump_yaml, load_yaml, yaml_text
from rlfleet.config.versions import current_version, next_version
from rlfleet.errors import RunDirError, option, write_error
from rlfleet.runs.config import (
    CONFIG_FILE,
    RunConfig,
    load_run_config,
    run_config_to_dict,
)

LOCK_FILE = ".lock"
"""The run directory's lock file, there while a process writes the run."""
ScheduleOnResume = Literal["continue", "stretch"]
"""What a resume that changes ``max_steps`` does with the schedules: ``continue`` keeps their
horizon (the earlier ``max_steps``), ``stretch`` runs them over the new ``max_steps``."""
_LOCK_READ_LIMIT = 4096
"""Bytes of a lock file read to name its holder (it holds one short JSON line)."""


def default_run_dir(cfg: RunConfig) -> Path:
    """``runs/<algo>-<env>-s<seed>-<date>-<time>``: see :func:`timestamped_run_dir`."""
    return timestamped_run_dir(run_name(cfg.algo, cfg.env.id, cfg.seed))


def run_name(algo: str, env_id: str, seed: int) -> str:
    """``<algo>-<env>-s<seed>``, the env id made a file name (``ALE/Pong-v5``: ``ALE-Pong-v5``)."""
    return f"{algo}-{env_id.replace('/', '-').replace(':', '-')}-s{seed}"


def timestamped_run_dir(name: str) -> Path:
    """``runs/<name>-<date>-<time>``, the first of it, ``...-2``, ``...-3``, ... that does not
    exist yet: two runs of one config started within a second (a script's loop over flags,
    a run that ends within its first second) get directories of their own. Two processes
    that pick the same name at the same moment are told apart by the run directory's lock."""
    base = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, number = base, 1
    while path.exists():
        number += 1
        path = base.with_name(f"{base.name}-{number}")
    return path


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
    # A lock file alone is what a run killed before it wrote anything leaves.
    if run_dir.exists() and any(child.name != LOCK_FILE for child in run_dir.iterdir()):
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


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or last held) a run directory's lock, as its lock file says."""

    pid: int
    host: str
    since: str
    """When it took the lock (local time, ISO 8601)."""

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host} since {self.since}"

    def is_dead(self) -> bool:
        """Whether the holder is known to have exited: a process of this host that is gone."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, under another user
            return False
        return False


def _read_holder(fd: int) -> LockHolder | None:
    """The holder a lock file names, or None when it is empty or unreadable (a holder still
    writing it, or a file that is not a lock file)."""
    try:
        data = json.loads(os.pread(fd, _LOCK_READ_LIMIT, 0).decode())
        return LockHolder(int(data["pid"]), str(data["host"]), str(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class RunDirLock:
    """The exclusive lock of the process that writes a run directory (``RUN_DIR/.lock``).

    :meth:`acquire` takes it at once or raises :class:`~rlfleet.errors.RunDirError` naming
    the holder; :meth:`release` gives it back and removes the lock file. A lock file whose
    owner died (its flock went with it) is taken over with a ``RuntimeWarning`` naming the
    dead owner. Readers (``eval``, ``play``, ``plot``, ``export``) do not take it.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`~rlfleet.errors.RunDirError` if another process
        holds it."""
        if self._fd is not None:
            return
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as error:
                raise RunDirError(
                    f"cannot lock run dir {self.run_dir}: {error.strerror or error} ({self.path})"
                ) from error
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunDirError(self._in_use(holder)) from error
            # The holder may have released (and removed) the file between our open and our
            # flock: then we hold a lock on a file no one else will open. Lock the one there.
            try:
                current = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            if current is None or not os.path.samestat(os.fstat(fd), current):
                os.close(fd)
                continue
            break
        previous = _read_holder(fd)
        if previous is not None:
            warnings.warn(
                f"run dir {self.run_dir}: taking over the lock of {previous.describe()}, "
                "which is no longer running",
                RuntimeWarning,
                stacklevel=2,
            )
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError as error:
            # Still locked and ours: removed as release() removes it, so that nothing is left.
            self._fd = fd
            self.release()
            raise write_error(RunDirError, self.path, error, "write the run dir's lock") from error
        self._fd = fd

    def _in_use(self, holder: LockHolder | None) -> str:
        if holder is None:
            return f"run dir {self.run_dir} is in use by another process (it holds {self.path})"
        message = f"run dir {self.run_dir} is in use by {holder.describe()}"
        if holder.is_dead():
            # A process it started (an env worker, say) inherited the lock and still runs.
            return message + " (exited; a process it started still holds the lock)"
        return message

    def release(self) -> None:
        """Give the lock back and remove the lock file (a no-op when not held)."""
        if self._fd is None:
            return
        # Removed while still locked, so that no process locks the file we are leaving; and
        # only if it is ours (a failed start may have removed it, and another process may
        # have locked a new one since).
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(self._fd), os.stat(self.path, follow_symlinks=False)):
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class RunDirAttempt:
    """One attempt to start a run in ``run_dir``, undone if it fails to start, holding the
    run directory's lock (:class:`RunDirLock`) until the block ends.

    Use as ``with RunDirAttempt(run_dir, resume=..., force=...) as attempt:`` around building
    and training the run, and call :meth:`started` once the run has taken its first training
    step (a collection step and the update, if one was due). The constructor checks the
    directory (:func:`check_run_dir`); entering creates it and takes its lock (a run that
    ``force`` replaces must not be locked either), and moves a run that ``force`` replaces
    aside instead of deleting it. :meth:`started` deletes the replaced run. Leaving the block
    releases the lock, however it is left.

    If the block raises (an error or Ctrl-C) before :meth:`started`, what this attempt
    created is removed, never anything that was there before, and the replaced run is put
    back: a run that fails to start, its first training step included (an env that breaks
    the API on its first step), leaves no directory that would make the same command ask
    for ``--force``. Resuming creates and removes nothing but its lock file. An attempt
    that finds the directory locked by another process raises before it writes anything.
    """

    def __init__(self, run_dir: str | Path, *, resume: bool, force: bool) -> None:
        try:
            check_run_dir(run_dir, resume=resume, force=force)
        except OSError as error:  # a name too long, a parent that cannot be read, ...
            raise RunDirError(
                f"cannot use run directory {run_dir}: {error.strerror or error}"
            ) from None
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.force = force
        self.lock = RunDirLock(run_dir)
        self._created: Path | None = None
        """The outermost directory this attempt created (None: ``run_dir`` existed)."""
        self._replaced: Path | None = None
        """The temporary directory holding the run that ``force`` replaces."""
        self._started = False

    def __enter__(self) -> RunDirAttempt:
        if self.resume:
            self.lock.acquire()
            return self
        run_dir = self.run_dir
        if self.force and run_dir.is_dir() and any(run_dir.iterdir()):
            # Refused while another process writes it; held until it is aside.
            replaced = RunDirLock(run_dir)
            replaced.acquire()
            try:
                # Aside, next to it (same file system, so a rename), until the new run has
                # started.
                self._replaced = Path(
                    tempfile.mkdtemp(prefix=f".{run_dir.name}.replaced-", dir=run_dir.parent)
                )
                run_dir.rename(self._replaced / run_dir.name)
                replaced.path = self._replaced / run_dir.name / LOCK_FILE
            finally:
                replaced.release()
        missing = [path for path in (run_dir, *run_dir.parents) if not path.exists()]
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                run_dir.mkdir()
                self._created = missing[-1] if missing else None
            except FileExistsError:
                self._created = None  # there already, or made by another process meanwhile
        except OSError as error:
            if missing and missing[-1].exists():
                shutil.rmtree(missing[-1], ignore_errors=True)
            self._put_back_replaced()
            raise RunDirError(
                f"cannot create run directory {run_dir}: {error.strerror or error}"
            ) from None
        try:
            self.lock.acquire()
        except RunDirError as error:
            raise self._refused(str(error)) from error
        # Another process may have started a run here between the check and the lock.
        if any(child.name != LOCK_FILE for child in run_dir.iterdir()):
            self.lock.release()
            raise self._refused(
                f"run directory {run_dir} already exists; pass {option('resume')} to continue "
                f"it or {option('force')} to overwrite it"
            )
        return self

    def _refused(self, message: str) -> RunDirError:
        """The error of an attempt another process got ahead of, in the moment between the
        check and the lock: a run ``force`` had set aside stays aside (the other process
        now has ``run_dir``), and the message says where."""
        if self._replaced is not None:
            message += (
                f"; the run it was to replace is kept in {self._replaced / self.run_dir.name}"
            )
        return RunDirError(message)

    def started(self) -> None:
        """The run has taken its first training step: the replaced run goes for good, and
        leaving the block no longer removes anything."""
        self._started = True
        if self._replaced is not None:
            shutil.rmtree(self._replaced)
            self._replaced = None

    def _put_back_replaced(self) -> None:
        if self._replaced is not None:
            (self._replaced / self.run_dir.name).rename(self.run_dir)
            self._replaced.rmdir()
            self._replaced = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self._undo_if_failed(exc_type)
        finally:
            self.lock.release()

    def _undo_if_failed(self, exc_type: type[BaseException] | None) -> None:
        if exc_type is None or self._started or self.resume:
            if self._replaced is not None:  # left the block without calling started()
                shutil.rmtree(self._replaced)
            return
        # Still locked: no other process has started in what is removed here.
        if self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)
        elif self.run_dir.is_dir():
            for child in self.run_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        self._put_back_replaced()


def write_run_files(
    run_dir: str | Path, cfg: RunConfig, files: Mapping[str, Any], *, resume: bool
) -> list[Path]:
    """Write a run's config (``config.yaml``) and ``files`` (name -> YAML data) into
    ``run_dir``; returns the paths written.

    A new run writes each under its name. A resume never overwrites one: a file whose
    content changes goes to its next version (``config.1.yaml``, ``config.2.yaml``, ...,
    which readers take as the current one: :mod:`rlfleet.config.versions`), and one that
    is unchanged is not written again.
    """
    run_dir = Path(run_dir)
    written: list[Path] = []
    new_config = yaml_text(run_config_to_dict(cfg))
    if not resume or yaml_text(run_config_to_dict(load_run_config(run_dir))) != new_config:
        written.append(_write_version(run_dir, CONFIG_FILE, run_config_to_dict(cfg), resume))
    for name, data in files.items():
        current = current_version(run_dir, name)
        if resume and current.is_file() and load_yaml(current) == yaml.safe_load(yaml_text(data)):
            continue
        written.append(_write_version(run_dir, name, data, resume))
    return written


def _write_version(run_dir: Path, name: str, data: Any, resume: bool) -> Path:
    path = next_version(run_dir, name) if resume else run_dir / name
    dump_yaml(data, path)
    return path


def scheduled_settings(cfg: RunConfig) -> list[str]:
    """The settings of ``cfg`` that follow the training progress (the fraction of
    ``max_steps`` done), as ``section.name: value``: linear schedules (``*_schedule``),
    DQN-style exploration decay, prioritized replay's importance-weight annealing, and
    curriculum lessons measured by progress."""
    found: list[str] = []
    hp = cfg.hyperparameters
    values = {f.name: getattr(hp, f.name) for f in dataclasses.fields(hp)}
    for name, value in values.items():
        if name.endswith("_schedule") and value != "constant":
            found.append(f"hyperparameters.{name}: {value}")
    if values.get("exploration_fraction", 0.0) > 0.0 and values.get(
        "exploration_initial_eps"
    ) != values.get("exploration_final_eps"):
        found.append(f"hyperparameters.exploration_fraction: {values['exploration_fraction']}")
    if values.get("prioritized") and values.get("prioritized_beta", 1.0) < 1.0:
        found.append(f"hyperparameters.prioritized_beta: {values['prioritized_beta']}")
    for name, settings in (cfg.environment_parameters or {}).items():
        if any(
            lesson.completion_criteria is not None
            and lesson.completion_criteria.measure == "progress"
            for lesson in settings.curriculum
        ):
            found.append(f"environment_parameters.{name}: a curriculum measured by progress")
    return found


def resumed_config(
    run_dir: str | Path, cfg: RunConfig, schedule_on_resume: ScheduleOnResume | None
) -> RunConfig:
    """``cfg``, the config a resume of ``run_dir`` asks for, with the schedules' horizon
    settled (``trainer.schedule_max_steps``).

    When the horizon would change (a new ``max_steps``) and the run has settings that follow
    it (:func:`scheduled_settings`), ``schedule_on_resume`` says what to do: ``continue``
    keeps the run's horizon, ``stretch`` takes the new ``max_steps``. A run without such
    settings, or a resume that keeps the horizon, needs no choice.

    Raises:
        RunDirError: the choice is needed and ``schedule_on_resume`` is None.
    """
    previous = load_run_config(run_dir)
    old = previous.trainer.schedule_max_steps or previous.trainer.max_steps
    new = cfg.trainer.schedule_max_steps or cfg.trainer.max_steps
    if schedule_on_resume == "stretch":
        return dataclasses.replace(
            cfg, trainer=dataclasses.replace(cfg.trainer, schedule_max_steps=None)
        )
    if old == new:
        return cfg
    settings = scheduled_settings(cfg)
    if not settings:
        return cfg
    if schedule_on_resume == "continue":
        return dataclasses.replace(
            cfg, trainer=dataclasses.replace(cfg.trainer, schedule_max_steps=old)
        )
    flag = option("schedule_on_resume", None)
    raise RunDirError(
        f"resuming {run_dir} with max_steps {new:,} instead of {old:,}: its schedules follow "
        f"max_steps ({'; '.join(settings)}); pass {flag} continue (keep their horizon at "
        f"{old:,} steps) or {flag} stretch (run them over {new:,})"
    )


def interrupted_message(
    run_dir: str | Path, resume_command: str, *, new_run_since: float | None = None
) -> str:
    """What to tell the user after Ctrl-C stopped the run in ``run_dir``: the command that
    continues it, or that it has no checkpoint to continue from yet. ``new_run_since``: for a
    new run (not a resume), when it began (``time.time()``); a checkpoint older than that is
    the one of the run ``--force`` was to replace, put back because the new run stopped
    before its first training step (:class:`RunDirAttempt`)."""
    run_dir = Path(run_dir)
    latest = CheckpointManager(run_dir / "checkpoints", readonly=True).latest()
    if latest is not None and (new_run_since is None or latest.stat().st_mtime >= new_run_since):
        return f"interrupted; the latest checkpoint is intact — continue with `{resume_command}`"
    if latest is not None:
        return (
            "interrupted before the first checkpoint; nothing of the new run was kept, and the "
            f"run it was to replace is back in {run_dir}"
        )
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return (
            "interrupted before the first checkpoint; nothing was kept — run the same command "
            "to start again"
        )
    return (
        f"interrupted before the first checkpoint, so {run_dir} has nothing to resume from — "
        f"start again with --force (it replaces {run_dir})"
    )
