"""Typed exceptions: each names what was expected, what was received, and where.

Every error rlfleet raises on bad input derives from :class:`RlfleetError`, so the CLI
can print it as one line without a traceback.

A message that tells the user what to set names it with :func:`option`, so the same message
says ``force=True`` to a Python caller and ``--force`` inside the ``rlfleet`` command.

A write that fails (a full disk, a read-only file system) becomes a typed error through
:func:`write_error`, which names the path and the space left; every durable writer marks its
write boundaries with :func:`write_boundary`, where tests inject a crash or a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path

_cli_wording: ContextVar[bool] = ContextVar("rlfleet_cli_wording", default=False)


def option(name: str, value: str | None = "True", *, flag: str | None = None) -> str:
    """How a message names the setting ``name``: ``name=value`` for a Python caller; inside
    :func:`cli_wording`, its command-line flag (``flag``, by default ``--name`` with hyphens)
    followed by ``value`` unless that is ``"True"`` (a switch). ``value=None`` names the
    setting alone (``name``, or the bare flag)."""
    if _cli_wording.get():
        cli = flag or "--" + name.replace("_", "-")
        return cli if value in (None, "True") else f"{cli} {value}"
    return name if value is None else f"{name}={value}"


@contextmanager
def cli_wording() -> Iterator[None]:
    """Within this block, :func:`option` names command-line flags (the ``rlfleet`` command
    runs every subcommand in it)."""
    token = _cli_wording.set(True)
    try:
        yield
    finally:
        _cli_wording.reset(token)


class RlfleetError(Exception):
    """Base class of every error rlfleet raises on bad input or a broken run."""


class ConfigError(RlfleetError, ValueError):
    """A configuration value, file or command-line flag is invalid."""


class EnvSpecError(RlfleetError, ValueError):
    """An environment id, space or env behaviour does not fit what was asked of it."""


class CheckpointError(RlfleetError):
    """A checkpoint or run directory is missing, truncated, tampered with or incompatible."""


class RunDirError(RlfleetError):
    """A run directory cannot be used as asked (exists without resume/force, not a run, ...)."""


class NonFiniteError(RlfleetError, FloatingPointError):
    """A NaN or infinity appeared in an observation, reward, loss or gradient."""


class EnvWorkerError(RlfleetError):
    """An environment worker process died, raised or stopped answering."""


class MissingDependencyError(RlfleetError, ImportError):
    """An optional dependency is needed for the requested feature but is not installed."""


class StorageError(RlfleetError):
    """A study's storage (SQLite file or database server) cannot be reached or used."""


class ClusterError(RlfleetError, ConnectionError):
    """A Ray cluster cannot be reached, or its rollout actors or learners were lost."""


class InsufficientMemoryError(RlfleetError, MemoryError):
    """Something (a replay buffer) would need more memory than the machine has available."""


class DatasetError(RlfleetError, ValueError):
    """An offline dataset is missing, malformed, empty, non-finite or does not fit the env."""


# --------------------------------------------------------------------------- durable writes

FaultHook = Callable[[str, Path], None]
"""``hook(boundary, path)``: called at each write boundary with its name and the path written."""

FAULT_HOOK: FaultHook | None = None
"""Called by every durable writer (checkpoints, ``latest.json``, the history) at each write
boundary — ``"history.tmp_written"``, ``"checkpoint.renamed"``, ... (:data:`WRITE_BOUNDARIES`)
— so that tests can kill the process, or fail the write, exactly there. ``None`` (the
default) costs one global lookup per boundary."""

WRITE_BOUNDARIES = (
    "history.tmp_written",
    "history.renamed",
    "checkpoint.tensors_written",
    "checkpoint.state_written",
    "checkpoint.meta_written",
    "checkpoint.manifest_written",
    "checkpoint.renamed",
    "latest.tmp_written",
    "latest.renamed",
    "checkpoint.delete_renamed",
    "checkpoint.deleted",
)
"""Every boundary :func:`write_boundary` is called at, in the order a training epoch reaches
them: the history is committed first, then the checkpoint, its ``latest.json`` pointer and the
rotation of old checkpoints."""


def write_boundary(name: str, path: str | Path) -> None:
    """Mark the write boundary ``name`` (one of :data:`WRITE_BOUNDARIES`) for :data:`FAULT_HOOK`."""
    hook = FAULT_HOOK
    if hook is not None:
        hook(name, Path(path))


def write_error(
    kind: type[RlfleetError], path: str | Path, error: BaseException, what: str = "write"
) -> RlfleetError:
    """A ``kind`` error for a failed write of ``path``: names the path, the cause and the space
    left on its file system (``No space left on device; 0 B free on its file system``), so
    that a full disk reads as one."""
    path = Path(path)
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    reason = " ".join(reason.split()) or type(error).__name__
    return kind(f"{path}: cannot {what} ({reason}; {free_space(path)})")


def nameless(path: str | Path) -> bool:
    """``path`` has no name of its own (``''``, ``.``, ``/``, ``..``): it is a directory
    reached from elsewhere, which an atomic write cannot replace without moving it away."""
    return Path(path).name in ("", "..")


@contextmanager
def replacing(
    path: str | Path, kind: type[RlfleetError] = RunDirError, what: str = "write"
) -> Iterator[Path]:
    """Write ``path`` whole or not at all: yields a sibling temporary path (with ``path``'s
    suffix, for writers that pick a format by it) to write to, which then replaces ``path``.

    On a failure the temporary file goes and any earlier ``path`` stays; an ``OSError``
    becomes a ``kind`` error naming ``path`` and the free space (:func:`write_error`). A
    ``path`` that is a device, a FIFO or a socket (``/dev/null``) is a ``kind`` error before
    anything is written: replacing it would put a file where the device was.
    """
    path = Path(path)
    refuse_special_file(path, kind, what)
    if nameless(path):
        raise kind(f"cannot {what} {str(path)!r}: expected a file path (such as out/name)")
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except OSError as error:
        raise write_error(kind, path, error, what) from error
    finally:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)


_FILE_KINDS = {
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
    stat.S_IFDIR: "directory",
}
_SPECIAL = (stat.S_IFIFO, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFSOCK)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, by its ``st_mode``: ``"FIFO"``,
    ``"character device"``, ... (``"special file"`` for any other)."""
    return _FILE_KINDS.get(stat.S_IFMT(mode), "special file")


def refuse_special_file(
    path: str | Path, kind: type[RlfleetError] = RunDirError, what: str = "write"
) -> None:
    """A ``kind`` error if ``path`` is a device, a FIFO or a socket (a symbolic link is judged
    as itself: replacing a link replaces the link, not what it points to)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # nothing there yet, or unreadable: the write itself says why it fails
    if stat.S_IFMT(mode) in _SPECIAL:
        raise kind(
            f"{path}: cannot {what} (expected a regular file or a new path, got a "
            f"{file_kind(mode)})"
        )


def free_space(path: str | Path) -> str:
    """``"1.2 GiB free on its file system"``: the free space of the file system that holds
    ``path`` (or its nearest existing parent), for messages about failed writes."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return "free space unknown"
    return f"{_bytes(free)} free on its file system"


def _bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
