"""A folder of step-numbered checkpoints with rotation and an atomic `latest` pointer::

    root/
      latest.json          {"name": "step-000000001000"}, replaced atomically after each save
      step-000000000500/
      step-000000001000/
      step-000000001000-1/ the same step saved again
      .tmp-*               a save or deletion in progress, or one a crash interrupted

Each step directory is a checkpoint of :mod:`rlfleet.checkpoint.durable`.
"""

from __future__ import annotations

import builtins
import os
import secrets
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rlfleet.checkpoint.codec import json_bytes, parse_json, short
from rlfleet.checkpoint.durable import (
    MANIFEST_FILE,
    fsync_dir,
    load_checkpoint,
    read_bounded,
    save_checkpoint,
    verification_error,
    write_durably,
)
from rlfleet.checkpoint.schema import STEP_NAME, LatestPointer, validate_part
from rlfleet.errors import CheckpointError, ConfigError, write_boundary, write_error

__all__ = ["LATEST_FILE", "MAX_LATEST_BYTES", "CheckpointManager"]

LATEST_FILE = "latest.json"
MAX_LATEST_BYTES = 4096
"""The most `latest.json` may hold (it holds about 40 bytes)."""


class CheckpointManager:
    """A folder of step-numbered checkpoints with an atomic `latest` pointer.

    One process writes to a root at a time: construction removes every ``.tmp-*`` entry,
    which would include another writer's save in progress.
    """

    def __init__(
        self, root: str | Path, keep: int | None = None, *, readonly: bool = False
    ) -> None:
        """Open (creating it if needed) ``root``; keep at most ``keep`` checkpoints, or all.

        Removes the ``.tmp-*`` leftovers of a save or deletion a crash interrupted. With
        ``readonly`` nothing on disk is touched (for readers such as ``eval``, which may run
        while a trainer writes to the same folder) and :meth:`save` is refused.
        """
        self.readonly = readonly
        if readonly:
            self.root = Path(root)
            self.keep = None
            return
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ConfigError(f"keep: expected None (keep all) or an integer >= 1, got {keep!r}")
        self.root = Path(root)
        self.keep = keep
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for leftover in self.root.glob(".tmp-*"):
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
        except OSError as error:
            raise write_error(CheckpointError, self.root, error, "prepare the folder") from error

    def save(self, state: Mapping[str, Any], metadata: Mapping[str, Any], step: int) -> Path:
        """Save as ``step-<step>`` (``-1``, ``-2``, ... if taken), point `latest` at it, rotate.

        Returns the new checkpoint's directory. Checkpoints beyond ``keep`` are deleted oldest
        first, never the one just saved. A ``step-<step>`` newer than the checkpoint
        `latest.json` names was left by a process killed before it moved the pointer; a
        resumed run that saves that step again has redone its work, so the leftover is
        replaced, not kept beside the new one.
        """
        if self.readonly:
            raise CheckpointError(f"{self.root}: opened read-only, cannot save")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"step: expected an integer >= 0, got {step!r}")
        base = f"step-{step:012d}"
        if os.path.lexists(self.root / base) and _step_of(self._read_pointer()[0]) < step:
            self._delete(self.root / base)
        name, suffix = base, 0
        while os.path.lexists(self.root / name):
            suffix += 1
            name = f"{base}-{suffix}"
        path = save_checkpoint(self.root / name, state, metadata)
        self._point_latest_to(name)
        self._rotate(protected=name)
        return path

    def latest(self) -> Path | None:
        """The checkpoint `latest.json` names if it verifies, else the newest one that does.

        Falling back warns (``RuntimeWarning``): it means a checkpoint or `latest.json` is
        gone or damaged. ``None`` if no checkpoint verifies.

        Raises:
            NewerFormatError: the checkpoint to use was written by a newer rlfleet.
        """
        return self._resolve_latest()[0]

    def latest_problem(self) -> str | None:
        """Why :meth:`latest` passes over `latest.json` or a checkpoint (the first problem
        found, in one line), or None when nothing is passed over."""
        return self._find_latest()[1]

    def load_latest(
        self,
        *,
        state_schema: type[BaseModel] | None = None,
        metadata_schema: type[BaseModel] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """``(state, metadata)`` of :meth:`latest`, checked against the schemas as
        :func:`~rlfleet.checkpoint.durable.load_checkpoint` checks them; CheckpointError if
        there is none."""
        path, problem = self._resolve_latest()
        if path is None:
            detail = f" ({problem})" if problem is not None else ""
            raise CheckpointError(f"{self.root}: no checkpoint found{detail}")
        return load_checkpoint(path, state_schema=state_schema, metadata_schema=metadata_schema)

    def _resolve_latest(self) -> tuple[Path | None, str | None]:
        path, problem = self._find_latest()
        if path is not None and problem is not None:
            warnings.warn(f"{problem}; using {path} instead", RuntimeWarning, stacklevel=3)
        return path, problem

    def _find_latest(self) -> tuple[Path | None, str | None]:
        """(the checkpoint to resume from, or None; why a preferred one was passed over).

        Raises:
            NewerFormatError: a candidate was written by a newer rlfleet; falling back to an
                older checkpoint would silently drop what the newer one holds.
        """
        named, problem = self._read_pointer()
        candidates = [self.root / named] if named is not None else []
        candidates += [path for path in reversed(self.list()) if path.name != named]
        for path in candidates:
            error = verification_error(path)
            if error is None:
                return path, problem
            if problem is None:
                pointed = f"{LATEST_FILE} names {named}, but " if path.name == named else ""
                problem = f"{pointed}{error}"
        return None, problem

    def list(self) -> builtins.list[Path]:
        """Complete checkpoints (step directories with a manifest), oldest step first."""
        found = []
        if not self.root.is_dir():
            return []
        for entry in self.root.iterdir():
            match = STEP_NAME.fullmatch(entry.name)
            if match and entry.is_dir() and (entry / MANIFEST_FILE).is_file():
                found.append((int(match[1]), int(match[2] or 0), entry))
        return [entry for _, _, entry in sorted(found)]

    def _read_pointer(self) -> tuple[str | None, str | None]:
        """(name latest.json holds, or None; why it could not be used, or None).

        The pointer is read as a checkpoint's files are: a regular file only (no symbolic
        link, FIFO or device), at most :data:`MAX_LATEST_BYTES`, parsed against its schema.
        """
        path = self.root / LATEST_FILE
        try:
            pointer = parse_json(path, read_bounded(path, MAX_LATEST_BYTES))
        except FileNotFoundError:
            return None, None
        except OSError as error:
            return None, f"{path}: unreadable ({error.strerror or error})"
        except CheckpointError as error:
            return None, str(error)
        try:
            validate_part(LatestPointer, pointer, str(path))
        except CheckpointError as error:
            return None, f"{error} (it should name a step checkpoint: {short(pointer)})"
        return str(pointer["name"]), None

    def _point_latest_to(self, name: str) -> None:
        temp = self.root / f".tmp-{LATEST_FILE}-{secrets.token_hex(6)}"
        latest = self.root / LATEST_FILE
        try:
            write_durably(temp, json_bytes({"name": name}))
            write_boundary("latest.tmp_written", temp)
            os.replace(temp, latest)
            fsync_dir(self.root)
        except OSError as error:
            temp.unlink(missing_ok=True)
            raise write_error(CheckpointError, latest, error, "update") from error
        write_boundary("latest.renamed", latest)

    def prune(self) -> None:
        """Delete checkpoints beyond ``keep``, oldest first, never the latest: what a save
        does after it points `latest` at the new checkpoint, and a process killed between
        the two left undone."""
        if self.readonly:
            raise CheckpointError(f"{self.root}: opened read-only, cannot prune")
        latest = self.latest()
        if latest is not None:
            self._rotate(protected=latest.name)

    def _rotate(self, protected: str) -> None:
        if self.keep is None:
            return
        checkpoints = self.list()
        excess = len(checkpoints) - self.keep
        for path in checkpoints:
            if excess <= 0:
                break
            if path.name != protected:
                self._delete(path)
                excess -= 1

    def _delete(self, path: Path) -> None:
        # Renamed first, so a crash midway leaves a .tmp-* leftover, not a half checkpoint.
        doomed = self.root / f".tmp-delete-{path.name}-{secrets.token_hex(6)}"
        try:
            os.rename(path, doomed)
            fsync_dir(self.root)
            write_boundary("checkpoint.delete_renamed", doomed)
            shutil.rmtree(doomed)
        except OSError as error:
            raise write_error(CheckpointError, path, error, "delete an old checkpoint") from error
        write_boundary("checkpoint.deleted", path)


def _step_of(name: str | None) -> int:
    """The step in a checkpoint name (``step-000000000128-1`` → 128); -1 for none."""
    match = None if name is None else STEP_NAME.fullmatch(name)
    return -1 if match is None else int(match.group(1))
