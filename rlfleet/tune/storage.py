"""Where a study lives: an Optuna RDB storage, opened with fast, clear failures.

By default a study is an SQLite file in its study directory, which several worker
processes on one machine share. A PostgreSQL or MySQL URL lets workers on several machines
share one study (see docs/tuning.md).

Before Optuna touches a network database, its host and port are tried with a plain socket
and a short timeout, and the driver gets a connect timeout too: an unreachable server is an
error within seconds, not a hang, and a missing driver is named as such. Passwords never
appear in messages.

The storage records a heartbeat for every running trial; a trial whose worker died (killed,
machine lost) stops beating, and after ``grace_period`` seconds the next worker that looks
fails it and calls ``stale_trial_callback`` (the tuner re-queues its parameters).
"""

from __future__ import annotations

import fcntl
import os
import socket
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfleet.errors import ConfigError, MissingDependencyError, StorageError

if TYPE_CHECKING:
    import optuna
    from sqlalchemy.engine import URL

CONNECT_TIMEOUT_S = 5
"""Seconds to wait for a database server to accept a connection."""
SQLITE_BUSY_TIMEOUT_S = 60
"""Seconds an SQLite writer waits for another process's lock before failing."""
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}
_DRIVER_HINTS = {
    "postgresql": "pip install psycopg2-binary",
    "mysql": "pip install pymysql and use a mysql+pymysql:// URL",
    "mariadb": "pip install pymysql and use a mariadb+pymysql:// URL",
}

StaleTrialCallback = Callable[["optuna.Study", "optuna.trial.FrozenTrial"], None]


def sqlite_url(path: str | Path) -> str:
    """The storage URL of an SQLite file (absolute, so worker processes agree on it)."""
    return f"sqlite:///{Path(path).resolve()}"


@contextmanager
def sqlite_claim_lock(url: str) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``FILE.claim-lock`` while the body runs, for an
    SQLite storage ``sqlite:///FILE``; for any other database, do nothing.

    Optuna claims a queued trial by reading its state and then writing RUNNING. PostgreSQL
    and MySQL lock the row between the two (``SELECT ... FOR UPDATE``); SQLite ignores that,
    and Python's sqlite3 driver begins the transaction only at the write, so two worker
    processes could both read WAITING and both claim the same trial (or both read RUNNING
    and both fail a lost trial, queueing two retries). Workers sharing an SQLite file share
    a host, where this lock makes the read and the write one step.
    """
    parsed = _parse(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        yield
        return
    database = Path(parsed.database).expanduser().resolve()
    lock_path = database.with_name(database.name + ".claim-lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs."""
    try:
        return str(_parse(url).render_as_string(hide_password=True))
    except ConfigError:
        return _redact(url)


def open_storage(
    url: str,
    *,
    heartbeat_interval: int,
    grace_period: int,
    stale_trial_callback: StaleTrialCallback | None = None,
) -> optuna.storages.RDBStorage:
    """Open (and create the tables of) the study storage at ``url``.

    Raises:
        ConfigError: ``url`` is not a database URL, names an unknown kind of database, or
            an in-memory one (which worker processes cannot share).
        StorageError: the SQLite file's directory does not exist, the server cannot be
            reached, or the database refuses the connection.
        MissingDependencyError: the database driver for ``url`` is not installed.
    """
    import optuna
    import sqlalchemy.exc

    parsed = _parse(url)
    backend = parsed.get_backend_name()
    engine_kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        _check_sqlite_path(parsed, url)
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    elif parsed.host:
        _check_reachable(parsed, backend)
        if backend in _DEFAULT_PORTS:
            engine_kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    try:
        with warnings.catch_warnings():
            # Heartbeats are marked experimental in Optuna; they are what resumes need.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=stale_trial_callback,
            )
    except sqlalchemy.exc.NoSuchModuleError:
        raise ConfigError(
            f"--storage {mask_url(url)}: unknown database kind {parsed.drivername!r}; expected "
            "sqlite:///FILE, postgresql://... or mysql+pymysql://..."
        ) from None
    except ImportError:
        hint = _DRIVER_HINTS.get(backend, "install the driver SQLAlchemy documents for it")
        raise MissingDependencyError(
            f"study storage {mask_url(url)}: the database driver for {parsed.drivername!r} "
            f"is not installed; {hint}"
        ) from None
    except sqlalchemy.exc.SQLAlchemyError as err:
        reason = getattr(err, "orig", None) or err
        raise StorageError(
            f"cannot open study storage {mask_url(url)}: {str(reason).strip().splitlines()[0]}"
        ) from None


def _parse(url: str) -> URL:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigError(
            f"--storage: expected a database URL such as sqlite:///study.db or "
            f"postgresql://user:password@host/db, got {_redact(url)!r}"
        ) from None


def _redact(url: str) -> str:
    """``url``, too malformed to parse, with what may be a password (from the first ``:``
    of the user part to the last ``@``) replaced by ``***``."""
    head, at, host = url.rpartition("@")
    if not at:
        return url
    scheme, sep, userinfo = head.rpartition("://")
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{sep}{user}{colon}{'***' if colon else ''}@{host}"


def _check_sqlite_path(parsed: URL, url: str) -> None:
    database = parsed.database
    if not database or database == ":memory:":
        raise ConfigError(
            f"--storage {url}: an in-memory SQLite database cannot be shared by workers or "
            "resumed; give a file, e.g. sqlite:///study.db"
        )
    folder = Path(database).expanduser().resolve().parent
    if not folder.is_dir():
        raise StorageError(
            f"--storage {url}: directory {folder} does not exist; create it or choose "
            "another path for the SQLite file"
        )


def _check_reachable(parsed: URL, backend: str) -> None:
    """Fail fast when nothing listens at the server's address (the drivers can block for
    minutes on an address that drops packets)."""
    host = str(parsed.host)
    port = parsed.port or _DEFAULT_PORTS.get(backend)
    if port is None:
        return
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise StorageError(
            f"cannot reach the study database at {host}:{port} "
            f"({parsed.render_as_string(hide_password=True)}): {reason}; start the server "
            "or check --storage"
        ) from None
